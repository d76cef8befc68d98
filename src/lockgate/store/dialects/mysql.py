"""MySQL >= 8.0 and MariaDB >= 10.6: SELECT ... FOR UPDATE SKIP LOCKED, then UPDATE;
batches of values through JSON_TABLE."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import orjson
from sqlalchemy import ColumnElement, Connection, Row, Select, Table, func, select, text
from sqlalchemy.dialects import mysql
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.sql import Insert

from lockgate.store.dialects.base import (
    _ATTEMPT_KINDS,
    _CLAIM_COLS,
    _FINISH_COLS,
    _FINISH_FENCE,
    _FINISH_KINDS,
    _FINISH_SET,
    _MY_TYPES,
    _SUBMIT_COLS,
    _SUBMIT_INTO,
    _SUBMIT_KINDS,
    Dialect,
    NewTaskValues,
    _driver_cursor,
    _finish_values,
    _json_batches,
    _leased,
)
from lockgate.store.tx import in_list
from lockgate.store.types import ClaimedTask, Finish


def _text_literal(v: Any) -> str:
    return "NULL" if v is None else "X'" + str(v).encode().hex() + "'"


def _int_literal(v: Any) -> str:
    return "NULL" if v is None else str(int(v))


def _float_literal(v: Any) -> str:
    if v is None:
        return "NULL"
    f = float(v)
    return repr(f) if math.isfinite(f) else "NULL"  # as JSON has it: no NaN, no infinity


#: SQL literals of a column's values, by the column's Python type.
_LITERAL: dict[type, Callable[[Any], str]] = {
    str: _text_literal, int: _int_literal, float: _float_literal}


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
            # A connection lost during the read (killed, a network cut) is not set back:
            # trying would raise "Can't reconnect until invalid transaction is rolled
            # back" in place of the error that says the database was lost.
            if not conn.invalidated:
                try:
                    conn.exec_driver_sql("SET SESSION " + ", ".join(
                        f"{n} = {int(v)}" for n, v in zip(names, saved, strict=True)))
                except SQLAlchemyError:
                    with contextlib.suppress(SQLAlchemyError):
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

    #: Characters of the VALUES list of one attempt insert (hex doubles the texts: far
    #: under the servers' default ``max_allowed_packet`` of 16 MB).
    _VALUES_CHARS = 2 << 20

    def insert_attempts(self, conn: Connection, attempts: Sequence[dict[str, Any]]) -> None:
        """A VALUES list of literals, texts in hex (``X'...'``: nothing to escape, and
        the server parses it in a third of the time it takes JSON_TABLE to pick 25
        columns out of each row's JSON: 11 against 29 µs a row on MariaDB 10.11). A row
        too large for one statement goes through JSON_TABLE as a parameter, in turn."""
        cols = sorted(set().union(*attempts))
        literals = [_LITERAL[_ATTEMPT_KINDS[c]] for c in cols]
        head = f"INSERT INTO task_attempt ({', '.join(cols)}) VALUES "
        with _driver_cursor(conn) as cur:
            values: list[str] = []
            size = 0
            for a in attempts:
                row = "(" + ",".join([lit(a.get(c)) for c, lit in zip(cols, literals,
                                                                        strict=True)]) + ")"
                if values and (size + len(row) > self._VALUES_CHARS
                               or len(row) > self._VALUES_CHARS):
                    cur.execute(head + ",".join(values))  # no parameters: nothing to format
                    values, size = [], 0
                if len(row) > self._VALUES_CHARS:
                    self._insert_attempts_json(cur, cols, [a])
                    continue
                values.append(row)
                size += len(row) + 1
            if values:
                cur.execute(head + ",".join(values))

    def _insert_attempts_json(self, cur: Any, cols: list[str],
                              attempts: Sequence[dict[str, Any]]) -> None:
        types = [_MY_TYPES[_ATTEMPT_KINDS[c]] for c in cols]
        picked = ", ".join(f"c{i}" for i in range(len(cols)))
        for batch in _json_batches([[a.get(c) for c in cols] for a in attempts],
                                   self._JSON_BYTES):
            table, params = self._json_table(batch, types)
            cur.execute(f"INSERT INTO task_attempt ({', '.join(cols)}) SELECT {picked} "
                        f"FROM {table} AS j", params or None)

    def insert_ignore(self, table: Table) -> Insert:
        return mysql.insert(table).prefix_with("IGNORE")

    def upsert_suffix(self, keys: Sequence[str], columns: Sequence[str]) -> str:
        # VALUES(col): MariaDB has no row alias (``AS new``); MySQL 8 still takes it.
        # PyMySQL's executemany sends the rows as one multi-row statement.
        return " ON DUPLICATE KEY UPDATE " + ", ".join(f"{c} = VALUES({c})" for c in columns)

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
