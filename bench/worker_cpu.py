"""Worker CPU per task: the CPU time (user + system) one ``lockgate worker --burst``
process spends per task against a 0 ms model, on a database made the same way for every
run, and, with ``--vs``, paired against another source tree (A/B).

One simulator (0 ms latency) serves every run. N tasks of the benchmark workload are
submitted once to a template database: a SQLite file (copied for each run) or a
PostgreSQL database (``CREATE DATABASE ... TEMPLATE``). Each run is a fresh process
(``bench/_worker_proc.py``, the worker's default settings) whose CPU is read from the
kernel; its imports are counted apart (``import_cpu_s``, the CPU before the worker
starts) so that µs/task is the worker's own. SQLite works in the worker's process (its
CPU counts here); PostgreSQL's server is reported apart: the CPU of its processes
(from /proc, the postmaster's reaped backends included) over the run, per task.

    python bench/worker_cpu.py --tasks 10000 --rounds 5
    python bench/worker_cpu.py --db postgresql --vs /tmp/base/src   # A/B: this tree / that
    python bench/worker_cpu.py --args=--http-client=pyreqwest --vs-args=   # A/B: settings

Rounds alternate A B A B ...; the ratio is this tree's µs/task over the other's, pair by
pair, and its median is quoted.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import create_engine, text

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _databases import PG_ADMIN  # noqa: E402
from engine_throughput import fresh_db, submit  # noqa: E402
from lockgate.simulator.testing import SimulatorProcess  # noqa: E402

TEMPLATE = "lockgate_bench_cpu_tpl"
RUN_DB = "lockgate_bench_cpu"


def _pg_admin() -> Any:
    return create_engine(PG_ADMIN.replace("postgresql://", "postgresql+psycopg://"),
                         isolation_level="AUTOCOMMIT")


def prepare(backend: str, tasks: int, tmp: Path) -> str:
    """The template database holding ``tasks`` PENDING tasks; returns its URL."""
    url = fresh_db(backend, tmp, name=TEMPLATE)
    submit(url, tasks)
    return url


def run_copy(backend: str, template: str, tmp: Path, n: int) -> str:
    """A fresh copy of the template for one run."""
    if backend == "sqlite":
        src = Path(template.removeprefix("sqlite:///"))
        dst = tmp / f"run-{n}.db"
        shutil.copyfile(src, dst)
        return f"sqlite:///{dst}"
    eng = _pg_admin()
    with eng.connect() as c:
        c.execute(text(f"DROP DATABASE IF EXISTS {RUN_DB} WITH (FORCE)"))
        c.execute(text(f"CREATE DATABASE {RUN_DB} TEMPLATE {TEMPLATE}"))
    eng.dispose()
    return PG_ADMIN.rsplit("/", 1)[0] + f"/{RUN_DB}"


def pg_server_cpu_s() -> float:
    """CPU seconds the PostgreSQL server has spent: every live ``postgres`` process,
    plus the postmaster's reaped children (the backends of connections since closed)."""
    procs: dict[int, list[str]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            raw = stat.read_text()
        except OSError:  # gone meanwhile
            continue
        if raw[raw.index("(") + 1:raw.rindex(")")] == "postgres":
            procs[int(stat.parent.name)] = raw[raw.rindex(")") + 2:].split()
    ticks = 0
    for f in procs.values():  # f[1] ppid; f[11:15] utime, stime, cutime, cstime
        ticks += int(f[11]) + int(f[12])
        if int(f[1]) not in procs:  # the postmaster
            ticks += int(f[13]) + int(f[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def one(url: str, sim_url: str, src: Path | None, args: list[str],
        tasks: int) -> dict[str, Any]:
    env = {**os.environ, "LOCKGATE_BASE_URL": sim_url}
    if src is not None:
        env["PYTHONPATH"] = str(src)
    server_before = pg_server_cpu_s() if url.startswith("postgresql") else None
    res = subprocess.run([sys.executable, str(HERE / "_worker_proc.py"), "--db", url, *args],
                         capture_output=True, text=True, env=env, check=False)
    if res.returncode != 0:
        raise SystemExit(f"worker failed ({res.returncode}):\n{res.stderr[-3000:]}")
    out: dict[str, Any] = orjson.loads(res.stdout.strip().splitlines()[-1])
    if out["succeeded"] != tasks:
        raise SystemExit(f"{out['succeeded']} of {tasks} tasks succeeded: {out}")
    out["us_per_task"] = (out["cpu_s"] - out["import_cpu_s"]) / tasks * 1e6
    if server_before is not None:
        time.sleep(0.2)  # the backends of the worker's connections exit and are reaped
        out["server_us_per_task"] = (pg_server_cpu_s() - server_before) / tasks * 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--db", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--vs", type=Path, help="another tree's src/ directory (A/B)")
    ap.add_argument("--args", default="", help="arguments of this side's _worker_proc.py")
    ap.add_argument("--vs-args", help="arguments of the other side's (A/B on this tree "
                                      "without --vs)")
    a = ap.parse_args()
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}, load {os.getloadavg()[0]:.1f}; "
          f"{a.tasks:,} tasks, {a.db}, 0 ms model", flush=True)
    sides: list[tuple[str, Path | None, list[str]]] = [("this", None, a.args.split())]
    if a.vs is not None or a.vs_args is not None:
        sides.append(("vs", a.vs.resolve() if a.vs else None, (a.vs_args or "").split()))
    got: dict[str, list[float]] = {name: [] for name, _, _ in sides}
    server: dict[str, list[float]] = {name: [] for name, _, _ in sides}
    with tempfile.TemporaryDirectory() as tmp_s, \
            SimulatorProcess({"latency": {"kind": "fixed", "mean_ms": 0}}) as sim:
        tmp = Path(tmp_s)
        template = prepare(a.db, a.tasks, tmp)
        n = 0
        for r in range(a.rounds):
            for name, src, args in sides:
                sim.reset()
                n += 1
                out = one(run_copy(a.db, template, tmp, n), sim.url, src, args, a.tasks)
                got[name].append(out["us_per_task"])
                if "server_us_per_task" in out:
                    server[name].append(out["server_us_per_task"])
                print(f"round {r + 1} {name:4s}: {out['us_per_task']:6.0f} µs/task "
                      f"(worker {out['elapsed_s']:.2f} s, {a.tasks / out['elapsed_s']:,.0f} "
                      f"tasks/s; imports {out['import_cpu_s']:.2f} s CPU"
                      + (f"; PostgreSQL server {out['server_us_per_task']:.0f} µs/task"
                         if "server_us_per_task" in out else "") + ")", flush=True)
    for name, values in got.items():
        print(f"{name}: median {statistics.median(values):.0f} µs/task "
              f"(min {min(values):.0f}, max {max(values):.0f})")
    for name, values in server.items():
        if values:
            print(f"{name}: PostgreSQL server median {statistics.median(values):.0f} µs/task "
                  f"(min {min(values):.0f}, max {max(values):.0f})")
    if len(sides) > 1:
        for what, figures in (("worker", got), ("server", server)):
            if not figures["this"]:
                continue
            ratios = [x / y for x, y in zip(figures["this"], figures["vs"], strict=True)]
            print(f"{what} this/vs: median {statistics.median(ratios):.3f} "
                  f"(min {min(ratios):.3f}, max {max(ratios):.3f}, {len(ratios)} pairs)")
    if a.db == "postgresql":
        eng = _pg_admin()
        with eng.connect() as c:
            for name in (RUN_DB, TEMPLATE):
                c.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        eng.dispose()


if __name__ == "__main__":
    main()
