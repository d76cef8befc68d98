"""kill -9 of worker processes in the middle of each role: the decision is still reached,
and it is the decision an undisturbed evaluation of the same snapshot reaches.

Materialise and finalise run one small page per transaction here (``[gate] page = 2``).
The test freezes every worker process (SIGSTOP) while it reads the rows; when it finds
the lease holder in the middle of a role (``prompt_run.leased_by``, or a task lease),
it kills exactly that process in exactly that state, else it thaws them all for a few
milliseconds and looks again. The undisturbed reference is an evaluation of an
identical snapshot (same dataset revision, candidate content and binding) taken step
by step in this process with the simulator's own answer function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from lockgate.simulator.testing import SimulatorProcess
from lockgate.store import Store
from lockgate.store.gate import GateStore

from .support import (
    DELIVERY,
    GOOD,
    MEDIOCRE,
    MODEL,
    BackgroundWorker,
    Env,
    Proc,
    Workers,
    decision_figures,
    drive,
    items,
    peek_store,
    rows,
    scalar,
    wait_for,
)

ITEMS = 120
BIND = {"thresholds": ["accuracy>=0.9", "recall>=0.9", "error_ratio<=0.05"],
        "comparison": "label:label", "positive": "yes", "confidence": 0.95}


def _holder(store: Store, workers: Workers, worker_id: str | None) -> Proc | None:
    if worker_id is None:
        return None
    pid = scalar(store, "SELECT pid FROM worker WHERE id = :w", w=worker_id)
    return next((p for p in workers.procs if p.pid == pid and p.alive()), None)


def _run_of(env: Env, update_id: int) -> dict[str, Any] | None:
    runs = env.gate.gs.runs(update_id)
    return runs[0] if runs else None


def _leased_now(run: dict[str, Any]) -> bool:
    return run["lease_until"] is not None and run["lease_until"] > run["db_now"]


@pytest.mark.slow
def test_kill_9_in_materialise_execute_and_finalise_reaches_the_same_decision(
        env: Env, store: Store, simulator: SimulatorProcess, workers: Workers) -> None:
    simulator.configure(latency={"kind": "fixed", "mean_ms": 15})
    workers.config += "page = 2\n"
    env.datasets.add("d", items(ITEMS, "d"))
    for name in ("calm", "killed"):
        env.prompts.create(name, MEDIOCRE, model_config=MODEL, delivery_rule=DELIVERY)
        env.gate.bind(name, "d", **BIND)
    # three worker processes, all up before the evaluation starts; each is killed in turn
    for _ in range(3):
        workers.start(concurrency=8, lease=1.0)
    wait_for(lambda: scalar(store, "SELECT COUNT(*) FROM worker WHERE status = 'running'")
             == 3, "three workers running", timeout=120)
    killed = env.prompts.propose("killed", GOOD)
    peek = peek_store(store)  # reads that never wait for a frozen worker's write lock
    gs = GateStore(peek)

    def run_of() -> dict[str, Any] | None:
        runs = gs.runs(killed.update_id)
        return runs[0] if runs else None

    def run_holder(predicate: Callable[[dict[str, Any]], bool]) -> Proc | None:
        run = run_of()
        if run is None or not predicate(run):
            return None
        return _holder(peek, workers, run["leased_by"])

    def materialising(r: dict[str, Any]) -> bool:
        return r["status"] == "MATERIALIZING" and r["page_cursor"] > 0 and _leased_now(r)

    def task_holder() -> Proc | None:
        run = run_of()
        if run is None or run["status"] != "EXECUTING":
            return None
        for r in rows(peek, "SELECT DISTINCT leased_by FROM task WHERE batch_id = :b AND "
                            "status = 'PENDING' AND lease_token IS NOT NULL AND "
                            f"visible_at > {store.dialect.now}", b=run["batch_id"]):
            proc = _holder(peek, workers, r["leased_by"])
            if proc is not None:
                return proc
        return None

    def finalising(r: dict[str, Any]) -> bool:
        if r["status"] != "EXECUTING" or not _leased_now(r):
            return False
        v = gs.verdict_counts([int(r["id"])])[int(r["id"])]
        return v.get("PENDING", 0) > 0 and v.get("MATCH", 0) > 0

    workers.catch(store, lambda: run_holder(materialising),
                  "a worker half-way through materialising")
    assert (run_of() or {})["status"] == "MATERIALIZING"
    workers.catch(store, task_holder, "a worker with evaluation calls in flight")
    workers.catch(store, lambda: run_holder(finalising), "a worker half-way through finalising")
    assert not [p for p in workers.procs if p.alive()], "every worker process was killed"
    finisher = BackgroundWorker(store, gate=True, lease_s=1.0)  # a fresh worker finishes
    try:
        wait_for(lambda: env.gate.status(killed.update_id)["terminal"], "the decision after "
                 "three kills", timeout=120)
    finally:
        finisher.stop()
    calm = env.prompts.propose("calm", GOOD)
    drive(env, calm.update_id)

    a, b = env.gate.status(calm.update_id), env.gate.status(killed.update_id)
    assert a["snapshot"]["candidate"]["content_hash"] == \
        b["snapshot"]["candidate"]["content_hash"]
    assert a["snapshot"]["datasets"][0]["items_hash"] == b["snapshot"]["datasets"][0][
        "items_hash"]
    assert decision_figures(b) == decision_figures(a)
    assert b["status"] == "ACTIVATED"
    run = _run_of(env, killed.update_id)
    assert run is not None
    assert env.gate.gs.verdict_counts([int(run["id"])]) == {int(run["id"]): {"MATCH": ITEMS}}
    assert scalar(store, "SELECT COUNT(*) FROM task WHERE batch_id = :b AND status = "
                         "'SUCCEEDED'", b=run["batch_id"]) == ITEMS
    # every item was materialised once and scored once, whatever the kills interrupted
    assert scalar(store, "SELECT COUNT(*) FROM prompt_run_item WHERE run_id = :r",
                  r=run["id"]) == ITEMS
    if peek is not store:
        peek.close()
