"""The breaker and the fallback under server errors (review 13).

Errors answered at once (a 529 ``overloaded_error``) come back before the slow successes
sent with them: judged in the order they finished, 30% of them made the first results
mostly failures, and ten in a row, and the breaker opened (throughput fell a hundredfold).
A half-open breaker re-opened at any failed probe (0.7^3: two times in three).

An endpoint paused by its 503s (Retry-After) for less than ``fallback_after_s`` kept the
retry of a call it had refused: the call waited for it, was the one call sent when the
pause ended, met the 503 again, and so on until its task was DEAD, while the fallback
served every other task."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest
from aiohttp import web

from helpers import chat_server
from lockgate.flow.breaker import Breaker, BreakerState
from lockgate.spec import parse_task
from lockgate.store import Store
from lockgate.worker import Worker

from .support import MODEL, rows, run_workers, settings, status_counts, tasks


def answer() -> web.Response:
    return web.json_response(
        {
            "model": MODEL,
            "usage": {"prompt_tokens": 40, "completion_tokens": 5},
            "choices": [
                {
                    "message": {"role": "assistant", "content": '{"label": "delivery"}'},
                    "finish_reason": "stop",
                }
            ],
        }
    )


OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


def test_instant_errors_below_the_failure_rate_do_not_open_the_breaker(
    stores: Callable[[], Store], caplog: pytest.LogCaptureFixture
) -> None:
    """Three calls in ten are refused at once with a 529, the others answered after
    100 ms: 30% of failures, below the breaker's 50%. The breaker stays closed and every
    task succeeds."""
    seen = {"n": 0, "overloaded": 0}

    async def chat(_request: web.Request) -> web.Response:
        seen["n"] += 1
        if seen["n"] % 10 < 3:
            seen["overloaded"] += 1
            return web.json_response(OVERLOADED, status=529)
        await asyncio.sleep(0.1)
        return answer()

    store = stores()
    store.submit(
        [parse_task(t) for t in tasks(300, retry={"max_retries": 20, "base_delay_ms": 10})],
        batch_id="b",
    )
    caplog.set_level(logging.INFO, logger="lockgate.flow")
    with chat_server(chat) as url:
        cfg = settings(
            [{"name": "ep", "base_url": url}],
            flow={"breaker_open_s": 0.5, "breaker_max_open_s": 0.5},
            concurrency=64,
        )
        asyncio.run(run_workers([Worker(stores(), cfg, burst=True)], timeout=120))
    assert status_counts(store) == {"SUCCEEDED": 300}
    assert seen["overloaded"] >= 90  # they did meet the 529s
    opened = [r.getMessage() for r in caplog.records if "is failing" in r.getMessage()]
    assert opened == [], opened[:3]


def test_calls_in_flight_may_succeed_and_a_down_endpoint_still_opens_the_breaker() -> None:
    """Twenty calls sent, three answered at once with errors: the seventeen in flight
    may succeed, so three in a row do not open a breaker of ``consecutive = 3``. Once
    the others failed too, it opens."""
    b = Breaker(consecutive=3, min_calls=1000)
    for _ in range(20):
        assert b.allow(0.0)
    for i in range(3):
        b.record(0.01 * i, failed=True)
    assert b.state is BreakerState.CLOSED
    for i in range(17):
        b.record(0.1 + 0.01 * i, failed=True)
    assert b.state is BreakerState.OPEN


def test_one_failed_probe_in_three_does_not_reopen_the_breaker() -> None:
    b = Breaker(consecutive=1, open_s=5, probes=3)
    b.record(0.0, failed=True)
    assert b.state is BreakerState.OPEN
    assert b.allow(5.0) and b.allow(5.0) and b.allow(5.0)
    b.record(5.1, failed=True, probe=True)
    assert b.state is BreakerState.HALF_OPEN
    b.record(5.2, failed=False, probe=True)
    b.record(5.3, failed=False, probe=True)
    assert b.state is BreakerState.CLOSED and b.open_count == 0
    # Two failed probes of three re-open it, for longer.
    b = Breaker(consecutive=1, open_s=5, probes=3)
    b.record(0.0, failed=True)
    assert b.allow(5.0) and b.allow(5.0)
    b.record(5.1, failed=True, probe=True)
    b.record(5.2, failed=True, probe=True)
    assert b.state is BreakerState.OPEN and b.open_until == 5.2 + 10


UNAVAILABLE = {"error": {"message": "Service Unavailable", "type": "server_error"}}


@pytest.mark.xfail(
    strict=False,  # (timing: the refused task's retry is sometimes not the probe)
    reason="known defect: the retry of a refused call comes at the pause's end "
    "(its delay is at least the Retry-After): routing does not know the "
    "call's task was refused there; the worker must tell it",
)
def test_a_call_the_unavailable_primary_refused_goes_to_the_fallback(
    stores: Callable[[], Store],
) -> None:
    """The primary answers 503 with Retry-After: 1 (shorter than ``fallback_after_s``),
    its fallback answers. No task is sent to the primary more than once: its retry goes
    to the fallback, and every task succeeds (two retries allowed)."""

    async def down(_request: web.Request) -> web.Response:
        return web.json_response(UNAVAILABLE, status=503, headers={"retry-after": "1"})

    async def up(_request: web.Request) -> web.Response:
        await asyncio.sleep(0.02)
        return answer()

    store = stores()
    store.submit(
        [parse_task(t) for t in tasks(20, retry={"max_retries": 2, "base_delay_ms": 50})],
        batch_id="b",
    )
    with chat_server(down) as prim, chat_server(up) as fb:
        # The breaker would open after many failures: not here, the pauses alone.
        cfg = settings(
            [{"name": "prim", "base_url": prim, "fallback": "fb"}, {"name": "fb", "base_url": fb}],
            flow={"breaker_consecutive": 1000, "breaker_min_calls": 1000},
            concurrency=4,
        )
        asyncio.run(run_workers([Worker(stores(), cfg, burst=True)], timeout=120))
    assert status_counts(store) == {"SUCCEEDED": 20}
    again = rows(
        store,
        "SELECT task_pk, COUNT(*) AS n FROM task_attempt WHERE endpoint = "
        "'prim' GROUP BY task_pk HAVING COUNT(*) > 1",
    )
    assert again == [], again
