"""The naive baseline: one asyncio process making the same calls as lockgate's worker
(same HTTP client, same request bodies), results kept in memory and nothing persisted.
Prints one JSON line: {"calls", "elapsed_s", "rate", "errors", "cpu_s"}.

    python bench/naive_baseline.py URL --tasks 20000 --concurrency 512 \
        [--style semaphore|pool] [--gc-threshold N] \
        [--max-retries 4 --base-delay-ms 0 --cap-ms 2000] [--results FILE]

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
from lockgate.errors import ErrorClass
from lockgate.providers import CompletionRequest, OpenAICompatible, ProviderError
from lockgate.worker.loop import run_async
from workload import request_body


async def main(url: str, tasks: int, concurrency: int,
               style: str = "semaphore", max_retries: int = 4, base_delay_ms: float = 0,
               cap_ms: float = 2000, results_out: str | None = None) -> dict[str, float]:
    client = OpenAICompatible("naive", url, max_connections=concurrency)
    sem = asyncio.Semaphore(concurrency)
    results: dict[int, str] = {}
    errors: dict[str, int] = {}

    async def call(i: int) -> None:
        body = request_body(i)
        for attempt in range(max_retries + 1):
            req = CompletionRequest(messages=body["messages"], model=body["model"],
                                    params={"max_tokens": body["max_tokens"]}, timeout_s=60,
                                    idempotency_key=f"naive-{i}:{attempt + 1}")
            try:
                results[i] = (await client.complete(req)).content
                return
            except ProviderError as exc:
                errors[exc.error_class] = errors.get(exc.error_class, 0) + 1
                if exc.error_class is ErrorClass.RATE_LIMITED:
                    await asyncio.sleep((exc.retry_after_ms or 100) / 1000)
                elif base_delay_ms and attempt < max_retries:
                    await asyncio.sleep(min(cap_ms, base_delay_ms * 2 ** attempt) / 1000)

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
    if results_out:
        with open(results_out, "wb") as f:
            f.write(orjson.dumps({str(i): c for i, c in results.items()}))
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
    ap.add_argument("--max-retries", type=int, default=4, help="retries of a failed call")
    ap.add_argument("--base-delay-ms", type=float, default=0,
                    help="back-off before the first retry of an error other than 429, "
                         "doubling [0: retry at once]; a 429 waits its retry-after")
    ap.add_argument("--cap-ms", type=float, default=2000, help="longest back-off")
    ap.add_argument("--results", help="write {index: content} of every answer here (JSON)")
    a = ap.parse_args()
    if a.gc_threshold:
        gc.set_threshold(a.gc_threshold, *gc.get_threshold()[1:])
    print(orjson.dumps(run_async(main(a.url, a.tasks, a.concurrency, a.style, a.max_retries,
                                      a.base_delay_ms, a.cap_ms, a.results))).decode())
