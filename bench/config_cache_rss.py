"""Worker memory when every task has a config of its own (the OpenAI batch format).

Each line of an OpenAI Batch API file carries its own request body, so each task gets a
config (template, model config) of its own: a worker's per-config caches (configs,
routes, sampling parameters, merged registry configs) would grow with every task
processed if they were not bounded. This runs one burst worker (a fresh process, as
`lockgate worker --burst`) over N and over 10N such tasks and reports its peak RSS;
bounded caches keep the two close.

    python bench/config_cache_rss.py --tasks 20000 --factor 10
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from lockgate.files import from_openai_batch  # noqa: E402
from lockgate.simulator.testing import SimulatorProcess  # noqa: E402
from lockgate.spec import TaskSpec  # noqa: E402
from lockgate.store import Store  # noqa: E402

PY = sys.executable


def batch_line(i: int) -> dict[str, Any]:
    """An OpenAI batch request whose system message (so whose config) is its own."""
    return {"custom_id": f"req-{i:07d}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "sim-small", "temperature": 0, "messages": [
                {"role": "system", "content": f'Reply with JSON like {{"label": "yes"}}. '
                                              f"Request {i}."},
                {"role": "user", "content": f"order {i}: where is my parcel"}]}}


def specs(n: int) -> Iterator[TaskSpec]:
    for i in range(n):
        yield from_openai_batch(batch_line(i), i + 1)


def measure(n: int, sim_url: str, tmp: Path) -> dict[str, Any]:
    db = f"sqlite:///{tmp / f'rss-{n}.db'}"
    store = Store(db)
    store.migrate()
    t0 = time.perf_counter()
    report = store.submit(specs(n), batch_id="rss")
    submit_s = time.perf_counter() - t0
    with store.read() as conn:
        configs = int(conn.execute("SELECT COUNT(*) FROM task_config").scalar_one())
    store.close()
    out = subprocess.run([PY, str(HERE / "_worker_proc.py"), "--db", db],
                         capture_output=True, check=True, text=True,
                         env={**os.environ, "LOCKGATE_BASE_URL": sim_url})
    res = orjson.loads(out.stdout.strip().splitlines()[-1])
    return {"tasks": n, "inserted": report.inserted, "configs": configs,
            "submit_s": round(submit_s, 1), **res}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=20_000)
    ap.add_argument("--factor", type=int, default=10)
    a = ap.parse_args()
    rows = []
    with SimulatorProcess({}) as sim, tempfile.TemporaryDirectory() as d:
        for n in (a.tasks, a.tasks * a.factor):
            rows.append(measure(n, sim.url, Path(d)))
            print(orjson.dumps(rows[-1]).decode(), flush=True)
    small, large = rows
    print(f"\nmachine: {platform.processor() or platform.machine()}, python "
          f"{platform.python_version()}")
    print("| tasks | configs | tasks/s | peak RSS MB |\n|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['tasks']:,} | {r['configs']:,} | {r['finished'] / r['elapsed_s']:,.0f} "
              f"| {r['maxrss_mb']:.1f} |")
    print(f"peak RSS ratio {large['maxrss_mb'] / small['maxrss_mb']:.2f} for "
          f"{a.factor}x the tasks")


if __name__ == "__main__":
    main()
