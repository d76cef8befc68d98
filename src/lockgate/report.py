"""Summaries of a batch for people: the table `lockgate run` and the demo print."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.table import Table

from lockgate.store import Store


def percentile(sorted_values: list[float], q: float) -> float | None:
    """The q-quantile (0..1) by nearest rank; None for no data."""
    if not sorted_values:
        return None
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


@dataclass
class BatchSummary:
    """What happened to a batch, from the database (not from any worker's memory)."""

    batch_id: str | None
    states: dict[str, int]
    calls: int
    retries: int
    duplicate_calls: int
    outcomes: dict[str, int]
    errors: dict[str, int]
    parse_status: dict[str, int]
    latency_ms: dict[str, float | None]
    completeness: float | None
    elapsed_s: float | None

    @property
    def tasks(self) -> int:
        return sum(self.states.values())

    @property
    def throughput(self) -> float | None:
        done = self.tasks - self.states.get("PENDING", 0)
        return done / self.elapsed_s if self.elapsed_s else None


def summarize(store: Store, batch_id: str | None, elapsed_s: float | None = None
              ) -> BatchSummary:
    """Collect the summary of one batch (or of everything)."""
    st = store.status()["batches"]
    states: dict[str, int] = {}
    for b, counts in st.items():
        if batch_id is None or b == batch_id:
            for k, v in counts.items():
                states[k] = states.get(k, 0) + v
    a: dict[str, Any] = store.attempt_stats(batch_id)
    lat = sorted(a["latencies_ms"])
    return BatchSummary(
        batch_id=batch_id, states=states, calls=a["calls"],
        retries=a["outcomes"].get("retry", 0),
        duplicate_calls=a["outcomes"].get("discarded", 0),
        outcomes=a["outcomes"], errors=a["errors"], parse_status=a["parse_status"],
        latency_ms={"p50": percentile(lat, 0.5), "p95": percentile(lat, 0.95),
                    "p99": percentile(lat, 0.99)},
        completeness=a["completeness"], elapsed_s=elapsed_s)


def _fmt(v: float | None, unit: str = "") -> str:
    return "-" if v is None else f"{v:,.1f}{unit}"


def summary_table(s: BatchSummary, extra: dict[str, str] | None = None) -> Table:
    """A rich table of a summary."""
    t = Table(title=f"batch {s.batch_id or '(all)'}", show_header=False, min_width=50)
    t.add_column("what", style="bold")
    t.add_column("value", justify="right")
    for state in ("SUCCEEDED", "FAILED", "DEAD", "CANCELLED", "PENDING"):
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
