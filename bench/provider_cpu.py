"""The CPU of one chat-completion call through lockgate's provider alone
(``OpenAICompatible.complete`` with the aiohttp client): no claim, render, parse or
write-back, so a change to the HTTP layer is seen apart from the rest of a worker.

    python bench/provider_cpu.py --calls 20000 --rounds 3
    python bench/provider_cpu.py --vs /tmp/old/src        # A/B: this tree / that one

One simulator (0 ms latency) serves every run. Each run is a fresh process that makes
500 calls to warm up, then ``--calls`` calls with ``--concurrency`` in flight on uvloop,
and reports the CPU (user + system, from the kernel) it spent on them per call. With
``--vs`` the trees alternate, A B A B, and the ratio is taken pair by pair.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
sys.path.insert(0, str(HERE))
from lockgate.simulator.testing import SimulatorProcess  # noqa: E402

#: The child: N calls through the provider of the tree on its PYTHONPATH.
CHILD = r"""
import asyncio, resource, sys
import uvloop
from lockgate.providers.base import CompletionRequest
from lockgate.providers.openai import OpenAICompatible

url, calls, concurrency = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

async def main():
    provider = OpenAICompatible("sim", url)
    gate = asyncio.Semaphore(concurrency)

    async def one(i):
        async with gate:
            await provider.complete(CompletionRequest(
                messages=[{"role": "user", "content": f"Classify: parcel {i} arrived broken"}],
                model="sim-small", timeout_s=30, params={"max_tokens": 32},
                idempotency_key=f"k-{i}"))

    await asyncio.gather(*(one(i) for i in range(500)))
    before = resource.getrusage(resource.RUSAGE_SELF)
    await asyncio.gather(*(one(i) for i in range(calls)))
    after = resource.getrusage(resource.RUSAGE_SELF)
    await provider.close()
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    print(cpu / calls * 1e6)

uvloop.run(main())
"""


def run(tree: Path, url: str, calls: int, concurrency: int) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, url, str(calls), str(concurrency)],
                         env={**os.environ, "PYTHONPATH": str(tree)},
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{tree}: the provider's run failed:\n{out.stderr[-2000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--vs", type=Path, help="another tree's src folder (A/B)")
    a = ap.parse_args()
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}, load {os.getloadavg()[0]:.1f}; {a.calls:,} calls, "
          f"{a.concurrency} in flight, 0 ms model")
    this: list[float] = []
    other: list[float] = []
    with SimulatorProcess({"latency": {"kind": "fixed", "mean_ms": 0}}) as sim:
        for r in range(1, a.rounds + 1):
            this.append(run(SRC, sim.url, a.calls, a.concurrency))
            print(f"round {r} this: {this[-1]:7.1f} µs/call", flush=True)
            if a.vs:
                other.append(run(a.vs, sim.url, a.calls, a.concurrency))
                print(f"round {r} vs  : {other[-1]:7.1f} µs/call", flush=True)
    print(f"this: median {statistics.median(this):.1f} µs/call "
          f"(min {min(this):.1f}, max {max(this):.1f})")
    if other:
        ratios = [x / y for x, y in zip(this, other, strict=True)]
        print(f"vs: median {statistics.median(other):.1f} µs/call "
              f"(min {min(other):.1f}, max {max(other):.1f})")
        print(f"this/vs: median {statistics.median(ratios):.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f}, {len(ratios)} pairs)")


if __name__ == "__main__":
    main()
