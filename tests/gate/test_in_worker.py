"""The gate's roles inside a real worker, against the simulator over HTTP: a better
prompt goes live, a worse one is rejected, and a burst worker stays up until the
evaluation is decided."""

from __future__ import annotations

from lockgate.simulator.testing import SimulatorProcess
from lockgate.store import Store

from .support import BAD, GOOD, MEDIOCRE, Env, accuracy_of, rows, run_worker


def test_worker_evaluates_activates_and_rejects(env: Env, store: Store,
                                                simulator: SimulatorProcess) -> None:
    env.setup(datasets={"regular": 40, "hard": 24}, thresholds=["accuracy>=0.9",
                                                                "error_ratio<=0"],
              non_inferiority=0.0)
    better = env.prompts.propose("p", GOOD)
    stats = run_worker(store, gate=True)  # burst: exits once the gate has decided
    st = env.gate.status(better.update_id)
    assert (st["status"], env.live()) == ("ACTIVATED", 2)
    runs = {(r["dataset"], r["subject"]): r for r in st["runs"]}
    assert set(runs) == {("hard", "candidate"), ("hard", "baseline"),
                         ("regular", "candidate"), ("regular", "baseline")}
    assert runs[("regular", "candidate")]["metrics"]["accuracy"] == accuracy_of(GOOD, 40)
    assert runs[("regular", "baseline")]["metrics"]["accuracy"] == accuracy_of(MEDIOCRE, 40)
    assert all(r["tasks"] == {"SUCCEEDED": r["expected_items"]} for r in runs.values())
    assert stats.succeeded == 2 * (40 + 24)
    assert simulator.stats()["requests"] == stats.succeeded

    worse = env.prompts.propose("p", BAD)
    run_worker(store, gate=True)
    st = env.gate.status(worse.update_id)
    assert (st["status"], env.live()) == ("REJECTED", 2)
    checks = {(d["dataset"], c["kind"], c["metric"]): c for d in st["decision"]["datasets"]
              for c in d["checks"]}
    live_on_snapshot = checks[("hard", "non_inferiority", "accuracy")]
    assert (live_on_snapshot["threshold"], live_on_snapshot["passed"]) == (1.0, False)
    assert not checks[("regular", "threshold", "accuracy")]["passed"]
    assert checks[("regular", "threshold", "error_ratio")]["passed"]
    traced = {r["prompt_version"] for r in rows(
        store, "SELECT DISTINCT prompt_version FROM task_attempt")}
    assert traced == {"p@1", "p@2", "p@3"}
