"""Metrics of one run (pure): accuracy, precision/recall/F1 for a positive label, error
ratio, latency percentiles, tokens and cost per item, and the Wilson score interval.

Values are raw floats, never rounded; a metric whose denominator is zero is ``None``
(undefined), and the decision treats it as the binding says (fail by default).

Conventions, chosen so that errors can never flatter a candidate:

* every item counts in ``accuracy`` (an ERROR is not a match) and in ``error_ratio``;
* for precision and recall an ERROR predicts "not positive": a positive item the
  candidate failed on is a false negative;
* latency percentiles use the winning attempt of each item that got an answer, with
  linear interpolation between order statistics (numpy's default);
* tokens and cost count every attempt of an item, retries and discarded calls included;
* an item that could not be evaluated (its task ended on an error of the provider or of
  the workers, not of the candidate: ``Sample.unevaluated``) is in no metric: it is
  counted apart, per error class (``not_evaluated``), and the decision fails the
  evaluation rather than judge the candidate on what is left.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

from lockgate.gate.compare import same


@dataclass(frozen=True, slots=True)
class Sample:
    """One scored item."""

    verdict: str  # MATCH | MISMATCH | ERROR
    predicted: Any = None
    truth: Any = None
    latency_ms: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    #: Why the item could not be evaluated (an error class of the provider or the
    #: workers, e.g. ``server_error``), or None for an item that was.
    unevaluated: str | None = None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0..1) by linear interpolation; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def z_for(confidence: float) -> float:
    """The normal quantile of a two-sided interval at ``confidence`` (0.95 -> 1.95996)."""
    return NormalDist().inv_cdf(1.0 - (1.0 - confidence) / 2.0)


def wilson(successes: int, n: int, confidence: float) -> tuple[float, float] | None:
    """The Wilson score interval of ``successes / n``; None when n is 0."""
    if n <= 0:
        return None
    z = z_for(confidence)
    p = successes / n
    z2 = z * z
    centre = p + z2 / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    denom = 1 + z2 / n
    return max(0.0, (centre - spread) / denom), min(1.0, (centre + spread) / denom)


def _ratio(k: int, n: int) -> float | None:
    return k / n if n else None


def compute(samples: Sequence[Sample], *, positive: Any = None,
            prices: tuple[float, float] | None = None) -> dict[str, Any]:
    """Every metric of a run, plus the counts behind them (``counts``) and the (k, n)
    of each proportion (``proportions``, for the statistical guard).

    Items that could not be evaluated are left out of every metric and counted apart:
    ``counts["not_evaluated"]``, and per error class in ``not_evaluated``."""
    lost = Counter(s.unevaluated for s in samples if s.unevaluated is not None)
    samples = [s for s in samples if s.unevaluated is None]
    n = len(samples)
    match = sum(1 for s in samples if s.verdict == "MATCH")
    error = sum(1 for s in samples if s.verdict == "ERROR")
    out: dict[str, Any] = {
        "accuracy": _ratio(match, n),
        "error_ratio": _ratio(error, n),
    }
    counts: dict[str, int] = {"items": n, "match": match, "mismatch": n - match - error,
                              "error": error}
    proportions: dict[str, list[int]] = {"accuracy": [match, n], "error_ratio": [error, n]}
    if positive is not None:
        tp = fp = fn = 0
        for s in samples:
            pred = s.verdict != "ERROR" and same(s.predicted, positive)
            true = same(s.truth, positive)
            tp += pred and true
            fp += pred and not true
            fn += true and not pred
        counts.update(tp=tp, fp=fp, fn=fn, tn=n - tp - fp - fn)
        out["precision"] = _ratio(tp, tp + fp)
        out["recall"] = _ratio(tp, tp + fn)
        out["f1"] = _ratio(2 * tp, 2 * tp + fp + fn)
        proportions["precision"] = [tp, tp + fp]
        proportions["recall"] = [tp, tp + fn]
    latencies = [s.latency_ms for s in samples if s.latency_ms is not None]
    out["latency_p50_ms"] = percentile(latencies, 0.50)
    out["latency_p95_ms"] = percentile(latencies, 0.95)
    tin = sum(s.input_tokens for s in samples)
    tout = sum(s.output_tokens for s in samples)
    out["tokens_per_item"] = _ratio(tin + tout, n)
    out["cost_per_item"] = ((tin * prices[0] + tout * prices[1]) / 1e6 / n
                            if prices is not None and n else None)
    counts.update(input_tokens=tin, output_tokens=tout, latencies=len(latencies),
                  not_evaluated=sum(lost.values()))
    out["counts"] = counts
    out["not_evaluated"] = dict(sorted(lost.items()))
    out["proportions"] = proportions
    return out
