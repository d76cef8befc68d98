"""A bulk submit leaves the planner statistics its claims need.

Without statistics (a freshly loaded table: autovacuum's ANALYZE comes a minute or more
later), PostgreSQL took a claim's PENDING rows for a handful: it read every one of them
and sorted them by ``visible_at`` for each claim of 256 (4 ms at 10,000 pending, and
growing with the table), instead of walking ``ix_task_claim`` to the claim's LIMIT. A
submit refreshes the statistics as it grows the table, a logarithmic number of times.
The claimed ids are then found by primary key (``id = ANY(ARRAY(...))``): written as
``id IN (...)`` the update was planned as a semi-join over a sequential scan of the
whole table whenever that was costed below 256 index probes.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from lockgate.spec import parse_task
from lockgate.store import Store
from lockgate.store import store as store_module

from .support import statements, tasks


def _claim_plan(store: Store) -> str:
    """Claim 256 tasks, and return the plan of the statement that did it."""
    ran = statements(store, lambda: store.claim(256, lease_ms=60_000, worker_id="w"))
    statement, params = [(s, p) for s, p in ran if "lease_token" in s
                         and s.lstrip().startswith("UPDATE task SET")][-1]
    with store.engine.connect() as c:
        return "\n".join(r[0] for r in c.exec_driver_sql("EXPLAIN " + statement, params))


def _analyzes(store: Store, fn: Any) -> list[str]:
    return [s for s, _p in statements(store, fn) if s.lstrip().upper().startswith("ANALYZE")]


def test_claims_walk_the_claim_index_right_after_a_bulk_submit(fresh_db_url: str,
                                                               backend: str) -> None:
    if backend != "postgresql":
        pytest.skip("MySQL/MariaDB and SQLite keep or need no statistics of their own here")
    store = Store(fresh_db_url)  # a new database: no statistics from earlier tests
    try:
        store.migrate()
        store.submit([parse_task(t) for t in tasks(10_000)], batch_id="b")
        with store.engine.connect() as c:
            counted = c.exec_driver_sql(
                "SELECT reltuples FROM pg_class WHERE oid = 'task'::regclass").scalar()
            columns = {r[0] for r in c.exec_driver_sql(
                "SELECT attname FROM pg_stats WHERE tablename = 'task'")}
        assert counted == 10_000
        assert {"status", "visible_at", "id", "pool", "batch_id"} <= columns, columns
        plans = []
        for _ in range(3):  # the plan of the first claim, and of those after it
            plans.append(_claim_plan(store))
    finally:
        store.close()
    for plan in plans:
        # the claim index walked to the LIMIT, the claimed rows found by primary key
        assert "Index Scan using ix_task_claim" in plan and "Bitmap" not in plan, plan
        assert "Index Scan using task_pkey" in plan and "Seq Scan" not in plan, plan



def test_a_submit_refreshes_statistics_a_logarithmic_number_of_times(
        fresh_db_url: str, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store = Store(fresh_db_url)  # never analysed (a wiped table keeps its old count)
    try:
        store.migrate()
        _submit_in_small_chunks(store, monkeypatch, backend)
    finally:
        store.close()


def _submit_in_small_chunks(store: Store, monkeypatch: pytest.MonkeyPatch,
                            backend: str) -> None:
    monkeypatch.setattr(store.dialect, "submit_chunk_rows", 1_000)
    n = 24_000
    specs = [parse_task(t) for t in tasks(n)]
    ran = _analyzes(store, lambda: store.submit(specs, batch_id="b"))
    if backend != "postgresql":
        assert ran == []
        return
    # a refresh whenever the rows added reach half those last counted (at least 1,000):
    # at 1k, 2k, 3k, 5k, 8k, 12k, 18k and 27k (not reached) rows
    assert 2 <= len(ran) <= 2 + math.log(n / store_module._StatisticsKeeper.MIN_ROWS, 1.5)
    with store.engine.connect() as c:
        counted = c.exec_driver_sql(
            "SELECT reltuples FROM pg_class WHERE oid = 'task'::regclass").scalar()
    assert n / 1.5 <= counted <= n  # what is left uncounted is under half
    # a second submit of the same ids inserts nothing and refreshes nothing
    assert _analyzes(store, lambda: store.submit(specs, batch_id="b")) == []


def test_a_refresh_that_fails_is_logged_and_the_submit_goes_on(
        fresh_db_url: str, backend: str, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    if backend != "postgresql":
        pytest.skip("only PostgreSQL's submits refresh statistics")
    store = Store(fresh_db_url)  # never analysed: the first chunk asks for a refresh
    store.migrate()
    monkeypatch.setattr(store.dialect, "submit_chunk_rows", 1_000)
    tried: list[int] = []

    def refuse(conn: Any) -> None:
        tried.append(1)
        conn.exec_driver_sql("ANALYZE no_such_table")  # as a server that refuses would

    monkeypatch.setattr(store.dialect, "refresh_task_statistics", refuse)
    report = store.submit([parse_task(t) for t in tasks(5_000)], batch_id="b")
    assert report.inserted == 5_000 and len(tried) == 1  # tried once, then left alone
    assert "could not refresh the task table's statistics" in caplog.text
    with store.engine.connect() as c:
        assert c.exec_driver_sql("SELECT COUNT(*) FROM task").scalar() == 5_000
    store.close()


def test_a_small_submit_asks_the_database_nothing_about_statistics(store: Store) -> None:
    ran = statements(store, lambda: store.submit([parse_task(t) for t in tasks(20)],
                                                 batch_id="small"))
    assert not [s for s, _p in ran if "pg_class" in s or "ANALYZE" in s.upper()], ran
