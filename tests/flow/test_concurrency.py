"""Adaptive concurrency: the rule of docs/flow.md, the per-token gradient policy, and when the
controller decides."""

from __future__ import annotations

import pytest

from lockgate.errors import ConfigError
from lockgate.flow.concurrency import (
    Adaptive,
    GradientPolicy,
    RulePolicy,
    WindowStats,
    make_policy,
)


def stats(latency: float, failure: float = 0.0, *, drops: float = 0.0, norm: float = 0.0,
          peak: int = 1000) -> WindowStats:
    return WindowStats(calls=100, mean_latency_ms=latency, failure_rate=failure,
                       drop_rate=drops, mean_norm_latency=norm, peak_in_flight=peak)


def test_rule_halves_when_slow_and_failing_and_grows_when_fast_and_clean() -> None:
    p = RulePolicy(min_limit=4, max_limit=200)
    assert p.next_limit(100, stats(2500, 0.06)) == 50
    assert p.next_limit(100, stats(500, 0.001)) == pytest.approx(120)
    # Only one of the two conditions: hold.
    assert p.next_limit(100, stats(2500, 0.01)) == 100
    assert p.next_limit(100, stats(900, 0.001)) == 100
    assert p.next_limit(100, stats(500, 0.01)) == 100
    # Within bounds.
    assert p.next_limit(6, stats(3000, 0.5)) == 4
    assert p.next_limit(190, stats(10, 0.0)) == 200


def test_rule_does_not_grow_a_limit_nobody_uses() -> None:
    p = RulePolicy(min_limit=1, max_limit=1000)
    assert p.next_limit(100, stats(100, peak=10)) == 100


def test_gradient_uses_latency_per_output_token_so_long_answers_are_not_congestion() -> None:
    p = GradientPolicy(min_limit=1, max_limit=1000)
    limit = 100.0
    for _ in range(10):  # steady: 10 ms per token
        limit = p.next_limit(limit, stats(500, norm=10.0))
    base = limit
    # Answers four times longer take four times as long: per token nothing changed.
    assert p.next_limit(limit, stats(2000, norm=10.0)) >= base
    # Per-token latency triples: that is congestion.
    assert p.next_limit(limit, stats(1500, norm=30.0)) < base


def test_gradient_backs_off_on_drops() -> None:
    p = GradientPolicy(min_limit=1, max_limit=1000)
    p.next_limit(100, stats(100, norm=5.0))
    assert p.next_limit(100, stats(100, 0.1, drops=0.1, norm=5.0)) == pytest.approx(90)


def test_gradient_halves_within_a_few_decisions_under_a_spike_and_recovers() -> None:
    p = GradientPolicy(min_limit=4, max_limit=200)
    limit = 200.0
    for _ in range(20):
        limit = p.next_limit(limit, stats(200, norm=10.0))
    steps_down = 0
    while limit > 100:
        limit = p.next_limit(limit, stats(3000, 0.1, norm=150.0))
        steps_down += 1
    assert steps_down <= 15
    steps_up = 0
    while limit < 190 and steps_up < 200:
        limit = p.next_limit(limit, stats(200, norm=10.0))
        steps_up += 1
    assert limit >= 190


def test_adaptive_waits_for_the_interval_and_enough_calls() -> None:
    a = Adaptive(RulePolicy(1, 100), initial=50, min_limit=1, max_limit=100, interval_s=1.0,
                 min_samples=10, now=0.0)
    for _ in range(9):
        a.record(3000, ok=False, in_flight=50)
    assert not a.maybe_adjust(5.0)  # too few calls
    a.record(3000, ok=False, in_flight=50)
    assert a.maybe_adjust(5.0)
    assert a.limit == 25 and a.slots == 25
    for _ in range(20):
        a.record(3000, ok=False, in_flight=25)
    assert not a.maybe_adjust(5.5)  # the interval has not passed
    assert a.maybe_adjust(6.0) and a.limit == 12.5


def test_drops_count_as_failures_and_429s_do_not_skew_latency() -> None:
    a = Adaptive(RulePolicy(1, 100), initial=50, min_limit=1, max_limit=100,
                 min_samples=1, now=0.0)
    a.record(0.0, ok=True, dropped=True)   # a 429 answered at once
    a.record(3000.0, ok=True, dropped=True)  # a timeout
    a.record(1000.0, ok=True, output_tokens=80)
    a.maybe_adjust(10.0)
    w = a.last_stats
    assert w is not None
    assert w.failure_rate == pytest.approx(2 / 3) and w.drop_rate == pytest.approx(2 / 3)
    assert w.mean_latency_ms == pytest.approx(2000.0)
    assert w.mean_norm_latency == pytest.approx(1000.0 / 100)


def test_policies_by_name() -> None:
    assert make_policy("rule", 1, 10).name == "rule"
    assert make_policy("gradient", 1, 10).name == "gradient"
    assert make_policy("fixed", 1, 10).next_limit(7, stats(9999, 1.0)) == 7
    with pytest.raises(ConfigError, match="unknown concurrency policy"):
        make_policy("vegas", 1, 10)
