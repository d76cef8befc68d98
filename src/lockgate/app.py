"""The Python API: ``lockgate.connect(url)`` (blocking) and ``lockgate.connect_async(url)``.

Example::

    import lockgate
    lg = lockgate.connect("postgresql://app@db/lockgate")
    lg.submit_file("tasks.jsonl")
    lg.run_worker(burst=True)          # or run `lockgate worker` on many machines
    for row in lg.results("tasks"):
        print(row.task_id, row.status, row.result if row.error is None else row.error)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import difflib
import errno
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal, TextIO, cast

import orjson

from lockgate import runtime
from lockgate.config import Settings, load_settings
from lockgate.durations import parse_duration
from lockgate.errors import (
    ErrorClass,
    LockgateError,
    NotFound,
    SpecError,
    StateConflict,
    cannot,
)
from lockgate.files import (
    Checks,
    Format,
    Intake,
    Reading,
    Spool,
    batch_id_problem,
    check_file,
    file_batch,
    read_tasks,
    refusal,
    rereadable,
    valid_tasks,
)
from lockgate.flow.window import BatchPlan
from lockgate.gate.api import Gate
from lockgate.registry.api import Datasets, Prompts, default_actor
from lockgate.registry.resolver import merge
from lockgate.results import (
    BatchSummary,
    CircuitView,
    ReviewItem,
    Status,
    TaskError,
    TaskResult,
    TaskView,
    utc,
)
from lockgate.spec import TaskConfig, TaskSpec, load_config, registry_reference, unencodable
from lockgate.states import CircuitState, TaskStatus
from lockgate.store import Store, SubmitReport
from lockgate.store.flow import FlowStore
from lockgate.store.types import NewTask
from lockgate.taskids import TaskIds

# The worker, the gate's and the quality loop's services, the alerts and the quality
# reports are imported where they are used (deferred for start-up time: they bring
# aiohttp, the OpenTelemetry SDK and protobuf, which a submit or a status never needs).
if TYPE_CHECKING:
    from lockgate.quality import QualityRow
    from lockgate.quality.alerts import Alert
    from lockgate.worker import Worker, WorkerStats
    from lockgate.worker.core import SideService


class _RejectsSink:
    """The file a submit writes its rejected lines to, opened (and emptied) only when
    the first line is rejected: a submit that rejects nothing leaves it as it was."""

    def __init__(self, path: str | Path) -> None:
        self.path = path
        self._file: TextIO | None = None

    def write(self, text: str) -> int:
        if self._file is None:
            try:
                self._file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 - closed below
            except OSError as exc:
                raise cannot("write", self.path, exc) from None
        return self._file.write(text)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file (through links too; a path that does not exist
    yet is compared by where it resolves)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def _check_rejects(path: str | Path, source: Path, database: str | None) -> None:
    """Refuse a rejects file that is the task file itself or the SQLite database (its
    lines would be written over them), or that cannot be written, before anything is
    read; nothing is opened or created here."""
    target = Path(path)
    if _same_file(target, source):
        raise LockgateError(
            f"--rejects {path} is the task file being submitted: writing the rejected "
            "lines there would destroy it. Name another file, e.g. --rejects "
            f"{source.with_suffix('.rejects.jsonl').name}")
    if database:
        db = Path(database)
        for name in (db, *(db.with_name(db.name + x) for x in ("-wal", "-shm", "-journal"))):
            if _same_file(target, name):
                raise LockgateError(
                    f"--rejects {path} is the SQLite database's file ({name}): writing the "
                    "rejected lines there would destroy the database. Name another file, "
                    f"e.g. --rejects {source.with_suffix('.rejects.jsonl').name}")
    if target.is_dir():
        raise cannot("write", path, IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR)))
    folder = target.absolute().parent
    if not folder.is_dir():
        raise cannot("write", path, FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT)))


@contextmanager
def _rejects_file(path: str | Path | None, source: Path | None = None,
                  database: str | None = None) -> Iterator[TextIO | None]:
    """The file a submit writes its rejected lines to (None: not asked for), checked
    first (:func:`_check_rejects`) and opened at the first rejected line."""
    if not path:
        yield None
        return
    if source is not None:
        _check_rejects(path, source, database)
    sink = _RejectsSink(path)
    try:
        yield cast(TextIO, sink)  # it writes text, all a submit asks of it
    finally:
        sink.close()


class _WrittenIds:
    """The task ids a streamed submit wrote, kept in a temporary file (memory stays flat
    in the file's size), and the ``created_at`` stamps of its chunks: what it cancels
    when a bad line stops it (``on_bad_line="cancel"``)."""

    def __init__(self) -> None:
        self._file: IO[bytes] | None = None
        self.stamps: set[int] = set()

    def __enter__(self) -> _WrittenIds:
        return self

    def __exit__(self, *_exc: object) -> None:
        if self._file is not None:
            self._file.close()

    def __call__(self, ids: list[str], at: int) -> None:
        """A chunk committed (the submit's writer thread, one chunk at a time)."""
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="lockgate-submitted-")  # noqa: SIM115 (closed on exit)
        self.stamps.add(at)
        self._file.write(orjson.dumps(ids) + b"\n")

    def ids(self) -> Iterator[str]:
        if self._file is None:
            return
        self._file.flush()
        self._file.seek(0)
        for line in self._file:
            yield from orjson.loads(line)


def _into(rows: Iterable[NewTask], batch_id: str, named: bool) -> Iterator[NewTask]:
    """``rows`` as the store counts the tasks a named batch takes from another
    (``SubmitReport.moved``): a row naming ``batch_id`` itself is one whose line named
    another batch while the caller ``named`` ``batch_id`` (it wins over a line's own).
    So a line that names ``batch_id`` (named or not) is written with no batch of its
    own, as a line naming none, and, without ``named``, the others keep theirs."""
    for row in rows:
        b = row.batch_id
        if b is None or (b != batch_id and not named):
            yield row
            continue
        # (built directly: NamedTuple._replace costs three times as much a row)
        yield NewTask(row.task_id, batch_id if b != batch_id else None, row.config,
                      row.input_json, row.metadata_json, row.priority, row.pool)


class Lockgate:
    """A handle on one lockgate database (blocking calls)."""

    def __init__(self, url: str | None = None, *, settings: Settings | None = None,
                 config: str | Path | None = None, migrate: bool = True,
                 create: bool = True) -> None:
        """Open the database at ``url`` (default ``$LOCKGATE_DATABASE_URL``, else
        ``sqlite:///lockgate.db``). With ``migrate`` its schema is created or upgraded;
        without ``create`` nothing is created: a database that does not exist, or holds
        no lockgate tables, is refused with :class:`ConfigError` (read-only uses)."""
        self.settings = settings or load_settings(config)
        self.store = Store(url)
        #: The database URL with its password (worker processes open their own).
        self.url: str = self.store.engine.url.render_as_string(hide_password=False)
        #: The schema revision the database was at when opened with ``migrate`` (None:
        #: it had no lockgate tables; ``SCHEMA_HEAD``: nothing was to do).
        self.schema_found: str | None = None
        try:
            if not create:
                self.store.check_schema(old_ok=migrate)
            if migrate:
                self.schema_found = self.store.migrate()
        except BaseException:
            self.store.close()
            raise
        #: The prompt registry, datasets and release gate (docs/gate.md).
        self.prompts = Prompts(self.store, self.settings, judge=self._judge_experiment)
        self.datasets = Datasets(self.store)
        self.gate = Gate(self.store)

    def _judge_experiment(self, experiment: dict[str, Any], min_gain: float,
                          min_tasks: int) -> dict[str, Any]:
        """An A/B test's figures per arm and the rule's verdict, from the quality loop
        (``lg.prompts`` is a layer below it)."""
        from lockgate.quality.experiments import judge  # deferred: start-up time

        return judge(self.store, experiment, min_gain, min_tasks)

    def close(self) -> None:
        """Close the database connections."""
        self.store.close()

    def __enter__(self) -> Lockgate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, tasks: Iterable[TaskSpec | dict[str, Any]], *,
               batch_id: str | None = None, plan: BatchPlan | None = None) -> SubmitReport:
        """Validate every task, then insert them (idempotent on task id) in committed
        chunks, as :meth:`submit_file` does: into ``batch_id`` if given (it wins over a
        task's own ``batch_id``), else each into its own ``batch_id`` or ``"default"``.
        ``plan`` sets the weight, deadline or time window (docs/flow.md) of the batches
        written."""
        problem = None if batch_id is None else batch_id_problem(batch_id)
        if problem is not None:
            raise SpecError(problem, field="batch_id")
        intake = Intake(self._checks(), self._pool_of)
        ids = TaskIds()
        rows = []
        for i, t in enumerate(tasks, start=1):
            row = intake.task(t, i)
            ids.check(row, i)  # the same id with another task: refused, naming both
            rows.append(row)
        bid = batch_id or "default"
        report = self.store.submit_rows(
            _into(rows, bid, batch_id is not None), batch_id=bid,
            batch_fields=plan.fields() if plan else None, named=batch_id is not None)
        return self._settled(report, plan)

    def _checks(self) -> Checks:
        """A submit's checks; each distinct registry reference is looked up once."""
        problems: dict[str, str | None] = {}

        def reference_problem(ref: str) -> str | None:
            if ref not in problems:
                problems[ref] = self._reference_problem(ref)
            return problems[ref]

        return Checks(model_modules=self.settings.runtime.model_modules,
                      max_input_bytes=self.store.max_input_bytes(),
                      reference_problem=reference_problem)

    def _reference_problem(self, ref: str) -> str | None:
        """Why ``@registry:REF`` names no version now (with a likely name), or None."""
        try:
            self.prompts.resolve(ref)
        except NotFound as exc:
            name = ref.split("@", 1)[0]
            names = [p["name"] for p in self.prompts.list()]
            close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
            hint = (f" (did you mean @registry:{close[0]}?)" if close and name not in names
                    else "")
            return f"@registry:{ref}: {exc}{hint}"
        return None

    def check_rejects(self, rejects: str | Path, path: str | Path) -> None:
        """Refuse ``rejects`` as the rejects file of a submit of ``path`` when it is that
        file or this SQLite database's, or cannot be written (:meth:`submit_file` does
        this too, before reading anything)."""
        _check_rejects(rejects, Path(path), self._sqlite_file())

    def _sqlite_file(self) -> str | None:
        """The SQLite database's file (None: a server database)."""
        url = self.store.engine.url
        return url.database if url.get_backend_name() == "sqlite" else None

    def _pool_of(self, spec: TaskSpec) -> str:
        return self.settings.pool_of(spec.model)

    def _settled(self, report: SubmitReport, plan: BatchPlan | None) -> SubmitReport:
        """The report naming the batches written (the submit's own batch is dropped when
        every line named another), with the plan set on each of them: a window without
        a target throughput gets the batch's tasks / length."""
        written = report.batches
        if len(written) > 1:  # the lines named batches: keep those that hold tasks
            written = tuple(b for b in written if sum(self.store.batch_counts(b).values()))
        report = dataclasses.replace(report, batches=written)
        if plan is None:
            return report
        flow = FlowStore(self.store)
        fields = plan.fields()
        w = plan.window
        for b in written:
            if b != report.batch_id and fields:  # the submit's own batch has them
                flow.set_batch(b, **fields)
            if w is not None and w.target_per_s is None:
                total = (report.inserted + report.duplicates - sum(report.elsewhere.values())
                         if len(written) == 1 else sum(self.store.batch_counts(b).values()))
                if total:
                    flow.set_batch(b, target_per_s=total * 1000.0 / w.length_ms)
        return report

    def submit_file(self, path: str | Path, *, format: Format = "tasks",
                    batch_id: str | None = None, skip_invalid: bool = False,
                    rejects: str | Path | None = None,
                    progress: Callable[[int], None] | None = None,
                    plan: BatchPlan | None = None, stream: bool = False,
                    on_bad_line: Literal["keep", "cancel"] = "keep") -> SubmitReport:
        """Submit a JSONL file; nothing is submitted if a line is bad (unless skipping).

        Without ``stream`` the whole file is checked first, then written in committed
        chunks (claimable as they are written). With ``stream`` each chunk is committed, and
        claimable, as soon as it is read and checked: a bad line then stops the submit,
        the tasks before it stay submitted and the batch stays marked incomplete (fix
        the line and submit the file again to complete it), or, with ``on_bad_line=
        "cancel"``, the tasks it wrote that no worker has finished are cancelled."""
        p = Path(path)
        bid = file_batch(p, batch_id)  # checked as a line's batch_id is
        intake = Intake(self._checks(), self._pool_of)
        if stream:
            return self._submit_streamed(p, format, intake, bid, skip_invalid, rejects,
                                         progress, plan, on_bad_line, batch_id is not None)
        # A pipe (``<(...)``, a FIFO, /dev/stdin on a pipe) is read once: its checked rows
        # must be kept, in the temporary folder if its own folder (/dev/fd) takes no file.
        once = not rereadable(p)
        with Spool(p.parent, temp_fallback=once) as spool:
            with _rejects_file(rejects, p, self._sqlite_file()) as sink:
                checked = check_file(p, format, reject_sink=sink, intake=intake,
                                     spool=spool)
            if checked.rejected and not skip_invalid:
                raise SpecError(refusal(p, checked.valid, checked.rejected))
            skip = {n for n, _ in checked.rejected}
            # The rows the check kept on disk; the file again if it could not keep them
            # (a pipe cannot be read again: refused, before anything is written).
            if spool.finish():
                rows = spool.rows()
            elif once:
                raise LockgateError(
                    f"{p} can be read only once (a pipe), and its checked tasks could not "
                    f"be kept on disk for writing ({spool.problem}); nothing was "
                    "submitted. Save it to a file and submit that, or submit it with "
                    "--stream (stream=True), which reads it once")
            else:
                rows = valid_tasks(p, format, skip, intake)
            return self._settled(self.store.submit_rows(
                _into(rows, bid, batch_id is not None), batch_id=bid, source=str(p),
                progress=progress, batch_fields=plan.fields() if plan else None,
                named=batch_id is not None), plan)

    def _submit_streamed(self, p: Path, format: Format, intake: Intake, bid: str,
                         skip_invalid: bool, rejects: str | Path | None,
                         progress: Callable[[int], None] | None, plan: BatchPlan | None,
                         on_bad_line: Literal["keep", "cancel"], named: bool) -> SubmitReport:
        with contextlib.ExitStack() as stack, \
                _rejects_file(rejects, p, self._sqlite_file()) as sink, \
                _WrittenIds() as written:
            reading = Reading()
            # The file is opened (or refused: missing, a folder) here, before the batch.
            reader = read_tasks(p, format, intake, reading, reject_sink=sink,
                                on_bad="skip" if skip_invalid else "stop")
            stack.enter_context(contextlib.closing(reader))
            rows = _into(reader, bid, named)
            if named:
                reading.batches = {None}  # every line goes to the named batch
            try:
                report = self.store.submit_rows(
                    rows, batch_id=bid, source=str(p), progress=progress,
                    batch_fields=plan.fields() if plan else None,
                    written=written if on_bad_line == "cancel" else None, named=named)
            except SpecError as exc:
                if reading.stopped_at is None:
                    raise
                raise SpecError(f"{exc}; the submit stopped there: " + self._stopped(
                    reading, bid, written if on_bad_line == "cancel" else None)) from None
        return self._settled(report, plan)

    def _stopped(self, reading: Reading, batch_id: str,
                 written: _WrittenIds | None) -> str:
        """What a streamed submit stopped by a bad line left, cancelling it if asked:
        the tasks it inserted itself, never those another submit wrote to the batch.
        The batches named are those its lines went to (a line may name its own); none
        when it stopped at the first line without a batch named (none was opened)."""
        if not reading.batches:
            return ("nothing was submitted (no batch was made). Fix the line and submit "
                    "the file again")
        named = sorted({b if b is not None else batch_id for b in reading.batches})
        which = (f"batch {named[0]!r} is" if len(named) == 1 else
                 "batches " + ", ".join(repr(b) for b in named) + " are")
        if written is None:
            return (f"the {reading.valid:,} task(s) before it are submitted and {which} "
                    "marked incomplete. Fix the line and submit the file again to complete "
                    f"{'it' if len(named) == 1 else 'them'} (tasks already in are skipped)")
        n = self.store.cancel_submitted(written.ids(), written.stamps,
                                        f"cancelled: line {reading.stopped_at} of the "
                                        "file submitted with it is bad")
        retry = " and ".join(f"`lockgate tasks retry --batch {b} --status CANCELLED`"
                             for b in named)
        return (f"{n:,} task(s) it had submitted that no worker had finished were cancelled "
                f"(of {reading.valid:,} before the line); {which} marked incomplete. Fix "
                "the line and submit the file again: tasks already in are skipped, the "
                f"cancelled ones stay cancelled ({retry} runs them again)")

    def worker(self, *, burst: bool = False, gate: bool = True,
               on_progress: Callable[[WorkerStats], None] | None = None,
               **overrides: Any) -> Worker:
        """A worker bound to this database (run it with ``asyncio``/``run_worker``);
        with ``gate`` it also runs the release gate's roles. ``on_progress`` is called
        with its counters after every write-back; ``overrides`` set ``[worker]``
        settings (``concurrency=...``)."""
        from lockgate.gate.service import GateService  # deferred: start-up time
        from lockgate.quality.circuit import CircuitService
        from lockgate.quality.service import AlertService
        from lockgate.worker import Worker

        settings = self.settings
        if overrides:  # checked as the config file is (SpecError naming the setting)
            settings = settings.model_copy(update={
                "worker": settings.worker.with_changes(**overrides)})
        g = settings.gate
        services: list[SideService] = [GateService(
            self.store, lease_s=g.lease_s or settings.worker.lease_s, poll_s=g.poll_s,
            idle_max_s=g.idle_max_s, page=g.page, pool_of=settings.pool_of_document)
        ] if gate and g.enabled else []
        if settings.quality.alerts:
            services.append(AlertService(self.store, settings))
        if settings.quality.circuit:  # every worker evaluates; a move is a compare-and-swap
            services.append(CircuitService(self.store, settings.quality))
        return Worker(self.store, settings, burst=burst, services=services,
                      on_progress=on_progress)

    def run_worker(self, *, burst: bool = False, gate: bool = True, processes: int = 1,
                   on_progress: Callable[[WorkerStats], None] | None = None,
                   tick: Callable[[], None] | None = None, log_level: str | None = None,
                   **overrides: Any) -> WorkerStats:
        """Work tasks until stopped (SIGTERM/SIGINT) or, with ``burst``, until drained
        (no task PENDING and, with ``gate``, no candidate still being evaluated).
        ``processes`` > 1 runs that many worker processes (one core each; children set
        up logging at ``log_level``) and returns their counters summed; ``tick`` is
        then called about twice a second (progress), and ``on_progress`` otherwise."""
        from lockgate.worker.loop import run_async  # deferred: start-up time
        from lockgate.worker.processes import run_processes

        if processes > 1:
            self.settings.worker.with_changes(**overrides)  # refused here, not in a child
            plan = WorkerPlan(self.url, self.settings, burst=burst, gate=gate,
                              overrides=dict(overrides))
            return run_processes(processes, plan, log_level=log_level, tick=tick,
                                 release=self.store.close)
        return run_async(self.worker(burst=burst, gate=gate, on_progress=on_progress,
                                     **overrides).run())

    def status(self) -> Status:
        """Counts per batch and state (REVIEW included), leases in flight, live workers,
        incomplete batches, and the completeness circuits configured."""
        st = self.store.status()
        if not self.settings.quality.circuit:
            return st
        return dataclasses.replace(st, circuits=self.circuits())

    # -- the completeness circuits and human review (docs/quality.md) -----------------

    def circuits(self) -> list[CircuitView]:
        """Every configured completeness circuit with its state now."""
        from lockgate.quality.circuit import circuit_views  # deferred: start-up time

        return circuit_views(self.store, self.settings.quality)

    def open_circuit(self, prompt: str, *, actor: str | None = None,
                     reason: str | None = None) -> CircuitView:
        """Open a circuit by hand: its new tasks go to its fallback (probes aside) until
        it is closed by hand. :class:`StateConflict` when it is already held open."""
        from lockgate.quality.circuit import set_circuit  # deferred: start-up time

        return set_circuit(self.store, self.settings.quality, prompt, CircuitState.OPEN,
                           actor=actor, reason=reason)

    def close_circuit(self, prompt: str, *, actor: str | None = None,
                      reason: str | None = None) -> CircuitView:
        """Close a circuit by hand; it opens again only on minutes from then on."""
        from lockgate.quality.circuit import set_circuit  # deferred: start-up time

        return set_circuit(self.store, self.settings.quality, prompt, CircuitState.CLOSED,
                           actor=actor, reason=reason)

    def review(self, batch_id: str | None = None) -> Iterator[ReviewItem]:
        """Every task held for a person (REVIEW), of one batch or all, in submission
        order: its input, the rendered prompt, why it is held, the last call's output or
        error, and the output schema a resolution must meet."""
        rows = self.store.review_rows(batch_id)  # NotFound for an unknown batch, now
        configs: dict[tuple[str, str | None], TaskConfig | None] = {}

        def items() -> Iterator[ReviewItem]:
            for r in rows:
                held, last = r["held"], r["last"]
                version = held["prompt_version"] if held else None
                key = (r["config_hash"], version)
                if key not in configs:
                    configs[key] = self._review_config(r["config_hash"], version)
                config = configs[key]
                data = orjson.loads(r["input_data"])
                messages: Any = None
                if held and held["prompt_snapshot"]:
                    messages = orjson.loads(held["prompt_snapshot"])
                elif config is not None:
                    with contextlib.suppress(LockgateError):
                        messages = runtime.render(config, data).messages
                error = None
                if last and (last["error_class"] or last["error_message"]):
                    error = TaskError(last["error_class"], last["error_message"])
                yield ReviewItem(
                    task_id=r["task_id"], batch_id=r["batch_id"], input=data,
                    prompt=version, messages=messages,
                    reason=(held["error_message"] if held else None) or r["error_message"],
                    held_at=utc(held["started_at"]) if held else utc(r["updated_at"]),
                    attempts=int(r["attempts"]),
                    last_output=last["raw_output"] if last else None,
                    last_parse_status=last["parse_status"] if last else None,
                    last_error=error,
                    output_schema=config.delivery_rule.json_schema if config else None,
                    model_config=config.model.model_dump(mode="json", exclude_none=True)
                    if config else None)
        return items()

    def _review_config(self, config_hash: str, version: str | None) -> TaskConfig | None:
        """The config a task held for review would have run under (its registry version
        as held), None when it cannot be had any more."""
        doc = self.store.configs([config_hash]).get(config_hash)
        if doc is None:
            return None
        try:
            ref = registry_reference(doc.get("prompt_template"))
            if ref is None:
                return load_config(doc)
            return merge(doc, self.prompts.resolve(version or ref))
        except (LockgateError, ValueError):
            return None

    def resolve(self, task_id: str, result: Any, *, actor: str | None = None,
                reason: str | None = None) -> None:
        """Complete a task held for review: REVIEW -> SUCCEEDED with ``result`` (a JSON
        value), checked against the task's delivery rule first (:class:`SpecError`
        naming the field); :class:`StateConflict` when the task is not in REVIEW. The
        resolution (who, why, the result) is kept in the task's trace."""
        from lockgate.quality.circuit import actor_of  # deferred: start-up time

        view = self.store.task(task_id)  # NotFound, with the fix
        if view.status != TaskStatus.REVIEW:
            raise StateConflict(f"cannot resolve task '{task_id}': it is {view.status}, "
                                "and resolve needs REVIEW (`lockgate export --review` "
                                "lists those)")
        held = [a for a in view.attempt_log if a.outcome == "review"]
        version = held[-1].prompt_version if held else None
        config = self._review_config(view.config_hash, version)
        if config is not None:  # (fields with a fallback take it, as in an answer)
            result = runtime.check_result(config.delivery_rule, result,
                                          model_modules=self.settings.runtime.model_modules)
        observe = None
        if self.settings.quality.rollups:  # the task ends: counted under its prompt
            from lockgate.quality.writer import RollupWriter  # deferred: start-up time
            # A shard of its own per process and thread: two resolves at once that
            # each open a new minute's row would collide on the same key.
            shard = f"resolve:{os.getpid()}:{threading.get_ident()}"
            observe = RollupWriter(self.store, shard=shard,
                                   endpoint=self.settings.endpoint_named,
                                   keywords=self.settings.quality.keywords).record
        try:
            text = orjson.dumps(result).decode()
        except (TypeError, orjson.JSONEncodeError) as exc:  # 10**30, a set, a cycle
            raise SpecError(unencodable(exc), field="result") from None
        self.store.resolve(task_id, text,
                           actor=actor_of(actor), reason=reason, prompt_version=version,
                           observe=observe)

    def results(self, batch_id: str | None = None) -> Iterator[TaskResult]:
        """Every task of a batch (all batches if None) with its result or error,
        streamed in submission order. :class:`NotFound` for a batch never submitted."""
        return self.store.results(batch_id)

    def summary(self, batch_id: str | None = None,
                elapsed_s: float | None = None) -> BatchSummary:
        """What happened to a batch (or all): tasks per state, calls, retries, duplicate
        calls, errors, parse statuses, latency percentiles, field completeness; with
        ``elapsed_s`` also the throughput."""
        return self.store.summary(batch_id, elapsed_s)

    def task(self, task_id: str) -> TaskView:
        """A task, its config and its attempts."""
        return self.store.task(task_id)

    def retry(self, task_id: str) -> None:
        """Run a FAILED, DEAD or CANCELLED task again with a fresh attempt budget."""
        self.store.retry(task_id)

    def retry_batch(self, batch_id: str, *, statuses: Iterable[str] = ("FAILED", "DEAD"),
                    error_class: str | None = None) -> int:
        """Run again every task of a batch in one of ``statuses`` (and, if given, with
        ``error_class``, e.g. ``"connection_error"``), in one transaction; returns how
        many. Idempotent: a second call finds nothing more. An ``error_class`` that is
        no :class:`ErrorClass` is refused (:class:`SpecError`, with the likely one)."""
        known = [e.value for e in ErrorClass]
        if error_class is not None and error_class not in known:
            close = difflib.get_close_matches(error_class, known, n=1, cutoff=0.6)
            raise SpecError(f"{error_class!r} is not an error class; "
                            + (f"did you mean '{close[0]}'?" if close else
                               f"one of {', '.join(known)}"), field="error_class")
        return self.store.retry_batch(batch_id, statuses=statuses, error_class=error_class)

    def cancel(self, task_id: str) -> None:
        """Cancel a PENDING task, or one held for review (REVIEW)."""
        self.store.cancel(task_id)

    def quality(self, prompt: str | None = None, *, since: str | float = "24h",
                by: str = "version") -> list[QualityRow]:
        """Quality figures of the last ``since`` (a duration such as ``"24h"``, or
        seconds) per prompt version (``by="version"``), version and model (``"model"``)
        or version and hour (``"hour"``), read from the rollups (docs/quality.md).
        ``prompt``: a registry name (all its versions), ``name@N`` or ``inline:…``."""
        from lockgate.quality.report import quality_report  # deferred: start-up time

        since_s = parse_duration(since, field="since", allow_zero=False)  # (named first)
        return quality_report(self.store, self.quality_key(prompt), since_s=since_s, by=by)

    def quality_key(self, prompt: str | None) -> str | None:
        """The rollups' key of a prompt as a user names it: a registry name as it is,
        once the registry has it; ``NAME@V`` with V a version as anywhere else (``3``,
        ``v3``, a tag or a label) as ``NAME@N``, once the registry has that version; an
        inline key (``inline:…``) as it is. An unknown prompt or version is refused
        (:class:`NotFound`, naming it), not read as one that made no calls."""
        if prompt is None or prompt.startswith("inline:"):
            return prompt
        name, at, selector = prompt.partition("@")
        if not at:
            self._known_prompt(name)
            return prompt
        if not selector.strip():
            raise SpecError(f"{prompt!r}: name a version after @ (NAME@3, NAME@v3, a tag "
                            "or a label), or give NAME for every version", field="prompt")
        return f"{name}@{self.prompts.version(name, selector).version}"

    def _known_prompt(self, name: str) -> None:
        """:class:`NotFound` (with a likely name) if the registry has no prompt ``name``:
        a mistyped name would read as a prompt that made no calls."""
        names = [p["name"] for p in self.prompts.list()]
        if name in names:
            return
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise NotFound(f"no prompt named {name!r} in the registry{hint}; `lockgate prompt "
                       "list` lists them, and an inline template's key starts with inline:")

    def alerts(self, *, everything: bool = False, limit: int = 1000) -> list[Alert]:
        """Open quality alerts, oldest first; with ``everything`` resolved ones too,
        the newest ``limit``, newest first (docs/quality.md)."""
        from lockgate.quality.alerts import list_alerts  # deferred: start-up time

        return list_alerts(self.store, everything=everything, limit=limit)

    def alert(self, alert_id: int) -> Alert:
        """One alert with its failing samples and webhook deliveries; :class:`NotFound`
        if there is none of that id."""
        from lockgate.quality.alerts import get_alert  # deferred: start-up time

        return get_alert(self.store, alert_id)

    def ack_alert(self, alert_id: int, *, actor: str | None = None,
                  reason: str | None = None) -> Alert:
        """Acknowledge an alert (who and why are kept; a second ack changes nothing). An
        acknowledged alert is still updated and resolves as before."""
        from lockgate.quality.alerts import ack_alert  # deferred: start-up time

        return ack_alert(self.store, alert_id, actor=actor or default_actor(),
                         reason=reason,
                         targets=[w.target for w in self.settings.quality.webhook])


@dataclass(frozen=True)
class WorkerPlan:
    """How one worker process makes its worker (a :class:`WorkerBuilder`): it opens the
    database anew, without migrating it. Picklable, so spawned children receive it."""

    url: str
    settings: Settings
    burst: bool = False
    gate: bool = True
    overrides: dict[str, Any] = field(default_factory=dict)

    @contextmanager
    def __call__(self) -> Iterator[Worker]:
        with Lockgate(self.url, settings=self.settings, migrate=False) as lg:
            yield lg.worker(burst=self.burst, gate=self.gate, **self.overrides)


class AsyncLockgate:
    """The same API for asyncio programs; database calls run in a worker thread."""

    def __init__(self, sync: Lockgate) -> None:
        self.sync = sync

    async def submit(self, tasks: Iterable[TaskSpec | dict[str, Any]], *,
                     batch_id: str | None = None) -> SubmitReport:
        return await asyncio.to_thread(self.sync.submit, list(tasks), batch_id=batch_id)

    async def submit_file(self, path: str | Path, **kwargs: Any) -> SubmitReport:
        return await asyncio.to_thread(self.sync.submit_file, path, **kwargs)

    async def run_worker(self, *, burst: bool = False, **overrides: Any) -> WorkerStats:
        return await self.sync.worker(burst=burst, **overrides).run()

    async def status(self) -> Status:
        return await asyncio.to_thread(self.sync.status)

    async def results(self, batch_id: str | None = None) -> list[TaskResult]:
        """Every task of a batch, as a list (read in a thread; for millions of rows use
        the blocking :meth:`Lockgate.results` stream, e.g. in ``asyncio.to_thread``)."""
        return await asyncio.to_thread(lambda: list(self.sync.results(batch_id)))

    async def task(self, task_id: str) -> TaskView:
        return await asyncio.to_thread(self.sync.task, task_id)

    async def retry(self, task_id: str) -> None:
        await asyncio.to_thread(self.sync.retry, task_id)

    async def retry_batch(self, batch_id: str, *,
                          statuses: Iterable[str] = ("FAILED", "DEAD"),
                          error_class: str | None = None) -> int:
        return await asyncio.to_thread(lambda: self.sync.retry_batch(
            batch_id, statuses=statuses, error_class=error_class))

    async def cancel(self, task_id: str) -> None:
        await asyncio.to_thread(self.sync.cancel, task_id)

    async def review(self, batch_id: str | None = None) -> list[ReviewItem]:
        """Every task held for review, as a list (read in a thread)."""
        return await asyncio.to_thread(lambda: list(self.sync.review(batch_id)))

    async def resolve(self, task_id: str, result: Any, *, actor: str | None = None,
                      reason: str | None = None) -> None:
        await asyncio.to_thread(lambda: self.sync.resolve(task_id, result, actor=actor,
                                                          reason=reason))

    async def circuits(self) -> list[CircuitView]:
        return await asyncio.to_thread(self.sync.circuits)

    async def open_circuit(self, prompt: str, *, actor: str | None = None,
                           reason: str | None = None) -> CircuitView:
        return await asyncio.to_thread(lambda: self.sync.open_circuit(
            prompt, actor=actor, reason=reason))

    async def close_circuit(self, prompt: str, *, actor: str | None = None,
                            reason: str | None = None) -> CircuitView:
        return await asyncio.to_thread(lambda: self.sync.close_circuit(
            prompt, actor=actor, reason=reason))

    async def quality(self, prompt: str | None = None, *, since: str | float = "24h",
                      by: str = "version") -> list[QualityRow]:
        return await asyncio.to_thread(self.sync.quality, prompt, since=since, by=by)

    async def alerts(self, *, everything: bool = False, limit: int = 1000) -> list[Alert]:
        return await asyncio.to_thread(lambda: self.sync.alerts(everything=everything,
                                                                limit=limit))

    async def alert(self, alert_id: int) -> Alert:
        return await asyncio.to_thread(self.sync.alert, alert_id)

    async def ack_alert(self, alert_id: int, *, actor: str | None = None,
                        reason: str | None = None) -> Alert:
        return await asyncio.to_thread(lambda: self.sync.ack_alert(
            alert_id, actor=actor, reason=reason))

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncLockgate:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def connect(url: str | None = None, *, config: str | Path | None = None,
            settings: Settings | None = None) -> Lockgate:
    """Open a lockgate database (default ``$LOCKGATE_DATABASE_URL`` or SQLite), migrated."""
    return Lockgate(url, config=config, settings=settings)


async def connect_async(url: str | None = None, *, config: str | Path | None = None,
                        settings: Settings | None = None) -> AsyncLockgate:
    """The asyncio variant of :func:`connect`."""
    return AsyncLockgate(await asyncio.to_thread(Lockgate, url, config=config,
                                                 settings=settings))
