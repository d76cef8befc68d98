"""Helpers of the flow-control tests: task lines, database reads, in-process workers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from helpers import rows, scalar  # noqa: F401  (re-exported to the tests)
from lockgate.config import Settings
from lockgate.providers.base import Completion, CompletionRequest, Provider, ProviderError
from lockgate.store import Store
from lockgate.worker import Worker, WorkerStats

MODEL = "sim-complaints"
TEMPLATE = (
    {"role": "system", "content": 'Label the text. Reply with JSON like {{"label": "x"}}.\n'
                                  "label: one of refund, delivery, other\n"
                                  "- if the text mentions refund then label = refund\n"
                                  "- if the text mentions parcel then label = delivery\n"
                                  "- otherwise label = other"},
    {"role": "user", "content": "<input>\n{text}\n</input>"},
)


def text_for(i: int) -> str:
    return ("I want a refund for order {i}", "where is my parcel {i}",
            "the colour of item {i} is odd")[i % 3].format(i=i)


def task(task_id: str, text_: str = "where is my parcel", *,
         model: Mapping[str, Any] | None = None, retry: Mapping[str, Any] | None = None,
         **extra: Any) -> dict[str, Any]:
    """One task line with the six meta-fields."""
    return {
        "task_id": task_id,
        "prompt_template": [dict(m) for m in TEMPLATE],
        "input_data": {"text": text_},
        "model_config": {"name": MODEL, "temperature": 0, "timeout_ms": 20_000,
                         **(model or {})},
        "delivery_rule": {"format": "json", "required_keys": ["label"]},
        "retry_policy": {"max_retries": 5, "base_delay_ms": 50, "backoff_factor": 2.0,
                         "jitter": 0.2, **(retry or {})},
        **extra,
    }


def tasks(n: int, prefix: str = "t", **kwargs: Any) -> list[dict[str, Any]]:
    return [task(f"{prefix}-{i:05d}", text_for(i), **kwargs) for i in range(n)]


def status_counts(store: Store, batch: str | None = None) -> dict[str, int]:
    where = "WHERE batch_id = :b " if batch else ""
    return {r["status"]: int(r["n"]) for r in rows(
        store, f"SELECT status, COUNT(*) AS n FROM task {where}GROUP BY status", b=batch)}


def settings(endpoints: Sequence[Mapping[str, Any]], *, flow: Mapping[str, Any] | None = None,
             **worker: Any) -> Settings:
    """Settings with these endpoints, fast flow loops for tests, and worker overrides."""
    return Settings.model_validate({
        "endpoint": [dict(e) for e in endpoints],
        "flow": {"lanes_refresh_s": 0.2, "report_s": 0.2, **(flow or {})},
        "worker": {"concurrency": 64, "heartbeat_s": 0.5, "poll_max_s": 0.1, **worker}})


async def run_workers(workers: Sequence[Worker], *, until: Callable[[], Awaitable[bool]] |
                      None = None, timeout: float = 120.0,
                      tick: Callable[[float], Awaitable[None]] | None = None
                      ) -> list[WorkerStats]:
    """Run workers on this loop until they drain (burst) or ``until()`` holds; ``tick``
    is called about every 50 ms with the elapsed seconds (to sample or to act)."""
    t0 = time.monotonic()
    jobs = [asyncio.create_task(w.run()) for w in workers]
    try:
        while not all(j.done() for j in jobs):
            elapsed = time.monotonic() - t0
            if elapsed > timeout:
                raise AssertionError(f"workers still running after {timeout:g}s")
            if tick is not None:
                await tick(elapsed)
            if until is not None and await until():
                for w in workers:
                    w.request_stop()
                until = None
            await asyncio.sleep(0.05)
        return [j.result() for j in jobs]
    finally:
        for w in workers:
            w.request_stop(hard=True)
        await asyncio.gather(*jobs, return_exceptions=True)


class Recording:
    """A provider wrapper that records each call: when it was sent, when the answer came
    back, the HTTP status and the Retry-After it named (monotonic seconds)."""

    def __init__(self, inner: Provider, log: list[dict[str, Any]], who: str) -> None:
        self.inner = inner
        self.name = inner.name
        self.log = log
        self.who = who

    async def complete(self, request: CompletionRequest) -> Completion:
        sent = time.monotonic()
        entry: dict[str, Any] = {"who": self.who, "sent": sent}
        self.log.append(entry)
        try:
            c = await self.inner.complete(request)
        except ProviderError as exc:
            entry.update(done=time.monotonic(), status=exc.http_status,
                         retry_after_ms=exc.retry_after_ms)
            raise
        entry.update(done=time.monotonic(), status=c.http_status, retry_after_ms=None)
        return c

    async def close(self) -> None:
        await self.inner.close()
