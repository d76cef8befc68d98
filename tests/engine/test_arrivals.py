"""Idle workers claim new tasks at once instead of at their next poll (up to
``poll_max_s``): on PostgreSQL a submit announces its tasks (``NOTIFY`` at commit) and
the workers listen; on MySQL/MariaDB and SQLite an idle worker looks at the newest task
id every 100 ms."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

import pytest

from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store
from lockgate.store.arrivals import ArrivalListener

from .support import BackgroundWorker, rows, status_counts, tasks, wait_for

#: The tests of the listener itself: only PostgreSQL announces tasks.
ON_POSTGRESQL = pytest.mark.parametrize("backend", ["postgresql"], indirect=True)


@pytest.fixture
def listener(store: Store) -> Iterator[tuple[ArrivalListener, threading.Event]]:
    heard = threading.Event()
    found = store.listen_for_tasks(heard.set)
    assert found is not None
    try:
        wait_for(lambda: found.connections >= 1, "the listener to connect")
        heard.clear()  # the wake-up for tasks that came while it was not listening
        yield found, heard
    finally:
        found.stop()


@ON_POSTGRESQL
def test_a_committed_submit_is_heard(store: Store, listener: tuple[ArrivalListener,
                                                                   threading.Event]) -> None:
    found, heard = listener
    store.submit([parse_task(t) for t in tasks(3)], batch_id="b")
    wait_for(heard.is_set, "word of the submitted tasks")
    assert found.received >= 1


@ON_POSTGRESQL
def test_the_listener_listens_again_after_losing_its_connection(
        store: Store, listener: tuple[ArrivalListener, threading.Event]) -> None:
    found, heard = listener
    killed = rows(store, "SELECT pg_terminate_backend(pid) AS k FROM pg_stat_activity "
                         "WHERE query LIKE 'LISTEN lockgate_tasks%' AND "
                         "datname = current_database()")
    assert killed and all(r["k"] for r in killed)
    wait_for(lambda: found.connections >= 2, "the listener to connect again", timeout=30)
    heard.clear()
    store.submit([parse_task(t) for t in tasks(2, prefix="after")], batch_id="b")
    wait_for(heard.is_set, "word of tasks submitted after the reconnection")


@ON_POSTGRESQL
def test_a_lost_listening_connection_is_one_warning_not_a_pool_traceback(
        store: Store, listener: tuple[ArrivalListener, threading.Event],
        caplog: pytest.LogCaptureFixture) -> None:
    """The dead connection is not handed back to the pool to be reset: the pool's
    failed rollback logged an ERROR with two chained tracebacks on every database
    restart, beside lockgate's own one-line warning."""
    found, _heard = listener
    with caplog.at_level(logging.WARNING):
        rows(store, "SELECT pg_terminate_backend(pid) AS k FROM pg_stat_activity "
                    "WHERE query LIKE 'LISTEN lockgate_tasks%' AND "
                    "datname = current_database()")
        wait_for(lambda: found.connections >= 2, "the listener to connect again",
                 timeout=30)
    mine = [r for r in caplog.records if r.name.startswith(("lockgate", "sqlalchemy"))]
    assert [(r.name, r.levelname) for r in mine] == [("lockgate.worker", "WARNING")], \
        [(r.name, r.levelname, r.getMessage()[:80]) for r in mine]
    assert mine[0].exc_info is None
    assert "listening for new tasks failed" in mine[0].getMessage()


def test_an_idle_worker_claims_announced_tasks_before_its_next_poll(
        store: Store, simulator: SimulatorProcess) -> None:
    """The worker's idle sleeps double from 10 ms: 5.5 s after its first empty claim it
    sleeps until about 10.2 s. A task submitted at 5.5 s is done well before that only
    if the submit's word woke it."""
    with BackgroundWorker(store, poll_max_s=600, concurrency=4) as bg:
        wait_for(lambda: rows(store, "SELECT id FROM worker"), "the worker to start")
        if store.dialect.announces_tasks:
            wait_for(lambda: bg.worker._listener is not None
                     and bg.worker._listener.connections >= 1, "the worker to listen")
        started = time.monotonic()
        time.sleep(5.5)
        store.submit([parse_task(t) for t in tasks(1, prefix="late")], batch_id="late")
        wait_for(lambda: status_counts(store) == {"SUCCEEDED": 1},
                 "the idle worker to take the task", timeout=10.2 - 5.5 - 0.7)
        assert time.monotonic() - started < 10.0
        if store.dialect.announces_tasks:
            heard = bg.worker._listener
            assert heard is not None and heard.received >= 1
        else:
            assert bg.worker._listener is None
        bg.stop()
    wait_for(lambda: not any(t.name == "lockgate-arrivals" and t.is_alive()
                             for t in threading.enumerate()),
             "the listening thread to end after the worker", timeout=10)
