"""Run one lockgate worker in burst mode in this process and report JSON:
elapsed seconds, tasks finished, peak RSS. Used by the benchmarks so every
measurement gets a fresh process (like `lockgate worker --burst`)."""

from __future__ import annotations

import argparse
import resource
import time

import orjson

from lockgate.app import WorkerPlan
from lockgate.config import Settings, WorkerSettings
from lockgate.store import Store
from lockgate.worker import Worker
from lockgate.worker.loop import run_async
from lockgate.worker.processes import run_processes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--db", required=True)
    ap.add_argument("--concurrency", type=int, default=512)
    ap.add_argument("--claim-batch", type=int, default=256)
    ap.add_argument("--prefetch", type=int, help="tasks kept ready beyond the calls in flight")
    ap.add_argument("--no-snapshots", action="store_true", help="skip prompt snapshots")
    ap.add_argument("--processes", type=int, default=1,
                    help="worker processes (lockgate worker --processes); the time includes "
                         "starting them")
    ap.add_argument("--start-method", choices=["fork", "spawn"],
                    help="how the children start [fork: this process has one thread]")
    ap.add_argument("--http-client", choices=["aiohttp", "pyreqwest"],
                    help="the worker's HTTP client [its default]")
    a = ap.parse_args()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    import_cpu_s = usage.ru_utime + usage.ru_stime  # interpreter start and imports

    store = Store(a.db)
    settings = Settings(worker=WorkerSettings(
        concurrency=a.concurrency, claim_batch=a.claim_batch, prefetch=a.prefetch,
        store_snapshots=not a.no_snapshots,
        **({"http_client": a.http_client} if a.http_client else {})))
    t0 = time.perf_counter()
    if a.processes > 1:
        stats = run_processes(a.processes, WorkerPlan(a.db, settings, burst=True, gate=False),
                              release=store.close, method=a.start_method)
    else:
        stats = run_async(Worker(store, settings, burst=True).run())
    elapsed = time.perf_counter() - t0
    print(orjson.dumps({"elapsed_s": elapsed, "finished": stats.finished,
                        "succeeded": stats.succeeded, "retried": stats.retried,
                        "discarded": stats.discarded, "claims": stats.claims,
                        "flushes": stats.flushes,
                        "maxrss_mb": max(resource.getrusage(who).ru_maxrss for who in (
                            resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024,
                        "import_cpu_s": import_cpu_s,
                        "cpu_s": sum(u.ru_utime + u.ru_stime for u in (
                            resource.getrusage(resource.RUSAGE_SELF),
                            resource.getrusage(resource.RUSAGE_CHILDREN))),
                        }).decode())


if __name__ == "__main__":  # worker processes are spawned: they import this file
    main()
