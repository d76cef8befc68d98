"""A provider that limits the calls in flight and names no limit (the simulator's
``max_in_flight``: vLLM's queue, LiteLLM's ``max_parallel_requests``, a provisioned
deployment): a 429 with no rate-limit header for every call beyond it.

A worker knows nothing of such a limit before its first refusals: its first answers
name none, and it then sends as many calls as its concurrency at once. Those first
refusals are the provider's first word on its limit, not the tasks' doing: they are
retried without spending an attempt (outcome ``first_429``). Before, with
``max_retries = 0``, 472 of 500 tasks ended DEAD ``rate_limited`` against a limit of 20.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store
from lockgate.worker import Worker

from .support import rows, run_workers, settings, status_counts, tasks

N = 200
CAP = 10


def _run(stores: Callable[[], Store], simulator: SimulatorProcess, *, max_retries: int,
         stop_on: list[str] | None = None) -> Store:
    simulator.configure(max_in_flight=CAP, retry_hint="none", header_style="none",
                        latency={"kind": "fixed", "mean_ms": 100})
    store = stores()
    retry: dict[str, object] = {"max_retries": max_retries}
    if stop_on is not None:
        retry["stop_on"] = stop_on
    store.submit([parse_task(t) for t in tasks(N, retry=retry)], batch_id="b")
    cfg = settings([{"name": "sim", "base_url": simulator.url}], concurrency=128)
    asyncio.run(run_workers([Worker(stores(), cfg, burst=True)], timeout=180))
    return store


def test_the_first_refusals_of_a_concurrency_limit_spend_no_attempt(
        stores: Callable[[], Store], simulator: SimulatorProcess) -> None:
    store = _run(stores, simulator, max_retries=0)
    sim = simulator.stats()
    assert sim["limited_by"].get("concurrency", 0) > 0, sim  # the limit was met
    first = rows(store, "SELECT COUNT(*) AS n FROM task_attempt WHERE outcome = 'first_429'")
    assert first[0]["n"] > 0
    # Only refusals of calls sent after the first one spend attempts: with no retry
    # allowed, those tasks end DEAD; the cold start's refusals (most of them) do not.
    counts = status_counts(store)
    assert counts.get("SUCCEEDED", 0) >= N * 0.9, (counts, sim["by_outcome"])
    assert sim["duplicate_successes"] == 0


def test_a_policy_that_stops_on_rate_limits_still_stops_on_the_first_refusal(
        stores: Callable[[], Store], simulator: SimulatorProcess) -> None:
    store = _run(stores, simulator, max_retries=3, stop_on=["rate_limited"])
    refused = rows(store, "SELECT COUNT(*) AS n FROM task_attempt WHERE outcome = 'first_429'")
    assert refused[0]["n"] == 0
    counts = status_counts(store)
    assert counts.get("SUCCEEDED", 0) < N, counts  # its 429s ended tasks, as it asked
