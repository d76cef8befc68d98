"""Engine benchmarks (issue targets in docs/benchmarks.md). Every result and trace is
persisted; the simulator and the naive baseline run as separate processes.

    python bench/engine_throughput.py --scenarios zero,lognormal --tasks 20000
    python bench/engine_throughput.py --scenarios claim
    python bench/engine_throughput.py --scenarios rss --backends sqlite

Scenarios:
  zero       0 ms simulator: lockgate tasks/s vs the naive baseline, per backend and
             per worker process count (--processes 1,2: `lockgate worker -p N`)
  lognormal  lognormal latency (mean 300 ms; --lognormal-mean-ms) at the same number of
             calls in flight (--lognormal-concurrency)
             (both throughput scenarios time lockgate end to end, including the start
             of its worker processes, and also from its first call, as the baseline is
             timed)
  claim      claim latency with 10k pending vs 1M pending vs 10k pending + 1M finished
             and 100k in flight (must stay flat: ratio <= 1.5)
  rss        peak RSS of a worker processing N vs 10N tasks (must stay flat)
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import text

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _flow_common  # noqa: E402
from lockgate.simulator.testing import SimulatorProcess  # noqa: E402
from lockgate.spec import parse_task  # noqa: E402
from lockgate.store import Store  # noqa: E402
from workload import task_line  # noqa: E402

PY = sys.executable


def fresh_db(backend: str, tmp: Path, name: str = "lockgate_bench") -> str:
    """An empty, migrated database for one measurement."""
    return _flow_common.fresh_db(backend, tmp, name=name)


def submit(url: str, n: int, tokenizer: str | None = None) -> None:
    s = Store(url)
    s.submit((parse_task(task_line(i, tokenizer=tokenizer)) for i in range(n)),
             batch_id="bench")
    s.close()


def run_json(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})},
                         check=False)
    if res.returncode != 0:
        raise SystemExit(f"{cmd[1]} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    return dict(orjson.loads(res.stdout.strip().splitlines()[-1]))


def naive(sim: SimulatorProcess, tasks: int, concurrency: int,
          gc_threshold: int = 0, style: str = "semaphore") -> dict[str, Any]:
    sim.reset()
    return run_json([PY, str(HERE / "naive_baseline.py"), sim.url, "--tasks", str(tasks),
                     "--concurrency", str(concurrency), "--gc-threshold", str(gc_threshold),
                     "--style", style])


def lockgate_run(sim: SimulatorProcess, url: str, tasks: int, concurrency: int,
                 processes: int = 1, tokenizer: str | None = None) -> dict[str, Any]:
    sim.reset()
    submit(url, tasks, tokenizer)
    out = run_json([PY, str(HERE / "_worker_proc.py"), "--db", url, "--concurrency",
                    str(concurrency), "--processes", str(processes)],
                   env={"LOCKGATE_BASE_URL": sim.url})
    ended_ms = time.time() * 1000
    s = Store(url)
    st = s.status()["batches"].get("bench", {})
    calls = s.attempt_stats("bench")["calls"]
    with s.read() as conn:  # when the first call of the run started (wall clock)
        first_ms = conn.execute(text("SELECT MIN(started_at) FROM task_attempt")).scalar()
    s.close()
    stats = sim.stats()
    # Also timed as the baseline is: from the first call to the last result (the
    # baseline's time, like this one, leaves out its imports; with --processes N the
    # end-to-end time includes spawning N interpreters that import lockgate anew).
    from_first = (ended_ms - first_ms) / 1000
    out.update(rate=tasks / out["elapsed_s"], from_first_call_s=from_first,
               rate_from_first_call=tasks / from_first, succeeded_db=st.get("SUCCEEDED", 0),
               pending_db=st.get("PENDING", 0), attempts_db=calls,
               sim_requests=stats.get("requests", stats.get("total_requests")))
    return out


def throughput(backends: list[str], tasks: int, concurrency: int, latency: dict[str, Any],
               tmp: Path, processes: list[int], tokenizer: str | None = None,
               naive_gc: int = 0, naive_style: str = "semaphore") -> list[dict[str, Any]]:
    """Per backend and process count: the naive baseline, then lockgate right after it
    (the calls in flight are the same in total: ``concurrency`` split over the
    processes). Each lockgate run gets a baseline of its own, measured just before it:
    the machine's speed drifts by 10-40 % within minutes on shared virtual machines."""
    rows = []
    with SimulatorProcess({"latency": latency}) as sim:
        for backend in backends:
            for n in processes:
                base = naive(sim, tasks, concurrency, naive_gc, naive_style)
                url = fresh_db(backend, tmp)
                lg = lockgate_run(sim, url, tasks, max(1, concurrency // n), n, tokenizer)
                rows.append({"backend": backend, "processes": n, "naive_rate": base["rate"],
                             **lg, "ratio": lg["rate"] / base["rate"],
                             "ratio_from_first_call": lg["rate_from_first_call"] / base["rate"]})
                print(f"  {backend:10s} naive {base['rate']:8.0f}/s  lockgate x{n} "
                      f"{lg['rate']:8.0f}/s ratio {lg['rate'] / base['rate']:.2f} (from the "
                      f"first call: {lg['rate_from_first_call']:.0f}/s, "
                      f"{lg['rate_from_first_call'] / base['rate']:.2f})  "
                      f"client CPU/task naive {base['cpu_s'] / tasks * 1e6:.0f} us, lockgate "
                      f"{lg['cpu_s'] / tasks * 1e6:.0f} us  succeeded {lg['succeeded_db']} "
                      f"attempts {lg['attempts_db']} sim requests {lg['sim_requests']}",
                      flush=True)
    return rows


# -- claim latency -----------------------------------------------------------------------

def fill_sql(dialect: str, n: int, status: str, visible: str, *, batch: str = "fill",
             pool: str | None = None) -> str:
    """One INSERT ... SELECT of ``n`` task rows generated by the database itself."""
    cols = ("task_id, batch_id, " + ("pool, " if pool else "") + "config_hash, input_data, "
            "status, visible_at, created_at, updated_at, attempts, version, priority")
    rest = (f"'{batch}', " + (f"'{pool}', " if pool else "")
            + f"'x', '{{}}', '{status}', {visible}, 0, 0, 0, 0, 0")
    prefix = f"{batch}-{status}-"
    if dialect == "postgresql":
        tid, source = f"'{prefix}' || g", f"generate_series(1, {n}) AS g"
    elif dialect == "mysql":
        tid, source = f"CONCAT('{prefix}', seq)", f"seq_1_to_{n}"
    else:
        tid, source = f"'{prefix}' || i", "s"
    sql = f"INSERT INTO task ({cols}) SELECT {tid}, {rest} FROM {source}"
    if dialect == "sqlite":
        sql = (f"WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s "
               f"WHERE i < {n}) " + sql)
    return sql


def _fill(store: Store, n: int, status: str, visible: str) -> None:
    with store.engine.begin() as c:
        c.execute(text(fill_sql(store.dialect.name, n, status, visible)))
    if store.dialect.name == "postgresql":
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            c.execute(text("VACUUM ANALYZE task"))
    elif store.dialect.name == "mysql":
        with store.engine.begin() as c:
            c.execute(text("ANALYZE TABLE task"))
    else:
        with store.engine.begin() as c:
            c.execute(text("ANALYZE"))


def _claim_ms(store: Store, rounds: int, batch: int = 100) -> list[float]:
    times = []
    for i in range(rounds):
        t0 = time.perf_counter()
        got = store.claim(batch, lease_ms=600_000, worker_id=f"bench-{i}")
        times.append((time.perf_counter() - t0) * 1000)
        assert len(got) == batch, "the fill ran out of visible rows"
    return times


def claim_latency(backends: list[str], tmp: Path, big: int, passes: int = 4,
                  rounds: int = 20) -> list[dict[str, Any]]:
    """Median latency of claiming 100 rows in three tables. The three are filled first,
    then measured in turn, ``rounds`` claims each, over ``passes`` passes: this
    machine's speed drifts within minutes, and measuring one table after the other
    moved the ratios by more than their own size."""
    rows = []
    for backend in backends:
        cases = (
            ("pending_10k", [(10_000, "PENDING", "0")]),
            (f"pending_{big // 1000}k", [(big, "PENDING", "0")]),
            (f"pending_10k_finished_{big // 1000}k_inflight_100k",
             [(10_000, "PENDING", "0"), (big, "SUCCEEDED", "0"),
              (100_000, "INFLIGHT", "99999999999999")]),
        )
        stores: dict[str, Store] = {}
        for i, (label, fills) in enumerate(cases):
            t0 = time.perf_counter()
            store = stores[label] = Store(fresh_db(backend, tmp, name=f"lockgate_claim{i}"))
            for n, status, vis in fills:
                # in-flight rows are PENDING with a lease far in the future
                _fill(store, n, status, vis)
            if any(s == "INFLIGHT" for _n, s, _v in fills):
                with store.engine.begin() as c:
                    c.execute(text("UPDATE task SET status = 'PENDING', lease_token = 'x' "
                                   "WHERE status = 'INFLIGHT'"))
            print(f"  {backend:10s} {label:45s} filled ({time.perf_counter() - t0:.1f}s)",
                  flush=True)
        times: dict[str, list[float]] = {label: [] for label in stores}
        per_pass: dict[str, list[float]] = {label: [] for label in stores}
        for _ in range(passes):
            for label, store in stores.items():
                t = _claim_ms(store, rounds)
                times[label] += t
                per_pass[label].append(statistics.median(t))
        res: dict[str, Any] = {"backend": backend}
        for label, store in stores.items():
            store.close()
            res[label] = statistics.median(times[label])
            print(f"  {backend:10s} {label:45s} median claim of 100 rows: "
                  f"{res[label]:.2f} ms (per pass: "
                  f"{', '.join(f'{m:.2f}' for m in per_pass[label])})", flush=True)
        keys = [k for k in res if k != "backend"]
        res["ratio_big_vs_10k"] = res[keys[1]] / res[keys[0]]
        res["ratio_finished_vs_10k"] = res[keys[2]] / res[keys[0]]
        print(f"  {backend:10s} ratios: {res['ratio_big_vs_10k']:.2f} (1M pending), "
              f"{res['ratio_finished_vs_10k']:.2f} (1M finished, 100k in flight)", flush=True)
        rows.append(res)
    return rows


def rss(backends: list[str], tasks: int, concurrency: int, tmp: Path) -> list[dict[str, Any]]:
    rows = []
    with SimulatorProcess({"latency": {"kind": "fixed", "mean_ms": 0}}) as sim:
        for backend in backends:
            for n in (tasks, tasks * 10):
                url = fresh_db(backend, tmp)
                out = lockgate_run(sim, url, n, concurrency)
                rows.append({"backend": backend, "tasks": n, **out})
                print(f"  {backend:10s} {n:8d} tasks: peak RSS {out['maxrss_mb']:.1f} MB, "
                      f"{out['rate']:.0f} tasks/s", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default="sqlite,postgresql,mariadb")
    ap.add_argument("--scenarios", default="zero,lognormal,claim")
    ap.add_argument("--tasks", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=512)
    ap.add_argument("--lognormal-concurrency", type=int, default=1000)
    ap.add_argument("--lognormal-mean-ms", type=float, default=300,
                    help="mean latency of the lognormal scenario (the target is set at 300)")
    ap.add_argument("--claim-big", type=int, default=1_000_000)
    ap.add_argument("--rss-tasks", type=int, default=20_000)
    ap.add_argument("--processes", default="1,2",
                    help="lockgate worker process counts to measure (comma-separated)")
    ap.add_argument("--tokenizer", help="model_config.tokenizer of the tasks (e.g. "
                    "'calibrated'); default: the best estimator on disk")
    ap.add_argument("--naive-style", choices=["semaphore", "pool"], default="semaphore",
                    help="how the baseline is written (bench/naive_baseline.py): one "
                         "coroutine per call under a semaphore, as the targets specify, or "
                         "a pool of as many coroutines as calls in flight")
    ap.add_argument("--naive-gc-threshold", type=int, default=0,
                    help="young-generation GC threshold of the baseline [0: the "
                         "interpreter's, as a naive program runs; a lockgate worker "
                         "raises its own to max(50000, 50 x concurrency)]")
    ap.add_argument("--json", type=Path, help="write all figures here")
    a = ap.parse_args()
    backends = a.backends.split(",")
    procs = [int(n) for n in a.processes.split(",")]
    report: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                                          "platform": platform.platform()}}
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        for sc in a.scenarios.split(","):
            print(f"== {sc}", flush=True)
            if sc == "zero":
                report[sc] = throughput(backends, a.tasks, a.concurrency,
                                        {"kind": "fixed", "mean_ms": 0}, tmp, procs,
                                        a.tokenizer, a.naive_gc_threshold, a.naive_style)
            elif sc == "lognormal":
                report[sc] = throughput(backends, a.tasks, a.lognormal_concurrency,
                                        {"kind": "lognormal", "mean_ms": a.lognormal_mean_ms,
                                         "sigma": 0.5},
                                        tmp, procs, a.tokenizer, a.naive_gc_threshold,
                                        a.naive_style)
            elif sc == "claim":
                report[sc] = claim_latency(backends, tmp, a.claim_big)
            elif sc == "rss":
                report[sc] = rss(backends, a.rss_tasks, a.concurrency, tmp)
            else:
                raise SystemExit(f"unknown scenario {sc}")
    if a.json:
        a.json.write_text(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())


if __name__ == "__main__":
    main()
