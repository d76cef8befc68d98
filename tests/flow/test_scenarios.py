"""Flow control end to end: workers, the simulator and a real database on every backend.

Each scenario asserts behaviours (no burst over the limit as the simulator counts it, no
call before Retry-After, limits that fall and recover, fallback without loss, order of
completion, window boundaries), never timings; the figures live in bench/flow_*.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from lockgate.flow.window import BatchPlan, Window
from lockgate.providers.openai import OpenAICompatible
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store
from lockgate.worker import Worker

from .support import Recording, rows, run_workers, settings, status_counts, tasks


def submit(store: Store, specs: list[dict[str, Any]], batch: str,
           plan: BatchPlan | None = None, pool: str = "default") -> None:
    store.submit([parse_task(t) for t in specs], batch_id=batch, pool_of=lambda _s: pool,
                 batch_fields=plan.fields() if plan else None)


def test_eight_workers_starting_at_once_never_burst_over_the_shared_limit(
        stores: Callable[[], Store], simulator: SimulatorProcess) -> None:
    limit, window = 200, 5.0
    simulator.configure(rpm=limit, window_s=window, latency={"kind": "fixed", "mean_ms": 5})
    store = stores()
    submit(store, tasks(260), "b")
    cfg = settings([{"name": "sim", "base_url": simulator.url, "rpm": limit,
                     "limit_window_s": window}], flow={"headroom": 0.1}, concurrency=32)
    workers = [Worker(stores(), cfg, burst=True) for _ in range(8)]
    stats = asyncio.run(run_workers(workers, timeout=120))

    sim = simulator.stats()
    assert sim["by_outcome"].get("rate_limited", 0) == 0, sim["by_outcome"]
    assert status_counts(store) == {"SUCCEEDED": 260}
    assert sum(s.succeeded for s in stats) == 260
    assert sim["requests"] == 260
    assert sum(1 for s in stats if s.succeeded) >= 2, "the budget was shared, not hoarded"


def test_no_worker_calls_before_the_time_a_429_named(
        stores: Callable[[], Store], simulator: SimulatorProcess) -> None:
    """Worker A meets 429s naming 2.5 s; then the provider is healthy again and worker B
    starts. Neither may call the endpoint before the named time: A by its own pause, B
    through the pause A shared in the database."""
    retry_ms = 2500
    simulator.configure(rate_429=1.0, retry_after_ms=retry_ms)
    store = stores()
    submit(store, tasks(40, retry={"base_delay_ms": 10, "jitter": 0.0}), "b")
    cfg = settings([{"name": "sim", "base_url": simulator.url}], concurrency=8)
    log: list[dict[str, Any]] = []

    def worker(who: str) -> Worker:
        prov = Recording(OpenAICompatible("sim", simulator.url), log, who)
        return Worker(stores(), cfg, burst=True, providers={"sim": prov})

    async def scenario() -> None:
        a = worker("A")
        job_a = asyncio.create_task(run_workers([a], timeout=60))
        while not any(e.get("status") == 429 for e in log):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.3)  # A publishes its pause
        await asyncio.to_thread(simulator.configure, rate_429=0.0)
        b = worker("B")
        await asyncio.gather(job_a, run_workers([b], timeout=60))

    asyncio.run(scenario())
    limited = [e for e in log if e.get("status") == 429]
    assert limited and all(e["who"] == "A" for e in limited)
    for e in limited:
        named = e["done"] + e["retry_after_ms"] / 1000.0
        early = [x for x in log if e["done"] < x["sent"] < named]
        assert not early, f"{len(early)} call(s) before the time a 429 named"
    assert any(x["who"] == "B" for x in log), "B made no call at all"
    assert status_counts(store) == {"SUCCEEDED": 40}
    (row,) = rows(store, "SELECT pause_reason FROM rate_limit WHERE name = 'sim'")
    assert row["pause_reason"] == "rate_limited"


@pytest.fixture(scope="module")
def local_model() -> Iterator[SimulatorProcess]:
    """A second provider: the fallback (think: a local model behind Ollama)."""
    with SimulatorProcess({"latency": {"kind": "fixed", "mean_ms": 20}}) as sim:
        yield sim


def test_quota_exhaustion_moves_traffic_to_the_fallback_and_back_without_loss(
        stores: Callable[[], Store], simulator: SimulatorProcess,
        local_model: SimulatorProcess) -> None:
    simulator.configure(latency={"kind": "fixed", "mean_ms": 20})
    local_model.reset()
    store = stores()
    # A policy that stops on the refusal still takes the fallback (it is not retried:
    # it is routed, without spending an attempt).
    submit(store, tasks(400, retry={"max_retries": 1, "stop_on": ["quota_exhausted"]}), "b")
    cfg = settings([{"name": "hosted", "base_url": simulator.url, "fallback": "local",
                     "models": ["sim-complaints"]},
                    {"name": "local", "base_url": local_model.url}],
                   flow={"quota_pause_s": 0.5}, concurrency=4)
    w = Worker(stores(), cfg, burst=True)
    phase = {"now": "normal"}

    async def tick(elapsed: float) -> None:
        done = w.stats.succeeded
        if phase["now"] == "normal" and done >= 60:
            phase["now"] = "exhausted"
            await asyncio.to_thread(simulator.configure, quota_exhausted=True)
        elif phase["now"] == "exhausted" and local_model.stats()["requests"] >= 80:
            phase["now"] = "recovered"
            await asyncio.to_thread(simulator.configure, quota_exhausted=False)

    asyncio.run(run_workers([w], tick=tick, timeout=120))
    assert phase["now"] == "recovered"
    assert status_counts(store) == {"SUCCEEDED": 400}, "a task was lost or failed"
    won = rows(store, "SELECT a.endpoint, a.routed_from, a.started_at, a.id FROM task_attempt a "
                      "WHERE a.outcome = 'succeeded' ORDER BY a.id")
    by_local = [a for a in won if a["endpoint"] == "local"]
    assert len(by_local) >= 80 and all(a["routed_from"] == "hosted" for a in by_local)
    assert all(a["routed_from"] is None for a in won if a["endpoint"] == "hosted")
    last_local = max(a["id"] for a in by_local)
    assert any(a["endpoint"] == "hosted" for a in won if a["id"] > last_local), \
        "traffic did not return to the primary after it recovered"
    refused = rows(store, "SELECT outcome, error_class FROM task_attempt "
                          "WHERE error_class = 'quota_exhausted'")
    assert refused and all(r["outcome"] == "rerouted" for r in refused)


def test_a_heavier_weight_batch_finishes_first_and_the_light_one_keeps_its_share(
        stores: Callable[[], Store], simulator: SimulatorProcess) -> None:
    simulator.configure(latency={"kind": "fixed", "mean_ms": 20})
    store = stores()
    submit(store, tasks(400, prefix="low"), "low", BatchPlan(base_weight=3))
    cfg = settings([{"name": "sim", "base_url": simulator.url}], concurrency=6,
                   claim_batch=8)
    w = Worker(stores(), cfg, burst=True)
    state = {"submitted": False}

    async def tick(elapsed: float) -> None:
        if not state["submitted"] and w.stats.succeeded >= 40:
            state["submitted"] = True
            await asyncio.to_thread(submit, store, tasks(120, prefix="high"), "high",
                                    BatchPlan(base_weight=10))

    asyncio.run(run_workers([w], tick=tick, timeout=120))
    assert status_counts(store) == {"SUCCEEDED": 520}
    done = rows(store, "SELECT batch_id, finished_at FROM task ORDER BY finished_at, id")
    high = [r["finished_at"] for r in done if r["batch_id"] == "high"]
    low = [r["finished_at"] for r in done if r["batch_id"] == "low"]
    assert max(high) < max(low), "the weight-10 batch did not finish first"
    during = [t for t in low if min(high) <= t <= max(high)]
    assert during, "the weight-3 batch got nothing while the weight-10 batch ran"
    # Its share while both ran is about 3 / 13 of the calls, well below half.
    share = len(during) / (len(during) + len(high))
    assert 0.05 <= share <= 0.45, share


def test_a_window_batch_starts_at_its_window_and_is_paced_to_finish_inside_it(
        stores: Callable[[], Store], simulator: SimulatorProcess) -> None:
    store = stores()
    now = store.db_now()
    start, end = now + 1500, now + 7500
    fin = _paced_run(stores, simulator, store, start, end)
    assert fin[0] >= start, "a task ran before its window opened"
    assert fin[-1] <= end, "the batch did not finish inside its window"
    first_half = sum(1 for t in fin if t < start + (end - start) / 2)
    assert first_half <= 0.75 * len(fin), "not paced: nearly everything ran at the start"
    (b,) = rows(store, "SELECT target_per_s FROM batch WHERE id = 'w'")
    assert b["target_per_s"] is None  # set by the API when not given (see test_cli)


def test_a_window_already_open_when_a_worker_starts_is_paced_from_its_first_claim(
        stores: Callable[[], Store], simulator: SimulatorProcess) -> None:
    # A worker's first claims came before it had read the lanes: a plain claim, which
    # knows no windows, took the whole backlog of a window batch open at its start.
    store = stores()
    now = store.db_now()
    start, end = now - 1000, now + 9000
    fin = _paced_run(stores, simulator, store, start, end)
    first_half = sum(1 for t in fin if t < start + (end - start) / 2)
    assert first_half <= 0.75 * len(fin), "not paced: nearly everything ran at the start"


def _paced_run(stores: Callable[[], Store], simulator: SimulatorProcess, store: Store,
               start: int, end: int) -> list[int]:
    """150 tasks of window batch ``w`` run by one burst worker; their finish times."""
    simulator.configure(latency={"kind": "fixed", "mean_ms": 10})
    submit(store, tasks(150), "w", BatchPlan(window=Window(start, end)))
    cfg = settings([{"name": "sim", "base_url": simulator.url}],
                   flow={"pace_every_s": 0.5}, concurrency=32)
    asyncio.run(run_workers([Worker(stores(), cfg, burst=True)], timeout=60))
    assert status_counts(store) == {"SUCCEEDED": 150}
    return sorted(r["finished_at"] for r in rows(store, "SELECT finished_at FROM task"))


def test_a_pool_worker_serves_only_its_pool(stores: Callable[[], Store],
                                             simulator: SimulatorProcess) -> None:
    store = stores()
    submit(store, tasks(10, prefix="g"), "g", pool="gpu")
    submit(store, tasks(7, prefix="c"), "c", pool="cpu")
    cfg = settings([{"name": "sim", "base_url": simulator.url, "pool": "gpu"}], pool="gpu")
    w = Worker(stores(), cfg, burst=True)

    async def gpu_done() -> bool:
        return await asyncio.to_thread(
            lambda: status_counts(store, "g") == {"SUCCEEDED": 10})

    asyncio.run(run_workers([w], until=gpu_done, timeout=60))
    assert status_counts(store, "g") == {"SUCCEEDED": 10}
    assert status_counts(store, "c") == {"PENDING": 7}
    assert rows(store, "SELECT DISTINCT leased_by FROM task WHERE batch_id = 'c'") == [
        {"leased_by": None}]
