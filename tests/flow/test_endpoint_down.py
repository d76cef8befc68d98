"""When the provider is down: the check at start, the warnings, the progress line, and
tasks that wait for the endpoint instead of spending their attempts (docs/flow.md,
"When an endpoint is down"). The real commands and the real simulator, stopped and
started again on the same port."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import orjson

from helpers import clean_env, wait_for
from lockgate.flow.status import trouble
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store
from lockgate.worker import Worker

from .support import rows, run_workers, settings, status_counts, tasks


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def simulator_on(port: int, **config: Any) -> SimulatorProcess:
    return SimulatorProcess(config, extra_args=("--port", str(port))).start()


def lockgate_cmd(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "lockgate.cli", *(str(a) for a in args)]


def write_tasks(path: Path, n: int, **kw: Any) -> Path:
    path.write_bytes(b"".join(orjson.dumps(t) + b"\n" for t in tasks(n, **kw)))
    return path


def config(path: Path, port: int, flow: str = "") -> Path:
    path.write_text(f'[[endpoint]]\nname = "sim"\nbase_url = "http://key:s3cret@127.0.0.1:{port}'
                    f'/v1"\n\n[flow]\nbreaker_open_s = 1\nreport_s = 0.5\n{flow}')
    return path


def one_line(text: str) -> str:
    return " ".join(text.split())


def test_run_refuses_when_its_only_endpoint_is_unreachable(db_url: str,
                                                           tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    res = subprocess.run(
        lockgate_cmd("run", write_tasks(tmp_path / "t.jsonl", 3), "--db", db_url,
                     "--config", config(tmp_path / "lockgate.toml", port)),
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=clean_env())
    assert res.returncode == 2, res.stderr
    assert one_line(res.stderr) == (
        f"error: the only endpoint is unreachable, so no task could run: endpoint 'sim' "
        f"(http://key:***@127.0.0.1:{port}/v1) is unreachable: connection refused (nothing "
        "listens on that port). Start the provider (the simulator: lockgate simulate) or fix "
        "base_url in the config file (--config), then run again; nothing was submitted")
    assert "s3cret" not in res.stderr
    store = Store(db_url)
    try:
        assert status_counts(store) == {}  # nothing submitted
    finally:
        store.close()


def test_run_refuses_before_submitting_when_an_endpoint_key_is_not_set(
        db_url: str, tmp_path: Path, simulator: SimulatorProcess) -> None:
    """The key variable an endpoint names, unset: ``run`` submitted the batch, then
    stopped on the missing key with the tasks stored."""
    cfg = tmp_path / "lockgate.toml"
    cfg.write_text(f'[[endpoint]]\nname = "sim"\nbase_url = "{simulator.url}"\n'
                   'api_key_env = "LOCKGATE_TEST_UNSET_KEY"\n')
    res = subprocess.run(
        lockgate_cmd("run", write_tasks(tmp_path / "t.jsonl", 3), "--db", db_url,
                     "--config", cfg),
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=clean_env())
    assert res.returncode == 2, res.stderr
    assert one_line(res.stderr) == (
        "error: endpoint 'sim' reads its API key from $LOCKGATE_TEST_UNSET_KEY, which is "
        "not set; export LOCKGATE_TEST_UNSET_KEY=... before starting; nothing was "
        "submitted")
    store = Store(db_url)
    try:
        assert status_counts(store) == {}
    finally:
        store.close()
    assert simulator.stats()["requests"] == 0


def test_a_worker_warns_and_its_tasks_wait_for_the_endpoint_without_spending_attempts(
        db_url: str, tmp_path: Path) -> None:
    """``lockgate worker`` with nothing listening: it says so at start and when the
    breaker opens, and the tasks (one retry allowed) neither fail nor spend attempts."""
    port = free_port()
    store = Store(db_url)
    try:
        store.submit([parse_task(t) for t in tasks(3, retry={"max_retries": 1})],
                     batch_id="b")
        # The breaker opens after 3 connection errors in a row instead of 10: the three
        # tasks get there in one round of calls instead of several.
        proc = subprocess.Popen(
            lockgate_cmd("worker", "--db", db_url, "--config",
                         config(tmp_path / "lockgate.toml", port, "breaker_consecutive = 3\n"),
                         "--burst"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
            env=clean_env())
        lines: list[str] = []
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            lines.append(line)
            if "still failing" in line:  # the breaker opened, then a probe failed
                break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        said = "".join(lines) + err
        url = f"http://key:***@127.0.0.1:{port}/v1"
        assert (f"WARNING: endpoint 'sim' ({url}) is unreachable: connection refused "
                "(nothing listens on that port); its tasks wait until it answers") in said
        assert re.search(
            rf"WARNING lockgate\.flow: endpoint 'sim' \({re.escape(url)}\) is failing: "
            r"connection_error: .*; its calls wait 1 s, then try again", said), said
        assert re.search(rf"endpoint 'sim' \({re.escape(url)}\) still failing after \d+ s: "
                         r"connection_error: .*; next try in \d+ s", said), said
        assert "s3cret" not in said + out
        assert status_counts(store) == {"PENDING": 3}
        assert {r["attempts"] for r in rows(store, "SELECT attempts FROM task")} == {0}
        outcomes = {r["outcome"] for r in rows(store, "SELECT outcome FROM task_attempt")}
        assert outcomes == {"unreachable"}, outcomes
    finally:
        store.close()


def test_tasks_do_not_die_while_the_endpoint_is_down_and_succeed_once_it_is_back(
        stores: Callable[[], Store]) -> None:
    """Tasks allowed one retry, the provider down for several breaker periods: before,
    they went DEAD after two connection errors each."""
    port = free_port()
    store = stores()
    store.submit([parse_task(t) for t in tasks(20, retry={"max_retries": 1,
                                                           "base_delay_ms": 50})],
                 batch_id="b")
    cfg = settings([{"name": "sim", "base_url": f"http://127.0.0.1:{port}/v1"}],
                   flow={"breaker_open_s": 0.3, "breaker_max_open_s": 1.0},
                   concurrency=8)
    worker = Worker(stores(), cfg, burst=True)
    sims: list[SimulatorProcess] = []
    seen: dict[str, Any] = {}

    async def tick(elapsed: float) -> None:
        if not sims and elapsed > 4.0:  # down for 4 s: calls failed, the breaker opened
            seen["down"] = await asyncio.to_thread(status_counts, store)
            sims.append(await asyncio.to_thread(simulator_on, port))

    try:
        asyncio.run(run_workers([worker], timeout=120, tick=tick))
    finally:
        for s in sims:
            s.stop()
    assert seen["down"] == {"PENDING": 20}, seen
    assert status_counts(store) == {"SUCCEEDED": 20}
    # Only the call that succeeded spent an attempt.
    assert {r["attempts"] for r in rows(store, "SELECT attempts FROM task")} == {1}
    failed = rows(store, "SELECT COUNT(*) AS n FROM task_attempt WHERE outcome = "
                         "'unreachable'")
    assert failed[0]["n"] >= 1  # they did meet the endpoint down


def test_run_says_when_the_simulator_stops_mid_run_and_finishes_when_it_is_back(
        db_url: str, tmp_path: Path) -> None:
    """``lockgate run`` (a terminal): the simulator stops after some tasks; the run
    warns, its progress line names the endpoint down, and it finishes once the
    simulator is back, with nothing dead."""
    port = free_port()
    sim = simulator_on(port, latency={"kind": "fixed", "mean_ms": 20})
    store = Store(db_url)
    n = 160  # 40 done before the stop, the rest (a few seconds of calls) after it
    proc = subprocess.Popen(
        lockgate_cmd("run", write_tasks(tmp_path / "t.jsonl", n), "--db", db_url,
                     "--config", config(tmp_path / "lockgate.toml", port),
                     "--concurrency", "4"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
        env=clean_env(TTY_COMPATIBLE="1", TTY_INTERACTIVE="1", COLUMNS="200"))
    # The run's output as it comes (so the test can wait for the progress line instead
    # of sleeping for a fixed time), drained by threads so that no pipe fills up.
    chunks: dict[str, list[bytes]] = {"out": [], "err": []}
    readers = [threading.Thread(target=_drain, args=(stream, chunks[name]), daemon=True)
               for name, stream in (("out", proc.stdout), ("err", proc.stderr))]
    for r in readers:
        r.start()
    down_line = r"tasks/s \| endpoint sim down for \d+ s \(connection_error\)"
    try:
        wait_for(lambda: status_counts(store).get("SUCCEEDED", 0) >= 40, "40 tasks done",
                 timeout=60, interval=0.1)
        sim.stop()
        # calls fail, the breaker opens, the workers report it, the progress line says so
        wait_for(lambda: re.search(down_line, one_line(_text(chunks["err"]))),
                 "the progress line to name the endpoint down", timeout=60, interval=0.1)
        sim = simulator_on(port, latency={"kind": "fixed", "mean_ms": 20})
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for r in readers:
            r.join(timeout=10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        sim.stop()
    out, err = _text(chunks["out"]), _text(chunks["err"])
    try:
        assert proc.returncode == 0, err
        said = one_line(err)
        url = f"http://key:***@127.0.0.1:{port}/v1"
        assert f"WARNING: endpoint 'sim' ({url}) is failing: connection_error" in said, said
        assert re.search(down_line, said), said
        assert status_counts(store) == {"SUCCEEDED": n}
        assert "s3cret" not in err + out
    finally:
        store.close()


def _drain(stream: IO[bytes] | None, into: list[bytes]) -> None:
    """Collect what a child process writes on ``stream`` until it closes it."""
    assert stream is not None
    fd = stream.fileno()
    while chunk := os.read(fd, 65536):
        into.append(chunk)


def _text(chunks: list[bytes]) -> str:
    return b"".join(list(chunks)).decode(errors="replace")


def test_the_progress_line_names_endpoints_in_trouble() -> None:
    workers = [
        {"endpoints": {"hosted": {"breaker": "open", "failing_s": 12.4, "retry_in_s": 3.6,
                                  "last_error": "connection_error: refused"},
                       "local": {"breaker": "closed", "failing_s": None}}},
        {"endpoints": {"hosted": {"breaker": "half_open", "failing_s": 11.0},
                       "local": {"breaker": "closed", "failing_s": 6.0,
                                 "last_error": "server_error: HTTP 503"}}},
        {"endpoints": {"spare": {"breaker": "closed", "paused_ms": 9000,
                                 "pause_reason": "quota"}}},
    ]
    assert trouble(workers) == [
        "endpoint hosted down for 12 s (connection_error), next try in 4 s",
        "endpoint local failing for 6 s (server_error)",
        "endpoint spare paused (quota) for 9 s more",
    ]
    assert trouble([{"endpoints": {"ok": {"breaker": "closed", "failing_s": 1.0}}}]) == []


def test_no_terminal_environment_leaks_into_the_other_tests() -> None:
    assert "TTY_INTERACTIVE" not in os.environ


def test_tasks_of_an_unreachable_endpoint_go_to_its_fallback_instead_of_waiting(
        stores: Callable[[], Store], simulator: SimulatorProcess) -> None:
    """Nothing listens on the primary; its fallback answers. A task whose call met the
    connection error (its half-open probes too) waited for the primary's next probe,
    up to a minute at a time, while the fallback was idle: it is rerouted at once,
    without spending an attempt."""
    store = stores()
    store.submit([parse_task(t) for t in tasks(40, retry={"max_retries": 0})], batch_id="b")
    cfg = settings([{"name": "sim", "base_url": f"http://127.0.0.1:{free_port()}/v1",
                     "fallback": "fb"},
                    {"name": "fb", "base_url": simulator.url}],
                   flow={"breaker_open_s": 30.0, "breaker_consecutive": 3}, concurrency=8)
    asyncio.run(run_workers([Worker(stores(), cfg, burst=True)], timeout=120))
    assert status_counts(store) == {"SUCCEEDED": 40}
    assert {r["attempts"] for r in rows(store, "SELECT attempts FROM task")} == {1}
    outcomes = {r["outcome"] for r in rows(store, "SELECT outcome FROM task_attempt")}
    assert outcomes <= {"rerouted", "succeeded"}, outcomes
    assert {r["endpoint"] for r in rows(store, "SELECT endpoint FROM task_attempt "
                                               "WHERE outcome = 'succeeded'")} == {"fb"}


def test_a_refused_key_spends_no_attempts_and_the_tasks_run_once_it_is_accepted(
        stores: Callable[[], Store], simulator: SimulatorProcess) -> None:
    """An endpoint that refuses the key (401) refuses every call until the key is fixed:
    not the tasks' fault. Each task failed at its first call (``auth_error`` was not
    retried), the whole batch FAILED in a moment; now the endpoint counts as down, its
    tasks wait without spending attempts, and they run once the key is accepted."""
    simulator.configure(require_api_key=True)
    store = stores()
    store.submit([parse_task(t) for t in tasks(20, retry={"max_retries": 1,
                                                           "base_delay_ms": 50})],
                 batch_id="b")
    cfg = settings([{"name": "sim", "base_url": simulator.url}],
                   flow={"breaker_open_s": 0.3, "breaker_max_open_s": 1.0}, concurrency=8)
    worker = Worker(stores(), cfg, burst=True)
    seen: dict[str, Any] = {}

    async def tick(elapsed: float) -> None:
        if not seen and elapsed > 3.0:  # refused for 3 s: calls failed, the breaker opened
            seen["refused"] = await asyncio.to_thread(status_counts, store)
            seen["calls"] = (await asyncio.to_thread(simulator.stats))["requests"]
            await asyncio.to_thread(simulator.configure, require_api_key=False)

    asyncio.run(run_workers([worker], timeout=120, tick=tick))
    assert seen["refused"] == {"PENDING": 20} and seen["calls"] >= 1, seen
    assert status_counts(store) == {"SUCCEEDED": 20}
    assert {r["attempts"] for r in rows(store, "SELECT attempts FROM task")} == {1}
    refused = rows(store, "SELECT error_class, COUNT(*) AS n FROM task_attempt "
                          "WHERE outcome = 'unreachable' GROUP BY error_class")
    assert [r["error_class"] for r in refused] == ["auth_error"]
