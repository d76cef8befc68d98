"""The garbage collector's young-generation threshold while workers run."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator

import pytest

from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store
from lockgate.worker import collector

from .support import run_worker, status_counts, tasks


@pytest.fixture
def interpreter_thresholds() -> Iterator[tuple[int, int, int]]:
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield gc.get_threshold()
    gc.set_threshold(*before)


def test_the_threshold_follows_concurrency_unless_configured() -> None:
    assert collector.young_threshold(100, None) == collector.FLOOR
    assert collector.young_threshold(4000, None) == 4000 * collector.PER_CALL
    assert collector.young_threshold(4000, 12_345) == 12_345
    assert collector.young_threshold(4000, 0) == 0


def test_nested_raises_restore_what_the_first_found(
        interpreter_thresholds: tuple[int, int, int]) -> None:
    with collector.raised_threshold(50_000):
        assert gc.get_threshold() == (50_000, 10, 10)
        with collector.raised_threshold(80_000):
            assert gc.get_threshold()[0] == 80_000
        with collector.raised_threshold(60_000):  # never lowered while a worker runs
            assert gc.get_threshold()[0] == 80_000
        assert gc.get_threshold()[0] == 80_000
    assert gc.get_threshold() == interpreter_thresholds
    with collector.raised_threshold(0):  # 0: the interpreter's own
        assert gc.get_threshold() == interpreter_thresholds


def _watch(store: Store, seen: list[tuple[int, int, int]], n: int) -> Callable[[], bool]:
    """A worker's stop condition that also records the thresholds once it has written
    results back (so it is running)."""
    def look() -> bool:
        done = status_counts(store).get("SUCCEEDED", 0)
        if done > n - 40:
            seen.append(gc.get_threshold())
        return done == n
    return look


def test_a_worker_raises_the_threshold_while_it_runs_and_restores_it(
        store: Store, simulator: SimulatorProcess,
        interpreter_thresholds: tuple[int, int, int]) -> None:
    simulator.configure(latency={"kind": "fixed", "mean_ms": 20})
    store.submit([parse_task(t) for t in tasks(40)], batch_id="b")
    seen: list[tuple[int, int, int]] = []
    run_worker(store, until=_watch(store, seen, 40), concurrency=8)
    assert seen and all(t == (collector.FLOOR, 10, 10) for t in seen), seen
    assert gc.get_threshold() == interpreter_thresholds

    store.submit([parse_task(t) for t in tasks(40, prefix="u")], batch_id="c")
    seen.clear()
    run_worker(store, until=_watch(store, seen, 80), concurrency=8, gc_threshold=0)
    assert seen and all(t == interpreter_thresholds for t in seen), seen
