"""Workers with different configs on one database (a rolling config change): a task
whose ``model_config.endpoint`` is not in a worker's config is handed back uncalled,
its attempt not spent, for a worker that has the endpoint; it fails ``unroutable``
(never the task's own error) only when no worker with the endpoint ran for
``[worker] unroutable_after_s``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from helpers import rows, scalar
from lockgate.cli import app
from lockgate.config import Endpoint, Settings, WorkerSettings
from lockgate.gate.roles import unevaluated
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store
from lockgate.worker import Worker, WorkerStats

from .support import WorkerPool, attempts_of, status_counts, task_row, tasks

N = 6


def settings(sim: SimulatorProcess, *, new: bool, **worker: Any) -> Settings:
    """A worker's config: endpoint ``sim`` and, with ``new``, endpoint ``new`` too."""
    eps = [Endpoint(name="sim", base_url=sim.url)]
    if new:
        eps.append(Endpoint(name="new", base_url=sim.url))
    return Settings(endpoint=eps, default_endpoint="sim",
                    worker=WorkerSettings(concurrency=4, **worker))


def submit_new(store: Store, n: int = N, **retry: Any) -> None:
    """``n`` tasks that name endpoint ``new`` (submitted with a config that has it)."""
    specs = [parse_task(t) for t in tasks(n, prefix="r", model={"endpoint": "new"},
                                          retry={"max_retries": 0, **retry})]
    store.submit(specs, batch_id="rolling")


def run(store: Store, cfg: Settings, until: Callable[[Worker], bool] | None = None,
        timeout: float = 30.0) -> WorkerStats:
    """A worker in this process: in burst mode, or until ``until(worker)``, then stopped
    gracefully (what it holds is written back)."""
    async def main() -> WorkerStats:
        w = Worker(store, cfg, burst=until is None)
        job = asyncio.create_task(w.run())
        deadline = time.monotonic() + timeout
        while until is not None and not job.done() and not until(w):
            assert time.monotonic() < deadline, "worker condition not met"
            await asyncio.sleep(0.02)
        if until is not None:
            w.request_stop()
        return await asyncio.wait_for(job, timeout)
    return asyncio.run(main())


def handed_back(n: int) -> Callable[[Worker], bool]:
    """Until the worker has handled ``n`` tasks: handed back (or failed, as it did before
    the fix)."""
    return lambda w: w.stats.failed + getattr(w.stats, "unroutable", 0) >= n


def test_worker_without_the_endpoint_hands_tasks_back_uncalled(
        store: Store, db_url: str, simulator: SimulatorProcess) -> None:
    """Worker B's older config lacks endpoint ``new``: it neither calls nor fails the
    tasks (before the fix: FAILED invalid_request "not a configured endpoint", for
    good); they wait, visibly, and worker A, which has the endpoint, does them with the
    attempt budget untouched (``max_retries`` 0: one call each)."""
    submit_new(store)
    stats = run(store, settings(simulator, new=False), handed_back(N))
    assert stats.failed == 0 and stats.dead == 0
    assert status_counts(store) == {"PENDING": N}
    for r in rows(store, "SELECT * FROM task"):
        assert r["attempts"] == 0, r
        assert r["error_class"] == "unroutable", r
        assert "'new'" in r["error_message"] and "deploy the config" in r["error_message"]
        assert r["visible_at"] - r["updated_at"] >= 5_000  # handed back with a delay
    assert simulator.stats()["requests"] == 0
    assert scalar(store, "SELECT COUNT(*) FROM task_attempt") == 0  # no call, no row
    # `status` says what they wait for, not just "backing off"
    assert store.status().unroutable == N
    result = CliRunner().invoke(app, ["status", "--db", db_url])
    assert result.exit_code == 0, result.output
    assert f"unroutable: {N} task(s) wait for a worker whose config has the endpoint" \
        in " ".join(result.output.split()), result.output

    with store.engine.begin() as conn:  # (the hand-back's delay, passed)
        conn.exec_driver_sql("UPDATE task SET visible_at = 0")
    stats = run(store, settings(simulator, new=True))
    assert stats.succeeded == N
    assert status_counts(store) == {"SUCCEEDED": N}
    assert simulator.stats()["requests"] == N
    for r in rows(store, "SELECT attempts, error_class FROM task"):
        assert r == {"attempts": 1, "error_class": None}
    assert store.status().unroutable == 0


def _age_tasks(store: Store, ms: int) -> None:
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"UPDATE task SET created_at = created_at - {ms}")


def test_no_worker_with_the_endpoint_fails_unroutable_after_the_bound(
        store: Store, simulator: SimulatorProcess) -> None:
    """Submitted longer ago than ``unroutable_after_s`` and no worker with endpoint
    ``new`` in its config ran meanwhile: FAILED ``unroutable``, naming the endpoint and
    the fix, and a release-gate item that ends so was not evaluated (never counted
    against the candidate, as ``invalid_request`` was)."""
    submit_new(store)
    _age_tasks(store, 60_000)
    stats = run(store, settings(simulator, new=False, unroutable_after_s=30))
    assert stats.failed == N
    assert status_counts(store) == {"FAILED": N}
    r = task_row(store, "r-00000")
    assert r["error_class"] == "unroutable"
    assert "no worker with endpoint 'new'" in r["error_message"]
    assert "lockgate tasks retry" in r["error_message"]
    a = attempts_of(store, "r-00000")
    assert [(x["outcome"], x["error_class"]) for x in a] == [("failed", "unroutable")]
    assert simulator.stats()["requests"] == 0
    assert unevaluated(f"task FAILED: unroutable: {r['error_message']}") == "unroutable"


def test_a_worker_with_the_endpoint_alive_keeps_the_task_waiting(
        store: Store, simulator: SimulatorProcess) -> None:
    """Past the bound, but a worker whose config has endpoint ``new`` reported lately
    (it is busy with a backlog, or restarting): the task is handed back, not failed."""
    submit_new(store)
    _age_tasks(store, 60_000)
    store.register_worker("worker-a", hostname="a", pid=1, concurrency=4)
    with store.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE worker SET flow = '{\"sim\": {}, \"new\": {}}' "
                             "WHERE id = 'worker-a'")
    stats = run(store, settings(simulator, new=False, unroutable_after_s=30),
                handed_back(N))
    assert stats.failed == 0
    assert status_counts(store) == {"PENDING": N}
    assert {r["error_class"] for r in rows(store, "SELECT error_class FROM task")} == {
        "unroutable"}


def test_stop_on_unroutable_fails_at_once(store: Store, simulator: SimulatorProcess) -> None:
    """``retry_policy.stop_on: ["unroutable"]``: the task is not left to another worker."""
    submit_new(store, 2, stop_on=["unroutable"])
    stats = run(store, settings(simulator, new=False))
    assert stats.failed == 2
    r = task_row(store, "r-00000")
    assert (r["status"], r["error_class"]) == ("FAILED", "unroutable")
    assert "stop_on" in r["error_message"]


def test_mixed_fleet_does_every_task_once(store: Store, simulator: SimulatorProcess,
                                         workers: WorkerPool, tmp_path: Path) -> None:
    """Two ``lockgate worker --burst`` processes at once, one with the new config and one
    with the old (the reviewer's repro: 95 of 100 tasks FAILED invalid_request): every
    task SUCCEEDED with one call, and the old worker says what its config lacks."""
    simulator.configure(latency={"kind": "fixed", "mean_ms": 50})
    submit_new(store, 40)
    base = f'default_endpoint = "sim"\n[[endpoint]]\nname = "sim"\nbase_url = "{simulator.url}"\n'
    new = f'[[endpoint]]\nname = "new"\nbase_url = "{simulator.url}"\n'
    (tmp_path / "a.toml").write_text(base + new)
    (tmp_path / "b.toml").write_text(base)
    b = workers.start(concurrency=4, extra=("--config", str(tmp_path / "b.toml")))
    a = workers.start(concurrency=4, extra=("--config", str(tmp_path / "a.toml")))
    assert a.wait(90) == 0 and b.wait(90) == 0, workers.logs()
    assert status_counts(store) == {"SUCCEEDED": 40}
    assert simulator.stats()["requests"] == 40
    assert scalar(store, "SELECT MAX(attempts) FROM task") == 1
    assert "lacks endpoint 'new'" in b.log(), b.log()
