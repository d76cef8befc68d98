"""arq (Redis): one ``arq`` worker with ``max_jobs`` = the budget of calls in flight,
retries by raising ``arq.Retry(defer=...)`` with ``max_tries`` = 1 + 3, results kept by
arq in Redis (``keep_result``). Jobs are enqueued with ``enqueue_job`` (arq has no bulk
enqueue), many at once on the pool.

Run by bench/peers/run.py in bench/peers/.venvs/arq (requirements/arq.txt)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
from _common import (
    MAX_RETRIES,
    TIMEOUT_S,
    CallFailed,
    Peer,
    backoff_s,
    body_bytes,
    content_of,
    headers,
    main,
)
from arq import Retry, create_pool
from arq.connections import ArqRedis, RedisSettings
from arq.jobs import deserialize_result
from arq.worker import func

QUEUE = "lockgate-peers:arq"
REDIS = RedisSettings.from_dsn(os.environ.get("PEERS_REDIS", "redis://127.0.0.1:6379/11"))
CONCURRENCY = int(os.environ.get("PEERS_CONCURRENCY", "512"))
URL = os.environ.get("PEERS_SIM_URL", "")
ENQUEUE_AT_ONCE = 200  # enqueue_job calls in flight while submitting


async def startup(ctx: dict[str, Any]) -> None:
    ctx["http"] = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=CONCURRENCY),
        timeout=aiohttp.ClientTimeout(total=TIMEOUT_S))


async def shutdown(ctx: dict[str, Any]) -> None:
    await ctx["http"].close()


async def label(ctx: dict[str, Any], i: int) -> str:
    tid, attempt = ctx["job_id"], ctx["job_try"]
    try:
        async with ctx["http"].post(URL, data=body_bytes(i),
                                    headers=headers(tid, attempt)) as resp:
            return content_of(resp.status, await resp.read())
    except (CallFailed, aiohttp.ClientError, TimeoutError) as exc:
        if attempt > MAX_RETRIES:
            raise
        raise Retry(defer=backoff_s(attempt)) from exc


class WorkerSettings:
    functions: ClassVar[list[Any]] = [func(label, max_tries=MAX_RETRIES + 1)]
    on_startup = startup
    on_shutdown = shutdown
    redis_settings = REDIS
    queue_name = QUEUE
    max_jobs = CONCURRENCY
    keep_result = 3600
    # poll_delay (0.5 s) and queue_read_limit (5 x max_jobs) stay at arq's defaults


class ArqPeer(Peer):
    pool: ArqRedis

    async def setup(self) -> None:
        self.name = "arq"
        self.settings = {"worker": f"arq worker, max_jobs={CONCURRENCY}, poll_delay 0.5 s "
                                   "(default)", "retry": "Retry(defer=...), max_tries=4",
                         "results": "arq's own (Redis)", "redis": self.args.redis}
        self.pool = await create_pool(REDIS, default_queue_name=QUEUE)
        if await self.pool.dbsize():
            raise SystemExit(f"Redis database {self.args.redis} is not empty: pick another "
                             "with --redis-db-arq")

    def worker_commands(self) -> list[list[str]]:
        return [[str(Path(sys.executable).parent / "arq"), "arq_peer.WorkerSettings"]]

    async def submit(self, indexes: Sequence[int], ids: Sequence[str]) -> None:
        jobs = list(zip(indexes, ids, strict=True))
        for k in range(0, len(jobs), ENQUEUE_AT_ONCE):
            await asyncio.gather(*(self.pool.enqueue_job("label", i, _job_id=tid)
                                   for i, tid in jobs[k:k + ENQUEUE_AT_ONCE]))

    async def finished(self, ids: Sequence[str]) -> int:
        return int(await self.pool.exists(*(f"arq:result:{t}" for t in ids)))

    async def results(self, ids: Sequence[str]) -> dict[str, str]:
        raw = await self.pool.mget([f"arq:result:{t}" for t in ids])
        out = {}
        for tid, value in zip(ids, raw, strict=True):
            if value is not None:
                res = deserialize_result(value)
                if res.success:
                    out[tid] = res.result
        return out

    async def _delete(self) -> None:
        keys = [k async for k in self.pool.scan_iter(match="arq:*", count=1000)]
        for k in range(0, len(keys), 1000):
            await self.pool.delete(*keys[k:k + 1000])

    async def clear(self) -> None:
        await self._delete()

    async def teardown(self) -> None:
        await self._delete()
        await self.pool.aclose()


if __name__ == "__main__":
    main(ArqPeer)
