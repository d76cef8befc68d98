"""``lockgate circuit list|open|close``: the completeness circuits (docs/quality.md)."""

from __future__ import annotations

from collections.abc import Sequence

import typer
from rich.table import Table

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
from lockgate.durations import format_duration
from lockgate.results import CircuitView

circuit_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                          help="Completeness circuits: list them; open or close one by hand.")
app.add_typer(circuit_app, name="circuit")


def fallback_text(kind: str, target: str) -> str:
    """Where a circuit sends its tasks: ``review``, ``prompt name@N`` or ``endpoint
    NAME`` (as lockgate.quality.circuit.fallback_text words it in the log)."""
    return "review" if kind == "review" else f"{kind} {target}"


def circuit_table(circuits: Sequence[CircuitView]) -> Table:
    """One line per configured circuit: its state, since when and why, its fallback."""
    t = table("completeness circuits", ["prompt", "state", "since", "fallback", "threshold",
                                        "window", "probes", "reason"])
    for c in circuits:
        t.add_row(c.prompt, c.state + (" (by hand)" if c.manual else ""), when(c.since),
                  fallback_text(c.fallback_kind, c.fallback), f"{c.threshold:.1%}",
                  format_duration(c.window_s), f"{c.probe_share:.0%}", c.reason or "-")
    return t


@command(circuit_app, "list")
def list_(db: DbOpt = None, config: ConfigOpt = None, as_json: JsonOpt = False) -> None:
    """Every circuit configured under [[quality.circuit]], with its state now."""
    with opened(db, config) as lg:
        circuits = lg.circuits()
    if as_json:
        print_json([c.to_dict() for c in circuits])
        return
    if not circuits:
        console.print("no completeness circuit is configured ([[quality.circuit]] in "
                      "lockgate.toml)", markup=False)
        return
    out.print(circuit_table(circuits))


@command(circuit_app, "open")
def open_(prompt: str, db: DbOpt = None, config: ConfigOpt = None, actor: ActorOpt = None,
          reason: ReasonOpt = None) -> None:
    """Open PROMPT's circuit by hand: its new tasks go to the fallback (probes aside)
    until `lockgate circuit close`; the evaluator leaves it alone meanwhile."""
    with opened_for_change(db, config) as lg:
        was = next((x for x in lg.circuits() if x.prompt == prompt), None)
        c = lg.open_circuit(prompt, actor=actor, reason=reason)
    if was is not None and was.state == "OPEN":
        console.print(f"circuit {c.prompt} was already OPEN (since {when(c.since)}); it is "
                      "now held by hand: the evaluator leaves it open until `lockgate "
                      "circuit close`", markup=False)
        return
    console.print(f"circuit {c.prompt} is OPEN: new tasks go to "
                  f"{fallback_text(c.fallback_kind, c.fallback)}", markup=False)


@command(circuit_app, "close")
def close(prompt: str, db: DbOpt = None, config: ConfigOpt = None, actor: ActorOpt = None,
          reason: ReasonOpt = None) -> None:
    """Close PROMPT's circuit by hand: new tasks take the primary path again; it opens
    again only on minutes from now on."""
    with opened_for_change(db, config) as lg:
        c = lg.close_circuit(prompt, actor=actor, reason=reason)
    console.print(f"circuit {c.prompt} is CLOSED", markup=False)
