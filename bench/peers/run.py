"""Peers: lockgate against PgQueuer, arq, Celery, Procrastinate and a naive asyncio loop,
end to end against the built-in simulator. One command runs every figure:

    .venv/bin/python bench/peers/run.py [--tasks 10000] [--scenarios zero,lognormal,errors]
        [--systems naive,pgqueuer,arq,celery,procrastinate,lockgate-sqlite,...]
        (lockgate-<db> runs the worker's defaults, lockgate-<db>-pyreqwest the optional
        HTTP client, lockgate-<db>-auto the worker with --processes auto)
        [--markdown bench/out/peers.md] [--json bench/out/peers.json]

Each peer library lives in a virtualenv of its own, bench/peers/.venvs/<peer>, created
here from bench/peers/requirements/<peer>.txt (pinned; recreated when that file changes):
arq 0.28 needs redis-py < 6 and Celery 5 needs >= 6.1, and none of them is a dependency
of lockgate. Each peer's driver, bench/peers/<peer>_peer.py, runs in that virtualenv.

For every scenario one simulator is started (``lockgate.simulator``); for every system:
its worker process(es) are started as its documentation recommends and given one
warm-up job, so that they are running and idle; the simulator's counters are zeroed;
the clock runs from the start of the submit of N tasks to the moment the last result is
seen persisted (polled every 20 ms); every result is then read back from where the
system stores it and checked against the label the simulator gives that task; the
simulator's stats give the calls, their statuses and the duplicate successes (a task
answered more than once). The naive loop persists nothing: its clock runs from its
first call to its last answer, and its answers are checked in memory. Every system has
the same budget of calls in flight (--concurrency, lockgate's default 512) and the same
retry policy: up to 3 retries, back-off 100 ms doubling, capped at 2 s.

Scenarios (10,000 tasks each by default):
  zero        0 ms model latency
  lognormal   lognormal latency, mean 300 ms (sigma 0.5)
  errors      50 ms latency, 2% of calls answered HTTP 500

Services it uses (never stopped or restarted; it creates and drops its own databases,
Redis keys and queue): PostgreSQL (--pg), MariaDB (--mariadb), Redis databases
--redis-db-arq and --redis-db-celery (must be empty), RabbitMQ (--amqp).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import os
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import create_engine, text

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(HERE)]
from _common import BASE_DELAY_S, CAP_S, MAX_RETRIES, POLL_S, verify  # noqa: E402

import _databases  # noqa: E402
import _flow_common  # noqa: E402
from lockgate.app import Lockgate  # noqa: E402
from lockgate.simulator.responder import Responder, respond  # noqa: E402
from lockgate.simulator.testing import SimulatorProcess  # noqa: E402
from lockgate.store import Store  # noqa: E402
from workload import request_body, task_line  # noqa: E402

PEERS = ("pgqueuer", "arq", "celery", "procrastinate")
#: lockgate on each database with its default settings, and with the optional HTTP
#: client (``[worker] http_client = "pyreqwest"``, the fast-http extra).
#: ``-auto``: ``lockgate worker --processes auto`` (one process per core, the budget of
#: calls in flight shared among them).
LOCKGATE = tuple(f"lockgate-{db}{variant}" for variant in ("", "-pyreqwest", "-auto",
                                                                "-pyreqwest-auto")
                 for db in ("sqlite", "postgresql", "mariadb"))
SYSTEMS = ("naive", *PEERS, *LOCKGATE)
LABELS = {
    "naive": "naive asyncio loop, nothing durable (the limit)",
    "pgqueuer": "PgQueuer (PostgreSQL)",
    "arq": "arq (Redis)",
    "celery": "Celery (RabbitMQ broker, Redis results)",
    "procrastinate": "Procrastinate (PostgreSQL)",
    **{name: ", ".join(
        ["lockgate", {"sqlite": "SQLite", "postgresql": "PostgreSQL",
                      "mariadb": "MariaDB"}[name.split("-")[1]]]
        + [{"pyreqwest": "http_client pyreqwest", "auto": "--processes auto"}[v]
           for v in name.split("-")[2:]]) for name in LOCKGATE},
}
SCENARIOS: dict[str, tuple[str, dict[str, Any]]] = {
    "zero": ("0 ms model", {"latency": {"kind": "fixed", "mean_ms": 0}}),
    "lognormal": ("lognormal 300 ms", {"latency": {"kind": "lognormal", "mean_ms": 300,
                                                   "sigma": 0.5}}),
    "errors": ("50 ms, 2% HTTP 500", {"latency": {"kind": "fixed", "mean_ms": 50},
                                      "rate_500": 0.02}),
}
RETRY_POLICY = {"max_retries": MAX_RETRIES, "base_delay_ms": int(BASE_DELAY_S * 1000),
                "cap_ms": int(CAP_S * 1000)}
TERMINAL = "('SUCCEEDED', 'FAILED', 'DEAD', 'CANCELLED')"
DB_NAME = "lockgate_peers"


# -- virtualenvs ----------------------------------------------------------------------

def venv_python(peer: str, base_python: str) -> Path:
    """The peer's virtualenv, created (or recreated) from its pinned requirements."""
    req = HERE / "requirements" / f"{peer}.txt"
    venv = HERE / ".venvs" / peer
    python = venv / "bin" / "python"
    stamp = venv / ".requirements-sha256"
    digest = hashlib.sha256(req.read_bytes()).hexdigest()
    if python.exists() and stamp.exists() and stamp.read_text() == digest:
        return python
    print(f"  creating {venv.relative_to(ROOT)} from {req.relative_to(ROOT)}", flush=True)
    subprocess.run([base_python, "-m", "venv", "--clear", str(venv)], check=True)
    res = subprocess.run([str(python), "-m", "pip", "install", "--quiet",
                          "--disable-pip-version-check", "-r", str(req)],
                         capture_output=True, text=True, check=False)
    if res.returncode:
        raise SystemExit(f"pip install -r {req} failed:\n{res.stdout[-2000:]}"
                         f"{res.stderr[-3000:]}")
    stamp.write_text(digest)
    return python


# -- expected answers ------------------------------------------------------------------

def expected_labels(n: int) -> list[str]:
    """The label the simulator gives each task (its answers are a pure function of the
    request), computed with the simulator's own responder."""
    responder = Responder()
    out = []
    for i in range(n):
        spec, txt, prompt_tokens = responder.prepare(request_body(i)["messages"])
        out.append(orjson.loads(respond(spec, txt, prompt_tokens, 0.0, False).content)["label"])
    return out


def _sim_counts(stats: dict[str, Any]) -> dict[str, Any]:
    return {"calls": stats["requests"], "by_status": stats["by_status"],
            "duplicates": stats["duplicate_successes"]}


# -- the systems ------------------------------------------------------------------------

def run_naive(sim: SimulatorProcess, a: argparse.Namespace, tmp: Path,
              expected: list[str]) -> dict[str, Any]:
    sim.reset()
    out = tmp / "naive-results.json"
    res = subprocess.run([sys.executable, str(BENCH / "naive_baseline.py"), sim.url, "--tasks",
                          str(a.tasks), "--concurrency", str(a.concurrency), "--max-retries",
                          str(MAX_RETRIES), "--base-delay-ms", str(BASE_DELAY_S * 1000),
                          "--cap-ms", str(CAP_S * 1000), "--results", str(out)],
                         capture_output=True, text=True, check=False)
    if res.returncode:
        raise RuntimeError(f"naive loop failed:\n{res.stderr[-3000:]}")
    doc = orjson.loads(res.stdout.strip().splitlines()[-1])
    answers = orjson.loads(out.read_bytes())
    ids = [f"naive-{i}" for i in range(a.tasks)]
    stored = {f"naive-{k}": v for k, v in answers.items()}
    return {"system": "naive", "tasks": a.tasks, "submit_s": 0.0, "elapsed_s": doc["elapsed_s"],
            "rate": a.tasks / doc["elapsed_s"],
            **verify(stored, ids, expected),
            **_sim_counts(sim.stats()),
            "settings": {"how": "one asyncio process, lockgate's HTTP client, a semaphore of "
                                f"{a.concurrency}, answers kept in memory"}}


def _drop_db(backend: str) -> None:
    if backend == "postgresql":
        admin = _databases.PG_ADMIN.replace("postgresql://", "postgresql+psycopg://")
        eng = create_engine(admin, isolation_level="AUTOCOMMIT")
        with eng.connect() as c:
            c.execute(text(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)"))
        eng.dispose()
    elif backend == "mariadb":
        eng = create_engine(_databases.MY_ADMIN.replace("mysql://", "mysql+pymysql://"))
        with eng.begin() as c:
            c.execute(text(f"DROP DATABASE IF EXISTS {DB_NAME}"))
        eng.dispose()


def _lockgate_count(store: Store, batch: str) -> int:
    with store.read() as conn:
        return int(conn.execute(text(f"SELECT COUNT(*) FROM task WHERE batch_id = :b AND "
                                     f"status IN {TERMINAL}"), {"b": batch}).scalar() or 0)


def run_lockgate(system: str, sim: SimulatorProcess, a: argparse.Namespace, tmp: Path,
                 expected: list[str]) -> dict[str, Any]:
    backend, *variant = system.split("-")[1:]
    client = "pyreqwest" if "pyreqwest" in variant else "aiohttp"
    processes = "auto" if "auto" in variant else "1"
    # the same budget of calls in flight in all: --concurrency is per worker process
    per_process = a.concurrency // (len(os.sched_getaffinity(0)) if processes == "auto" else 1)
    config = tmp / f"{system}.toml"
    config.write_text(f'[worker]\nhttp_client = "{client}"\n')
    url = _flow_common.fresh_db(backend, tmp, name=DB_NAME)
    tasks_file = tmp / f"{system}-tasks.jsonl"
    with tasks_file.open("wb") as f:
        for i in range(a.tasks):
            line = task_line(i, batch="peers")
            line["retry_policy"] = RETRY_POLICY
            f.write(orjson.dumps(line) + b"\n")
    log = (tmp / f"{system}-worker.log").open("wb")
    worker = subprocess.Popen([sys.executable, "-m", "lockgate.cli", "worker", "--db", url,
                               "--config", str(config), "--no-gate", "--concurrency",
                               str(per_process), "--processes", processes],
                              stdout=log, stderr=subprocess.STDOUT,
                              env={**os.environ, "LOCKGATE_BASE_URL": sim.url})
    lg = Lockgate(url)
    probe = Store(url, pool_size=1)
    try:
        warm = task_line(0, batch="warm")
        warm["task_id"] = "warm-0"
        lg.submit([warm], batch_id="warm")
        deadline = time.monotonic() + 120
        while _lockgate_count(probe, "warm") < 1:
            if time.monotonic() > deadline or worker.poll() is not None:
                raise RuntimeError(f"{system}: the warm-up task did not finish; see "
                                   f"{tmp / f'{system}-worker.log'}")
            time.sleep(POLL_S)
        time.sleep(1.0)
        sim.reset()
        t0 = time.perf_counter()
        lg.submit_file(tasks_file, batch_id="peers")
        submitted = time.perf_counter()
        deadline = t0 + a.timeout
        while _lockgate_count(probe, "peers") < a.tasks:
            if time.perf_counter() > deadline or worker.poll() is not None:
                break
            time.sleep(POLL_S)
        ended = time.perf_counter()
        stats = sim.stats()
        stored = {r.task_id: orjson.dumps(r.result).decode()
                  if not isinstance(r.result, str) else r.result
                  for r in lg.results("peers") if r.status == "SUCCEEDED"}
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        log.close()
        probe.close()
        lg.close()
        _drop_db(backend)
    ids = [f"peers-{i:08d}" for i in range(a.tasks)]
    return {"system": system, "tasks": a.tasks, "submit_s": submitted - t0,
            "elapsed_s": ended - t0, "rate": a.tasks / (ended - t0),
            **verify(stored, ids, expected),
            **_sim_counts(stats),
            "settings": {"worker": f"lockgate worker --no-gate (defaults: --concurrency "
                                   f"{per_process} per process; --processes {processes}; "
                                   f"http_client {client})",
                         "submit": "Lockgate.submit_file (what `lockgate submit` runs)",
                         "retry": f"retry_policy {RETRY_POLICY}"}}


def run_peer(peer: str, sim: SimulatorProcess, a: argparse.Namespace, tmp: Path,
             expected_file: Path, python: Path) -> dict[str, Any]:
    db = {"arq": a.redis_db_arq, "celery": a.redis_db_celery}.get(peer, a.redis_db_arq)
    cmd = [str(python), str(HERE / f"{peer}_peer.py"), "--sim", sim.base_url, "--tasks",
           str(a.tasks), "--concurrency", str(a.concurrency), "--expected", str(expected_file),
           "--workdir", str(tmp), "--pg", a.pg, "--redis", f"{a.redis}/{db}", "--amqp", a.amqp,
           "--timeout", str(a.timeout)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=HERE)
    if res.returncode:
        raise RuntimeError(f"{peer} failed ({res.returncode}):\n{res.stderr[-4000:]}")
    doc: dict[str, Any] = orjson.loads(res.stdout.strip().splitlines()[-1])
    return doc


# -- report ----------------------------------------------------------------------------

def machine() -> dict[str, Any]:
    model = ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        model = next((ln.split(":", 1)[1].strip() for ln in out.splitlines()
                      if ln.startswith("Model name")), "")
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cpu": model, "cpus": os.cpu_count(), "memory_gib": round(mem_gib, 1),
            "python": platform.python_version(), "platform": platform.platform()}


def commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=ROOT,
                              check=False).stdout.strip()
    rev = git("rev-parse", "--short", "HEAD")
    return rev + (" (with local changes)" if git("status", "--porcelain", "--", "src",
                                                   "bench") else "")


def cell(row: dict[str, Any] | None) -> str:
    if row is None:
        return "-"
    if "error" in row:
        return "failed"
    rate = f"{row['rate']:,.0f}"
    if row["correct"] != row["tasks"]:
        rate += f" ({row['correct']:,} of {row['tasks']:,} correct)"
    return rate


def tables(rows: list[dict[str, Any]], scenarios: list[str], systems: list[str],
           tasks: int) -> str:
    by = {(r["scenario"], r["system"]): r for r in rows}
    head = f"| {tasks:,} tasks, tasks/s | " + " | ".join(
        SCENARIOS[s][0] for s in scenarios) + " |"
    out = [head, "|---|" + "---:|" * len(scenarios)]
    for sysname in systems:
        out.append(f"| {LABELS[sysname]} | " + " | ".join(
            cell(by.get((s, sysname))) for s in scenarios) + " |")
    out += ["", "| system, scenario | submit s | end to end s | calls | HTTP 500 | duplicates "
                "| results stored, correct |", "|---|---:|---:|---:|---:|---:|---|"]
    for sysname in systems:
        for s in scenarios:
            r = by.get((s, sysname))
            if r is None:
                continue
            if "error" in r:
                why = r["error"].strip().splitlines()[-1][:100].replace("|", "/")
                out.append(f"| {sysname}, {s} | failed: {why} | | | | | |")
                continue
            out.append(f"| {sysname}, {s} | {r['submit_s']:.2f} | {r['elapsed_s']:.2f} | "
                       f"{r['calls']:,} | {r['by_status'].get('500', 0):,} | "
                       f"{r['duplicates']:,} | {r['stored']:,}, {r['correct']:,} correct, "
                       f"{r['wrong']:,} wrong, {r['missing']:,} missing |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--concurrency", type=int, default=512,
                    help="calls in flight per system (lockgate worker's default)")
    ap.add_argument("--seed", type=int, default=20261203, help="the simulator's seed")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="give up on a run after this many seconds")
    ap.add_argument("--pg", default=_databases.PG_ADMIN)
    ap.add_argument("--redis", default="redis://127.0.0.1:6379")
    ap.add_argument("--redis-db-arq", type=int, default=11)
    ap.add_argument("--redis-db-celery", type=int, default=12)
    ap.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672//")
    ap.add_argument("--base-python", default="python3",
                    help="the interpreter the peers' virtualenvs are made from")
    ap.add_argument("--markdown", type=Path, help="also write the tables here")
    ap.add_argument("--json", type=Path, help="also write every figure here")
    a = ap.parse_args()
    scenarios = a.scenarios.split(",")
    systems = a.systems.split(",")
    for name in (*scenarios, *systems):
        if name not in SCENARIOS and name not in SYSTEMS:
            raise SystemExit(f"unknown scenario or system {name!r}")
    started = datetime.datetime.now(datetime.UTC)
    pythons = {p: venv_python(p, a.base_python) for p in systems if p in PEERS}
    expected = expected_labels(a.tasks)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="lockgate-peers-") as td:
        tmp = Path(td)
        expected_file = tmp / "expected.json"
        expected_file.write_bytes(orjson.dumps(expected))
        for scenario in scenarios:
            print(f"== {SCENARIOS[scenario][0]}", flush=True)
            config = {**SCENARIOS[scenario][1], "seed": a.seed}
            with SimulatorProcess(config) as sim:
                for sysname in systems:
                    try:
                        if sysname == "naive":
                            row = run_naive(sim, a, tmp, expected)
                        elif sysname in PEERS:
                            row = run_peer(sysname, sim, a, tmp, expected_file,
                                           pythons[sysname])
                        else:
                            row = run_lockgate(sysname, sim, a, tmp, expected)
                    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                        row = {"system": sysname, "error": str(exc)}
                        print(f"  {sysname:20s} FAILED: {exc}", flush=True)
                    row["scenario"] = scenario
                    rows.append(row)
                    if "error" not in row:
                        print(f"  {sysname:20s} {row['rate']:8,.0f} tasks/s  submit "
                              f"{row['submit_s']:.2f} s, end to end {row['elapsed_s']:.2f} s; "
                              f"{row['calls']:,} calls {row['by_status']}, duplicates "
                              f"{row['duplicates']}; results {row['correct']:,} correct, "
                              f"{row['wrong']} wrong, {row['missing']} missing", flush=True)
    command = "python bench/peers/run.py " + shlex.join(sys.argv[1:])
    info = machine()
    md = (f"Machine: {info['cpus']} CPUs ({info['cpu']}), {info['memory_gib']} GiB, Python "
          f"{info['python']}; commit {commit()}; {started:%Y-%m-%d}\n\n`{command.strip()}`\n\n"
          + tables(rows, scenarios, systems, a.tasks) + "\n")
    print("\n" + md)
    if a.markdown:
        a.markdown.parent.mkdir(parents=True, exist_ok=True)
        a.markdown.write_text(md)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_bytes(orjson.dumps({"machine": info, "commit": commit(), "command": command,
                                         "started": started.isoformat(), "rows": rows},
                                        option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
