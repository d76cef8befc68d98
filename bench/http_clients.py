"""The HTTP client of a worker's calls: lockgate's (aiohttp, on the event loop) against
pyreqwest (Rust's reqwest; connections, parsing and timeouts on a Rust thread, the
answer handed to the event loop), making the same calls to the simulator.

    python bench/http_clients.py --latency zero --concurrency 256
    python bench/http_clients.py --latency lognormal --concurrency 1000 --loop-busy 0.5

Per client and round: calls/s, CPU per call of the whole process and of the event
loop's thread, and the mean and median call latency. ``--loop-busy F`` keeps the event
loop busy a fraction F of the time, in 1 ms slices, as a worker's own work per task
(rendering, parsing, traces, write-back) keeps it busy; a baseline's loop is idle
between answers. pyreqwest is a development dependency, for this comparison only.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import resource
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import orjson

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from lockgate.providers import CompletionRequest, OpenAICompatible
from lockgate.simulator.testing import SimulatorProcess
from lockgate.worker.loop import run_async
from workload import request_body

Call = Callable[[int], Awaitable[Any]]


def aiohttp_client(url: str, concurrency: int) -> tuple[Call, Callable[[], Awaitable[None]]]:
    client = OpenAICompatible("bench", url, max_connections=concurrency)

    async def call(i: int) -> Any:
        b = request_body(i)
        return await client.complete(CompletionRequest(
            messages=b["messages"], model=b["model"], params={"max_tokens": b["max_tokens"]},
            timeout_s=60, idempotency_key=f"bench-{i}:1"))

    return call, client.close


def reqwest_client(url: str, concurrency: int) -> tuple[Call, Callable[[], Awaitable[None]]]:
    from pyreqwest.client import ClientBuilder

    client = (ClientBuilder().max_connections(concurrency)
              .default_headers({"Content-Type": "application/json"}).build())
    endpoint = url.rstrip("/") + "/chat/completions"
    timeout = timedelta(seconds=60)

    async def call(i: int) -> Any:
        body = orjson.dumps(request_body(i))
        resp = await (client.post(endpoint).body_bytes(body).timeout(timeout)
                      .header("Idempotency-Key", f"bench-{i}:1").build().send())
        data = orjson.loads(memoryview(await resp.bytes()))
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}")
        # the same answer handling as lockgate's client
        return OpenAICompatible._completion(data, resp.status, resp.headers, "sim-bench")

    return call, client.close


CLIENTS = {"aiohttp": aiohttp_client, "pyreqwest": reqwest_client}


async def measure(name: str, url: str, tasks: int, concurrency: int,
                  loop_busy: float) -> dict[str, Any]:
    call, close = CLIENTS[name](url, concurrency)
    latencies: list[float] = []
    indexes = iter(range(tasks))
    done = False

    async def member() -> None:
        for i in indexes:
            t = time.perf_counter()
            await call(i)
            latencies.append((time.perf_counter() - t) * 1000)

    async def busy() -> None:  # the loop's own work: busy F of each slice
        idle = (1 - loop_busy) / loop_busy * 0.001
        while not done:
            end = time.perf_counter() + 0.001
            while time.perf_counter() < end:
                pass
            await asyncio.sleep(idle)

    hog = asyncio.ensure_future(busy()) if loop_busy > 0 else None
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    c0, t0 = time.thread_time(), time.perf_counter()
    await asyncio.gather(*(member() for _ in range(concurrency)))
    elapsed, main_cpu = time.perf_counter() - t0, time.thread_time() - c0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    done = True
    if hog is not None:
        await hog
    await close()
    cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
    return {"client": name, "rate": tasks / elapsed, "cpu_us": cpu / tasks * 1e6,
            "loop_thread_cpu_us": main_cpu / tasks * 1e6,
            "latency_mean_ms": statistics.mean(latencies),
            "latency_median_ms": statistics.median(latencies)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency", choices=["zero", "lognormal"], default="lognormal")
    ap.add_argument("--tasks", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=1000)
    ap.add_argument("--loop-busy", type=float, default=0.0,
                    help="fraction of the time the event loop is kept busy [0]")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    if not 0 <= a.loop_busy < 1:
        raise SystemExit("--loop-busy must be at least 0 and below 1")
    latency = ({"kind": "fixed", "mean_ms": 0} if a.latency == "zero"
               else {"kind": "lognormal", "mean_ms": 300, "sigma": 0.5})
    print(f"{platform.processor() or platform.machine()}, Python {sys.version.split()[0]}; "
          f"{a.latency}, {a.concurrency} in flight, loop busy {a.loop_busy:.0%}", flush=True)
    with SimulatorProcess({"latency": latency}) as sim:
        for rnd in range(a.rounds):
            for name in CLIENTS:  # alternate: the machine's speed drifts
                sim.reset()
                r = run_async(measure(name, sim.url, a.tasks, a.concurrency, a.loop_busy))
                print(f"  round {rnd + 1} {name:9s} {r['rate']:7.0f} calls/s  CPU/call "
                      f"{r['cpu_us']:4.0f} us (event loop's thread {r['loop_thread_cpu_us']:4.0f}"
                      f" us)  latency mean {r['latency_mean_ms']:6.1f} ms, median "
                      f"{r['latency_median_ms']:6.1f} ms", flush=True)


if __name__ == "__main__":
    main()
