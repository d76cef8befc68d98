"""A client cut off from the database (or frozen) in the middle of a transaction: the
server ends its session after ``IDLE_IN_TRANSACTION_S`` idle, so the task rows it locked
can be claimed by others. Found by the partition scenario: a worker cut off between a
claim's statements kept its row locks for as long as the server's TCP keepalive takes
to notice (two hours by default), and no other worker could take those tasks."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from engine.support import tasks, wait_for
from lockgate.spec import parse_task
from lockgate.store import Store
from lockgate.store import engine as store_engine

pytestmark = pytest.mark.chaos

IDLE_S = 2


@pytest.fixture(scope="module", params=("postgresql", "mariadb"))
def backend(request: pytest.FixtureRequest) -> str:
    """Server databases only: SQLite has no sessions to end."""
    return str(request.param)


@pytest.fixture
def frozen_store(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    monkeypatch.setattr(store_engine, "IDLE_IN_TRANSACTION_S", IDLE_S, raising=False)
    s = Store(db_url, pool_size=1)
    try:
        yield s
    finally:
        s.engine.dispose()


def test_row_locks_of_a_client_gone_quiet_mid_transaction_are_freed(
        store: Store, frozen_store: Store) -> None:
    store.submit([parse_task(t) for t in tasks(10)], batch_id="b")
    conn = frozen_store.engine.connect()
    try:
        conn.begin()
        locked = conn.execute(text("SELECT id FROM task FOR UPDATE")).all()
        assert len(locked) == 10
        # The client goes quiet here, its transaction open: the rows are locked.
        assert store.claim(10, lease_ms=30_000, worker_id="other") == []
        started = time.monotonic()
        claimed = wait_for(lambda: store.claim(10, lease_ms=30_000, worker_id="other"),
                           "the server to end the quiet session and free its row locks",
                           timeout=IDLE_S + 20)
        assert len(claimed) == 10
        assert time.monotonic() - started < IDLE_S + 15
        with pytest.raises(Exception):  # noqa: B017 - whatever the driver says: it is gone
            conn.execute(text("SELECT 1"))
    finally:
        conn.invalidate()  # closes the socket: the server rolls back if it has not yet
        conn.close()
