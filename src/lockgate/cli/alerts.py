"""``lockgate alerts list|show|ack``: the quality alerts the evaluator keeps
(docs/quality.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from lockgate.cli._common import (
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
    table,
    when,
)

if TYPE_CHECKING:
    from lockgate.quality.alerts import Alert

alerts_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                         help="Quality alerts: list, show (with failing samples), ack.")
app.add_typer(alerts_app, name="alerts")

IdArg = Annotated[int, typer.Argument(help="the alert's id (see `lockgate alerts list`)")]


def _fig(a: Alert, v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f} ms" if a.rule == "performance_degradation" else f"{v * 100:.2f}%"


#: The rules' names in the 80-column list.
_SHORT = {"completeness_collapse": "completeness", "semantic_drift": "drift",
          "format_pollution": "pollution", "performance_degradation": "latency"}


def _rule(a: Alert) -> str:
    return a.rule if a.subject is None else f"{a.rule} ({a.subject})"


def _state(a: Alert) -> str:
    return a.status + (" acked" if a.acked else "")


@command(alerts_app, "list")
def list_(everything: Annotated[bool, typer.Option(
              "--all", help="resolved alerts too (newest first)")] = False,
          limit: Annotated[int, typer.Option(
              "--limit", min=1, help="the newest N alerts (open ones, or with --all "
                                     "all)")] = 1000,
          as_json: JsonOpt = False, db: DbOpt = None, config: ConfigOpt = None) -> None:
    """Open quality alerts (oldest first): rule, prompt version, model, the value
    against its threshold (limit), tasks touched since onset, OPEN or RESOLVED and
    whether acknowledged."""
    with opened(db, config) as lg:
        rows = lg.alerts(everything=everything, limit=limit)
    if len(rows) == limit:  # there may be more: say so, off stdout
        console.print(f"the newest {limit:,} {'' if everything else 'open '}alerts; older "
                      "ones with a larger --limit", markup=False)
    if as_json:
        print_json(rows)
        return
    if not rows:
        out.print("no open alert" if not everything else "no alert", markup=False)
        return
    t = table("quality alerts", ["id", "rule", "prompt", "model", "value", "limit",
                                 "tasks", "state"],
              right=("id", "value", "limit", "tasks"))
    for a in rows:
        short = _SHORT.get(a.rule, a.rule) + (f" {a.subject}" if a.subject else "")
        t.add_row(str(a.id), short, a.prompt, a.model, _fig(a, a.value),
                  _fig(a, a.threshold), f"{a.tasks:,}", _state(a))
    out.print(t)


@command(alerts_app, "show")
def show(alert_id: IdArg, as_json: JsonOpt = False, db: DbOpt = None,
         config: ConfigOpt = None) -> None:
    """An alert, its failing samples (rendered prompt and raw output) and its webhook
    deliveries."""
    with opened(db, config) as lg:
        a = lg.alert(alert_id)
    if as_json:
        print_json(a)
        return
    batches = f"{a.batches:,}" + ("" if a.batches_exact else "+")
    lines = [f"alert {a.id}: {_rule(a)} — {_state(a)}",
             f"prompt {a.prompt}, model {a.model}",
             f"value {_fig(a, a.value)}, baseline {_fig(a, a.baseline)}, threshold "
             f"{_fig(a, a.threshold)}, {a.calls:,} calls in the window",
             f"since onset {when(a.onset)}: {a.tasks:,} tasks, {batches} batches",
             f"opened {when(a.opened_at)}, updated {when(a.updated_at)}, resolved "
             f"{when(a.resolved_at)}"]
    if a.acked:
        lines.append(f"acked {when(a.acked_at)} by {a.acked_by or '-'}"
                     + (f": {a.ack_reason}" if a.ack_reason else ""))
    for line in lines:
        out.print(line, markup=False)
    for d in a.deliveries:
        out.print(f"webhook {d['target']}: {d['event']} {d['status']} after "
                  f"{d['attempts']} attempt(s)"
                  + (f" ({d['last_error']})" if d.get("last_error") else ""), markup=False)
    out.print(f"{len(a.samples)} failing sample(s), newest first", markup=False)
    for s in a.samples:
        fig = f"{s.latency_ms:,.0f} ms" if s.latency_ms is not None else "-"
        out.print(f"\n-- attempt {s.attempt_id}, task {s.task_id} (batch {s.batch_id}), "
                  f"{when(s.started_at)}, {s.parse_status or '-'}, completeness "
                  f"{'-' if s.completeness is None else f'{s.completeness:.2f}'}, {fig}",
                  markup=False)
        out.print(f"prompt: {s.prompt or '-'}", markup=False)
        out.print(f"output: {s.raw_output or '-'}", markup=False)


@command(alerts_app, "ack")
def ack(alert_id: IdArg, actor: ActorOpt = None, reason: ReasonOpt = None,
        db: DbOpt = None, config: ConfigOpt = None) -> None:
    """Acknowledge an alert: it is still updated while it lasts and resolves as before."""
    with opened_for_change(db, config) as lg:
        before = lg.alert(alert_id)
        a = lg.ack_alert(alert_id, actor=actor, reason=reason)
    if before.acked:
        out.print(f"alert {a.id} was already acked by {a.acked_by or '-'} at "
                  f"{when(a.acked_at)}", markup=False)
    else:
        out.print(f"alert {a.id} acked by {a.acked_by or '-'}", markup=False)
