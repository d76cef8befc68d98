"""The store: every database operation lockgate performs, behind one class.

Nothing outside :mod:`lockgate.store` writes SQL. Hot-path operations (claim, finish,
renew) take whole batches so the database sees one round trip per batch, not per task.
Every state transition is a conditional UPDATE whose affected-row count is checked.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import re
import secrets
import socket
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar, cast

import orjson
from sqlalchemy import Engine, inspect, text
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

from lockgate.errors import ConfigError, SpecError, StateConflict, StoreError
from lockgate.redact import redact_url
from lockgate.spec import (
    MAX_INPUT_BYTES,
    RESERVED_ID_PREFIX,
    TaskSpec,
    canonical_json,
    config_hash,
)
from lockgate.store import schema
from lockgate.store.arrivals import ArrivalListener
from lockgate.store.dialects import Dialect, dialect_for
from lockgate.store.engine import create, database_url
from lockgate.store.failures import is_conflict, map_db_errors, translate
from lockgate.store.tx import AttemptObserver, Tx, sql
from lockgate.store.types import (
    AttemptRow,
    ClaimedTask,
    ConfigRow,
    Finish,
    FinishReport,
    NewTask,
)
from lockgate.store.views import TaskViews

log = logging.getLogger("lockgate.store")
T = TypeVar("T")

#: How far one point of a task's ``priority`` moves it in the claim order.
PRIORITY_STEP_MS = 1000
#: A submit commits its tasks in chunks of at most this many bytes of input ...
SUBMIT_CHUNK_BYTES = 16 << 20
#: ... or its dialect's ``submit_chunk_rows``, whichever comes first; its first chunk
#: holds at most this many rows, so that workers can start on it at once.
SUBMIT_FIRST_CHUNK_ROWS = 1000

# -- named statements (the same on every dialect; :now is bound by Tx.execute) ---------

_REVISION = sql("SELECT version_num FROM alembic_version")
_NEWEST_TASK = sql("SELECT MAX(id) FROM task")
_WORKER_OWNER = sql("SELECT hostname, pid, status FROM worker WHERE id = :id")
_WORKER_REREGISTER = sql("UPDATE worker SET hostname = :hostname, pid = :pid, "
                         "status = 'running', stopped_at = NULL, heartbeat_at = :now, "
                         "concurrency = :concurrency, version = version + 1 WHERE id = :id")
#: The newest schema revision: the head of ``migrations/versions`` (a test holds the two
#: together). A database at it needs no migration, so opening it does not load alembic.
SCHEMA_HEAD = "0013"
_WRITTEN_BEFORE = sql("SELECT task_pk, lease_token FROM task_attempt WHERE task_pk IN :ids "
                      "AND lease_token IN :toks AND outcome <> 'discarded'", "ids", "toks")
#: A batch is complete once no submit of it is left unfinished.
_BATCH_COMPLETE = sql("UPDATE batch SET complete = 1 WHERE id IN :b AND NOT EXISTS "
                      "(SELECT 1 FROM batch_submit s WHERE s.batch_id = batch.id)", "b")
_SUBMIT_DONE = sql("DELETE FROM batch_submit WHERE submit_key = :k AND batch_id IN :b",
                   "b")
_BATCHES_INCOMPLETE = sql("UPDATE batch SET complete = 0 WHERE id IN :b", "b")
#: A batch left without tasks is not kept, unless a submit of it is still unfinished.
_BATCH_DROP_EMPTY = sql("DELETE FROM batch WHERE id IN :b AND NOT EXISTS "
                        "(SELECT 1 FROM task WHERE task.batch_id = batch.id) AND NOT EXISTS "
                        "(SELECT 1 FROM batch_submit s WHERE s.batch_id = batch.id)", "b")
_TASK_BATCHES = sql("SELECT task_id, batch_id FROM task WHERE task_id IN :ids", "ids")
_CONFIGS = sql("SELECT hash, document FROM task_config WHERE hash IN :h", "h")
#: PENDING is checked under the row lock by ``Dialect.owned`` first.
_RENEW = sql("UPDATE task SET visible_at = :now + :lease_ms, updated_at = :now "
             "WHERE id IN :ids AND lease_token = :tok", "ids")
#: The attempts of the task's current run: a task run again by hand keeps the earlier
#: runs' trace, before ``trace_from``.
_THIS_RUN = ("task_pk = :pk AND attempt < :n AND outcome = 'retry' AND id > COALESCE("
             "(SELECT trace_from FROM task WHERE id = :pk), 0)")
_RETRIES_BEFORE = sql(f"SELECT COUNT(*) FROM task_attempt WHERE {_THIS_RUN}")
_LAST_RETRY = sql(f"SELECT error_class, error_message FROM task_attempt WHERE {_THIS_RUN} "
                  "ORDER BY attempt DESC, id DESC LIMIT 1")
_EARLIEST_PENDING = sql("SELECT MIN(visible_at) FROM task WHERE status = 'PENDING'")
_EARLIEST_PENDING_IN = sql("SELECT MIN(visible_at) FROM task WHERE pool = :pool "
                           "AND status = 'PENDING'")
_TASK_CREATED = sql("SELECT created_at FROM task WHERE id = :pk")
#: The endpoints of the workers alive since ``:since`` (stopped ones included): each
#: worker's flow controller reports every endpoint of its config in ``flow``.
_WORKER_FLOWS = sql("SELECT flow FROM worker WHERE heartbeat_at >= :since")


#: What no database column may hold: NUL (PostgreSQL refuses it in text) and lone UTF-16
#: surrogates (no encoding can write them; a provider other than lockgate's may pass
#: ``"\ud800"`` from an answer's JSON through).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


class _StatisticsKeeper:
    """Refreshes the planner's statistics of the task table while a submit grows it
    (where the dialect asks for it): whenever the rows added since they were last
    taken reach half the rows they counted, and at least :attr:`MIN_ROWS`. A load of N
    rows so takes about log N refreshes, each of a bounded sample of the columns the
    hot path's plans depend on. Runs in the submit's writer thread, after a chunk has
    committed; a refresh that fails is logged and the submit goes on."""

    MIN_ROWS = 1_000

    def __init__(self, store: Store) -> None:
        self._store = store
        self._known: int | None = None
        self._added = 0
        self._off = not store.dialect.refreshes_statistics

    def grew(self, rows: int) -> None:
        if self._off or rows <= 0:
            return
        self._added += rows
        if self._added < self.MIN_ROWS:  # a small submit asks the database nothing
            return
        dialect = self._store.dialect
        try:
            if self._known is None:
                self._known = self._store.transaction(
                    lambda tx: dialect.task_rows_estimate(tx.conn))
            if self._added < max(self.MIN_ROWS, self._known // 2):
                return
            self._store.transaction(lambda tx: dialect.refresh_task_statistics(tx.conn))
        except StoreError as exc:
            log.warning("could not refresh the task table's statistics (%s); the "
                        "database's own schedule will", exc)
            self._off = True
            return
        self._known += self._added
        self._added = 0


def _storable(f: Finish) -> Finish:
    """``f`` with every NUL character and lone surrogate in its texts replaced by U+FFFD.

    Refused, the write-back of a whole batch would fail on every retry, and its tasks
    would be called again each time their leases ran out. The replacement is the same
    on every backend. Every text is checked at once, joined: this runs for each
    write-back, on the thread that shares the interpreter with the worker's calls."""
    trace = f.attempt
    texts = [v for v in trace.values() if isinstance(v, str)] if trace else []
    texts.extend(t for t in (f.result, f.error_message, f.error_class, f.parse_status,
                             f.model, f.request_id, f.response) if t is not None)
    joined = "".join(texts)
    if "\x00" not in joined and (joined.isascii() or not _UNSTORABLE.search(joined)):
        return f

    def clean(v: Any) -> Any:
        return _UNSTORABLE.sub("\ufffd", v) if isinstance(v, str) else v

    return replace(f, result=clean(f.result), error_message=clean(f.error_message),
                   error_class=clean(f.error_class), parse_status=clean(f.parse_status),
                   model=clean(f.model), request_id=clean(f.request_id),
                   response=clean(f.response),
                   attempt=cast(AttemptRow, {k: clean(v) for k, v in trace.items()})
                   if trace else trace)


#: Batches a submit reports having written to (its own and those its tasks name).
_NAMED_BATCHES = 64


@dataclass(frozen=True, slots=True)
class SubmitReport:
    """How a submission went: rows inserted, task ids that already existed, and the
    batches those already belong to when that is not this one (task id -> count)."""

    batch_id: str
    inserted: int
    duplicates: int
    elsewhere: dict[str, int] = field(default_factory=dict)
    #: The batches the submitted tasks were written to: this one, then those the tasks
    #: named themselves (``batch_id`` on a line), in the order met (at most 64).
    batches: tuple[str, ...] = ()
    #: Tasks whose line named another batch, written now to this one because the submit
    #: named it (``--batch``): a batch named by the caller wins over the lines'. A task
    #: id that was in already (in any batch) is skipped, not moved. (The store counts
    #: the rows written now that name this batch themselves: ``lockgate.app`` gives
    #: those so, a line naming this batch unasked as one naming none.)
    moved: int = 0


#: This machine's name, recorded with the submits it makes.
_HOST = socket.gethostname()[:255]


def _untold(_ids: list[str], _at: int) -> None:
    return None


def submit_key(source: str | None) -> str:
    """What tells one submit from another: the file's absolute path (None for tasks
    given in memory) and this machine. Run again, the same submit has the same key."""
    where = os.path.abspath(source) if source else ""
    return hashlib.sha256(f"{_HOST}\0{where}".encode()).hexdigest()[:32]


class Store(TaskViews):
    """All persistent state of lockgate, on SQLite, PostgreSQL or MySQL/MariaDB."""

    def __init__(self, url: str | None = None, *, pool_size: int = 4,
                 engine: Engine | None = None) -> None:
        self.engine = engine or create(url, pool_size=pool_size)
        #: The URL as given (with its password), for messages, which show it redacted.
        self.url: str = database_url(url, with_driver=False) if engine is None else \
            self.engine.url.render_as_string(hide_password=False)
        self.dialect: Dialect = dialect_for(self.engine.dialect.name)
        self._max_input: int | None = None
        self._writer = self.dialect.writer_lock()

    # -- plumbing -----------------------------------------------------------------

    def close(self) -> None:
        """Release every pooled connection."""
        self.engine.dispose()

    def listen_for_tasks(self, arrived: Callable[[], object]) -> ArrivalListener | None:
        """Start a thread that calls ``arrived()`` whenever a submit commits tasks, on
        a database that announces them (PostgreSQL); None elsewhere (workers poll)."""
        if not self.dialect.announces_tasks:
            return None
        listener = ArrivalListener(self.url, arrived)
        listener.start()
        return listener

    @contextmanager
    def read(self) -> Iterator[Tx]:
        """A read-only transaction, in a ``with``. On SQLite it begins deferred: a reader
        of a WAL file neither waits for the one writer nor holds the write lock against
        it, as ``BEGIN IMMEDIATE`` would. Database errors come out as
        :class:`StoreError`."""
        with map_db_errors(self.url), self.engine.connect() as conn:
            yield Tx(conn.execution_options(lockgate_read=True), self.dialect.now)

    def transaction(self, fn: Callable[[Tx], T], *, attempts: int = 8) -> T:
        """Run ``fn`` in one transaction and return what it returns, retrying deadlocks
        and lock timeouts (``fn`` may run more than once: it must only touch the
        database); every database error comes out as :class:`StoreError`."""
        delay = 0.005
        for i in range(attempts):
            try:
                with self._writer, self.engine.begin() as conn:
                    return fn(Tx(conn, self.dialect.now))
            except DBAPIError as exc:
                if i == attempts - 1 or not is_conflict(exc):
                    raise translate(exc, self.url) from exc
            except SQLAlchemyError as exc:
                raise translate(exc, self.url) from exc
            log.debug("transient database conflict, retrying (attempt %d)", i + 1)
            time.sleep(delay)
            delay = min(0.5, delay * 2)
        raise AssertionError("unreachable")

    def ping(self) -> None:
        """Raise :class:`DatabaseUnavailable` unless the database answers now."""
        with self.read() as tx:
            tx.execute("SELECT 1")

    def migrate(self) -> str | None:
        """Create or upgrade the schema to the newest revision (safe to run concurrently,
        and again after a run stopped part way: it finishes the revision that run was
        making); returns the revision it found under the migration lock (None: no
        schema yet; :data:`SCHEMA_HEAD`: nothing was to do, also when another process
        migrated it meanwhile), so of processes that migrate at once only one reports
        a creation or an upgrade. A database already at :data:`SCHEMA_HEAD` costs one
        read: alembic is not loaded. A database at a revision this lockgate does not
        know (a newer lockgate's) is refused with :class:`ConfigError`; a revision that
        cannot be applied is named in the error."""
        found = self._revision()
        if found == SCHEMA_HEAD:
            return found
        from alembic import command
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
        try:
            # The lock is released only after the upgrade committed, so the next process
            # to take it sees the new revision (and does nothing).
            with map_db_errors(self.url), self.engine.connect() as conn, \
                    self.dialect.migration_lock(conn), conn.begin():
                # Under the lock: another process (or a newer lockgate) may have
                # migrated it meanwhile; what it is at now is what this run found.
                found = (Tx(conn, self.dialect.now).execute(_REVISION).scalar()
                         if inspect(conn).has_table("alembic_version") else None)
                self._refuse_newer(found)
                if found != SCHEMA_HEAD:
                    cfg.attributes["connection"] = conn
                    command.upgrade(cfg, "head")
        except (ConfigError, StoreError) as exc:
            # migrations/env.py sets "start" once the run begins: errors before it (the
            # lock, a newer revision) are not a revision's
            if "start" not in cfg.attributes or getattr(exc, "transient", False):
                raise
            raise self._not_applied(cfg.attributes, exc) from exc
        return found

    @staticmethod
    def _known_revisions() -> list[str]:
        """This lockgate's schema revisions, oldest first (loads alembic)."""
        from alembic.script import ScriptDirectory

        script = ScriptDirectory(str(Path(__file__).parent / "migrations"))
        return [s.revision for s in reversed(list(script.walk_revisions()))]

    def _refuse_newer(self, have: str | None) -> None:
        """Raise :class:`ConfigError` if the database is at a revision none of this
        lockgate's migrations makes: a newer lockgate upgraded it."""
        if have is None or have == SCHEMA_HEAD or have in self._known_revisions():
            return
        raise ConfigError(
            f"the database {redact_url(self.url)} is at schema revision {have}, newer than "
            f"this lockgate (which knows revisions up to {SCHEMA_HEAD}): upgrade lockgate on "
            "this machine; in a rolling upgrade every machine's lockgate must be at least "
            "as new as the database")

    def _not_applied(self, progress: Mapping[str, Any],
                     exc: ConfigError | StoreError) -> ConfigError | StoreError:
        """The error of a migration run that failed part way, naming the revision it
        was applying (``progress``: what migrations/env.py recorded)."""
        from lockgate.store.failures import cause

        order = self._known_revisions()
        done = progress.get("applied", progress["start"])
        rev = order[min(order.index(done) + 1 if done in order else 0, len(order) - 1)]
        where = redact_url(self.url)
        if isinstance(exc, ConfigError):  # a step that cannot finish (migrations/steps.py)
            return ConfigError(f"cannot finish schema revision {rev} of {where}: {exc}, "
                               "then run `lockgate init` again")
        kept = ("the revisions before it, and the part of it that ran, are kept (MySQL and "
                "MariaDB commit each schema change at once)"
                if self.dialect.name == "mysql" else
                f"the database is left at revision {progress['start'] or '(none)'}")
        return StoreError(f"schema revision {rev} could not be applied to {where}: "
                          f"{cause(exc.__cause__ or exc)}; {kept}: fix the cause and run "
                          "`lockgate init` again")

    def _revision(self) -> str | None:
        """The schema revision the database is at (None: none, or no table yet)."""
        try:
            with self.read() as tx:
                if not inspect(tx.conn).has_table("alembic_version"):
                    return None
                return tx.execute(_REVISION).scalar()
        except StoreError:
            return None  # the full path says what is wrong

    def check_schema(self, *, old_ok: bool = False) -> None:
        """Raise :class:`ConfigError` unless this database holds lockgate's tables at the
        newest revision (or, with ``old_ok``, at any older revision: a migration will
        upgrade them; a newer one is refused either way); never creates anything (a
        SQLite file that does not exist is not made)."""
        where = redact_url(self.url)
        path = self.engine.url.database
        if self.dialect.name == "sqlite" and path not in (None, "", ":memory:") \
                and not Path(path).exists():
            raise ConfigError(f"no lockgate database at {where}: the file {path} does not "
                              "exist; check the path (--db or LOCKGATE_DATABASE_URL), or "
                              "create it with `lockgate init`")
        with self.read() as tx:
            if not inspect(tx.conn).has_table("alembic_version"):
                raise ConfigError(f"the database {where} has no lockgate tables; create them "
                                  "with `lockgate init`")
            have = tx.execute(_REVISION).scalar()
        if have == SCHEMA_HEAD:
            return
        self._refuse_newer(have)
        if not old_ok:
            raise ConfigError(f"the database {where} is at schema revision {have}, this "
                              f"lockgate needs {SCHEMA_HEAD}; upgrade it with `lockgate init`")

    def max_input_bytes(self) -> int:
        """The largest task input (JSON bytes) this database can store and write back
        with its trace: MySQL/MariaDB bound a statement by ``max_allowed_packet``, and a
        trace holds the rendered prompt (the input again) beside the answer."""
        if self._max_input is None:
            with self.read() as tx:
                self._max_input = self.dialect.max_input_bytes(tx.conn, MAX_INPUT_BYTES)
        return self._max_input

    def db_now(self) -> int:
        """The database clock in ms (the one lease arithmetic uses)."""
        with self.read() as tx:
            return tx.now

    # -- submission ---------------------------------------------------------------

    def submit(self, specs: Iterable[TaskSpec], *, batch_id: str,
               source: str | None = None,
               progress: Callable[[int], None] | None = None,
               pool_of: Callable[[TaskSpec], str] | None = None,
               batch_fields: Mapping[str, Any] | None = None) -> SubmitReport:
        """Insert validated specs (see :meth:`submit_rows`); ``pool_of`` names each
        task's worker pool (flow control)."""
        return self.submit_rows(
            (new_task(s, pool_of(s) if pool_of else "default") for s in specs),
            batch_id=batch_id, source=source, progress=progress, batch_fields=batch_fields)

    def submit_rows(self, rows: Iterable[NewTask], *, batch_id: str,
                    source: str | None = None,
                    progress: Callable[[int], None] | None = None,
                    batch_fields: Mapping[str, Any] | None = None,
                    written: Callable[[list[str], int], None] | None = None,
                    named: bool = True) -> SubmitReport:
        """Insert tasks; task ids that exist already are skipped (idempotent).

        Tasks are written in chunks (the first small, so that workers start at once,
        then of the dialect's bulk size, at most :data:`SUBMIT_CHUNK_BYTES` of input),
        each committed at once, so workers work the first chunks while the rest is
        written, and a SQLite writer lock is held only for one chunk's insert (``rows``
        is consumed, and validated, outside it, while the chunk before is written).
        The batch is marked incomplete until the last chunk is in: an interrupted submit
        leaves it so (``status`` shows it, naming the file and the machine), and the
        same submit run again completes it. Each submit is tracked on its own
        (``batch_submit``, keyed by the file's absolute path and the machine): another
        file submitted to the same batch, finished, leaves it incomplete while the
        interrupted one is not run again. Batches the lines name themselves are tracked
        the same way. ``written`` is told, after each chunk commits, the task ids it
        inserted (not those that existed) and its ``created_at``.
        Duplicates are found by the unique constraint on ``task_id``, never by a check
        before the insert. ``batch_fields`` sets the batch's weight, deadline or window,
        and a window's tasks become visible at its start. A batch left without tasks
        (every task id belonged to another batch already) is not kept.

        ``named``: the caller named ``batch_id`` (``--batch``), and it is opened, marked
        incomplete, before any row is read. Without it ``batch_id`` is only where rows
        that name no batch go (a file's default batch), opened with the chunk that
        writes the first of them, as the batches rows name are: a submit whose rows all
        name their own batch, interrupted, leaves no batch it wrote nothing to.

        A :class:`SpecError` raised by ``rows`` (a bad line met while reading, in a
        streamed submit) stops the submit: the tasks before it are committed, the batch
        stays incomplete.
        """
        if batch_id.startswith(RESERVED_ID_PREFIX):
            raise SpecError(f"ids starting with '{RESERVED_ID_PREFIX}' are reserved for the "
                            "release gate's evaluations", field="batch_id")
        fields = dict(batch_fields or {})
        key = submit_key(source)
        source = schema.source_path(source)
        if named:
            self.transaction(lambda tx: self._open_batch(tx, batch_id, source, fields, key))
        seen: dict[str, None] = {batch_id: None}
        report = self._write_chunks(rows, batch_id, source, fields, progress, key, seen,
                                    written, opened=named)
        self.transaction(lambda tx: self._close_batch(tx, list(seen), key))
        return report

    def _write_chunks(self, rows: Iterable[NewTask], batch_id: str, source: str | None,
                      fields: dict[str, Any],
                      progress: Callable[[int], None] | None, key: str,
                      seen_batches: dict[str, None],
                      written_ids: Callable[[list[str], int], None] | None, *,
                      opened: bool) -> SubmitReport:
        """Write ``rows`` in chunks, each committed in its own transaction, one chunk
        written in a thread while the next is read. ``seen_batches`` (ordered: this
        batch, then those tasks name) gains the batches the lines name; each is opened
        by the chunk holding its first row, this batch too unless ``opened`` already
        (with ``fields``). The rows that name ``batch_id`` itself are counted as moved
        (``SubmitReport.moved``) when written now: a chunk holding one reads which of
        its ids are new before its insert; a chunk without one reads nothing more for
        it."""
        told = written_ids or _untold
        # The batches open, or opened by the chunk being gathered.
        opening = set(seen_batches) - (set() if opened else {batch_id})
        check = written_ids is not None
        seen_configs: set[str] = set()
        inserted = total = moved = 0
        elsewhere: dict[str, int] = {}
        chunk: list[NewTask] = []
        configs: list[ConfigRow] = []
        batches: list[str] = []
        size = taken = 0  # taken: rows of the chunk naming this batch (moved if new)
        limit = SUBMIT_FIRST_CHUNK_ROWS
        writing: Future[tuple[int, dict[str, int], int]] | None = None
        written = 0

        def collect() -> None:
            """Wait for the chunk being written, and count it."""
            nonlocal inserted, total, moved, writing
            if writing is None:
                return
            got, other, took = writing.result()
            writing = None
            inserted += got
            total += written
            moved += took
            for b, n in other.items():
                elsewhere[b] = elsewhere.get(b, 0) + n
            if progress:
                progress(written)

        stats = _StatisticsKeeper(self)

        def write(args: tuple[list[NewTask], list[ConfigRow], list[str]], taking: int
                  ) -> tuple[int, dict[str, int], int]:
            ids = [t.task_id for t in args[0]]
            # (the ids that exist already are read first: they are not this submit's)
            mine, got, at = self.transaction(lambda tx: (
                _new_ids(tx, ids, check or taking > 0), self._insert_chunk(
                    tx, *args, source, fields, batch_id, key), tx.now))
            stats.grew(got[0])
            told(mine, at)
            return got[0], got[1], _moved(args[0], mine, batch_id, got[0]) if taking else 0

        def flush() -> None:
            nonlocal chunk, configs, batches, size, taken, limit, writing, written
            collect()
            writing = writer.submit(write, (chunk, configs, batches), taken)
            written = len(chunk)
            chunk, configs, batches, size, taken = [], [], [], 0, 0
            limit = self.dialect.submit_chunk_rows

        # One chunk is written (in a thread: the database works, and the driver waits
        # without the GIL) while the next is read and checked here.
        with ThreadPoolExecutor(1, thread_name_prefix="lockgate-submit") as writer:
            try:
                for t in rows:
                    cfg = t.config
                    if cfg.hash not in seen_configs:
                        seen_configs.add(cfg.hash)
                        configs.append(cfg)
                    b = t.batch_id or batch_id
                    if b not in opening:  # its first row: opened with its chunk
                        opening.add(b)
                        seen_batches.setdefault(b, None)
                        batches.append(b)
                    taken += t.batch_id == batch_id
                    chunk.append(t)
                    size += len(t.input_json) + len(t.metadata_json or "") + 200
                    if size >= SUBMIT_CHUNK_BYTES or len(chunk) >= limit:
                        flush()
            except SpecError:
                if chunk:
                    flush()  # a bad line stops the submit: the lines before it are in
                raise
            else:
                if chunk or configs or batches:
                    flush()
            finally:
                collect()  # interrupted too: the chunk handed over is committed whole
        return SubmitReport(batch_id, inserted, total - inserted, elsewhere,
                            tuple(itertools.islice(seen_batches, _NAMED_BATCHES)), moved)

    def _open_batch(self, tx: Tx, batch_id: str, source: str | None,
                    fields: dict[str, Any], key: str) -> None:
        """Create the batch row (or find it), mark it incomplete and record this submit
        of it."""
        tx.execute(self.dialect.insert_ignore(schema.batch), [
            {"id": batch_id, "source": source, "created_at": tx.now, "complete": 0}])
        tx.execute(schema.batch.update().where(schema.batch.c.id == batch_id)
                   .values(complete=0, **fields))
        self._record_submit(tx, [batch_id], source, key)

    def _record_submit(self, tx: Tx, batch_ids: Sequence[str], source: str | None,
                       key: str) -> None:
        tx.execute(self.dialect.insert_ignore(schema.batch_submit), [
            {"batch_id": b, "submit_key": key, "source": source, "host": _HOST,
             "started_at": tx.now} for b in batch_ids])

    @staticmethod
    def _close_batch(tx: Tx, batch_ids: list[str], key: str) -> None:
        """This submit is over: each of its batches is complete, and dropped if it holds
        no task (a batch left without tasks is not kept), unless another submit of it is
        unfinished; whether this run made the batch or an interrupted one before it."""
        for i in range(0, len(batch_ids), 1000):
            part = batch_ids[i:i + 1000]
            tx.execute(_SUBMIT_DONE, {"k": key, "b": part})
            tx.execute(_BATCH_COMPLETE, {"b": part})
            tx.execute(_BATCH_DROP_EMPTY, {"b": part})

    def _insert_configs(self, tx: Tx, configs: list[ConfigRow]) -> None:
        # Sorted: two submits never take the same keys in opposite orders.
        tx.execute(self.dialect.insert_ignore(schema.task_config), [
            {"hash": c.hash, "document": c.document, "created_at": tx.now}
            for c in sorted(configs, key=lambda c: c.hash)])

    def _insert_chunk(self, tx: Tx, rows: list[NewTask], configs: list[ConfigRow],
                      batches: list[str], source: str | None, fields: dict[str, Any],
                      batch_id: str, key: str) -> tuple[int, dict[str, int]]:
        """One chunk of a submit, in its transaction: the configs and batches it brings
        (``batch_id`` among them, opened late, gets the batch's ``fields``), then its
        tasks. Returns (rows inserted, batches holding the ids that existed, when not
        the batch asked for)."""
        now = tx.now
        window_start = int(fields.get("window_start") or 0)
        if configs:
            self._insert_configs(tx, configs)
        if batches:  # named by lines: incomplete, like this submit's own, till it ends
            ordered = sorted(batches)
            tx.execute(self.dialect.insert_ignore(schema.batch), [
                {"id": b, "source": source, "created_at": now, "complete": 0}
                for b in ordered])
            tx.execute(_BATCHES_INCOMPLETE, {"b": ordered})
            if fields and batch_id in batches:
                tx.execute(schema.batch.update().where(schema.batch.c.id == batch_id)
                           .values(**fields))
            self._record_submit(tx, ordered, source, key)
        if not rows:
            return 0, {}
        if len({t.task_id for t in rows}) != len(rows):
            # Repeated ids inside one chunk: keep the first, as a second submit would.
            rows = list({t.task_id: t for t in reversed(rows)}.values())[::-1]
        # Claims take visible rows in visible_at order: priority p moves a task p
        # seconds ahead (or back), never before its batch's window opens.
        base = max(now, window_start)
        values = [(t.task_id, t.batch_id or batch_id, t.config.hash, t.input_json,
                   t.metadata_json, t.priority,
                   base if not t.priority
                   else max(window_start, base - t.priority * PRIORITY_STEP_MS), t.pool)
                  for t in rows]
        n = self.dialect.insert_tasks(tx.conn, values, now=now)
        if n:
            self.dialect.announce_tasks(tx.conn)
        if n == len(values):
            return n, {}
        wanted = {v[0]: v[1] for v in values}
        ids = list(wanted)
        other: dict[str, int] = {}
        for i in range(0, len(ids), 1000):
            for tid, b in tx.execute(_TASK_BATCHES, {"ids": ids[i:i + 1000]}):
                if b != wanted[tid]:
                    other[b] = other.get(b, 0) + 1
        return n, other

    # -- the hot path -------------------------------------------------------------

    def claim(self, limit: int, *, lease_ms: int, worker_id: str) -> list[ClaimedTask]:
        """Lease up to ``limit`` visible tasks under one fresh random token."""
        token = secrets.token_hex(16)
        return self.transaction(lambda tx: self.dialect.claim(
            tx.conn, limit=limit, lease_ms=lease_ms, token=token, worker_id=worker_id))

    def configs(self, hashes: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Config documents by hash (immutable, so callers cache them forever)."""
        wanted = sorted(set(hashes))
        if not wanted:
            return {}
        with self.read() as tx:
            return {h: orjson.loads(d) for h, d in tx.execute(_CONFIGS, {"h": wanted})}

    def retries_before(self, pk: int, attempt: int) -> int:
        """How many attempts of task ``pk`` before ``attempt`` ended in a retry that was
        written (each spent an attempt with a call or a decision): the others of those
        attempts were claims lost to workers that crashed or stalled."""
        with self.read() as tx:
            return int(tx.execute(_RETRIES_BEFORE, {"pk": pk, "n": attempt}).scalar_one())

    def last_retry(self, pk: int, attempt: int) -> tuple[str | None, str | None]:
        """The error class and message of the last attempt of task ``pk`` before
        ``attempt`` that ended in a retry ((None, None): none did)."""
        with self.read() as tx:
            row = tx.execute(_LAST_RETRY, {"pk": pk, "n": attempt}).first()
        return (None, None) if row is None else (row[0], row[1])

    def task_created_at(self, pk: int) -> int | None:
        """When task ``pk`` was submitted (ms, database clock; None: it is gone)."""
        with self.read() as tx:
            created = tx.execute(_TASK_CREATED, {"pk": pk}).scalar()
        return None if created is None else int(created)

    def endpoint_configured(self, name: str, within_ms: int) -> bool:
        """Whether a worker whose config has endpoint ``name`` was alive (a heartbeat)
        in the last ``within_ms``, running or stopped since: its flow controller reports
        every endpoint of its config in the worker row (``flow``, a JSON object keyed by
        endpoint name)."""
        with self.read() as tx:
            rows = tx.execute(_WORKER_FLOWS, {"since": tx.now - within_ms}).scalars().all()
        for flow in rows:
            try:
                endpoints = orjson.loads(flow or "{}")
            except orjson.JSONDecodeError:
                continue
            if isinstance(endpoints, dict) and name in endpoints:
                return True
        return False

    def finish(self, rows: Sequence[Finish], *, worker_id: str,
               observe: AttemptObserver | None = None) -> FinishReport:
        """Apply a batch of write-backs, each fenced by its lease token.

        Rows whose token no longer matches (the lease was re-claimed) or whose task
        left PENDING are discarded, never written; their attempts are still recorded
        with outcome ``discarded``. Returns which ids were applied and discarded.
        ``observe`` is handed the attempt rows written, each with its write-back, in
        the same transaction (the quality rollups are kept so).
        """
        if not rows:
            return FinishReport([], [])
        # One lock order (by id): fewer deadlocks.
        ordered = sorted((_storable(f) for f in rows), key=lambda f: f.id)

        def work(tx: Tx) -> FinishReport:
            held = self.dialect.owned(tx.conn, [f.id for f in ordered])
            mine = [f for f in ordered if (f.id, f.lease_token) in held]
            if mine:
                n = self.dialect.finish(tx.conn, mine)
                if n != len(mine):
                    raise StateConflict(
                        f"write-back changed {n} rows, expected {len(mine)}; rolled back")
            # A worker may flush a stale and a current result of one task together
            # (it re-claimed the task after its own lease ran out): key by claim.
            applied = {(f.id, f.lease_token) for f in mine}
            earlier = self._written_before(tx, [f for f in ordered
                                                  if (f.id, f.lease_token) not in applied])
            attempts = []
            written: list[tuple[Finish, dict[str, Any]]] = []
            for f in ordered:
                claim = (f.id, f.lease_token)
                if f.attempt is not None and claim not in earlier:
                    a = dict(f.attempt)
                    a["task_pk"] = f.id
                    a["lease_token"] = f.lease_token
                    a["worker_id"] = worker_id
                    if claim not in applied:
                        a["outcome"] = "discarded"
                    attempts.append(a)
                    written.append((f, a))
            if attempts:
                # One column set for all: short attempt rows (released, dead) sit
                # beside full traces.
                self.dialect.insert_attempts(tx.conn, attempts)
                if observe is not None:
                    observe(tx, written)
            settled = applied | earlier  # once, not per row
            lost = [f for f in ordered if (f.id, f.lease_token) not in settled]
            return FinishReport(sorted(f.id for f in mine), [f.id for f in lost],
                                frozenset(settled),
                                frozenset((f.id, f.lease_token) for f in lost))

        report = self.transaction(work)
        if report.discarded:
            log.warning("discarded %d write-back(s) whose lease was lost: task pk %s",
                        len(report.discarded), report.discarded[:10])
        return report

    @staticmethod
    def _written_before(tx: Tx, rows: Sequence[Finish]) -> set[tuple[int, str]]:
        """Claims among ``rows`` whose write-back committed earlier: a transaction whose
        acknowledgement was lost (the connection dropped after COMMIT) is sent again by
        its worker, and must count as applied, not as a lost lease. Its attempt row,
        written in that transaction under the claim's token, is the proof."""
        traced = [f for f in rows if f.attempt is not None]
        found: set[tuple[int, str]] = set()
        for i in range(0, len(traced), 500):
            part = traced[i:i + 500]
            found.update((int(pk), str(tok)) for pk, tok in tx.execute(
                _WRITTEN_BEFORE, {"ids": sorted({f.id for f in part}),
                                  "toks": sorted({f.lease_token for f in part})}))
        return found & {(f.id, f.lease_token) for f in traced}

    def renew(self, held: dict[str, list[int]], *, lease_ms: int) -> int:
        """Push the lease of every task still held under these tokens forward; returns
        how many were."""
        total = sum(len(ids) for ids in held.values())
        return total - len(self.renew_leases(held, lease_ms=lease_ms))

    def renew_leases(self, held: dict[str, list[int]], *, lease_ms: int
                     ) -> set[tuple[int, str]]:
        """Push the lease of every task still held under these tokens forward; returns
        the claims (id, token) that are held no more (another worker took the task
        over, or it ended): a worker must not call those."""
        if not held:
            return set()

        def work(tx: Tx) -> set[tuple[int, str]]:
            # Lock every row first, in id order across all tokens (as a write-back
            # does): updating token by token would take them in a different order.
            current = self.dialect.owned(tx.conn,
                                         sorted(i for ids in held.values() for i in ids))
            lost: set[tuple[int, str]] = set()
            for tok, ids in held.items():
                mine = sorted(i for i in ids if (i, tok) in current)
                lost.update((i, tok) for i in ids if (i, tok) not in current)
                for i in range(0, len(mine), 1000):
                    tx.execute(_RENEW, {"lease_ms": lease_ms, "tok": tok,
                                        "ids": mine[i:i + 1000]})
            return lost

        return self.transaction(work)

    def queue_state(self, pool: str | None = None) -> tuple[bool, int | None, int]:
        """(any task PENDING, of ``pool`` if given, earliest visible_at among them,
        database now)."""
        with self.read() as tx:
            earliest = (tx.execute(_EARLIEST_PENDING) if pool is None else
                        tx.execute(_EARLIEST_PENDING_IN, {"pool": pool})).scalar()
            return earliest is not None, earliest, tx.now

    def newest_task_id(self) -> int:
        """The highest task row id (0: none), a read without locks: idle workers on a
        database that does not announce its tasks look at it between polls."""
        with self.read() as tx:
            return int(tx.execute(_NEWEST_TASK).scalar() or 0)

    # -- workers ------------------------------------------------------------------

    def register_worker(self, worker_id: str, *, hostname: str, pid: int,
                        concurrency: int) -> int:
        """Insert this worker's heartbeat row; returns the database clock (ms).

        Idempotent: a row with this id that this same process (host and pid) wrote
        already (a registration whose COMMIT landed but whose answer was lost), or that
        a stopped worker left, is taken over. A row of another worker that has not
        stopped is refused with :class:`ConfigError` (no retry can help)."""
        host = hostname[:255]

        def insert(tx: Tx) -> int:
            tx.execute(schema.worker.insert(), [{
                "id": worker_id, "hostname": host, "pid": pid,
                "status": "running", "started_at": tx.now, "heartbeat_at": tx.now,
                "concurrency": concurrency}])
            return tx.now

        def take_over(tx: Tx) -> int:
            row = tx.execute(_WORKER_OWNER, {"id": worker_id}).first()
            if row is None:  # deleted since (pruned): insert it after all
                return insert(tx)
            if (str(row[0]), int(row[1])) != (host, pid) and row[2] != "stopped":
                raise ConfigError(
                    f"worker id {worker_id!r} is already registered by another worker "
                    f"(host {row[0]}, pid {row[1]}, {row[2]}): give each worker its own id")
            tx.execute(_WORKER_REREGISTER, {"id": worker_id, "hostname": host, "pid": pid,
                                            "concurrency": concurrency})
            return tx.now

        try:
            return self.transaction(insert)
        except StoreError as exc:
            if not isinstance(exc.__cause__, IntegrityError):
                raise
        return self.transaction(take_over)

    def heartbeat(self, worker_id: str, *, status: str = "running",
                  **counters: int) -> int:
        """Refresh the worker row's heartbeat and counters; returns the database clock
        (ms) the heartbeat was stamped with."""
        sets = ", ".join(f"{k} = :{k}" for k in counters)
        stopped = ", stopped_at = :now" if status == "stopped" else ""
        statement = text(f"UPDATE worker SET heartbeat_at = :now, status = :status, "
                         f"version = version + 1{', ' + sets if sets else ''}{stopped} "
                         "WHERE id = :id")

        def work(tx: Tx) -> int:
            tx.execute(statement, {"id": worker_id, "status": status, **counters})
            return tx.now
        return self.transaction(work)


def _new_ids(tx: Tx, ids: list[str], check: bool) -> list[str]:
    """``ids`` less those that exist already (read only if ``check``: a submit told what
    it wrote). Those are not the submit's own: another submit may have written them in
    the same millisecond, so ``created_at`` alone would not tell them apart."""
    if not check:
        return ids
    there = {str(r[0]) for i in range(0, len(ids), 1000)
             for r in tx.execute(_TASK_BATCHES, {"ids": ids[i:i + 1000]})}
    return [i for i in ids if i not in there]


def _moved(rows: list[NewTask], new_ids: list[str], batch_id: str, inserted: int) -> int:
    """How many of a chunk's ``rows`` naming ``batch_id`` itself were written now: those
    whose id is in ``new_ids`` (an id met twice is written as first met), at most the
    chunk's ``inserted`` (another submit may have written one of them since)."""
    first: dict[str, bool] = {}
    for t in rows:
        first.setdefault(t.task_id, t.batch_id == batch_id)
    return min(sum(first[i] for i in set(new_ids)), inserted)


def new_task(spec: TaskSpec, pool: str = "default") -> NewTask:
    """A validated spec as the row a submit writes (its config hashed here: a file's
    submit hashes each distinct config once, see ``lockgate.files.Intake``)."""
    doc = spec.config_document()
    meta = orjson.dumps(spec.metadata).decode() if spec.metadata is not None else None
    return NewTask(spec.task_id, spec.batch_id,
                   ConfigRow(config_hash(doc), canonical_json(doc).decode()),
                   spec.input_json().decode(), meta, spec.priority, pool)


__all__ = ["AttemptObserver", "Store", "SubmitReport", "new_task"]
