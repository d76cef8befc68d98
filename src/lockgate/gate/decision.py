"""The gate's decision (pure): every threshold of every bound dataset against the
metrics of its run, with the statistical guard and non-inferiority.

The outcome is binary for a candidate that was fully evaluated: ``activate`` when every
check of every dataset passes, ``reject`` otherwise. ``fail`` means the evaluation
could not complete: a run FAILED, or items of a run could not be evaluated because of
the provider or the workers (``not_evaluated`` in its metrics: rate limits, an
exhausted quota, server errors, timeouts, workers killed holding the items...), which
say nothing about the candidate; the live version stays as it is in both cases.

A candidate none of whose items was answered (every evaluated item ended in an ERROR:
requests the provider refused, outputs the delivery rule rejected...) is rejected
whatever the binding says: ``undefined = pass`` excuses a metric whose denominator is
legitimately empty (no predicted positive), not one left empty because nothing was
answered, and the metrics that stay defined (tokens, cost) say nothing of answers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from lockgate.gate.binding import (
    HIGHER_IS_BETTER,
    PROPORTIONS,
    BindingSettings,
    Threshold,
)
from lockgate.gate.metrics import wilson


def _at(value: float, bound: float) -> bool:
    """Whether ``value`` is ``bound`` but for the rounding of the float arithmetic it
    came from: 10 items at 15 tokens and 2.5 / 10 per million cost 7.500000000000001e-05
    each, and a live accuracy of 0.8 less a margin of 0.1 is 0.7000000000000001; both
    are at the bound a user wrote (0.000075, 0.7), not past it."""
    return math.isclose(value, bound, rel_tol=1e-9, abs_tol=1e-12)


#: The comparators, each at a bound within rounding (:func:`_at`): ``>=`` and ``<=``
#: hold there, ``>`` and ``<`` do not, ``==`` does.
OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": lambda v, b: v >= b or _at(v, b),
    ">": lambda v, b: v > b and not _at(v, b),
    "<=": lambda v, b: v <= b or _at(v, b),
    "<": lambda v, b: v < b and not _at(v, b),
    "==": _at,
}


@dataclass(frozen=True, slots=True)
class Check:
    """One comparison of the decision: what was compared with what, and the result."""

    kind: str  # threshold | non_inferiority
    metric: str
    op: str
    threshold: float | None
    value: float | None
    passed: bool
    bound: float | None = None
    n: int | None = None
    note: str | None = None


@dataclass(frozen=True, slots=True)
class DatasetResult:
    """The checks of one dataset."""

    dataset: str
    status: str
    passed: bool
    checks: list[Check] = field(default_factory=list)
    metrics: dict[str, Any] | None = None
    baseline_metrics: dict[str, Any] | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """What Reconcile concludes."""

    outcome: str  # activate | reject | fail
    reason: str
    datasets: list[DatasetResult]

    def document(self) -> dict[str, Any]:
        """The JSON stored on ``prompt_update.decision``."""
        return asdict(self)


def observations(metric: str, metrics: Mapping[str, Any]) -> int:
    """How many observations a metric of a run stands on: the denominator of a
    proportion, tp + fp + fn for f1, the calls with a latency for a latency, else the
    items."""
    k_n = metrics.get("proportions", {}).get(metric)
    if k_n:
        return int(k_n[1])
    counts = metrics.get("counts", {})
    if metric == "f1":
        return int(counts.get("tp", 0)) + int(counts.get("fp", 0)) + int(counts.get("fn", 0))
    if metric.startswith("latency_"):
        return int(counts.get("latencies", 0))
    return int(counts.get("items", 0))


def check_threshold(t: Threshold, metrics: Mapping[str, Any],
                    settings: BindingSettings) -> Check:
    """One threshold against a run's metrics, under the binding's guard and policy.
    The minimum sample size comes first: a metric undefined for a zero denominator
    stands on no observation, so ``undefined = pass`` does not excuse it from
    ``--min-samples``."""
    value = metrics.get(t.metric)
    cmp = OPS[t.op]
    guard = settings.guard
    n = observations(t.metric, metrics)
    if guard is not None and n < guard.min_samples:
        return Check("threshold", t.metric, t.op, t.value, value, False, n=n,
                     note=f"{n} samples < minimum {guard.min_samples}")
    if value is None:
        silent = unanswered(metrics)
        if silent is not None:
            return Check("threshold", t.metric, t.op, t.value, None, False,
                         n=None if guard is None else n,
                         note=f"undefined: {silent}{_not_excused(settings)}")
        ok = settings.undefined == "pass"
        return Check("threshold", t.metric, t.op, t.value, None, ok,
                     n=None if guard is None else n,
                     note="undefined (zero denominator); binding says "
                          f"{settings.undefined}")
    if guard is None:
        return Check("threshold", t.metric, t.op, t.value, value, cmp(value, t.value))
    k_n = metrics.get("proportions", {}).get(t.metric)
    if guard.confidence is not None and t.metric in PROPORTIONS and k_n and t.op != "==":
        interval = wilson(int(k_n[0]), n, guard.confidence)
        assert interval is not None  # n > 0 because value is defined
        bound = interval[0] if t.op in (">=", ">") else interval[1]
        return Check("threshold", t.metric, t.op, t.value, value, cmp(bound, t.value),
                     bound=bound, n=n,
                     note=f"Wilson {'lower' if t.op in ('>=', '>') else 'upper'} bound, "
                          f"{guard.confidence * 100:g}%")
    return Check("threshold", t.metric, t.op, t.value, value, cmp(value, t.value), n=n)


def check_non_inferiority(settings: BindingSettings, metrics: Mapping[str, Any],
                          baseline: Mapping[str, Any] | None) -> Check | None:
    """Candidate vs the live version on the same snapshot, within the margin."""
    ni = settings.non_inferiority
    if ni is None:
        return None
    value = metrics.get(ni.metric)
    base = baseline.get(ni.metric) if baseline else None
    higher = ni.metric in HIGHER_IS_BETTER
    op = ">=" if higher else "<="
    silent = unanswered(metrics) if value is None else None
    if silent is not None:
        return Check("non_inferiority", ni.metric, op, None, None, False,
                     note=f"undefined: {silent}{_not_excused(settings)}")
    if value is None or base is None:
        ok = settings.undefined == "pass"
        return Check("non_inferiority", ni.metric, op, None, value, ok,
                     note=f"undefined (candidate {value}, live {base}); binding says "
                          f"{settings.undefined}")
    limit = base - ni.margin if higher else base + ni.margin
    return Check("non_inferiority", ni.metric, op, limit, value, OPS[op](value, limit),
                 note=f"live {base!r} {'-' if higher else '+'} margin {ni.margin:g}")


def evaluate_dataset(name: str, settings: BindingSettings, run: Mapping[str, Any],
                     baseline: Mapping[str, Any] | None) -> DatasetResult:
    """The checks of one dataset from its candidate run (and baseline run, if any)."""
    status = str(run["status"])
    if status == "EMPTY":
        return DatasetResult(name, status, False, reason="the dataset snapshot is empty")
    if status != "FINALIZED":
        return DatasetResult(name, status, False, reason=run.get("reason") or status.lower())
    metrics = dict(run["metrics"] or {})
    lost = not_evaluated(metrics)
    if lost is not None:  # partial data: no check is made (decide() fails the update)
        return DatasetResult(name, status, False, metrics=metrics, reason=lost)
    checks = [check_threshold(t, metrics, settings) for t in settings.thresholds]
    base_metrics = None
    if settings.non_inferiority is not None:
        if baseline is not None and baseline["status"] not in ("FINALIZED", "EMPTY"):
            return DatasetResult(name, str(baseline["status"]), False, metrics=metrics,
                                 reason="baseline run: " + str(baseline.get("reason")
                                                               or baseline["status"]))
        base_lost = not_evaluated(baseline.get("metrics")) if baseline else None
        if base_lost is not None:
            return DatasetResult(name, status, False, metrics=metrics,
                                 baseline_metrics=dict(baseline["metrics"] or {})
                                 if baseline else None,
                                 reason="baseline run: " + base_lost)
        base_metrics = dict(baseline["metrics"] or {}) if baseline else None
        ni = check_non_inferiority(settings, metrics, base_metrics)
        if ni is not None:
            checks.append(ni)
    silent = unanswered(metrics)
    return DatasetResult(name, status, silent is None and all(c.passed for c in checks),
                         checks, metrics, base_metrics,
                         reason=silent)


def unanswered(metrics: Mapping[str, Any]) -> str | None:
    """Why a run's metrics cannot pass its candidate when no evaluated item was answered
    (every one ended in an ERROR of the candidate's), or None when one was. Such a run
    leaves precision and the latencies undefined and tokens or cost meaningless, so no
    threshold, and no ``--undefined pass``, may let it through."""
    counts = metrics.get("counts") or {}
    items = int(counts.get("items", 0) or 0)
    errors = int(counts.get("error", 0) or 0)
    if items <= 0 or errors < items:
        return None
    return (f"no item was answered ({'the' if items == 1 else 'all'} {items} evaluated "
            f"item{'s' if items != 1 else ''} ended in an error)")


def _not_excused(settings: BindingSettings) -> str:
    return ("; --undefined pass excuses an empty denominator, not a candidate that "
            "answered nothing" if settings.undefined == "pass" else "")


def not_evaluated(metrics: Mapping[str, Any] | None) -> str | None:
    """What of a run could not be evaluated, from its metrics (``12 of 40 items could
    not be evaluated: server_error 10, timeout 2``), or None when every item was."""
    if not metrics:
        return None
    lost = int(metrics.get("counts", {}).get("not_evaluated", 0) or 0)
    if lost <= 0:
        return None
    total = lost + int(metrics.get("counts", {}).get("items", 0) or 0)
    classes = ", ".join(f"{cls} {n}" for cls, n in
                        (metrics.get("not_evaluated") or {}).items())
    return (f"{lost} of {total} item{'s' if total != 1 else ''} could not be evaluated"
            + (f": {classes}" if classes else ""))


def decide(datasets: Sequence[Mapping[str, Any]], runs: Sequence[Mapping[str, Any]],
           *, prompt: str | None = None, candidate: int | None = None) -> Decision:
    """The decision over every bound dataset.

    ``datasets`` are the snapshot's entries (``name``, ``id``, ``binding``); ``runs``
    the update's runs (``dataset_id``, ``subject``, ``status``, ``metrics``, ``reason``),
    all terminal. ``prompt`` and ``candidate`` (the version) only word the advice of a
    decision that failed for the provider's or the workers' errors.
    """
    by_key = {(int(r["dataset_id"]), str(r["subject"])): r for r in runs}
    results: list[DatasetResult] = []
    failed: list[str] = []
    infrastructure = False
    for ds in datasets:
        settings = BindingSettings.model_validate(ds["binding"])
        cand = by_key.get((int(ds["id"]), "candidate"))
        base = by_key.get((int(ds["id"]), "baseline"))
        if cand is None:
            failed.append(f"{ds['name']}: no run")
            results.append(DatasetResult(ds["name"], "MISSING", False, reason="no run"))
            continue
        for r in (cand, base):
            if r is None:
                continue
            if r["status"] in ("FAILED", "CANCELLED"):
                failed.append(f"{ds['name']} ({r['subject']}): {r.get('reason') or r['status']}")
            elif r["status"] == "FINALIZED" and (lost := not_evaluated(r.get("metrics"))):
                failed.append(f"{ds['name']} ({r['subject']}): {lost}")
                infrastructure = True
        results.append(evaluate_dataset(ds["name"], settings, cand, base))
    if failed:
        reason = "evaluation could not complete: " + "; ".join(failed)
        if infrastructure:
            reason += " (" + _rerun_advice(prompt, candidate) + ")"
        return Decision("fail", reason, results)
    losing = [f"{r.dataset}: " + (r.reason or ", ".join(
        _describe(c) for c in r.checks if not c.passed)) for r in results if not r.passed]
    if losing:
        return Decision("reject", "; ".join(losing), results)
    return Decision("activate", "passed every threshold", results)


def _rerun_advice(prompt: str | None, candidate: int | None) -> str:
    """What to do about items the provider or the workers failed: they say nothing about
    the candidate, so nothing was judged; the same candidate proposed again re-runs."""
    again = "propose the candidate again"
    if prompt is not None:
        again = f"`lockgate prompt propose {prompt}` with the same content"
        if candidate is not None:
            again += f" (it re-uses version {candidate})"
    return ("errors of the provider or the workers, not of the candidate, which was not "
            f"judged; live unchanged. Re-run the evaluation once they are resolved: {again}")


def _describe(c: Check) -> str:
    label = c.metric if c.kind == "threshold" else f"{c.metric} vs live"
    if c.note and ("samples" in c.note or c.note.startswith("undefined: ")):
        return f"{label}: {c.note}"
    if c.value is None:
        return f"{label} undefined"
    compared = c.value if c.bound is None else c.bound
    limit = "?" if c.threshold is None else _figure(c.threshold, compared)
    shown = _figure(c.value, c.threshold)
    if c.bound is not None:
        shown += f" (bound {_figure(c.bound, c.threshold)})"
    return f"{label} {shown} not {c.op} {limit}"


def _figure(x: float, other: float | None) -> str:
    """``x`` in six significant digits, or in as many as tell it apart from ``other``
    (``0.6999999 not >= 0.7``, where six digits would print ``0.7 not >= 0.7``); a
    value at ``other`` but for rounding is printed as ``other`` is."""
    if other is None or _at(x, other):
        return f"{x:.6g}"
    for digits in (6, 9, 12):
        text = f"{x:.{digits}g}"
        if text != f"{other:.{digits}g}":
            return text
    return repr(x)
