"""The database goes away mid-run and comes back: a private PostgreSQL or MariaDB server
(never the shared ones) is restarted while workers run, once while they wait on row
locks a session holds, once down for a long outage (``--chaos=long``). No worker exits,
each one lands results again within 10 s of the server answering, and every task
SUCCEEDED exactly once with the simulator's answer."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from sqlalchemy import create_engine, text

from engine.support import (
    WorkerPool,
    WorkerProcess,
    expected_label,
    rows,
    scalar,
    status_counts,
    tasks,
    text_for,
    wait_for,
)
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store
from lockgate.store.engine import database_url

from .conftest import Scale
from .servers import PrivateServer

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

WORKERS = 2
#: A worker lands results again within this many seconds of the server answering.
RESUME_S = 10.0


@pytest.fixture
def db(private: PrivateServer) -> Iterator[Store]:
    private.wipe()
    store = Store(private.url, pool_size=1)
    try:
        yield store
    finally:
        store.close()


def _finished(store: Store) -> int:
    return int(scalar(store, "SELECT COUNT(*) FROM task WHERE status <> 'PENDING'"))


def _hold_row_locks(url: str, held: threading.Event, release: threading.Event) -> None:
    """Lock every PENDING task row in one open transaction until ``release`` (or until the
    server dies under it): the workers' write-backs and renewals wait on these locks."""
    engine = create_engine(database_url(url), poolclass=None)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT id FROM task WHERE status = 'PENDING' FOR UPDATE"))
            held.set()
            release.wait(60)
    except Exception:  # the server went away under the lock: what the test wants
        pass
    finally:
        held.set()
        engine.dispose()


def _resumed(store: Store, wids: dict[int, str], after_id: int, answered: float,
             live: list[WorkerProcess]) -> dict[str, float]:
    """Seconds from the server answering to each worker's first new attempt row."""
    seen: dict[str, float] = {}
    deadline = answered + 60
    while len(seen) < len(wids) and time.monotonic() < deadline:
        assert all(p.alive() for p in live), "a worker exited while the database was away"
        for r in rows(store, "SELECT worker_id, MIN(id) AS first FROM task_attempt "
                             "WHERE id > :a GROUP BY worker_id", a=after_id):
            if r["worker_id"] in wids.values() and r["worker_id"] not in seen:
                seen[r["worker_id"]] = time.monotonic() - answered
        if _finished(store) == scalar(store, "SELECT COUNT(*) FROM task"):
            break  # the run ended before every worker landed a result: nothing to wait on
        time.sleep(0.05)
    return seen


def test_workers_ride_out_database_restarts(private: PrivateServer, db: Store,
                                            simulator: SimulatorProcess, scale: Scale,
                                            tmp_path: Path) -> None:
    n = scale.restart_tasks
    simulator.configure(latency={"kind": "fixed", "mean_ms": 30})
    db.submit([parse_task(t) for t in tasks(n)], batch_id="restart")
    (tmp_path / "workers").mkdir()
    pool = WorkerPool(private.url, simulator.url, tmp_path / "workers")
    try:
        live = [pool.start(concurrency=16, lease=10.0) for _ in range(WORKERS)]
        wids = {p.pid: wait_for(lambda: rows(
            db, "SELECT id FROM worker WHERE pid = :p", p=p.pid),  # noqa: B023
            "worker rows")[0]["id"] for p in live}
        report = []
        steps = [("under row locks", 0.0), *(("outage", s) for s in scale.outages)]
        for k, (kind, down_s) in enumerate(steps):
            wait_for(lambda: _finished(db) >= n * (k + 1) / (len(steps) + 2),  # noqa: B023
                     f"progress before the {kind} restart", timeout=120)
            held, release = threading.Event(), threading.Event()
            locker = threading.Thread(target=_hold_row_locks, args=(private.url, held, release))
            if kind == "under row locks":
                locker.start()
                held.wait(30)
                time.sleep(1.0)  # the workers' write-backs now wait on the locks
            before = int(scalar(db, "SELECT COALESCE(MAX(id), 0) FROM task_attempt"))
            db.engine.dispose()
            answered = private.restart(down_s, kill=kind == "outage" and down_s > 5)
            release.set()
            if locker.is_alive() or kind == "under row locks":
                locker.join(30)
            seen = _resumed(db, wids, before, answered, live)
            report.append((kind, down_s, seen))
            remaining = n - _finished(db)
            if remaining > WORKERS * 16 * 2:
                assert set(seen) == set(wids.values()), (kind, seen, pool.logs())
            assert all(s <= RESUME_S for s in seen.values()), (kind, seen)
        for p in live:
            assert p.wait(600) == 0, pool.logs()
    finally:
        pool.close()
    print(f"restarts of {private.backend} ({n} tasks): " + "; ".join(
        f"{kind} down {down:g}s: resumed after " + ", ".join(f"{s:.1f}s" for s in seen.values())
        for kind, down, seen in report))
    assert status_counts(db) == {"SUCCEEDED": n}
    for r in rows(db, "SELECT task_id, result FROM task"):
        i = int(r["task_id"].split("-")[1])
        assert orjson.loads(r["result"]) == {"label": expected_label(text_for(i))}
    won = rows(db, "SELECT task_pk, COUNT(*) AS k FROM task_attempt WHERE outcome = "
                   "'succeeded' GROUP BY task_pk HAVING COUNT(*) > 1")
    assert won == [], "a task has two applied results"
