"""A batch's summary as a table (``lockgate run`` prints it)."""

from __future__ import annotations

from rich.table import Table

from lockgate.results import BatchSummary


def _fmt(v: float | None, unit: str = "") -> str:
    return "-" if v is None else f"{v:,.1f}{unit}"


def summary_table(s: BatchSummary, extra: dict[str, str] | None = None) -> Table:
    """A two-column table of a summary (label, value)."""
    t = Table(title=f"batch {s.batch_id or '(all)'}", show_header=False)
    t.add_column("what", style="bold", overflow="fold")
    t.add_column("value", justify="right", overflow="fold")
    for state in ("SUCCEEDED", "FAILED", "DEAD", "CANCELLED", "PENDING", "REVIEW"):
        if s.states.get(state) or state == "SUCCEEDED":
            t.add_row(f"tasks {state}", f"{s.states.get(state, 0):,}")
    t.add_row("tasks total", f"{s.tasks:,}")
    t.add_row("calls made", f"{s.calls:,}")
    t.add_row("retries", f"{s.retries:,}")
    t.add_row("duplicate calls (discarded write-backs)", f"{s.duplicate_calls:,}")
    if s.errors:
        t.add_row("errors by class", ", ".join(f"{k} {v}" for k, v in sorted(s.errors.items())))
    if s.parse_status:
        t.add_row("parse status", ", ".join(f"{k} {v}" for k, v in
                                            sorted(s.parse_status.items())))
    t.add_row("throughput", _fmt(s.throughput, " tasks/s"))
    for q in ("p50", "p95", "p99"):
        t.add_row(f"latency {q}", _fmt(s.latency_ms[q], " ms"))
    comp = s.completeness
    t.add_row("field completeness", "-" if comp is None else f"{comp * 100:.2f}%")
    for k, v in (extra or {}).items():
        t.add_row(k, v)
    return t
