"""Results and exports read the task table alone, so no planner statistics can make
them quadratic.

Right after a bulk run the tables have no statistics yet, and a server-side cursor
favours a fast-start plan: a results query joined to ``task_attempt`` was planned on
PostgreSQL as a nested loop over a sequential scan of the attempts (minutes at 30k
tasks, hours at a million). The call that ended each task is on its row, so the stream
is one scan of ``task``; ``bench/export_throughput.py`` times it at a million rows.
"""

from __future__ import annotations

import time

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from lockgate.spec import parse_task
from lockgate.store import Store
from lockgate.store import engine as engine_module

from .support import statements, tasks


def test_results_read_one_table_and_postgres_plans_no_join(store: Store,
                                                           backend: str) -> None:
    store.migrate()
    store.submit([parse_task(t) for t in tasks(300)], batch_id="b")
    # attempts for every task, as a run leaves them, and no ANALYZE afterwards
    with store.engine.begin() as c:
        c.execute(text(
            "INSERT INTO task_attempt (task_pk, attempt, worker_id, lease_token, outcome, "
            "started_at) SELECT id, 1, 'w', 'tok', 'succeeded', created_at FROM task"))
        c.execute(text("UPDATE task SET status = 'SUCCEEDED', result = '{\"label\": 1}', "
                       "model = 'm', input_tokens = 3, output_tokens = 1"))
    seen = statements(store, lambda: list(store.results("b")))
    reads = [(s, p) for s, p in seen if "FROM task" in s and "result" in s]
    assert len(reads) == 1, seen
    statement, params = reads[0]
    assert "task_attempt" not in statement and "JOIN" not in statement.upper()
    if backend == "postgresql":
        with store.engine.connect() as c:
            plan = "\n".join(r[0] for r in c.exec_driver_sql("EXPLAIN " + statement,
                                                              params))
        assert "Join" not in plan and "Nested Loop" not in plan, plan
    rows = list(store.results("b"))
    assert len(rows) == 300 and rows[0].result == {"label": 1}
    assert rows[0].usage is not None and rows[0].usage.model == "m"


@pytest.mark.parametrize("n", [1, 7])
def test_results_stream_in_submission_order(store: Store, n: int) -> None:
    store.migrate()
    lines = tasks(n)
    store.submit([parse_task(t) for t in reversed(lines)], batch_id="order")
    got = [r.task_id for r in store.results("order")]
    assert got == [t["task_id"] for t in reversed(lines)]


def test_a_slow_reader_of_results_is_not_cut_off(db_url: str, backend: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # Server sessions end a transaction left idle past engine.IDLE_IN_TRANSACTION_S (a
    # frozen worker must not keep its row locks). A stream of results is a read that a
    # user's loop may hold open for as long as it likes between rows: it must not be cut
    # off, and the connection it gives back must be as it was.
    if backend == "sqlite":
        pytest.skip("SQLite has no server session to end")
    # The shortest bound each server takes (MariaDB counts whole seconds), and a pause of
    # a second more than it.
    bound = 0.5 if backend == "postgresql" else 1
    pause = bound + 1.0
    monkeypatch.setattr(engine_module, "IDLE_IN_TRANSACTION_S", bound)
    store = Store(db_url)
    try:
        store.submit([parse_task(t) for t in tasks(20)], batch_id="b")
        rows = store.results("b")
        first = next(rows)
        time.sleep(pause)  # the user's own work, longer than the bound
        rest = list(rows)
        assert [first.task_id] + [r.task_id for r in rest] == [
            t["task_id"] for t in tasks(20)]
        # the bound still holds for every other transaction on the pooled connections
        with store.engine.connect() as c:
            c.execute(text("SELECT COUNT(*) FROM task"))
            time.sleep(pause)
            with pytest.raises(DBAPIError):
                c.execute(text("SELECT COUNT(*) FROM task"))
                c.commit()
    finally:
        store.close()
