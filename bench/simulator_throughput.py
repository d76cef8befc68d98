"""How many chat completions per second the simulator answers (0 ms latency).

Starts the simulator in a subprocess, then runs one or more client processes, each an
aiohttp session with ``--concurrency`` keep-alive requests in flight, until
``--requests`` requests are done. The prompt is a realistic classification template
(schema, allowed values, a dozen rules) with varying inputs, so the number includes
prompt splitting, rule matching and JSON serialisation, not just HTTP.

    .venv/bin/python bench/simulator_throughput.py --requests 40000 --concurrency 64

The client is Python too and shares the machine: on a 2-core box one client process
and the server each get a core, so the figure is a lower bound of the server's rate.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from lockgate.simulator.testing import SimulatorProcess

SYSTEM = """You label customer complaints.
Reply with one JSON object: {"category": "...", "emotion": 1, "summary": "..."}
- category: one of logistics, quality, refund, service, other
- emotion: integer 1-5
- summary: at most 30 characters
Rules:
- if the text mentions 快递|物流|配送|发货 then category = logistics
- if the text mentions 质量|坏了|破损|瑕疵 then category = quality
- if the text mentions 退款|退钱|退货 then category = refund
- if the text mentions 客服|态度|售后 then category = service
- otherwise category = other
- if the text mentions 气死|忍无可忍|投诉到底 then emotion = 5
- if the text mentions 非常生气|太失望 then emotion = 4
- if the text mentions 有点失望|不太满意 then emotion = 3
- if the text mentions 希望尽快|麻烦 then emotion = 2
- otherwise emotion = 1
"""

TEXTS = [
    "买的空气炸锅快递一周都没到，物流信息也不更新，气死了！",
    "收到的保温杯有明显瑕疵，质量太差了，非常生气。",
    "申请退款十天了还没到账，希望尽快处理。",
    "客服态度很差，问了三次都不回复，有点失望。",
    "会员积分突然清零了，麻烦帮我查一下。",
]


def _payload(i: int) -> bytes:
    text = f"{TEXTS[i % len(TEXTS)]}（订单 {i % 997}）"
    return orjson.dumps({
        "model": "sim-complaints",
        "temperature": 0.2,
        "max_tokens": 200,
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Complaint:\n<input>\n{text}\n</input>"},
        ],
    })


async def _client(url: str, requests: int, concurrency: int, start_at: float,
                  offset: int) -> tuple[int, int, float, float]:
    payloads = [_payload(offset + i) for i in range(997)]
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    ok = errors = 0
    next_i = 0
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one(i: int) -> bool:
            async with session.post(
                    f"{url}/chat/completions", data=payloads[i % len(payloads)],
                    headers={"Content-Type": "application/json",
                             "Authorization": "Bearer bench",
                             "Idempotency-Key": f"bench_{offset + i}:1"}) as resp:
                await resp.read()
                return resp.status == 200

        for i in range(min(concurrency, 50)):  # warm up the connections
            await one(i)
        await asyncio.sleep(max(0.0, start_at - time.time()))
        t0 = time.perf_counter()

        async def worker() -> None:
            nonlocal ok, errors, next_i
            while next_i < requests:
                i = next_i
                next_i += 1
                if await one(i):
                    ok += 1
                else:
                    errors += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        t1 = time.perf_counter()
    return ok, errors, t0, t1


def _run_client(url: str, requests: int, concurrency: int, start_at: float, offset: int,
                out: Any) -> None:
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    out.put(asyncio.run(_client(url, requests, concurrency, start_at, offset)))


def _cpu_seconds(pid: int) -> float:
    """User+system CPU time of a process (Linux); 0 where /proc is unavailable.

    Reported next to the wall-clock rate because on a shared 2-core machine the Python
    client competes with the server: CPU per request is the server's own cost.
    """
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    """Run the benchmark and print a one-line result per run."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=40_000, help="total requests")
    ap.add_argument("--concurrency", type=int, default=64, help="in flight per client")
    ap.add_argument("--clients", type=int, default=1, help="client processes")
    ap.add_argument("--latency-ms", type=float, default=0.0)
    args = ap.parse_args()
    per_client = args.requests // args.clients
    config = {"latency": {"kind": "fixed", "mean_ms": args.latency_ms}}
    with SimulatorProcess(config) as sim:
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        start_at = time.time() + 3.0
        procs = [ctx.Process(target=_run_client,
                             args=(sim.url, per_client, args.concurrency, start_at,
                                   k * per_client, out))
                 for k in range(args.clients)]
        for p in procs:
            p.start()
        time.sleep(max(0.0, start_at - time.time()))
        assert sim.proc is not None
        cpu0 = _cpu_seconds(sim.proc.pid)
        results = [out.get() for _ in procs]
        cpu1 = _cpu_seconds(sim.proc.pid)
        for p in procs:
            p.join()
        stats = sim.stats()
    ok = sum(r[0] for r in results)
    errors = sum(r[1] for r in results)
    wall = max(r[3] for r in results) - min(r[2] for r in results)
    print(f"requests={ok + errors} ok={ok} errors={errors} clients={args.clients} "
          f"concurrency={args.concurrency} latency_ms={args.latency_ms:g} "
          f"wall={wall:.2f}s rate={(ok + errors) / wall:,.0f} req/s "
          f"server_counted={stats['requests']}")
    if cpu1 > cpu0:
        per_req = (cpu1 - cpu0) / (ok + errors)
        print(f"server CPU {per_req * 1e6:.0f} us/request -> one core sustains "
              f"~{1 / per_req:,.0f} req/s")


if __name__ == "__main__":
    main()
