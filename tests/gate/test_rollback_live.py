"""A rollback while workers run: tasks that name the prompt by reference and are claimed
more than 5 seconds after the rollback run the restored version, as their
attempt traces show; no worker restarts."""

from __future__ import annotations

import time

from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store

from .support import GOOD, BackgroundWorker, Env, drive, rows, scalar, wait_for

BEFORE_S = 1.5  # traffic before the rollback
AFTER_S = 5.6  # traffic after it: past the 5 s bound


def test_rollback_reaches_running_workers_within_5_seconds(
        env: Env, store: Store, simulator: SimulatorProcess) -> None:
    simulator.configure(latency={"kind": "fixed", "mean_ms": 10})
    env.setup(thresholds=["accuracy>=0"])
    drive(env, env.prompts.propose("p", GOOD).update_id)
    assert env.live() == 2
    workers = [BackgroundWorker(store), BackgroundWorker(store)]
    n = 0

    def submit_for(seconds: float) -> None:
        nonlocal n
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            store.submit([parse_task({"task_id": f"t{n + k:06d}", "prompt_template":
                                      "@registry:p", "input_data": {"text": "refund?"}})
                          for k in range(5)], batch_id="live")
            n += 5
            time.sleep(0.05)  # a steady trickle of traffic, not a wait for a condition

    try:
        submit_for(BEFORE_S)
        rolled = env.prompts.rollback("p", to=1, reason="bad answers in production")
        submit_for(AFTER_S)
        wait_for(lambda: not scalar(store, "SELECT COUNT(*) FROM task WHERE status = "
                                           "'PENDING'"), "every task done", timeout=60)
    finally:
        for w in workers:
            w.stop()
    at = rolled["at"]
    attempts = rows(store, "SELECT a.started_at, a.prompt_version, a.outcome FROM task_attempt a "
                           "JOIN task t ON t.id = a.task_pk WHERE t.batch_id = 'live'")
    assert len(attempts) == n and {a["outcome"] for a in attempts} == {"succeeded"}
    late = [a["prompt_version"] for a in attempts if a["started_at"] > at + 5000]
    assert len(late) >= 10 and set(late) == {"p@1"}, "claimed > 5 s after: restored version"
    before = [a for a in attempts if a["prompt_version"] == "p@2"]
    assert before, "traffic before the rollback ran the version that was live then"
    assert {a["prompt_version"] for a in attempts} == {"p@1", "p@2"}
