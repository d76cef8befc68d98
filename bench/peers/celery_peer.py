"""Celery: one worker with the threads pool and ``-c`` = the budget of calls in flight,
RabbitMQ as the broker (Celery's default and recommended one), results in Redis.

Why threads and not gevent, the pool Celery's documentation names for I/O-bound tasks
(eventlet, the other one, is no longer developed): on this machine a gevent worker
consuming from RabbitMQ took one message every ~100 ms (about 10 tasks/s, whatever
the prefetch, acks or remote-control settings), and with Redis as the broker it
reached about 200 tasks/s; the threads pool, a real pool of 512 threads each blocking on
its own HTTP call, did better than both.

``task_acks_late`` so that a task is acknowledged once it is done (at least once, like
the others, instead of Celery's default of acknowledging on receipt). Retries with the
task's own ``self.retry(countdown=...)`` and ``max_retries=3``. Tasks are sent with
``apply_async`` on one producer.

Run by bench/peers/run.py in bench/peers/.venvs/celery (requirements/celery.txt)."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import requests
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
from celery import Celery
from requests.adapters import HTTPAdapter

QUEUE = "lockgate-peers-celery"
CONCURRENCY = int(os.environ.get("PEERS_CONCURRENCY", "512"))
URL = os.environ.get("PEERS_SIM_URL", "")
META = "celery-task-meta-"

app = Celery("lockgate_peers",
             broker=os.environ.get("PEERS_AMQP", "amqp://guest:guest@127.0.0.1:5672//"),
             backend=os.environ.get("PEERS_REDIS", "redis://127.0.0.1:6379/12"))
app.conf.update(
    task_default_queue=QUEUE,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_enable_remote_control=False,  # no pidbox queues left behind on the broker
    result_expires=3600,
    broker_connection_retry_on_startup=True,
)

_session: requests.Session | None = None
_session_lock = threading.Lock()


def session() -> requests.Session:
    """One keep-alive session per worker process, its connection pool as large as the
    pool of threads."""
    global _session
    with _session_lock:
        if _session is None:
            s = requests.Session()
            s.mount("http://", HTTPAdapter(pool_connections=1, pool_maxsize=CONCURRENCY))
            _session = s
        return _session


@app.task(bind=True, name="label", max_retries=MAX_RETRIES)
def label(self: Any, i: int) -> str:
    attempt = self.request.retries + 1
    try:
        resp = session().post(URL, data=body_bytes(i), headers=headers(self.request.id, attempt),
                              timeout=TIMEOUT_S)
        return content_of(resp.status_code, resp.content)
    except (CallFailed, requests.RequestException) as exc:
        raise self.retry(exc=exc, countdown=backoff_s(attempt)) from exc


class CeleryPeer(Peer):
    async def setup(self) -> None:
        self.name = "celery"
        self.settings = {"worker": f"celery worker -P threads -c {CONCURRENCY} "
                                   "--without-mingle --without-gossip (prefetch multiplier "
                                   "4, the default)",
                         "acks": "task_acks_late=True", "broker": self.args.amqp,
                         "results": f"Redis ({self.args.redis})",
                         "retry": "self.retry(countdown=backoff), max_retries=3"}
        self.redis = app.backend.client
        if self.redis.dbsize():
            raise SystemExit(f"Redis database {self.args.redis} is not empty: pick another "
                             "with --redis-db-celery")
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(QUEUE)  # a queue left by an aborted run

    def worker_commands(self) -> list[list[str]]:
        return [[str(Path(sys.executable).parent / "celery"), "-A", "celery_peer", "worker",
                 "-P", "threads", "-c", str(CONCURRENCY), "-Q", QUEUE, "--without-mingle",
                 "--without-gossip", "-l", "WARNING"]]

    async def submit(self, indexes: Sequence[int], ids: Sequence[str]) -> None:
        with app.producer_or_acquire() as producer:
            for i, tid in zip(indexes, ids, strict=True):
                label.apply_async((i,), task_id=tid, producer=producer)

    async def finished(self, ids: Sequence[str]) -> int:
        keys = [META + t for t in ids]
        n = int(self.redis.exists(*keys))
        if n < len(ids):
            return n
        # a retried task has a RETRY result until it succeeds: count finished states only
        return sum(1 for raw in self.redis.mget(keys)
                   if raw is not None and app.backend.decode(raw)["status"] in
                   ("SUCCESS", "FAILURE"))

    async def results(self, ids: Sequence[str]) -> dict[str, str]:
        out = {}
        for tid, raw in zip(ids, self.redis.mget([META + t for t in ids]), strict=True):
            if raw is not None:
                meta = app.backend.decode(raw)
                if meta["status"] == "SUCCESS":
                    out[tid] = meta["result"]
        return out

    def _delete(self) -> None:
        keys = list(self.redis.scan_iter(match=META + "*", count=1000))
        for k in range(0, len(keys), 1000):
            self.redis.delete(*keys[k:k + 1000])

    async def clear(self) -> None:
        self._delete()

    async def teardown(self) -> None:
        self._delete()
        with app.connection_for_write() as conn:
            conn.default_channel.queue_delete(QUEUE)
            conn.default_channel.exchange_delete(QUEUE)


if __name__ == "__main__":
    main(CeleryPeer)
