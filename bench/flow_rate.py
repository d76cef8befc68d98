"""Rate accuracy: how close do worker processes sharing one endpoint limit get to it,
and how many 429s do they draw? (docs/benchmarks.md, "Flow control")

    python bench/flow_rate.py --workers 4 --tasks 20000 --rpm 60000 --runs 2
    python bench/flow_rate.py --workers 8 --tasks 8000 --rpm 60000

The worker processes always start at the same instant (a cold start of all of them is
the burst the shared bucket must absorb).

The simulator enforces a sliding window of ``--window`` seconds (the per-minute limit
scaled to it: 60,000 RPM is 10,000 per 10 s) for requests and for tokens. Tasks come
in blocks of short and long inputs, so the request limit binds in one block and the
token limit in the next. Every 0.5 s the simulator's counters are sampled; the achieved
rate is the admitted requests (and tokens) per second over the steady part, divided by
the limit that binds in that part.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
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
    spread,
    submit,
    task_line,
    write_config,
)
from _proxy import RecordingProxy
from lockgate.simulator.testing import SimulatorProcess


def workload(n: int, block: int) -> list[dict[str, Any]]:
    return [task_line(i, "rate", long=(i // block) % 2 == 1) for i in range(n)]


def utilisation(samples: list[tuple[float, dict[str, Any]]], req_per_s: float,
                tok_per_s: float | None) -> dict[str, Any]:
    """Per 1-second step: admitted requests and tokens over their limits; the binding
    one is the larger share. Steady part: from the first second at 50% until the last
    one at 50% (the ramp-up and the drain at the end are excluded)."""
    pts = [(t, s["requests"] - s["by_outcome"].get("rate_limited", 0),
            s["tokens"]["total"]) for t, s in samples]
    steps = []
    for i in range(len(pts)):
        j = next((k for k in range(i, len(pts)) if pts[k][0] - pts[i][0] >= 1.0), None)
        if j is None:
            break
        dt = pts[j][0] - pts[i][0]
        r = (pts[j][1] - pts[i][1]) / dt / req_per_s
        k = (pts[j][2] - pts[i][2]) / dt / tok_per_s if tok_per_s else 0.0
        steps.append((pts[i][0], r, k, max(r, k)))
    busy = [i for i, s in enumerate(steps) if s[3] >= 0.5]
    steady = steps[busy[0]:busy[-1] + 1] if busy else []
    if not steady:
        return {"steady_s": 0.0, "achieved": 0.0, "req_share": 0.0, "tok_share": 0.0,
                "req_bound_s": 0, "tok_bound_s": 0}
    return {
        "steady_s": round(steady[-1][0] - steady[0][0] + 1, 1),
        "achieved": sum(s[3] for s in steady) / len(steady),
        "req_share": sum(s[1] for s in steady) / len(steady),
        "tok_share": sum(s[2] for s in steady) / len(steady),
        # (steps start every sampling period, 0.5 s)
        "req_bound_s": sum(1 for s in steady if s[1] >= s[2]) * 0.5,
        "tok_bound_s": sum(1 for s in steady if s[2] > s[1]) * 0.5,
        "max_step": max(s[3] for s in steady),
    }


def one_run(a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    per_window_req = int(a.rpm * a.window / 60)
    per_window_tok = int(a.tpm * a.window / 60) if a.tpm else None
    sim_cfg = {"rpm": per_window_req, "tpm": per_window_tok, "window_s": a.window,
               "latency": {"kind": "fixed", "mean_ms": a.latency_ms}}
    with SimulatorProcess(sim_cfg) as sim, contextlib.ExitStack() as stack:
        proxy = stack.enter_context(RecordingProxy(sim.base_url)) if a.proxy else None
        url = fresh_db(a.backend, tmp)
        lines = workload(a.tasks, a.block)
        for i in range(0, len(lines), a.block):  # one submit per block: claimed in order
            submit(url, lines[i:i + a.block], "rate")
        cfg = write_config(tmp / "flow.toml", [{
            "name": "sim", "base_url": proxy.url if proxy else sim.url, "rpm": per_window_req,
            **({"tpm": per_window_tok} if per_window_tok else {}),
            "limit_window_s": a.window, "max_concurrency": a.concurrency}],
            flow={"headroom": a.headroom})
        workers = Workers()
        sampler = Sampler(sim, db_url=url)
        sampler.start()
        t0 = time.monotonic()
        workers.start(a.workers, url, cfg, concurrency=a.concurrency, log_dir=tmp)
        codes = workers.wait(a.timeout)
        elapsed = time.monotonic() - t0
        time.sleep(0.6)
        sampler.stop()
        stats = sim.stats()
        sent = sorted(e["t"] for e in proxy.log) if proxy else []
    max_sent = max((bisect.bisect_left(sent, t + a.window) - i for i, t in enumerate(sent)),
                   default=None)
    # Most requests the shared bucket granted in any window (from the row's counter,
    # sampled every 0.5 s, so within one sample of exact).
    g = sampler.grants
    gt = [t for t, _n in g]
    max_granted = max((g[max(0, bisect.bisect_left(gt, t + a.window) - 1)][1] - n
                       for t, n in g), default=None)
    if a.keep:
        (tmp / "samples.json").write_bytes(orjson.dumps(sampler.samples))
        (tmp / "buckets.json").write_bytes(orjson.dumps(sampler.buckets))
    u = utilisation(sampler.samples, per_window_req / a.window,
                    per_window_tok / a.window if per_window_tok else None)
    limited = stats["by_outcome"].get("rate_limited", 0)
    prev = 0
    when_429 = []
    for t, smp in sampler.samples:
        n = smp["by_outcome"].get("rate_limited", 0)
        if n > prev:
            when_429.append((round(t, 1), n - prev))
        prev = n
    tok = stats["tokens"]["total"] / max(1, stats["successes"])
    return {"max_sent_in_window": max_sent, "max_granted_in_window": max_granted,
            "window_limit": per_window_req,
            "max_sim_stall_s": round(sampler.max_call_s, 2), "when_429": when_429,
            "tokens_per_task": round(tok, 1), "exit_codes": codes,
            "elapsed_s": round(elapsed, 1), "requests": stats["requests"],
            "rate_limited": limited, "share_429": limited / max(1, stats["requests"]),
            "limited_by": stats.get("limited_by", {}),
            "successes": stats["successes"], **u}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="postgresql")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--tasks", type=int, default=20_000)
    ap.add_argument("--rpm", type=int, default=60_000, help="requests per minute")
    ap.add_argument("--tpm", type=int, default=6_000_000, help="tokens per minute (0: none)")
    ap.add_argument("--window", type=float, default=10.0, help="simulator window, seconds")
    ap.add_argument("--block", type=int, default=2500, help="tasks per short/long block")
    ap.add_argument("--latency-ms", type=float, default=50.0)
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--headroom", type=float, default=0.02)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", type=Path, help="append results here")
    ap.add_argument("--keep", type=Path, help="keep worker logs in this directory")
    ap.add_argument("--proxy", action="store_true",
                    help="record send times through a proxy: the most requests sent in "
                         "any window, on the workers' side of the wire")
    a = ap.parse_args()
    print(f"machine {machine()}; {a.workers} workers, {a.tasks} tasks, {a.rpm} RPM, "
          f"{a.tpm} TPM, window {a.window:g}s, backend {a.backend}", flush=True)
    results = []
    for run in range(a.runs):
        with run_dir(a.keep, f"run{run}") as tmp:
            r = one_run(a, tmp)
        results.append(r)
        print(f"run {run + 1}: achieved {r['achieved']:.1%} of the binding limit over "
              f"{r['steady_s']}s (requests {r['req_share']:.1%}, tokens {r['tok_share']:.1%}; "
              f"max 1-s step {r.get('max_step', 0):.1%}); 429s {r['rate_limited']} of "
              f"{r['requests']} ({r['share_429']:.2%}, by {r['limited_by']}); "
              f"elapsed {r['elapsed_s']}s; "
              f"requests bind {r['req_bound_s']}s, tokens {r['tok_bound_s']}s; "
              f"exit codes {r['exit_codes']}; tokens/task {r['tokens_per_task']}; "
              f"429s at (s, n) {r['when_429'][:12]}; most granted in a window "
              f"{r['max_granted_in_window']}, sent {r['max_sent_in_window']}, of "
              f"{r['window_limit']}; longest stats call "
              f"{r['max_sim_stall_s']}s", flush=True)
    print(f"achieved: {spread([r['achieved'] * 100 for r in results])} %; "
          f"429 share: {spread([r['share_429'] * 100 for r in results])} %")
    if a.json:
        with a.json.open("ab") as fh:
            args = vars(a) | {"json": None, "keep": None}
            fh.write(orjson.dumps({"bench": "flow_rate", "args": args, "machine": machine(),
                                   "runs": results}) + b"\n")


if __name__ == "__main__":
    main()
