"""Several worker processes on one machine, under one supervising process.

One worker is one asyncio event loop, so one Python process uses about one core for
its HTTP client, rendering and parsing. ``run_processes`` runs ``n`` of them against
the same database: the supervising process itself is one, and it starts the other
``n - 1`` (each with its own connections). They coordinate only through the task rows,
exactly like workers on different machines.

Children are forked when the supervisor has a single thread at that moment (the usual
case: ``lockgate worker`` and ``lockgate run`` start them before any thread), so they
begin working within milliseconds with the modules already imported. A fork of a
process with other threads could inherit a lock one of them holds, so otherwise they
are spawned: each then spends a second or more of CPU importing lockgate anew. The
supervisor's own worker starts at once either way. The caller's pooled database
connections are closed first (``release``), as SQLAlchemy advises before a fork: a
child opens its own and inherits none.

Signals: the children run in their own process group, so a terminal's Ctrl-C reaches
only the supervisor, which acts on each SIGINT/SIGTERM it receives and forwards it once
to every child (the first means "stop claiming, finish within the grace period", the
second "now", as for a single worker). A child whose supervisor died (``kill -9``)
stops gracefully by itself, so no worker outlives its supervisor.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict, fields
from types import FrameType
from typing import Any, Protocol

from lockgate.errors import ConfigError, LockgateError
from lockgate.worker.core import exit_if_stuck
from lockgate.worker.loop import run_async
from lockgate.worker.worker import Worker, WorkerStats

log = logging.getLogger(__name__)

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _watch_parent(parent: int) -> None:
    """Stop this worker (gracefully, via its own SIGTERM handler) once its supervisor
    is gone: the child is then re-parented and ``getppid`` changes."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)
            return


class WorkerBuilder(Protocol):
    """Makes the worker of one process: a context manager that opens what the worker
    needs (its own database connections), yields it, and closes them. It must be
    picklable, since spawned children receive it (a module-level dataclass is)."""

    def __call__(self) -> AbstractContextManager[Worker]: ...


def _recorder(early: list[int], *, exit_on_second: bool
              ) -> Callable[[int, FrameType | None], None]:
    """A signal handler for the time before a worker's event loop takes the signals:
    it notes each one in ``early`` (the worker acts on them as it starts:
    ``Worker.early_signals``). With ``exit_on_second``, a second one stops the process
    at once, as a second signal stops a running worker now (a child that is still
    starting holds no task)."""
    def record(signum: int, _frame: FrameType | None = None) -> None:
        early.append(signum)
        if exit_on_second and len(early) >= 2:
            raise SystemExit(128 + signum)
    return record


#: Signals a forked child received before it installed its own handler (the
#: supervisor's, inherited, notes them here instead of acting as the supervisor).
_before_start: list[int] = []


def _child(build: WorkerBuilder, log_level: str | None, parent: int, results: Any,
           index: int) -> None:
    os.setpgid(0, 0)  # out of the terminal's process group: signals come from the parent
    # A forked child inherited the supervisor's handlers. A signal forwarded before the
    # worker's event loop installs its own (the supervisor stopped right after it
    # started) is noted and acted on then: by default it killed the child mid-start
    # (SIGTERM) or raised KeyboardInterrupt in an import (SIGINT).
    early = _before_start
    record = _recorder(early, exit_on_second=True)
    signal.signal(signal.SIGINT, record)
    signal.signal(signal.SIGTERM, record)
    if log_level:
        logging.basicConfig(level=log_level.upper(),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True,
                     name="lockgate-parent-watch").start()
    with build() as worker:
        worker.early_signals = early
        stats: WorkerStats = run_async(worker.run())
    results.put((index, asdict(stats)))  # written to the pipe before it returns
    exit_if_stuck(stats)


def _supervise(children: list[Any], processes: int, done: threading.Event,
               tick: Callable[[], None] | None, tick_s: float) -> None:
    """Until ``done``: report children that exited abnormally (they are not
    restarted; the others go on) and call ``tick`` about every ``tick_s`` seconds."""
    reported_dead: set[str] = set()
    while not done.is_set():
        for c in children:
            c.join(timeout=tick_s / len(children))
            if c.exitcode not in (None, 0) and c.name not in reported_dead:
                reported_dead.add(c.name)
                log.error("worker process %s (pid %s) exited with code %s; %d of %d "
                          "still running", c.name, c.pid, c.exitcode,
                          1 + sum(x.is_alive() for x in children), processes)
        if not children:
            done.wait(tick_s)
        if tick is not None:
            try:
                tick()
            except Exception:  # a progress display must not end the supervision
                log.warning("progress update failed", exc_info=True)


def _add_children(total: WorkerStats, children: list[Any], results: Any) -> WorkerStats:
    """Add the children's counters to ``total``; raise if any did not report."""
    reported = set()
    while not results.empty():
        index, counters = results.get()
        reported.add(index)
        for f in fields(WorkerStats):
            setattr(total, f.name, getattr(total, f.name) + counters[f.name])
    failed = [(i, c.exitcode) for i, c in enumerate(children, 1)
              if c.exitcode != 0 or i not in reported]
    if failed:
        raise LockgateError(
            "worker process(es) exited abnormally: "
            + ", ".join(f"#{i} (exit code {code})" for i, code in failed)
            + "; their leased tasks return to the queue when the leases expire. "
              "Run with --log-level INFO to see why.")
    return total


def start_method() -> str:
    """``fork`` when this process has one thread and the platform forks, else ``spawn``.

    Threads that Python does not know of count too, where ``/proc`` tells: a thread
    started by an extension module (a native library's worker pool, faulthandler's
    watchdog) is as unsafe to fork around as a Python one."""
    if _os_threads() == 1 and "fork" in mp.get_all_start_methods():
        return "fork"
    return "spawn"


def _os_threads() -> int:
    """Threads of this process: the kernel's count where ``/proc`` has it, else
    Python's."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _signal_handlers(children: list[Any]) -> tuple[
        Callable[[int], None], Callable[[int, FrameType | None], None], list[int]]:
    """The supervisor's signal handling: ``forward`` passes a signal on to every child
    still running; ``received``, its handler until its own worker's event loop takes
    the signals, also notes each in ``early`` for that worker (it acts on them as it
    starts: only forwarded, a stop was lost for it, and it went on working)."""
    def forward(signum: int) -> None:
        for c in children:
            if c.pid is not None and c.exitcode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(c.pid, signum)

    early: list[int] = []
    record = _recorder(early, exit_on_second=False)
    supervisor = os.getpid()

    def received(signum: int, frame: FrameType | None = None) -> None:
        if os.getpid() != supervisor:  # a child forked a moment ago, inheriting this
            _before_start.append(signum)
            return
        record(signum, frame)
        forward(signum)
    return forward, received, early


def run_processes(processes: int, build: WorkerBuilder, *, log_level: str | None = None,
                  tick: Callable[[], None] | None = None, tick_s: float = 0.5,
                  release: Callable[[], None] | None = None,
                  method: str | None = None) -> WorkerStats:
    """Run ``processes`` workers (this process and ``processes - 1`` children), each
    made by ``build``, until they stop (burst: the queue is drained; else a signal) and
    return their counters summed. ``tick`` is called every ``tick_s`` seconds while they
    run, from a supervising thread (progress display). The database must be migrated
    already. ``release`` is called just before the children start: it should close the
    caller's idle pooled connections (``Store.close``; they reopen on their next use),
    so that no forked child inherits a database connection, an SQLite file lock or WAL
    index state. ``method`` is the multiprocessing start method, by default
    :func:`start_method`.

    Raises :class:`LockgateError` naming the process if a child exited abnormally (its
    unfinished leases expire and other workers take the tasks over)."""
    if processes < 1:
        raise ConfigError(f"processes must be at least 1, got {processes}")
    if method is None:
        method = start_method()
    elif method == "fork" and _os_threads() > 1:
        raise ConfigError("fork with other threads running could deadlock a child; "
                          "use method='spawn'")
    ctx: Any = mp.get_context(method)  # typeshed: BaseContext, which lacks Process
    log.info("starting %d worker process(es) by %s", processes - 1, method)
    results = ctx.SimpleQueue()
    children = [ctx.Process(target=_child, name=f"lockgate-worker-{i}", daemon=False,
                            args=(build, log_level, os.getpid(), results, i))
                for i in range(1, processes)]

    forward, received, early = _signal_handlers(children)
    done = threading.Event()
    watcher = threading.Thread(target=_supervise, name="lockgate-supervisor", daemon=True,
                               args=(children, processes, done, tick, tick_s))
    previous = {s: signal.signal(s, received) for s in _SIGNALS}
    try:
        if release is not None:
            release()
        for c in children:
            c.start()
        watcher.start()
        with build() as own:
            own.early_signals = early
            own.on_signal = forward  # while it runs, its event loop receives the signals
            try:
                total: WorkerStats = run_async(own.run())
            except BaseException:
                forward(signal.SIGTERM)  # do not leave the children working unsupervised
                raise
            finally:  # its loop gave the signals back to the default handlers
                for s in _SIGNALS:
                    signal.signal(s, lambda signum, _frame: forward(signum))
        for c in children:
            c.join()
    finally:
        done.set()
        if watcher.is_alive():
            watcher.join()
        for s, h in previous.items():
            signal.signal(s, h)
    return _add_children(total, children, results)
