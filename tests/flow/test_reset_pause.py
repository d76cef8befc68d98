"""Pauses learned from a limit with nothing remaining: a reset is the time until the
limit is full again, so the pause is the time one call frees (``reset / limit``); a
Retry-After replaces a pause only inferred from headers; a fixed window (refused again
after such a pause) pauses until its reset. And the unsuffixed Together/OpenRouter
headers reach flow control as the requests ones."""

from __future__ import annotations

import asyncio
import time

from lockgate.errors import ErrorClass
from lockgate.providers.headers import rate_headers

from .test_control import CONFIG, claimed, controller, ep, result

FULL_IN_60S = {"x-ratelimit-limit-requests": "120", "x-ratelimit-remaining-requests": "0",
               "x-ratelimit-reset-requests": "60s"}


def test_nothing_remaining_with_a_reset_to_full_pauses_for_one_call_not_the_reset() -> None:
    """120 a minute, nothing left, full again in 60 s: one call frees every 0.5 s. The
    endpoint was paused for 60 s (12 tasks took 64 s instead of ~5 s)."""
    async def main() -> tuple[float, int]:
        fc, fake = controller([ep("a")], lease_interval_s=0.02)
        stop = asyncio.Event()
        loop = asyncio.create_task(fc.run(stop))
        primary = fc.settings.endpoint[0]
        t = await fc.acquire(claimed(1), CONFIG, primary)
        fc.release(t, result(headers=FULL_IN_60S))
        left = fc.states["a"].paused_until - time.monotonic()
        await asyncio.sleep(0.1)  # published with the next leases
        row = fake.rows["a"][1].paused_until - fake.now()
        stop.set()
        await loop
        return left, row

    left, row = asyncio.run(main())
    assert 0.3 < left <= 0.5
    assert row <= 500


def test_a_retry_after_replaces_a_pause_inferred_from_headers_here_and_for_everyone() -> None:
    """An answer says nothing remains until a reset 60 s away (no limit known: the
    whole reset); the next, a 429, says retry after 500 ms: that is the pause, in this
    worker and in the shared row (it could only lengthen a pause before)."""
    async def main() -> tuple[float, float, float, str | None, float]:
        fc, fake = controller([ep("a")], lease_interval_s=0.02)
        stop = asyncio.Event()
        loop = asyncio.create_task(fc.run(stop))
        primary = fc.settings.endpoint[0]
        t1 = await fc.acquire(claimed(1), CONFIG, primary)
        st = fc.states["a"]
        t2 = await fc.acquire(claimed(2), CONFIG, primary)
        fc.release(t1, result(headers={"x-ratelimit-remaining-requests": "0",
                                       "x-ratelimit-reset-requests": "60s"}))
        inferred = st.paused_until - time.monotonic()
        await asyncio.sleep(0.1)  # the row has the inferred pause
        fc.release(t2, result(ErrorClass.RATE_LIMITED, retry_after_ms=500,
                              headers={"x-ratelimit-remaining-requests": "0",
                                       "x-ratelimit-reset-requests": "60s"}))
        replaced = st.paused_until - time.monotonic()
        await asyncio.sleep(0.1)  # a few leases: the row must not bring the 60 s back
        after_leases = st.paused_until - time.monotonic()
        _spec, row = fake.rows["a"]
        row_left = row.paused_until - fake.now()
        t0 = time.monotonic()
        t3 = await asyncio.wait_for(fc.acquire(claimed(3), CONFIG, primary), 5)
        waited = time.monotonic() - t0
        fc.release(t3, result())
        stop.set()
        await loop
        assert row_left <= 500
        return inferred, replaced, after_leases, row.pause_reason, waited

    inferred, replaced, after_leases, why, waited = asyncio.run(main())
    assert inferred > 59
    assert 0.4 < replaced <= 0.5
    assert after_leases <= 0.4
    assert why == "rate_limited"
    assert waited < 3.0  # the pause, then the pace inferred from one call accepted


def test_an_inferred_pause_never_shortens_one_the_provider_named() -> None:
    async def main() -> float:
        fc, _ = controller([ep("a")], lease_interval_s=0.02)
        stop = asyncio.Event()
        loop = asyncio.create_task(fc.run(stop))
        primary = fc.settings.endpoint[0]
        t1 = await fc.acquire(claimed(1), CONFIG, primary)
        t2 = await fc.acquire(claimed(2), CONFIG, primary)
        fc.release(t1, result(ErrorClass.RATE_LIMITED, retry_after_ms=3000,
                              headers={"retry-after-ms": "3000"}))
        fc.release(t2, result(ErrorClass.RATE_LIMITED, headers=FULL_IN_60S))
        left = fc.states["a"].paused_until - time.monotonic()
        stop.set()
        await loop
        return left

    assert asyncio.run(main()) > 2.9


def test_a_fixed_window_refusing_again_after_the_short_pause_pauses_until_its_reset() -> None:
    """60 a minute in a fixed window, nothing left for 8 s: the first pause is the time
    one call would free in a continuous bucket (134 ms); a 429 for a call sent before it
    ended says nothing new; one for a call sent after it says the window is fixed, and
    the pause is then what that answer's reset says."""
    def window(reset: str) -> dict[str, str]:
        return {"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "0",
                "x-ratelimit-reset-requests": reset}

    async def main() -> tuple[float, float, float]:
        fc, _ = controller([ep("a")], lease_interval_s=0.02)
        stop = asyncio.Event()
        loop = asyncio.create_task(fc.run(stop))
        primary = fc.settings.endpoint[0]
        t1 = await fc.acquire(claimed(1), CONFIG, primary)
        st = fc.states["a"]
        t2 = await fc.acquire(claimed(2), CONFIG, primary)
        fc.release(t1, result(ErrorClass.RATE_LIMITED, latency=5.0, headers=window("8s")))
        first = st.paused_until - time.monotonic()
        fc.release(t2, result(ErrorClass.RATE_LIMITED, latency=5.0, headers=window("8s")))
        in_flight = st.paused_until - time.monotonic()  # sent before the pause: no news
        t3 = await asyncio.wait_for(fc.acquire(claimed(3), CONFIG, primary), 10)
        fc.release(t3, result(ErrorClass.RATE_LIMITED, latency=1.0,
                              headers=window("7.5s")))
        fixed = st.paused_until - time.monotonic()
        stop.set()
        await loop
        return first, in_flight, fixed

    first, in_flight, fixed = asyncio.run(main())
    assert 0.05 < first <= 0.134
    assert in_flight <= 0.134
    assert 7.0 < fixed <= 7.5


def test_a_429_with_together_s_headers_learns_the_limit_and_pauses_by_them() -> None:
    """``x-ratelimit-limit: 60``, ``-remaining: 0``, ``-reset: 8`` (no Retry-After) were
    ignored: a 1 s default pause per 429, no limit learned, 4 tasks DEAD in 5-6 s."""
    headers = rate_headers({"x-ratelimit-limit": "60", "x-ratelimit-remaining": "0",
                            "x-ratelimit-reset": "8"})

    async def main() -> tuple[bool, float, str | None]:
        fc, _ = controller([ep("a")], lease_interval_s=0.02, default_pause_s=5)
        stop = asyncio.Event()
        loop = asyncio.create_task(fc.run(stop))
        primary = fc.settings.endpoint[0]
        t = await fc.acquire(claimed(1), CONFIG, primary)
        st = fc.states["a"]
        fc.release(t, result(ErrorClass.RATE_LIMITED, headers=headers))
        left = st.paused_until - time.monotonic()
        stop.set()
        await loop
        return st.req_limited, left, st.pause_reason

    limited, left, why = asyncio.run(main())
    assert limited  # 60 a minute, from now on paced by the shared bucket
    assert left <= 0.134 and why == "exhausted"  # not the 5 s default of a bare 429


def test_a_429_after_the_reset_has_fallen_starts_with_a_short_pause_again() -> None:
    """The fixed-window verdict holds until the reset the short pause was inferred from:
    a limit reached again later is first taken for a continuous bucket again."""
    headers = {"x-ratelimit-limit-requests": "3", "x-ratelimit-remaining-requests": "0",
               "x-ratelimit-reset-requests": "300ms"}

    async def main() -> tuple[float, float]:
        fc, _ = controller([ep("a")], lease_interval_s=0.02)
        stop = asyncio.Event()
        loop = asyncio.create_task(fc.run(stop))
        primary = fc.settings.endpoint[0]
        t1 = await fc.acquire(claimed(1), CONFIG, primary)
        st = fc.states["a"]
        fc.release(t1, result(ErrorClass.RATE_LIMITED, latency=1.0, headers=headers))
        first = st.paused_until - time.monotonic()
        await asyncio.sleep(0.4)  # the reset has fallen
        t2 = await asyncio.wait_for(fc.acquire(claimed(2), CONFIG, primary), 10)
        fc.release(t2, result(ErrorClass.RATE_LIMITED, latency=1.0, headers=headers))
        again = st.paused_until - time.monotonic()
        stop.set()
        await loop
        return first, again

    first, again = asyncio.run(main())
    assert 0.05 < first <= 0.1
    assert again <= 0.1
