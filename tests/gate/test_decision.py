"""The decision (pure): thresholds on raw values, undefined metrics, the Wilson guard,
minimum samples, non-inferiority, and the terminal outcomes of runs."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

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
    ("==", 0.9, True), (">=", 0.9000001, False), ("<=", 0.8999999, False),
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


# -- boundaries: a value at a threshold but for the rounding of float arithmetic is at it


def _ni(metric: str, margin: float) -> BindingSettings:
    return _settings("accuracy>=0", non_inferiority={"metric": metric, "margin": margin})


@pytest.mark.parametrize(("metric", "live", "cand"), [
    ("accuracy", (8, 10), (7, 10)),  # 0.8 - 0.1 is 0.7000000000000001 in floats
    ("error_ratio", (7, 10), (8, 10)),  # 0.7 + 0.1 is 0.7999999999999999
])
def test_non_inferiority_holds_at_exactly_the_margin(metric: str, live: tuple[int, int],
                                                     cand: tuple[int, int]) -> None:
    def run(k: int, n: int) -> dict[str, Any]:
        verdict = "MATCH" if metric == "accuracy" else "ERROR"
        return compute([Sample(verdict)] * k + [Sample("MISMATCH")] * (n - k))

    c = check_non_inferiority(_ni(metric, 0.1), run(*cand), run(*live))
    assert c is not None and c.passed
    ds = [_ds("ds", 1, thresholds=[{"metric": "accuracy", "op": ">=", "value": 0}],
              non_inferiority={"metric": metric, "margin": 0.1})]
    d = decide(ds, [_run(1, "FINALIZED", run(*cand)),
                    _run(1, "FINALIZED", run(*live), subject="baseline")])
    assert d.outcome == "activate", d.reason


def test_cost_per_item_meets_a_threshold_it_is_exactly_at() -> None:
    # 10 items of 10 input and 5 output tokens at 2.5 and 10 per million: 0.000075 an
    # item, computed as 7.500000000000001e-05
    samples = [Sample("MATCH", input_tokens=10, output_tokens=5)] * 10
    metrics = compute(samples, prices=(2.5, 10.0))
    s = _settings("cost_per_item<=0.000075", "cost_per_item>=0.000075",
                  "cost_per_item==0.000075", "cost_per_item<0.000075",
                  "cost_per_item>0.000075", prices={"input_per_mtok": 2.5,
                                                    "output_per_mtok": 10.0})
    assert [check_threshold(t, metrics, s).passed for t in s.thresholds] \
        == [True, True, True, False, False]


def test_a_value_just_past_a_threshold_shows_the_digits_that_differ() -> None:
    ds = [_ds("ds", 1, thresholds=[{"metric": "accuracy", "op": ">=", "value": 0.7}])]
    d = decide(ds, [_run(1, "FINALIZED", {"accuracy": 0.69999999})])
    assert d.outcome == "reject"
    assert d.reason == "ds: accuracy 0.69999999 not >= 0.7", d.reason
    at = decide(ds, [_run(1, "FINALIZED", {"accuracy": 0.6999999999999999})])
    assert at.outcome == "activate", at.reason
    strict = [_ds("ds", 1, thresholds=[{"metric": "accuracy", "op": ">", "value": 0.7}])]
    assert decide(strict, [_run(1, "FINALIZED", {"accuracy": 0.7000000000000001})]).reason \
        == "ds: accuracy 0.7 not > 0.7"


_OPS = {">=": Fraction.__ge__, ">": Fraction.__gt__, "<=": Fraction.__le__,
        "<": Fraction.__lt__, "==": Fraction.__eq__}


@given(k=st.integers(0, 1000), n=st.integers(1, 1000), t=st.integers(0, 1000),
       op=st.sampled_from(sorted(_OPS)))
def test_a_proportion_against_a_decimal_threshold_is_decided_as_in_exact_arithmetic(
        k: int, n: int, t: int, op: str) -> None:
    k = min(k, n)
    metrics = _metrics(k, n)
    threshold = Threshold(metric="accuracy", op=op, value=float(f"{t / 1000}"))  # type: ignore[arg-type]
    c = check_threshold(threshold, metrics, _settings("accuracy>=0"))
    assert c.passed is _OPS[op](Fraction(k, n), Fraction(t, 1000))


@given(live=st.integers(0, 200), cand=st.integers(0, 200), n=st.integers(1, 200),
       margin=st.integers(0, 100), higher=st.booleans())
@example(live=8, cand=7, n=10, margin=10, higher=True)
@example(live=7, cand=8, n=10, margin=10, higher=False)
def test_non_inferiority_is_decided_as_in_exact_arithmetic(
        live: int, cand: int, n: int, margin: int, higher: bool) -> None:
    live, cand = min(live, n), min(cand, n)
    metric = "accuracy" if higher else "error_ratio"
    c = check_non_inferiority(_ni(metric, float(f"{margin / 100}")),
                              {metric: cand / n}, {metric: live / n})
    exact_margin = Fraction(margin, 100)
    expected = (Fraction(cand, n) >= Fraction(live, n) - exact_margin if higher
                else Fraction(cand, n) <= Fraction(live, n) + exact_margin)
    assert c is not None and c.passed is expected


@given(items=st.integers(1, 50), tin=st.integers(0, 5000), tout=st.integers(0, 5000),
       pin=st.integers(0, 10000), pout=st.integers(0, 10000))
def test_a_cost_threshold_equal_to_the_exact_cost_is_met_by_le_ge_and_eq(
        items: int, tin: int, tout: int, pin: int, pout: int) -> None:
    prices = (pin / 100, pout / 100)  # per million tokens, in cents
    metrics = compute([Sample("MATCH", input_tokens=tin, output_tokens=tout)] * items,
                      prices=prices)
    exact = float((Fraction(tin * pin) + Fraction(tout * pout)) / 100 / 1_000_000)
    s = _settings("accuracy>=0", prices={"input_per_mtok": prices[0],
                                         "output_per_mtok": prices[1]})
    passed = {op: check_threshold(Threshold(metric="cost_per_item", op=op, value=exact),  # type: ignore[arg-type]
                                  metrics, s).passed for op in _OPS}
    assert passed == {">=": True, ">": False, "<=": True, "<": False, "==": True}
