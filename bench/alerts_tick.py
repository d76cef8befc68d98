"""What one evaluation of the quality evaluator costs as ``task_attempt`` grows: the
same incident (a completeness collapse on one prompt version, 150 calls against a
150-call baseline) with 0, then N, then 10 x N more attempts of that version and model
inside the rule's window (the worst case for the bounded reads: every one of them is a
sample candidate and a touched-batch candidate). Per table size, the median wall time of
an **open** tick (the alert, its 100 samples and its outbox row written; the alert rows
are deleted before each) and of an **update** tick (the alert open: figures and volume
refreshed).

    python bench/alerts_tick.py --backends postgresql,mariadb --filler 100000 --ticks 9

The reads of ``task_attempt`` are an index range with a LIMIT, so the figures should not
grow with the table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson
from sqlalchemy import text

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _databases import fresh_url  # noqa: E402
from lockgate.config import QualitySettings, Settings  # noqa: E402
from lockgate.quality.alerts import Evaluator  # noqa: E402
from lockgate.quality.writer import RollupWriter  # noqa: E402
from lockgate.spec import parse_task  # noqa: E402
from lockgate.states import TaskStatus  # noqa: E402
from lockgate.store import Finish, Store  # noqa: E402

HOUR = 3_600_000


def feed(store: Store, n: int, first: int, ago_ms: int, completeness: float) -> None:
    store.submit([parse_task({
        "task_id": f"t{first + i}", "prompt_template": "@registry:p@1",
        "input_data": {"x": first + i}, "model_config": {"name": "m"},
        "retry_policy": {}}) for i in range(n)], batch_id="b")
    writer = RollupWriter(store, shard="w")
    now = store.db_now()
    rows = []
    for t in store.claim(n, lease_ms=60_000, worker_id="w"):
        rows.append(Finish(id=t.id, lease_token=t.lease_token, status=TaskStatus.SUCCEEDED,
                           result='{"label": "yes"}', attempt={
                               "attempt": 1, "outcome": "succeeded", "latency_ms": 100.0,
                               "started_at": now - ago_ms, "endpoint": "e", "model": "m",
                               "prompt_sha256": "h", "prompt_version": "p@1",
                               "input_tokens": 50, "parse_status": "valid",
                               "completeness": completeness,
                               "prompt_snapshot": "Label this " * 20,
                               "raw_output": '{"label": "yes"}'}))
    store.finish(rows, worker_id="w", observe=writer.record)


def filler(store: Store, n: int) -> None:
    """``n`` more attempts of p@1 / m in the last hour, in chunks of 50,000."""
    now = store.db_now()
    done = 0
    while done < n:
        k = min(50_000, n - done)
        rows = [{"task_pk": 1 + (done + i) % 300, "attempt": 1, "worker_id": "f",
                 "lease_token": "x", "outcome": "succeeded",
                 "started_at": now - 1000 - (done + i) % HOUR, "model": "m",
                 "prompt_version": "p@1", "completeness": 0.5, "parse_status": "valid",
                 "latency_ms": 100.0, "prompt_snapshot": "p", "raw_output": "o"}
                for i in range(k)]
        with store.engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO task_attempt (task_pk, attempt, worker_id, lease_token, "
                "outcome, started_at, model, prompt_version, completeness, parse_status, "
                "latency_ms, prompt_snapshot, raw_output) VALUES (:task_pk, :attempt, "
                ":worker_id, :lease_token, :outcome, :started_at, :model, :prompt_version, "
                ":completeness, :parse_status, :latency_ms, :prompt_snapshot, :raw_output)"),
                rows)
        done += k
    with store.engine.begin() as conn:
        if store.dialect.name == "postgresql":
            conn.execute(text("ANALYZE task_attempt"))
        else:
            conn.execute(text("ANALYZE TABLE task_attempt"))


def reset(store: Store) -> None:
    with store.engine.begin() as conn:
        for table in ("quality_alert", "quality_alert_sample", "alert_delivery"):
            conn.execute(text(f"DELETE FROM {table}"))


def measure(store: Store, ev: Evaluator, ticks: int) -> tuple[float, float]:
    opens, updates = [], []
    for _ in range(ticks):
        reset(store)
        t0 = time.perf_counter()
        assert [e.event for e in ev.tick()] == ["open"]
        opens.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        assert ev.tick() == []
        updates.append(time.perf_counter() - t0)
    return statistics.median(opens) * 1000, statistics.median(updates) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="postgresql")
    ap.add_argument("--filler", type=int, default=100_000)
    ap.add_argument("--ticks", type=int, default=9)
    args = ap.parse_args()
    settings = Settings(quality=QualitySettings(evaluate_every=1.0))
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.backends.split(","):
            url = fresh_url(family, Path(tmp), "lockgate_bench_alerts")
            if url is None:
                continue
            store = Store(url)
            store.migrate()
            feed(store, 150, 0, 30 * HOUR, 1.0)
            feed(store, 150, 1000, 60_000, 0.5)
            ev = Evaluator(store, settings, worker_id="bench")
            total = 300
            for extra in (0, args.filler, 9 * args.filler):
                filler(store, extra)
                total += extra
                o, u = measure(store, ev, args.ticks)
                out.append({"backend": family, "attempts": total, "open_ms": round(o, 1),
                            "update_ms": round(u, 1)})
                print(orjson.dumps(out[-1]).decode(), flush=True)
            store.close()
    print("| backend | attempts in task_attempt | open tick (ms, median) | "
          "update tick (ms, median) |\n|---|---:|---:|---:|")
    for r in out:
        print(f"| {r['backend']} | {r['attempts']:,} | {r['open_ms']} | {r['update_ms']} |")


if __name__ == "__main__":
    main()
