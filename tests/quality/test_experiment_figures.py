"""The promotion rule of an A/B test (docs/quality.md "A/B tests") on the figures of two
arms: completeness must rise by min_gain (absolute), the cost per task must not rise
(tokens per task while no price is configured), each arm needs min_tasks."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lockgate.quality.experiments import KEEP, PROMOTE, UNDECIDED, verdict


def arm(completeness: float | None, *, tasks: int = 500, cost: float | None = None,
        tokens: float = 400.0) -> dict[str, Any]:
    return {"version": "p@1", "tasks": tasks, "calls": tasks, "completeness": completeness,
            "conformance": 1.0, "cost_per_task": cost, "tokens_per_task": tokens,
            "error_share": 0.0, "latency_p95_ms": 100.0}


@pytest.mark.parametrize(("control", "candidate", "want", "basis"), [
    (arm(0.95), arm(0.97), PROMOTE, "tokens"),  # exactly +0.02: meets it
    (arm(0.95), arm(0.9699), KEEP, "tokens"),  # short of +0.02
    (arm(0.50), arm(1.0, tokens=401), KEEP, "tokens"),  # more tokens per task
    (arm(0.50, cost=0.002), arm(1.0, cost=0.002, tokens=900), PROMOTE, "cost"),  # priced
    (arm(0.50, cost=0.002), arm(1.0, cost=0.0021), KEEP, "cost"),
    (arm(0.50, cost=0.002), arm(1.0, cost=None, tokens=100), PROMOTE, "tokens"),
    (arm(None), arm(1.0), KEEP, "tokens"),  # nothing parsed in the control
    (arm(0.5, tasks=99), arm(1.0), UNDECIDED, "tokens"),
    (arm(0.5), arm(1.0, tasks=0), UNDECIDED, "tokens"),
])
def test_the_rule(control: dict[str, Any], candidate: dict[str, Any], want: str,
                  basis: str) -> None:
    v = verdict(control, candidate, min_gain=0.02, min_tasks=100)
    assert (v["verdict"], v["basis"]) == (want, basis), v["why"]
    if basis == "tokens" and want != UNDECIDED and control["completeness"] is not None:
        assert "no prices configured" in v["why"]


def test_too_few_tasks_names_both_counts() -> None:
    v = verdict(arm(0.5, tasks=1234), arm(1.0, tasks=56), min_gain=0.02, min_tasks=100)
    assert v["verdict"] == UNDECIDED
    assert "the control has 1,234, the candidate 56; each arm needs 100" in v["why"]


@given(st.floats(0, 1), st.floats(0, 1), st.floats(0, 0.5))
def test_promotion_needs_the_gain(before: float, after: float, gain: float) -> None:
    v = verdict(arm(before), arm(after), min_gain=gain, min_tasks=1)
    if v["verdict"] == PROMOTE:
        assert after - before >= gain - 1e-9
    if after - before >= gain + 1e-9:
        assert v["verdict"] == PROMOTE  # equal tokens: the cost did not rise
