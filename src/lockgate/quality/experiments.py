"""The figures of an A/B test's two arms and the verdict of the promotion rule (SPEC F3,
docs/quality.md "A/B tests").

Each arm is a prompt version, so its figures are that version's quality rollups since
the test started: the rows of the span holding the start onwards (minute rows for a
test up to 6 hours old, hour rows up to 14 days, day rows beyond, as a report reads
them) until it ended, or now. The control's rows hold every task that ran the control
version in that time, pinned references included.

The rule: promote only if each arm has ``min_tasks`` finished tasks, the candidate's
completeness is at least the control's plus ``min_gain`` (absolute: 0.02 is two share
points, 0.95 -> 0.97), and its cost per task is not above the control's; while no
price is configured, tokens per task (input + output) stand in for the cost.
"""

from __future__ import annotations

from typing import Any

from lockgate.quality.report import resolution_for
from lockgate.quality.rollup import Rollup, bucket_of
from lockgate.store.quality import QualityStore
from lockgate.store.store import Store

PROMOTE, KEEP, UNDECIDED = "promote", "keep", "undecided"
#: Completeness is a mean of floats: a rise equal to ``min_gain`` must not fail on the
#: last bit of a sum.
_SLACK = 1e-9


def arm_figures(store: Store, version: str, since_ms: int, until_ms: int) -> dict[str, Any]:
    """One version's figures between two times (see the module docstring)."""
    res = resolution_for(max(until_ms - since_ms, 1) / 1000, "version")
    r = Rollup()
    for row in QualityStore(store).rows(res, since=bucket_of(since_ms, res),
                                        until=until_ms + 1, prompt=version):
        r = r.merge(Rollup.from_row(row.values))
    errors = sum(r.error_mix.values())
    return {"version": version, "tasks": r.tasks, "calls": r.calls,
            "completeness": r.completeness, "conformance": r.conformance,
            "cost_per_task": r.cost_per_task,
            "tokens_per_task": (r.input_tokens + r.output_tokens) / r.tasks if r.tasks
            else None,
            "error_share": errors / r.attempts if r.attempts else None,
            "latency_p95_ms": r.quantile(0.95)}


def verdict(control: dict[str, Any], candidate: dict[str, Any], *, min_gain: float,
            min_tasks: int) -> dict[str, Any]:
    """What the rule decides on two arms' figures: the verdict, why, and what stood
    for the cost (``cost`` or ``tokens``)."""
    priced = control["cost_per_task"] is not None and candidate["cost_per_task"] is not None
    basis = "cost" if priced else "tokens"
    out: dict[str, Any] = {"min_gain": min_gain, "min_tasks": min_tasks, "basis": basis}
    if min(control["tasks"], candidate["tasks"]) < min_tasks:
        return {**out, "verdict": UNDECIDED,
                "why": f"too few finished tasks to decide: the control has "
                       f"{control['tasks']:,}, the candidate {candidate['tasks']:,}; each "
                       f"arm needs {min_tasks:,} (--min-tasks)"}
    before, after = control["completeness"], candidate["completeness"]
    if before is None or after is None:
        return {**out, "verdict": KEEP,
                "why": "no parsed output to measure completeness on in "
                       + ("the control" if before is None else "the candidate")}
    key = "cost_per_task" if priced else "tokens_per_task"
    unit = "cost per task" if priced else "tokens per task (no prices configured)"
    cost_before, cost_after = control[key], candidate[key]
    gained = after - before >= min_gain - _SLACK
    cheaper = cost_after <= cost_before
    why = (f"completeness {before:.4f} -> {after:.4f} "
           f"({'meets' if gained else 'short of'} +{min_gain:g}); {unit} "
           f"{cost_before:.6g} -> {cost_after:.6g} ({'not above' if cheaper else 'above'})")
    return {**out, "verdict": PROMOTE if gained and cheaper else KEEP, "why": why}


def judge(store: Store, experiment: dict[str, Any], min_gain: float,
          min_tasks: int) -> dict[str, Any]:
    """Both arms' figures since the experiment started, until it ended (or now), and
    the verdict the rule gives on them."""
    until = experiment["concluded_at"] or QualityStore(store).now()
    name = experiment["prompt"]
    arms = {arm: arm_figures(store, f"{name}@{experiment[f'{arm}_version']}",
                             experiment["started_at"], until)
            for arm in ("control", "candidate")}
    return {"arms": arms, "until": until,
            **verdict(arms["control"], arms["candidate"], min_gain=min_gain,
                      min_tasks=min_tasks)}
