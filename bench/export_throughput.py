"""Results and export right after a bulk run: rows per second at up to a million rows.

A freshly bulk-loaded table has no planner statistics yet, which is when a query joined
to the attempt table can be planned as a nested loop over a sequential scan (quadratic).
This loads N finished tasks into a fresh database with one server-side statement (as a
bulk run leaves them: result, model, usage, latency, request id and the provider's body
on each row, one creation time per 10,000 rows, a finishing time per row; no ANALYZE
afterwards), then at once times

* ``Lockgate.results(batch)`` iterated to the end (typed rows, JSON parsed),
* ``lockgate export`` in each format (jsonl, csv, openai-batch) to /dev/null, in process,
* the ``lockgate export --format jsonl`` command as a user runs it (a fresh process),

and reports rows/s and the peak RSS of the process (streaming keeps it flat in N).

    python bench/export_throughput.py --rows 1000000
    python bench/export_throughput.py --rows 100000 --db sqlite --db postgresql
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _databases import fresh_url
from lockgate import Lockgate
from lockgate.files import WRITERS

DB_NAME = "lockgate_bench_export"
NOW_MS = 1_796_000_000_000

# The provider's body as an OpenAI-compatible server returns it (~420 bytes).
_BODY = ('{"id": "chatcmpl-", "object": "chat.completion", "created": 1796000000, '
         '"model": "sim-small", "system_fingerprint": "fp_sim", "choices": [{"index": 0, '
         '"message": {"role": "assistant", "content": "{\\"label\\": \\"yes\\", '
         '\\"confidence\\": 0.93}"}, "logprobs": null, "finish_reason": "stop"}], '
         '"usage": {"prompt_tokens": 42, "completion_tokens": 9, "total_tokens": 51}}')
_RESULT = '{"label": "yes", "confidence": 0.93}'


def _load_sql(family: str, n: int) -> str:
    """One INSERT ... SELECT over a generated series of n integers ``i``."""
    if family == "postgresql":
        series, cat = f"generate_series(1, {n}) AS s(i)", "||"
    elif family == "mysql":
        series, cat = f"(SELECT seq AS i FROM seq_1_to_{n}) AS s", "concat"
    else:
        series, cat = "s", "||"

    def join(*parts: str) -> str:
        if cat == "concat":
            return "concat(" + ", ".join(parts) + ")"
        return " || ".join(parts)

    div = "DIV" if family == "mysql" else "/"
    body = _BODY if family != "mysql" else _BODY.replace("\\", "\\\\")
    result = _RESULT
    head, tail = body.split('"chatcmpl-"', 1)
    cols = ("task_id, batch_id, config_hash, input_data, status, visible_at, attempts, "
            "result, parse_status, created_at, updated_at, finished_at, model, "
            "input_tokens, output_tokens, latency_ms, http_status, request_id, response")
    values = ", ".join([
        join("'exp-'", "lpad(cast(i AS char(8)), 8, '0')" if family == "mysql"
             else "printf('%08d', i)" if family == "sqlite"
             else "lpad(i::text, 8, '0')"),
        "'exp'", "'cfg'",
        join("'{\"text\": \"order '", _as_text(family, "i"), "' where is my parcel\"}'"),
        "'SUCCEEDED'", "0", "1", f"'{result}'",
        "'valid'", f"{NOW_MS} + (i {div} 10000) * 1000", f"{NOW_MS} + i", f"{NOW_MS} + i",
        "'sim-small'", "42", "9",
        "120.5", "200", join("'req-'", _as_text(family, "i")),
        join("'" + head.replace("'", "''") + "\"chatcmpl-'", _as_text(family, "i"),
             "'\"" + tail.replace("'", "''") + "'"),
    ])
    if family == "sqlite":
        return (f"WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s "
                f"WHERE i < {n}) INSERT INTO task ({cols}) SELECT {values} FROM {series}")
    return f"INSERT INTO task ({cols}) SELECT {values} FROM {series}"


def _as_text(family: str, expr: str) -> str:
    return {"postgresql": f"{expr}::text", "mysql": f"cast({expr} AS char(12))",
            "sqlite": f"cast({expr} AS text)"}[family]


def load(lg: Lockgate, family: str, n: int) -> float:
    t0 = time.perf_counter()
    with lg.store.engine.begin() as c:
        c.exec_driver_sql(
            "INSERT INTO batch (id, source, created_at) VALUES ('exp', 'bench', "
            f"{NOW_MS})")
        c.exec_driver_sql(_load_sql(family, n))
    return time.perf_counter() - t0


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(label: str, n: int, fn: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    got = fn()
    s = time.perf_counter() - t0
    if got != n:
        raise SystemExit(f"{label}: {got} rows, expected {n}")
    return {"what": label, "s": s, "rows_per_s": n / s, "rss_mb": rss_mb()}


def run_family(family: str, n: int, tmp: Path) -> list[dict[str, Any]]:
    url = fresh_url(family, tmp, DB_NAME)
    if url is None:
        return []
    lg = Lockgate(url)
    load_s = load(lg, family, n)
    print(f"{family}: loaded {n:,} rows in {load_s:.1f} s", file=sys.stderr)
    out: list[dict[str, Any]] = []
    out.append(timed("results()", n, lambda: sum(1 for _ in lg.results("exp"))))
    for fmt, writer in WRITERS.items():
        with open(os.devnull, "w", encoding="utf-8", newline="") as fh:
            out.append(timed(f"export {fmt}", n,
                             lambda w=writer, f=fh: w(lg.results("exp"), f)))
    lg.close()
    cli = [str(Path(sys.executable).with_name("lockgate")), "export", "exp", "--db", url,
           "--format", "jsonl", "--out", os.devnull]
    t0 = time.perf_counter()
    subprocess.run(cli, check=True, capture_output=True)
    s = time.perf_counter() - t0
    out.append({"what": "`lockgate export` (process)", "s": s, "rows_per_s": n / s,
                "rss_mb": None})
    for r in out:
        r["db"] = family
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--db", action="append", choices=["sqlite", "postgresql", "mysql"],
                    help="database family (repeatable; default all three)")
    args = ap.parse_args()
    families = args.db or ["sqlite", "postgresql", "mysql"]
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}; rows: {args.rows:,}")
    print("| database | what | s | rows/s | peak RSS MB |")
    print("|---|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for family in families:
            for r in run_family(family, args.rows, Path(tmp)):
                rss = "-" if r["rss_mb"] is None else f"{r['rss_mb']:.0f}"
                print(f"| {r['db']} | {r['what']} | {r['s']:.1f} | "
                      f"{r['rows_per_s']:,.0f} | {rss} |", flush=True)


if __name__ == "__main__":
    main()
