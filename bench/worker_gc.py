"""What the garbage collector costs one worker process with many calls in flight.

Runs one worker in this process (lognormal latency, mean 300 ms, 1,000 calls in flight
by default) once per young-generation threshold, each time on a fresh database, and
reports: tasks/s, collections and the time spent in them per generation, the event
loop's lag (how late a 100 ms sleep wakes up, median and worst), and the median
calls the worker had in flight (middle 60 % of the run).

    python bench/worker_gc.py --thresholds 0,50000 --rounds 2 --backend sqlite

A threshold of 0 leaves CPython's own (700); any other value is the worker's
``gc_threshold`` setting.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from engine_throughput import fresh_db, submit  # noqa: E402
from lockgate.config import Settings, WorkerSettings  # noqa: E402
from lockgate.simulator.testing import SimulatorProcess  # noqa: E402
from lockgate.store import Store  # noqa: E402
from lockgate.worker import Worker  # noqa: E402
from lockgate.worker.loop import run_async  # noqa: E402


class Collections:
    """Counts and times collections per generation through ``gc.callbacks``."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._t0 = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            g = info["generation"]
            self.count[g] += 1
            self.seconds[g] += time.perf_counter() - self._t0


def one_run(url: str, sim_url: str, tasks: int, concurrency: int,
            threshold: int) -> dict[str, Any]:
    os.environ["LOCKGATE_BASE_URL"] = sim_url
    store = Store(url)
    worker = Worker(store, Settings(worker=WorkerSettings(
        concurrency=concurrency, gc_threshold=threshold)), burst=True)
    lags: list[float] = []
    in_flight: list[int] = []
    cols = Collections()

    async def main() -> float:
        async def sample() -> None:
            loop = asyncio.get_running_loop()
            while True:
                t = loop.time()
                await asyncio.sleep(0.1)
                lags.append(loop.time() - t - 0.1)
                in_flight.append(len(worker._running))

        sampler = asyncio.create_task(sample())
        t0 = time.perf_counter()
        await worker.run()
        elapsed = time.perf_counter() - t0
        sampler.cancel()
        return elapsed

    gc.callbacks.append(cols)
    try:
        elapsed = run_async(main())
    finally:
        gc.callbacks.remove(cols)
        store.close()
    middle = in_flight[len(in_flight) // 5: len(in_flight) * 4 // 5] or in_flight
    return {"rate": tasks / elapsed, "collections": cols.count,
            "gc_s": [round(s, 3) for s in cols.seconds],
            "lag_median_ms": statistics.median(lags) * 1000, "lag_max_ms": max(lags) * 1000,
            "running_median": statistics.median(middle), "succeeded": worker.stats.succeeded}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="sqlite")
    ap.add_argument("--tasks", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=1000)
    ap.add_argument("--thresholds", default="0,50000",
                    help="young-generation thresholds to compare (0: CPython's own)")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    latency = {"kind": "lognormal", "mean_ms": 300, "sigma": 0.5}
    with tempfile.TemporaryDirectory() as td, SimulatorProcess({"latency": latency}) as sim:
        for _ in range(a.rounds):
            for threshold in (int(x) for x in a.thresholds.split(",")):
                url = fresh_db(a.backend, Path(td))
                submit(url, a.tasks)
                sim.reset()
                r = one_run(url, sim.url, a.tasks, a.concurrency, threshold)
                print(f"threshold {threshold or 'CPython'}: {r['rate']:,.0f} tasks/s, "
                      f"collections {r['collections']} taking {r['gc_s']} s, loop lag "
                      f"median {r['lag_median_ms']:.0f} ms max {r['lag_max_ms']:.0f} ms, "
                      f"calls running (median) {r['running_median']:.0f}, "
                      f"succeeded {r['succeeded']}", flush=True)


if __name__ == "__main__":
    main()
