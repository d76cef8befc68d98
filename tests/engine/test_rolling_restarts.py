"""Rolling restarts shorter than a call: a worker stopped (SIGTERM, ``--grace`` shorter
than the call) after the request was sent gives the task back with its attempt kept,
which counts as a lost lease, so restarts cannot call the provider without end; a task
given back while it still waited to be sent costs nothing."""

from __future__ import annotations

import signal
from pathlib import Path

from helpers import rows, scalar, wait_for
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store
from lockgate.worker.calls import max_lost_leases

from .support import WorkerPool, WorkerProcess, attempts_of, status_counts, tasks

CALL_MS = 4000


def stop_mid_call(workers: WorkerPool, simulator: SimulatorProcess, in_flight: int,
                  **start: object) -> WorkerProcess:
    """Start a worker, wait until ``in_flight`` calls are at the simulator, SIGTERM it
    (its grace is shorter than the call) and wait for its exit."""
    w = workers.start(burst=False, lease=5, grace=0.3, **start)  # type: ignore[arg-type]
    wait_for(lambda: simulator.stats()["in_flight"] >= in_flight,
             f"{in_flight} calls in flight", timeout=30)
    w.signal(signal.SIGTERM)
    assert w.wait(30) == 0, w.log()
    return w


def test_sigterm_mid_call_counts_as_a_lost_lease(store: Store, simulator: SimulatorProcess,
                                                 workers: WorkerPool) -> None:
    """``max_retries`` 0, calls of 4 s, workers stopped with ``--grace 0.3`` mid-call
    time after time: each task is called at most ``max(3, max_retries + 1)`` times, then
    its next claim ends it DEAD (``lease_expired``) without a call, saying why. Before
    the fix each stop gave the attempt back: 6 restarts, 6 calls per task, still
    PENDING with attempts 0."""
    simulator.configure(latency={"kind": "fixed", "mean_ms": CALL_MS})
    n = 2
    store.submit([parse_task(t) for t in tasks(
        n, prefix="s", model={"timeout_ms": 30_000}, retry={"max_retries": 0})],
        batch_id="restarts")
    cap = max_lost_leases(0)
    for i in range(cap):
        stop_mid_call(workers, simulator, n)
        assert simulator.stats()["requests"] == n * (i + 1)
        for r in rows(store, "SELECT status, attempts FROM task"):
            assert r == {"status": "PENDING", "attempts": i + 1}, r  # the claim counted
    # The next worker (burst) ends them without calling.
    assert workers.start(lease=5, grace=0.3).wait(60) == 0, workers.logs()
    assert simulator.stats()["requests"] == n * cap  # 3 calls per task, not one per restart
    assert status_counts(store) == {"DEAD": n}
    for r in rows(store, "SELECT error_class, error_message FROM task"):
        assert r["error_class"] == "lease_expired"
        assert f"lost {cap} times" in r["error_message"] and "stopped" in r["error_message"]
    a = attempts_of(store, "s-00000")
    assert [x["outcome"] for x in a] == ["released"] * cap + ["dead"]
    assert all("after the request was sent" in x["error_message"] for x in a[:cap])


def test_sigterm_before_the_call_costs_nothing(store: Store, simulator: SimulatorProcess,
                                               workers: WorkerPool, tmp_path: Path) -> None:
    """An endpoint that takes one call at a time: one task is called, the others wait
    for admission when the worker is stopped. Only the called one keeps its attempt;
    the others are given back as they were (attempts 0), however often it happens."""
    simulator.configure(latency={"kind": "fixed", "mean_ms": CALL_MS})
    config = tmp_path / "one.toml"
    config.write_text(f'[[endpoint]]\nname = "sim"\nbase_url = "{simulator.url}"\n'
                      "max_concurrency = 1\n")
    store.submit([parse_task(t) for t in tasks(
        3, prefix="w", model={"timeout_ms": 30_000}, retry={"max_retries": 0})],
        batch_id="waiting")
    stop_mid_call(workers, simulator, 1, extra=("--config", str(config)))
    assert simulator.stats()["requests"] == 1
    got = sorted(r["attempts"] for r in rows(store, "SELECT attempts FROM task"))
    assert got == [0, 0, 1], got
    assert status_counts(store) == {"PENDING": 3}
    released = rows(store, "SELECT error_message FROM task_attempt WHERE attempt = 1 "
                           "ORDER BY error_message")
    assert [r["error_message"] for r in released] == [
        "released: worker shut down before the request was sent",
        "released: worker shut down before the request was sent",
        "released: worker shut down mid-call, after the request was sent (counted as a "
        "lost lease)"]
    assert scalar(store, "SELECT COUNT(*) FROM task WHERE error_class = "
                         "'released_at_shutdown'") == 3
