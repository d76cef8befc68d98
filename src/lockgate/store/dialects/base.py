"""What every dialect shares: the write-back and submit statements, the helpers
that batch values as JSON, and :class:`Dialect` with the behaviour the others
change."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from typing import Any

import orjson
from sqlalchemy import ColumnElement, Connection, Row, Select, Table, select, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import Insert

from lockgate.errors import StoreError
from lockgate.store.schema import task_attempt
from lockgate.store.types import ClaimedTask, Finish

#: A submitted task's values, in the order of ``_SUBMIT_COLS``.
NewTaskValues = tuple[str, str, str, str, str | None, int, int, str]
_SUBMIT_COLS = ("task_id", "batch_id", "config_hash", "input_data", "metadata", "priority",
                "visible_at", "pool")
_SUBMIT_KINDS: tuple[type, ...] = (str, str, str, str, str, int, int, str)
#: The INSERT's column list: the submitted values, then the ones every new task shares.
_SUBMIT_INTO = (f"INSERT {{ignore}}INTO task ({', '.join(_SUBMIT_COLS)}, status, created_at, "
                "updated_at)")

#: How long a process waits for another's schema migration (where the lock has a bound:
#: MySQL/MariaDB) before :class:`MigrationLockBusy`; ``lockgate worker`` then waits again.
MIGRATION_LOCK_WAIT_S = 120


class MigrationLockBusy(StoreError):
    """Another process held the schema migration lock for all of
    :data:`MIGRATION_LOCK_WAIT_S`: its migration is still running (or it hangs)."""


_CLAIM_COLS = "id, task_id, batch_id, config_hash, input_data, attempts, lease_token"

# The SET clause of a write-back, shared by all dialects. ``v`` is the batch of
# values; only v.* and each column's own old value are read (MySQL applies SET
# assignments left to right, so no assignment may read a column set before it).
_FINISH_SET = """
    {t}status = v.status,
    {t}result = v.result,
    {t}parse_status = v.parse_status,
    {t}error_class = v.error_class,
    {t}error_message = v.error_message,
    {t}visible_at = CASE WHEN v.status = 'PENDING' THEN {now} + v.delay_ms
                     ELSE t.visible_at END,
    {t}attempts = t.attempts - v.release_attempt,
    {t}lease_token = CASE WHEN v.status = 'PENDING' THEN NULL ELSE t.lease_token END,
    {t}leased_by = CASE WHEN v.status = 'PENDING' THEN NULL ELSE t.leased_by END,
    {t}finished_at = CASE WHEN v.status IN ('PENDING', 'REVIEW') THEN NULL ELSE {now} END,
    {t}version = t.version + 1,
    {t}updated_at = {now},
    {t}model = v.model,
    {t}input_tokens = v.input_tokens,
    {t}output_tokens = v.output_tokens,
    {t}latency_ms = v.latency_ms,
    {t}http_status = v.http_status,
    {t}request_id = v.request_id,
    {t}response = v.response
"""
# No status condition here: the rows were locked and checked PENDING by ``owned`` in
# the same transaction. Naming the status let PostgreSQL, before its first ANALYZE of
# a freshly submitted batch, plan the write-back over every PENDING row through the
# claim index (127 ms for 256 rows among 300k pending, against 1 ms by primary key).
_FINISH_FENCE = "t.id = v.id AND t.lease_token = v.tok"
_FINISH_COLS = ("id", "tok", "status", "result", "parse_status", "error_class",
                "error_message", "delay_ms", "release_attempt", "model", "input_tokens",
                "output_tokens", "latency_ms", "http_status", "request_id", "response")
#: The Python type of each, to declare it when the values are read back from JSON.
_FINISH_KINDS: tuple[type, ...] = (int, str, str, str, str, str, str, int, int, str, int, int,
                                   float, int, str, str)


def _finish_values(f: Finish) -> tuple[Any, ...]:
    return (f.id, f.lease_token, f.status, f.result, f.parse_status, f.error_class,
            f.error_message, f.delay_ms, 1 if f.release_attempt else 0, f.model,
            f.input_tokens, f.output_tokens, f.latency_ms, f.http_status, f.request_id,
            f.response)


#: The Python type of each trace column, to declare it when reading rows from JSON.
_ATTEMPT_KINDS: dict[str, type] = {c.name: c.type.python_type for c in task_attempt.columns}
_PG_TYPES: dict[type, str] = {int: "bigint", float: "double precision", str: "text"}
_MY_TYPES: dict[type, str] = {int: "BIGINT", float: "DOUBLE", str: "LONGTEXT"}


def _json_batches(rows: Sequence[Any], max_bytes: int) -> Iterator[bytes]:
    """``rows`` as JSON arrays of at most ``max_bytes`` each (a row larger than that
    goes alone): whole batches travel as one text parameter, which the database reads
    with its own JSON functions, instead of one driver-adapted parameter per value."""
    batch: list[bytes] = []
    size = 0
    for r in rows:
        one = orjson.dumps(r)
        if batch and size + len(one) + 1 > max_bytes:
            yield b"[" + b",".join(batch) + b"]"
            batch, size = [], 0
        batch.append(one)
        size += len(one) + 1
    if batch:
        yield b"[" + b",".join(batch) + b"]"


@contextmanager
def _driver_cursor(conn: Connection) -> Iterator[Any]:
    """A DB-API cursor under a SQLAlchemy connection, closed on exit, for the hot path's
    fixed SQL: no compilation, no result wrapping (the transaction stays SQLAlchemy's).

    Driver errors come out as SQLAlchemy's, as from ``conn.execute``: the store retries
    deadlocks and lock timeouts by their wrapped class, and a lost connection is
    invalidated so that the pool does not hand it out again."""
    dbapi_conn = conn.connection.dbapi_connection
    cur = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        yield cur
    except conn.dialect.loaded_dbapi.Error as exc:
        lost = conn.dialect.is_disconnect(exc, dbapi_conn, cur)
        if lost:
            conn.invalidate(exc)
        raise DBAPIError.instance(None, None, exc, conn.dialect.loaded_dbapi.Error,
                                  connection_invalidated=lost,
                                  dialect=conn.dialect) from exc
    finally:
        with suppress(Exception):  # a cursor of a lost connection may not close
            cur.close()


def _claimed(rows: Sequence[Any]) -> list[ClaimedTask]:
    return [ClaimedTask(id=r[0], task_id=r[1], batch_id=r[2], config_hash=r[3],
                        input_data=r[4], attempt=r[5], lease_token=r[6]) for r in rows]


def _leased(rows: Sequence[Any], token: str) -> list[ClaimedTask]:
    """Rows read before the UPDATE that leased them (``_CLAIM_COLS`` up to
    ``attempts``): the attempt is the one that UPDATE counted, the token its own."""
    return [ClaimedTask(id=r[0], task_id=r[1], batch_id=r[2], config_hash=r[3],
                        input_data=r[4], attempt=r[5] + 1, lease_token=token) for r in rows]


class Dialect:
    """The interface; one subclass per database family."""

    name = "abstract"
    #: SQL expression for the database's current time in integer milliseconds.
    now = ""

    def claim(self, conn: Connection, *, limit: int, lease_ms: int, token: str,
              worker_id: str) -> list[ClaimedTask]:
        """Lease up to ``limit`` visible PENDING tasks under ``token``; caller commits."""
        raise NotImplementedError

    def finish(self, conn: Connection, rows: Sequence[Finish]) -> int:
        """Apply fenced write-backs for rows already locked and checked; return the count."""
        raise NotImplementedError

    def claim_lane(self, conn: Connection, *, pool: str, batch_id: str, limit: int,
                   lease_ms: int, token: str, worker_id: str) -> list[ClaimedTask]:
        """Like :meth:`claim`, restricted to one pool and batch (index ``ix_task_lane``)."""
        raise NotImplementedError

    def insert_ignore(self, table: Table) -> Insert:
        """An INSERT that skips rows whose unique key already exists."""
        raise NotImplementedError

    #: Rows a submit commits at once after its first chunk (the bulk path's sweet spot).
    submit_chunk_rows = 10_000

    def insert_tasks(self, conn: Connection, rows: Sequence[NewTaskValues], *,
                     now: int) -> int:
        """Insert new PENDING tasks, skipping task ids that exist already; return how
        many were inserted. Each row is ``_SUBMIT_COLS`` in order (ids unique within
        ``rows``)."""
        raise NotImplementedError

    #: Whether a submit tells listening workers of its tasks (:mod:`lockgate.store.
    #: arrivals`); elsewhere idle workers poll.
    announces_tasks = False

    def announce_tasks(self, conn: Connection) -> None:
        """Tell listening workers, when this transaction commits, that tasks came."""

    #: Whether a submit refreshes the planner's statistics of the task table itself as
    #: it grows it (elsewhere the database keeps them, or needs none for the hot path).
    refreshes_statistics = False

    def task_rows_estimate(self, conn: Connection) -> int:
        """The task table's row count as the planner's statistics last saw it (0 if
        never)."""
        return 0

    def refresh_task_statistics(self, conn: Connection) -> None:
        """Refresh the planner's statistics of the task table after a bulk insert."""

    def lock_for_update(self) -> str:
        """Suffix that row-locks a SELECT inside a transaction ('' where not needed)."""
        return " FOR UPDATE"

    def upsert_suffix(self, keys: Sequence[str], columns: Sequence[str]) -> str:
        """Suffix that turns a (multi-row) ``INSERT`` into an upsert: a row whose unique
        key ``keys`` exists already has its ``columns`` set to the inserted values.
        Names are quoted already."""
        sets = ", ".join(f"{c} = excluded.{c}" for c in columns)
        return f" ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {sets}"

    #: The driver's positional parameter marker.
    placeholder = "%s"

    def owned(self, conn: Connection, ids: Sequence[int]) -> set[tuple[int, str]]:
        """(id, lease token) of the tasks among ``ids`` still PENDING, row-locked until
        the transaction ends (the write-back that follows changes exactly these).

        Rows are locked in id order. Every statement that locks several leased rows
        (write-back, lease renewal) locks them through here first: two transactions
        taking overlapping rows in different orders would deadlock. ``ids`` must be
        sorted."""
        out: set[tuple[int, str]] = set()
        with _driver_cursor(conn) as cur:
            for i in range(0, len(ids), 900):
                part = ids[i:i + 900]
                # The status is checked here, not in WHERE: looked up by id alone, the
                # rows are found by primary key whatever the planner's statistics say.
                cur.execute("SELECT id, lease_token, status FROM task WHERE "
                            f"id IN ({', '.join([self.placeholder] * len(part))}) "
                            "ORDER BY id" + self.lock_for_update(), tuple(part))
                out.update((int(r[0]), str(r[1])) for r in cur.fetchall()
                           if r[2] == "PENDING")
        return out

    def insert_attempts(self, conn: Connection, attempts: Sequence[dict[str, Any]]) -> None:
        """Insert trace rows; columns absent from every row keep their defaults."""
        raise NotImplementedError

    def max_input_bytes(self, conn: Connection, ceiling: int) -> int:
        """The largest task input (JSON bytes) this database takes, at most ``ceiling``."""
        return ceiling

    def select_stream(self, columns: Sequence[ColumnElement[Any]]
                      ) -> tuple[Select[Any], Callable[[Row[Any]], Sequence[Any]]]:
        """A SELECT of ``columns`` for a long stream of rows, and how to read one of
        its rows as the columns' values, in order."""
        return select(*columns), _as_is

    def long_read(self, conn: Connection) -> AbstractContextManager[None]:
        """Around a read its caller may leave idle between rows for as long as it likes
        (a stream of results the user's loop consumes): lifts, for that read alone, the
        bound a server puts on an idle transaction (see ``engine.IDLE_IN_TRANSACTION_S``).
        A read holds no row lock, which is what the bound protects."""
        return nullcontext()

    def writer_lock(self) -> AbstractContextManager[Any]:
        """What a process's threads hold around each write transaction (none here)."""
        return nullcontext()

    #: The statements that take (answering 1, or giving up after ``:wait`` seconds
    #: where the lock has a bound) and give back the cross-process schema migration
    #: lock; None on SQLite, whose IMMEDIATE transactions already serialise
    #: writers.
    _migration_lock: tuple[str, str] | None = None

    @contextmanager
    def migration_lock(self, conn: Connection) -> Iterator[None]:
        """Serialise schema migrations across processes: held from before the
        migration's transaction begins until after it commits."""
        if self._migration_lock is None:
            yield
            return
        take, give_back = self._migration_lock
        got = conn.execute(text(take), {"wait": MIGRATION_LOCK_WAIT_S}).scalar()
        conn.commit()
        if got != 1:
            raise MigrationLockBusy(f"another process has held the schema migration lock "
                                    f"for {MIGRATION_LOCK_WAIT_S} s; let its migration finish "
                                    "(or stop it), then start again")
        try:
            yield
        finally:
            conn.rollback()
            conn.execute(text(give_back))
            conn.commit()

    def _claim_update_sql(self, where: str) -> str:
        return (
            f"UPDATE task SET lease_token = :tok, leased_by = :worker, "
            f"attempts = attempts + 1, visible_at = {self.now} + :lease_ms, "
            f"version = version + 1, updated_at = {self.now} WHERE {where}"
        )

    def _lane_select(self, cols: str, lock: str = "") -> str:
        return (f"SELECT {cols} FROM task WHERE pool = :pool AND status = 'PENDING' "
                f"AND batch_id = :batch AND visible_at <= {self.now} ORDER BY visible_at "
                f"LIMIT :lim{lock}")

    def _lane_params(self, pool: str, batch_id: str, limit: int, lease_ms: int, token: str,
                     worker_id: str) -> dict[str, Any]:
        return {"pool": pool, "batch": batch_id, "lim": limit, "lease_ms": lease_ms,
                "tok": token, "worker": worker_id}


def _as_is(row: Row[Any]) -> Sequence[Any]:
    return row
