"""The gate's roles inside a real worker, against the simulator over HTTP: a better
prompt goes live, a worse one is rejected, and a burst worker stays up until the
evaluation is decided."""

from __future__ import annotations

import asyncio

from lockgate.config import Endpoint, FlowSettings, Settings, WorkerSettings
from lockgate.errors import ErrorClass
from lockgate.gate.service import GateService
from lockgate.providers.base import Completion, CompletionRequest, ProviderError
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store
from lockgate.worker import Worker

from .support import (
    BAD,
    GOOD,
    MEDIOCRE,
    Env,
    LocalProvider,
    accuracy_of,
    rows,
    run_worker,
)


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


class _OutOfQuota(LocalProvider):
    """The simulator's answers, after refusing the first ``refusals`` calls with
    ``insufficient_quota``."""

    def __init__(self, refusals: int) -> None:
        super().__init__()
        self.refusals = refusals

    async def complete(self, request: CompletionRequest) -> Completion:
        if self.refusals > 0:
            self.refusals -= 1
            self.calls += 1
            raise ProviderError(ErrorClass.QUOTA_EXHAUSTED, "insufficient_quota (test)",
                                http_status=429)
        return await super().complete(request)


def test_an_evaluation_never_takes_the_endpoints_fallback(env: Env, store: Store) -> None:
    # While the candidate's endpoint was out of quota, its evaluation items were answered
    # by the fallback endpoint (another model) and the candidate was judged, and
    # activated, on that model's answers. Production tasks take the fallback; an
    # evaluation waits for its own endpoint.
    env.setup(datasets={"regular": 12}, thresholds=["accuracy>=0.9"])
    update = env.prompts.propose("p", GOOD)
    store.submit([parse_task({"task_id": f"prod-{k}", "prompt_template": "@registry:p",
                              "input_data": {"text": "refund?"}})
                  for k in range(12)], batch_id="production")
    primary, backup = _OutOfQuota(refusals=1), LocalProvider()
    settings = Settings(
        endpoint=(Endpoint(name="primary", base_url="http://primary.invalid/v1",
                           fallback="backup"),
                  Endpoint(name="backup", base_url="http://backup.invalid/v1")),
        flow=FlowSettings(quota_pause_s=1.0),
        worker=WorkerSettings(concurrency=8, lease_s=10.0))
    worker = Worker(store, settings, burst=True,
                    services=[GateService(store, lease_s=10.0, poll_s=0.05, idle_max_s=0.2)],
                    providers={"primary": primary, "backup": backup})  # type: ignore[dict-item]
    asyncio.run(asyncio.wait_for(worker.run(), timeout=120))
    assert env.status(update.update_id) == "ACTIVATED"
    by_batch = rows(store, "SELECT t.batch_id, a.endpoint, a.routed_from, a.outcome "
                           "FROM task_attempt a JOIN task t ON t.id = a.task_pk")
    evaluation = [r for r in by_batch if r["batch_id"].startswith("gate:")]
    assert evaluation and {r["endpoint"] for r in evaluation} == {"primary"}
    assert {r["routed_from"] for r in evaluation} == {None}
    production = [r for r in by_batch if r["batch_id"] == "production"
                  and r["outcome"] == "succeeded"]
    assert len(production) == 12
    assert {r["endpoint"] for r in production} >= {"backup"}, "the fallback still serves"
