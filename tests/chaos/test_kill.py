"""kill -9 of random workers during a run on PostgreSQL and MariaDB, a worker restarted
after each kill: every task SUCCEEDED exactly once with the simulator's answer, and the
provider calls made twice stay within the calls the killed workers had in flight.

The victim is frozen (SIGSTOP) and killed, and its leases are read only once the server
has closed its sessions (:func:`helpers.kill_settled`), so a COMMIT it sent just before
dying is counted, and before the leases expire, so nobody has taken them yet."""

from __future__ import annotations

import os
import random
from collections import Counter
from typing import Any

import orjson
import pytest

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
from helpers import kill_settled
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store

from .conftest import Scale

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

WORKERS = 4
CONCURRENCY = 16
LEASE_S = 3.0
SEED = int(os.environ.get("LOCKGATE_TEST_SEED") or random.randrange(1 << 30))


@pytest.fixture(scope="module", params=("postgresql", "mariadb"))
def backend(request: pytest.FixtureRequest) -> str:
    """Server databases only: a kill there can leave a COMMIT in flight."""
    return str(request.param)


def _finished(store: Store) -> int:
    return int(scalar(store, "SELECT COUNT(*) FROM task WHERE status <> 'PENDING'"))


def _holding(store: Store, live: list[WorkerProcess]) -> list[tuple[WorkerProcess, str]]:
    ids = {r["pid"]: r["id"] for r in rows(store, "SELECT id, pid FROM worker")}
    return [(p, ids[p.pid]) for p in live if p.alive() and p.pid in ids
            and scalar(store, "SELECT COUNT(*) FROM task WHERE leased_by = :w AND "
                              "status = 'PENDING'", w=ids[p.pid])]


def test_random_kill_9_during_a_run_loses_nothing(store: Store, simulator: SimulatorProcess,
                                                  workers: WorkerPool, scale: Scale) -> None:
    seed, n = SEED, scale.kill_tasks
    rng = random.Random(seed)
    simulator.configure(latency={"kind": "fixed", "mean_ms": 20}, rate_500=0.01)
    store.submit([parse_task(t) for t in tasks(n, retry={"max_retries": 10})],
                 batch_id="kill")

    def start() -> WorkerProcess:
        return workers.start(concurrency=CONCURRENCY, lease=LEASE_S)

    live = [start() for _ in range(WORKERS)]
    kills: list[dict[str, Any]] = []
    held_ids: set[str] = set()
    for point in sorted(rng.uniform(0.05, 0.85) for _ in range(scale.kills)):
        wait_for(lambda: _finished(store) >= point * n,  # noqa: B023 - used at once
                 f"{point:.0%} of the tasks to finish (seed {seed})", timeout=300)
        candidates = wait_for(lambda: _holding(store, live),
                              f"a worker holding leases (seed {seed})", timeout=60)
        victim, wid = rng.choice(candidates)
        kill_settled(victim.popen, store)
        held = [r["task_id"] for r in rows(
            store, "SELECT task_id FROM task WHERE leased_by = :w AND status = 'PENDING'",
            w=wid)]
        kills.append({"worker": wid, "at": round(point, 3), "held": len(held)})
        held_ids.update(held)
        live.remove(victim)
        live.append(start())
    for p in live:
        assert p.wait(600) == 0, workers.logs()

    assert status_counts(store) == {"SUCCEEDED": n}, f"seed {seed}: {kills}"
    results = {r["task_id"]: r["result"] for r in rows(store, "SELECT task_id, result FROM task")}
    for task_id, result in results.items():
        i = int(task_id.split("-")[1])
        assert orjson.loads(result) == {"label": expected_label(text_for(i))}, task_id
    won = Counter(r["task_id"] for r in rows(
        store, "SELECT t.task_id FROM task_attempt a JOIN task t ON t.id = a.task_pk "
               "WHERE a.outcome = 'succeeded'"))
    assert set(won.values()) == {1} and len(won) == n, f"seed {seed}: applied twice or never"
    discarded = {r["task_id"] for r in rows(
        store, "SELECT t.task_id FROM task_attempt a JOIN task t ON t.id = a.task_pk "
               "WHERE a.outcome = 'discarded'")}
    stats = simulator.stats(detail=True)
    repeated = {t for t, k in stats["task_successes"].items() if k > 1}
    in_flight = sum(k["held"] for k in kills)
    print(f"kill -9 x{len(kills)} on {store.engine.url.get_backend_name()}, {n} tasks, "
          f"seed {seed}: calls held at the kills {in_flight}, duplicate calls "
          f"{stats['duplicate_successes']}, fenced write-backs {len(discarded)}")
    assert repeated <= held_ids | discarded, f"seed {seed}: duplicates outside the kills"
    assert stats["duplicate_successes"] <= in_flight + len(discarded), (seed, kills, stats)
    assert stats["duplicate_keys"] == 0
