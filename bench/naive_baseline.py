"""The naive baseline: one asyncio process making the same calls as lockgate's worker
(same HTTP client, same request bodies), results kept in memory and nothing persisted.
Prints one JSON line: {"calls", "elapsed_s", "rate", "errors", "cpu_s"}.

    python bench/naive_baseline.py URL --tasks 20000 --concurrency 512 \
        [--style semaphore|pool] [--gc-threshold N]

Two ways of writing it:
  semaphore  (the default, as the targets specify) one coroutine per call, all gathered
             at once and bounded by a semaphore: 20,000 tasks exist from the start
  pool       ``concurrency`` coroutines that each take the next call from a shared
             iterator: never more coroutines than calls in flight
It runs with the interpreter's garbage-collector settings unless --gc-threshold sets
the young generation's (a lockgate worker raises its own while it runs).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import resource
import sys
import time

import orjson

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from lockgate.app import run_async
from lockgate.errors import ErrorClass
from lockgate.providers import CompletionRequest, OpenAICompatible, ProviderError
from workload import request_body


async def main(url: str, tasks: int, concurrency: int,
               style: str = "semaphore") -> dict[str, float]:
    client = OpenAICompatible("naive", url, max_connections=concurrency)
    sem = asyncio.Semaphore(concurrency)
    results: dict[int, str] = {}
    errors: dict[str, int] = {}

    async def call(i: int) -> None:
        body = request_body(i)
        req = CompletionRequest(messages=body["messages"], model=body["model"],
                                params={"max_tokens": body["max_tokens"]}, timeout_s=60,
                                idempotency_key=f"naive-{i}:1")
        for _ in range(5):
            try:
                results[i] = (await client.complete(req)).content
                return
            except ProviderError as exc:
                errors[exc.error_class] = errors.get(exc.error_class, 0) + 1
                if exc.error_class is ErrorClass.RATE_LIMITED:
                    await asyncio.sleep((exc.retry_after_ms or 100) / 1000)

    async def bounded(i: int) -> None:
        async with sem:
            await call(i)

    indexes = iter(range(tasks))

    async def pool_member() -> None:
        for i in indexes:
            await call(i)

    t0 = time.perf_counter()
    if style == "pool":
        await asyncio.gather(*(pool_member() for _ in range(concurrency)))
    else:
        await asyncio.gather(*(bounded(i) for i in range(tasks)))
    elapsed = time.perf_counter() - t0
    await client.close()
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {"calls": len(results), "elapsed_s": elapsed, "rate": len(results) / elapsed,
            "errors": sum(errors.values()), "cpu_s": ru.ru_utime + ru.ru_stime}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("url")
    ap.add_argument("--tasks", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=512)
    ap.add_argument("--style", choices=["semaphore", "pool"], default="semaphore")
    ap.add_argument("--gc-threshold", type=int, default=0,
                    help="young-generation GC threshold [0: the interpreter's]")
    a = ap.parse_args()
    if a.gc_threshold:
        gc.set_threshold(a.gc_threshold, *gc.get_threshold()[1:])
    print(orjson.dumps(run_async(main(a.url, a.tasks, a.concurrency, a.style))).decode())
