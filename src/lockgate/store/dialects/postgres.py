"""PostgreSQL: one-statement claims with FOR UPDATE SKIP LOCKED, COPY for submits."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Table, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql import Insert

from lockgate.store.arrivals import CHANNEL as ARRIVALS
from lockgate.store.dialects.base import (
    _ATTEMPT_KINDS,
    _CLAIM_COLS,
    _FINISH_COLS,
    _FINISH_FENCE,
    _FINISH_KINDS,
    _FINISH_SET,
    _PG_TYPES,
    _SUBMIT_COLS,
    _SUBMIT_INTO,
    _SUBMIT_KINDS,
    Dialect,
    NewTaskValues,
    _claimed,
    _driver_cursor,
    _finish_values,
    _json_batches,
)
from lockgate.store.types import ClaimedTask, Finish

#: The SQLSTATE of a duplicate key.
_UNIQUE_VIOLATION = "23505"


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
        # id = ANY(ARRAY(...)): the locked ids are gathered once, then found by primary
        # key. ``id IN (...)`` was planned as a semi-join over a sequential scan of the
        # whole table whenever the planner costed that below 256 index probes (5.3 ms a
        # claim at 10,000 rows, against 2.9).
        sql = self._claim_update_sql(
            f"id = ANY(ARRAY(SELECT id FROM task WHERE status = 'PENDING' AND visible_at <= "
            f"{self.now} ORDER BY visible_at LIMIT :lim FOR UPDATE SKIP LOCKED))"
        ) + f" RETURNING {_CLAIM_COLS}"
        rows = conn.execute(text(sql), {"tok": token, "worker": worker_id,
                                        "lease_ms": lease_ms, "lim": limit}).all()
        return _claimed(rows)

    #: Rows per JSON parameter are bounded only to bound the memory of one statement.
    _JSON_BYTES = 32 << 20

    def finish(self, conn: Connection, rows: Sequence[Finish]) -> int:
        # jsonb, not json: each element is parsed once, where json's ->> parsed the
        # element's text again for every one of the 16 columns (a 256-row write-back's
        # join took 6.3 ms, now 2.6).
        values = ", ".join(f"(e->>{i})::{_PG_TYPES[k]} AS {c}" for i, (c, k) in
                           enumerate(zip(_FINISH_COLS, _FINISH_KINDS, strict=True)))
        sql = (f"UPDATE task AS t SET {_FINISH_SET.format(now=self.now, t='')} "
               f"FROM (SELECT {values} FROM jsonb_array_elements(%s::jsonb) AS e) AS v "
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
    announces_tasks = True

    def announce_tasks(self, conn: Connection) -> None:
        conn.exec_driver_sql(f"NOTIFY {ARRIVALS}")  # delivered at commit, once per channel

    # Without statistics, or with statistics from when the table was a tenth of its
    # size, the planner takes a claim's PENDING rows for a handful: it reads every one
    # of them and sorts them (4 ms a claim at 10,000 pending, growing with the table)
    # instead of walking ix_task_claim to its LIMIT, and autovacuum's ANALYZE comes a
    # minute or more after a bulk load. A submit refreshes them as it grows the table.

    refreshes_statistics = True

    def task_rows_estimate(self, conn: Connection) -> int:
        n = conn.exec_driver_sql(
            "SELECT reltuples FROM pg_class WHERE oid = 'task'::regclass").scalar()
        return max(0, int(n or 0))  # -1: never analysed

    def refresh_task_statistics(self, conn: Connection) -> None:
        # SKIP_LOCKED: never wait behind autovacuum or another submit's ANALYZE. Only the
        # columns the claim, lane and write-back plans read, from a sample of 3,000 rows
        # (statistics target 10, this transaction only): the planner needs the table's
        # size and a rough shape of status and visible_at, which autovacuum refines
        # later; 11 ms at 1,000,000 rows, against 140-175 ms at the default target.
        conn.exec_driver_sql("SET LOCAL default_statistics_target = 10")
        conn.exec_driver_sql(
            "ANALYZE (SKIP_LOCKED) task (id, status, visible_at, pool, batch_id)")

    #: The session's staging table of a submit: COPY cannot skip existing keys, so rows
    #: are copied here, then moved by one INSERT ... ON CONFLICT DO NOTHING.
    _STAGE = ("CREATE TEMP TABLE IF NOT EXISTS lockgate_submit ("
              + ", ".join(f"{c} {_PG_TYPES[k]}" for c, k in zip(_SUBMIT_COLS, _SUBMIT_KINDS,
                                                               strict=True))
              + ", status text, created_at bigint, updated_at bigint) ON COMMIT DELETE ROWS")

    def insert_tasks(self, conn: Connection, rows: Sequence[NewTaskValues], *,
                     now: int) -> int:
        cols = ", ".join(_SUBMIT_COLS)
        data = _copy_text(rows, now)
        with _driver_cursor(conn) as cur:
            # Straight into the table: one COPY, no staging. A task id that exists already
            # stops it at that row (a submit run again): then the chunk goes the way that
            # skips existing ids.
            cur.execute("SAVEPOINT lockgate_copy")
            try:
                with cur.copy(f"COPY task ({cols}, status, created_at, updated_at) "
                              "FROM STDIN") as copy:
                    copy.write(data)
            except conn.dialect.loaded_dbapi.IntegrityError as exc:
                if getattr(exc, "sqlstate", None) != _UNIQUE_VIOLATION:
                    raise
                cur.execute("ROLLBACK TO SAVEPOINT lockgate_copy")
            else:
                cur.execute("RELEASE SAVEPOINT lockgate_copy")
                return len(rows)
            cur.execute("SET LOCAL client_min_messages = warning")  # no "already exists"
            cur.execute(self._STAGE)
            with cur.copy(f"COPY lockgate_submit ({cols}, status, created_at, updated_at) "
                          "FROM STDIN") as copy:
                copy.write(data)
            cur.execute(_SUBMIT_INTO.format(ignore="") + f" SELECT {cols}, status, "
                        "created_at, updated_at FROM lockgate_submit "
                        "ON CONFLICT (task_id) DO NOTHING")
            return int(cur.rowcount)

    def claim_lane(self, conn: Connection, *, pool: str, batch_id: str, limit: int,
                   lease_ms: int, token: str, worker_id: str) -> list[ClaimedTask]:
        sub = self._lane_select("id", " FOR UPDATE SKIP LOCKED")
        sql = self._claim_update_sql(f"id = ANY(ARRAY({sub}))") + f" RETURNING {_CLAIM_COLS}"
        return _claimed(conn.execute(text(sql), self._lane_params(
            pool, batch_id, limit, lease_ms, token, worker_id)).all())

    _migration_lock = ("SELECT 1 FROM (SELECT pg_advisory_lock(7193001)) AS held",
                       "SELECT pg_advisory_unlock(7193001)")


def _copy_field(v: str) -> str:
    """A text value as COPY's text format writes it."""
    if "\\" in v:
        v = v.replace("\\", "\\\\")
    if "\t" in v or "\n" in v or "\r" in v:
        v = v.replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return v


def _copy_text(rows: Sequence[NewTaskValues], now: int) -> bytes:
    """Rows (``_SUBMIT_COLS`` in order), then status, created_at and updated_at, as the
    data of one ``COPY ... FROM STDIN`` in the text format, built in one piece."""
    tail = f"\tPENDING\t{int(now)}\t{int(now)}\n"
    f, null = _copy_field, "\\N"
    return "".join([
        f"{f(tid)}\t{f(batch)}\t{f(cfg)}\t{f(data)}\t"
        f"{null if meta is None else f(meta)}\t{prio:d}\t{vis:d}\t{f(pool)}{tail}"
        for tid, batch, cfg, data, meta, prio, vis, pool in rows]).encode()
