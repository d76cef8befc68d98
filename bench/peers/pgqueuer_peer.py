"""PgQueuer (PostgreSQL): one worker run as ``pgq run`` runs it (``pgqueuer.run``, on
uvloop: the ``pgq run`` command of 1.6.0 fails at start with this typer, on its log-level
option), with ``max_concurrent_tasks`` = the budget of calls in flight and
``batch_size=100`` (jobs taken per dequeue; the budget must be at least twice the
batch); retries by its ``DatabaseRetryEntrypointExecutor`` (``max_attempts=3`` retries,
back-off from 100 ms doubling, capped at 2 s); the answer stored by the task in a
results table (PgQueuer keeps no return value). Jobs are enqueued in one bulk
``Queries.enqueue`` call (lists of entrypoints, payloads and priorities), as PgQueuer
documents for many jobs.

Run by bench/peers/run.py in bench/peers/.venvs/pgqueuer (requirements/pgqueuer.txt)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

import aiohttp
import asyncpg
import pgqueuer
import uvloop
from _common import (
    BASE_DELAY_S,
    CAP_S,
    MAX_RETRIES,
    TIMEOUT_S,
    Peer,
    body_bytes,
    content_of,
    headers,
    main,
)
from _pg import RESULTS_DDL, STORE_SQL, database_url
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.executors import DatabaseRetryEntrypointExecutor, EntrypointExecutorParameters
from pgqueuer.models import Job
from pgqueuer.queries import Queries

DB = "lockgate_peers_pgqueuer"
CONCURRENCY = int(os.environ.get("PEERS_CONCURRENCY", "512"))
BATCH = 100
URL = os.environ.get("PEERS_SIM_URL", "")
DSN = database_url(os.environ.get("PEERS_PG", "postgresql://postgres@127.0.0.1:5432/test"), DB)


def retrying(params: EntrypointExecutorParameters) -> DatabaseRetryEntrypointExecutor:
    return DatabaseRetryEntrypointExecutor(
        parameters=params, max_attempts=MAX_RETRIES,
        initial_delay=timedelta(seconds=BASE_DELAY_S), max_delay=timedelta(seconds=CAP_S))


@asynccontextmanager
async def create_pgqueuer() -> AsyncIterator[PgQueuer]:
    """The factory ``pgq run pgqueuer_peer:create_pgqueuer`` starts."""
    conn = await asyncpg.connect(DSN)
    results = await asyncpg.create_pool(DSN, min_size=1, max_size=10)
    http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY),
                                 timeout=aiohttp.ClientTimeout(total=TIMEOUT_S))
    pgq = PgQueuer(AsyncpgDriver(conn))

    @pgq.entrypoint("label", executor_factory=retrying)
    async def label(job: Job) -> None:
        assert job.payload is not None
        doc = json.loads(job.payload)
        async with http.post(URL, data=body_bytes(doc["i"]),
                             headers=headers(doc["id"], job.attempts + 1)) as resp:
            content = content_of(resp.status, await resp.read())
        await results.execute(STORE_SQL, doc["id"], content)

    try:
        yield pgq
    finally:
        await http.close()
        await results.close()
        await conn.close()


class PgQueuerPeer(Peer):
    conn: asyncpg.Connection

    async def setup(self) -> None:
        self.name = "pgqueuer"
        self.settings = {"worker": f"pgqueuer.run (as pgq run) batch_size={BATCH}, "
                                   f"max_concurrent_tasks={CONCURRENCY}",
                         "retry": "DatabaseRetryEntrypointExecutor(max_attempts=3, "
                                  "initial_delay=100 ms, max_delay=2 s)",
                         "submit": "one bulk Queries.enqueue", "results": "peer_result table"}
        admin = await asyncpg.connect(self.args.pg)
        await admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        await admin.execute(f"CREATE DATABASE {DB}")
        await admin.close()
        self.conn = await asyncpg.connect(DSN)
        await Queries(AsyncpgDriver(self.conn)).install()
        await self.conn.execute(RESULTS_DDL)
        self.queries = Queries(AsyncpgDriver(self.conn))

    def worker_commands(self) -> list[list[str]]:
        return [[sys.executable, str(Path(__file__).resolve()), "--worker"]]

    async def submit(self, indexes: Sequence[int], ids: Sequence[str]) -> None:
        n = len(ids)
        await self.queries.enqueue(
            ["label"] * n, [json.dumps({"i": i, "id": t}).encode()
                            for i, t in zip(indexes, ids, strict=True)], [0] * n)

    async def finished(self, ids: Sequence[str]) -> int:
        return int(await self.conn.fetchval("SELECT count(*) FROM peer_result"))

    async def results(self, ids: Sequence[str]) -> dict[str, str]:
        rows = await self.conn.fetch("SELECT task_id, content FROM peer_result")
        return {r["task_id"]: r["content"] for r in rows}

    async def clear(self) -> None:
        await self.conn.execute("TRUNCATE peer_result")

    async def teardown(self) -> None:
        await self.conn.close()
        admin = await asyncpg.connect(self.args.pg)
        await admin.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
        await admin.close()


def worker() -> None:
    uvloop.run(pgqueuer.run(create_pgqueuer, batch_size=BATCH,
                            max_concurrent_tasks=CONCURRENCY))


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker()
    else:
        main(PgQueuerPeer)
