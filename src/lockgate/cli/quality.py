"""``lockgate quality [PROMPT]``: quality figures per prompt version, model or hour, from
the rollups the workers keep (docs/quality.md)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from lockgate.cli._common import (
    ConfigOpt,
    DbOpt,
    JsonOpt,
    app,
    command,
    console,
    opened,
    out,
    print_json,
    table,
)
from lockgate.config import config_file
from lockgate.errors import LockgateError
from lockgate.quality import BY

if TYPE_CHECKING:
    from lockgate.quality import QualityRow
    from lockgate.quality.rules import Finding


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.2f}%"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _share(counts: dict[str, int], name: str, of: int) -> str:
    return "-" if not of else f"{counts.get(name, 0) / of * 100:.2f}%"


def _watched(r: QualityRow, most: int = 4) -> str:
    ranked = sorted(r.watched.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{k} {v * 100:.1f}%" for k, v in ranked[:most]) or "-"
    if len(ranked) > most:
        text += f" (+{len(ranked) - most} more; --json lists all)"
    return text


@command(app, "quality")
def quality(prompt: Annotated[str | None, typer.Argument(
                help="a registry prompt (every version), NAME@N, or an inline key "
                     "(inline:…) [all]")] = None,
            since: Annotated[str, typer.Option(
                "--since", metavar="DURATION", help="how far back, e.g. 30m, 24h, 7d")] = "24h",
            by: Annotated[str, typer.Option(
                "--by", help=f"one row per: {', '.join(BY)}")] = "version",
            check: Annotated[bool, typer.Option(
                "--check", help="evaluate the four anomaly rules now instead ([quality] "
                                "window and thresholds)")] = False,
            as_json: JsonOpt = False, db: DbOpt = None, config: ConfigOpt = None) -> None:
    """Quality per prompt version: tasks, calls, field completeness (before fallbacks),
    schema conformance, invalid JSON, errors, latency p50/p95/p99, tokens per call,
    cost per task (retries and discarded calls included) and watched values."""
    if check:
        from lockgate.quality.report import check_rules  # deferred: start-up time

        if since != "24h" or by != "version":
            raise LockgateError("--check evaluates the rules over their own window "
                                "([quality] window) per prompt version and model: drop "
                                "--since and --by, or drop --check for the figures")

        with opened(db, config) as lg:
            prompt = lg.quality_key(prompt)
            findings = check_rules(lg.store, lg.settings.quality, prompt)
            off = _rollups_off(lg.settings.quality.rollups, config)
        if off and not findings and not as_json:
            out.print(f"no rule can be evaluated: the rules read the rollups, and {off}",
                      markup=False)
            return
        if off:
            console.print(f"note: {off}", markup=False)
        _print_findings(findings, as_json)
        return
    with opened(db, config) as lg:
        rows = lg.quality(prompt, since=since, by=by)  # (--since checked first)
        prompt = lg.quality_key(prompt)
        off = _rollups_off(lg.settings.quality.rollups, config)
    if off and (rows or as_json):
        console.print(f"note: {off}", markup=False)
    if as_json:
        print_json(rows)
        return
    if not rows:
        of = f" of {prompt}" if prompt else ""
        if off:
            out.print(f"no quality figures{of} for the last {since}: {off}", markup=False)
        else:
            out.print(f"no attempts{of} recorded in the last {since}", markup=False)
        return
    second = {"model": ["model"], "hour": ["hour (UTC)"]}.get(by, [])
    columns = ["prompt", *second, "tasks", "calls", "complete", "conform", "invalid json",
               "errors", "p50 ms", "p95 ms", "p99 ms", "in/out tok", "cost/task", "watched"]
    cells = [_cells(r, by) for r in rows]
    title = f"quality, last {since}"
    # A row of 14 figures needs a wide terminal; in a narrow one each row is printed as
    # a block of "figure value" lines instead (a table would fold the names away).
    needed = sum(max(len(c), *(len(row[i]) for row in cells)) + 3
                 for i, c in enumerate(columns)) + 1
    if needed > out.width:
        out.print(title, markup=False)
        for row in cells:
            block = Table(show_header=False, box=None, padding=(0, 2, 0, 0))
            block.add_column(no_wrap=True)
            block.add_column(overflow="fold")
            for name, value in zip(columns, row, strict=True):
                block.add_row(name, value)
            out.print()
            out.print(block)
        return
    t = table(title, columns, right=tuple(columns[1 + len(second):-1]))
    for row in cells:
        t.add_row(*row)
    out.print(t)


def _rollups_off(rollups: bool, config: Path | None) -> str | None:
    """With ``[quality] rollups = false``, what to say (the figures and the rules read
    the rollups, which workers then do not keep), naming the configuration file."""
    if rollups:
        return None
    chosen = config_file(config)
    where = f"in {chosen}" if chosen else "in the configuration"
    return (f"rollups are off ([quality] rollups = false {where}): workers keep no "
            "quality figures, though attempts are still recorded. Set rollups = true "
            "(the default) there and restart the workers; attempts written meanwhile "
            "stay out of the figures")


def _cells(r: QualityRow, by: str) -> list[str]:
    extra = [r.model or ""] if by == "model" else \
        [r.hour.strftime("%Y-%m-%d %H:00") if r.hour else ""] if by == "hour" else []
    per_call = "-" if not r.calls else \
        f"{r.input_tokens / r.calls:,.0f}/{r.output_tokens / r.calls:,.0f}"
    return [r.prompt, *extra, f"{r.tasks:,}", f"{r.calls:,}", _pct(r.completeness),
            _pct(r.conformance),
            _share(r.parse_status, "invalid_json", sum(r.parse_status.values())),
            _pct(sum(r.errors.values()) / r.attempts if r.attempts else None),
            _ms(r.latency_p50_ms), _ms(r.latency_p95_ms), _ms(r.latency_p99_ms),
            per_call, "-" if r.cost_per_task is None else f"{r.cost_per_task:.6f}",
            _watched(r)]


def _fig(rule: str, v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f} ms" if rule == "performance_degradation" else f"{v * 100:.2f}%"


def _print_findings(findings: list[Finding], as_json: bool) -> None:
    if as_json:
        print_json([{k: getattr(f, k) for k in f.__dataclass_fields__ if k != "decided"}
                    for f in findings])
        return
    if not findings:
        out.print("no prompt has the calls a rule needs", markup=False)
        return
    t = table("anomaly rules", ["rule", "prompt", "model", "value", "baseline", "threshold",
                                "calls", "state"],
              right=("value", "baseline", "threshold", "calls"))
    for f in findings:
        rule = f.rule if f.subject is None else f"{f.rule} ({f.subject})"
        t.add_row(rule, f.prompt, f.model, _fig(f.rule, f.value), _fig(f.rule, f.baseline),
                  _fig(f.rule, f.threshold), f"{f.calls:,}", "FIRING" if f.fired else "ok")
    out.print(t)
