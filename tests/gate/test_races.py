"""Racing candidates and moving bases with several workers running the gate's roles:
only the newest submission can activate, and an evaluation whose base moved ends STALE.

The workers are real :class:`~lockgate.worker.Worker` engines, each on its own event
loop, thread and database connections in this process: they race exactly as processes
do, through rows (process kills are in test_crash.py)."""

from __future__ import annotations

import time

import pytest

from lockgate.simulator.testing import SimulatorProcess
from lockgate.store import Store

from .support import (
    BAD,
    GOOD,
    BackgroundWorker,
    Env,
    items,
    rows,
    scalar,
    wait_for,
    yes_no,
)

BETTER = yes_no("refund|money back|reimburse|refunded")
ALSO_GOOD = yes_no("refund|money back|reimburse|repay")


def _decided(env: Env, update_id: int) -> bool:
    return env.status(update_id) not in ("PENDING", "EVALUATING")


def _start(store: Store, n: int) -> list[BackgroundWorker]:
    started = [BackgroundWorker(store, gate=True, concurrency=16, lease_s=5.0)
               for _ in range(n)]
    wait_for(lambda: scalar(store, "SELECT COUNT(*) FROM worker WHERE status = 'running'")
             == n, f"{n} workers running", timeout=60)
    return started


@pytest.mark.slow
def test_racing_candidates_and_a_moving_base(env: Env, store: Store,
                                             simulator: SimulatorProcess) -> None:
    """Two worker processes race on every step (one pair per backend, for both parts).

    1. Two candidates submitted 50 ms apart, twice (the newer passes, then the newer
       fails): only the newer can activate; the older ends CANCELLED and nothing it
       still had in flight activates it.
    2. A slow evaluation whose base moves (a rollback) ends STALE although it passed.
    """
    simulator.configure(latency={"kind": "fixed", "mean_ms": 5})
    env.setup(datasets={"d": 80}, thresholds=["accuracy>=0.7"])
    racers = _start(store, 3)
    try:
        _race_and_move(env, store, simulator)
    finally:
        for w in racers:
            w.stop()


def _race_and_move(env: Env, store: Store, simulator: SimulatorProcess) -> None:
    activated: list[int] = []
    live_now = env.live()
    for older_tpl, newer_tpl, newer_passes in ((BETTER, GOOD, True), (ALSO_GOOD, BAD, False)):
        live_before = env.live()
        older = env.prompts.propose("p", older_tpl)
        time.sleep(0.05)  # the scenario: the second submission comes 50 ms later
        newer = env.prompts.propose("p", newer_tpl)
        assert newer.superseded == [older.update_id]
        wait_for(lambda u=newer.update_id: _decided(env, u), "the newer candidate decided",
                 timeout=90)
        assert env.status(older.update_id) == "CANCELLED"
        assert env.status(newer.update_id) == ("ACTIVATED" if newer_passes else "REJECTED")
        assert env.live() == (newer.version if newer_passes else live_before)
        # whatever the older one's workers still held can never activate it
        assert env.gate.gs.activate(older.update_id, {}).status == "CANCELLED"
        older_runs = env.gate.gs.runs(older.update_id)
        assert all(r["status"] == "CANCELLED" for r in older_runs)
        pending = env.gate.gs.task_counts([r["batch_id"] for r in older_runs])
        assert not any(c.get("PENDING") for c in pending.values())
        if newer_passes:
            activated.append(newer.update_id)
            live_now = newer.version
    audit = env.prompts.history("p")["audit"]
    assert [r["update_id"] for r in audit if r["action"] == "activate"] == activated
    assert env.live() == live_now == 3

    # 2. a slow evaluation; the base moves under it
    env.datasets.add("slow", items(160, "slow"))
    env.gate.bind("p", "slow", thresholds=["accuracy>=0.7"], comparison="label:label")
    simulator.configure(latency={"kind": "fixed", "mean_ms": 200})
    slow = env.prompts.propose("p", BETTER)

    def under_way() -> bool:
        st = env.gate.status(slow.update_id)
        return any(r["tasks"].get("SUCCEEDED") for r in st["runs"] if r["dataset"] == "slow")

    wait_for(under_way, "the slow evaluation to be under way", timeout=60)
    env.prompts.rollback("p", to=1, reason="incident in production")
    wait_for(lambda: _decided(env, slow.update_id), "the slow candidate decided", timeout=90)
    st = env.gate.status(slow.update_id)
    assert st["status"] == "STALE", st["reason"]
    assert st["decision"]["outcome"] == "activate", "it passed, yet must not go live"
    assert env.live() == 1
    actions = [(r["action"], r["to_version"]) for r in env.prompts.history("p")["audit"]]
    assert actions[-2:] == [("rollback", 1), ("stale", slow.version)]
    assert not rows(store, "SELECT id FROM prompt_update WHERE status IN "
                           "('PENDING', 'EVALUATING')")
