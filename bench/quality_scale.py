"""Rule evaluation and rollup upkeep against the size of the attempt table: the same
measurements on a database with 1M ``task_attempt`` rows and on one with 10M (and half
as many ``task`` rows, two attempts each), and the ratio 10M/1M.

The two databases are measured in alternating rounds (1M, 10M, 1M, 10M ...), so a
change in the load of the shared machine hits both alike; the ratio quoted is the
median of the rounds' ratios. Per round and database:

* **flush**: ``Store.finish`` of ``--flush-size`` claimed tasks with full attempt traces
  and the worker's observer (``quality_observer``: rollups on), as the worker's
  write-back calls it; the median of ``--flushes`` flushes;
* **check**: ``check_rules()`` with the default settings (a 24 h window on hour rows,
  its baseline a week earlier, five minutes of minute rows), median of ``--checks``
  (wall time, and the CPU time of this process);
* **report**: ``quality_report(since 24 h, by model)``, median of ``--checks``.

The rollups are those of a steady production: ``--prompts`` inline prompts x 2 models x
2 worker shards, minute rows for the last 2 days, hour rows for 15 days and day rows for
90 (one realistic row, built by observing 300 attempts, copied to every key and bucket);
they stay the same at both sizes. The attempt rows are filled by the database itself
(``INSERT ... SELECT`` over ``generate_series``, a recursive CTE or MariaDB's sequence
engine), in steps of 1M,
then ANALYZEd.

    python bench/quality_scale.py --backends postgresql,sqlite --rounds 5
    python bench/quality_scale.py --backends mariadb --rounds 5
    python bench/quality_scale.py --backends postgresql --sizes 1000000,10000000 --flushes 20

Target (issue: the quality loop): rule evaluation and rollup update time flat with 1M
and 10M attempt rows (ratio <= 1.5).
"""

from __future__ import annotations

import argparse
import os
import statistics
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
from lockgate.config import QualitySettings, Settings  # noqa: E402
from lockgate.quality.report import check_rules, quality_report  # noqa: E402
from lockgate.quality.rollup import Rollup, watch_of  # noqa: E402
from lockgate.quality.writer import quality_observer, template_key  # noqa: E402
from lockgate.spec import parse_task  # noqa: E402
from lockgate.store import Store, schema  # noqa: E402
from lockgate.store.quality import QualityStore  # noqa: E402
from lockgate.store.types import Finish  # noqa: E402

SCHEMA = {"type": "object", "properties": {
    "category": {"type": "string", "enum": ["logistics", "quality", "refund", "other"]},
    "summary": {"type": "string"}}, "required": ["category", "summary"]}
MODELS = ("sim-small", "sim-large")
SHARDS = ("w-bench-1", "w-bench-2")
SNAPSHOT = '[{"role": "system", "content": "' + "x" * 400 + '"}]'
MINUTE, HOUR, DAY = 60_000, 3_600_000, 86_400_000
STEP = 1_000_000


def template(p: int) -> list[dict[str, str]]:
    return [{"role": "system", "content": f"Prompt {p}: label the complaint, reply JSON "
                                          f"{{\"category\": ..., \"summary\": ...}}"},
            {"role": "user", "content": "<input>\n{text}\n</input>"}]


def task_doc(p: int, i: int, batch: str) -> dict[str, Any]:
    return {"task_id": f"{batch}-{p}-{i:08d}", "prompt_template": template(p),
            "input_data": {"text": f"complaint {i}"},
            "model_config": {"name": MODELS[i % 2], "timeout_ms": 60_000},
            "delivery_rule": {"format": "json", "schema": SCHEMA}, "retry_policy": {}}


def attempt(i: int, at: int, model: str) -> dict[str, Any]:
    """An attempt row of the size a real call writes."""
    ok = i % 50 != 0
    return {"attempt": 1, "outcome": "succeeded" if ok else "failed", "started_at": at,
            "latency_ms": 400.0 + (i * 37) % 900, "endpoint": "default", "model": model,
            "prompt_sha256": "ab" * 32, "prompt_snapshot": SNAPSHOT,
            "token_estimator": "tiktoken:cl100k_base", "estimated_tokens": 120,
            "input_tokens": 118 + i % 7, "output_tokens": 20 + i % 5, "http_status": 200,
            "raw_output": '{"category": "logistics", "summary": "late parcel"}',
            "parse_status": "valid" if ok else "invalid_json", "fixes": None,
            "completeness": 1.0 if ok else 0.0, "error_class": None if ok else "parse",
            "error_message": None, "prompt_version": None}


def realistic_row() -> dict[str, Any]:
    """The columns of a rollup row of 300 attempts (sketch, mixes and watched values)."""
    r = Rollup()
    watch = watch_of(SCHEMA, ())
    for i in range(300):
        out = {"category": ("logistics", "quality", "refund", "other")[i % 4],
               "summary": "late"}
        r.observe(attempt(i, 0, "sim-small"), output=out, watch=watch, cost=None)
    return r.to_row()


# ------------------------------------------------------------------ filling

def seed_configs(store: Store, prompts: int) -> list[str]:
    """Submit one task per prompt and model (their configs are what fills point at);
    returns the config hashes."""
    store.submit((parse_task(task_doc(p, m, "seed")) for p in range(prompts)
                  for m in range(2)), batch_id="seed")
    with store.read() as tx:
        return sorted(str(h) for (h,) in tx.execute(text("SELECT hash FROM task_config")))


def fill_rollups(store: Store, prompts: int) -> int:
    qstore = QualityStore(store)
    now = qstore.now()
    row = realistic_row()
    spans = [("m", MINUTE, 2 * DAY), ("h", HOUR, 15 * DAY), ("d", DAY, 90 * DAY)]
    rows = []
    for p in range(prompts):
        prompt = template_key(template(p))
        for model in MODELS:
            for shard in SHARDS:
                for res, span, keep in spans:
                    last = now - now % span
                    for bucket in range(last - keep + span, last + span, span):
                        rows.append({"resolution": res, "bucket": bucket, "prompt": prompt,
                                     "model": model, "endpoint": "default", "shard": shard,
                                     "updated_at": now, **row})
    with store.engine.begin() as conn:
        for i in range(0, len(rows), 5000):
            conn.execute(schema.quality_rollup.insert(), rows[i:i + 5000])
    return len(rows)


def _source(dialect: str, lo: int, hi: int) -> tuple[str, str]:
    """(WITH prefix, FROM clause) of the numbers ``lo..hi`` as column ``g``."""
    if dialect == "postgresql":
        return "", f"generate_series({lo}, {hi}) AS s(g)"
    if dialect == "sqlite":
        return (f"WITH RECURSIVE s(g) AS (SELECT {lo} UNION ALL SELECT g + 1 FROM s "
                f"WHERE g < {hi}) ", "s")
    if dialect == "mysql":  # MariaDB's sequence engine (built in since 10.1)
        return "", f"(SELECT seq AS g FROM seq_{lo}_to_{hi}) AS s"
    raise SystemExit(f"{dialect}: not supported by this benchmark")


def _concat(dialect: str, a: str, b: str) -> str:
    return f"CONCAT({a}, {b})" if dialect == "mysql" else f"{a} || {b}"


def fill_sql(dialect: str, first: int, last: int, hashes: list[str],
             now: int) -> tuple[str, str]:
    """INSERT ... SELECT statements adding tasks ``first..last`` (1-based) and their
    attempt rows, two per task; the attempts' task pk is ``t + {offset}``, the caller
    fills in the offset once the tasks have their ids."""
    cases = " ".join(f"WHEN {k} THEN '{h}'" for k, h in enumerate(hashes))
    result = '{"category": "logistics", "summary": "late parcel"}'
    pre, src = _source(dialect, first, last)
    task_id = _concat(dialect, "'fill-'", "g")
    tasks = (
        f"{pre}INSERT INTO task (task_id, batch_id, config_hash, input_data, status, "
        f"visible_at, created_at, updated_at, finished_at, attempts, version, priority, "
        f"result, parse_status, model, input_tokens, output_tokens, latency_ms, "
        f"http_status) SELECT {task_id}, 'fill', CASE g % {len(hashes)} {cases} END, "
        f"'{{\"text\": \"complaint\"}}', 'SUCCEEDED', 0, {now}, {now}, {now}, 2, 2, 0, "
        f"'{result}', 'valid', 'sim-small', 120, 22, 512.5, 200 FROM {src}")
    pre, src = _source(dialect, 2 * first - 1, 2 * last)
    attempts = (
        f"{pre}INSERT INTO task_attempt (task_pk, attempt, worker_id, lease_token, outcome, "
        f"started_at, latency_ms, endpoint, model, prompt_sha256, prompt_snapshot, "
        f"token_estimator, estimated_tokens, input_tokens, output_tokens, http_status, "
        f"raw_output, parse_status, completeness) SELECT (g + 1) / 2 + {{offset}}, "
        f"2 - g % 2, 'w-fill', 'ab12ab12ab12ab12ab12ab12ab12ab12', "
        f"CASE g % 2 WHEN 1 THEN 'retried' ELSE 'succeeded' END, {now} - g, 512.5, "
        f"'default', 'sim-small', '{'ab' * 32}', '{SNAPSHOT}', 'tiktoken:cl100k_base', "
        f"120, 120, 22, 200, '{result}', 'valid', 1.0 FROM {src}")
    return tasks, attempts


def count(store: Store, table: str) -> int:
    with store.read() as tx:
        return int(tx.execute(text(f"SELECT COUNT(*) FROM {table}")).scalar() or 0)


def grow(store: Store, attempts_target: int, hashes: list[str]) -> float:
    """Fill up to ``attempts_target`` attempt rows (in steps of 1M), then ANALYZE;
    returns the seconds it took."""
    t0 = time.perf_counter()
    dialect = store.dialect.name
    have = count(store, "task_attempt")
    now = QualityStore(store).now() - DAY
    while have < attempts_target:
        n = min(STEP, attempts_target - have)
        first_task, last_task = have // 2 + 1, (have + n) // 2
        tasks_sql, attempts_sql = fill_sql(dialect, first_task, last_task, hashes, now)
        with store.engine.begin() as conn:
            conn.execute(text(tasks_sql))
            offset = conn.execute(text(
                "SELECT MIN(id) FROM task WHERE task_id = :t"), {"t": f"fill-{first_task}"}
            ).scalar()
            assert offset is not None
            conn.execute(text(attempts_sql.replace(
                "{offset}", str(int(offset) - first_task))))
        have += n
        print(f"  filled {have:,} attempt rows ({time.perf_counter() - t0:.0f} s)",
              flush=True)
    if dialect == "postgresql":
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            c.execute(text("VACUUM ANALYZE task"))
            c.execute(text("VACUUM ANALYZE task_attempt"))
            c.execute(text("VACUUM ANALYZE quality_rollup"))
    elif dialect == "mysql":
        with store.engine.begin() as c:
            c.execute(text("ANALYZE TABLE task, task_attempt, quality_rollup"))
    else:
        with store.engine.begin() as c:
            c.execute(text("ANALYZE"))
    return time.perf_counter() - t0


# ------------------------------------------------------------------ measuring

def measure(store: Store, label: str, prompts: int, flushes: int, size: int,
            checks: int) -> dict[str, list[float]]:
    """One round on one database: the times (ms) of each flush, check and report."""
    settings = Settings()
    batch = f"live-{label}"
    store.submit((parse_task(task_doc(i % prompts, i, batch))
                  for i in range(flushes * size)), batch_id=batch)
    out: dict[str, list[float]] = {"flush": [], "check": [], "check_cpu": [], "report": []}
    # One observer per worker shard, kept across flushes as a worker keeps its own.
    observers = [quality_observer(store, settings, shard) for shard in SHARDS]
    for k in range(flushes):
        observer = observers[k % 2]
        assert observer is not None
        got = store.claim(size, lease_ms=600_000, worker_id=SHARDS[k % 2])
        at = QualityStore(store).now()
        rows = [Finish(id=c.id, lease_token=c.lease_token, status="SUCCEEDED",
                       result='{"category": "logistics", "summary": "late parcel"}',
                       parse_status="valid", model=MODELS[c.id % 2],
                       attempt=attempt(c.id, at, MODELS[c.id % 2]))  # type: ignore[arg-type]
                for c in got]
        t0 = time.perf_counter()
        report = store.finish(rows, worker_id=SHARDS[k % 2], observe=observer)
        out["flush"].append((time.perf_counter() - t0) * 1000)
        observer.committed()
        assert len(report.applied) == len(rows) == size, (len(report.applied), len(rows))
    qs = QualitySettings()
    for _ in range(checks):
        t0, c0 = time.perf_counter(), time.process_time()
        check_rules(store, qs)
        out["check"].append((time.perf_counter() - t0) * 1000)
        out["check_cpu"].append((time.process_time() - c0) * 1000)
        t0 = time.perf_counter()
        quality_report(store, since_s=86_400.0, by="model")
        out["report"].append((time.perf_counter() - t0) * 1000)
    return out


FIGURES = ("flush", "check", "check_cpu", "report")


def run(backend: str, sizes: list[int], args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    stores: dict[int, Store] = {}
    out: dict[str, Any] = {"sizes": {}, "rounds": []}
    try:
        for n in sizes:
            url = _flow_common.fresh_db(backend, tmp, f"lockgate_quality_scale_{n}")
            store = stores[n] = Store(url)
            hashes = seed_configs(store, args.prompts)
            out["rollup_rows"] = fill_rollups(store, args.prompts)
            fill_s = grow(store, n, hashes)
            out["sizes"][str(n)] = {"fill_s": round(fill_s, 1),
                                    "attempt_rows": count(store, "task_attempt"),
                                    "task_rows": count(store, "task")}
            print(f"{backend}: {n:,} attempt rows filled in {fill_s:.0f} s", flush=True)
        every: dict[int, dict[str, list[float]]] = {n: {k: [] for k in FIGURES}
                                                    for n in sizes}
        for r in range(args.rounds):
            medians: dict[int, dict[str, float]] = {}
            for n in sizes:
                m = measure(stores[n], f"{n}-{r}", args.prompts, args.flushes,
                            args.flush_size, args.checks)
                medians[n] = {k: statistics.median(v) for k, v in m.items()}
                for k in FIGURES:
                    every[n][k] += m[k]
            ratio = {k: medians[sizes[-1]][k] / medians[sizes[0]][k] for k in FIGURES}
            load = [round(x, 2) for x in os.getloadavg()]
            out["rounds"].append({"medians": {str(n): v for n, v in medians.items()},
                                  "ratio": ratio, "load_avg": load})
            print(f"{backend} round {r + 1}: " + ", ".join(
                f"{k} {medians[sizes[0]][k]:.1f} / {medians[sizes[-1]][k]:.1f} ms "
                f"({ratio[k]:.2f})" for k in FIGURES) + f"; load {load}", flush=True)
        for n in sizes:
            e = every[n]
            out["sizes"][str(n)].update({f"{k}_ms_median": statistics.median(e[k])
                                         for k in FIGURES})
            out["sizes"][str(n)]["flush_ms_p90"] = sorted(e["flush"])[
                int(0.9 * (len(e["flush"]) - 1))]
        ratios = [rd["ratio"] for rd in out["rounds"]]
        out["ratio"] = {k: {"median": round(statistics.median(x[k] for x in ratios), 3),
                            "min": round(min(x[k] for x in ratios), 3),
                            "max": round(max(x[k] for x in ratios), 3)} for k in FIGURES}
        print(f"{backend} ratio {sizes[-1]:,}/{sizes[0]:,} (median of rounds, min-max): "
              + ", ".join(f"{k} {v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f})"
                          for k, v in out["ratio"].items()), flush=True)
    finally:
        for store in stores.values():
            store.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="postgresql")
    ap.add_argument("--sizes", default="1000000,10000000", help="attempt rows, ascending")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--flushes", type=int, default=20, help="per round and database")
    ap.add_argument("--flush-size", type=int, default=100)
    ap.add_argument("--checks", type=int, default=6, help="per round and database")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    out: dict[str, Any] = {"machine": _flow_common.machine(), "args": vars(args) | {
        "json": None}, "backends": {}}
    with tempfile.TemporaryDirectory() as d:
        for backend in args.backends.split(","):
            out["backends"][backend] = run(backend, sizes, args, Path(d))
    if args.json:
        args.json.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2, default=str))


if __name__ == "__main__":
    main()
