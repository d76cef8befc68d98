"""The shared bucket's arithmetic: refill on the database clock, grants, returns,
settlements, pauses, and the promise that grants never exceed a sliding-window limit."""

from __future__ import annotations

import math
import random
from bisect import bisect_left
from dataclasses import replace

import pytest

from lockgate.flow.bucket import (
    CUT,
    SPORADIC_CUT,
    Ask,
    Bucket,
    Grant,
    Limits,
    effective,
    initial,
    lease,
)

#: No grants ahead (``min_cap_ms=0``): the allowance arithmetic alone.
L60 = Limits(requests=600, tokens=60_000, window_ms=60_000, headroom=0.02, burst=0.01,
             min_cap_ms=0)


def test_a_new_bucket_holds_only_its_small_cap() -> None:
    b = initial(L60, now=1000)
    assert b.requests == pytest.approx(6.0)  # 1% of the window, not the whole minute
    assert b.tokens == pytest.approx(600.0)


def test_refill_follows_elapsed_time_and_stops_at_the_cap() -> None:
    b = Bucket(0.0, 0.0, refilled_at=0)
    half = b.refilled(L60, 100)  # 100 ms of 582 req/min: 600 less 2% and the cap's 6
    assert half.requests == pytest.approx(0.97)
    assert b.refilled(L60, 3_600_000).requests == pytest.approx(L60.cap(600))
    assert b.refilled(L60, -5).requests == 0.0  # a clock going back refills nothing


def test_a_provider_limit_sets_the_cap_aside_and_a_pace_does_not() -> None:
    """Grants in any window stay under limit * (1 - headroom) with the cap included;
    a window batch's pace (no provider window to overrun) refills at its full rate."""
    for window in (60_000, 10_000, 1_000):
        lim = Limits(1000, None, window, headroom=0.02, burst=0.01, min_cap_ms=200)
        assert lim.cap(1000) + lim.rate(1000) * window == pytest.approx(980, abs=1e-6)
    pace = Limits(50, None, 1000, headroom=0.0, burst=0.25, min_cap_ms=200, sliding=False)
    assert pace.rate(50) == pytest.approx(0.05)
    assert pace.cap(50) == pytest.approx(12.5)


def test_requests_and_tokens_are_granted_each_within_its_allowance() -> None:
    b = Bucket(5.5, 550.0, refilled_at=0)
    _after, g = lease(b, L60, 0, Ask(requests=10, tokens=1500.0, largest=150.0))
    assert (g.requests, g.tokens) == (5, 550.0)
    _after, g = lease(b, L60, 0, Ask(requests=3, tokens=200.0, largest=80.0))
    assert (g.requests, g.tokens) == (3, 200.0)


def test_while_requests_bind_tokens_go_only_with_the_requests_granted() -> None:
    """A worker with 10 calls waiting (100 tokens each) and 2 requests held gets 3 more
    requests: tokens for 5 calls, minus the 120 it holds, not for all 10. Without the
    per-call estimate nothing is capped."""
    b = Bucket(3.0, 5000.0, refilled_at=0)
    ask = Ask(requests=8, tokens=880.0, largest=100.0, per_call=100.0, held_requests=2,
              held_tokens=120.0)
    _after, g = lease(b, L60, 0, ask)
    assert (g.requests, g.tokens) == (3, 380.0)
    _after, g = lease(b, L60, 0, Ask(requests=8, tokens=880.0, largest=100.0))
    assert (g.requests, g.tokens) == (3, 600.0)  # all the allowance (its cap)
    _after, g = lease(Bucket(0.0, 5000.0, refilled_at=0), L60, 0, ask)
    assert (g.requests, g.tokens) == (0, 80.0)  # the 2 held requests still get theirs
    _after, g = lease(Bucket(6.0, 5000.0, refilled_at=0), L60, 0, replace(ask, requests=5))
    assert (g.requests, g.tokens) == (5, 600.0)  # requests do not bind: no cap


def test_one_call_larger_than_the_cap_is_granted_and_paid_back_later() -> None:
    b = Bucket(6.0, 600.0, refilled_at=0)
    after, g = lease(b, L60, 0, Ask(requests=1, tokens=5000.0, largest=5000.0))
    assert (g.requests, g.tokens) == (1, 5000.0)
    assert after.tokens == pytest.approx(-4400.0)
    # Nothing more until refills have paid the debt back.
    _a2, g2 = lease(after, L60, 1000, Ask(requests=1, tokens=100.0, largest=100.0))
    assert g2.tokens == 0


def test_the_overdraft_is_one_call_at_most() -> None:
    b = Bucket(6.0, 600.0, refilled_at=0)
    after, g = lease(b, L60, 0, Ask(requests=6, tokens=5000.0, largest=300.0))
    assert g.tokens == 600.0 and after.tokens == pytest.approx(0.0)
    _a, g = lease(Bucket(6.0, 100.0, 0), L60, 0, Ask(requests=6, tokens=5000.0, largest=300))
    assert g.tokens == 300.0


def test_returns_and_settlements_move_the_allowance_but_never_past_the_cap() -> None:
    b = Bucket(0.0, 0.0, refilled_at=0)
    after, _ = lease(b, L60, 0, Ask(give_requests=100, give_tokens=100_000))
    assert after.requests == pytest.approx(L60.cap(600))
    assert after.tokens == pytest.approx(L60.cap(60_000))
    after, _ = lease(after, L60, 0, Ask(debt_tokens=250.0))  # used more than reserved
    assert after.tokens == pytest.approx(L60.cap(60_000) - 250.0)
    after, _ = lease(after, L60, 0, Ask(debt_tokens=-100.0))  # a refund
    assert after.tokens == pytest.approx(L60.cap(60_000) - 150.0)
    after, _ = lease(after, L60, 0, Ask(debt_tokens=-10_000.0))  # refunds are capped too
    assert after.tokens == pytest.approx(L60.cap(60_000))


def test_a_pause_stops_grants_until_it_ends_and_is_never_shortened() -> None:
    b = Bucket(6.0, 600.0, refilled_at=0)
    b, g = lease(b, L60, 0, Ask(requests=1, tokens=10, pause_ms=2000))
    assert (g.requests, g.paused_ms, b.paused_until) == (0, 2000, 2000)
    b, g = lease(b, L60, 500, Ask(requests=1, tokens=10, pause_ms=100))
    assert (g.requests, g.paused_ms, b.paused_until) == (0, 1500, 2000)
    b, g = lease(b, L60, 2000, Ask(requests=1, tokens=10))
    assert (g.requests, g.paused_ms) == (1, 0)


def test_unlimited_dimensions_grant_everything() -> None:
    free = Limits(None, None)
    assert not free.limited
    _b, g = lease(Bucket(0, 0, 0), free, 0, Ask(requests=1000, tokens=1e9))
    assert g.requests == 1000


def test_learned_limits_only_lower_the_configured_ones() -> None:
    assert effective(1000, None) == 1000
    assert effective(1000, 500) == 500
    assert effective(1000, 5000) == 1000
    assert effective(None, 300) == 300


def _max_in_window(times: list[int], window: int) -> int:
    times.sort()
    return max((bisect_left(times, t + window) - i for i, t in enumerate(times)), default=0)


def _send_times(t: int, g: Grant, rng: random.Random, late_ms: int) -> list[int]:
    """When a worker sends a grant's calls: each when it becomes usable, up to
    ``late_ms`` later (a busy process)."""
    out = []
    for k in range(g.requests):
        at = 0.0 if g.req_rate <= 0 else max(0.0, (k + 1 - g.req_from) / g.req_rate)
        out.append(t + math.ceil(at) + rng.randint(0, late_ms))
    return out


@pytest.mark.parametrize(("seed", "window", "period", "use"),
                         [(1, 20_000, 0, 0.96), (2, 20_000, 0, 0.96), (3, 20_000, 0, 0.96),
                          (4, 5_000, 0, 0.96), (5, 5_000, 0, 0.96),
                          (6, 60_000, 1_000, 0.96), (7, 60_000, 1_000, 0.96)])
def test_many_workers_never_get_more_than_the_limit_in_any_window(
        seed: int, window: int, period: int, use: float) -> None:
    """Eight workers lease every ~100 ms (with jitter) for what waits plus one interval,
    and send each call when its grant makes it usable, up to 20 ms late; the provider
    counts sends in a sliding window (and, with ``period``, the limit scaled to any
    period: 2,000 per minute as 33 per second... here 120,000 per minute, 2,000 per
    second). Checked over five windows (periods), starting together at t=0 (no burst at
    start)."""
    rng = random.Random(seed)
    limit = 2000
    per_window = limit * window // period if period else limit
    lim = Limits(per_window, None, window, headroom=0.02, burst=0.01, min_cap_ms=200,
                 period_ms=period)
    span = period or window
    b = initial(lim, 0)
    events = sorted((rng.randint(0, 100), w) for w in range(8))
    sends: list[int] = []
    next_tick = {w: t for t, w in events}
    horizon = span * 5
    t = 0
    while t < horizon:
        w = min(next_tick, key=lambda k: next_tick[k])
        t = next_tick[w]
        b, g = lease(b, lim, t, Ask(requests=rng.randint(20, 60)))
        sends += _send_times(t, g, rng, 20)
        next_tick[w] = t + rng.randint(60, 140)
    sends = [s for s in sends if s < horizon]
    assert _max_in_window(sends, span) <= limit
    # ... and the limit is used: at least 96% of it over the run.
    assert len(sends) >= use * limit * horizon / span


def test_grants_ahead_are_scheduled_and_nothing_is_lost_between_leases() -> None:
    """One worker leasing every 100 ms for more than it can get, at 60,000 per minute
    enforced per second: each lease grants the next interval ahead, the schedule makes
    it usable at the bucket's rate, and the sends in any second stay under 980."""
    lim = Limits(60_000, None, 60_000, headroom=0.02, burst=0.01, min_cap_ms=200,
                 period_ms=1000)
    assert lim.cap(60_000) == pytest.approx(10.0)  # 1% of a second, not of a minute
    assert lim.rate(60_000) == pytest.approx(0.97)  # 970 per second
    b = initial(lim, 0)
    sends: list[int] = []
    for t in range(0, 10_000, 100):
        b, g = lease(b, lim, t, Ask(requests=1000))
        assert b.requests >= -lim.ahead(60_000) - 1e-6
        sends += _send_times(t, g, random.Random(t), 0)
    assert _max_in_window(sends, 1000) <= 980
    assert len([s for s in sends if s < 10_000]) >= 0.96 * 10_000


def test_a_pace_is_not_granted_ahead() -> None:
    pace = Limits(50, None, 1000, headroom=0.0, burst=0.25, min_cap_ms=200, sliding=False)
    _b, g = lease(Bucket(0.0, 0.0, 0), pace, 0, Ask(requests=10))
    assert (g.requests, g.req_rate) == (0, 0.0)


def test_charges_owe_one_window_of_the_limit_at_most() -> None:
    """A usage figure no provider would accept (500M tokens on a 600 per minute row)
    owes one window: the allowance is back in one window, not in years."""
    b, _ = lease(Bucket(6.0, 10.0, 0), L60, 0, Ask(debt_tokens=500_000_000.0,
                                                   debt_requests=10_000))
    assert (b.requests, b.tokens) == (-600.0, -60_000.0)
    _later, g = lease(b, L60, 62_000, Ask(requests=1, tokens=100.0))
    assert g.requests == 1 and g.tokens == 100.0


def test_calls_sent_before_the_limit_was_known_are_charged() -> None:
    b, _ = lease(Bucket(6.0, 0.0, 0), L60, 0, Ask(debt_requests=50))
    assert b.requests == pytest.approx(-44.0)


def test_a_429_lowers_the_shared_rate_once_per_burst_and_it_recovers() -> None:
    t = 1_000_000
    b = Bucket(0.0, 0.0, refilled_at=t)
    b, _ = lease(b, L60, t, Ask(cut=CUT))
    assert b.factor == pytest.approx(0.9)
    b, _ = lease(b, L60, t + 500, Ask(cut=CUT))  # the same burst: no second cut
    assert b.factor == pytest.approx(0.9 + 500 * 0.02 / 10_000)
    b, _ = lease(b, L60, t + 3000, Ask(cut=CUT))
    assert b.factor < 0.9
    # The refill follows the lowered rate ...
    low = b.factor
    b2, _ = lease(Bucket(0.0, 0.0, t, factor=low, cut_at=t), L60, t + 100, Ask())
    assert b2.requests == pytest.approx(100 * 600 * 0.98 / 60_000 * low, rel=0.01)
    # ... and it climbs back to the full limit without 429s.
    b3, _ = lease(b, L60, t + 10 * 60_000, Ask())
    assert b3.factor == 1.0
    for _ in range(20):
        b, _ = lease(b, L60, b.cut_at + 2000, Ask(cut=CUT))
    assert b.factor >= 0.5


def test_a_sporadic_429_lowers_the_shared_rate_a_smaller_step() -> None:
    t = 1_000_000
    b, _ = lease(Bucket(0.0, 0.0, refilled_at=t), L60, t, Ask(cut=SPORADIC_CUT))
    assert b.factor == pytest.approx(0.95)
    b, _ = lease(b, L60, t + 2000, Ask(cut=CUT))  # a burst after it: the full step
    assert b.factor == pytest.approx((0.95 + 2000 * 0.02 / 10_000) * 0.9)
