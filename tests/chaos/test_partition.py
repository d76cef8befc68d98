"""A worker in a network namespace of its own is cut off from the database (every packet
on the link lost silently, no reset) for longer than its lease, while its model calls
still answer, then reconnected. The cut-off worker notices: its database calls time out
(``LOCKGATE_DB_TIMEOUT``) instead of waiting on TCP's retransmissions. Another worker
takes over the expired leases; the cut-off worker's late results are refused by fencing
(written as ``discarded`` attempts), no task has two results, and the cut-off worker goes
on by itself once the link is back."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from engine.support import (
    WorkerPool,
    expected_label,
    rows,
    scalar,
    status_counts,
    tasks,
    text_for,
    wait_for,
)
from helpers import clean_env
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store

from .conftest import Scale
from .netns import Namespace, make_namespace
from .servers import PrivateServer, private_server

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

LEASE_S = 3.0
#: The cut-off worker's LOCKGATE_DB_TIMEOUT: shorter than the cut (which outlasts the
#: lease), so the test sees the worker give its silent connections up.
DB_TIMEOUT = "1s"
TASKS = 600
MORE = 300


@pytest.fixture
def namespace() -> Iterator[Namespace]:
    ns = make_namespace()
    try:
        yield ns
    finally:
        ns.close()


@pytest.fixture
def server(namespace: Namespace) -> Iterator[PrivateServer]:
    """A private PostgreSQL listening on the database link's host-side address."""
    pg = private_server("postgresql", host=namespace.db_host)
    try:
        yield pg
    finally:
        pg.close()


@pytest.fixture
def store(server: PrivateServer) -> Iterator[Store]:
    """The test's own store on the private server (closed however the test ends, so no
    connection to a server that is gone outlives it)."""
    s = Store(server.url, pool_size=1)
    try:
        yield s
    finally:
        s.close()


def test_a_worker_cut_off_past_its_lease_is_fenced_and_recovers(
        namespace: Namespace, server: PrivateServer, store: Store, tmp_path: Path,
        scale: Scale) -> None:
    sim = SimulatorProcess({"latency": {"kind": "fixed", "mean_ms": 40}},
                           host=namespace.call_host).start()
    log = tmp_path / "cut-off-worker.log"
    (tmp_path / "workers").mkdir()
    others = WorkerPool(server.url, sim.url, tmp_path / "workers")
    cut_off: subprocess.Popen[bytes] | None = None
    try:
        store.submit([parse_task(t) for t in tasks(TASKS)], batch_id="partition")
        with log.open("wb") as out:
            cut_off = subprocess.Popen(
                namespace.command(sys.executable, "-m", "lockgate.cli", "worker", "--burst",
                                  "--concurrency", "16", "--lease", str(LEASE_S),
                                  "--log-level", "INFO"),
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=tmp_path, env=clean_env(LOCKGATE_DATABASE_URL=server.url,
                                            LOCKGATE_BASE_URL=sim.url,
                                            LOCKGATE_DB_TIMEOUT=DB_TIMEOUT))
        wid = wait_for(lambda: rows(store, "SELECT id FROM worker WHERE pid = :p",
                                    p=cut_off.pid), "the worker's row")[0]["id"]
        wait_for(lambda: scalar(store, "SELECT COUNT(*) FROM task_attempt WHERE "
                                       "worker_id = :w", w=wid) >= 100,
                 "the worker to land 100 results")
        namespace.cut()
        cut_at = time.monotonic()
        logged = log.stat().st_size
        held = {r["task_id"] for r in rows(
            store, "SELECT task_id FROM task WHERE leased_by = :w AND status = 'PENDING'",
            w=wid)}
        assert held, "the worker held no lease when it was cut off"
        # Past the lease: another worker finishes the batch, the held tasks included.
        other = others.start(concurrency=8, lease=LEASE_S)
        assert other.wait(120) == 0, others.logs()
        assert status_counts(store) == {"SUCCEEDED": TASKS}
        assert time.monotonic() - cut_at >= LEASE_S
        assert cut_off.poll() is None, "the cut-off worker exited"
        # It noticed the cut: its calls on the silent connections failed (timed out)
        # while the link was still cut, rather than hanging on TCP's back-off.
        wait_for(lambda: b"cannot reach the database" in log.read_bytes()[logged:],
                 "the cut-off worker's database calls to time out", timeout=60)
        # More work, then the link comes back: the cut-off worker alone must do it.
        store.submit([parse_task(t) for t in tasks(MORE, prefix="more")], batch_id="more")
        last = int(scalar(store, "SELECT MAX(id) FROM task_attempt"))
        time.sleep(max(0.0, scale.cut_s - (time.monotonic() - cut_at)))
        namespace.join()
        joined_at = time.monotonic()
        try:
            wait_for(lambda: scalar(store, "SELECT COUNT(*) FROM task_attempt WHERE "
                                           "worker_id = :w AND outcome = 'discarded'", w=wid),
                     "the cut-off worker's late results to be refused", timeout=120)
            wait_for(lambda: scalar(store, "SELECT COUNT(*) FROM task_attempt WHERE "
                                           "worker_id = :w AND outcome = 'succeeded' AND "
                                           "id > :a", w=wid, a=last),
                     "the cut-off worker to land new results by itself", timeout=60)
        except AssertionError:
            print(status_counts(store), log.read_text()[-5000:])
            raise
        recovered_s = time.monotonic() - joined_at
        assert cut_off.wait(300) == 0, log.read_text()[-3000:]
        assert scalar(store, "SELECT COUNT(*) FROM task_attempt WHERE worker_id = :w AND "
                             "outcome = 'succeeded' AND id > :a", w=wid, a=last) == MORE
    finally:
        if cut_off is not None and cut_off.poll() is None:
            cut_off.kill()
            cut_off.wait()
        others.close()
        sim.stop()

    assert status_counts(store) == {"SUCCEEDED": TASKS + MORE}
    for r in rows(store, "SELECT task_id, result FROM task"):
        i = int(r["task_id"].split("-")[1])
        assert orjson.loads(r["result"]) == {"label": expected_label(text_for(i))}
    applied = rows(store, "SELECT task_pk, COUNT(*) AS k FROM task_attempt WHERE outcome = "
                          "'succeeded' GROUP BY task_pk HAVING COUNT(*) <> 1")
    assert applied == [], "a task has two results"
    refused = {r["task_id"] for r in rows(
        store, "SELECT t.task_id FROM task_attempt a JOIN task t ON t.id = a.task_pk "
               "WHERE a.worker_id = :w AND a.outcome = 'discarded'", w=wid)}
    assert refused <= held, "a result was refused for a task the worker did not hold"
    won_by_other = {r["task_id"] for r in rows(
        store, "SELECT t.task_id FROM task_attempt a JOIN task t ON t.id = a.task_pk "
               "WHERE a.worker_id <> :w AND a.outcome = 'succeeded'", w=wid)}
    assert refused <= won_by_other
    print(f"partition: cut off holding {len(held)} leases for "
          f"{joined_at - cut_at:.1f}s (lease {LEASE_S:g}s); {len(refused)} late results "
          f"refused by fencing; new results {recovered_s:.1f}s after the link came back")
