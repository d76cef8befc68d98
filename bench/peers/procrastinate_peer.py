"""Procrastinate (PostgreSQL): one ``procrastinate worker`` with ``--concurrency`` = the
budget of calls in flight, LISTEN/NOTIFY on (its default) and its default polling
interval, retries by a retry strategy of its own kind (a ``BaseRetryStrategy``:
``RetryStrategy`` counts in whole seconds, and the policy here starts at 100 ms), the
answer stored by the task in a results table (Procrastinate keeps no return value). Jobs
are deferred with ``batch_defer_async``, one statement for all.

Run by bench/peers/run.py in bench/peers/.venvs/procrastinate
(requirements/procrastinate.txt)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
from _common import (
    MAX_RETRIES,
    TIMEOUT_S,
    Peer,
    backoff_s,
    body_bytes,
    content_of,
    headers,
    main,
)
from _pg import RESULTS_DDL, STORE_SQL, database_url
from procrastinate import App, BaseRetryStrategy, JobContext, PsycopgConnector, RetryDecision
from procrastinate.jobs import Job
from psycopg_pool import AsyncConnectionPool

DB = "lockgate_peers_procrastinate"
CONCURRENCY = int(os.environ.get("PEERS_CONCURRENCY", "512"))
URL = os.environ.get("PEERS_SIM_URL", "")
DSN = database_url(os.environ.get("PEERS_PG", "postgresql://postgres@127.0.0.1:5432/test"), DB)
STORE = STORE_SQL.replace("$1", "%s").replace("$2", "%s")

app = App(connector=PsycopgConnector(conninfo=DSN))


class Backoff(BaseRetryStrategy):
    """Up to 3 retries, 100 ms doubling, capped at 2 s."""

    def get_retry_decision(self, *, exception: BaseException,
                           job: Job) -> RetryDecision | None:
        if job.attempts >= MAX_RETRIES:
            return None
        return RetryDecision(retry_in={"seconds": backoff_s(job.attempts + 1)})


_resources: dict[str, Any] = {}
_lock = asyncio.Lock()


async def resources() -> tuple[aiohttp.ClientSession, AsyncConnectionPool]:
    async with _lock:
        if not _resources:
            _resources["http"] = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=CONCURRENCY),
                timeout=aiohttp.ClientTimeout(total=TIMEOUT_S))
            pool = AsyncConnectionPool(DSN, min_size=1, max_size=10, open=False)
            await pool.open()
            _resources["pool"] = pool
    return _resources["http"], _resources["pool"]


@app.task(name="label", retry=Backoff(), pass_context=True)
async def label(context: JobContext, i: int, tid: str) -> None:
    http, pool = await resources()
    assert context.job is not None
    async with http.post(URL, data=body_bytes(i),
                         headers=headers(tid, context.job.attempts + 1)) as resp:
        content = content_of(resp.status, await resp.read())
    async with pool.connection() as conn:
        await conn.execute(STORE, (tid, content))


class ProcrastinatePeer(Peer):
    conn: psycopg.AsyncConnection[Any]

    async def setup(self) -> None:
        self.name = "procrastinate"
        self.settings = {"worker": f"procrastinate worker --concurrency {CONCURRENCY} "
                                   "(LISTEN/NOTIFY, polling every 5 s: the defaults)",
                         "retry": "a BaseRetryStrategy: 3 retries, 100 ms doubling, cap 2 s",
                         "submit": "batch_defer_async", "results": "peer_result table"}
        async with await psycopg.AsyncConnection.connect(self.args.pg, autocommit=True) as a:
            await a.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
            await a.execute(f"CREATE DATABASE {DB}")
        self.conn = await psycopg.AsyncConnection.connect(DSN, autocommit=True)
        await self.conn.execute(RESULTS_DDL)
        await app.open_async()
        await app.schema_manager.apply_schema_async()

    def worker_commands(self) -> list[list[str]]:
        return [[str(Path(sys.executable).parent / "procrastinate"),
                 "--app=procrastinate_peer.app", "worker", f"--concurrency={CONCURRENCY}"]]

    async def submit(self, indexes: Sequence[int], ids: Sequence[str]) -> None:
        await label.batch_defer_async(*({"i": i, "tid": t}
                                        for i, t in zip(indexes, ids, strict=True)))

    async def finished(self, ids: Sequence[str]) -> int:
        cur = await self.conn.execute("SELECT count(*) FROM peer_result")
        row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def results(self, ids: Sequence[str]) -> dict[str, str]:
        cur = await self.conn.execute("SELECT task_id, content FROM peer_result")
        return {tid: content for tid, content in await cur.fetchall()}

    async def clear(self) -> None:
        await self.conn.execute("TRUNCATE peer_result")

    async def teardown(self) -> None:
        await app.close_async()
        await self.conn.close()
        async with await psycopg.AsyncConnection.connect(self.args.pg, autocommit=True) as a:
            await a.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")


if __name__ == "__main__":
    main(ProcrastinatePeer)
