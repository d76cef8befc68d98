"""kill -9 of worker processes in the middle of a run: leases recover every task, and
the duplicate calls stay within what the killed workers held when they died."""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from collections import Counter
from typing import Any

import orjson
import pytest

from helpers import kill_settled
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import ClaimedTask, Finish, Store
from lockgate.worker import Worker

from .support import (
    WorkerPool,
    WorkerProcess,
    attempts_of,
    rows,
    run_worker,
    scalar,
    status_counts,
    task_row,
    tasks,
    wait_for,
    worker_settings,
)

CRASH_TASKS = 2000
KILLS = 3
LIVE_WORKERS = 3
CONCURRENCY = 16
LEASE_S = 3.0
#: Kill moments are drawn from this seed (set LOCKGATE_TEST_SEED to replay a run).
SEED = int(os.environ.get("LOCKGATE_TEST_SEED") or random.randrange(1 << 30))


def finished(store: Store) -> int:
    return int(scalar(store, "SELECT COUNT(*) FROM task WHERE status <> 'PENDING'"))


def registered(store: Store, procs: list[WorkerProcess]) -> list[tuple[WorkerProcess, str]]:
    """Live processes that have written their worker row, with their worker id."""
    ids = {r["pid"]: r["id"] for r in rows(store, "SELECT id, pid FROM worker")}
    return [(p, ids[p.pid]) for p in procs if p.alive() and p.pid in ids]


@pytest.mark.slow
def test_kill_9_at_random_moments_loses_nothing(store: Store, simulator: SimulatorProcess,
                                                workers: WorkerPool) -> None:
    """Three workers (``--concurrency 16``, ``--lease 3``) run; three times, at a random
    point of progress, one is killed with SIGKILL and a replacement started.

    Bound on duplicate calls: a killed worker can only have called the model for the
    tasks it held when it died, i.e. its calls in flight (at most ``--concurrency``) plus
    results it had not flushed yet. Those leases are read from the database once the
    server has closed the killed process's sessions (a COMMIT it sent just before dying
    still lands) and before they expire (nobody else can take them), so the bound is
    exact.
    """
    seed = SEED
    rng = random.Random(seed)
    # Some faults too, so retries (fenced write-backs of PENDING) race with the kills.
    simulator.configure(latency={"kind": "fixed", "mean_ms": 20}, rate_500=0.03,
                        rate_429=0.02, retry_after_ms=100)
    specs = [parse_task(t) for t in tasks(CRASH_TASKS, retry={"max_retries": 10})]
    store.submit(specs, batch_id="crash")

    def start() -> WorkerProcess:
        return workers.start(concurrency=CONCURRENCY, lease=LEASE_S)

    live = [start() for _ in range(LIVE_WORKERS)]
    held_ids: set[str] = set()
    kills: list[dict[str, Any]] = []
    for point in sorted(rng.uniform(0.1, 0.8) for _ in range(KILLS)):
        target = point * CRASH_TASKS
        wait_for(lambda: finished(store) >= target,  # noqa: B023 - used at once
                 f"{point:.0%} of the tasks to finish (seed {seed})", timeout=120)
        candidates = wait_for(lambda: [
            (p, w) for p, w in registered(store, live)
            if scalar(store, "SELECT COUNT(*) FROM task WHERE leased_by = :w "
                             "AND status = 'PENDING'", w=w)],
            f"a worker holding leases (seed {seed})", timeout=60)
        victim, wid = rng.choice(candidates)
        kill_settled(victim.popen, store)
        held = [r["task_id"] for r in rows(
            store, "SELECT task_id FROM task WHERE leased_by = :w AND status = 'PENDING'",
            w=wid)]
        kills.append({"worker": wid, "at": point, "held": len(held)})
        held_ids.update(held)
        live.remove(victim)
        live.append(start())

    for p in live:
        assert p.wait(180) == 0, workers.logs()
    assert len(kills) == KILLS, f"seed {seed}"

    # Every task terminal exactly once, with one applied result that is its own.
    assert status_counts(store) == {"SUCCEEDED": CRASH_TASKS}, f"seed {seed}: {kills}"
    task_rows = {r["task_id"]: r for r in rows(
        store, "SELECT id, task_id, result, attempts, lease_token, leased_by, version "
               "FROM task")}
    attempts = rows(store, "SELECT t.task_id, a.attempt, a.outcome, a.raw_output, a.worker_id, "
                           "a.lease_token, a.started_at, a.error_class FROM task_attempt a "
                           "JOIN task t ON t.id = a.task_pk ORDER BY a.id")
    won = Counter(a["task_id"] for a in attempts if a["outcome"] == "succeeded")
    wrong = {t: [a for a in attempts if a["task_id"] == t]
             for t in task_rows if won[t] != 1}
    assert not wrong, f"seed {seed}: tasks without exactly one applied result: {wrong}; " \
                      f"rows {[task_rows[t] for t in wrong]}; kills {kills}"
    for a in attempts:
        if a["outcome"] == "succeeded":
            assert orjson.loads(task_rows[a["task_id"]]["result"]) == orjson.loads(
                a["raw_output"])
    outcomes = Counter(a["outcome"] for a in attempts)
    assert outcomes["retry"] > 0, "the injected faults caused no retry"
    # (first_429: a worker's first refusal by an endpoint that named no limit, unspent)
    assert set(outcomes) <= {"succeeded", "retry", "discarded", "first_429"}, outcomes
    discarded = {a["task_id"] for a in attempts if a["outcome"] == "discarded"}
    n_discarded = sum(1 for a in attempts if a["outcome"] == "discarded")

    # Duplicate calls: only for tasks a killed worker held (or whose write-back was
    # fenced, which shows up as a discarded attempt), and no more than they held.
    held_total = sum(k["held"] for k in kills)
    stats = simulator.stats(detail=True)
    repeated = {t for t, n in stats["task_successes"].items() if n > 1}
    print(f"seed {seed}: kills {kills}; duplicate successes {stats['duplicate_successes']}, "
          f"discarded write-backs {n_discarded}, calls {stats['requests']}, "
          f"traced attempts {len(attempts)}")
    assert repeated <= held_ids | discarded, f"seed {seed}: unexpected duplicate calls"
    assert stats["duplicate_successes"] <= held_total + n_discarded, (seed, kills, stats)
    assert stats["duplicate_keys"] == 0
    # Claims lost with the killed workers leave no trace; they are exactly the leases
    # they held (fewer if a write-back committed just as the process died).
    untraced = sum(t["attempts"] for t in task_rows.values()) - len(attempts)
    assert 0 <= untraced <= held_total, (seed, kills)
    lost_calls = stats["requests"] - len(attempts)
    assert 0 <= lost_calls <= held_total, (seed, kills)
    killed = {k["worker"] for k in kills}
    states = {r["id"]: r["status"] for r in rows(store, "SELECT id, status FROM worker")}
    assert all(states[w] == "running" for w in killed), "a killed worker cannot sign off"
    assert all(s == "stopped" for w, s in states.items() if w not in killed)


def _lose_leases(store: Store, n: int) -> None:
    """``n`` holders "crash" in turn: each claims the task and never writes back."""
    for _ in range(n):
        claimed = store.claim(1, lease_ms=200, worker_id="crashed")
        assert [c.task_id for c in claimed] == ["t-00000"]
        visible_at = scalar(store, "SELECT visible_at FROM task WHERE id = :i", i=claimed[0].id)
        wait_for(lambda: store.db_now() > visible_at,  # noqa: B023 - used at once
                 "the lease to expire", timeout=10)


def test_leases_lost_with_crashed_workers_do_not_spend_the_retry_budget(
        store: Store, simulator: SimulatorProcess) -> None:
    """A worker killed with its tasks (in flight, or claimed ahead and never called)
    must not end them: at max_retries 0 every task it held ended DEAD before."""
    store.submit([parse_task(t) for t in tasks(1, retry={"max_retries": 0})], batch_id="b")
    _lose_leases(store, 2)
    run_worker(store, concurrency=2)
    row = task_row(store, "t-00000")
    assert (row["status"], row["attempts"]) == ("SUCCEEDED", 3)
    assert [(a["attempt"], a["outcome"]) for a in attempts_of(store, "t-00000")] == [
        (3, "succeeded")]
    assert simulator.stats(detail=True)["task_successes"] == {"t-00000": 1}


def test_a_task_that_keeps_losing_its_lease_ends_dead_without_another_call(
        store: Store, simulator: SimulatorProcess) -> None:
    """Claims lost to crashes are bounded, so a task that kills workers cannot loop:
    after max(3, max_retries + 1) lost leases it ends DEAD (lease_expired)."""
    store.submit([parse_task(t) for t in tasks(1, retry={"max_retries": 1})], batch_id="b")
    _lose_leases(store, 3)
    store.submit([parse_task(t) for t in tasks(1, prefix="u")], batch_id="b")
    run_worker(store, concurrency=2)
    dead = task_row(store, "t-00000")
    assert (dead["status"], dead["error_class"], dead["attempts"]) == (
        "DEAD", "lease_expired", 4)
    assert "lost 3 times" in dead["error_message"]
    assert [(a["attempt"], a["outcome"]) for a in attempts_of(store, "t-00000")] == [
        (4, "dead")]
    assert task_row(store, "u-00000")["status"] == "SUCCEEDED"
    assert simulator.stats(detail=True)["task_successes"] == {"u-00000": 1}, \
        "the dead task was not sent to the model again"


def test_after_a_lost_lease_the_retry_budget_counts_calls(
        store: Store, simulator: SimulatorProcess) -> None:
    """max_retries 1 is two calls, whatever leases were lost before them."""
    simulator.configure(rate_500=1.0)
    store.submit([parse_task(t) for t in tasks(
        1, retry={"max_retries": 1, "base_delay_ms": 10, "jitter": 0.0})], batch_id="b")
    _lose_leases(store, 1)
    run_worker(store, concurrency=2)
    row = task_row(store, "t-00000")
    assert (row["status"], row["error_class"]) == ("DEAD", "server_error")
    assert [(a["attempt"], a["outcome"]) for a in attempts_of(store, "t-00000")] == [
        (2, "retry"), (3, "dead")]
    assert simulator.stats()["requests"] == 2


def test_a_task_run_again_by_hand_keeps_its_retry_budget_after_a_lost_lease(
        store: Store, simulator: SimulatorProcess) -> None:
    """``tasks retry`` gives a DEAD task a fresh budget; its earlier run's retries stay
    in the trace. They were counted as this run's, so a claim lost with a crashed worker
    counted as a spent retry: the task ended DEAD after one call, not two."""
    simulator.configure(rate_500=1.0)
    store.submit([parse_task(t) for t in tasks(
        1, retry={"max_retries": 1, "base_delay_ms": 10, "jitter": 0.0})], batch_id="b")
    run_worker(store, concurrency=2)
    assert [(a["attempt"], a["outcome"]) for a in attempts_of(store, "t-00000")] == [
        (1, "retry"), (2, "dead")]
    store.retry("t-00000")
    _lose_leases(store, 1)
    run_worker(store, concurrency=2)
    row = task_row(store, "t-00000")
    assert (row["status"], row["error_class"]) == ("DEAD", "server_error")
    assert [(a["attempt"], a["outcome"]) for a in attempts_of(store, "t-00000")] == [
        (1, "retry"), (2, "dead"), (2, "retry"), (3, "dead")]
    assert simulator.stats()["requests"] == 4  # two calls a run


def test_a_frozen_worker_does_not_call_the_tasks_it_kept_ready_once_their_leases_ran_out(
        store: Store, simulator: SimulatorProcess) -> None:
    """A worker frozen past its lease (SIGSTOP, a VM paused) while holding tasks it had
    claimed ahead: another worker takes them over and finishes them. Resumed, the frozen
    worker called each of them again (duplicate calls, their write-backs discarded);
    it lets them go uncalled, also when its lease renewals ran again before the call
    under way ended (they renewed none of them: the renewal tells it so)."""
    # The call under way outlasts the freeze by two seconds: renewals run meanwhile.
    simulator.configure(latency={"kind": "fixed", "mean_ms": 6000})
    store.submit([parse_task(t) for t in tasks(6)], batch_id="b")
    taken: list[str] = []

    def other_worker() -> None:  # takes the expired leases over while the first sleeps
        deadline = time.monotonic() + 20
        while len(taken) < 6 and time.monotonic() < deadline:
            got = store.claim(10, lease_ms=60_000, worker_id="other")
            store.finish([Finish(id=c.id, lease_token=c.lease_token, status="SUCCEEDED",
                                 result='{"label": "x"}', parse_status="valid",
                                 attempt={"attempt": c.attempt, "outcome": "succeeded",
                                          "started_at": 0}) for c in got], worker_id="other")
            taken.extend(c.task_id for c in got)
            time.sleep(0.1)

    async def main() -> None:
        worker = Worker(store, worker_settings(concurrency=1, prefetch=5, lease_s=2.0,
                                               claim_batch=6), burst=True)
        job = asyncio.create_task(worker.run())
        while worker.stats.claimed < 6:
            await asyncio.sleep(0.05)
        helper = threading.Thread(target=other_worker)
        time.sleep(0.2)
        helper.start()
        time.sleep(4.0)  # the whole process frozen: no renewal, the leases run out
        await asyncio.to_thread(helper.join)
        await asyncio.wait_for(job, 60)

    asyncio.run(main())
    assert len(taken) == 6, taken  # every lease ran out, the one in flight's too
    called = set(simulator.stats(detail=True)["task_successes"])
    # only the call already under way when it froze: not the five kept ready
    assert len(called) <= 1, called


def test_a_worker_frozen_while_its_claim_was_answered_does_not_call_what_it_got(
        store: Store, simulator: SimulatorProcess) -> None:
    """A freeze that lands while a claim is in flight: the database commits the claim,
    the worker reads the answer only after its leases ran out and another worker took
    the tasks over. It called every task of that claim (duplicate calls up to a whole
    claim batch): the leases run from when the claim was sent, and tasks whose lease ran
    out before they could start are let go uncalled."""
    store.submit([parse_task(t) for t in tasks(4)], batch_id="b")
    taken: list[str] = []
    claim = store.claim

    def stalled_claim(limit: int, **kw: Any) -> list[ClaimedTask]:
        got = claim(limit, **kw)
        if got and not taken:  # the first claim: another worker takes them over meanwhile
            time.sleep(2.5)  # past the 2 s lease
            more = claim(10, lease_ms=60_000, worker_id="other")
            store.finish([Finish(id=c.id, lease_token=c.lease_token, status="SUCCEEDED",
                                 result='{"label": "x"}', parse_status="valid",
                                 attempt={"attempt": c.attempt, "outcome": "succeeded",
                                          "started_at": 0}) for c in more],
                         worker_id="other")
            taken.extend(c.task_id for c in more)
        return got

    store.claim = stalled_claim  # type: ignore[method-assign]
    worker = Worker(store, worker_settings(concurrency=4, lease_s=2.0, claim_batch=4),
                    burst=True)
    stats = asyncio.run(asyncio.wait_for(worker.run(), 60))
    assert sorted(taken) == [f"t-{i:05d}" for i in range(4)]
    assert simulator.stats()["requests"] == 0  # none of the four called again
    assert stats.lapsed == 4


def test_a_claim_answered_late_whose_tasks_nobody_took_still_calls_them(
        store: Store, simulator: SimulatorProcess) -> None:
    """The same late answer (a claim that waited on a lock, or a freeze), but no other
    worker took the tasks meanwhile: they are still this worker's (the late claim's
    leases are renewed, not assumed lost) and each is called once, now."""
    store.submit([parse_task(t) for t in tasks(4)], batch_id="b")
    claim = store.claim
    stalled = []

    def stalled_claim(limit: int, **kw: Any) -> list[ClaimedTask]:
        got = claim(limit, **kw)
        if got and not stalled:
            stalled.append(len(got))
            time.sleep(2.5)  # past the 2 s lease; nobody claims them meanwhile
        return got

    store.claim = stalled_claim  # type: ignore[method-assign]
    worker = Worker(store, worker_settings(concurrency=4, lease_s=2.0, claim_batch=4),
                    burst=True)
    stats = asyncio.run(asyncio.wait_for(worker.run(), 60))
    assert stalled == [4]
    assert (stats.succeeded, stats.lapsed) == (4, 0)
    sim = simulator.stats()
    assert (sim["requests"], sim["duplicate_successes"]) == (4, 0)
