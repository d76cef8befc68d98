"""Submit at volume: tasks/s of `lockgate submit`, its peak memory, and how soon the first
task can be claimed, on SQLite, PostgreSQL and MariaDB.

For each size a task file is written once (the benchmark workload: one shared config,
an input per task, ~560 bytes a line). For each database a fresh, empty database is made
and migrated, then ``lockgate submit FILE --db URL`` runs as a user runs it (a fresh
process, the whole file validated first, then written in committed chunks), while this
process polls a second connection every 5 ms for the first task of the batch that a
worker could claim (PENDING, committed, visible). Reported per run:

* tasks/s: tasks / wall time of the whole command (process start to exit, imports and
  the validation pass included);
* write starts: seconds from the command's start to the batch row's appearance (when
  the writing begins: after the checking pass over the whole file, or at once with
  ``--stream``);
* first claimable: seconds from the command's start to the first claimable task (without
  ``--stream`` the whole file is checked first: a bad line refuses the file before any
  task is claimable; with ``--stream`` chunks are claimable as they are read);
* peak RSS of the submitting process (from the kernel's accounting of the child), which
  stays flat as the file grows.

    python bench/submit_throughput.py                       # 100k and 1M, all three
    python bench/submit_throughput.py --tasks 100000 --db postgresql
    python bench/submit_throughput.py --stream          # tasks claimable as read
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _databases import fresh_url
from lockgate import Lockgate
from workload import task_line

DB_NAME = "lockgate_bench_submit"
BATCH = "bench"


def write_file(path: Path, n: int) -> None:
    with path.open("wb") as fh:
        for i in range(n):
            fh.write(orjson.dumps(task_line(i, BATCH)) + b"\n")


def watch_first(lg: Lockgate, t0: list[float], done: threading.Event,
                out: dict[str, float]) -> None:
    """Poll for the batch row (made when the write pass begins, after the file was
    checked whole) and the first claimable task of the batch; record when each
    appeared."""
    batch = sa.text("SELECT id FROM batch WHERE id = :b")
    query = sa.text("SELECT id FROM task WHERE batch_id = :b AND status = 'PENDING' "
                    f"AND visible_at <= {lg.store.dialect.now} LIMIT 1")
    while not done.is_set():
        with lg.store.read() as tx:
            if "write_s" not in out and tx.execute(batch, {"b": BATCH}).first() is not None:
                out["write_s"] = time.perf_counter() - t0[0]
            if tx.execute(query, {"b": BATCH}).first() is not None:
                out["first_s"] = time.perf_counter() - t0[0]
                out.setdefault("write_s", out["first_s"])
                return
        time.sleep(0.005)


def run_one(family: str, n: int, path: Path, tmp: Path,
            stream: bool = False) -> dict[str, Any] | None:
    url = fresh_url(family, tmp, DB_NAME)
    if url is None:
        return None
    lg = Lockgate(url)  # migrated here, so the command times the submit alone
    cli = [str(Path(sys.executable).with_name("lockgate")), "submit", str(path), "--db", url,
           "--batch", BATCH,
           *(["--stream"] if stream else [])]
    t0 = [0.0]
    done = threading.Event()
    seen: dict[str, float] = {}
    watcher = threading.Thread(target=watch_first, args=(lg, t0, done, seen), daemon=True)
    t0[0] = time.perf_counter()
    proc = subprocess.Popen(cli, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    watcher.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0[0]
    proc.returncode = os.waitstatus_to_exitcode(status)
    done.set()
    watcher.join()
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        raise SystemExit(f"{family}: lockgate submit failed ({proc.returncode}): {err}")
    with lg.store.read() as tx:
        stored = tx.execute(sa.text("SELECT COUNT(*) FROM task WHERE batch_id = :b"),
                            {"b": BATCH}).scalar_one()
    lg.close()
    if stored != n:
        raise SystemExit(f"{family}: {stored} tasks stored, expected {n}")
    return {"db": family, "mode": "stream" if stream else "checked first", "tasks": n,
            "s": wall, "per_s": n / wall,
            "first_s": seen.get("first_s"), "write_s": seen.get("write_s"),
            "rss_mb": usage.ru_maxrss / 1024,
            "cpu_s": usage.ru_utime + usage.ru_stime}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, action="append",
                    help="tasks in the file (repeatable; default 100000 and 1000000)")
    ap.add_argument("--db", action="append", choices=["sqlite", "postgresql", "mysql"],
                    help="database family (repeatable; default all three)")
    ap.add_argument("--stream", action="store_true",
                    help="submit with --stream (tasks claimable as they are read)")
    args = ap.parse_args()
    sizes = args.tasks or [100_000, 1_000_000]
    families = args.db or ["sqlite", "postgresql", "mysql"]
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}")
    print(f"load average at the start: {os.getloadavg()[0]:.1f}")
    print("| database | mode | tasks | s | tasks/s | write starts s | first claimable s | "
          "peak RSS MB | CPU s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        for n in sizes:
            path = tmp / f"tasks-{n}.jsonl"
            write_file(path, n)
            for family in families:
                r = run_one(family, n, path, tmp, args.stream)
                if r is None:
                    continue
                first, write = ("-" if r[k] is None else f"{r[k]:.2f}"
                                for k in ("first_s", "write_s"))
                print(f"| {r['db']} | {r['mode']} | {n:,} | {r['s']:.1f} | "
                      f"{r['per_s']:,.0f} | {write} | "
                      f"{first} | {r['rss_mb']:.0f} | {r['cpu_s']:.1f} |", flush=True)
            path.unlink()


if __name__ == "__main__":
    main()
