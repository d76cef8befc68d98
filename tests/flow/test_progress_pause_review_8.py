"""The progress line of ``lockgate run`` names a pause that holds an endpoint (review 8):
with the breaker open after timeouts and the endpoint paused for minutes by a 429
(``x-ratelimit-remaining-requests: 0``, reset ``6m0s``), the line said "endpoint mock
down for 10 s (timeout), next try in 0 s" while nothing was sent and ``lockgate status``
showed the pause. The line is computed from the workers' rows as a real worker wrote
them (:func:`lockgate.flow.status.trouble`)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

from aiohttp import web

from helpers import chat_server
from lockgate.flow.status import trouble
from lockgate.spec import parse_task
from lockgate.store import Store
from lockgate.worker import Worker

from .support import run_workers, settings, tasks


def test_the_progress_line_names_a_pause_that_holds_an_endpoint_whose_breaker_is_open(
        stores: Callable[[], Store]) -> None:
    """Nine calls time out (the breaker opens), one is refused with nothing remaining
    for six minutes (the endpoint pauses). Once the breaker's wait is over, the pause
    still holds every call: the line names the pause and its time left, never "next
    try in 0 s"."""
    async def chat(request: web.Request) -> web.Response:
        if "limit" in (await request.json())["messages"][-1]["content"]:
            return web.json_response(
                {"error": {"message": "Rate limit reached for requests",
                           "type": "requests", "code": "rate_limit_exceeded"}}, status=429,
                headers={"x-ratelimit-remaining-requests": "0",
                         "x-ratelimit-reset-requests": "6m0s"})
        await asyncio.sleep(2.0)  # past the task's timeout
        return web.json_response({})

    store = stores()
    retry = {"max_retries": 3, "base_delay_ms": 50}
    specs = tasks(9, "slow", retry=retry, model={"timeout_ms": 200}) + \
        [dict(t, input_data={"text": "limit"}) for t in tasks(1, "limit", retry=retry)]
    store.submit([parse_task(t) for t in specs], batch_id="b")
    seen: dict[str, Any] = {}

    def held() -> bool:
        workers = store.status().workers
        for w in workers:
            d = w.endpoints.get("ep") or {}
            if d.get("breaker") == "open" and d.get("retry_in_s") == 0 \
                    and (d.get("paused_ms") or 0) > 0:
                seen["workers"] = [{"endpoints": w.endpoints} for w in workers]
                seen["detail"] = d
                return True
        return False

    async def until() -> bool:
        return await asyncio.to_thread(held)

    with chat_server(chat) as url:
        cfg = settings([{"name": "ep", "base_url": url}],
                       flow={"breaker_consecutive": 3, "breaker_open_s": 0.3,
                             "breaker_max_open_s": 0.3}, concurrency=16)
        asyncio.run(run_workers([Worker(stores(), cfg)], until=until, timeout=120))
    d = seen["detail"]
    assert d["pause_reason"] == "exhausted" and d["paused_ms"] > 60_000, d
    (line,) = trouble(seen["workers"])
    assert "next try in 0 s" not in line
    m = re.fullmatch(r"endpoint ep down for \d+ s \(timeout\), "
                     r"paused \(exhausted\) for (\d+) s more", line)
    assert m, line
    assert int(m.group(1)) == -(-d["paused_ms"] // 1000)  # its time left, rounded up


def test_the_progress_line_names_the_pause_in_every_trouble_it_comes_with() -> None:
    """A pause in force with a half-open breaker or a run of failures is named too (the
    calls wait for it, not for the probe); a breaker whose wait ends after the pause
    still says when it tries again."""
    def line(**d: Any) -> list[str]:
        return trouble([{"endpoints": {"ep": {"failing_s": 12.0,
                                              "last_error": "timeout: no answer", **d}}}])

    assert line(breaker="half_open", paused_ms=30_000, pause_reason="rate_limited") == [
        "endpoint ep down for 12 s (timeout), paused (rate_limited) for 30 s more"]
    assert line(breaker="closed", paused_ms=7_500, pause_reason="quota") == [
        "endpoint ep failing for 12 s (timeout), paused (quota) for 8 s more"]
    assert line(breaker="open", retry_in_s=4.0, paused_ms=1_000,
                pause_reason="unavailable") == [
        "endpoint ep down for 12 s (timeout), paused (unavailable) for 1 s more, "
        "next try in 4 s"]
    assert line(breaker="open", retry_in_s=0.0, paused_ms=400, pause_reason="exhausted") == [
        "endpoint ep down for 12 s (timeout), paused (exhausted) for 1 s more"]
    # without a pause, as before
    assert line(breaker="open", retry_in_s=3.6) == [
        "endpoint ep down for 12 s (timeout), next try in 4 s"]
    assert line(breaker="half_open") == ["endpoint ep down for 12 s (timeout), trying it again"]
