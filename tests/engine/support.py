"""Helpers for the engine tests: task builders, worker processes, polling, database reads.

Nothing here sleeps a fixed time hoping something happened: :func:`wait_for` polls a
condition against a deadline and fails with a message naming what did not happen.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import event
from typer.testing import Result

from helpers import clean_env, rows, scalar, wait_for
from lockgate.config import Settings, WorkerSettings
from lockgate.store import Store
from lockgate.worker import Worker, WorkerStats

#: A prompt whose schema and rule the simulator follows literally: texts that mention
#: "refund" are labelled yes, all others no (see docs of lockgate.simulator.prompt).
SYSTEM = ('Reply with JSON like {{"label": "yes"}}.\n'
          "label: one of yes, no\n"
          "If the text mentions refund then label = yes\n"
          "Otherwise label = no")
TEMPLATE: list[dict[str, str]] = [
    {"role": "system", "content": SYSTEM},
    {"role": "user", "content": "<input>\n{text}\n</input>"},
]
#: A prompt that declares no JSON: the simulator answers prose, which a JSON delivery
#: rule can never accept (a deterministic invalid output, without injected faults).
PROSE_TEMPLATE: list[dict[str, str]] = [
    {"role": "user", "content": "Summarise in one sentence: <input>\n{text}\n</input>"},
]
MODEL = "sim-small"


def text_for(i: int) -> str:
    """The input text of task number ``i`` (every third one asks for a refund)."""
    return f"order {i}: please refund me" if i % 3 == 0 else f"order {i}: where is my parcel"


def expected_label(text: str) -> str:
    """What the simulator answers for ``text`` under :data:`TEMPLATE`."""
    return "yes" if "refund" in text.lower() else "no"


def task(task_id: str, text: str = "where is my parcel", *,
         template: Sequence[Mapping[str, str]] | str = tuple(TEMPLATE),
         model: Mapping[str, Any] | None = None,
         delivery: Mapping[str, Any] | None = None,
         retry: Mapping[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """One task line with the six meta-fields."""
    return {
        "task_id": task_id,
        "prompt_template": template if isinstance(template, str) else [dict(m)
                                                                        for m in template],
        "input_data": {"text": text},
        "model_config": {"name": MODEL, "temperature": 0, "timeout_ms": 20_000,
                         **(model or {})},
        "delivery_rule": {"format": "json", "required_keys": ["label"], **(delivery or {})},
        "retry_policy": {"max_retries": 3, "base_delay_ms": 50, "backoff_factor": 2.0,
                         "jitter": 0.2, "stop_on": [], **(retry or {})},
        **extra,
    }


def tasks(n: int, prefix: str = "t", **kwargs: Any) -> list[dict[str, Any]]:
    """``n`` tasks ``{prefix}-00000`` ... with :func:`text_for` inputs."""
    return [task(f"{prefix}-{i:05d}", text_for(i), **kwargs) for i in range(n)]


def write_jsonl(path: Path, rows: Iterable[Mapping[str, Any] | bytes | str]) -> Path:
    """Write rows (objects, or raw lines given as str/bytes) one per line."""
    with path.open("wb") as fh:
        for row in rows:
            if isinstance(row, str):
                fh.write(row.encode() + b"\n")
            elif isinstance(row, bytes):
                fh.write(row + b"\n")
            else:
                fh.write(orjson.dumps(row) + b"\n")
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSONL file."""
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


# -- database reads -------------------------------------------------------------------

def statements(store: Store, fn: Callable[[], Any]) -> list[tuple[str, Any]]:
    """The SQL statements (and their parameters) the store's engine runs while ``fn()``
    runs."""
    seen: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
               executemany: bool) -> None:
        seen.append((statement, parameters))

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        fn()
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    return seen


def status_counts(store: Store) -> dict[str, int]:
    """Tasks per status."""
    return {r["status"]: int(r["n"]) for r in rows(
        store, "SELECT status, COUNT(*) AS n FROM task GROUP BY status")}


def task_row(store: Store, task_id: str) -> dict[str, Any]:
    """The task row of ``task_id``."""
    found = rows(store, "SELECT * FROM task WHERE task_id = :t", t=task_id)
    assert found, f"no task {task_id}"
    return found[0]


def attempts_of(store: Store, task_id: str) -> list[dict[str, Any]]:
    """The task_attempt rows of one task, oldest first."""
    return rows(store, "SELECT a.* FROM task_attempt a JOIN task t ON t.id = a.task_pk "
                       "WHERE t.task_id = :t ORDER BY a.id", t=task_id)


def all_pending_done(store: Store) -> bool:
    """No task is PENDING any more."""
    return not scalar(store, "SELECT COUNT(*) FROM task WHERE status = 'PENDING'")


# -- workers ----------------------------------------------------------------------------

def lockgate_cmd(*args: str) -> list[str]:
    """The ``lockgate`` command line, run by this interpreter."""
    return [sys.executable, "-m", "lockgate.cli", *args]


@dataclass
class WorkerProcess:
    """One ``lockgate worker`` subprocess; its stdout and stderr go to ``log_path``."""

    popen: subprocess.Popen[bytes]
    log_path: Path
    concurrency: int

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait(self, timeout: float) -> int:
        """Exit code; fails the test (showing the log) when the worker does not exit."""
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
            raise AssertionError(f"worker {self.pid} still running after {timeout:g}s; "
                                 f"log:\n{self.log()[-3000:]}") from None

    def signal(self, sig: signal.Signals) -> None:
        self.popen.send_signal(sig)


@dataclass
class WorkerPool:
    """Starts ``lockgate worker`` subprocesses on one database and simulator; kills any
    still running when the test ends."""

    db_url: str
    base_url: str
    log_dir: Path
    procs: list[WorkerProcess] = field(default_factory=list)

    def start(self, *, burst: bool = True, concurrency: int = 32, lease: float | None = None,
              grace: float | None = None, claim_batch: int | None = None,
              log_level: str = "WARNING", extra: Sequence[str] = ()) -> WorkerProcess:
        args = ["worker", "--concurrency", str(concurrency), "--log-level", log_level,
                *extra]
        if burst:
            args.append("--burst")
        if lease is not None:
            args += ["--lease", str(lease)]
        if grace is not None:
            args += ["--grace", str(grace)]
        if claim_batch is not None:
            args += ["--claim-batch", str(claim_batch)]
        log_path = self.log_dir / f"worker-{len(self.procs)}.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen(
                lockgate_cmd(*args), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, cwd=self.log_dir,
                env=clean_env(LOCKGATE_DATABASE_URL=self.db_url,
                              LOCKGATE_BASE_URL=self.base_url))
        proc = WorkerProcess(popen, log_path, concurrency)
        self.procs.append(proc)
        return proc

    def wait_all(self, timeout: float) -> list[int]:
        """Exit codes of every worker started (waiting for all within ``timeout``)."""
        deadline = time.monotonic() + timeout
        return [p.wait(max(0.1, deadline - time.monotonic())) for p in self.procs]

    def logs(self) -> str:
        return "\n".join(f"--- worker {p.pid}:\n{p.log()[-2000:]}" for p in self.procs)

    def close(self) -> None:
        for p in self.procs:
            if p.alive():
                p.popen.kill()
            p.popen.wait()


def worker_id_of(store: Store, pid: int) -> str:
    """The id a worker process registered under (waits for its row)."""
    found = wait_for(lambda: rows(store, "SELECT id FROM worker WHERE pid = :p", p=pid),
                     f"worker row of pid {pid}")
    return str(found[0]["id"])


# -- in-process worker ---------------------------------------------------------------------

def worker_settings(**overrides: Any) -> Settings:
    """Settings that talk to ``$LOCKGATE_BASE_URL`` with worker overrides."""
    return Settings(worker=WorkerSettings(**overrides))


def run_worker(store: Store, *, until: Callable[[], Any] | None = None,
               timeout: float = 60.0, wall_clock: Callable[[], float] = time.time,
               **overrides: Any) -> WorkerStats:
    """Run a worker in this process: in burst mode (``until`` None) until the queue is
    drained, else until ``until()`` holds, then stop it gracefully. ``wall_clock`` is
    the worker machine's clock (skew it to test clock handling)."""
    settings = worker_settings(**overrides)

    async def main() -> WorkerStats:
        worker = Worker(store, settings, burst=until is None, wall_clock=wall_clock)
        job = asyncio.create_task(worker.run())
        deadline = time.monotonic() + timeout
        if until is not None:
            while not job.done() and not await asyncio.to_thread(until):
                if time.monotonic() > deadline:
                    worker.request_stop(hard=True)
                    await job
                    raise AssertionError(f"worker condition not met within {timeout:g}s")
                await asyncio.sleep(0.02)
            worker.request_stop()
        return await asyncio.wait_for(job, timeout=max(1.0, deadline - time.monotonic()))

    return asyncio.run(main())


class BackgroundWorker:
    """A worker running on its own event loop in a thread of this process, so a test can
    look at the database (or run commands) while calls are in flight."""

    def __init__(self, store: Store, **overrides: Any) -> None:
        self.worker = Worker(store, worker_settings(**overrides))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self.stats: WorkerStats | None = None
        self.error: BaseException | None = None
        self._stop_requested = False
        self._thread = threading.Thread(target=self._main, name="bg-worker", daemon=True)

    def _main(self) -> None:
        async def run() -> WorkerStats:
            self._loop = asyncio.get_running_loop()
            self._ready.set()
            return await self.worker.run()

        try:
            self.stats = asyncio.run(run())
        except BaseException as exc:  # re-raised by stop()
            self.error = exc
        finally:
            self._ready.set()

    def __enter__(self) -> BackgroundWorker:
        self._thread.start()
        self._ready.wait(10)
        return self

    def request_stop(self) -> None:
        """What SIGTERM does (a second call means: stop now)."""
        self._stop_requested = True
        if self._loop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self.worker.request_stop)

    def stop(self, timeout: float = 60.0) -> WorkerStats:
        """Ask the worker to stop gracefully and wait for it."""
        if not self._stop_requested:
            self.request_stop()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the worker did not stop"
        if self.error is not None:
            raise self.error
        assert self.stats is not None
        return self.stats

    def __exit__(self, *exc: object) -> None:
        if self._thread.is_alive():
            self.stop()


def one_error(result: Result) -> str:
    """The single ``error:`` line of a refused command (exit code 2, no traceback)."""
    assert result.exit_code == 2, (result.output, result.exception)
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output, result.output
    errors = [ln for ln in result.output.splitlines() if ln.startswith("error")]
    assert len(errors) == 1 and errors[0].startswith("error: "), result.output
    return errors[0]


@contextlib.contextmanager
def pipe_file(data: bytes) -> Iterator[Path]:
    """``/dev/fd/N``: the read end of a pipe holding ``data`` (as ``<(cat file)`` gives
    a command), whose folder takes no file."""
    r, w = os.pipe()
    try:
        os.write(w, data)  # small: it fits in the pipe's buffer
        os.close(w)
        w = -1
        yield Path(f"/dev/fd/{r}")
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
