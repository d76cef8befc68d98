"""Review 6 of the provider connection and the quota flow: a request on a pooled
keep-alive connection the server closed as it was written is sent again on a new one
(no attempt spent, the endpoint not counted as failing); an endpoint out of quota for
good, with a token limit and no fallback, ends its tasks within their retries (every
waiting call goes at the end of a pause, not four). Assertions are counts, never
timings."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from helpers import chat_server
from lockgate.providers import openai
from lockgate.providers.base import Completion, CompletionRequest, ProviderError
from lockgate.providers.openai import OpenAICompatible
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store
from lockgate.worker import Worker

from .support import rows, run_workers, settings, status_counts, tasks

#: The server's keep-alive: an idle connection is closed after 50 ms.
KEEPALIVE_S = 0.05


@contextlib.contextmanager
def keepalive_server(served: list[str]) -> Iterator[str]:
    """An OpenAI-compatible endpoint that closes a keep-alive connection idle for
    :data:`KEEPALIVE_S`; records each request's last message and yields its base URL."""
    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        served.append(body["messages"][-1]["content"])
        return web.json_response({
            "model": "m", "usage": {"prompt_tokens": 40, "completion_tokens": 5},
            "choices": [{"message": {"role": "assistant",
                                     "content": json.dumps({"label": "delivery"})},
                         "finish_reason": "stop"}]})

    with chat_server(chat, keepalive_s=KEEPALIVE_S) as url:
        yield url


@pytest.fixture
def closed_as_written(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every request on a pooled connection meets it closed by the server as it is
    written (a race that otherwise comes a few times in a few hundred calls); yields
    the list of those requests (when each took its connection)."""
    reused: list[float] = []

    async def busy_on_reuse(_session: aiohttp.ClientSession, _ctx: SimpleNamespace,
                            _params: Any) -> None:
        # The loop busy (parsing answers, say) just as the request takes a pooled
        # connection: the server's keep-alive ends meanwhile, and the loop learns of
        # it only as the request is written ("Cannot write to closing transport").
        reused.append(time.monotonic())
        time.sleep(6 * KEEPALIVE_S)
        await asyncio.sleep(0)

    trace = aiohttp.TraceConfig()
    trace.on_connection_reuseconn.append(openai._on_reuse)
    trace.on_connection_reuseconn.append(busy_on_reuse)
    trace.freeze()
    monkeypatch.setattr(openai, "_REUSE_TRACE", trace)
    return reused


def test_a_request_on_a_connection_closed_as_it_was_written_is_sent_again(
        closed_as_written: list[float]) -> None:
    """aiohttp raises ClientOSError "Can not write request body" (no errno; its cause
    "Cannot write to closing transport"): it was taken for an endpoint that could not
    be reached (``connection_error``, an attempt spent). The request never reached the
    server: it is sent again on a new connection, as a stale connection's."""
    served: list[str] = []

    async def main(url: str) -> list[Completion | ProviderError]:
        prov = OpenAICompatible("ka", url)
        out: list[Completion | ProviderError] = []
        try:
            for i in range(8):
                try:
                    out.append(await prov.complete(CompletionRequest(
                        [{"role": "user", "content": f"call {i}"}], "m", {}, 10.0)))
                except ProviderError as exc:
                    out.append(exc)
        finally:
            await prov.close()
        return out

    with keepalive_server(served) as url:
        out = asyncio.run(main(url))
    failed = [str(o) for o in out if isinstance(o, ProviderError)]
    assert not failed, failed
    assert any(isinstance(o, Completion) and o.resent for o in out), \
        "no request met a pooled connection closed as it was written"
    assert served == [f"call {i}" for i in range(8)], "a call reached the server twice"


def submit(store: Store, specs: list[dict[str, Any]], batch: str) -> None:
    store.submit([parse_task(t) for t in specs], batch_id=batch,
                 pool_of=lambda _s: "default")


def test_tasks_spend_no_attempt_on_a_connection_closed_as_it_was_written(
        sqlite_store: Store, closed_as_written: list[float]) -> None:
    """With ``max_retries = 0``, tasks whose request met such a connection ended DEAD
    ``connection_error`` and the endpoint counted as failing; now each succeeds with
    its one attempt."""
    submit(sqlite_store, tasks(12, retry={"max_retries": 0}), "b")
    served: list[str] = []
    with keepalive_server(served) as url:
        cfg = settings([{"name": "ka", "base_url": url}], concurrency=1)
        w = Worker(sqlite_store, cfg, burst=True)
        asyncio.run(run_workers([w], timeout=60))
    assert status_counts(sqlite_store) == {"SUCCEEDED": 12}
    attempts = rows(sqlite_store, "SELECT outcome, error_class FROM task_attempt")
    assert len(attempts) == 12 and all(a["error_class"] is None for a in attempts), attempts
    assert len(served) == 12, "a request reached the server twice, or not at all"
    assert closed_as_written, "no request took a pooled connection"


def test_a_quota_out_for_good_ends_the_tasks_of_a_token_limited_endpoint(
        sqlite_store: Store, simulator: SimulatorProcess,
        caplog: pytest.LogCaptureFixture) -> None:
    """An endpoint with a token limit teaches a task type's token estimate only by an
    answer's usage; a 429 insufficient_quota has none, so only the cold start's four
    calls went at the end of each quota pause: 40 tasks of three attempts took 30
    pauses. A refusal holds the waiting calls no longer: all go when a pause ends."""
    caplog.set_level(logging.INFO, logger="lockgate.flow")
    simulator.configure(quota_exhausted=True)
    submit(sqlite_store, tasks(40, retry={"max_retries": 2, "base_delay_ms": 10,
                                          "jitter": 0.0}), "b")
    cfg = settings([{"name": "sim", "base_url": simulator.url, "rpm": 100_000,
                     "tpm": 100_000_000}],
                   flow={"quota_pause_s": 0.3}, concurrency=64, shutdown_grace_s=1)
    w = Worker(sqlite_store, cfg, burst=True)
    asyncio.run(run_workers([w], timeout=120))

    assert status_counts(sqlite_store) == {"DEAD": 40}
    attempts = rows(sqlite_store, "SELECT error_class, COUNT(*) AS n FROM task_attempt "
                                  "GROUP BY error_class")
    assert attempts == [{"error_class": "quota_exhausted", "n": 120}], attempts
    assert simulator.stats()["requests"] == 120
    pauses = sum(1 for r in caplog.records if "paused for" in r.getMessage()
                 and "(quota)" in r.getMessage())
    # three attempts: about a pause each (30 before, four calls a pause)
    assert 1 <= pauses <= 10, f"{pauses} quota pauses for 120 calls"
