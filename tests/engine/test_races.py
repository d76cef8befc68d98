"""Several worker processes on one queue: every task ends terminal exactly once, no
result is overwritten, and the simulator's request log agrees with the database."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import orjson
import pytest

from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import ClaimedTask, Finish, Store

from .support import (
    BackgroundWorker,
    WorkerPool,
    attempts_of,
    expected_label,
    rows,
    status_counts,
    task_row,
    tasks,
    wait_for,
)

#: 10,000 tasks on every backend. Measured on the 2-core development machine with four
#: workers of concurrency 64: about 20 s on PostgreSQL and MariaDB, 25 s on SQLite.
RACE_TASKS = 10_000
RACE_WORKERS = 4


def check_exactly_once(store: Store, sim: SimulatorProcess, n: int) -> dict[str, Any]:
    """The invariants of a run without crashes and without faults; returns figures."""
    assert status_counts(store) == {"SUCCEEDED": n}
    task_rows = {r["id"]: r for r in rows(
        store, "SELECT id, task_id, input_data, result, attempts, lease_token, leased_by "
               "FROM task")}
    attempts = rows(store, "SELECT task_pk, attempt, outcome, raw_output, worker_id, "
                           "lease_token, parse_status FROM task_attempt")
    per_task: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for a in attempts:
        per_task[a["task_pk"]].append(a)
    assert set(per_task) == set(task_rows), "a task has no attempt trace"
    outcomes = Counter(a["outcome"] for a in attempts)
    assert set(outcomes) <= {"succeeded", "discarded"}, outcomes
    for pk, t in task_rows.items():
        trace = per_task[pk]
        won = [a for a in trace if a["outcome"] == "succeeded"]
        assert len(won) == 1, f"task {t['task_id']} has {len(won)} applied results"
        (a,) = won
        result = orjson.loads(t["result"])
        assert result == orjson.loads(a["raw_output"]), f"{t['task_id']}: result overwritten"
        assert result == {"label": expected_label(orjson.loads(t["input_data"])["text"])}
        assert (a["lease_token"], a["worker_id"]) == (t["lease_token"], t["leased_by"]), \
            "the result's audit trail names the lease that wrote it"
        assert t["attempts"] == len(trace), "every claim left exactly one trace"
        assert sorted(x["attempt"] for x in trace) == list(range(1, len(trace) + 1))

    stats = sim.stats(detail=True)
    discarded = outcomes.get("discarded", 0)
    assert stats["requests"] == len(attempts), "calls made == calls recorded"
    assert stats["successes"] == len(attempts)
    assert stats["duplicate_keys"] == 0, "an attempt key was sent twice"
    assert stats["duplicate_successes"] == discarded
    calls = Counter({t["task_id"]: len(per_task[pk]) for pk, t in task_rows.items()})
    assert Counter(stats["task_successes"]) == calls
    return {"attempts": len(attempts), "discarded": discarded}


@pytest.mark.slow
def test_worker_processes_race_on_one_queue(store: Store, simulator: SimulatorProcess,
                                            workers: WorkerPool) -> None:
    report = store.submit([parse_task(t) for t in tasks(RACE_TASKS)], batch_id="race")
    assert report.inserted == RACE_TASKS
    for _ in range(RACE_WORKERS):
        workers.start(concurrency=64, claim_batch=64)
    codes = workers.wait_all(timeout=240)
    assert codes == [0] * RACE_WORKERS, workers.logs()

    figures = check_exactly_once(store, simulator, RACE_TASKS)

    ws = rows(store, "SELECT status, claimed, succeeded, discarded, stopped_at FROM worker")
    assert len(ws) == RACE_WORKERS
    assert all(w["status"] == "stopped" and w["stopped_at"] is not None for w in ws)
    assert sum(w["succeeded"] for w in ws) == RACE_TASKS
    assert sum(w["claimed"] for w in ws) == figures["attempts"]
    assert sum(w["discarded"] for w in ws) == figures["discarded"]
    assert sum(1 for w in ws if w["succeeded"] > 0) > 1, "the workers did not share the queue"


def test_a_worker_that_lost_its_lease_mid_call_does_not_overwrite(
        store: Store, simulator: SimulatorProcess) -> None:
    """While a worker waits on the model, its lease runs out (forced here by moving the
    row's visible_at into the past) and another holder claims the task. The first
    worker's answer must then be fenced off: discarded, recorded, never written."""
    simulator.configure(latency={"kind": "fixed", "mean_ms": 2500})
    store.submit([parse_task(t) for t in tasks(1)], batch_id="b")
    with BackgroundWorker(store, concurrency=1, lease_s=60) as slow:  # no room to re-claim
        wait_for(lambda: simulator.stats()["in_flight"] >= 1, "the call to start")

        def expire_and_steal() -> list[ClaimedTask]:
            # Retried because the holder's lease loop may renew in between (every 5 s).
            with store.engine.begin() as conn:
                conn.exec_driver_sql("UPDATE task SET visible_at = 0")  # the lease runs out
            return store.claim(1, lease_ms=60_000, worker_id="thief")

        (thief,) = wait_for(expire_and_steal, "another holder to claim the task")
        assert thief.attempt == 2
        wait_for(lambda: slow.worker.stats.discarded == 1, "the stale write-back", timeout=30)
        stats = slow.stop()
    assert (stats.succeeded, stats.discarded) == (0, 1)
    row = task_row(store, thief.task_id)
    assert (row["status"], row["lease_token"], row["leased_by"], row["result"]) == (
        "PENDING", thief.lease_token, "thief", None)
    (stale,) = attempts_of(store, thief.task_id)
    assert (stale["outcome"], stale["attempt"], stale["worker_id"]) == (
        "discarded", 1, slow.worker.id)
    assert orjson.loads(stale["raw_output"]) == {"label": "yes"}, "the call is on record"

    done = Finish(id=thief.id, lease_token=thief.lease_token, status="SUCCEEDED",
                  result='{"label":"yes"}', parse_status="valid",
                  attempt={"attempt": 2, "outcome": "succeeded", "started_at": 0})
    assert store.finish([done], worker_id="thief").applied == [thief.id]
    assert task_row(store, thief.task_id)["status"] == "SUCCEEDED"
    assert [a["outcome"] for a in attempts_of(store, thief.task_id)] == [
        "discarded", "succeeded"]


def test_a_worker_that_re_claims_a_task_it_still_runs_keeps_track_of_both_calls(
        store: Store, simulator: SimulatorProcess) -> None:
    """The worker's own lease runs out mid-call (its renewals were late) and it claims the
    same task again, so two calls of one task run in one worker. The first answer is
    fenced off; on shutdown the second call, still in flight, must be released."""
    simulator.configure(latency={"kind": "fixed", "mean_ms": 2000})
    store.submit([parse_task(t) for t in tasks(1, model={"timeout_ms": 6000})], batch_id="b")
    with BackgroundWorker(store, concurrency=2, lease_s=60, poll_max_s=0.05,
                          shutdown_grace_s=0.5) as bg:
        wait_for(lambda: simulator.stats()["in_flight"] >= 1, "the first call")
        simulator.configure(rate_timeout=1.0, hang_s=60)  # later calls never answer
        with store.engine.begin() as conn:
            conn.exec_driver_sql("UPDATE task SET visible_at = 0")  # the lease runs out
        wait_for(lambda: simulator.stats()["hanging"] >= 1, "the worker to re-claim it")
        (second,) = rows(store, "SELECT lease_token, attempts FROM task")
        assert second["attempts"] == 2
        wait_for(lambda: bg.worker.stats.discarded == 1, "the first answer to be fenced off")
        stats = bg.stop()  # graceful; the second call outlives the grace period
    assert (stats.discarded, stats.released) == (1, 1)
    row = task_row(store, "t-00000")
    # (the second call's request was sent: its claim keeps its attempt, a lost lease)
    assert (row["status"], row["lease_token"], row["attempts"]) == ("PENDING", None, 2)
    assert [(a["attempt"], a["outcome"], a["lease_token"]) for a in attempts_of(
        store, "t-00000")][1:] == [(2, "released", second["lease_token"])]
