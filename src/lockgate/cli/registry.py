"""Command line of the prompt registry and release gate: ``lockgate prompt …``,
``lockgate dataset …``, ``lockgate bind …``, ``lockgate gate …`` (docs/gate.md)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Group
from rich.live import Live
from rich.table import Table

from lockgate.app import Lockgate
from lockgate.cli._common import (
    DURATION_HELP,
    ActorOpt,
    ConfigOpt,
    DbOpt,
    JsonOpt,
    ReasonOpt,
    app,
    command,
    console,
    opened,
    opened_for_change,
    out,
    print_json,
    seconds,
    table,
    when,
)
from lockgate.errors import ConfigError, LockgateError, NotFound, StateConflict
from lockgate.gate.binding import parse_comparison
from lockgate.registry.content import read_json_option, read_template
from lockgate.registry.experiments import (
    DEFAULT_FOR,
    DEFAULT_SHARE,
    MIN_GAIN,
    MIN_TASKS,
    share_text,
)
from lockgate.store.registry import prompt_exists

prompt_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                         help="Prompts: versions, proposals, history, diff, rollback.")
dataset_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                          help="Labelled datasets for the release gate.")
gate_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                       help="Release-gate evaluations and decisions.")
experiment_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                             help="A/B tests: a version takes a share of the live "
                                  "traffic, then is promoted or not (docs/quality.md).")
prompt_app.add_typer(experiment_app, name="experiment")
app.add_typer(prompt_app, name="prompt")
app.add_typer(dataset_app, name="dataset")
app.add_typer(gate_app, name="gate")

ModelOpt = Annotated[str | None, typer.Option(
    "--model-config", help="JSON object or @file.json [propose: the live version's]")]
DeliveryOpt = Annotated[str | None, typer.Option(
    "--delivery-rule", help="JSON object or @file.json [propose: the live version's]")]
TagOpt = Annotated[str | None, typer.Option(help="a tag for the version, e.g. prompt-v1.2.3")]
TimeoutOpt = Annotated[str | None, typer.Option(
    "--timeout", metavar="DURATION", help=f"how long to wait [forever]; {DURATION_HELP}")]
FileHelp = ("template file: text with [system] / [user] section lines (one message each), "
            "plain text (one user message) or JSON (a list of {role, content})")

#: Exit code of ``gate status --wait`` when the candidate did not go live.
NOT_ACTIVATED = 3


# -- prompt ------------------------------------------------------------------------------


@command(prompt_app, "create")
def prompt_create(name: str,
                  file: Annotated[Path, typer.Option("--file", "-f", help=FileHelp)],
                  model_config: ModelOpt = None, delivery_rule: DeliveryOpt = None,
                  tag: TagOpt = None, actor: ActorOpt = None, reason: ReasonOpt = None,
                  description: Annotated[str | None, typer.Option()] = None,
                  db: DbOpt = None, config: ConfigOpt = None) -> None:
    """Create a prompt; its version 1 is live at once."""
    template = read_template(file)
    mc = read_json_option(model_config, "--model-config")
    if mc is None:
        _refuse_existing(name, db, config)
        raise LockgateError("--model-config is required for a new prompt, e.g. "
                            '\'{"name": "gpt-4o-mini", "temperature": 0.2}\'')
    with opened(db, config, create=True) as lg:
        v = lg.prompts.create(name, template, model_config=mc,
                              delivery_rule=read_json_option(delivery_rule,
                                                             "--delivery-rule"),
                              tag=tag, author=actor, note=reason, description=description)
    console.print(f"prompt {name}: version {v.version} is live "
                  f"(content {v.content_hash[:12]})", markup=False)


def _refuse_existing(name: str, db: str | None, config: Path | None) -> None:
    """``create`` without --model-config of a prompt that exists: say that it exists
    (its next version is proposed), not that a new prompt needs a model config. A
    database that does not exist yet is not made for it."""
    try:
        with opened(db, config) as lg:
            lg.prompts.registry.prompt(name)
    except (ConfigError, NotFound):
        return
    raise prompt_exists(name)


@command(prompt_app, "propose")
def prompt_propose(name: str,
                   file: Annotated[Path | None, typer.Option(
                       "--file", "-f", help=FileHelp + " [default: the live template]")]
                   = None,
                   model_config: ModelOpt = None, delivery_rule: DeliveryOpt = None,
                   retry_policy: Annotated[str | None, typer.Option(
                       help="retry policy of the evaluation's calls (JSON or @file)")] = None,
                   tag: TagOpt = None, actor: ActorOpt = None, reason: ReasonOpt = None,
                   wait: Annotated[bool, typer.Option(
                       "--wait", help="wait for the decision (exit 3 unless ACTIVATED)")]
                   = False,
                   timeout: TimeoutOpt = None,
                   db: DbOpt = None, config: ConfigOpt = None) -> None:
    """Submit a candidate to the release gate; prints its tracking id at once."""
    wait_s = seconds(timeout, "timeout")
    with opened_for_change(db, config) as lg:
        p = lg.prompts.propose(
            name, read_template(file) if file else None,
            model_config=read_json_option(model_config, "--model-config"),
            delivery_rule=read_json_option(delivery_rule, "--delivery-rule"),
            retry_policy=read_json_option(retry_policy, "--retry-policy"),
            tag=tag, author=actor, note=reason)
        console.print(f"candidate version {p.version} of {name} against "
                      f"live v{p.base_version}: update {p.update_id}"
                      + (f" (supersedes {', '.join(map(str, p.superseded))})"
                         if p.superseded else ""), markup=False)
        out.print(p.update_id)
        if wait:
            _wait_and_show(lg, p.update_id, wait_s)


@command(prompt_app, "show")
def prompt_show(name: str,
                version: Annotated[str | None, typer.Option(
                    help="number, tag or label [default: live]")] = None,
                db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """A prompt's live version, generation, labels and the content of one version."""
    with opened(db) as lg:
        info = lg.prompts.show(name, version)
    if as_json:
        print_json(info)
        return
    v = info["version"]
    labels = ", ".join(f"{k}->v{n}" for k, n in info["labels"].items()) or "-"
    out.print(f"[bold]{name}[/bold]  live v{info['live_version']}  generation "
              f"{info['generation']}  labels {labels}")
    out.print(f"version {v.version}  tag {v.tag or '-'}  content {v.content_hash}  "
              f"by {v.author or '-'} at {when(v.created_at)}")
    sys.stdout.write(info["text"] + "\n")


@command(prompt_app, "history")
def prompt_history(name: str, db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """Every version and the audit trail (who, when, from, to, why)."""
    with opened(db) as lg:
        h = lg.prompts.history(name)
    if as_json:
        print_json(h)
        return
    live = h["prompt"]["live_version"]
    t = table(f"versions of {name}",
              ("version", "tag", "content", "author", "created", "note"))
    for v in h["versions"]:
        t.add_row(f"v{v.version}" + (" (live)" if v.version == live else ""), v.tag or "",
                  v.content_hash[:12], v.author or "", when(v.created_at), v.note or "")
    out.print(t)
    a = table("audit trail", ("when", "action", "from", "to", "update", "who", "why"))
    for r in h["audit"]:
        a.add_row(when(r["created_at"]), r["action"] + (f" {r['label']}" if r["label"] else ""),
                  _v(r["from_version"]), _v(r["to_version"]),
                  str(r["update_id"] or ""), r["actor"] or "", r["reason"] or "")
    out.print(a)


def _v(n: int | None) -> str:
    return "" if n is None else f"v{n}"


@command(prompt_app, "diff")
def prompt_diff(name: str, a: str,
                b: Annotated[str | None, typer.Argument(help="[default: live]")] = None,
                db: DbOpt = None) -> None:
    """Unified diff of two versions (template, model config, delivery rule)."""
    with opened(db) as lg:
        text = lg.prompts.diff(name, a, b)
    sys.stdout.write((text or "(identical)") + "\n")


@command(prompt_app, "rollback")
def prompt_rollback(name: str,
                    to: Annotated[str | None, typer.Option(
                        help="version [default: the one live before the last change]")]
                    = None,
                    reason: ReasonOpt = None, actor: ActorOpt = None,
                    db: DbOpt = None) -> None:
    """Compare-and-swap the live version back to a known-good one; no re-evaluation.
    Workers use it within about a second (at most 5)."""
    with opened_for_change(db) as lg:
        r = lg.prompts.rollback(name, to, actor=actor, reason=reason)
    console.print(f"{name}: live v{r['from']} -> v{r['to']} "
                  f"(generation {r['generation']})", markup=False)


@command(prompt_app, "label")
def prompt_label(name: str, label: str, version: str,
                 reason: ReasonOpt = None, actor: ActorOpt = None,
                 db: DbOpt = None) -> None:
    """Point a custom label (canary, …) at a version; tasks use it as NAME@LABEL."""
    with opened_for_change(db) as lg:
        before = lg.prompts.label(name, label, version, actor=actor, reason=reason)
        now = lg.prompts.version(name, label).version
    console.print(f"{name}@{label}: {_v(before) or '(new)'} -> v{now}", markup=False)


@command(prompt_app, "list")
def prompt_list(db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """Every prompt with its live version."""
    with opened(db) as lg:
        rows = lg.prompts.list()
    if as_json:
        print_json(rows)
        return
    t = table("prompts", ("name", "live", "generation", "submissions", "updated"))
    for r in rows:
        t.add_row(r["name"], _v(r["live_version"]), str(r["generation"]),
                  str(r["submissions"]), when(r["updated_at"]))
    out.print(t)


# -- prompt experiment -------------------------------------------------------------------

MinGainOpt = Annotated[float, typer.Option(
    "--min-gain", help="rise in completeness the candidate needs, in share points "
                       "(0.02: 0.95 -> 0.97)")]
MinTasksOpt = Annotated[int, typer.Option(
    "--min-tasks", help="finished tasks each arm needs before a decision")]


@command(experiment_app, "start")
def experiment_start(name: str,
                     version: Annotated[str, typer.Option(
                         "--version", help="the candidate: number, vN, tag or label")],
                     share: Annotated[str, typer.Option(
                         help="its share of the live traffic: 5% or 0.05 (at most 50%)")]
                     = DEFAULT_SHARE,
                     duration: Annotated[str, typer.Option(
                         "--for", metavar="DURATION", help=f"how long; {DURATION_HELP}")]
                     = DEFAULT_FOR,
                     actor: ActorOpt = None, reason: ReasonOpt = None,
                     db: DbOpt = None) -> None:
    """Give a version a share of the tasks that follow the live version (NAME,
    NAME@production) for a time; the live version is the control."""
    with opened_for_change(db) as lg:
        e = lg.prompts.start_experiment(name, version, share=share, duration=duration,
                                        actor=actor, reason=reason)
    console.print(f"{name}: experiment {e['id']} runs v{e['candidate_version']} on "
                  f"{share_text(e['share_bp'])} of the live traffic (control "
                  f"v{e['control_version']}) until {when(e['ends_at'])}", markup=False)


def _figure(x: float | None, spec: str = ".4f") -> str:
    """A figure of an arm; "-" where nothing was measured (no prices, no outputs)."""
    return "-" if x is None else format(x, spec)


#: The figures of an arm, as the columns (or, in a narrow terminal, the rows) name them.
ARM_FIGURES = ("version", "tasks", "completeness", "conformance", "cost/task", "tokens/task",
               "errors", "p95 ms")


def _arm_cells(f: dict[str, Any]) -> list[str]:
    return [f["version"], f"{f['tasks']:,}", _figure(f["completeness"]),
            _figure(f["conformance"]), _figure(f["cost_per_task"], ".6g"),
            _figure(f["tokens_per_task"], ".1f"), _figure(f["error_share"]),
            _figure(f["latency_p95_ms"], ".0f")]


def _arms_table(e: dict[str, Any]) -> Table:
    """Both arms' figures, the control first (a stored decision may list the candidate
    first). One row per arm where the nine columns fit; in a narrower terminal one row
    per figure and one column per arm, as the numeric columns never wrap and would
    squeeze the arm and version columns to nothing."""
    arms = sorted(e["decision"]["arms"].items(), key=lambda kv: kv[0] != "control")
    cells = [[arm, *_arm_cells(f)] for arm, f in arms]
    title = f"experiment {e['id']} of {e['prompt']}"
    columns = ("arm", *ARM_FIGURES)
    needed = sum(max(len(c), *(len(row[i]) for row in cells))
                 for i, c in enumerate(columns)) + 3 * len(columns) + 1
    if needed <= out.width:
        t = table(title, columns, right=ARM_FIGURES[1:])
        for row in cells:
            t.add_row(*row)
        return t
    t = Table(title=title)
    t.add_column("figure", no_wrap=True)
    for arm, _f in arms:
        t.add_column(arm, justify="right", overflow="fold")
    for i, figure in enumerate(ARM_FIGURES, start=1):
        t.add_row(figure, *(row[i] for row in cells))
    return t


def _experiment_state(e: dict[str, Any]) -> str:
    """The status, and for a running test that no longer splits the traffic, so."""
    if e["status"] == "RUNNING" and not e["splitting"]:
        return f"{e['status']} (not splitting)"
    return str(e["status"])


def _show_experiment(e: dict[str, Any]) -> None:
    ended = (f"ended {when(e['concluded_at'])}" if e["concluded_at"]
             else f"ends {when(e['ends_at'])}")
    out.print(f"{e['prompt']}: experiment {e['id']} {_experiment_state(e)}  "
              f"v{e['candidate_version']} on {share_text(e['share_bp'])} against "
              f"v{e['control_version']}  started {when(e['started_at'])}  {ended}",
              markup=False)
    if e["status"] == "RUNNING" and not e["splitting"]:
        out.print(f"not splitting traffic: {e['split_reason']}", markup=False)
    d = e["decision"]
    if d and d.get("arms"):
        out.print(_arms_table(e))
        said = "verdict" if e["status"] != "RUNNING" else "verdict now"
        out.print(f"{said}: {d['verdict']} ({d['why']})", markup=False)


@command(experiment_app, "status")
def experiment_status(name: str, min_gain: MinGainOpt = MIN_GAIN,
                      min_tasks: MinTasksOpt = MIN_TASKS, db: DbOpt = None,
                      as_json: JsonOpt = False) -> None:
    """The prompt's newest A/B test, each arm's figures since it started, and the
    verdict the promotion rule gives now."""
    with opened(db) as lg:
        e = lg.prompts.experiment_status(name, min_gain=min_gain, min_tasks=min_tasks)
    if as_json:
        print_json(e)
        return
    _show_experiment(e)


@command(experiment_app, "conclude")
def experiment_conclude(name: str, min_gain: MinGainOpt = MIN_GAIN,
                        min_tasks: MinTasksOpt = MIN_TASKS,
                        stop: Annotated[bool, typer.Option(
                            "--stop", help="too few tasks: end it undecided (STOPPED)")]
                        = False,
                        actor: ActorOpt = None, reason: ReasonOpt = None,
                        db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """Promote the candidate only if its completeness rose by --min-gain and its cost
    per task did not rise (tokens per task without prices); else keep the control."""
    with opened_for_change(db) as lg:
        e = lg.prompts.conclude_experiment(name, min_gain=min_gain, min_tasks=min_tasks,
                                           stop=stop, actor=actor, reason=reason)
    if as_json:
        print_json(e)
        return
    _show_experiment(e)
    if e["status"] == "PROMOTED":
        console.print(f"{name}: live v{e['control_version']} -> v{e['candidate_version']} "
                      f"(generation {e['generation']}); `lockgate prompt rollback {name}` "
                      "undoes it", markup=False)


@command(experiment_app, "stop")
def experiment_stop(name: str, actor: ActorOpt = None, reason: ReasonOpt = None,
                    db: DbOpt = None) -> None:
    """End the running A/B test without a decision; the live version stays."""
    with opened_for_change(db) as lg:
        e = lg.prompts.stop_experiment(name, actor=actor, reason=reason)
        live = lg.prompts.registry.prompt(name)["live_version"]
    moved = ("" if live == e["control_version"] else
             f" (the control, v{e['control_version']}, is no longer live)")
    console.print(f"{name}: experiment {e['id']} STOPPED; live stays v{live}{moved}",
                  markup=False)


@command(experiment_app, "list")
def experiment_list(name: Annotated[str | None, typer.Argument()] = None,
                    db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """Every A/B test (of one prompt), oldest first."""
    with opened(db) as lg:
        rows = lg.prompts.experiments(name)
    if as_json:
        print_json(rows)
        return
    t = table("experiments", ("id", "prompt", "candidate", "control", "share", "status",
                              "started", "ends/ended"))
    for r in rows:
        t.add_row(str(r["id"]), r["prompt"], f"v{r['candidate_version']}",
                  f"v{r['control_version']}", share_text(r["share_bp"]), _experiment_state(r),
                  when(r["started_at"]), when(r["concluded_at"] or r["ends_at"]))
    out.print(t)


# -- dataset -----------------------------------------------------------------------------


@command(dataset_app, "add")
def dataset_add(name: str, file: Path,
                replace: Annotated[bool, typer.Option(
                    help="the dataset becomes exactly this file")] = False,
                expected_column: Annotated[str | None, typer.Option(
                    help="CSV: the expected column [expected or label]")] = None,
                description: Annotated[str | None, typer.Option()] = None,
                db: DbOpt = None) -> None:
    """Add items from JSONL ({"id","input","expected"}) or CSV; a new revision."""
    with opened(db, create=True) as lg:
        r = lg.datasets.add(name, file, replace=replace, expected_column=expected_column,
                            description=description)
    console.print(f"dataset {name} revision {r['revision']}: {r['items']:,} "
                  f"items ({r['added']:,} added, {r['changed']:,} changed, "
                  f"{r['retired']:,} retired, {r['unchanged']:,} unchanged)", markup=False)
    if r["ignored_keys"]:
        keys = ", ".join(f"'{k}' ({n:,} item{'s' if n > 1 else ''})"
                         for k, n in sorted(r["ignored_keys"].items()))
        console.print(f"note: not stored, beside 'input': {keys}. Only id, input and "
                      "expected (or label) are kept; an input field goes inside 'input'",
                      markup=False)


@command(dataset_app, "show")
def dataset_show(name: str, limit: Annotated[int, typer.Option(help="items shown")] = 5,
                 db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """A dataset's revision, size, items hash, input fields and first items."""
    with opened(db) as lg:
        info = lg.datasets.show(name, limit=limit)
    if as_json:
        print_json(info)
        return
    out.print(f"[bold]{name}[/bold]  revision {info['revision']}  {info['item_count']:,} items"
              f"  hash {info['items_hash'][:16]}  input fields {info['input_keys']}"
              f"  source {info['source'] or '-'}")
    for it in info["sample"]:
        sys.stdout.write(orjson.dumps({k: it[k] for k in ("id", "input", "expected")})
                         .decode() + "\n")


@command(dataset_app, "list")
def dataset_list(db: DbOpt = None) -> None:
    """Every dataset with its revision and size."""
    with opened(db) as lg:
        rows = lg.datasets.list()
    t = table("datasets", ("name", "revision", "items", "hash", "updated"))
    for r in rows:
        t.add_row(r["name"], str(r["revision"]), f"{r['item_count']:,}", r["items_hash"][:16],
                  when(r["updated_at"]))
    out.print(t)


# -- bind ----------------------------------------------------------------------------------


def _label_value(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


@command(app, "bind")
def bind(prompt: str, dataset: str,
         threshold: Annotated[list[str] | None, typer.Option(
             "--threshold", "-t", help="METRIC OP VALUE, e.g. accuracy>=0.9 (repeatable; "
                                       "at least one, unless --remove)")] = None,
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
    """Bind DATASET to PROMPT with per-metric thresholds (the release gate's bar), or
    unbind it with --remove."""
    if remove and threshold:
        raise LockgateError("--remove unbinds the dataset and takes no --threshold: give "
                            "one or the other")
    if not remove and not threshold:
        raise LockgateError("give at least one threshold with -t METRIC OP VALUE, e.g. "
                            "-t 'accuracy>=0.9' (or --remove to unbind)")
    with opened_for_change(db) as lg:
        if remove:
            gone = lg.gate.unbind(prompt, dataset)
            console.print(f"{prompt} / {dataset}: " + ("unbound" if gone else "not bound"),
                          markup=False)
            return
        assert threshold is not None
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
    extras = [f"compare {compare}"]
    if s.guard is not None:
        if s.guard.confidence is not None:
            extras.append(f"Wilson bound at {s.guard.confidence:g} confidence must clear "
                          "each threshold")
        if s.guard.min_samples:
            extras.append(f"at least {s.guard.min_samples} samples")
    if s.non_inferiority is not None:
        extras.append(f"{s.non_inferiority.metric} not worse than live by more than "
                      f"{s.non_inferiority.margin:g}")
    console.print(f"{prompt} / {dataset}: " + "; ".join(str(t) for t in s.thresholds)
                  + "  (" + "; ".join(extras) + ")", markup=False)


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
        lost = int(((r.get("metrics") or {}).get("counts") or {}).get("not_evaluated", 0))
        t.add_row(r["dataset"], who, r["status"], f"{items}/{r['expected_items']}",
                  f"{done}/{total}", f"{v.get('MATCH', 0)} / {v.get('MISMATCH', 0)} / "
                  f"{v.get('ERROR', 0)}" + (f" ({lost} not evaluated)" if lost else ""))
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


def _undecided(st: dict[str, Any], timeout: float | None) -> typer.Exit:
    """A wait that timed out: the candidate is not live (yet), so exit 3 as for any
    other "not live", saying so and how to wait again (exit 2 stays for usage errors)."""
    uid = st["id"]
    console.print(f"update {uid} is still {st['status']} after {timeout or 0:g}s: not "
                  f"decided yet, live unchanged; wait again with `lockgate gate status "
                  f"{uid} --wait` (are workers running? `lockgate worker`)", markup=False)
    return typer.Exit(NOT_ACTIVATED)


def _wait_and_show(lg: Lockgate, update_id: int, timeout: float | None) -> None:
    deadline = None if timeout is None else time.monotonic() + timeout
    with Live(console=console, refresh_per_second=4, transient=True) as live:
        while True:
            st = lg.gate.status(update_id)
            live.update(Group(progress_table(st)))
            if st["terminal"]:
                break
            if deadline is not None and time.monotonic() > deadline:
                break
            time.sleep(0.5)
    out.print(progress_table(st))
    if not st["terminal"]:
        raise _undecided(st, timeout)
    out.print(decision_table(st))
    if st["status"] != "ACTIVATED":
        raise typer.Exit(NOT_ACTIVATED)


@command(gate_app, "status")
def gate_status(update_id: int,
                wait: Annotated[bool, typer.Option(
                    help="wait for the decision (exit 3 unless ACTIVATED)")] = False,
                timeout: TimeoutOpt = None,
                db: DbOpt = None, as_json: JsonOpt = False) -> None:
    """Progress per dataset and, once decided, each metric against its threshold."""
    wait_s = seconds(timeout, "timeout")
    with opened(db) as lg:
        if wait and not as_json:
            _wait_and_show(lg, update_id, wait_s)
            return
        try:
            st = lg.gate.wait(update_id, timeout=wait_s) if wait else \
                lg.gate.status(update_id)
        except TimeoutError:
            st = lg.gate.status(update_id)
            if not st["terminal"]:  # else it was decided just now: shown below
                print_json(st)
                raise _undecided(st, wait_s) from None
    if as_json:
        print_json(st)
        if wait and st["status"] != "ACTIVATED":
            raise typer.Exit(NOT_ACTIVATED)
        return
    out.print(progress_table(st))
    if st["decision"]:
        out.print(decision_table(st))


@command(gate_app, "list")
def gate_list(prompt: Annotated[str | None, typer.Option()] = None,
              limit: Annotated[int, typer.Option()] = 20, db: DbOpt = None) -> None:
    """Recent candidates, newest first."""
    with opened(db) as lg:
        rows = lg.gate.list(prompt, limit=limit)
    t = table("release-gate updates", ("id", "prompt", "candidate", "base", "status",
                                       "submitted", "decided", "reason"))
    for r in rows:
        t.add_row(str(r["id"]), r["prompt"], _v(r["candidate_version"]), _v(r["base_version"]),
                  r["status"], when(r["created_at"]), when(r["decided_at"]),
                  (r["reason"] or "")[:80])
    out.print(t)


@command(gate_app, "cancel")
def gate_cancel(update_id: int,
                reason: ReasonOpt = None, actor: ActorOpt = None,
                db: DbOpt = None) -> None:
    """Withdraw a candidate that is still PENDING or EVALUATING."""
    with opened_for_change(db) as lg:
        done = lg.gate.cancel(update_id, reason=reason or "withdrawn", actor=actor)
        st = lg.gate.status(update_id)["status"]
    if not done and st == "CANCELLED":  # withdrawn before: the same end
        console.print(f"update {update_id}: CANCELLED (already withdrawn)", markup=False)
        return
    if not done:
        raise StateConflict(f"update {update_id} is already decided ({st}): only a PENDING "
                            "or EVALUATING candidate can be withdrawn; see lockgate gate "
                            f"status {update_id}")
    console.print(f"update {update_id}: {st}", markup=False)
