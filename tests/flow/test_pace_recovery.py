"""How an inferred pace (:class:`lockgate.flow.endpoint.Pace`) goes through a storm of
429s (a provider refusing every call for a while, then unlimited again): cut once, not
once a period down to its floor, and back to the rate that held within a few periods
(it took minutes: +2 % a period)."""

from __future__ import annotations

import asyncio
import time

from lockgate.errors import ErrorClass
from lockgate.flow.endpoint import PACE_CUT, PACE_RISE, Pace

from .test_control import CONFIG, claimed, controller, ep, result


def test_a_storm_cuts_the_pace_once_and_it_doubles_back_to_the_rate_that_held() -> None:
    """160 calls a second, then 20 s of 429s with no header (every call refused), then
    unlimited again: the pace was cut once a second to 4 % of itself (0.85 ** 20) and
    rose 2 % a second, ~165 s back to the rate before."""
    pace = Pace.inferred(160, 1.0, 0.0)
    start = pace.rate
    assert pace.cut(1.0, sent=0.99, accepted=False)  # the storm's first verdict
    now = 1.0
    for _ in range(20):  # each second a call sent at the cut pace is refused
        now += 1.0
        assert not pace.cut(now, sent=now - 0.01, accepted=False)
    assert pace.rate == start * PACE_CUT
    rates = []
    for _ in range(3):  # calls accepted again, and waiting for the pace
        now += 1.0
        pace.rise(now)
        rates.append(pace.rate)
    assert rates[0] == start  # doubling, capped at the rate that held
    assert rates[1] == start * (1 + PACE_RISE)  # then probing up by 2 %


def test_a_cut_needs_a_429_for_a_call_sent_after_the_last_cut() -> None:
    pace = Pace.inferred(100, 1.0, 0.0)
    assert pace.cut(1.5, sent=1.4)
    rate = pace.rate
    assert not pace.cut(2.6, sent=1.45)  # sent at the old pace: no news of this one
    assert pace.rate == rate
    assert pace.cut(2.7, sent=2.0)  # sent at the cut pace, and accepted calls beside it


def test_a_limit_the_acceptances_show_is_not_regained_by_doubling() -> None:
    """429s among accepted calls: a limit below the rate. The pace is cut each period
    with such evidence, and climbs back from there by 2 %, not by doubling (else it
    would bounce on the limit)."""
    pace = Pace.inferred(100, 1.0, 0.0)
    assert pace.cut(1.0, sent=0.9, accepted=True)
    assert pace.cut(2.0, sent=1.9, accepted=True)
    low = pace.rate
    assert low == 90 * PACE_CUT * PACE_CUT
    pace.rise(3.0)
    assert pace.rate == low * (1 + PACE_RISE)


def test_a_pause_leaves_nothing_to_burst_when_it_ends() -> None:
    pace = Pace.inferred(100, 1.0, 0.0)
    pace.rise(1.0)
    assert pace.ready(1.5)
    pace.hold(3.0)
    assert not pace.ready(2.9)
    assert not pace.ready(3.0)
    assert abs(pace.wait(3.0) - 1 / pace.rate) < 1e-9


def test_after_a_storm_of_429s_the_worker_is_back_at_its_pace_within_a_few_periods() -> None:
    """The same through the controller, at a period of 0.1 s: calls answered, then
    every call refused for 10 periods (no header), then answered again."""
    async def main() -> tuple[float, float, float]:
        fc, _ = controller([ep("a", limit_enforced_s=0.1)], lease_interval_s=0.02,
                           default_pause_s=0.05)
        stop = asyncio.Event()
        loop = asyncio.create_task(fc.run(stop))
        primary = fc.settings.endpoint[0]
        t0 = time.monotonic()
        seen: dict[str, float] = {}
        n = 0

        async def caller() -> None:
            nonlocal n
            while (el := time.monotonic() - t0) < 2.0:
                n += 1
                t = await fc.acquire(claimed(n), CONFIG, primary)
                await asyncio.sleep(0.005)
                el = time.monotonic() - t0
                pace = fc.states["a"].pace
                if pace is not None:
                    seen.setdefault("start", pace.rate)
                    if el >= 1.3:
                        seen.setdefault("storm_end", pace.rate)
                if 0.3 <= el < 1.3:
                    fc.release(t, result(ErrorClass.RATE_LIMITED, latency=1.0))
                else:
                    fc.release(t, result(latency=5.0))

        await asyncio.gather(*(caller() for _ in range(20)))
        seen["end"] = fc.states["a"].pace.rate  # type: ignore[union-attr]
        stop.set()
        await loop
        return seen["start"], seen["storm_end"], seen["end"]

    start, storm_end, end = asyncio.run(main())
    assert storm_end >= 0.8 * start, (start, storm_end)  # was ~0.2 (a cut a period)
    assert end >= 0.8 * start, (start, end)  # was ~0.25 (2 % a period)
