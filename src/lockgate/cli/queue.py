"""The task commands: ``init``, ``submit``, ``run``, ``worker``, ``status``, ``export``,
``cleanup``, ``simulate``."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import stat
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from lockgate.app import Lockgate
from lockgate.cli._common import (
    DURATION_HELP,
    INTERRUPTED,
    ConfigOpt,
    DbOpt,
    JsonOpt,
    app,
    command,
    console,
    fail,
    opened,
    opened_for_change,
    out,
    print_json,
    seconds,
    table,
    when,
)
from lockgate.cli.circuit import circuit_table
from lockgate.cli.report import summary_table
from lockgate.config import Endpoint, Settings
from lockgate.durations import format_duration, parse_duration
from lockgate.errors import ConfigError, LockgateError, SpecError, StoreError, cannot
from lockgate.files import REVIEW_WRITERS, WRITERS, Format, file_batch
from lockgate.flow.status import report as flow_report
from lockgate.flow.status import trouble
from lockgate.flow.window import BatchPlan, plan_from_options
from lockgate.redact import redact_url
from lockgate.results import Status
from lockgate.store.store import SCHEMA_HEAD, SubmitReport

if TYPE_CHECKING:
    from lockgate.worker.core import WorkerStats

InputFormatOpt = Annotated[str, typer.Option(
    "--input-format", metavar="FORMAT",
    help="the file's format: tasks (lockgate's JSONL) or openai-batch")]
BatchNameOpt = Annotated[str | None, typer.Option(
    "--batch", metavar="ID",
    help="batch id of every task, over any batch_id the lines give [default: each "
         "line's batch_id, else the file's name without extension]")]
SkipOpt = Annotated[bool, typer.Option(
    "--skip-invalid", help="submit the good lines and write the bad ones to a rejects file "
                           "(--rejects) instead of refusing the whole file")]
RejectsOpt = Annotated[Path | None, typer.Option(
    "--rejects", metavar="FILE",
    help="where the bad lines are written, opened only when a line is bad "
         "[NAME.rejects.jsonl beside NAME.jsonl with --skip-invalid; a pipe needs --rejects]")]
ConcOpt = Annotated[int | None, typer.Option(
    "--concurrency", metavar="N", help="calls in flight per worker process [512]")]
ClaimOpt = Annotated[int | None, typer.Option("--claim-batch", metavar="N",
                                              help="rows per claim [256]")]
LeaseOpt = Annotated[str | None, typer.Option(
    "--lease", metavar="DURATION",
    help=f"how long a worker keeps a task without renewing it [60s]; "
                    f"{DURATION_HELP}")]
GraceOpt = Annotated[str | None, typer.Option(
    "--grace", metavar="DURATION",
    help=f"time to finish calls in flight after SIGTERM/Ctrl-C [30s]; "
                    f"{DURATION_HELP}")]
ProcOpt = Annotated[str, typer.Option(
    "--processes", "-p", metavar="N|auto",
    help="worker processes on this machine, each using about one core: a number from 1 "
         "to 256, or auto for one per core this process may run on [1]")]
MAX_PROCESSES = 256


def processes_from(value: str) -> int:
    """``--processes``: a whole number from 1 to 256, or ``auto`` (one per core this
    process may run on, as the scheduler's affinity mask says)."""
    text = value.strip().lower()
    if text == "auto":
        cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count() or 1)
        return max(1, min(MAX_PROCESSES, cores))
    if text.isdigit() and 1 <= int(text) <= MAX_PROCESSES:
        return int(text)
    raise LockgateError(f"--processes takes a whole number from 1 to {MAX_PROCESSES}, or "
                        f"auto (one per core), not {value!r}")

INPUT_FORMATS = ("tasks", "openai-batch")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _progress(auto_refresh: bool = True) -> Progress:
    """A progress bar; without ``auto_refresh`` it starts no thread of its own and is
    redrawn on each update (worker processes are forked only from a single thread)."""
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TaskProgressColumn(), TextColumn("{task.fields[rate]}"),
                    TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                    console=console, transient=False, auto_refresh=auto_refresh)


def _overrides(concurrency: int | None = None, claim_batch: int | None = None,
               lease: str | None = None, grace: str | None = None,
               pool: str | None = None) -> dict[str, Any]:
    values = {"concurrency": concurrency, "claim_batch": claim_batch,
              "lease_s": seconds(lease, "lease", allow_zero=False),
              "shutdown_grace_s": seconds(grace, "grace"), "pool": pool}
    return {k: v for k, v in values.items() if v is not None}


def _submit(lg: Lockgate, file: Path, fmt: str, batch: str | None, skip_invalid: bool,
            rejects: Path | None, plan: BatchPlan | None = None, stream: bool = False,
            on_bad_line: str = "keep") -> SubmitReport:
    if fmt not in INPUT_FORMATS:
        raise LockgateError(f"--input-format must be tasks or openai-batch, not {fmt!r}")
    if on_bad_line not in ("keep", "cancel"):
        raise LockgateError(f"--on-bad-line must be keep or cancel, not {on_bad_line!r}")
    if on_bad_line == "cancel" and not stream:
        raise LockgateError("--on-bad-line goes with --stream (without it a file with a "
                            "bad line submits nothing)")
    rejects = _rejects_path(file, skip_invalid, rejects)
    before = _stamp(rejects)
    fmt_: Format = "openai-batch" if fmt == "openai-batch" else "tasks"
    written = [0]  # rows of committed chunks (the progress is told after each commit)

    with _progress() as prog:
        bar = prog.add_task("submitting", total=None, rate="")

        def advance(n: int) -> None:
            written[0] += n
            prog.advance(bar, n)

        try:
            report = lg.submit_file(
                file, format=fmt_, batch_id=batch, skip_invalid=skip_invalid,
                rejects=rejects, progress=advance, plan=plan,
                stream=stream, on_bad_line="cancel" if on_bad_line == "cancel" else "keep")
        except StoreError as exc:  # cut off part way: say how to finish the batch
            exc.args = (f"{exc} Once it is fixed, run the same command again: it "
                        "completes the batch (tasks already written are skipped).",)
            raise
        except KeyboardInterrupt:
            if not written[0]:  # still checking the file (or before the first commit)
                console.print("interrupted before any task was written: nothing was "
                              "submitted; run the same command again to submit the file",
                              markup=False)
            else:
                console.print("interrupted: the tasks written so far are in and the batch "
                              "is marked incomplete; run the same command again to complete "
                              "it (tasks already written are skipped)", markup=False)
            raise typer.Exit(INTERRUPTED) from None
    names = report.batches or (report.batch_id,)
    console.print(f"{'batch' if len(names) == 1 else 'batches'} {', '.join(names)}: "
                  f"{report.inserted:,} submitted, {report.duplicates:,} already present "
                  "(skipped)", markup=False)
    if report.moved:
        console.print(f"{report.moved:,} line(s) named another batch (batch_id); --batch "
                      f"{report.batch_id} took them", markup=False)
    if report.elsewhere:
        where = ", ".join(f"{n:,} in batch '{b}'" for b, n in sorted(report.elsewhere.items()))
        console.print(f"{sum(report.elsewhere.values()):,} task id(s) already belong to "
                      f"another batch ({where}); they were not moved"
                      + ("" if _kept(report, lg) else
                         f", and batch '{report.batch_id}' was not created"), markup=False)
    after = _stamp(rejects)
    if rejects is not None and after is not None and after != before and after[2]:
        console.print(f"rejected lines written to {rejects}", markup=False)
    return report


def _kept(report: SubmitReport, lg: Lockgate | None = None) -> bool:
    """Whether the submit's batch is there after it. It is when the submit wrote tasks
    to it or met some of the file's there; when every task id it gave belonged to
    another batch already, only if it existed before (or another submit of it is
    unfinished): a batch left without tasks is not kept. That is asked of the database
    with ``lg``, without it answered no."""
    if report.inserted or report.duplicates > sum(report.elsewhere.values()):
        return True
    return lg is not None and lg.store.batch_exists(report.batch_id)


def _stamp(path: Path | None) -> tuple[int, int, int] | None:
    """What tells whether a submit wrote its rejects file (it is opened only when a
    line is rejected): its inode, modification time and size; None if it is absent."""
    try:
        st = os.stat(path) if path is not None else None
    except OSError:
        return None
    return None if st is None else (st.st_ino, st.st_mtime_ns, st.st_size)


def _system_named(file: Path) -> bool:
    """Whether ``file`` is named by the system, not the user: a pipe or descriptor
    (``<(...)`` gives ``/dev/fd/63``), ``/dev/stdin``, anything under /dev or /proc."""
    where = os.path.abspath(file)
    return where.startswith(("/dev/", "/proc/"))


def _rejects_path(file: Path, skip_invalid: bool, rejects: Path | None) -> Path | None:
    """Where the rejected lines go: ``--rejects``, else with ``--skip-invalid`` the file
    beside the task file (``NAME.rejects.jsonl`` for ``NAME.jsonl``). A pipe or a device
    has no such place (``/dev/fd/63.rejects.jsonl``): it needs ``--rejects``."""
    if rejects is not None or not skip_invalid:
        return rejects
    regular = True
    with contextlib.suppress(OSError):
        regular = stat.S_ISREG(os.stat(file).st_mode)
    if not regular or _system_named(file):
        raise LockgateError(f"--skip-invalid on {file} (a pipe or a device) needs --rejects "
                            "FILE: where to write the rejected lines (there is no folder "
                            "of its own to put NAME.rejects.jsonl in)")
    return file.with_suffix(".rejects.jsonl")


@command(app)
def init(db: DbOpt = None) -> None:
    """Create the database's tables, or upgrade them to this version of lockgate."""
    with opened(db, create=True) as lg:
        where = redact_url(lg.store.url)
        found = lg.schema_found
        if found is None:
            said = f"schema created in {where} (revision {SCHEMA_HEAD})"
        elif found == SCHEMA_HEAD:
            said = f"schema is up to date in {where} (revision {SCHEMA_HEAD})"
        else:
            said = f"schema upgraded in {where}: revision {found} -> {SCHEMA_HEAD}"
        console.print(said, markup=False)


@command(app)
def submit(file: Path, db: DbOpt = None, fmt: InputFormatOpt = "tasks",
           batch: BatchNameOpt = None, skip_invalid: SkipOpt = False,
           rejects: RejectsOpt = None, config: ConfigOpt = None,
           window: Annotated[str | None, typer.Option(
               metavar="HH:MM-HH:MM",
               help="time window HH:MM-HH:MM (local time): tasks start at its start and "
                    "are paced to finish inside it")] = None,
           cron: Annotated[str | None, typer.Option(
               metavar="CRON",
               help="window start from a cron expression, e.g. '0 2 * * *'")] = None,
           duration: Annotated[str | None, typer.Option(
               metavar="DURATION", help=f"window length with --cron; {DURATION_HELP}")] = None,
           target: Annotated[float | None, typer.Option(
               metavar="TASKS/S", help="window target tasks/s [tasks / window length]")] = None,
           weight: Annotated[float | None, typer.Option(
               help="SLA base weight of the batch [1]")] = None,
           deadline: Annotated[str | None, typer.Option(
               metavar="WHEN",
               help="a time (ISO 8601) or a duration from now (2h, +90m): urgency grows "
                    "as it nears")] = None,
           stream: Annotated[bool, typer.Option(
               "--stream", help="make tasks claimable as they are read, before the whole "
                                "file is checked: a bad line then stops the submit, keeps "
                                "the tasks before it and leaves the batch incomplete (fix "
                                "it and submit again to complete the batch)")] = False,
           on_bad_line: Annotated[str, typer.Option(
               "--on-bad-line", metavar="keep|cancel",
               help="with --stream: what happens to the tasks written before a bad line: "
                    "kept, or cancelled if no worker has finished them")] = "keep",
           ) -> None:
    """Submit a task file: refused whole if a line is bad (unless --stream or
    --skip-invalid); idempotent on task_id."""
    def plan_at(now: datetime) -> BatchPlan | None:  # local wall time: see clock_window
        return plan_from_options(window=window, cron=cron, duration=duration, weight=weight,
                                 deadline=deadline, target=target, now=now)

    plan = plan_at(datetime.now())  # the options checked before the database is opened
    file_batch(file, batch)  # --batch (or the file's name) as a batch id: likewise
    checked_rejects = _rejects_path(file, skip_invalid, rejects)  # a pipe: --rejects
    with opened(db, config, create=True) as lg:
        if checked_rejects is not None:  # the task file or the database: refused now
            lg.check_rejects(checked_rejects, file)
        past: int | None = None  # a deadline already past, in ms
        if plan is not None:
            # Placed on the database's clock, as workers read it: this machine's may be
            # off (the local time zone still gives the wall time of a window).
            now_ms = lg.store.db_now()
            plan = plan_at(datetime.fromtimestamp(now_ms / 1000))
            if plan is not None and plan.deadline_ms is not None \
                    and plan.deadline_ms <= now_ms:
                past = plan.deadline_ms
        report = _submit(lg, file, fmt, batch, skip_invalid, rejects, plan, stream,
                         on_bad_line)
        kept = plan is not None and _kept(report, lg)  # asked while the database is open
    if plan is not None and plan.window is not None and kept:
        w = plan.window
        console.print(f"window {when(w.start_ms)} - {when(w.end_ms)}: tasks start at its "
                      "start and are paced to finish inside it", markup=False)
    if past is not None and kept:
        # (a year mistyped reads as the most urgent batch there is, without a word)
        console.print(f"note: the deadline {when(past)} has passed: the batch "
                      "is as urgent as a batch gets (max_urgency); was another date "
                      "meant?", markup=False)


def _served(settings: Settings, pool: str | None) -> list[Endpoint]:
    """The endpoints a worker of ``pool`` (None: every pool) may call, fallbacks too."""
    eps = list(settings.endpoints())
    if pool is None:
        return eps
    names = {e.name for e in eps if e.pool == pool}
    todo = list(names)
    while todo:
        ep = settings.endpoint_named(todo.pop())
        if ep is not None and ep.fallback and ep.fallback not in names:
            names.add(ep.fallback)
            todo.append(ep.fallback)
    return [e for e in eps if e.name in names]


def _check_endpoints(settings: Settings, pool: str | None, *, refuse: bool) -> None:
    """Say which endpoints cannot be reached (docs/flow.md, "When an endpoint is
    down"); with ``refuse``, stop when none can."""
    from lockgate.providers import reach  # deferred: start-up time (aiohttp)

    eps = _served(settings, pool)
    if not eps:
        if pool is not None:
            pools = sorted({e.pool for e in settings.endpoints()})
            console.print(
                f"WARNING: no endpoint of this config is in pool {pool!r} (its pools: "
                f"{', '.join(map(repr, pools))}): a task of that pool names an endpoint "
                "this worker does not have, and is handed back for a worker that has it. "
                "Set the endpoint's pool in the config, or start the worker with one of "
                "those pools", markup=False)
        return
    for ep in eps:  # a key variable that is not set: every call would fail
        try:
            ep.api_key()
        except ConfigError as exc:
            raise ConfigError(f"{exc}{'; nothing was submitted' if refuse else ''}") \
                from None
    bad = reach.check(eps)
    if refuse and len(bad) == len(eps):
        what = "; ".join(u.describe() for u in bad)
        raise LockgateError(
            f"{'every endpoint is' if len(bad) > 1 else 'the only endpoint is'} "
            f"unreachable, so no task could run: {what}. Start the provider (the "
            f"simulator: lockgate simulate) or {_where_base_url(settings)}, then run "
            "again; nothing was submitted")
    for u in bad:
        console.print(f"WARNING: {u.describe()}; its tasks wait until it answers",
                      markup=False)


def _where_base_url(settings: Settings) -> str:
    """Where the unreachable endpoints' URL came from, to be fixed there."""
    if settings.endpoint:
        return "fix base_url in the config file (--config)"
    if os.environ.get("LOCKGATE_BASE_URL"):
        return "fix $LOCKGATE_BASE_URL (the endpoint's URL comes from it)"
    return ("set $LOCKGATE_BASE_URL, or add an [[endpoint]] to the config file (--config): "
            "without either, lockgate calls the simulator's default address")


class _ConsoleLog(logging.Handler):
    """Log records printed through the console, above the progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        console.print(f"{record.levelname}: {record.getMessage()}", markup=False)


@command(app)
def worker(db: DbOpt = None, config: ConfigOpt = None, concurrency: ConcOpt = None,
           claim_batch: ClaimOpt = None, lease: LeaseOpt = None, grace: GraceOpt = None,
           burst: Annotated[bool, typer.Option(
               "--burst", help="exit when no task is pending (in --pool's pool, "
                            "with --pool)")] = False,
           gate: Annotated[bool, typer.Option(
               "--gate/--no-gate", help="also run the release gate's roles")] = True,
           pool: Annotated[str | None, typer.Option(
               metavar="POOL", help="serve only this pool (endpoint.pool) [all pools]")] = None,
           processes: ProcOpt = "1",
           log_level: Annotated[str, typer.Option(
               metavar="LEVEL",
               help="logging level: DEBUG, INFO, WARNING, ERROR")] = "WARNING") -> None:
    """Work tasks until SIGTERM/Ctrl-C. Run any number, on any number of machines."""
    if log_level.upper() not in LOG_LEVELS:
        raise LockgateError(f"--log-level must be one of {', '.join(LOG_LEVELS)}, not "
                            f"{log_level!r}")
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    overrides = _overrides(concurrency, claim_batch, lease, grace, pool)
    procs = processes_from(processes)
    with opened(db, config, create=True, wait=True) as lg:
        ws = lg.settings.worker.with_changes(**overrides)  # refuses a flag out of range
        console.print(f"{procs} worker process(es) on {redact_url(lg.store.url)}: "
                      f"concurrency {ws.concurrency} each, lease {ws.lease_s:g}s"
                      if procs > 1 else
                      f"worker on {redact_url(lg.store.url)}: concurrency "
                      f"{ws.concurrency}, lease {ws.lease_s:g}s", markup=False)
        _check_endpoints(lg.settings, pool, refuse=False)
        stats = lg.run_worker(burst=burst, gate=gate, processes=procs,
                              log_level=log_level, **overrides)
        _stopped(stats)  # before the database closes: it would wait on hanging calls


def _stopped(stats: WorkerStats) -> None:
    """Say what the worker did. Stopped at once while the database did not answer,
    the process ends here: closing the database, or the interpreter's exit, would
    wait on the calls still hanging."""
    from lockgate.worker.core import exit_if_stuck  # deferred: start-up time

    console.print(f"worker stopped: {stats.succeeded:,} succeeded, {stats.failed:,} failed, "
                  f"{stats.dead:,} dead, {stats.retried:,} retried, "
                  f"{stats.discarded:,} discarded"
                  + (f", {stats.unwritten:,} not written back (they run again when their "
                     "leases expire)" if stats.unwritten else ""), markup=False)
    exit_if_stuck(stats)


def _done(counts: dict[str, int]) -> int:
    """Tasks no worker will call again (neither PENDING nor held for review)."""
    return sum(n for state, n in counts.items() if state not in ("PENDING", "REVIEW"))


def _counts(lg: Lockgate, batch_ids: Sequence[str]) -> dict[str, int]:
    """Tasks per state over the batches."""
    out: dict[str, int] = {}
    for b in batch_ids:
        for state, n in lg.store.batch_counts(b).items():
            out[state] = out.get(state, 0) + n
    return out


#: How often ``run`` prints a progress line when its output is not a terminal (seconds).
PLAIN_PROGRESS_S = 10.0


def run_batch(lg: Lockgate, batch_id: str | Sequence[str], processes: int = 1,
              **overrides: Any) -> float:
    """Work until the queue is drained, with a progress bar over ``batch_id`` (one batch
    or several)."""
    batch_ids = [batch_id] if isinstance(batch_id, str) else list(batch_id)
    counts = _counts(lg, batch_ids)
    total = sum(counts.values())
    done0 = _done(counts)
    t0 = time.perf_counter()
    issues: list[str] = []  # endpoints in trouble, as the workers report them
    last = [done0]
    # Not a terminal (a log file, a CI job): the bar is drawn once, at the end; a plain
    # progress line every PLAIN_PROGRESS_S instead shows the work going on.
    plain = not console.is_terminal
    next_line = [t0 + PLAIN_PROGRESS_S]
    lines = threading.Lock()
    name = f"batch {', '.join(batch_ids)}"
    with _progress(auto_refresh=processes == 1) as prog:
        bar = prog.add_task(name, total=total, completed=done0, rate="")

        def show(done: int) -> None:
            last[0] = done
            now = time.perf_counter()
            elapsed = now - t0
            rate = (done - done0) / elapsed if elapsed > 0 else 0.0
            said = " | ".join([f"{rate:,.0f} tasks/s", *issues])
            prog.update(bar, completed=done, rate=said, refresh=processes > 1)
            if plain and now >= next_line[0] and lines.acquire(blocking=False):
                try:
                    next_line[0] = now + PLAIN_PROGRESS_S
                    share = f" ({done / total:.0%})" if total else ""
                    console.print(f"{name}: {done:,}/{total:,} finished{share}, {said}, "
                                  f"{elapsed:,.0f} s", markup=False)
                finally:
                    lines.release()

        def look() -> None:
            issues[:] = trouble({"endpoints": w.endpoints} for w in lg.status().workers)

        def poll() -> None:  # most workers are other processes: read the database
            c = _counts(lg, batch_ids)
            look()
            show(_done(c))

        stop = threading.Event()

        def watch() -> None:  # one process: its calls may all be waiting (no progress)
            while not stop.wait(1.0):
                with contextlib.suppress(Exception):
                    look()
                    show(last[0])

        watcher = threading.Thread(target=watch, daemon=True, name="lockgate-progress")
        if processes == 1:
            watcher.start()
        try:
            stats = lg.run_worker(burst=True, processes=processes, tick=poll,
                                  on_progress=lambda stats: show(done0 + stats.finished),
                                  **overrides)
        finally:
            stop.set()
            if watcher.is_alive():
                watcher.join()
        if stats.stuck_db:  # stopped at once, the database hanging: no report to read
            from lockgate.worker.core import exit_if_stuck  # deferred: start-up time

            console.print("interrupted while the database does not answer; run the same "
                          "command again once it does (tasks already done are skipped)",
                          markup=False)
            exit_if_stuck(stats, INTERRUPTED)
        if processes > 1:
            poll()
    return time.perf_counter() - t0


@command(app)
def run(file: Path, db: DbOpt = None, config: ConfigOpt = None,
        fmt: InputFormatOpt = "tasks", batch: BatchNameOpt = None,
        skip_invalid: SkipOpt = False, rejects: RejectsOpt = None,
        concurrency: ConcOpt = None, claim_batch: ClaimOpt = None, lease: LeaseOpt = None,
        processes: ProcOpt = "1") -> None:
    """Submit FILE and work until every task is finished (one machine), with progress,
    then report each batch holding FILE's tasks (also one they belonged to already). A
    file with no task says there is nothing to run. Stopped before (Ctrl-C, SIGTERM), it
    exits with code 130: run it again to finish."""
    procs = processes_from(processes)
    file_batch(file, batch)  # --batch (or the file's name) checked as a batch id
    checked_rejects = _rejects_path(file, skip_invalid, rejects)  # a pipe: --rejects
    handler = _ConsoleLog(logging.WARNING)
    logging.getLogger("lockgate").addHandler(handler)
    logging.getLogger("lockgate").setLevel(logging.WARNING)
    overrides = _overrides(concurrency, claim_batch, lease)
    with opened(db, config, create=True) as lg:
        lg.settings.worker.with_changes(**overrides)  # a flag out of range: nothing submitted
        if checked_rejects is not None:  # the task file or the database: refused now
            lg.check_rejects(checked_rejects, file)
        _check_endpoints(lg.settings, None, refuse=True)
        report = _submit(lg, file, fmt, batch, skip_invalid, rejects)
        # The tasks' own batches, when their lines name them (the submit's own batch is
        # then left empty, and not kept), and those that held the file's task ids
        # already (not moved by the submit): the run works and reports them all.
        named = [*(report.batches or (report.batch_id,)),
                 *sorted(b for b in report.elsewhere if b not in report.batches)]
        counts = {b: lg.store.batch_counts(b) for b in named}
        batches = [b for b, c in counts.items() if sum(c.values())]
        if not batches:  # an empty file, or every line rejected (--skip-invalid)
            console.print(f"nothing to run: {file} holds no task"
                          + (" that passed its checks" if skip_invalid else ""),
                          markup=False)
            return
        # finished by an earlier run: not this run's throughput
        before = {b: _done(counts.get(b, {})) for b in batches}
        elapsed = run_batch(lg, batches, procs, **overrides)
        for b in batches:
            out.print(summary_table(dataclasses.replace(lg.store.summary(b, elapsed),
                                                        done_before=before[b])))
        # A burst worker stops with tasks PENDING only when told to (Ctrl-C, SIGTERM).
        left = _counts(lg, batches).get("PENDING", 0)
    if left:
        console.print(f"interrupted: {left:,} task(s) not finished; run the same command "
                      "again to finish them (tasks already done are skipped)", markup=False)
        raise typer.Exit(INTERRUPTED)


@command(app)
def status(db: DbOpt = None, as_json: JsonOpt = False, config: ConfigOpt = None) -> None:
    """Tasks per state and batch, leases in flight, workers alive, endpoints, windows,
    and alert webhook deliveries waiting."""
    from lockgate.quality.alerts import waiting_deliveries  # deferred: start-up time

    with opened(db, config) as lg:
        st = lg.status()
        flow = flow_report(lg.store, lg.settings, [
            {"endpoints": w.endpoints, "concurrency": w.concurrency} for w in st.workers])
        waiting = waiting_deliveries(lg.store)
    if as_json:
        print_json({**st.to_dict(), "flow": flow, "webhooks_waiting": waiting})
        return
    _print_status(st)
    _print_flow(flow)
    _print_waiting(waiting)


#: Deliveries pending longer than this are shown by `status` (a delivery normally goes
#: out within seconds; one waits when its receiver is down or no worker's config names
#: its webhook).
WAITING_SHOWN_S = 60.0


def _print_waiting(waiting: list[dict[str, Any]]) -> None:
    late = [w for w in waiting if w["oldest_s"] >= WAITING_SHOWN_S]
    for w in late:
        many = "delivery" if w["pending"] == 1 else "deliveries"
        console.print(f"webhook '{w['target']}': {w['pending']:,} alert {many} waiting, "
                      f"the oldest {format_duration(int(w['oldest_s']))} old: a worker "
                      "holding the quality role whose config names this webhook sends "
                      "them (is its receiver down, or was it renamed? docs/quality.md, "
                      "Webhooks)", markup=False)


def _print_status(st: Status) -> None:
    # REVIEW only where a task is held (no circuit routes to review on most databases:
    # the table keeps to 80 columns)
    states = ["PENDING", *(["REVIEW"] if st.review else []), "SUCCEEDED", "FAILED", "DEAD",
              "CANCELLED"]
    t = table("tasks", ["batch", *states], right=tuple(states))
    for b, counts in sorted(st.batches.items()):
        t.add_row(b + (" (incomplete)" if b in st.incomplete_batches else ""),
                  *[f"{counts.get(s, 0):,}" for s in states])
    out.print(t)
    for b in st.incomplete_batches:
        where = st.unfinished_submits.get(b)
        console.print(f"incomplete: a submit of {b}"
                      + (f" ({'; '.join(where)})" if where else "")
                      + " did not finish; run the same submit again"
                      + (" there" if where else "") + " to complete it", markup=False)
    out.print(f"leases in flight: {st.leased:,}   backing off: {st.backing_off:,}"
              + (f"   scheduled: {st.scheduled:,}" if st.scheduled else ""), markup=False)
    if st.unroutable:
        console.print(f"unroutable: {st.unroutable:,} task(s) wait for a worker whose config "
                      "has the endpoint they name (`lockgate tasks show ID` names it): "
                      "deploy that config to the workers (docs/operations.md, "
                      "Upgrading)", markup=False)
    w = table(f"workers alive: {len(st.workers)}",
              ["worker", "status", "in flight", "succeeded", "failed", "discarded",
               "heartbeat"],
              right=("in flight", "succeeded", "failed", "discarded", "heartbeat"))
    for r in st.workers:
        w.add_row(r.id, r.status, f"{r.in_flight}/{r.concurrency}", f"{r.succeeded:,}",
                  f"{r.failed:,}", f"{r.discarded:,}", f"{r.heartbeat_age_s:.1f}s ago")
    out.print(w)
    if st.silent_workers:
        lost = table(f"workers silent: {len(st.silent_workers)} (no heartbeat for 30 s: "
                     "crashed, killed or cut off?)",
                     ["worker", "host", "pid", "last status", "in flight", "heartbeat"],
                     right=("pid", "in flight", "heartbeat"))
        for r in st.silent_workers:
            lost.add_row(r.id, r.hostname, str(r.pid), r.status,
                         f"{r.in_flight}/{r.concurrency}", f"{r.heartbeat_age_s:.0f}s ago")
        out.print(lost)
    if st.circuits:
        out.print(circuit_table(st.circuits))
    if st.review:
        console.print(f"held for review: {st.review:,} task(s); `lockgate export --review` "
                      "lists them, `lockgate tasks resolve` completes one", markup=False)


def _print_flow(flow: dict[str, Any]) -> None:
    """Endpoints (limits, pauses, concurrency, health) and windows (projections)."""
    if flow["endpoints"]:
        t = table("endpoints", ["endpoint", "state", "concurrency", "in flight",
                                "latency", "failures"],
                  right=("in flight", "latency", "failures"))
        for e in flow["endpoints"]:
            per = e.get("worker_concurrency") or []
            conc = (f"{e['concurrency']} = {' + '.join(map(str, per))}" if len(per) > 1
                    else str(e["concurrency"]))
            state = e["breaker"] if e["breaker"] != "closed" else "ok"
            if e["paused_s"]:
                state += f", paused {e['paused_s']:g}s ({e['pause_reason']})"
            t.add_row(e["endpoint"], state, conc, f"{e['in_flight']}+{e['waiting']} waiting",
                      f"{e['latency_ms']:,.0f} ms" if e["latency_ms"] else "-",
                      f"{e['failure_rate']:.2%}" if e["failure_rate"] is not None else "-")
        out.print(t)
        console.print("concurrency: the calls the workers may send at once, each worker "
                      "the lower of its --concurrency and the endpoint's adaptive limit",
                      markup=False)
        limits = [e for e in flow["endpoints"] if e["rpm"] or e["tpm"] or e["fallback"]
                  or e["cost_per_1k_calls"] or (e["pool"] or "default") != "default"]
        if limits:
            t = table("endpoint limits", ["endpoint", "pool", "rpm", "tpm", "cost/1k calls",
                                          "fallback"],
                      right=("rpm", "tpm", "cost/1k calls"))
            for e in limits:
                t.add_row(e["endpoint"], e["pool"] or "-", _num(e["rpm"]), _num(e["tpm"]),
                          _num(e["cost_per_1k_calls"]), e["fallback"] or "-")
            out.print(t)
    if flow["windows"]:
        t = table("windows", ["batch", "window", "done", "target/s", "rate/s", "needs/s",
                              "limits/s", "projected finish", "status"])
        for w in flow["windows"]:
            done = w["total"] - w["remaining"]
            t.add_row(w["batch"], f"{when(w['window_start'])} - {when(w['window_end'])}",
                      f"{done:,}/{w['total']:,}", _num(w["target_per_s"]),
                      f"{w['rate_per_s']:,.1f}", f"{w['required_per_s']:,.1f}",
                      _num(w["capacity_per_s"]), when(w["projected_finish"]),
                      "ok" if w["warning"] is None else "WARNING")
        out.print(t)
        for w in flow["windows"]:
            if w["warning"]:
                console.print(f"window {w['batch']}: {w['warning']}", markup=False)


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:,.4g}"


@command(app)
def export(batch: Annotated[str | None, typer.Argument(
               help="the batch (with --review: optional, else every batch)")] = None,
           db: DbOpt = None,
           fmt: Annotated[str, typer.Option(
               "--format", metavar="FORMAT", help="the output: jsonl, csv or openai-batch")]
           = "jsonl",
           output: Annotated[Path | None, typer.Option(
               "--out", "-o", metavar="FILE", help="file [stdout]")] = None,
           review: Annotated[bool, typer.Option(
               "--review", help="the tasks held for a person (REVIEW) instead: input, "
                                "rendered prompt, why, the last output or error")] = False,
           batch_opt: Annotated[str | None, typer.Option(
               "--batch", metavar="BATCH", help="the batch (same as the argument)")] = None,
           config: ConfigOpt = None) -> None:
    """Write every task of BATCH: its result, or the precise error. With --review, the
    tasks held for review, to be resolved with `lockgate tasks resolve`."""
    writers: dict[str, Any] = REVIEW_WRITERS if review else WRITERS
    if fmt not in writers:
        raise LockgateError(f"--format must be one of {', '.join(sorted(writers))}, "
                            f"not {fmt!r}")
    if batch is not None and batch_opt is not None and batch != batch_opt:
        raise LockgateError("give the batch once: as the argument or as --batch")
    batch = batch or batch_opt
    if batch is None and not review:
        raise LockgateError("give the BATCH to export (`lockgate status` lists them), "
                            "or --review for the tasks held for review")
    with opened(db, config) as lg:
        # NotFound for a batch never submitted, before any output
        rows: Any = lg.review(batch) if review else lg.results(batch)
        if output is None:
            n = writers[fmt](rows, sys.stdout)
        else:
            _not_the_database(output, lg.store.engine.url)
            n = _export_to(output, lambda fh: writers[fmt](rows, fh))
    console.print(f"exported {n:,} task(s)" + (" held for review" if review else ""),
                  markup=False)


def _not_the_database(output: Path, url: Any) -> None:
    """Refuse an export written over the SQLite database it reads (or its journal):
    the export's rename put it in the database's place, and every task was lost."""
    if url.get_backend_name() != "sqlite" or not url.database:
        return
    db = Path(url.database)
    for f in (db, *(db.with_name(db.name + s) for s in ("-wal", "-shm", "-journal"))):
        with contextlib.suppress(OSError):
            if os.path.samefile(output, f):
                raise LockgateError(f"{output} is the database this exports from ({f}); "
                                    "write the export to another file")


def _export_to(output: Path, write: Callable[[IO[str]], int]) -> int:
    """Write an export to ``output`` whole or not at all: into a file beside it, renamed
    over it once complete, so an interrupted export (Ctrl-C, a full disk, a lost
    database) leaves the previous file as it was, never a shorter one that looks
    complete. A FIFO or a device is written directly."""
    target = output.resolve() if output.is_symlink() else output  # written through
    part = target.with_name(f".{target.name[:200]}.{os.getpid()}.part")
    try:
        if target.exists() and not target.is_file():
            raise IsADirectoryError  # a FIFO, a device: no file to stand beside it
        fh = part.open("w", encoding="utf-8", newline="")
    except OSError:  # (or a folder that takes no new file: the file itself, directly)
        try:
            direct = output.open("w", encoding="utf-8", newline="")
        except OSError as exc:
            raise cannot("write", output, exc) from None
        try:
            with direct:
                return write(direct)
        except OSError as exc:  # a full device (/dev/full), a FIFO's reader gone
            raise cannot("write", output, exc) from None
    try:
        with fh:
            n = write(fh)
        with contextlib.suppress(OSError):  # the file's mode (and owner) kept
            st = target.stat()
            os.chmod(part, stat.S_IMODE(st.st_mode))
            os.chown(part, st.st_uid, st.st_gid)
        os.replace(part, target)
    except OSError as exc:
        part.unlink(missing_ok=True)
        raise cannot("write", output, exc) from None
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return n


@command(app)
def cleanup(older_than: Annotated[str, typer.Option(
                "--older-than", metavar="DURATION",
                help=f"age of what is deleted; {DURATION_HELP}")] = "30d",
            tasks: Annotated[bool, typer.Option(
                "--tasks", help="also delete finished tasks that old")] = False,
            db: DbOpt = None, config: ConfigOpt = None) -> None:
    """Retention: delete attempt traces (and optionally finished tasks), alerts resolved
    (with their samples) and alert webhook deliveries done older than an age, and quality
    rollups past `[quality] keep_minutes` and `keep_hours`."""
    from lockgate.quality.alerts import prune_alerts, prune_deliveries  # deferred:
    from lockgate.quality.report import prune_rollups  # start-up time

    age = seconds(older_than, "older_than")
    assert age is not None
    with opened_for_change(db, config) as lg:
        deleted = lg.store.cleanup(older_than_ms=int(age * 1000), tasks=tasks)
        rollups = prune_rollups(lg.store, lg.settings.quality)
        # deliveries first: an old resolved alert goes with its deliveries, which must
        # be counted as the deliveries done they are
        sent = prune_deliveries(lg.store, int(age * 1000))
        alerts, samples = prune_alerts(lg.store, int(age * 1000))
    console.print(f"deleted {deleted['attempts']:,} attempt(s), {deleted['tasks']:,} "
                  f"task(s), {rollups:,} minute or hour rollup row(s), {alerts:,} resolved "
                  f"alert(s) with {samples:,} sample(s), {sent:,} webhook deliveries done",
                  markup=False)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                "help_option_names": []})
def simulate(ctx: typer.Context) -> None:
    """Run the built-in OpenAI-compatible simulator (`lockgate simulate --help` for flags)."""
    from lockgate.simulator.cli import main as simulator_main  # only this command needs it

    try:
        args = _simulator_args(list(ctx.args))
    except LockgateError as exc:
        fail(exc)
    raise typer.Exit(simulator_main(args, prog="lockgate simulate"))


#: The simulator's flags in seconds: `lockgate simulate` reads them in the duration
#: grammar (the simulator itself, standalone, takes plain seconds).
SIMULATOR_DURATIONS = ("--window-s", "--hang-s", "--enforce-s")


def _simulator_args(args: list[str]) -> list[str]:
    """``args`` with each duration flag's value in plain seconds (``1m`` -> ``60``)."""
    out: list[str] = []
    flag: str | None = None
    for arg in args:
        name, eq, value = arg.partition("=")
        if flag is not None:
            out.append(_plain_seconds(flag, arg))
            flag = None
        elif name in SIMULATOR_DURATIONS and eq:
            out.append(f"{name}={_plain_seconds(name, value)}")
        else:
            out.append(arg)
            flag = arg if arg in SIMULATOR_DURATIONS else None
    return out


def _plain_seconds(flag: str, value: str) -> str:
    try:
        return repr(parse_duration(value, allow_zero=flag == "--hang-s"))
    except SpecError as exc:
        raise LockgateError(f"{flag}: {exc.reason}") from None
