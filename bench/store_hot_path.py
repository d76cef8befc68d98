"""The store's hot path alone: claim a batch, write it back with full attempt traces,
in one thread, until the queue is empty. Prints microseconds per task for each half:
wall time, and the CPU time of the calling thread (what a worker's database threads
take from its event loop under the GIL; the database server's own work not included).

    python bench/store_hot_path.py --backends sqlite,postgresql,mariadb --tasks 20000
    python bench/store_hot_path.py --backends postgresql --backlog 300000

``--backlog N`` first inserts N more PENDING tasks that are not yet visible, in one
statement and with no ANALYZE afterwards: the state of the table right after a large
submission, before the database has gathered statistics on it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import text

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_throughput import fill_sql, fresh_db, submit
from lockgate.store import Store
from lockgate.store.types import Finish

SNAPSHOT = '[{"role": "system", "content": "' + "x" * 600 + '"}]'


def trace() -> dict[str, object]:
    """An attempt row of the size a real call writes (prompt snapshot included)."""
    return {"attempt": 1, "outcome": "succeeded", "started_at": 1, "latency_ms": 12.5,
            "endpoint": "sim", "model": "m", "prompt_sha256": "ab" * 32,
            "prompt_snapshot": SNAPSHOT, "token_estimator": "tiktoken:cl100k_base",
            "estimated_tokens": 100, "input_tokens": 101, "output_tokens": 20,
            "http_status": 200, "raw_output": '{"a": 1}', "parse_status": "ok",
            "fixes": None, "completeness": 1.0, "error_class": None,
            "error_message": None, "prompt_version": None}


def run(backend: str, tasks: int, batch: int,
        backlog: int = 0) -> tuple[float, float, float, float]:
    url = fresh_db(backend, Path(tempfile.mkdtemp()))
    submit(url, tasks)
    store = Store(url)
    if backlog:
        with store.engine.begin() as conn:
            conn.execute(text(fill_sql(store.dialect.name, backlog, "PENDING",
                                       "99999999999999", batch="backlog")))
    claim_s = finish_s = claim_cpu = finish_cpu = 0.0
    done = 0
    try:
        while done < tasks:
            t0, c0 = time.perf_counter(), time.thread_time()
            got = store.claim(batch, lease_ms=60_000, worker_id="bench")
            t1, c1 = time.perf_counter(), time.thread_time()
            rows = [Finish(id=c.id, lease_token=c.lease_token, status="SUCCEEDED",
                           result='{"a": 1}', parse_status="ok", attempt=trace())
                    for c in got]
            t2, c2 = time.perf_counter(), time.thread_time()
            store.finish(rows, worker_id="bench")
            finish_s += time.perf_counter() - t2
            finish_cpu += time.thread_time() - c2
            claim_s += t1 - t0
            claim_cpu += c1 - c0
            done += len(got)
    finally:
        store.close()
    return tuple(x / tasks * 1e6 for x in (claim_s, claim_cpu, finish_s,  # type: ignore
                                            finish_cpu))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default="sqlite,postgresql,mariadb")
    ap.add_argument("--tasks", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--backlog", type=int, default=0,
                    help="PENDING tasks not yet visible, inserted without ANALYZE")
    a = ap.parse_args()
    for backend in a.backends.split(","):
        claim_us, claim_cpu, finish_us, finish_cpu = run(backend, a.tasks, a.batch, a.backlog)
        print(f"{backend:10s} claim {claim_us:6.1f} us/task (client CPU {claim_cpu:5.1f}), "
              f"write-back {finish_us:6.1f} us/task (client CPU {finish_cpu:5.1f}) "
              f"({a.batch} per batch, traces included, backlog {a.backlog})", flush=True)


if __name__ == "__main__":
    main()
