"""A per-minute limit enforced per second: how much of it do workers use, and how many
429s do they draw? (docs/benchmarks.md, "Limits enforced per second"; docs/flow.md)

    python bench/flow_enforced.py                       # every case below, once
    python bench/flow_enforced.py --mode configured --workers 4 --tasks 30000
    python bench/flow_enforced.py --mode learned --headers gateway --workers 1

The simulator allows 60,000 requests per minute (``--rpm``) and enforces them as 1,000
in any 1 s sliding window (``--enforce-s``), answering after ``--latency-ms`` (100 ms).
``configured``: the endpoint declares ``rpm = 60000`` (per minute, as a provider
publishes it). ``learned``: it declares no limit; the workers learn it from the
answers' headers, ``openai`` style (limit, remaining, reset) or ``gateway`` style
(limit and remaining, no reset, as LiteLLM's proxy sends them), and from
``retry-after-ms`` on 429s.

The tasks are submitted first (timed), then 1 or 4 ``lockgate worker`` processes start
together and run until the queue is empty. Reported per run:

* ``processing``: requests the simulator admitted per second, from the first request to
  the last, over the enforced limit (1,000/s);
* ``with submit``: tasks succeeded over the limit times (submit + processing time);
* 429s (count and share of all requests), the most requests received in any 1 s
  (refused ones included; the limit is 1,000), duplicate successes (a task answered
  twice), and tasks not DONE.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _flow_common import (
    Sampler,
    Workers,
    fresh_db,
    machine,
    run_dir,
    submit,
    task_line,
    write_config,
)
from lockgate.simulator.testing import SimulatorProcess
from lockgate.store import Store

CASES = [("configured", "openai", 1), ("configured", "openai", 4),
         ("learned", "openai", 1), ("learned", "openai", 4),
         ("learned", "gateway", 1), ("learned", "gateway", 4)]


def processing_rate(stats: dict[str, Any]) -> tuple[float, float]:
    """(admitted requests per second, seconds) from the simulator's first request to its
    last, as the simulator timed them (a sampler would be off by its period at each
    end)."""
    first, last = stats.get("first_request_s"), stats.get("last_request_s")
    if first is None or last is None or last <= first:
        return 0.0, 0.0
    admitted = stats["requests"] - stats["by_outcome"].get("rate_limited", 0)
    return admitted / (last - first), last - first


def not_done(url: str, batch: str) -> int:
    s = Store(url)
    try:
        return sum(n for state, n in s.batch_counts(batch).items() if state != "SUCCEEDED")
    finally:
        s.close()


def one_run(a: argparse.Namespace, mode: str, headers: str, workers_n: int,
            tmp: Path) -> dict[str, Any]:
    limit_s = a.rpm * a.enforce_s / 60.0
    sim_cfg = {"rpm": a.rpm, "window_s": 60.0, "enforce_s": a.enforce_s,
               "header_style": headers, "latency": {"kind": "fixed", "mean_ms": a.latency_ms}}
    with SimulatorProcess(sim_cfg) as sim:
        url = fresh_db(a.backend, tmp, "lockgate_flow_enforced")
        lines = [task_line(i, "enf") for i in range(a.tasks)]
        t_submit = time.monotonic()
        submit(url, lines, "enf")
        submit_s = time.monotonic() - t_submit
        ep: dict[str, Any] = {"name": "sim", "base_url": sim.url,
                              "max_concurrency": a.concurrency}
        if mode == "configured":
            ep["rpm"] = a.rpm
        cfg = write_config(tmp / "flow.toml", [ep])
        workers = Workers()
        sampler = Sampler(sim, period=0.25)
        sampler.start()
        t0 = time.monotonic()
        workers.start(workers_n, url, cfg, concurrency=a.concurrency, log_dir=tmp)
        codes = workers.wait(a.timeout)
        work_s = time.monotonic() - t0
        time.sleep(0.5)
        sampler.stop()
        stats = sim.stats()
        left = not_done(url, "enf")
    if a.keep:
        (tmp / "samples.json").write_bytes(orjson.dumps(sampler.samples))
    rate, span = processing_rate(stats)
    limited = stats["by_outcome"].get("rate_limited", 0)
    return {
        "mode": mode, "headers": headers, "workers": workers_n, "tasks": a.tasks,
        "submit_s": round(submit_s, 2), "work_s": round(work_s, 2),
        "processing_s": round(span, 2),
        "processing": rate / limit_s,
        "with_submit": stats["tasks_succeeded"] / (limit_s * (submit_s + work_s)),
        "requests": stats["requests"], "rate_limited": limited,
        "share_429": limited / max(1, stats["requests"]),
        "peak_1s": stats.get("peak_requests_1s"), "limit_1s": limit_s,
        "duplicates": stats["duplicate_successes"], "not_done": left, "exit_codes": codes,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("configured", "learned"),
                    help="one case (default: every case)")
    ap.add_argument("--headers", choices=("openai", "gateway", "none"), default="openai",
                    help="none: no rate-limit header, the limit shown by 429s alone")
    ap.add_argument("--workers", type=int, help="with --mode: worker processes [1]")
    ap.add_argument("--backend", default="postgresql")
    ap.add_argument("--tasks", type=int, default=30_000)
    ap.add_argument("--rpm", type=int, default=60_000, help="requests per minute")
    ap.add_argument("--enforce-s", type=float, default=1.0)
    ap.add_argument("--latency-ms", type=float, default=100.0)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", type=Path, help="append results here")
    ap.add_argument("--keep", type=Path, help="keep worker logs in this directory")
    a = ap.parse_args()
    cases = [(a.mode, a.headers, a.workers or 1)] if a.mode else CASES
    print(f"machine {machine()}; {a.tasks} tasks, {a.rpm} RPM enforced per "
          f"{a.enforce_s:g}s, latency {a.latency_ms:g} ms, backend {a.backend}", flush=True)
    print("| limit | headers | workers | processing | with submit | 429s | peak in 1 s "
          "| duplicates | not done |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    results = []
    for mode, headers, n in cases:
        with run_dir(a.keep, f"{mode}-{headers}-{n}") as tmp:
            r = one_run(a, mode, headers, n, tmp)
        results.append(r)
        print(f"| {mode} | {headers if mode == 'learned' else '-'} | {n} "
              f"| {r['processing']:.1%} | {r['with_submit']:.1%} "
              f"| {r['rate_limited']} ({r['share_429']:.2%}) | {r['peak_1s']} "
              f"| {r['duplicates']} | {r['not_done']} |", flush=True)
    if a.json:
        with a.json.open("ab") as fh:
            args = vars(a) | {"json": None, "keep": None}
            fh.write(orjson.dumps({"bench": "flow_enforced", "args": args,
                                   "machine": machine(), "runs": results}) + b"\n")


if __name__ == "__main__":
    main()
