"""A provider at a window's limit that names nothing, and the breaker's message during a
long failure (docs/flow.md, "Learning from the provider" and "When an endpoint is
down"). The real simulator, real workers, a real database.

A window limit whose 429s name nothing (no header, no Retry-After) refuses every call
until the window frees: before, each refusal paused the endpoint for the fixed
``default_pause_s``, every pause ended with a pace's worth of calls all refused, and
each refusal spent its task's attempt (a mock allowing 300 calls per 30 s window: 117 of
1,200 tasks DEAD ``rate_limited``, 54 % of the calls refused). Now the pauses of such a
run grow, one call probes after each, and the run's 429s spend no attempt.

The breaker's "still failing after N s" restarted its count at a half-open probe that
was answered (a success does not close a breaker whose other probes fail): "still failing
after 0 s" 35 s into a failure.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable

import pytest

from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store
from lockgate.worker import Worker

from .support import rows, run_workers, settings, status_counts, tasks

N = 60
RPM = 20  # calls per WINDOW_S, then every call is refused until the window frees
WINDOW_S = 4.0


def test_a_window_limit_that_names_nothing_ends_no_task_dead(
        stores: Callable[[], Store], simulator: SimulatorProcess) -> None:
    simulator.configure(rpm=RPM, window_s=WINDOW_S, header_style="none",
                        limit_headers_on_429=False, retry_hint="none",
                        latency={"kind": "fixed", "mean_ms": 50})
    store = stores()
    store.submit([parse_task(t) for t in tasks(N, retry={"max_retries": 1})], batch_id="b")
    cfg = settings([{"name": "sim", "base_url": simulator.url}], concurrency=32)
    asyncio.run(run_workers([Worker(stores(), cfg, burst=True)], timeout=240))
    sim = simulator.stats()
    assert sim["limited_by"].get("requests", 0) > 0, sim  # the limit was met
    counts = status_counts(store)
    assert counts == {"SUCCEEDED": N}, (counts, sim["by_outcome"])
    spent = rows(store, "SELECT COUNT(*) AS n FROM task_attempt WHERE outcome <> 'succeeded' "
                        "AND outcome <> 'first_429'")
    assert spent[0]["n"] == 0, rows(store, "SELECT outcome, COUNT(*) AS n FROM task_attempt "
                                           "GROUP BY outcome")
    # After each pause one call probes: the refusals are far fewer than the calls
    # answered (before: more than half of all calls).
    refused = rows(store, "SELECT COUNT(*) AS n FROM task_attempt WHERE outcome = 'first_429'")
    assert refused[0]["n"] < N, refused


def test_the_breaker_counts_a_failure_from_its_start_until_it_closes(
        stores: Callable[[], Store], simulator: SimulatorProcess,
        caplog: pytest.LogCaptureFixture) -> None:
    # Most calls fail: a half-open breaker's probes are answered now and then, but one
    # of them failing opens it again. The breaker opens no sooner than breaker_open_s
    # (1 s) after the failures began: "still failing after 0 s" cannot be right.
    simulator.configure(rate_500=0.6, latency={"kind": "fixed", "mean_ms": 20})
    store = stores()
    store.submit([parse_task(t) for t in tasks(100, retry={"max_retries": 50,
                                                          "base_delay_ms": 10})],
                 batch_id="b")
    cfg = settings([{"name": "sim", "base_url": simulator.url}], concurrency=8,
                   flow={"breaker_open_s": 1.0, "breaker_max_open_s": 1.0,
                         "breaker_consecutive": 3, "breaker_probes": 3})
    caplog.set_level(logging.WARNING, logger="lockgate.flow")
    asyncio.run(run_workers([Worker(stores(), cfg, burst=True)], until=_reopened(caplog),
                            timeout=120))
    said = [r.getMessage() for r in caplog.records if "still failing after" in r.getMessage()]
    assert len(said) >= 3, said
    after = [int(m) for s in said for m in re.findall(r"still failing after (\d+) s", s)]
    assert min(after) >= 1, said


def _reopened(caplog: pytest.LogCaptureFixture) -> Callable[[], Awaitable[bool]]:
    async def until() -> bool:
        return sum("still failing after" in r.getMessage() for r in caplog.records) >= 12

    return until
