"""Flow-control scenarios at full length, with worker processes, the simulator and
PostgreSQL (docs/benchmarks.md, "Flow control"):

    python bench/flow_scenarios.py retry_after   # 429 + retry-after-ms for a period
    python bench/flow_scenarios.py spike [--policy gradient]
    python bench/flow_scenarios.py quota         # primary out of quota, then back
    python bench/flow_scenarios.py priority      # weight 10 submitted while weight 3 runs
    python bench/flow_scenarios.py window        # 10,000 tasks in a 2-minute window
    python bench/flow_scenarios.py claim --backend sqlite  # lane claims, 1M finished rows

Each prints its figures and appends a JSON line to bench/out/flow_scenarios.jsonl.
"""

from __future__ import annotations

import argparse
import itertools
import re
import signal
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _flow_common import (
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
from engine_throughput import fill_sql
from lockgate.simulator.testing import SimulatorProcess
from lockgate.store import Store
from lockgate.worker.execute import idempotency_key

OUT = Path(__file__).resolve().parent / "out" / "flow_scenarios.jsonl"


def q(url: str, sql: str, **params: Any) -> list[dict[str, Any]]:
    s = Store(url, pool_size=1)
    try:
        with s.engine.connect() as c:
            return [dict(r._mapping) for r in c.execute(text(sql), params)]
    finally:
        s.close()


def counts(url: str, batch: str | None = None) -> dict[str, int]:
    where = "WHERE batch_id = :b " if batch else ""
    return {r["status"]: int(r["n"]) for r in q(
        url, f"SELECT status, COUNT(*) AS n FROM task {where}GROUP BY status", b=batch)}


def wait_until(cond: Callable[[], bool], timeout: float, step: float = 0.5) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(step)
    return False


# -- Retry-After ----------------------------------------------------------------------

def retry_after(a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """429 with retry-after-ms for ``--period`` s: no call may arrive before the named
    time. Calls are attributed to workers through their idempotency key and the traces."""
    with SimulatorProcess({"latency": {"kind": "fixed", "mean_ms": 50}}) as sim, \
            RecordingProxy(sim.base_url) as proxy:
        url = fresh_db(a.backend, tmp)
        submit(url, [task_line(i, "ra") for i in range(a.tasks)], "ra")
        cfg = write_config(tmp / "ra.toml", [{"name": "sim", "base_url": proxy.url,
                                              "rpm": 60_000}])
        w = Workers()
        w.start(a.workers, url, cfg, concurrency=64, log_dir=tmp,
                extra=["--log-level", "INFO"])  # the pauses each worker learned, and when
        wait_until(lambda: len(proxy.log) > 200, 120, 0.1)
        sim.configure(rate_429=1.0, retry_after_ms=a.retry_ms)
        t_on = time.monotonic()
        time.sleep(a.period)
        sim.configure(rate_429=0.0)
        t_off = time.monotonic()
        codes = w.wait(600)
        log = [dict(e) for e in proxy.log if "status" in e]
    who = {idempotency_key(r["task_id"], r["lease_token"], r["attempt"]): r["worker_id"]
           for r in q(url, "SELECT t.task_id, a.lease_token, a.attempt, a.worker_id "
                           "FROM task_attempt a JOIN task t ON t.id = a.task_pk")}
    for e in log:
        e["who"] = who.get(e.get("key") or "")
    limited = [e for e in log if e["status"] == 429]
    same = other = 0
    lag: list[float] = []
    own_lag: list[float] = []
    for x in log:  # each call once: was it made while a 429 it should honour was running?
        own = [e["done"] for e in limited if e["who"] == x["who"]
               and e["done"] < x["t"] < e["done"] + e["retry_after_ms"] / 1000.0]
        if own:
            same += 1
            own_lag.append(x["t"] - min(own))
            continue
        others = [e["done"] for e in limited if e["who"] != x["who"]
                  and e["done"] < x["t"] < e["done"] + e["retry_after_ms"] / 1000.0]
        if others:
            other += 1
            lag.append(x["t"] - min(others))
    # When did each worker know of a pause (its own 429 or the shared row)? From its
    # log, on the wall clock (1 ms resolution), moved onto the proxy's monotonic one.
    known = learned_pauses(tmp, time.time() - time.monotonic())
    after_known: list[float] = []
    for x in log:
        # How long after its worker knew of a running pause did a call reach the proxy?
        # (A call handed to the HTTP client just before the worker learned arrives a
        # moment later; the log's clock has 1 ms steps.)
        gaps = [x["t"] - t for t, until, _shared in known.get(x["who"], [])
                if t <= x["t"] < until]
        if gaps:
            after_known.append(max(gaps))
    first_429 = min((e["done"] for e in limited), default=None)
    reach = [t - first_429 for pauses in known.values() for t, _u, shared in pauses
             if shared and first_429 is not None and t >= first_429]
    c = counts(url)
    return {"exit_codes": codes, "calls": len(log), "answered_429": len(limited),
            "period_s": round(t_off - t_on, 1), "early_same_worker": same,
            "max_lag_same_s": round(max(own_lag), 3) if own_lag else 0.0,
            "early_other_workers": other,
            "max_lag_other_s": round(max(lag), 3) if lag else 0.0,
            "calls_while_a_known_pause_ran": len(after_known),
            "of_them_over_5_ms_after": sum(1 for g in after_known if g > 0.005),
            "max_after_known_s": round(max(after_known), 4) if after_known else None,
            "pause_reached_others_after_s": round(min(reach), 3) if reach else None,
            "workers_that_learned_from_the_row": sum(
                1 for pauses in known.values() if any(sh for _t, _u, sh in pauses)),
            "succeeded": c.get("SUCCEEDED", 0), "not_succeeded": sum(c.values()) -
            c.get("SUCCEEDED", 0)}


_PAUSE_LOG = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO lockgate\.flow: "
                        r"worker (\S+): endpoint \S+ paused for (\d+) ms \(\w+\)"
                        r"(, learned from the shared row)?")


def learned_pauses(log_dir: Path, wall_minus_mono: float
                   ) -> dict[str, list[tuple[float, float, bool]]]:
    """Per worker id: (learned at, paused until, from the shared row) on the monotonic
    clock, read off the workers' INFO logs."""
    out: dict[str, list[tuple[float, float, bool]]] = {}
    for path in sorted(log_dir.glob("worker-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            m = _PAUSE_LOG.match(line)
            if not m:
                continue
            wall = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            t = wall - wall_minus_mono
            out.setdefault(m[2], []).append((t, t + int(m[3]) / 1000.0, m[4] is not None))
    return out


# -- latency spike -----------------------------------------------------------------------

def spike(a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """200 ms -> 3 s with 10% errors for ``--period`` s, then back; the workers' limits
    are sampled from their rows every second."""
    base = {"kind": "fixed", "mean_ms": 200}
    with SimulatorProcess({"latency": base}) as sim:
        url = fresh_db(a.backend, tmp)
        submit(url, [task_line(i, "sp", max_retries=20) for i in range(a.tasks)], "sp")
        cfg = write_config(tmp / "sp.toml", [{"name": "sim", "base_url": sim.url,
                                              "max_concurrency": a.max_concurrency,
                                              "min_concurrency": 2,
                                              "concurrency_policy": a.policy}],
                           flow={"report_s": 0.5})
        w = Workers()
        w.start(a.workers, url, cfg, concurrency=a.max_concurrency * 2, burst=False,
                log_dir=tmp)
        samples: list[tuple[float, str, int]] = []
        t0 = time.monotonic()

        def sample(phase: str) -> int:
            rows = q(url, "SELECT concurrency_limit FROM worker WHERE status = 'running'")
            total = sum(int(r["concurrency_limit"] or 0) for r in rows)
            samples.append((round(time.monotonic() - t0, 1), phase, total))
            return total

        wait_until(lambda: sample("before") >= a.max_concurrency * a.workers
                   and time.monotonic() - t0 > a.warmup, 180, 1.0)
        initial = samples[-1][2]
        sim.configure(rate_500=0.1, latency={"kind": "fixed", "mean_ms": 3000})
        t_spike = time.monotonic()
        while time.monotonic() - t_spike < a.period:
            sample("spike")
            time.sleep(1.0)
        sim.configure(rate_500=0.0, latency=base)
        t_back = time.monotonic()
        while time.monotonic() - t_back < a.recover_wait:
            sample("after")
            time.sleep(1.0)
        for p in w.procs:
            p.send_signal(signal.SIGTERM)
        codes = w.wait(120)
        before_stop = counts(url)
        # Nothing lost: a fast drain of what the stop released.
        sim.configure(latency={"kind": "fixed", "mean_ms": 0})
        d = Workers()
        d.start(1, url, cfg, concurrency=256, log_dir=tmp)
        d.wait(900)
    half = initial / 2
    fell = next((t for t, p, n in samples if p == "spike" and n <= half), None)
    back = next((t for t, p, n in samples if p == "after" and n >= initial), None)
    spike_at = next(t for t, p, _n in samples if p == "spike")
    after_at = next(t for t, p, _n in samples if p == "after")
    c = counts(url)
    return {"exit_codes": codes, "policy": a.policy, "initial_limit": initial,
            "min_limit_in_spike": min(n for _t, p, n in samples if p == "spike"),
            "fell_to_half_after_s": None if fell is None else round(fell - spike_at, 1),
            "recovered_after_s": None if back is None else round(back - after_at, 1),
            "at_stop": before_stop, "after_drain": c,
            "lost": a.tasks - c.get("SUCCEEDED", 0), "samples": samples}


# -- quota and fallback --------------------------------------------------------------------

def first_success(sim: SimulatorProcess, before: int, deadline: float) -> float | None:
    """When ``sim`` first answers successfully beyond ``before`` successes (or None)."""
    while time.time() < deadline:
        if sim.stats()["successes"] > before:
            return time.time()
        time.sleep(0.02)
    return None


def quota(a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    lat = {"kind": "fixed", "mean_ms": 100}
    with SimulatorProcess({"latency": lat}) as hosted, \
            SimulatorProcess({"latency": lat}) as local:
        url = fresh_db(a.backend, tmp)
        submit(url, [task_line(i, "qt", max_retries=3) for i in range(a.tasks)], "qt")
        # Both endpoints limited (--rpm), so the phases last long enough to be seen.
        cfg = write_config(tmp / "qt.toml", [
            {"name": "hosted", "base_url": hosted.url, "fallback": "local",
             "models": ["sim-bench"], "rpm": a.rpm},
            {"name": "local", "base_url": local.url, "rpm": a.rpm}],
            flow={"quota_pause_s": a.quota_pause})
        w = Workers()
        w.start(a.workers, url, cfg, concurrency=32, log_dir=tmp)
        wait_until(lambda: counts(url).get("SUCCEEDED", 0) >= a.tasks // 6, 300)
        # Takeover and return are read off the simulators' own counters (polled every
        # 20 ms): the first answer the fallback gives after the primary ran out of
        # quota, and the first the primary gives after its quota is back.
        t_out = time.time()  # (before the call: the simulator applies it on receipt)
        hosted.configure(quota_exhausted=True)
        first_local = first_success(local, local.stats()["successes"], t_out + a.period)
        time.sleep(max(0.0, t_out + a.period - time.time()))
        t_back = time.time()
        hosted.configure(quota_exhausted=False)
        first_home = first_success(hosted, hosted.stats()["successes"], t_back + 60)
        codes = w.wait(900)
    att = q(url, "SELECT endpoint, outcome, error_class FROM task_attempt")
    c = counts(url)
    by_ep: dict[str, int] = {}
    for x in att:
        if x["outcome"] == "succeeded":
            by_ep[x["endpoint"]] = by_ep.get(x["endpoint"], 0) + 1
    return {"exit_codes": codes, "counts": c, "failed_or_dead": c.get("FAILED", 0) +
            c.get("DEAD", 0), "succeeded_by_endpoint": by_ep,
            "refused_quota": sum(1 for x in att if x["error_class"] == "quota_exhausted"),
            "fallback_after_s": None if first_local is None else
            round(first_local - t_out, 2),
            "primary_again_after_s": None if first_home is None else
            round(first_home - t_back, 2), "quota_pause_s": a.quota_pause}


# -- priority --------------------------------------------------------------------------

def priority(a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """A rate-limited endpoint (``--rpm``): capacity is what batches share."""
    with SimulatorProcess({"latency": {"kind": "fixed", "mean_ms": 100}}) as sim:
        url = fresh_db(a.backend, tmp)
        submit(url, [task_line(i, "low") for i in range(a.tasks)], "low",
               {"base_weight": 3.0})
        cfg = write_config(tmp / "pr.toml", [{"name": "sim", "base_url": sim.url,
                                              "rpm": a.rpm}])
        w = Workers()
        w.start(a.workers, url, cfg, concurrency=64, log_dir=tmp)
        wait_until(lambda: counts(url, "low").get("SUCCEEDED", 0) >= a.tasks // 10, 300)
        submit(url, [task_line(i, "high") for i in range(a.high)], "high",
               {"base_weight": 10.0})
        codes = w.wait(1800)
    rows = q(url, "SELECT batch_id, finished_at FROM task ORDER BY finished_at")
    high = [r["finished_at"] for r in rows if r["batch_id"] == "high"]
    low = [r["finished_at"] for r in rows if r["batch_id"] == "low"]
    during = [t for t in low if min(high) <= t <= max(high)]
    gaps = [b - x for x, b in itertools.pairwise(during)]
    edge = [during[0] - min(high), max(high) - during[-1]] if during else []
    return {"exit_codes": codes, "high_finished_first": max(high) < max(low),
            "high_span_s": round((max(high) - min(high)) / 1000, 1),
            "low_done_during_high": len(during), "high_done": len(high),
            "low_share_during": round(len(during) / (len(during) + len(high)), 3),
            "expected_share": round(3 / 13, 3),
            "max_gap_low_during_high_s": round(max(gaps + edge) / 1000, 2)
            if during else None}


# -- window --------------------------------------------------------------------------------

def window(a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    with SimulatorProcess({"latency": {"kind": "fixed", "mean_ms": 100}}) as sim:
        url = fresh_db(a.backend, tmp)
        s = Store(url)
        now = s.db_now()
        s.close()
        start = now + int(a.lead * 1000)
        end = start + int(a.length * 1000)
        target = a.tasks / a.length
        submit(url, [task_line(i, "win") for i in range(a.tasks)], "win",
               {"window_start": start, "window_end": end, "target_per_s": target,
                "deadline_at": end})
        cfg = write_config(tmp / "win.toml", [{"name": "sim", "base_url": sim.url,
                                               "rpm": a.rpm}])
        w = Workers()
        w.start(a.workers, url, cfg, concurrency=64, log_dir=tmp)
        codes = w.wait(a.lead + a.length + 600)
    fin = sorted(int(r["finished_at"]) for r in q(url, "SELECT finished_at FROM task"))
    buckets: list[int] = [0] * (int(a.length // 10) + 3)
    for t in fin:
        buckets[max(0, (t - start) // 10_000)] += 1
    rates = [n / 10.0 for n in buckets]
    steady = rates[1:int(a.length // 10) - 1]
    dev = [r / target - 1 for r in steady]
    return {"exit_codes": codes, "target_per_s": round(target, 2),
            "first_finish_after_start_s": round((fin[0] - start) / 1000, 2),
            "last_finish_before_end_s": round((end - fin[-1]) / 1000, 2),
            "inside_window": fin[0] >= start and fin[-1] <= end,
            "rate_per_10s": rates, "steady_max_dev": round(max(abs(d) for d in dev), 3),
            "steady_mean_dev": round(sum(dev) / len(dev), 3), "counts": counts(url)}


# -- lane claims on a big table ------------------------------------------------------------

def _fill(store: Store, n: int, status: str, visible: str, batch: str) -> None:
    with store.engine.begin() as c:
        c.execute(text(fill_sql(store.dialect.name, n, status, visible, batch=batch,
                                pool="default")))


def claim(a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Median time of a lane claim of 100 rows and of a lane scan, with 10k pending, and
    with 10k pending + 1M finished + 100k in flight in the same lane (must stay flat)."""
    from lockgate.store.flow import FlowStore

    out: dict[str, Any] = {}
    for label, big in (("pending_10k", False), ("plus_1M_finished_100k_in_flight", True)):
        url = fresh_db(a.backend, tmp)
        s = Store(url)
        _fill(s, 10_000, "PENDING", "0", "b")
        if big:
            _fill(s, a.tasks, "SUCCEEDED", "0", "b")
            _fill(s, 100_000, "PENDING", "99999999999999", "f")
            with s.engine.begin() as c:  # in flight: same lane, leased far ahead
                c.execute(text("UPDATE task SET batch_id = 'b', lease_token = 'x' "
                               "WHERE batch_id = 'f'"))
        with s.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            c.execute(text("VACUUM ANALYZE task" if s.dialect.name == "postgresql"
                           else "ANALYZE TABLE task" if s.dialect.name == "mysql"
                           else "ANALYZE"))
        fs = FlowStore(s)
        claims, scans = [], []
        for i in range(60):
            t0 = time.perf_counter()
            got = fs.claim_lanes({("default", "b"): 100}, lease_ms=600_000,
                                 token=f"{i:032d}", worker_id="bench")
            claims.append((time.perf_counter() - t0) * 1000)
            assert len(got[("default", "b")]) == 100
            t0 = time.perf_counter()
            fs.lanes(None)
            scans.append((time.perf_counter() - t0) * 1000)
        s.close()
        out[label] = {"claim_ms": round(sorted(claims)[30], 2),
                      "lane_scan_ms": round(sorted(scans)[30], 2)}
    out["claim_ratio"] = round(out["plus_1M_finished_100k_in_flight"]["claim_ms"]
                               / out["pending_10k"]["claim_ms"], 2)
    out["scan_ratio"] = round(out["plus_1M_finished_100k_in_flight"]["lane_scan_ms"]
                              / out["pending_10k"]["lane_scan_ms"], 2)
    return out


SCENARIOS: dict[str, Callable[[argparse.Namespace, Path], dict[str, Any]]] = {
    "retry_after": retry_after, "spike": spike, "quota": quota, "priority": priority,
    "window": window, "claim": claim}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", choices=sorted(SCENARIOS))
    ap.add_argument("--backend", default="postgresql")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tasks", type=int)
    ap.add_argument("--period", type=float, help="length of the fault, seconds")
    ap.add_argument("--retry-ms", type=int, default=3000)
    ap.add_argument("--policy", default="rule", choices=["rule", "gradient"])
    ap.add_argument("--max-concurrency", type=int, default=32)
    ap.add_argument("--warmup", type=float, default=15.0)
    ap.add_argument("--recover-wait", type=float, default=75.0)
    ap.add_argument("--quota-pause", type=float, default=10.0)
    ap.add_argument("--rpm", type=int, default=6000)
    ap.add_argument("--high", type=int, default=1000)
    ap.add_argument("--lead", type=float, default=25.0, help="window starts after, s")
    ap.add_argument("--length", type=float, default=120.0, help="window length, s")
    ap.add_argument("--keep", type=Path)
    a = ap.parse_args()
    defaults = {"retry_after": {"tasks": 6000, "period": 8.0},
                "spike": {"tasks": 40_000, "period": 60.0},
                "quota": {"tasks": 6000, "period": 20.0},
                "priority": {"tasks": 6000, "period": 0.0},
                "window": {"tasks": 10_000, "period": 0.0},
                "claim": {"tasks": 1_000_000, "period": 0.0}}[a.scenario]
    a.tasks = a.tasks or defaults["tasks"]
    a.period = a.period if a.period is not None else defaults["period"]
    print(f"{a.scenario}: machine {machine()}, {a.workers} workers, {a.tasks} tasks, "
          f"backend {a.backend}", flush=True)
    results = []
    for run in range(a.runs):
        with run_dir(a.keep, f"{a.scenario}-{run}") as tmp:
            r = SCENARIOS[a.scenario](a, tmp)
        results.append(r)
        shown = {k: v for k, v in r.items() if k not in ("samples", "rate_per_10s")}
        print(f"run {run + 1}: {shown}", flush=True)
        if "rate_per_10s" in r:
            print(f"  tasks/s per 10 s: {r['rate_per_10s']}", flush=True)
    for key in ("fell_to_half_after_s", "recovered_after_s", "fallback_after_s",
                "primary_again_after_s", "max_gap_low_during_high_s", "steady_max_dev",
                "max_lag_other_s", "max_lag_same_s"):
        vals = [r[key] for r in results if r.get(key) is not None]
        if vals:
            print(f"{key}: {spread(vals)}")
    OUT.parent.mkdir(exist_ok=True)
    with OUT.open("ab") as fh:
        fh.write(orjson.dumps({"scenario": a.scenario, "machine": machine(),
                               "args": {k: str(v) for k, v in vars(a).items()},
                               "runs": results}) + b"\n")


if __name__ == "__main__":
    main()
