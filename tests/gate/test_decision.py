"""The decision (pure): thresholds on raw values, undefined metrics, the Wilson guard,
minimum samples, non-inferiority, and the terminal outcomes of runs."""

from __future__ import annotations

from typing import Any

import pytest

from lockgate.gate.binding import BindingSettings, Threshold
from lockgate.gate.decision import check_non_inferiority, check_threshold, decide
from lockgate.gate.metrics import Sample, compute, wilson


def _settings(*thresholds: str, **kw: Any) -> BindingSettings:
    from lockgate.gate.binding import parse_threshold

    return BindingSettings(thresholds=tuple(parse_threshold(t) for t in thresholds), **kw)


def _metrics(match: int, n: int, **extra: Any) -> dict[str, Any]:
    samples = [Sample("MATCH")] * match + [Sample("MISMATCH")] * (n - match)
    return {**compute(samples), **extra}


@pytest.mark.parametrize(("op", "value", "passed"), [
    (">=", 0.9, True), (">", 0.9, False), ("<=", 0.9, True), ("<", 0.9, False),
    ("==", 0.9, True), (">=", 0.9000000000000001, False),
])
def test_thresholds_compare_the_raw_unrounded_value(op: str, value: float,
                                                    passed: bool) -> None:
    metrics = _metrics(9, 10)  # accuracy exactly 0.9
    c = check_threshold(Threshold(metric="accuracy", op=op, value=value), metrics,  # type: ignore[arg-type]
                        _settings("accuracy>=0"))
    assert c.passed is passed
    assert c.value == 0.9


def test_an_almost_passing_value_is_not_rounded_up() -> None:
    metrics = _metrics(899, 1000)  # 0.899 would print as 0.90 with two digits
    assert not check_threshold(Threshold(metric="accuracy", op=">=", value=0.9), metrics,
                               _settings("accuracy>=0.9")).passed


def test_an_undefined_metric_fails_unless_the_binding_says_pass() -> None:
    metrics = compute([Sample("MATCH", "no", "no")], positive="yes")
    assert metrics["precision"] is None
    t = Threshold(metric="precision", op=">=", value=0.5)
    fail = check_threshold(t, metrics, _settings("precision>=0.5", positive_label="yes",
                                                 comparison={"kind": "label", "field": "x"}))
    ok = check_threshold(t, metrics, _settings("precision>=0.5", positive_label="yes",
                                               undefined="pass",
                                               comparison={"kind": "label", "field": "x"}))
    assert (fail.passed, ok.passed) == (False, True)
    assert fail.value is None and "undefined" in (fail.note or "")


def test_wilson_guard_uses_the_lower_bound_for_a_floor_and_upper_for_a_ceiling() -> None:
    metrics = _metrics(95, 100)
    metrics["error_ratio"] = 0.01
    metrics["proportions"]["error_ratio"] = [1, 100]
    s = _settings("accuracy>=0.9", "error_ratio<=0.05", guard={"confidence": 0.95})
    acc = check_threshold(s.thresholds[0], metrics, s)
    low, _high = wilson(95, 100, 0.95) or (0, 0)
    assert acc.bound == low and acc.passed is (low >= 0.9)
    err = check_threshold(s.thresholds[1], metrics, s)
    assert err.bound == (wilson(1, 100, 0.95) or (0, 0))[1]
    assert err.passed is (err.bound is not None and err.bound <= 0.05)
    # a point estimate that passes can fail under the guard with few samples
    few = _metrics(10, 10)
    s2 = _settings("accuracy>=0.9", guard={"confidence": 0.95})
    assert check_threshold(s2.thresholds[0], few, _settings("accuracy>=0.9")).passed
    assert not check_threshold(s2.thresholds[0], few, s2).passed


def test_minimum_sample_size() -> None:
    s = _settings("accuracy>=0.5", guard={"confidence": 0.9, "min_samples": 50})
    c = check_threshold(s.thresholds[0], _metrics(40, 49), s)
    assert not c.passed and c.n == 49 and "minimum 50" in (c.note or "")
    assert check_threshold(s.thresholds[0], _metrics(40, 50), s).passed


def test_a_minimum_sample_size_alone_compares_the_value_itself() -> None:
    # --min-samples without --confidence turned the Wilson bound at 95% on: 178 of 200
    # (0.89, lower bound 0.839) failed accuracy >= 0.88.
    s = _settings("accuracy>=0.88", guard={"min_samples": 100})
    c = check_threshold(s.thresholds[0], _metrics(178, 200), s)
    assert c.passed and c.bound is None and c.n == 200


def test_a_minimum_sample_size_counts_each_metric_s_own_observations() -> None:
    # 200 items, 5 of which have a latency: the latency stands on 5 observations
    samples = [Sample("ERROR")] * 195 + [Sample("MATCH", latency_ms=10.0)] * 5
    metrics = compute(samples)
    s = _settings("latency_p95_ms<2000", "accuracy>=0.0", "error_ratio<=1",
                  guard={"min_samples": 100})
    lat, acc, err = (check_threshold(t, metrics, s) for t in s.thresholds)
    assert (lat.passed, lat.n) == (False, 5) and "minimum 100" in (lat.note or "")
    assert (acc.passed, acc.n, err.passed, err.n) == (True, 200, True, 200)


@pytest.mark.parametrize(("metric", "cand", "base", "passed"), [
    ("accuracy", 0.89, 0.9, True), ("accuracy", 0.87, 0.9, False),
    ("latency_p95_ms", 110.0, 100.0, False), ("latency_p95_ms", 100.01, 100.0, True),
])
def test_non_inferiority_against_the_live_version(metric: str, cand: float, base: float,
                                                  passed: bool) -> None:
    s = _settings("accuracy>=0", non_inferiority={"metric": metric, "margin": 0.02})
    c = check_non_inferiority(s, {metric: cand}, {metric: base})
    assert c is not None and c.passed is passed


def _ds(name: str, did: int, **binding: Any) -> dict[str, Any]:
    binding.setdefault("thresholds", [{"metric": "accuracy", "op": ">=", "value": 0.8}])
    return {"name": name, "id": did, "binding": binding}


def _run(did: int, status: str, metrics: dict[str, Any] | None = None,
         subject: str = "candidate", reason: str | None = None) -> dict[str, Any]:
    return {"dataset_id": did, "subject": subject, "status": status, "metrics": metrics,
            "reason": reason}


def test_every_dataset_must_pass_for_activation() -> None:
    ds = [_ds("regular", 1), _ds("hard", 2)]
    good, bad = _metrics(9, 10), _metrics(7, 10)
    assert decide(ds, [_run(1, "FINALIZED", good), _run(2, "FINALIZED", good)]).outcome \
        == "activate"
    d = decide(ds, [_run(1, "FINALIZED", good), _run(2, "FINALIZED", bad)])
    assert d.outcome == "reject" and d.reason.startswith("hard: accuracy 0.7 not >= 0.8")
    assert [r.passed for r in d.datasets] == [True, False]


def test_an_empty_dataset_rejects_and_a_failed_or_cancelled_run_fails() -> None:
    ds = [_ds("a", 1)]
    empty = decide(ds, [_run(1, "EMPTY", reason="the dataset snapshot has no items")])
    assert empty.outcome == "reject" and "empty" in empty.reason
    failed = decide(ds, [_run(1, "FAILED", reason="scorer missing")])
    assert failed.outcome == "fail" and "scorer missing" in failed.reason
    assert decide(ds, [_run(1, "CANCELLED")]).outcome == "fail"
    assert decide(ds, []).outcome == "fail"


def test_non_inferiority_needs_the_baseline_run() -> None:
    ds = [_ds("a", 1, non_inferiority={"metric": "accuracy", "margin": 0.0})]
    cand = _run(1, "FINALIZED", _metrics(9, 10))
    better = _run(1, "FINALIZED", _metrics(8, 10), subject="baseline")
    worse = _run(1, "FINALIZED", _metrics(10, 10), subject="baseline")
    assert decide(ds, [cand, better]).outcome == "activate"
    d = decide(ds, [cand, worse])
    assert d.outcome == "reject" and "accuracy vs live" in d.reason
    assert decide(ds, [cand, _run(1, "FAILED", subject="baseline")]).outcome == "fail"


def test_decision_document_is_json_ready() -> None:
    import orjson

    d = decide([_ds("a", 1)], [_run(1, "FINALIZED", _metrics(9, 10))])
    doc = orjson.loads(orjson.dumps(d.document()))
    assert doc["outcome"] == "activate"
    assert doc["datasets"][0]["checks"][0] == {
        "kind": "threshold", "metric": "accuracy", "op": ">=", "threshold": 0.8,
        "value": 0.9, "passed": True, "bound": None, "n": None, "note": None}
