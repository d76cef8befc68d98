"""SQLite: one writer at a time, so a claim is a plain UPDATE ... RETURNING."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import orjson
from sqlalchemy import Connection, Table
from sqlalchemy.dialects import sqlite
from sqlalchemy.sql import Insert

from lockgate.store.dialects.base import (
    _FINISH_COLS,
    _FINISH_FENCE,
    _FINISH_SET,
    _SUBMIT_COLS,
    _SUBMIT_INTO,
    Dialect,
    NewTaskValues,
    _driver_cursor,
    _finish_values,
    _json_batches,
    _leased,
)
from lockgate.store.types import ClaimedTask, Finish


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
