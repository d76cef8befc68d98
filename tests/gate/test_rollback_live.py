"""A rollback while workers run: tasks that name the prompt by reference and are claimed
more than 5 seconds after the rollback run the restored version, as their
attempt traces show; no worker restarts."""

from __future__ import annotations

import time

from lockgate.config import Endpoint
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


def test_rollback_reaches_calls_waiting_behind_a_rate_limit(
        env: Env, store: Store, simulator: SimulatorProcess) -> None:
    """Calls resolved before the rollback but still waiting for the endpoint's rate
    limit are sent with the restored version: a call is checked against the registry
    when it is admitted, not only when its task starts."""
    simulator.configure(latency={"kind": "fixed", "mean_ms": 5})
    env.setup(thresholds=["accuracy>=0"])
    drive(env, env.prompts.propose("p", GOOD).update_id)
    assert env.live() == 2
    store.submit([parse_task({"task_id": f"w{k:03d}", "prompt_template": "@registry:p",
                              "input_data": {"text": "refund?"}}) for k in range(80)],
                 batch_id="waiting")
    # 10 calls a second, paced: all 80 tasks start at once and wait their turn.
    limited = Endpoint(name="sim", base_url=simulator.url, rpm=600)
    worker = BackgroundWorker(store, endpoints=(limited,), concurrency=100)
    try:
        wait_for(lambda: scalar(store, "SELECT COUNT(*) FROM task WHERE batch_id = "
                                       "'waiting' AND status = 'SUCCEEDED'") >= 10,
                 "the first calls", timeout=30)
        rolled = env.prompts.rollback("p", to=1, reason="bad answers in production")
        wait_for(lambda: not scalar(store, "SELECT COUNT(*) FROM task WHERE status = "
                                           "'PENDING'"), "every task done", timeout=60)
    finally:
        worker.stop()
    done = rows(store, "SELECT t.finished_at, a.prompt_version FROM task t JOIN task_attempt "
                       "a ON a.task_pk = t.id AND a.outcome = 'succeeded' "
                       "WHERE t.batch_id = 'waiting'")
    assert len(done) == 80
    # The worker re-reads a moving reference at most every second (refresh_s).
    late = [d["prompt_version"] for d in done if d["finished_at"] > rolled["at"] + 2500]
    assert len(late) >= 20, "the limit kept calls waiting past the rollback"
    assert set(late) == {"p@1"}, "calls sent after the rollback ran the restored version"
    assert worker.worker.stats.version_moves > 0
