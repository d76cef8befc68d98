"""Everything that differs between SQLite, PostgreSQL and MySQL/MariaDB, in one place.

Above this module the store is dialect-free. Each :class:`Dialect` knows its clock
expression, how to claim a batch (``FOR UPDATE SKIP LOCKED`` or SQLite's serialised
writer), how to insert ignoring duplicates, how to apply a batch of fenced write-backs
in one statement, and how to serialise migrations across processes.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from typing import Any

import orjson
from sqlalchemy import ColumnElement, Connection, Row, Select, Table, func, select, text
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql import Insert

from lockgate.errors import ConfigError, StoreError
from lockgate.store.schema import task_attempt
from lockgate.store.tx import in_list
from lockgate.store.types import ClaimedTask, Finish

#: A submitted task's values, in the order of ``_SUBMIT_COLS``.
NewTaskValues = tuple[str, str, str, str, str | None, int, int, str]
_SUBMIT_COLS = ("task_id", "batch_id", "config_hash", "input_data", "metadata", "priority",
                "visible_at", "pool")
_SUBMIT_KINDS: tuple[type, ...] = (str, str, str, str, str, int, int, str)
#: The INSERT's column list: the submitted values, then the ones every new task shares.
_SUBMIT_INTO = (f"INSERT {{ignore}}INTO task ({', '.join(_SUBMIT_COLS)}, status, created_at, "
                "updated_at)")

#: How long a process waits for another's schema migration (where the lock has a bound).
MIGRATION_LOCK_WAIT_S = 120
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
    {t}finished_at = CASE WHEN v.status = 'PENDING' THEN NULL ELSE {now} END,
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

    def lock_for_update(self) -> str:
        """Suffix that row-locks a SELECT inside a transaction ('' where not needed)."""
        return " FOR UPDATE"

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
            raise StoreError(f"another process has held the schema migration lock for "
                             f"{MIGRATION_LOCK_WAIT_S} s; let its migration finish (or stop "
                             "it), then start again")
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


class SQLiteDialect(Dialect):
    """SQLite: one writer at a time (``BEGIN IMMEDIATE``), so no row locks are needed.

    Python's sqlite3 releases the GIL around every step of a statement, that is once
    per row read or written, and takes it back after each. A worker's event loop holds
    the GIL most of the time, so each of those returns waits for it (a quarter of a
    millisecond or more): a 256-row claim through ``RETURNING`` and a 256-row
    write-back through ``executemany`` took about 100 ms each, and the SQLite write
    lock was held all that while. So the hot path moves whole batches per step: rows
    come back aggregated into one JSON value, and rows go in as one multi-row VALUES
    list (chunked under the connection's limit on bound parameters)."""

    name = "sqlite"
    now = "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"
    _ROW_JSON = "json_array(id, task_id, batch_id, config_hash, input_data, attempts)"

    def claim(self, conn: Connection, *, limit: int, lease_ms: int, token: str,
              worker_id: str) -> list[ClaimedTask]:
        return self._claim(conn, (
            f"SELECT {self._ROW_JSON} AS r FROM task WHERE status = 'PENDING' "
            f"AND visible_at <= {self.now} ORDER BY visible_at LIMIT :lim"),
            {"lim": limit}, lease_ms=lease_ms, token=token, worker_id=worker_id)

    def claim_lane(self, conn: Connection, *, pool: str, batch_id: str, limit: int,
                   lease_ms: int, token: str, worker_id: str) -> list[ClaimedTask]:
        return self._claim(conn, self._lane_select(f"{self._ROW_JSON} AS r"),
                           {"pool": pool, "batch": batch_id, "lim": limit},
                           lease_ms=lease_ms, token=token, worker_id=worker_id)

    def _claim(self, conn: Connection, select: str, params: dict[str, Any], *,
               lease_ms: int, token: str, worker_id: str) -> list[ClaimedTask]:
        """Read the chosen rows as one JSON array, then lease them in one UPDATE: the
        transaction holds the write lock, so nothing changes them in between."""
        with _driver_cursor(conn) as cur:  # sqlite3 takes the :name parameters as they are
            cur.execute(f"SELECT json_group_array(json(r)) FROM ({select})", params)
            rows = orjson.loads(cur.fetchone()[0])
            if not rows:
                return []
            ids = orjson.dumps([r[0] for r in rows]).decode()
            cur.execute(self._claim_update_sql("id IN (SELECT value FROM json_each(:ids))"),
                        {"tok": token, "worker": worker_id, "lease_ms": lease_ms,
                         "ids": ids})
            if cur.rowcount != len(rows):
                raise AssertionError(f"claim leased {cur.rowcount} of {len(rows)} rows "
                                     "under the write lock")
        return _leased(rows, token)

    def owned(self, conn: Connection, ids: Sequence[int]) -> set[tuple[int, str]]:
        # No row locks to order: the transaction already holds the database's write lock.
        with _driver_cursor(conn) as cur:
            cur.execute("SELECT json_group_array(json_array(id, lease_token)) FROM task "
                        "WHERE id IN (SELECT value FROM json_each(?)) AND status = 'PENDING'",
                        (orjson.dumps(list(ids)).decode(),))
            return {(int(i), str(tok)) for i, tok in orjson.loads(cur.fetchone()[0])}

    def finish(self, conn: Connection, rows: Sequence[Finish]) -> int:
        changed = 0
        set_clause = _FINISH_SET.format(now=self.now, t="")
        names = ", ".join(f"column{i} AS {c}" for i, c in enumerate(_FINISH_COLS, 1))
        with _driver_cursor(conn) as cur:
            for part, values in self._values(cur, [_finish_values(f) for f in rows],
                                             len(_FINISH_COLS)):
                # Not ``WITH v(...) AS (VALUES ...) UPDATE``: sqlite3 reports no
                # rowcount for a statement that does not begin with UPDATE.
                cur.execute(f"UPDATE task AS t SET {set_clause} FROM (SELECT {names} "
                            f"FROM (VALUES {values})) AS v WHERE {_FINISH_FENCE}", part)
                changed += cur.rowcount
        return changed

    def insert_attempts(self, conn: Connection, attempts: Sequence[dict[str, Any]]) -> None:
        cols = sorted(set().union(*attempts))
        with _driver_cursor(conn) as cur:
            for part, values in self._values(
                    cur, [tuple(a.get(c) for c in cols) for a in attempts], len(cols)):
                cur.execute(f"INSERT INTO task_attempt ({', '.join(cols)}) VALUES {values}",
                            part)

    @staticmethod
    def _values(cur: Any, rows: list[tuple[Any, ...]],
                width: int) -> Iterator[tuple[tuple[Any, ...], str]]:
        """``rows`` in chunks: each chunk's parameters, flattened, and its VALUES list
        of placeholders.

        Chunks hold a power of two rows, at most 256 and within the connection's limit
        on bound parameters. sqlite3 keeps every statement text it runs in a per-
        connection cache, and a VALUES list of a few thousand parameters compiles to a
        large program: one text per batch size let a worker's memory grow with the
        sizes it met (148 to 234 MB over 20,000 and 200,000 tasks). Powers of two keep
        it to nine texts per statement, for at most nine steps per batch of up to 511
        rows."""
        try:
            limit = cur.connection.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        except AttributeError:  # not the standard library's sqlite3
            limit = 999  # SQLite's smallest default
        most = min(256, max(1, limit // width))
        size = 1 << (most.bit_length() - 1)  # the largest power of two within it
        one = "(" + ", ".join(["?"] * width) + ")"
        i = 0
        while i < len(rows):
            while size > len(rows) - i:
                size //= 2
            chunk = rows[i:i + size]
            yield tuple(v for r in chunk for v in r), ", ".join([one] * size)
            i += size

    submit_chunk_rows = 5_000

    def insert_tasks(self, conn: Connection, rows: Sequence[NewTaskValues], *,
                     now: int) -> int:
        # One JSON parameter read by json_each: the whole insert is one statement step
        # (one release of the GIL, not one per row as executemany takes).
        picked = ", ".join(f"json_extract(value, '$[{i}]')" for i in range(len(_SUBMIT_COLS)))
        sql = (_SUBMIT_INTO.format(ignore="OR IGNORE ") + f" SELECT {picked}, 'PENDING', "
               "?, ? FROM json_each(?)")
        n = 0
        with _driver_cursor(conn) as cur:
            for batch in _json_batches(rows, 32 << 20):
                cur.execute(sql, (now, now, batch.decode()))
                n += cur.rowcount
        return n

    def writer_lock(self) -> AbstractContextManager[Any]:
        # SQLite lets one write transaction in at a time, and a writer that finds the
        # file locked can only poll for it (engine._begin_immediate). Threads of one
        # process queue here instead and get the lock the moment it is free.
        return threading.RLock()

    def insert_ignore(self, table: Table) -> Insert:
        return sqlite.insert(table).on_conflict_do_nothing()

    def lock_for_update(self) -> str:
        return ""


class PostgresDialect(Dialect):
    """PostgreSQL >= 13: one-statement claims with ``FOR UPDATE SKIP LOCKED``."""

    name = "postgresql"
    now = "(EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::bigint"

    @contextmanager
    def long_read(self, conn: Connection) -> Iterator[None]:
        # LOCAL: ends with this read's transaction; the session keeps its bound.
        conn.exec_driver_sql("SET LOCAL idle_in_transaction_session_timeout = 0")
        yield

    def claim(self, conn: Connection, *, limit: int, lease_ms: int, token: str,
              worker_id: str) -> list[ClaimedTask]:
        sql = self._claim_update_sql(
            f"id IN (SELECT id FROM task WHERE status = 'PENDING' AND visible_at <= {self.now}"
            f" ORDER BY visible_at LIMIT :lim FOR UPDATE SKIP LOCKED)"
        ) + f" RETURNING {_CLAIM_COLS}"
        rows = conn.execute(text(sql), {"tok": token, "worker": worker_id,
                                        "lease_ms": lease_ms, "lim": limit}).all()
        return _claimed(rows)

    #: Rows per JSON parameter are bounded only to bound the memory of one statement.
    _JSON_BYTES = 32 << 20

    def finish(self, conn: Connection, rows: Sequence[Finish]) -> int:
        values = ", ".join(f"(e->>{i})::{_PG_TYPES[k]} AS {c}" for i, (c, k) in
                           enumerate(zip(_FINISH_COLS, _FINISH_KINDS, strict=True)))
        sql = (f"UPDATE task AS t SET {_FINISH_SET.format(now=self.now, t='')} "
               f"FROM (SELECT {values} FROM json_array_elements(%s::json) AS e) AS v "
               f"WHERE {_FINISH_FENCE}")
        changed = 0
        with _driver_cursor(conn) as cur:
            for batch in _json_batches([_finish_values(f) for f in rows], self._JSON_BYTES):
                cur.execute(sql, (batch.decode(),))
                changed += cur.rowcount
        return changed

    def insert_attempts(self, conn: Connection, attempts: Sequence[dict[str, Any]]) -> None:
        names = sorted(set().union(*attempts))
        cols = ", ".join(names)
        types = ", ".join(f"{c} {_PG_TYPES[_ATTEMPT_KINDS[c]]}" for c in names)
        sql = (f"INSERT INTO task_attempt ({cols}) SELECT {cols} "
               f"FROM json_to_recordset(%s::json) AS x({types})")
        with _driver_cursor(conn) as cur:
            for batch in _json_batches(attempts, self._JSON_BYTES):
                cur.execute(sql, (batch.decode(),))

    def insert_ignore(self, table: Table) -> Insert:
        return postgresql.insert(table).on_conflict_do_nothing()

    submit_chunk_rows = 20_000
    #: The session's staging table of a submit: COPY cannot skip existing keys, so rows
    #: are copied here, then moved by one INSERT ... ON CONFLICT DO NOTHING.
    _STAGE = ("CREATE TEMP TABLE IF NOT EXISTS lockgate_submit ("
              + ", ".join(f"{c} {_PG_TYPES[k]}" for c, k in zip(_SUBMIT_COLS, _SUBMIT_KINDS,
                                                               strict=True))
              + ") ON COMMIT DELETE ROWS")

    def insert_tasks(self, conn: Connection, rows: Sequence[NewTaskValues], *,
                     now: int) -> int:
        cols = ", ".join(_SUBMIT_COLS)
        with _driver_cursor(conn) as cur:
            cur.execute("SET LOCAL client_min_messages = warning")  # no "already exists"
            cur.execute(self._STAGE)
            with cur.copy(f"COPY lockgate_submit ({cols}) FROM STDIN") as copy:
                for r in rows:
                    copy.write_row(r)
            cur.execute(_SUBMIT_INTO.format(ignore="") + f" SELECT {cols}, 'PENDING', "
                        f"{int(now)}, {int(now)} FROM lockgate_submit "
                        "ON CONFLICT (task_id) DO NOTHING")
            return int(cur.rowcount)

    def claim_lane(self, conn: Connection, *, pool: str, batch_id: str, limit: int,
                   lease_ms: int, token: str, worker_id: str) -> list[ClaimedTask]:
        sub = self._lane_select("id", " FOR UPDATE SKIP LOCKED")
        sql = self._claim_update_sql(f"id IN ({sub})") + f" RETURNING {_CLAIM_COLS}"
        return _claimed(conn.execute(text(sql), self._lane_params(
            pool, batch_id, limit, lease_ms, token, worker_id)).all())

    _migration_lock = ("SELECT 1 FROM (SELECT pg_advisory_lock(7193001)) AS held",
                       "SELECT pg_advisory_unlock(7193001)")


def _as_is(row: Row[Any]) -> Sequence[Any]:
    return row


def _json_array(row: Row[Any]) -> Sequence[Any]:
    values: list[Any] = orjson.loads(row[0])
    return values


class MySQLDialect(Dialect):
    """MySQL >= 8.0 and MariaDB >= 10.6: SELECT ... FOR UPDATE SKIP LOCKED, then UPDATE."""

    name = "mysql"
    # Sessions run with time_zone '+00:00' (set on connect), so this is exact UTC.
    now = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)"

    @contextmanager
    def long_read(self, conn: Connection) -> Iterator[None]:
        # Session settings (MySQL has no transaction-local ones): the server waits on a
        # reader that has not fetched (net_write_timeout) and, on MariaDB, on a
        # transaction left idle (idle_transaction_timeout); both as they were afterwards,
        # or the connection is dropped rather than pooled with the bounds lifted.
        names = ["net_write_timeout"]
        if getattr(conn.dialect, "is_mariadb", False):
            names.append("idle_transaction_timeout")
        saved = conn.exec_driver_sql(
            "SELECT " + ", ".join(f"@@session.{n}" for n in names)).one()
        conn.exec_driver_sql("SET SESSION " + ", ".join(
            f"{n} = {31_536_000 if n == 'net_write_timeout' else 0}" for n in names))
        try:
            yield
        finally:
            try:
                conn.exec_driver_sql("SET SESSION " + ", ".join(
                    f"{n} = {int(v)}" for n, v in zip(names, saved, strict=True)))
            except DBAPIError:
                conn.invalidate()

    def select_stream(self, columns: Sequence[ColumnElement[Any]]
                      ) -> tuple[Select[Any], Callable[[Row[Any]], Sequence[Any]]]:
        # Each row as one JSON array: PyMySQL decodes fields in pure Python, so one
        # field a row instead of one a column streams ~1.7x the rows per second.
        return select(func.json_array(*columns)), _json_array

    def claim(self, conn: Connection, *, limit: int, lease_ms: int, token: str,
              worker_id: str) -> list[ClaimedTask]:
        rows = conn.execute(text(
            f"SELECT {_CLAIM_COLS} FROM task WHERE status = 'PENDING' "
            f"AND visible_at <= {self.now} ORDER BY visible_at LIMIT :lim "
            f"FOR UPDATE SKIP LOCKED"), {"lim": limit}).all()
        if not rows:
            return []
        ids = [r[0] for r in rows]
        conn.execute(text(self._claim_update_sql("id IN :ids")).bindparams(
            in_list("ids")), {"tok": token, "worker": worker_id, "lease_ms": lease_ms,
                                 "ids": ids})
        return _leased(rows, token)

    #: JSON per statement: sent in hex (below), so each statement is twice this, far
    #: under the servers' default ``max_allowed_packet`` (16 MB).
    _JSON_BYTES = 1 << 20
    _FINISH_TYPES = tuple(_MY_TYPES[k] for k in _FINISH_KINDS)

    @classmethod
    def _json_table(cls, batch: bytes, types: Sequence[str]) -> tuple[str, tuple[str, ...]]:
        """A batch of rows (JSON arrays, one member per column) as a table, and the
        statement's parameters.

        The JSON goes in as a hex literal, not a bound parameter: PyMySQL escapes a
        string parameter character by character in Python (about 40 µs of the GIL per
        trace row), and a hex digit needs no escaping. Only a single row larger than a
        whole batch (a prompt snapshot of megabytes) goes as a parameter, at half the
        size of its hex on the wire: the server's ``max_allowed_packet`` (16 MB by
        default) bounds one statement. Rows are positional (``$[i]``): MariaDB looks
        members of an object up by name far more slowly. A JSON null reads as SQL NULL
        (MySQL since 8.0.21, MariaDB since 10.6)."""
        cols = ", ".join(f"c{i} {t} PATH '$[{i}]'" for i, t in enumerate(types))
        params: tuple[str, ...]
        if len(batch) <= cls._JSON_BYTES:
            source, params = f"CONVERT(X'{batch.hex()}' USING utf8mb4)", ()
        else:
            source, params = "%s", (batch.decode(),)
        return f"JSON_TABLE({source}, '$[*]' COLUMNS ({cols}))", params

    def finish(self, conn: Connection, rows: Sequence[Finish]) -> int:
        fields = ", ".join(f"c{i} AS {c}" for i, c in enumerate(_FINISH_COLS))
        set_clause = _FINISH_SET.format(now=self.now, t="t.")
        changed = 0
        with _driver_cursor(conn) as cur:
            for batch in _json_batches([_finish_values(f) for f in rows], self._JSON_BYTES):
                table, params = self._json_table(batch, self._FINISH_TYPES)
                cur.execute(f"UPDATE task AS t JOIN (SELECT {fields} FROM {table} AS j) AS v "
                            f"ON {_FINISH_FENCE} SET {set_clause}", params or None)
                changed += cur.rowcount
        return changed

    def insert_attempts(self, conn: Connection, attempts: Sequence[dict[str, Any]]) -> None:
        cols = sorted(set().union(*attempts))
        types = [_MY_TYPES[_ATTEMPT_KINDS[c]] for c in cols]
        picked = ", ".join(f"c{i}" for i in range(len(cols)))
        with _driver_cursor(conn) as cur:
            for batch in _json_batches([[a.get(c) for c in cols] for a in attempts],
                                       self._JSON_BYTES):
                table, params = self._json_table(batch, types)
                cur.execute(f"INSERT INTO task_attempt ({', '.join(cols)}) SELECT {picked} "
                            f"FROM {table} AS j", params or None)

    def insert_ignore(self, table: Table) -> Insert:
        return mysql.insert(table).prefix_with("IGNORE")

    _SUBMIT_TYPES = tuple(_MY_TYPES[k] for k in _SUBMIT_KINDS)

    def insert_tasks(self, conn: Connection, rows: Sequence[NewTaskValues], *,
                     now: int) -> int:
        picked = ", ".join(f"c{i}" for i in range(len(_SUBMIT_COLS)))
        n = 0
        with _driver_cursor(conn) as cur:
            for batch in _json_batches(rows, self._JSON_BYTES):
                table, params = self._json_table(batch, self._SUBMIT_TYPES)
                cur.execute(_SUBMIT_INTO.format(ignore="IGNORE ") + f" SELECT {picked}, "
                            f"'PENDING', {int(now)}, {int(now)} FROM {table} AS j",
                            params or None)
                n += cur.rowcount
        return n

    def claim_lane(self, conn: Connection, *, pool: str, batch_id: str, limit: int,
                   lease_ms: int, token: str, worker_id: str) -> list[ClaimedTask]:
        rows = conn.execute(text(self._lane_select(_CLAIM_COLS, " FOR UPDATE SKIP LOCKED")),
                            {"pool": pool, "batch": batch_id, "lim": limit}).all()
        if not rows:
            return []
        conn.execute(text(self._claim_update_sql("id IN :ids")).bindparams(
            in_list("ids")), {"tok": token, "worker": worker_id, "lease_ms": lease_ms,
                                 "ids": [r[0] for r in rows]})
        return _leased(rows, token)

    def max_input_bytes(self, conn: Connection, ceiling: int) -> int:
        # A trace row holds the input twice at most (prompt snapshot and answer), and a
        # string parameter may double when escaped: a quarter of a packet is safe.
        packet = int(conn.execute(text("SELECT @@max_allowed_packet")).scalar_one())
        return min(ceiling, packet // 4)

    _migration_lock = ("SELECT GET_LOCK('lockgate_migrate', :wait)",
                       "SELECT RELEASE_LOCK('lockgate_migrate')")


def dialect_for(name: str) -> Dialect:
    """The :class:`Dialect` for a SQLAlchemy dialect name."""
    if name == "sqlite":
        return SQLiteDialect()
    if name == "postgresql":
        return PostgresDialect()
    if name in ("mysql", "mariadb"):
        return MySQLDialect()
    raise ConfigError(f"unsupported database '{name}': use sqlite, postgresql or mysql/mariadb")
