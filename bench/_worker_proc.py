"""Run one lockgate worker in burst mode in this process and report JSON:
elapsed seconds, tasks finished, peak RSS. Used by the benchmarks so every
measurement gets a fresh process (like `lockgate worker --burst`)."""

from __future__ import annotations

import argparse
import resource
import time

import orjson

from lockgate.app import run_async
from lockgate.config import Settings, WorkerSettings
from lockgate.store import Store
from lockgate.worker import Worker

ap = argparse.ArgumentParser()
ap.add_argument("--db", required=True)
ap.add_argument("--concurrency", type=int, default=512)
ap.add_argument("--claim-batch", type=int, default=256)
ap.add_argument("--no-snapshots", action="store_true", help="skip prompt snapshots")
a = ap.parse_args()

store = Store(a.db)
settings = Settings(worker=WorkerSettings(concurrency=a.concurrency, claim_batch=a.claim_batch,
                                          store_snapshots=not a.no_snapshots))
worker = Worker(store, settings, burst=True)
t0 = time.perf_counter()
stats = run_async(worker.run())
elapsed = time.perf_counter() - t0
print(orjson.dumps({"elapsed_s": elapsed, "finished": stats.finished,
                    "succeeded": stats.succeeded, "retried": stats.retried,
                    "discarded": stats.discarded, "claims": stats.claims,
                    "flushes": stats.flushes,
                    "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                    }).decode())
