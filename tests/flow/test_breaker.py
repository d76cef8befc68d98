"""The circuit breaker's state machine, every arrow."""

from __future__ import annotations

from lockgate.flow.breaker import Breaker, BreakerState


def test_opens_on_the_failure_rate_over_the_window() -> None:
    b = Breaker(failure_rate=0.5, min_calls=10, consecutive=100, window_s=10)
    for i in range(9):
        b.record(float(i) * 0.1, failed=i % 2 == 0)
    assert b.state is BreakerState.CLOSED  # too few calls yet
    b.record(1.0, failed=True)
    assert b.state is BreakerState.OPEN
    assert not b.allow(2.0) and not b.available(2.0)


def test_old_failures_leave_the_window() -> None:
    b = Breaker(failure_rate=0.5, min_calls=10, consecutive=100, window_s=10)
    for i in range(6):
        b.record(float(i), failed=True)
    for i in range(10):
        b.record(20.0 + i, failed=False)
    b.record(30.0, failed=True)
    assert b.state is BreakerState.CLOSED


def test_opens_on_consecutive_failures() -> None:
    b = Breaker(consecutive=3, min_calls=1000)
    b.record(0.0, failed=True)
    b.record(0.1, failed=True)
    b.record(0.2, failed=False)
    b.record(0.3, failed=True)
    b.record(0.4, failed=True)
    assert b.state is BreakerState.CLOSED
    b.record(0.5, failed=True)
    assert b.state is BreakerState.OPEN


def test_half_open_probes_then_close_on_success() -> None:
    b = Breaker(consecutive=1, open_s=5, probes=2)
    b.record(0.0, failed=True)
    assert b.state is BreakerState.OPEN and b.open_until == 5.0
    assert not b.allow(4.9)
    assert b.allow(5.0) and b.state is BreakerState.HALF_OPEN
    assert b.allow(5.0)
    assert not b.allow(5.0), "only `probes` calls at a time while half-open"
    b.record(5.5, failed=False, probe=True)
    assert b.state is BreakerState.HALF_OPEN
    b.record(5.6, failed=False, probe=True)
    assert b.state is BreakerState.CLOSED
    assert b.allow(5.7)


def test_a_failed_probe_reopens_for_longer_and_success_resets_the_backoff() -> None:
    b = Breaker(consecutive=1, open_s=5, max_open_s=12, probes=1)
    b.record(0.0, failed=True)
    assert b.allow(5.0)
    b.record(5.1, failed=True, probe=True)
    assert b.state is BreakerState.OPEN and b.open_until == 5.1 + 10
    assert b.allow(15.1)
    b.record(15.2, failed=True, probe=True)
    assert b.open_until == 15.2 + 12  # capped
    assert b.allow(27.2)
    b.record(27.3, failed=False, probe=True)
    assert b.state is BreakerState.CLOSED and b.open_count == 0


def test_calls_from_before_the_opening_do_not_close_it() -> None:
    b = Breaker(consecutive=2, open_s=5)
    b.record(0.0, failed=True)
    b.record(0.1, failed=True)
    assert b.state is BreakerState.OPEN
    b.record(0.2, failed=False)  # started while closed, finished late
    assert b.state is BreakerState.OPEN
