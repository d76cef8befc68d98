"""Metrics cross-checked against scikit-learn, numpy and scipy (pure, no I/O)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from scipy.stats import binomtest
from sklearn.metrics import accuracy_score, f1_score, precision_score, recall_score

from lockgate.gate.metrics import Sample, compute, percentile, wilson, z_for

LABELS = ("yes", "no", "maybe")
ERROR = "<error>"


def _samples(rng: random.Random, n: int, p_error: float, labels: tuple[str, ...] = LABELS
             ) -> list[Sample]:
    out = []
    for _ in range(n):
        truth = rng.choice(labels)
        if rng.random() < p_error:
            out.append(Sample("ERROR", None, truth))
            continue
        pred = truth if rng.random() < 0.6 else rng.choice(labels)
        out.append(Sample("MATCH" if pred == truth else "MISMATCH", pred, truth))
    return out


def _sk(samples: list[Sample], positive: str) -> dict[str, float]:
    y_true = [s.truth for s in samples]
    y_pred = [ERROR if s.verdict == "ERROR" else s.predicted for s in samples]
    t = np.array([y == positive for y in y_true])
    p = np.array([y == positive for y in y_pred])
    return {
        "accuracy": float(accuracy_score(y_true, y_pred)),
        "precision": float(precision_score(t, p, zero_division=np.nan)),
        "recall": float(recall_score(t, p, zero_division=np.nan)),
        "f1": float(f1_score(t, p, zero_division=np.nan)),
    }


def _same(ours: float | None, theirs: float) -> bool:
    if ours is None:
        return math.isnan(theirs)
    return not math.isnan(theirs) and math.isclose(ours, theirs, rel_tol=0, abs_tol=1e-12)


@pytest.mark.parametrize("seed", range(40))
def test_accuracy_precision_recall_f1_match_scikit_learn(seed: int) -> None:
    """Random predictions (with errors) of random sizes, including tiny ones where the
    denominators are zero."""
    rng = random.Random(seed)
    n = rng.choice([1, 2, 3, 5, 20, 200])
    samples = _samples(rng, n, p_error=rng.choice([0.0, 0.1, 0.5]))
    positive = rng.choice(LABELS)
    ours = compute(samples, positive=positive)
    theirs = _sk(samples, positive)
    for metric, value in theirs.items():
        assert _same(ours[metric], value), (metric, ours[metric], value, seed)
    c = ours["counts"]
    assert c["tp"] + c["fp"] + c["fn"] + c["tn"] == n
    assert ours["proportions"]["precision"] == [c["tp"], c["tp"] + c["fp"]]


@pytest.mark.parametrize(("truth", "pred", "undefined"), [
    (["no", "no"], ["no", "no"], {"precision", "recall", "f1"}),  # no positives at all
    (["yes", "no"], ["no", "no"], {"precision"}),  # nothing predicted positive
    (["no", "no"], ["yes", "no"], {"recall"}),  # no true positive exists
    (["yes"], ["yes"], set()),
])
def test_zero_division_is_undefined_like_scikit_learns_nan(
        truth: list[str], pred: list[str], undefined: set[str]) -> None:
    samples = [Sample("MATCH" if p == t else "MISMATCH", p, t)
               for t, p in zip(truth, pred, strict=True)]
    ours = compute(samples, positive="yes")
    theirs = _sk(samples, "yes")
    for metric in ("precision", "recall", "f1"):
        assert (ours[metric] is None) == (metric in undefined), metric
        assert _same(ours[metric], theirs[metric]), metric


def test_an_error_counts_against_accuracy_and_as_a_missed_positive() -> None:
    samples = [Sample("ERROR", None, "yes"), Sample("MATCH", "yes", "yes")]
    m = compute(samples, positive="yes")
    assert m["accuracy"] == 0.5
    assert m["error_ratio"] == 0.5
    assert (m["counts"]["fn"], m["counts"]["tp"]) == (1, 1)
    assert m["recall"] == 0.5


def test_empty_run_has_undefined_metrics() -> None:
    m = compute([], positive="yes")
    assert all(m[k] is None for k in ("accuracy", "error_ratio", "precision", "recall", "f1",
                                      "latency_p50_ms", "latency_p95_ms", "tokens_per_item"))


@pytest.mark.parametrize("n", [1, 2, 3, 10, 101])
def test_percentiles_match_numpy_linear_interpolation(n: int) -> None:
    rng = random.Random(n)
    xs = [rng.lognormvariate(5, 1) for _ in range(n)]
    for q in (0.0, 0.5, 0.95, 1.0):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q * 100)),
                                                  rel=1e-12)
    assert percentile([], 0.5) is None


def test_latency_tokens_and_cost_per_item_are_raw() -> None:
    samples = [Sample("MATCH", latency_ms=10.0, input_tokens=100, output_tokens=10),
               Sample("MISMATCH", latency_ms=30.0, input_tokens=200, output_tokens=20),
               Sample("ERROR", input_tokens=50, output_tokens=0)]
    m = compute(samples, prices=(1.0, 4.0))
    assert m["latency_p50_ms"] == 20.0
    assert m["latency_p95_ms"] == pytest.approx(29.0)
    assert m["tokens_per_item"] == 380 / 3
    assert m["cost_per_item"] == (350 * 1.0 + 30 * 4.0) / 1e6 / 3
    assert compute(samples)["cost_per_item"] is None


@pytest.mark.parametrize(("k", "n"), [(0, 1), (1, 1), (8, 10), (178, 200), (0, 50),
                                      (950, 1000), (3, 7)])
@pytest.mark.parametrize("confidence", [0.8, 0.95, 0.99])
def test_wilson_interval_matches_scipy(k: int, n: int, confidence: float) -> None:
    ci = binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    lo, hi = wilson(k, n, confidence) or (None, None)
    assert lo == pytest.approx(float(ci.low), abs=1e-12)
    assert hi == pytest.approx(float(ci.high), abs=1e-12)


def test_wilson_is_undefined_without_samples_and_z_is_the_normal_quantile() -> None:
    assert wilson(0, 0, 0.95) is None
    assert z_for(0.95) == pytest.approx(1.959963984540054)
