"""Command line of the prompt registry and release gate: ``lockgate prompt …``,
``lockgate dataset …``, ``lockgate bind …``, ``lockgate gate …`` (docs/gate.md).

Registered on the main app by :func:`register`.
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table

from lockgate.app import Lockgate
from lockgate.errors import LockgateError
from lockgate.gate.binding import parse_comparison
from lockgate.registry.content import read_json_option, read_template

prompt_app = typer.Typer(no_args_is_help=True,
                         help="Prompts: versions, proposals, history, diff, rollback.")
dataset_app = typer.Typer(no_args_is_help=True, help="Labelled datasets for the release gate.")
gate_app = typer.Typer(no_args_is_help=True, help="Release-gate evaluations and decisions.")
console = Console(stderr=True)
out = Console()

DbOpt = Annotated[str | None, typer.Option("--db", envvar="LOCKGATE_DATABASE_URL",
                                           help="database URL [default: sqlite:///lockgate.db]")]
ConfigOpt = Annotated[Path | None, typer.Option("--config", envvar="LOCKGATE_CONFIG",
                                                help="TOML file with endpoints")]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]
ModelOpt = Annotated[str | None, typer.Option(
    "--model-config", help="JSON object or @file.json [propose: the live version's]")]
DeliveryOpt = Annotated[str | None, typer.Option(
    "--delivery-rule", help="JSON object or @file.json [propose: the live version's]")]
TagOpt = Annotated[str | None, typer.Option(help="a tag for the version, e.g. prompt-v1.2.3")]
AuthorOpt = Annotated[str | None, typer.Option(help="who [default: login name]")]
NoteOpt = Annotated[str | None, typer.Option(help="why (kept in the audit trail)")]

#: Exit code of ``gate status --wait`` when the candidate did not go live.
NOT_ACTIVATED = 3


def register(app: typer.Typer) -> None:
    """Add the registry and gate commands to the ``lockgate`` app."""
    app.add_typer(prompt_app, name="prompt")
    app.add_typer(dataset_app, name="dataset")
    app.add_typer(gate_app, name="gate")
    app.command("bind")(bind)


def _fail(exc: Exception) -> None:
    console.print(f"[red]error:[/red] {exc}", markup=True, highlight=False)
    raise typer.Exit(2)


def _open(db: str | None, config: Path | None = None) -> Lockgate:
    return Lockgate(db, config=config)


def _json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2, default=_default)
                     .decode() + "\n")


def _default(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return {k: getattr(value, k) for k in value.__dataclass_fields__}
    return str(value)


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


# -- prompt ------------------------------------------------------------------------------


@prompt_app.command("create")
def prompt_create(name: str,
                  file: Annotated[Path, typer.Option("--file", "-f", help="template file")],
                  model_config: ModelOpt = None, delivery_rule: DeliveryOpt = None,
                  tag: TagOpt = None, author: AuthorOpt = None, note: NoteOpt = None,
                  description: Annotated[str | None, typer.Option()] = None,
                  db: DbOpt = None) -> None:
    """Create a prompt; its version 1 is live at once."""
    try:
        mc = read_json_option(model_config, "--model-config")
        if mc is None:
            raise LockgateError("--model-config is required for a new prompt, e.g. "
                                '\'{"name": "gpt-4o-mini", "temperature": 0.2}\'')
        with _open(db) as lg:
            v = lg.prompts.create(name, read_template(file), model_config=mc,
                                  delivery_rule=read_json_option(delivery_rule,
                                                                 "--delivery-rule"),
                                  tag=tag, author=author, note=note, description=description)
    except LockgateError as exc:
        _fail(exc)
    console.print(f"prompt [bold]{name}[/bold]: version {v.version} is live "
                  f"(content {v.content_hash[:12]})")


@prompt_app.command("propose")
def prompt_propose(name: str,
                   file: Annotated[Path | None, typer.Option(
                       "--file", "-f", help="template file [default: the live template]")]
                   = None,
                   model_config: ModelOpt = None, delivery_rule: DeliveryOpt = None,
                   retry_policy: Annotated[str | None, typer.Option(
                       help="retry policy of the evaluation's calls (JSON or @file)")] = None,
                   tag: TagOpt = None, author: AuthorOpt = None, note: NoteOpt = None,
                   wait: Annotated[bool, typer.Option(help="wait for the decision")] = False,
                   timeout: Annotated[float | None, typer.Option(help="seconds to wait")]
                   = None,
                   db: DbOpt = None, config: ConfigOpt = None) -> None:
    """Submit a candidate to the release gate; prints its tracking id at once."""
    try:
        with _open(db, config) as lg:
            p = lg.prompts.propose(
                name, read_template(file) if file else None,
                model_config=read_json_option(model_config, "--model-config"),
                delivery_rule=read_json_option(delivery_rule, "--delivery-rule"),
                retry_policy=read_json_option(retry_policy, "--retry-policy"),
                tag=tag, author=author, note=note)
            console.print(f"candidate version {p.version} of [bold]{name}[/bold] against "
                          f"live v{p.base_version}: update [bold]{p.update_id}[/bold]"
                          + (f" (supersedes {', '.join(map(str, p.superseded))})"
                             if p.superseded else ""))
            out.print(p.update_id)
            if wait:
                _wait_and_show(lg, p.update_id, timeout)
    except LockgateError as exc:
        _fail(exc)


@prompt_app.command("show")
def prompt_show(name: str,
                version: Annotated[str | None, typer.Option(
                    help="number, tag or label [default: live]")] = None,
                db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """A prompt's live version, generation, labels and the content of one version."""
    try:
        with _open(db) as lg:
            info = lg.prompts.show(name, version)
    except LockgateError as exc:
        _fail(exc)
    if as_json:
        _json(info)
        return
    v = info["version"]
    labels = ", ".join(f"{k}->v{n}" for k, n in info["labels"].items()) or "-"
    out.print(f"[bold]{name}[/bold]  live v{info['live_version']}  generation "
              f"{info['generation']}  labels {labels}")
    out.print(f"version {v.version}  tag {v.tag or '-'}  content {v.content_hash}  "
              f"by {v.author or '-'} at {_when(v.created_at)}")
    sys.stdout.write(info["text"] + "\n")


@prompt_app.command("history")
def prompt_history(name: str, db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """Every version and the audit trail (who, when, from, to, why)."""
    try:
        with _open(db) as lg:
            h = lg.prompts.history(name)
    except LockgateError as exc:
        _fail(exc)
    if as_json:
        _json(h)
        return
    live = h["prompt"]["live_version"]
    t = Table(title=f"versions of {name}")
    for col in ("version", "tag", "content", "author", "created", "note"):
        t.add_column(col)
    for v in h["versions"]:
        t.add_row(f"v{v.version}" + (" (live)" if v.version == live else ""), v.tag or "",
                  v.content_hash[:12], v.author or "", _when(v.created_at), v.note or "")
    out.print(t)
    a = Table(title="audit trail")
    for col in ("when", "action", "from", "to", "update", "who", "why"):
        a.add_column(col)
    for r in h["audit"]:
        a.add_row(_when(r["created_at"]), r["action"] + (f" {r['label']}" if r["label"] else ""),
                  _v(r["from_version"]), _v(r["to_version"]),
                  str(r["update_id"] or ""), r["actor"] or "", r["reason"] or "")
    out.print(a)


def _v(n: int | None) -> str:
    return "" if n is None else f"v{n}"


@prompt_app.command("diff")
def prompt_diff(name: str, a: str,
                b: Annotated[str | None, typer.Argument(help="[default: live]")] = None,
                db: DbOpt = None) -> None:
    """Unified diff of two versions (template, model config, delivery rule)."""
    try:
        with _open(db) as lg:
            text = lg.prompts.diff(name, a, b)
    except LockgateError as exc:
        _fail(exc)
    sys.stdout.write((text or "(identical)") + "\n")


@prompt_app.command("rollback")
def prompt_rollback(name: str,
                    to: Annotated[str | None, typer.Option(
                        help="version [default: the one live before the last change]")]
                    = None,
                    reason: Annotated[str | None, typer.Option(help="why (audited)")] = None,
                    actor: AuthorOpt = None, db: DbOpt = None) -> None:
    """Compare-and-swap the live version back to a known-good one; no re-evaluation.
    Workers use it within about a second (at most 5)."""
    try:
        with _open(db) as lg:
            r = lg.prompts.rollback(name, to, actor=actor, reason=reason)
    except LockgateError as exc:
        _fail(exc)
    console.print(f"[bold]{name}[/bold]: live v{r['from']} -> v{r['to']} "
                  f"(generation {r['generation']})")


@prompt_app.command("label")
def prompt_label(name: str, label: str, version: str,
                 reason: Annotated[str | None, typer.Option()] = None, actor: AuthorOpt = None,
                 db: DbOpt = None) -> None:
    """Point a custom label (canary, …) at a version; tasks use it as NAME@LABEL."""
    try:
        with _open(db) as lg:
            before = lg.prompts.label(name, label, version, actor=actor, reason=reason)
            now = lg.prompts.version(name, label).version
    except LockgateError as exc:
        _fail(exc)
    console.print(f"{name}@{label}: {_v(before) or '(new)'} -> v{now}")


@prompt_app.command("list")
def prompt_list(db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """Every prompt with its live version."""
    try:
        with _open(db) as lg:
            rows = lg.prompts.list()
    except LockgateError as exc:
        _fail(exc)
    if as_json:
        _json(rows)
        return
    t = Table(title="prompts")
    for col in ("name", "live", "generation", "submissions", "updated"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], _v(r["live_version"]), str(r["generation"]),
                  str(r["submissions"]), _when(r["updated_at"]))
    out.print(t)


# -- dataset -----------------------------------------------------------------------------


@dataset_app.command("add")
def dataset_add(name: str, file: Path,
                replace: Annotated[bool, typer.Option(
                    help="the dataset becomes exactly this file")] = False,
                expected_column: Annotated[str | None, typer.Option(
                    help="CSV: the expected column [expected or label]")] = None,
                description: Annotated[str | None, typer.Option()] = None,
                db: DbOpt = None) -> None:
    """Add items from JSONL ({"id","input","expected"}) or CSV; a new revision."""
    try:
        with _open(db) as lg:
            r = lg.datasets.add(name, file, replace=replace, expected_column=expected_column,
                                description=description)
    except LockgateError as exc:
        _fail(exc)
    console.print(f"dataset [bold]{name}[/bold] revision {r['revision']}: {r['items']:,} "
                  f"items ({r['added']:,} added, {r['changed']:,} changed, "
                  f"{r['retired']:,} retired, {r['unchanged']:,} unchanged)")


@dataset_app.command("show")
def dataset_show(name: str, limit: Annotated[int, typer.Option(help="items shown")] = 5,
                 db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """A dataset's revision, size, items hash, input fields and first items."""
    try:
        with _open(db) as lg:
            info = lg.datasets.show(name, limit=limit)
    except LockgateError as exc:
        _fail(exc)
    if as_json:
        _json(info)
        return
    out.print(f"[bold]{name}[/bold]  revision {info['revision']}  {info['item_count']:,} items"
              f"  hash {info['items_hash'][:16]}  input fields {info['input_keys']}"
              f"  source {info['source'] or '-'}")
    for it in info["sample"]:
        sys.stdout.write(orjson.dumps({k: it[k] for k in ("id", "input", "expected")})
                         .decode() + "\n")


@dataset_app.command("list")
def dataset_list(db: DbOpt = None) -> None:
    """Every dataset with its revision and size."""
    try:
        with _open(db) as lg:
            rows = lg.datasets.list()
    except LockgateError as exc:
        _fail(exc)
    t = Table(title="datasets")
    for col in ("name", "revision", "items", "hash", "updated"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["name"], str(r["revision"]), f"{r['item_count']:,}", r["items_hash"][:16],
                  _when(r["updated_at"]))
    out.print(t)


# -- bind ----------------------------------------------------------------------------------


def _label_value(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def bind(prompt: str, dataset: str,
         threshold: Annotated[list[str], typer.Option(
             "--threshold", "-t", help="METRIC OP VALUE, e.g. accuracy>=0.9 (repeatable)")],
         compare: Annotated[str, typer.Option(
             help="exact | label:FIELD | fields:A,B | scorer:module:function")] = "exact",
         positive: Annotated[str | None, typer.Option(
             help="positive label for precision/recall/F1 (JSON or text)")] = None,
         ignore_case: Annotated[bool, typer.Option(help="compare text case-blind")] = False,
         confidence: Annotated[float | None, typer.Option(
             help="Wilson guard: the bound at this confidence must clear the threshold")]
         = None,
         min_samples: Annotated[int, typer.Option(help="minimum observations per metric")]
         = 0,
         non_inferiority: Annotated[float | None, typer.Option(
             help="margin: not worse than the live version by more than this")] = None,
         non_inferiority_metric: Annotated[str, typer.Option()] = "accuracy",
         undefined: Annotated[str, typer.Option(
             help="a metric with a zero denominator: fail | pass")] = "fail",
         price_in: Annotated[float | None, typer.Option(help="price per 1M input tokens")]
         = None,
         price_out: Annotated[float | None, typer.Option(help="price per 1M output tokens")]
         = None,
         remove: Annotated[bool, typer.Option("--remove", help="unbind instead")] = False,
         db: DbOpt = None) -> None:
    """Bind DATASET to PROMPT with per-metric thresholds (the release gate's bar)."""
    try:
        with _open(db) as lg:
            if remove:
                gone = lg.gate.unbind(prompt, dataset)
                console.print(f"{prompt} / {dataset}: " + ("unbound" if gone else "not bound"))
                return
            comp = parse_comparison(compare).model_copy(update={"ignore_case": ignore_case})
            prices = None
            if price_in is not None or price_out is not None:
                prices = (price_in or 0.0, price_out or 0.0)
            s = lg.gate.bind(
                prompt, dataset, thresholds=threshold, comparison=comp,
                positive=_label_value(positive), confidence=confidence,
                min_samples=min_samples,
                non_inferiority=None if non_inferiority is None else
                {"metric": non_inferiority_metric, "margin": non_inferiority},
                undefined=undefined, prices=prices)
    except LockgateError as exc:
        _fail(exc)
    console.print(f"{prompt} / {dataset}: " + "; ".join(str(t) for t in s.thresholds)
                  + f"  (compare {compare})")


# -- gate ------------------------------------------------------------------------------------


def progress_table(st: dict[str, Any]) -> Table:
    """Per-run progress of an update: materialised items, tasks done, verdicts."""
    t = Table(title=f"update {st['id']}: {st['prompt']} v{st['candidate_version']} "
                    f"(base v{st['base_version']})  {st['status']}")
    t.add_column("dataset")
    t.add_column("run", no_wrap=True)
    t.add_column("status", no_wrap=True)
    for col in ("items", "done", "match / mismatch / error"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in st["runs"]:
        tasks = r["tasks"]
        total = sum(tasks.values())
        done = total - tasks.get("PENDING", 0)
        v = r["verdicts"]
        who = f"v{r['version']}" + (" (live)" if r["subject"] == "baseline" else "")
        items = r["materialized"] if r["status"] != "MATERIALIZING" else total
        t.add_row(r["dataset"], who, r["status"], f"{items}/{r['expected_items']}",
                  f"{done}/{total}", f"{v.get('MATCH', 0)} / {v.get('MISMATCH', 0)} / "
                  f"{v.get('ERROR', 0)}")
    return t


def _num(x: Any) -> str:
    if x is None:
        return "undefined"
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def decision_table(st: dict[str, Any]) -> Table:
    """Each metric of each dataset against its threshold (raw values)."""
    d = st.get("decision") or {}
    t = Table(title=f"decision: {st['status']}" + (f" — {st['reason']}" if st.get("reason")
                                                  else ""))
    for col in ("dataset", "metric", "value", "bound", "threshold", "n", "result"):
        t.add_column(col, justify="right" if col in ("value", "bound", "n") else "left")
    for ds in d.get("datasets", []):
        if not ds["checks"]:
            t.add_row(ds["dataset"], "-", "-", "-", "-", "-",
                      f"[red]FAIL[/red] {ds.get('reason') or ds['status']}")
        for c in ds["checks"]:
            name = c["metric"] if c["kind"] == "threshold" else f"{c['metric']} vs live"
            limit = "-" if c["threshold"] is None else f"{c['op']} {_num(c['threshold'])}"
            result = "[green]pass[/green]" if c["passed"] else "[red]FAIL[/red]"
            if c.get("note"):
                result += f" [dim]{c['note']}[/dim]"
            t.add_row(ds["dataset"], name, _num(c["value"]), _num(c["bound"]) if c["bound"]
                      is not None else "", limit, "" if c["n"] is None else str(c["n"]),
                      result)
    return t


def _wait_and_show(lg: Lockgate, update_id: int, timeout: float | None) -> None:
    deadline = None if timeout is None else time.monotonic() + timeout
    with Live(console=console, refresh_per_second=4, transient=True) as live:
        while True:
            st = lg.gate.status(update_id)
            live.update(Group(progress_table(st)))
            if st["terminal"]:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise LockgateError(f"update {update_id} is still {st['status']} after "
                                    f"{timeout:g}s; are workers running (`lockgate worker`)?")
            time.sleep(0.5)
    out.print(progress_table(st))
    out.print(decision_table(st))
    if st["status"] != "ACTIVATED":
        raise typer.Exit(NOT_ACTIVATED)


@gate_app.command("status")
def gate_status(update_id: int,
                wait: Annotated[bool, typer.Option(
                    help="wait for the decision (exit 3 unless ACTIVATED)")] = False,
                timeout: Annotated[float | None, typer.Option(help="seconds to wait")] = None,
                db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """Progress per dataset and, once decided, each metric against its threshold."""
    try:
        with _open(db) as lg:
            if wait and not as_json:
                _wait_and_show(lg, update_id, timeout)
                return
            st = lg.gate.wait(update_id, timeout=timeout) if wait else \
                lg.gate.status(update_id)
    except (LockgateError, TimeoutError) as exc:
        _fail(exc)
    if as_json:
        _json(st)
        return
    out.print(progress_table(st))
    if st["decision"]:
        out.print(decision_table(st))


@gate_app.command("list")
def gate_list(prompt: Annotated[str | None, typer.Option()] = None,
              limit: Annotated[int, typer.Option()] = 20, db: DbOpt = None) -> None:
    """Recent candidates, newest first."""
    try:
        with _open(db) as lg:
            rows = lg.gate.list(prompt, limit=limit)
    except LockgateError as exc:
        _fail(exc)
    t = Table(title="release-gate updates")
    for col in ("id", "prompt", "candidate", "base", "status", "submitted", "decided",
                "reason"):
        t.add_column(col)
    for r in rows:
        t.add_row(str(r["id"]), r["prompt"], _v(r["candidate_version"]), _v(r["base_version"]),
                  r["status"], _when(r["created_at"]), _when(r["decided_at"]),
                  (r["reason"] or "")[:80])
    out.print(t)


@gate_app.command("cancel")
def gate_cancel(update_id: int,
                reason: Annotated[str, typer.Option(help="why (audited)")] = "withdrawn",
                actor: AuthorOpt = None, db: DbOpt = None) -> None:
    """Withdraw a candidate that is still PENDING or EVALUATING."""
    try:
        with _open(db) as lg:
            done = lg.gate.cancel(update_id, reason=reason, actor=actor)
            st = lg.gate.status(update_id)["status"]
    except LockgateError as exc:
        _fail(exc)
    console.print(f"update {update_id}: {st}" + ("" if done else " (already decided)"))
    if not done:
        raise typer.Exit(1)
