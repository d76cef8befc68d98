"""The pace a worker keeps on an endpoint that refuses calls for the rate (429) without
naming a limit (:class:`lockgate.flow.endpoint.Pace`): its arithmetic, as properties."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lockgate.flow.endpoint import PACE_CUT, PACE_MIN_RATE, PACE_START, Pace


def _send(pace: Pace, times: list[float]) -> list[float]:
    """The times a caller that sends as soon as the pace lets it would send at, asking
    at ``times`` (sorted) and, while refused, again when the pace says."""
    sent = []
    for t in times:
        now = max(t, sent[-1] if sent else t)
        if not pace.ready(now):
            now += pace.wait(now)
            assert pace.ready(now + 1e-9)
            now += 1e-9
        pace.take(now)
        sent.append(now)
    return sent


@settings(max_examples=300, deadline=None)
@given(answered=st.integers(0, 5000), period=st.sampled_from([0.5, 1.0, 10.0, 60.0]),
       asks=st.lists(st.floats(0.0, 30.0, allow_nan=False), min_size=1, max_size=300),
       window=st.floats(0.05, 5.0))
def test_calls_in_any_window_stay_within_the_rate_and_its_small_burst(
        answered: int, period: float, asks: list[float], window: float) -> None:
    pace = Pace.inferred(answered, period, 0.0)
    assert pace.rate == max(PACE_MIN_RATE, PACE_START * answered / period)
    sent = _send(pace, sorted(asks))
    burst = max(1.0, pace.rate * 0.1)
    for i, t in enumerate(sent):
        inside = sum(1 for s in sent[i:] if s <= t + window)
        assert inside <= pace.rate * window + burst + 1e-6


def test_it_starts_empty_so_a_pause_never_ends_with_a_burst() -> None:
    pace = Pace.inferred(100, 1.0, 10.0)
    assert not pace.ready(10.0)
    assert abs(pace.wait(10.0) - 1 / 90) < 1e-9


def test_a_burst_of_429s_cuts_it_once_and_rises_resume_a_period_later() -> None:
    pace = Pace.inferred(100, 1.0, 0.0)
    assert not pace.cut(0.5)  # the burst that taught it
    assert pace.cut(1.2)
    assert abs(pace.rate - 90 * PACE_CUT) < 1e-9
    assert not pace.cut(1.9)  # the same burst's other 429s
    pace.rise(2.0)  # less than a period after the cut: no rise
    assert abs(pace.rate - 90 * PACE_CUT) < 1e-9
    pace.rise(2.3)
    assert pace.rate > 90 * PACE_CUT
    before = pace.rate
    pace.rise(2.9)  # once per period
    assert pace.rate == before
    # A rise does not hold a cut back: a 429 after a rise cuts at once.
    assert pace.cut(3.0)
    assert pace.rate < before


@given(cuts=st.integers(0, 200))
def test_it_never_falls_below_its_least_rate(cuts: int) -> None:
    pace = Pace.inferred(0, 1.0, 0.0)
    for i in range(cuts):
        pace.cut(1.0 + i)
    assert pace.rate >= PACE_MIN_RATE
