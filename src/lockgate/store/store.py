"""The store: every database operation lockgate performs, behind one class.

Nothing outside :mod:`lockgate.store` writes SQL. Hot-path operations (claim, finish,
renew) take whole batches so the database sees one round trip per batch, not per task.
Every state transition is a conditional UPDATE whose affected-row count is checked.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import orjson
from sqlalchemy import Connection, Engine, bindparam, func, select, text
from sqlalchemy.exc import DBAPIError, OperationalError

from lockgate.errors import NotFound, StateConflict, StoreError
from lockgate.spec import TaskSpec, canonical_json, config_hash
from lockgate.store import schema
from lockgate.store.dialects import Dialect, dialect_for
from lockgate.store.engine import create
from lockgate.store.types import (
    TERMINAL,
    ClaimedTask,
    Finish,
    FinishReport,
    TaskStatus,
    row_dict,
)

log = logging.getLogger("lockgate.store")
T = TypeVar("T")

_RETRY_CODES_MYSQL = {1205, 1213}
_RETRY_SQLSTATES_PG = {"40001", "40P01"}
SUBMIT_CHUNK = 500


def _storable(f: Finish) -> Finish:
    """``f`` with every NUL character in its texts replaced by U+FFFD.

    A model's answer or a provider's error body may contain NUL (JSON allows
    ``\\u0000``), and PostgreSQL refuses it in a text column. Refused, the write-back
    of a whole batch would fail on every retry, and its tasks would be called again
    each time their leases ran out. The replacement is the same on every backend."""
    texts = (f.result, f.error_message, f.error_class, f.parse_status)
    trace = f.attempt
    if not (any(t is not None and "\x00" in t for t in texts)
            or (trace and any(isinstance(v, str) and "\x00" in v for v in trace.values()))):
        return f

    def clean(v: Any) -> Any:
        return v.replace("\x00", "\ufffd") if isinstance(v, str) else v

    return replace(f, result=clean(f.result), error_message=clean(f.error_message),
                   error_class=clean(f.error_class), parse_status=clean(f.parse_status),
                   attempt={k: clean(v) for k, v in trace.items()} if trace else trace)


def _transient(exc: DBAPIError) -> bool:
    orig = exc.orig
    code = getattr(orig, "args", (None,))[0] if orig is not None else None
    if isinstance(code, int) and code in _RETRY_CODES_MYSQL:
        return True
    if getattr(orig, "sqlstate", None) in _RETRY_SQLSTATES_PG:
        return True
    return "database is locked" in str(orig)


@dataclass(frozen=True, slots=True)
class SubmitReport:
    """How a submission went: rows inserted and task ids that already existed."""

    batch_id: str
    inserted: int
    duplicates: int


class Store:
    """All persistent state of lockgate, on SQLite, PostgreSQL or MySQL/MariaDB."""

    def __init__(self, url: str | None = None, *, pool_size: int = 4,
                 engine: Engine | None = None) -> None:
        self.engine = engine or create(url, pool_size=pool_size)
        self.dialect: Dialect = dialect_for(self.engine.dialect.name)
        self.now = self.dialect.now
        # SQLite lets one write transaction in at a time, and a writer that finds the
        # file locked can only poll for it (engine._begin_immediate). Threads of this
        # process queue here instead and get the lock the moment it is free.
        self._writer: AbstractContextManager[Any] = (
            threading.RLock() if self.dialect.name == "sqlite" else nullcontext())

    # -- plumbing -----------------------------------------------------------------

    def close(self) -> None:
        """Release every pooled connection."""
        self.engine.dispose()

    def read(self) -> Connection:
        """A connection for reading only (use it in a ``with``). On SQLite its
        transactions begin deferred: a reader of a WAL file neither waits for the one
        writer nor holds the write lock against it, as ``BEGIN IMMEDIATE`` would."""
        return self.engine.connect().execution_options(lockgate_read=True)

    def _tx(self, fn: Callable[[Connection], T], *, attempts: int = 8) -> T:
        """Run ``fn`` in one transaction, retrying deadlocks and lock timeouts."""
        delay = 0.005
        for i in range(attempts):
            try:
                with self._writer, self.engine.begin() as conn:
                    return fn(conn)
            except OperationalError as exc:
                if i == attempts - 1 or not _transient(exc):
                    raise StoreError(f"database error: {exc.orig}") from exc
            except DBAPIError as exc:
                if i == attempts - 1 or not _transient(exc):
                    raise
            log.debug("transient database conflict, retrying (attempt %d)", i + 1)
            time.sleep(delay)
            delay = min(0.5, delay * 2)
        raise AssertionError("unreachable")

    def migrate(self) -> None:
        """Create or upgrade the schema to the newest revision (safe to run concurrently)."""
        from alembic import command
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
        # The lock is released only after the upgrade committed, so the next process
        # to take it sees the new revision (and does nothing).
        with self.engine.connect() as conn, self.dialect.migration_lock(conn), conn.begin():
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")

    def db_now(self) -> int:
        """The database clock in ms (the one lease arithmetic uses)."""
        with self.read() as conn:
            return int(conn.execute(text(f"SELECT {self.now}")).scalar_one())

    # -- submission ---------------------------------------------------------------

    def submit(self, specs: Iterable[TaskSpec], *, batch_id: str,
               source: str | None = None,
               progress: Callable[[int], None] | None = None,
               pool_of: Callable[[TaskSpec], str] | None = None,
               batch_fields: Mapping[str, Any] | None = None) -> SubmitReport:
        """Insert tasks in one transaction; existing task ids are skipped (idempotent).

        Duplicates are detected by the unique constraint on ``task_id``, never by a
        check before the insert; a failure rolls the whole submission back.
        ``pool_of`` names each task's worker pool (flow control); ``batch_fields`` sets
        the batch's weight, deadline or window, and a window's tasks become visible at
        its start.
        """

        def work(conn: Connection) -> SubmitReport:
            now = int(conn.execute(text(f"SELECT {self.now}")).scalar_one())
            conn.execute(self.dialect.insert_ignore(schema.batch),
                         [{"id": batch_id, "source": source, "created_at": now}])
            fields = dict(batch_fields or {})
            if fields:
                conn.execute(schema.batch.update().where(schema.batch.c.id == batch_id)
                             .values(**fields))
            visible = max(now, int(fields.get("window_start") or now))
            inserted = total = 0
            seen_configs: set[str] = set()
            seen_batches = {batch_id}
            chunk: list[dict[str, Any]] = []
            for spec in specs:
                doc = spec.config_document()
                h = config_hash(doc)
                if h not in seen_configs:
                    seen_configs.add(h)
                    self._insert_config(conn, h, doc, now)
                if spec.batch_id and spec.batch_id not in seen_batches:
                    seen_batches.add(spec.batch_id)
                    conn.execute(self.dialect.insert_ignore(schema.batch), [
                        {"id": spec.batch_id, "source": source, "created_at": now}])
                chunk.append({
                    "task_id": spec.task_id, "batch_id": spec.batch_id or batch_id,
                    "config_hash": h, "input_data": orjson.dumps(spec.input_data).decode(),
                    "metadata": orjson.dumps(spec.metadata).decode() if spec.metadata else None,
                    "priority": spec.priority, "status": TaskStatus.PENDING,
                    "visible_at": visible, "created_at": now, "updated_at": now,
                    "pool": pool_of(spec) if pool_of else "default",
                })
                if len(chunk) >= SUBMIT_CHUNK:
                    inserted += self._insert_tasks(conn, chunk)
                    total += len(chunk)
                    if progress:
                        progress(len(chunk))
                    chunk = []
            if chunk:
                inserted += self._insert_tasks(conn, chunk)
                total += len(chunk)
                if progress:
                    progress(len(chunk))
            return SubmitReport(batch_id, inserted, total - inserted)

        return self._tx(work, attempts=1)

    def _insert_config(self, conn: Connection, h: str, doc: dict[str, Any], now: int) -> None:
        """Store a config document once. Configs are immutable and content-addressed, so
        on a server database each is committed in its own short transaction: two
        submissions meeting the same configs in opposite orders then cannot deadlock
        (an orphan config of a rolled-back submission is harmless). SQLite has one
        writer at a time, so there it joins the submit's own transaction."""
        row = [{"hash": h, "document": canonical_json(doc).decode(), "created_at": now}]
        stmt = self.dialect.insert_ignore(schema.task_config)
        if self.dialect.name == "sqlite":
            conn.execute(stmt, row)
        else:
            self._tx(lambda c: c.execute(stmt, row))

    def _insert_tasks(self, conn: Connection, rows: list[dict[str, Any]]) -> int:
        if len({r["task_id"] for r in rows}) != len(rows):
            # Repeated ids inside one chunk: keep the first, as a second submit would.
            rows = list({r["task_id"]: r for r in reversed(rows)}.values())[::-1]
        stmt = self.dialect.insert_ignore(schema.task)
        if conn.dialect.insert_executemany_returning:
            # RETURNING names exactly the rows inserted; executemany rowcounts do not.
            return len(conn.execute(stmt.returning(schema.task.c.id), rows).all())
        return int(conn.execute(stmt, rows).rowcount)  # MySQL: INSERT IGNORE counts inserts

    # -- the hot path -------------------------------------------------------------

    def claim(self, limit: int, *, lease_ms: int, worker_id: str) -> list[ClaimedTask]:
        """Lease up to ``limit`` visible tasks under one fresh random token."""
        token = secrets.token_hex(16)
        return self._tx(lambda conn: self.dialect.claim(
            conn, limit=limit, lease_ms=lease_ms, token=token, worker_id=worker_id))

    def configs(self, hashes: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Config documents by hash (immutable, so callers cache them forever)."""
        wanted = sorted(set(hashes))
        if not wanted:
            return {}
        q = select(schema.task_config.c.hash, schema.task_config.c.document).where(
            schema.task_config.c.hash.in_(bindparam("h", expanding=True)))
        with self.read() as conn:
            return {h: orjson.loads(d) for h, d in conn.execute(q, {"h": wanted})}

    def finish(self, rows: Sequence[Finish], *, worker_id: str) -> FinishReport:
        """Apply a batch of write-backs, each fenced by its lease token.

        Rows whose token no longer matches (the lease was re-claimed) or whose task
        left PENDING are discarded, never written; their attempts are still recorded
        with outcome ``discarded``. Returns which ids were applied and discarded.
        """
        if not rows:
            return FinishReport([], [])
        # One lock order (by id): fewer deadlocks.
        ordered = sorted((_storable(f) for f in rows), key=lambda f: f.id)

        def work(conn: Connection) -> FinishReport:
            held = self.dialect.owned(conn, [f.id for f in ordered])
            mine = [f for f in ordered if (f.id, f.lease_token) in held]
            if mine:
                n = self.dialect.finish(conn, mine)
                if n != len(mine):
                    raise StateConflict(
                        f"write-back changed {n} rows, expected {len(mine)}; rolled back")
            # A worker may flush a stale and a current result of one task together
            # (it re-claimed the task after its own lease ran out): key by claim.
            applied = {(f.id, f.lease_token) for f in mine}
            attempts = []
            for f in ordered:
                if f.attempt is not None:
                    a = dict(f.attempt)
                    a["task_pk"] = f.id
                    a["lease_token"] = f.lease_token
                    a["worker_id"] = worker_id
                    if (f.id, f.lease_token) not in applied:
                        a["outcome"] = "discarded"
                    attempts.append(a)
            if attempts:
                # One column set for all: short attempt rows (released, dead) sit
                # beside full traces.
                self.dialect.insert_attempts(conn, attempts)
            return FinishReport(sorted(f.id for f in mine),
                                [f.id for f in ordered
                                 if (f.id, f.lease_token) not in applied],
                                frozenset(applied))

        report = self._tx(work)
        if report.discarded:
            log.warning("discarded %d write-back(s) whose lease was lost: task pk %s",
                        len(report.discarded), report.discarded[:10])
        return report

    def renew(self, held: dict[str, list[int]], *, lease_ms: int) -> int:
        """Push the lease of every task still held under these tokens forward."""
        if not held:
            return 0
        sql = text(
            f"UPDATE task SET visible_at = {self.now} + :lease_ms, updated_at = {self.now} "
            "WHERE id IN :ids AND lease_token = :tok"  # PENDING: checked under lock by owned()
        ).bindparams(bindparam("ids", expanding=True))

        def work(conn: Connection) -> int:
            # Lock every row first, in id order across all tokens (as a write-back
            # does): updating token by token would take them in a different order.
            current = self.dialect.owned(conn, sorted(i for ids in held.values() for i in ids))
            n = 0
            for tok, ids in held.items():
                mine = sorted(i for i in ids if (i, tok) in current)
                for i in range(0, len(mine), 1000):
                    n += conn.execute(sql, {"lease_ms": lease_ms, "tok": tok,
                                            "ids": mine[i:i + 1000]}).rowcount
            return n

        return self._tx(work)

    def queue_state(self) -> tuple[bool, int | None, int]:
        """(any task PENDING, earliest visible_at among them, database now)."""
        with self.read() as conn:
            row = conn.execute(text(
                f"SELECT MIN(visible_at), {self.now} FROM task WHERE status = 'PENDING'"
            )).one()
        return row[0] is not None, row[0], int(row[1])

    # -- workers ------------------------------------------------------------------

    def register_worker(self, worker_id: str, *, hostname: str, pid: int,
                        concurrency: int) -> None:
        """Insert this worker's heartbeat row."""
        def work(conn: Connection) -> None:
            now = conn.execute(text(f"SELECT {self.now}")).scalar_one()
            conn.execute(schema.worker.insert(), [{
                "id": worker_id, "hostname": hostname[:255], "pid": pid,
                "status": "running", "started_at": now, "heartbeat_at": now,
                "concurrency": concurrency}])
        self._tx(work)

    def heartbeat(self, worker_id: str, *, status: str = "running",
                  **counters: int) -> None:
        """Refresh the worker row's heartbeat and counters."""
        sets = ", ".join(f"{k} = :{k}" for k in counters)
        stopped = f", stopped_at = {self.now}" if status == "stopped" else ""
        sql = text(f"UPDATE worker SET heartbeat_at = {self.now}, status = :status, "
                   f"version = version + 1{', ' + sets if sets else ''}{stopped} "
                   "WHERE id = :id")
        self._tx(lambda conn: conn.execute(sql, {"id": worker_id, "status": status,
                                                 **counters}))

    # -- inspection and administration --------------------------------------------

    def batch_counts(self, batch_id: str) -> dict[str, int]:
        """Tasks of one batch per state (index-backed: cheap enough to poll)."""
        t = schema.task
        with self.read() as conn:
            return {s: int(n) for s, n in conn.execute(
                select(t.c.status, func.count()).where(t.c.batch_id == batch_id)
                .group_by(t.c.status))}

    def status(self, *, alive_within_ms: int = 30_000) -> dict[str, Any]:
        """Counts per batch and state, leases in flight, and live workers."""
        t = schema.task
        with self.read() as conn:
            now = int(conn.execute(text(f"SELECT {self.now}")).scalar_one())
            counts: dict[str, dict[str, int]] = {}
            for b, s, n in conn.execute(select(t.c.batch_id, t.c.status, func.count())
                                        .group_by(t.c.batch_id, t.c.status)):
                counts.setdefault(b, {})[s] = int(n)
            leased = conn.execute(text(
                "SELECT COUNT(*) FROM task WHERE status = 'PENDING' AND lease_token IS NOT "
                "NULL AND visible_at > :now"), {"now": now}).scalar_one()
            waiting = conn.execute(text(
                "SELECT COUNT(*) FROM task WHERE status = 'PENDING' AND lease_token IS NULL "
                "AND visible_at > :now"), {"now": now}).scalar_one()
            w = schema.worker
            workers = [row_dict(r) for r in conn.execute(
                select(w).where(w.c.status != "stopped",
                                w.c.heartbeat_at >= now - alive_within_ms)
                .order_by(w.c.started_at))]
        return {"now": now, "batches": counts, "leased": int(leased),
                "backing_off": int(waiting), "workers": workers}

    def task(self, task_id: str) -> dict[str, Any]:
        """One task with its config and every attempt, for ``lockgate tasks show``."""
        t, a = schema.task, schema.task_attempt
        with self.read() as conn:
            row = conn.execute(select(t).where(t.c.task_id == task_id)).first()
            if row is None:
                raise NotFound(f"no task '{task_id}'; check the id with `lockgate status`")
            out = row_dict(row)
            out["attempt_log"] = [row_dict(r) for r in conn.execute(
                select(a).where(a.c.task_pk == out["id"]).order_by(a.c.id))]
            doc = conn.execute(select(schema.task_config.c.document).where(
                schema.task_config.c.hash == out["config_hash"])).scalar_one()
            out["config"] = orjson.loads(doc)
        return out

    def cancel(self, task_id: str) -> None:
        """PENDING -> CANCELLED. A worker holding it will find its write-back fenced."""
        sql = text(f"UPDATE task SET status = 'CANCELLED', finished_at = {self.now}, "
                   f"updated_at = {self.now}, version = version + 1, "
                   "error_class = NULL, error_message = 'cancelled by operator' "
                   "WHERE task_id = :tid AND status = 'PENDING'")
        self._transition(task_id, sql, "PENDING", "cancel")

    def retry(self, task_id: str) -> None:
        """FAILED, DEAD or CANCELLED -> PENDING with a fresh attempt budget."""
        sql = text(f"UPDATE task SET status = 'PENDING', visible_at = {self.now}, "
                   f"updated_at = {self.now}, attempts = 0, lease_token = NULL, "
                   "leased_by = NULL, finished_at = NULL, result = NULL, "
                   "parse_status = NULL, error_class = NULL, error_message = NULL, "
                   "version = version + 1 "
                   "WHERE task_id = :tid AND status IN ('FAILED', 'DEAD', 'CANCELLED')")
        self._transition(task_id, sql, "FAILED, DEAD or CANCELLED", "retry")

    def _transition(self, task_id: str, sql: Any, needs: str, verb: str) -> None:
        def work(conn: Connection) -> None:
            if conn.execute(sql, {"tid": task_id}).rowcount == 1:
                return
            st = conn.execute(select(schema.task.c.status).where(
                schema.task.c.task_id == task_id)).scalar()
            if st is None:
                raise NotFound(f"no task '{task_id}'")
            raise StateConflict(f"cannot {verb} task '{task_id}': it is {st}, "
                                f"and {verb} needs {needs}")
        self._tx(work)

    def results(self, batch_id: str | None = None) -> Iterator[dict[str, Any]]:
        """Stream every task of a batch (or all) in id order, with its last attempt's usage."""
        t, a = schema.task, schema.task_attempt
        won = (a.c.task_pk == t.c.id) & (a.c.outcome == "succeeded")
        q = select(t.c.id, t.c.task_id, t.c.batch_id, t.c.status, t.c.result,
                   t.c.parse_status, t.c.error_class, t.c.error_message, t.c.attempts,
                   t.c.finished_at, t.c.created_at, a.c.input_tokens, a.c.output_tokens,
                   a.c.model, a.c.latency_ms).select_from(t.outerjoin(a, won)).order_by(t.c.id)
        if batch_id is not None:
            q = q.where(t.c.batch_id == batch_id)
        with self.read() as conn:
            res = conn.execution_options(yield_per=1000).execute(q)
            for row in res:
                yield row_dict(row)

    def batch_exists(self, batch_id: str) -> bool:
        """Whether a batch of this id was ever submitted."""
        with self.read() as conn:
            return conn.execute(select(schema.batch.c.id).where(
                schema.batch.c.id == batch_id)).first() is not None

    def attempt_stats(self, batch_id: str | None = None) -> dict[str, Any]:
        """Calls, outcomes, latencies and completeness over the attempts of a batch."""
        t, a = schema.task, schema.task_attempt
        q = select(a.c.outcome, a.c.latency_ms, a.c.completeness, a.c.error_class,
                   a.c.parse_status)
        if batch_id is not None:
            q = q.join(t, t.c.id == a.c.task_pk).where(t.c.batch_id == batch_id)
        latencies: list[float] = []
        outcomes: dict[str, int] = {}
        errors: dict[str, int] = {}
        parse: dict[str, int] = {}
        comp_sum = 0.0
        comp_n = 0
        with self.read() as conn:
            for outcome, lat, comp, err, ps in conn.execution_options(
                    yield_per=5000).execute(q):
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
                if lat is not None:
                    latencies.append(float(lat))
                if err:
                    errors[err] = errors.get(err, 0) + 1
                if ps:
                    parse[ps] = parse.get(ps, 0) + 1
                if outcome == "succeeded" and comp is not None:
                    comp_sum += comp
                    comp_n += 1
        return {"calls": sum(outcomes.values()), "outcomes": outcomes, "errors": errors,
                "parse_status": parse, "latencies_ms": latencies,
                "completeness": comp_sum / comp_n if comp_n else None}

    def cleanup(self, *, older_than_ms: int, tasks: bool = False) -> dict[str, int]:
        """Retention: delete attempts (and optionally finished tasks) older than a bound.

        The cutoff is the database clock minus ``older_than_ms``. Tasks' ``finished_at``
        is on that clock; attempts' ``started_at`` is the wall clock of the worker that
        made the call, so an attempt within a worker's clock skew of the cutoff may be
        kept or deleted one run early or late (harmless against retention periods of
        hours or days)."""
        deleted = {"attempts": 0, "tasks": 0}

        def work(conn: Connection) -> None:
            cutoff = int(conn.execute(text(f"SELECT {self.now}")).scalar_one()) - older_than_ms
            deleted["attempts"] = conn.execute(text(
                "DELETE FROM task_attempt WHERE started_at < :c"), {"c": cutoff}).rowcount
            if tasks:
                deleted["tasks"] = conn.execute(text(
                    "DELETE FROM task WHERE status IN ('SUCCEEDED', 'FAILED', 'DEAD', "
                    "'CANCELLED') AND finished_at < :c"), {"c": cutoff}).rowcount
        self._tx(work)
        return deleted

    def truncate_all(self) -> None:
        """Delete every row (tests and benchmarks only)."""
        def work(conn: Connection) -> None:
            for tbl in reversed(schema.metadata.sorted_tables):
                conn.execute(tbl.delete())
        self._tx(work)


__all__ = ["TERMINAL", "Store", "SubmitReport"]
