"""Adaptive concurrency in a running worker: a latency spike with errors halves the
limit, which comes back afterwards, and no task is lost.

The limit lives in the worker's memory and the database only holds the tasks, so this
runs on SQLite alone (the claims and write-backs it uses are exercised on every backend
by the other scenarios).
"""

from __future__ import annotations

import asyncio

import pytest

from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store
from lockgate.worker import Worker

from .support import rows, run_workers, settings, status_counts, tasks

N = 2500


@pytest.mark.parametrize("policy", ["rule", "gradient"])
def test_a_latency_spike_halves_concurrency_which_recovers_after_and_nothing_is_lost(
        sqlite_store: Store, simulator: SimulatorProcess, policy: str) -> None:
    store = sqlite_store
    normal = {"kind": "fixed", "mean_ms": 150}
    simulator.configure(latency=normal)
    # Enough tasks that the worker is never short of work (a worker without work does
    # not grow its limit): about 200/s before and after the spike, for a few seconds.
    store.submit([parse_task(t) for t in tasks(N, retry={"max_retries": 20})],
                 batch_id="b")
    cfg = settings([{"name": "sim", "base_url": simulator.url, "max_concurrency": 32,
                     "min_concurrency": 2, "concurrency_policy": policy}],
                   flow={"adjust_interval_s": 0.3, "min_samples": 8}, concurrency=64)
    w = Worker(store, cfg, burst=True)
    # The rule climbs back to the maximum; the gradient policy settles near it (on a
    # busy machine its latency samples are noisy), so "recovered" is 7/8 of it there.
    back = 32 if policy == "rule" else 28
    limits: list[tuple[str, int]] = []
    phase = {"now": "before", "since": 0.0}

    async def tick(elapsed: float) -> None:
        st = w.flow.states.get("sim")
        if st is None:
            return
        limit = st.adaptive.slots
        limits.append((phase["now"], limit))
        if phase["now"] == "before" and elapsed > 1.0:
            phase.update(now="spike", since=elapsed)
            await asyncio.to_thread(simulator.configure, rate_500=0.1,
                                    latency={"kind": "fixed", "mean_ms": 2500})
        elif phase["now"] == "spike" and (limit <= 16 or elapsed - phase["since"] > 30):
            phase.update(now="after", since=elapsed)
            await asyncio.to_thread(simulator.configure, rate_500=0.0, latency=normal)
        elif phase["now"] == "after" and (limit >= back or elapsed - phase["since"] > 40):
            phase["now"] = "done"

    async def done() -> bool:
        return phase["now"] == "done"

    asyncio.run(run_workers([w], until=done, tick=tick, timeout=120))
    before = [n for p, n in limits if p == "before"]
    spike = [n for p, n in limits if p == "spike"]
    assert max(before) == 32
    assert min(spike) <= 16, "the limit did not fall by half during the spike"
    after = [n for p, n in limits if p == "after"]
    assert max(after) >= back, "the limit did not recover"
    # Nothing lost: drain the rest with a fast, healthy provider.
    simulator.configure(latency={"kind": "fixed", "mean_ms": 0})
    w2 = Worker(store, cfg, burst=True)
    asyncio.run(run_workers([w2], timeout=120))
    assert status_counts(store) == {"SUCCEEDED": N}
    (wr,) = rows(store, f"SELECT concurrency_limit, flow FROM worker WHERE id = '{w.id}'")
    assert wr["concurrency_limit"] is not None and f'"policy":"{policy}"' in wr["flow"]
