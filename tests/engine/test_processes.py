"""Several worker processes under one supervisor (``lockgate worker -p N``, ``lockgate run
-p N``): the supervisor is one of the workers, they share the queue, signals reach each
child once, and no child outlives a supervisor killed with SIGKILL."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lockgate.app import Lockgate, WorkerPlan
from lockgate.cli import app
from lockgate.cli.queue import MAX_PROCESSES, processes_from
from lockgate.errors import ConfigError, LockgateError
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store
from lockgate.worker.processes import run_processes

from .support import (
    WorkerPool,
    clean_env,
    lockgate_cmd,
    rows,
    status_counts,
    tasks,
    wait_for,
    write_jsonl,
)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its new parent) counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_two_processes_share_a_batch_and_report_one_total(
        store: Store, simulator: SimulatorProcess, workers: WorkerPool) -> None:
    n = 300
    simulator.configure(latency={"kind": "fixed", "mean_ms": 60})
    store.submit([parse_task(t) for t in tasks(n)], batch_id="b")
    proc = workers.start(burst=True, concurrency=6, log_level="INFO",
                         extra=["--processes", "2"])
    assert proc.wait(120) == 0, proc.log()
    # The CLI has one thread when it starts the child: it forks (no second import).
    assert "starting 1 worker process(es) by fork" in proc.log(), proc.log()
    assert status_counts(store) == {"SUCCEEDED": n}
    ws = rows(store, "SELECT pid, status, succeeded FROM worker ORDER BY pid")
    assert len(ws) == 2 and proc.pid in {w["pid"] for w in ws}, "the supervisor works too"
    assert all(w["status"] == "stopped" and w["succeeded"] > 0 for w in ws), ws
    assert sum(w["succeeded"] for w in ws) == n
    assert re.search(rf"worker stopped: {n:,} succeeded", proc.log()), proc.log()
    assert simulator.stats()["requests"] == n


def test_a_supervisor_with_other_threads_spawns_its_children(
        db_url: str, store: Store, simulator: SimulatorProcess,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The test process runs threads (the simulator's output drainer), where a fork
    could inherit a held lock: the API then spawns fresh interpreters, which work the
    same queue to the end."""
    n = 200
    assert threading.active_count() > 1
    monkeypatch.setenv("LOCKGATE_BASE_URL", simulator.url)
    store.submit([parse_task(t) for t in tasks(n)], batch_id="b")
    caplog.set_level(logging.INFO, logger="lockgate.worker.processes")
    with Lockgate(db_url) as lg:
        stats = lg.run_worker(burst=True, gate=False, processes=2, concurrency=4)
    assert "starting 1 worker process(es) by spawn" in caplog.text
    assert stats.succeeded == n
    assert status_counts(store) == {"SUCCEEDED": n}
    ws = rows(store, "SELECT pid, succeeded FROM worker")
    assert len(ws) == 2 and os.getpid() in {w["pid"] for w in ws}
    assert simulator.stats()["requests"] == n
    with pytest.raises(ConfigError, match="method='spawn'"):
        run_processes(2, WorkerPlan(db_url, lg.settings, burst=True), method="fork")


def test_a_thread_that_python_does_not_know_of_also_rules_out_fork() -> None:
    """faulthandler's watchdog is a native thread: threading does not list it, the
    kernel does. A fresh interpreter (this one runs other threads already) chooses
    fork before the watchdog starts, and spawn while it runs (an explicit fork is
    refused then)."""
    script = (
        "import faulthandler, threading\n"
        "from lockgate.app import WorkerPlan\n"
        "from lockgate.config import Settings\n"
        "from lockgate.errors import ConfigError\n"
        "from lockgate.worker.processes import run_processes, start_method\n"
        "print(threading.active_count(), start_method())\n"
        "faulthandler.dump_traceback_later(600)\n"
        "print(threading.active_count(), start_method())\n"
        "try:\n"
        "    run_processes(2, WorkerPlan('sqlite://', Settings()), method='fork')\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, check=True).stdout.splitlines()
    assert out[:2] == ["1 fork", "1 spawn"], out
    assert "method='spawn'" in out[2], out


def test_sigterm_to_the_supervisor_stops_every_child_gracefully(
        store: Store, simulator: SimulatorProcess, workers: WorkerPool) -> None:
    """One SIGTERM is forwarded once: the calls in flight (1.5 s each) finish within
    the grace period and are written back; nothing is left leased."""
    simulator.configure(latency={"kind": "fixed", "mean_ms": 1500})
    store.submit([parse_task(t) for t in tasks(200)], batch_id="b")
    proc = workers.start(burst=False, concurrency=4, grace=30,
                         extra=["--processes", "2"])
    wait_for(lambda: simulator.stats()["in_flight"] >= 8, "both children's calls in flight")
    proc.signal(signal.SIGTERM)
    assert proc.wait(60) == 0, proc.log()
    ws = rows(store, "SELECT status, succeeded FROM worker")
    assert [w["status"] for w in ws] == ["stopped", "stopped"]
    assert sum(w["succeeded"] for w in ws) >= 8  # the calls in flight were finished
    assert rows(store, "SELECT COUNT(*) AS n FROM task WHERE lease_token IS NOT NULL "
                       "AND status = 'PENDING'") == [{"n": 0}]
    assert simulator.stats()["duplicate_successes"] == 0


_STOPPED_WHILE_STARTING = """
import os, signal, sys
from contextlib import contextmanager
from lockgate.app import Lockgate, WorkerPlan
from lockgate.worker.processes import run_processes

SUPERVISOR = os.getpid()

class StoppedWhileStarting(WorkerPlan):
    @contextmanager
    def __call__(self):
        with super().__call__() as worker:
            if os.getpid() == SUPERVISOR:
                # before its event loop takes the signals (a stop right after a start);
                # forwarded to the children, wherever they are in their start
                os.kill(os.getpid(), signal.SIGTERM)
            yield worker

with Lockgate(sys.argv[1]) as lg:
    plan = StoppedWhileStarting(sys.argv[1], lg.settings, burst=False, gate=False)
stats = run_processes(3, plan, method="fork")
print("stopped", stats.claimed)
"""


def test_a_stop_that_comes_while_the_workers_start_is_not_lost(
        db_url: str, store: Store, simulator: SimulatorProcess, tmp_path: Path) -> None:
    """SIGTERM right after ``lockgate worker --processes N`` started: the supervisor
    only forwarded it, and its own worker (not yet listening) went on working for good;
    a child still starting died of it (exit code -15) or, for Ctrl-C, printed a
    KeyboardInterrupt from an import. Each now stops as it starts, and all exit 0."""
    script = tmp_path / "stopped.py"
    script.write_text(_STOPPED_WHILE_STARTING)
    proc = subprocess.Popen([sys.executable, str(script), db_url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=clean_env(LOCKGATE_BASE_URL=simulator.url))
    try:
        out, err = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the workers went on working after the stop:\n{err}") from None
    assert proc.returncode == 0, err
    assert "stopped 0" in out, (out, err)
    ws = rows(store, "SELECT status FROM worker")
    assert [w["status"] for w in ws] == ["stopped"] * 3, (ws, err)


def test_children_of_a_killed_supervisor_stop_by_themselves(
        store: Store, simulator: SimulatorProcess, workers: WorkerPool) -> None:
    simulator.configure(latency={"kind": "fixed", "mean_ms": 200})
    store.submit([parse_task(t) for t in tasks(2000)], batch_id="b")
    proc = workers.start(burst=False, concurrency=4, grace=5, extra=["--processes", "2"])
    found = wait_for(lambda: (r := rows(store, "SELECT pid FROM worker")) and len(r) == 2
                     and r, "both workers registered")
    children = [int(r["pid"]) for r in found if int(r["pid"]) != proc.pid]
    assert len(children) == 1, (found, proc.pid)
    proc.popen.kill()
    proc.popen.wait()
    wait_for(lambda: not any(alive(p) for p in children), "the child to exit", timeout=30)
    status = {int(r["pid"]): r["status"] for r in rows(store, "SELECT pid, status FROM worker")}
    # The killed supervisor's own worker could not say so: its leases simply expire.
    assert status == {children[0]: "stopped", proc.pid: "running"}


@pytest.mark.parametrize("processes", [2])
def test_run_with_processes_shows_progress_and_the_summary(
        db_url: str, store: Store, simulator: SimulatorProcess, tmp_path: Path,
        processes: int) -> None:
    n = 120
    path = write_jsonl(tmp_path / "tickets.jsonl", tasks(n))
    res = subprocess.run(lockgate_cmd("run", str(path), "--processes", str(processes),
                                      "--concurrency", "8"),
                         capture_output=True, text=True, timeout=180, cwd=tmp_path,
                         env=clean_env(LOCKGATE_DATABASE_URL=db_url,
                                       LOCKGATE_BASE_URL=simulator.url))
    assert res.returncode == 0, res.stderr
    assert status_counts(store) == {"SUCCEEDED": n}
    summary = " ".join(res.stdout.split())
    assert re.search(rf"tasks SUCCEEDED\W+{n}\b", summary), summary
    assert f"{n}/{n}" in res.stderr  # the progress bar reached the end
    assert len(rows(store, "SELECT id FROM worker")) == processes


def test_processes_must_be_positive(db_url: str) -> None:
    res = subprocess.run(lockgate_cmd("worker", "--processes", "0"), capture_output=True,
                         text=True, timeout=60, env=clean_env(LOCKGATE_DATABASE_URL=db_url))
    assert res.returncode == 2
    assert "--processes" in res.stderr


def test_a_supervisor_whose_own_worker_cannot_start_says_why_and_stops_its_children(
        db_url: str, tmp_path: Path) -> None:
    cfg = tmp_path / "lockgate.toml"
    cfg.write_text('[[endpoint]]\nname = "main"\nbase_url = "http://127.0.0.1:9/v1"\n'
                   'api_key_env = "LOCKGATE_TEST_UNSET_KEY"\n')
    res = subprocess.run(lockgate_cmd("worker", "--config", str(cfg), "--burst",
                                      "--processes", "2"),
                         capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env=clean_env(LOCKGATE_DATABASE_URL=db_url))
    # It exits (so its child did: a supervisor waits for every child it started) with
    # the configuration error itself, not a report of crashed processes.
    assert res.returncode == 2, res.stderr
    err = " ".join(res.stderr.split())
    assert "$LOCKGATE_TEST_UNSET_KEY" in err and "not set" in err, err
    assert "exited abnormally" not in err, err


def test_processes_auto_is_one_per_core_this_process_may_use() -> None:
    cores = len(os.sched_getaffinity(0))
    assert processes_from("auto") == processes_from(" AUTO ") == min(cores, MAX_PROCESSES)
    assert processes_from("3") == 3
    for bad in ("0", "257", "-1", "two", "1.5", ""):
        with pytest.raises(LockgateError, match=r"^--processes takes a whole number from 1 "
                                                 r"to 256, or auto \(one per core\)"):
            processes_from(bad)


def test_worker_processes_auto_from_the_command_line(
        store: Store, simulator: SimulatorProcess, workers: WorkerPool) -> None:
    n = 100
    store.submit([parse_task(t) for t in tasks(n)], batch_id="b")
    proc = workers.start(burst=True, concurrency=4, log_level="INFO",
                         extra=["--processes", "auto"])
    assert proc.wait(120) == 0, proc.log()
    cores = len(os.sched_getaffinity(0))
    expected = (f"{cores} worker process(es) on" if cores > 1 else "worker on")
    assert expected in proc.log(), proc.log()
    assert status_counts(store) == {"SUCCEEDED": n}
    assert len(rows(store, "SELECT pid FROM worker")) == cores


def test_a_wrong_processes_value_is_one_line_and_exit_code_2(db_url: str) -> None:
    result = CliRunner().invoke(app, ["worker", "--db", db_url, "--burst",
                                      "--processes", "many"])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines()[-1] == (
        "error: --processes takes a whole number from 1 to 256, or auto (one per core), "
        "not 'many'"), result.output
