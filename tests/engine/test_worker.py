"""The worker process: graceful shutdown on SIGTERM (within and beyond the grace period),
burst mode, and its worker row."""

from __future__ import annotations

import signal
import sqlite3
import threading
import time

import pytest

from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store
from lockgate.store.engine import _begin_immediate

from .support import (
    BackgroundWorker,
    WorkerPool,
    rows,
    run_worker,
    scalar,
    status_counts,
    tasks,
    wait_for,
    worker_id_of,
)

N = 10
CONCURRENCY = 4


def in_flight(sim: SimulatorProcess, n: int) -> bool:
    return int(sim.stats()["in_flight"]) >= n


@pytest.mark.slow
def test_sigterm_lets_in_flight_calls_finish_and_exits_cleanly(
        store: Store, simulator: SimulatorProcess, workers: WorkerPool) -> None:
    simulator.configure(latency={"kind": "fixed", "mean_ms": 3000})
    store.submit([parse_task(t) for t in tasks(N)], batch_id="b")
    proc = workers.start(burst=False, concurrency=CONCURRENCY, grace=30, lease=10)
    wid = worker_id_of(store, proc.pid)
    wait_for(lambda: in_flight(simulator, CONCURRENCY), "calls in flight", timeout=60)
    calls_at_signal = simulator.stats()["requests"]
    proc.signal(signal.SIGTERM)
    assert proc.wait(30) == 0, proc.log()

    stats = simulator.stats()
    assert stats["requests"] == calls_at_signal, "the worker claimed after SIGTERM"
    assert stats["in_flight"] == 0
    done = rows(store, "SELECT task_id, attempts FROM task WHERE status = 'SUCCEEDED'")
    assert len(done) == calls_at_signal == stats["successes"]
    assert all(r["attempts"] == 1 for r in done)
    untouched = rows(store, "SELECT attempts, lease_token FROM task WHERE status = 'PENDING'")
    assert len(untouched) == N - len(done)
    assert all(r["attempts"] == 0 and r["lease_token"] is None for r in untouched)
    (w,) = rows(store, "SELECT status, stopped_at, succeeded, in_flight FROM worker "
                       "WHERE id = :w", w=wid)
    assert w["status"] == "stopped" and w["stopped_at"] is not None
    assert (w["succeeded"], w["in_flight"]) == (len(done), 0)
    assert f"{len(done)} succeeded" in proc.log()
    # what the user saw at the signal: what it is waiting for, and how not to wait
    assert (f"stopping: no new tasks; finishing {CONCURRENCY} call(s) in flight within 30s "
            "(send the signal again, e.g. Ctrl-C, to stop now)") in proc.log()


@pytest.mark.slow
def test_calls_still_running_when_grace_ends_are_released_as_lost_leases(
        store: Store, simulator: SimulatorProcess, workers: WorkerPool) -> None:
    """Calls sent and cut off by the end of the grace: given back at once (PENDING, no
    token), their attempt kept, as a lost lease (the provider had the request; see
    test_rolling_restarts.py)."""
    simulator.configure(latency={"kind": "fixed", "mean_ms": 20_000})
    store.submit([parse_task(t) for t in tasks(N)], batch_id="b")
    proc = workers.start(burst=False, concurrency=CONCURRENCY, grace=0.5, lease=30)
    wid = worker_id_of(store, proc.pid)
    wait_for(lambda: in_flight(simulator, CONCURRENCY), "calls in flight", timeout=60)
    proc.signal(signal.SIGTERM)
    assert proc.wait(15) == 0, proc.log()

    assert status_counts(store) == {"PENDING": N}
    held = rows(store, "SELECT t.task_id, t.attempts, t.lease_token, t.leased_by, "
                       "a.outcome, a.error_class, a.attempt FROM task t "
                       "JOIN task_attempt a ON a.task_pk = t.id")
    assert len(held) == CONCURRENCY
    for r in held:
        assert (r["attempts"], r["lease_token"], r["leased_by"]) == (1, None, None), r
        assert (r["outcome"], r["error_class"], r["attempt"]) == (
            "released", "released_at_shutdown", 1)
    assert rows(store, "SELECT status FROM worker WHERE id = :w", w=wid) == [
        {"status": "stopped"}]
    assert simulator.stats()["successes"] == 0

    # Another worker completes everything; the released tasks run as attempt 2 (the
    # lost lease does not spend their retries), the others as attempt 1.
    simulator.configure(latency={"kind": "fixed", "mean_ms": 0})
    stats = run_worker(store, concurrency=8)
    assert stats.succeeded == N
    assert status_counts(store) == {"SUCCEEDED": N}
    released = {r["task_id"] for r in held}
    for r in rows(store, "SELECT t.task_id, t.attempts, a.attempt FROM task t JOIN "
                         "task_attempt a ON a.task_pk = t.id WHERE a.outcome = 'succeeded'"):
        n = 2 if r["task_id"] in released else 1
        assert (r["attempts"], r["attempt"]) == (n, n), r
    assert len(released) == CONCURRENCY
    assert simulator.stats()["duplicate_successes"] == 0


def test_tasks_kept_ready_hold_leases_and_go_back_unspent_at_shutdown(
        store: Store, simulator: SimulatorProcess) -> None:
    """Beyond its calls in flight a worker keeps ``prefetch`` claimed tasks ready to
    start. They hold leases but are not called; a stop gives them back without
    spending an attempt and without an attempt row (no call was made). The calls it cut
    off keep theirs (their requests were sent)."""
    simulator.configure(latency={"kind": "fixed", "mean_ms": 20_000})
    store.submit([parse_task(t) for t in tasks(N)], batch_id="b")
    with BackgroundWorker(store, concurrency=2, prefetch=3, shutdown_grace_s=0.2) as bg:
        wait_for(lambda: in_flight(simulator, 2), "calls in flight")
        wait_for(lambda: scalar(store, "SELECT COUNT(*) FROM task "
                                       "WHERE lease_token IS NOT NULL") == 5, "5 leases")
        assert simulator.stats()["requests"] == 2, "a task kept ready was called"
        stats = bg.stop()

    assert stats.released == 5  # two calls cut off by the stop, three never started
    assert status_counts(store) == {"PENDING": N}
    assert rows(store, "SELECT attempts, lease_token, leased_by FROM task "
                       "WHERE attempts <> 0 OR lease_token IS NOT NULL "
                       "OR leased_by IS NOT NULL") == [
        {"attempts": 1, "lease_token": None, "leased_by": None}] * 2
    assert rows(store, "SELECT outcome, COUNT(*) AS n FROM task_attempt GROUP BY outcome"
                ) == [{"outcome": "released", "n": 2}]
    assert rows(store, "SELECT error_class, COUNT(*) AS n FROM task WHERE error_class IS "
                       "NOT NULL GROUP BY error_class"
                ) == [{"error_class": "released_at_shutdown", "n": 5}], "not lease_expired"


def test_burst_worker_on_an_empty_queue_stops_at_once(store: Store,
                                                      simulator: SimulatorProcess) -> None:
    stats = run_worker(store, concurrency=4, timeout=30)
    assert (stats.claimed, stats.succeeded) == (0, 0)
    (w,) = rows(store, "SELECT status, concurrency FROM worker")
    assert (w["status"], w["concurrency"]) == ("stopped", 4)


def test_a_burst_worker_of_one_pool_ends_when_its_pool_is_drained(
        store: Store, simulator: SimulatorProcess) -> None:
    """A burst worker serving pool ``other`` waited for ever while another pool's tasks
    were PENDING (the queue as a whole was not drained): they are not its work."""
    store.submit([parse_task(t) for t in tasks(2)], batch_id="b")  # pool "default"
    stats = run_worker(store, concurrency=2, pool="other", timeout=30)
    assert (stats.claimed, stats.succeeded) == (0, 0)
    assert status_counts(store) == {"PENDING": 2}


def test_burst_worker_waits_for_a_task_backing_off(store: Store,
                                                   simulator: SimulatorProcess) -> None:
    """Burst mode ends only when nothing is PENDING, including tasks backing off."""
    simulator.configure(rate_500=1.0)
    store.submit([parse_task(t) for t in tasks(1, retry={"max_retries": 1,
                                                         "base_delay_ms": 300,
                                                         "jitter": 0.0})], batch_id="b")
    stats = run_worker(store, concurrency=2, timeout=30)
    assert (stats.retried, stats.dead) == (1, 1)
    assert status_counts(store) == {"DEAD": 1}


def test_a_long_flush_period_holds_neither_the_last_results_nor_the_stop(
        store: Store, simulator: SimulatorProcess) -> None:
    """The write-behind waited out its whole period for a batch to gather: with
    ``flush_interval_s`` of a minute a burst run's last results waited a minute (a
    config with ``inf`` hung), and a stop was not heard until the period ended."""
    store.submit([parse_task(t) for t in tasks(3)], batch_id="b")
    stats = run_worker(store, concurrency=4, flush_interval_s=300, timeout=60)
    assert stats.succeeded == 3
    assert status_counts(store) == {"SUCCEEDED": 3}
    store.submit([parse_task(t) for t in tasks(2, prefix="more")], batch_id="c")
    stats = run_worker(store, until=lambda: simulator.stats()["successes"] >= 5,
                       concurrency=4, flush_interval_s=300, timeout=60)
    assert stats.succeeded == 2, "the stop writes the results gathered"
    assert status_counts(store) == {"SUCCEEDED": 5}


def test_a_second_stop_request_releases_in_flight_calls_at_once(
        store: Store, simulator: SimulatorProcess) -> None:
    """Worker.request_stop: "a second signal means: now", also once the grace period
    has begun (the in-flight calls here would take 4 s, the grace is a minute)."""
    simulator.configure(latency={"kind": "fixed", "mean_ms": 4000})
    store.submit([parse_task(t) for t in tasks(CONCURRENCY)], batch_id="b")
    with BackgroundWorker(store, concurrency=CONCURRENCY, shutdown_grace_s=60,
                          heartbeat_s=0.1, lease_s=1.2) as bg:
        wait_for(lambda: in_flight(simulator, CONCURRENCY), "calls in flight")
        bg.request_stop()
        wait_for(lambda: rows(store, "SELECT status FROM worker") == [{"status": "stopping"}],
                 "the worker to report that it is stopping")
        bg.request_stop()
        stats = bg.stop()
    assert (stats.released, stats.succeeded) == (CONCURRENCY, 0)
    assert simulator.stats()["successes"] == 0
    # (their requests were sent: each keeps its attempt, a lost lease)
    assert rows(store, "SELECT DISTINCT attempts, lease_token FROM task") == [
        {"attempts": 1, "lease_token": None}]


def test_a_second_sigterm_with_a_healthy_database_says_nothing_of_a_hung_one(
        store: Store, simulator: SimulatorProcess, workers: WorkerPool) -> None:
    """A stop at once looked at the database threads the instant they were told to
    end: still alive, they were taken for calls that do not return, the log said "the
    database does not answer" and the process ended by ``os._exit`` (3 runs of 3)."""
    simulator.configure(latency={"kind": "fixed", "mean_ms": 20_000})
    store.submit([parse_task(t) for t in tasks(N)], batch_id="b")
    proc = workers.start(burst=False, concurrency=CONCURRENCY, grace=60, lease=30,
                         log_level="INFO")
    wait_for(lambda: in_flight(simulator, CONCURRENCY), "calls in flight", timeout=60)
    proc.signal(signal.SIGTERM)
    wait_for(lambda: "stopping: no new tasks" in proc.log(), "the first stop to be heard")
    proc.signal(signal.SIGTERM)
    assert proc.wait(15) == 0, proc.log()
    log = proc.log()
    assert "stopping now:" in log, log
    assert "without waiting for the database" not in log, log
    assert "worker stopped:" in log, log
    assert status_counts(store) == {"PENDING": N}


@pytest.mark.parametrize("when", ["at start", "during calls"])
def test_a_sqlite_write_lock_held_past_the_wait_is_waited_out(
        sqlite_store: Store, simulator: SimulatorProcess, monkeypatch: pytest.MonkeyPatch,
        when: str) -> None:
    """Another process holding the file's write lock longer than a writer waits (60 s;
    200 ms here): the driver's "database is locked" passed as a bug. A worker starting
    meanwhile died; one running wrote results with a bare trace ("storage_error: the
    database refused this attempt's trace", no usage)."""
    monkeypatch.setattr(_begin_immediate, "__kwdefaults__", {"deadline_s": 0.2})
    simulator.configure(latency={"kind": "fixed", "mean_ms": 300})
    sqlite_store.submit([parse_task(t) for t in tasks(40)], batch_id="b")
    holder = sqlite3.connect(sqlite_store.engine.url.database or "", isolation_level=None,
                             check_same_thread=False)
    locked = threading.Event()

    def hold() -> None:
        if when == "during calls":
            wait_for(lambda: simulator.stats()["requests"] >= 1, "a call in flight")
        holder.execute("BEGIN IMMEDIATE")
        locked.set()
        time.sleep(1.0)
        holder.execute("ROLLBACK")

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    if when == "at start":
        assert locked.wait(10)
    try:
        stats = run_worker(sqlite_store, concurrency=8)
    finally:
        t.join(10)
        holder.close()
    assert stats.succeeded == 40
    assert status_counts(sqlite_store) == {"SUCCEEDED": 40}
    bare = rows(sqlite_store, "SELECT COUNT(*) AS n FROM task_attempt WHERE "
                              "error_class = 'storage_error' OR raw_output IS NULL")
    assert bare == [{"n": 0}]
    assert rows(sqlite_store, "SELECT COUNT(*) AS n FROM task WHERE input_tokens IS NULL"
                ) == [{"n": 0}]


def test_a_renewal_held_up_longer_than_a_lease_is_said(
        sqlite_store: Store, simulator: SimulatorProcess,
        caplog: pytest.LogCaptureFixture) -> None:
    """Found by a chaos review: with the task table locked for 4-5 leases' length
    (LOCK TABLE, LOCK TABLES, BEGIN IMMEDIATE) the workers' logs held no line at all,
    while the leases they held ran out."""
    simulator.configure(latency={"kind": "fixed", "mean_ms": 4000})
    sqlite_store.submit([parse_task(t) for t in tasks(CONCURRENCY)], batch_id="b")
    holder = sqlite3.connect(sqlite_store.engine.url.database or "", isolation_level=None,
                             check_same_thread=False)
    try:
        with caplog.at_level("WARNING", logger="lockgate.worker"), \
                BackgroundWorker(sqlite_store, concurrency=CONCURRENCY, lease_s=1.0,
                                 heartbeat_s=0.2) as bg:
            wait_for(lambda: in_flight(simulator, CONCURRENCY), "calls in flight")
            holder.execute("BEGIN IMMEDIATE")
            time.sleep(2.5)
            holder.execute("ROLLBACK")
            wait_for(lambda: "renewing the leases took" in caplog.text,
                     "the held-up renewal to be said", timeout=10)
            bg.stop()
    finally:
        holder.close()
    assert "longer than a lease (1s)" in caplog.text, caplog.text


def test_long_calls_keep_their_lease_by_renewing_it(store: Store,
                                                    simulator: SimulatorProcess) -> None:
    """Calls last more than twice the lease; a second worker polls all along and must
    never get the tasks (their leases are renewed every lease/3)."""
    simulator.configure(latency={"kind": "fixed", "mean_ms": 3500})
    store.submit([parse_task(t) for t in tasks(CONCURRENCY)], batch_id="b")
    with BackgroundWorker(store, concurrency=CONCURRENCY, lease_s=1.5) as holder:
        wait_for(lambda: in_flight(simulator, CONCURRENCY), "calls in flight")
        first_expiry = max(r["visible_at"] for r in rows(store, "SELECT visible_at FROM task"))
        with BackgroundWorker(store, concurrency=CONCURRENCY, lease_s=1.5,
                              poll_max_s=0.05) as thief:
            wait_for(lambda: store.db_now() > first_expiry + 500,
                     "the original leases to have run out", timeout=10)
            assert rows(store, "SELECT COUNT(*) AS n FROM task WHERE visible_at > :t",
                        t=first_expiry) == [{"n": CONCURRENCY}], "leases were renewed"
            thief_stats = thief.stop()
        held = holder.stop()
    assert thief_stats.claimed == 0
    assert (held.claimed, held.succeeded, held.discarded) == (CONCURRENCY,) * 2 + (0,)
    assert status_counts(store) == {"SUCCEEDED": CONCURRENCY}
    stats = simulator.stats()
    assert (stats["requests"], stats["duplicate_successes"]) == (CONCURRENCY, 0)


# Back-pressure under a slow database: test_resilience.py
