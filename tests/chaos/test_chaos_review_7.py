"""Review 7 of the chaos suite: a SQLite database at rest on a full disk (SQLite says only
"disk I/O error" as it opens: it cannot create its -shm file), a worker stopped with one
SIGTERM while its database is down or hangs, an interrupted submit whose lines name their
own batch, and the listener's lost connection in the log."""

from __future__ import annotations

import contextlib
import logging
import re
import signal
import socket
import sqlite3
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from engine.support import (
    BackgroundWorker,
    WorkerPool,
    rows,
    scalar,
    status_counts,
    task,
    tasks,
    text_for,
    wait_for,
    write_jsonl,
)
from lockgate.errors import DatabaseUnavailable, SpecError, StoreError
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import TaskSpec, parse_task
from lockgate.store import Store, failures
from lockgate.store.arrivals import ArrivalListener

from .test_disk import Disk, assert_one_clear_line, cli, integrity
from .test_hung_server import HangingProxy

pytestmark = pytest.mark.chaos

SERVERS = ["postgresql", "mariadb"]


def _sqlite_error(message: str, url: str) -> StoreError:
    """The error lockgate makes of SQLite's ``message`` on the database at ``url``."""
    error = OperationalError("SELECT 1", {}, sqlite3.OperationalError(message))
    made = failures.translate(error, url)
    made.__cause__ = error  # as map_db_errors raises it
    return made


# -- SQLite: the words of a disk that is full or cannot be written ------------------------

@pytest.mark.parametrize(("message", "words"), [
    ("disk I/O error", ("disk is full", "permissions", "network file system", "df ")),
    ("database or disk is full", ("Free space on the disk", "goes on.")),
    ("database is locked", ("locked.",)),
    ("attempt to write a readonly database", ("make the file and its folder writable",)),
    ("no such table: task", ("no such table: task.",)),
    ("file is not a database", ("is not an SQLite database",)),
])
def test_a_sqlite_refusal_is_one_line_of_whole_sentences(
        message: str, words: tuple[str, ...], tmp_path: Path) -> None:
    """SQLite's "disk I/O error" came alone, and "... goes on" ran into the next
    sentence ("goes on Once it is fixed, run the same command again")."""
    text = str(_sqlite_error(message, f"sqlite:///{tmp_path / 'lg.db'}"))
    assert "\n" not in text and text.endswith("."), text
    for w in words:
        assert w in text, text
    assert f"{text} Once it is fixed".count(". Once") == 1


@given(st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=80))
def test_any_refusal_ends_as_a_sentence(message: str) -> None:
    text = str(_sqlite_error(message, "sqlite:////nowhere/lg.db"))
    assert text.endswith((".", "?")) and "\n" not in text


@pytest.mark.parametrize(("message", "waits"), [
    ("disk I/O error", True),
    ("database or disk is full", True),
    ("database is locked", True),
    ("attempt to write a readonly database", False),
    ("unable to open database file", False),
    ("no such table: task", False),
])
def test_a_worker_waits_at_start_only_for_sqlite_conditions_that_pass(
        message: str, waits: bool, tmp_path: Path) -> None:
    error = _sqlite_error(message, f"sqlite:///{tmp_path / 'lg.db'}")
    assert failures.sqlite_passing(error) is waits


def test_a_server_error_is_not_taken_for_a_sqlite_one() -> None:
    assert not failures.sqlite_passing(StoreError(
        "the database x refused the operation: disk I/O error", transient=True))
    assert not failures.sqlite_passing(DatabaseUnavailable(
        "cannot reach the database x: locked"))


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Disk]:
    d = Disk(tmp_path / "disk", "8m")
    try:
        yield d
    finally:
        d.close()


@pytest.mark.slow
def test_a_database_at_rest_on_a_full_disk_says_so_and_a_worker_waits_for_space(
        small_disk: Disk, tmp_path: Path, simulator: SimulatorProcess) -> None:
    """Every command said only "disk I/O error" (SQLite cannot create the -shm file on
    a full disk as it opens), and ``lockgate worker`` exited 2 at once."""
    path = small_disk.path / "lockgate.db"
    db = f"sqlite:///{path}"
    n = 40
    store = Store(db)
    try:
        store.migrate()
        store.submit([parse_task(t) for t in tasks(n)], batch_id="b")
    finally:
        store.close()  # the -wal and -shm files go with the last connection
    filler = small_disk.fill()
    line = assert_one_clear_line(cli(db, "status", cwd=tmp_path), "disk I/O error")
    assert re.search(r"The disk holding \S+lockgate\.db is full \([\d,]+ bytes free\)",
                     line), line
    assert "Free space" in line and line.endswith("goes on."), line

    (tmp_path / "w").mkdir()
    pool = WorkerPool(db, simulator.url, tmp_path / "w")
    try:
        worker = pool.start(concurrency=8, lease=30.0, log_level="WARNING")
        wait_for(lambda: "waiting for the database" in worker.log(),
                 "the worker to wait for space", timeout=60)
        assert worker.alive(), worker.log()
        waiting = [x for x in worker.log().splitlines() if "waiting for the database" in x]
        assert "is full" in waiting[0], waiting[0]
        filler.unlink()
        assert worker.wait(120) == 0, worker.log()
    finally:
        pool.close()
    assert "Traceback" not in worker.log(), worker.log()
    store = Store(db)
    try:
        assert status_counts(store) == {"SUCCEEDED": n}
    finally:
        store.close()
    assert integrity(path) == "ok"


@pytest.mark.slow
def test_a_submit_cut_off_by_a_full_disk_says_how_to_finish_in_sentences(
        tmp_path: Path) -> None:
    disk = Disk(tmp_path / "disk", "1m")
    try:
        db = f"sqlite:///{disk.path / 'lockgate.db'}"
        store = Store(db)
        try:
            store.migrate()
        finally:
            store.close()
        # 300 tasks of ~5 KB: more than the 1 MB disk holds.
        file = write_jsonl(tmp_path / "tasks.jsonl", [
            task(f"t-{i:05d}", text_for(i) + " " + "x" * 5000) for i in range(300)])
        line = assert_one_clear_line(cli(db, "submit", str(file), "--batch", "b",
                                         cwd=tmp_path), "disk is full")
        assert "goes on. Once it is fixed, run the same command again" in line, line
    finally:
        disk.close()


# -- one SIGTERM while the database is gone ---------------------------------------------

class CutProxy(HangingProxy):
    """A proxy that can also be cut: every connection closed and new ones refused, as a
    server that is down."""

    def cut(self) -> None:
        # Closing alone leaves the thread blocked in accept() holding the socket open:
        # the next connection would still be taken, and forwarded.
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.close()


@pytest.mark.slow
@pytest.mark.parametrize("outage", ["down", "hung"])
@pytest.mark.parametrize("backend", SERVERS, indirect=True)
def test_one_sigterm_stops_a_worker_whose_database_is_gone(
        store: Store, db_url: str, simulator: SimulatorProcess, tmp_path: Path,
        outage: str) -> None:
    """A worker stopped once while its database was down retried its write-backs every
    5 s for ever (only a second signal, or the server's return, ended it). It now gives
    the database a bounded time past the grace, saying so, then stops as at a second
    signal; its summary counts only results that landed, and the tasks whose results
    were lost run again, each succeeding once."""
    n = 300
    simulator.configure(latency={"kind": "fixed", "mean_ms": 1500})
    store.submit([parse_task(t) for t in tasks(n)], batch_id="gone")
    url = make_url(db_url)
    proxy = CutProxy(url.host or "127.0.0.1", int(url.port or 0))
    through = url.set(port=proxy.port).render_as_string(hide_password=False)
    pool = WorkerPool(through, simulator.url, tmp_path)
    try:
        w = pool.start(burst=False, concurrency=16, lease=5, grace=4, log_level="INFO")
        wait_for(lambda: status_counts(store).get("SUCCEEDED", 0) >= 16,
                 "the worker to finish some tasks", timeout=60)
        # Calls are in flight (1.5 s each): their results find the database gone.
        if outage == "down":
            proxy.cut()
        else:
            proxy.hang.set()  # connections open, nothing answers
        w.signal(signal.SIGTERM)
        assert w.wait(120) == 0, w.log()[-3000:]
    finally:
        proxy.hang.clear()
        proxy.close()
        pool.close()
    log = w.log()
    assert "wait for the database" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    summary = re.search(r"worker stopped: ([\d,]+) succeeded", log)
    assert summary, log[-3000:]
    landed = status_counts(store).get("SUCCEEDED", 0)
    assert int(summary.group(1).replace(",", "")) == landed < n

    # Nothing lost: once the leases expire a worker finishes every task, each once.
    (tmp_path / "after").mkdir()
    direct = WorkerPool(db_url, simulator.url, tmp_path / "after")
    simulator.configure(latency={"kind": "fixed", "mean_ms": 5})
    try:
        assert direct.start(burst=True, concurrency=64, lease=5).wait(180) == 0
    finally:
        direct.close()
    assert status_counts(store) == {"SUCCEEDED": n}
    won = Counter(r["task_id"] for r in rows(
        store, "SELECT t.task_id FROM task_attempt a JOIN task t ON t.id = a.task_pk "
               "WHERE a.outcome = 'succeeded'"))
    assert len(won) == n and set(won.values()) == {1}


@pytest.mark.slow
@pytest.mark.parametrize("backend", SERVERS, indirect=True)
def test_a_stopped_worker_counts_what_it_could_not_write_back(
        store: Store, db_url: str, simulator: SimulatorProcess) -> None:
    """The counters of a worker stopped while its database is down: ``succeeded`` only
    what landed, ``unwritten`` what it still held (to say how many results were lost)."""
    simulator.configure(latency={"kind": "fixed", "mean_ms": 1500})
    store.submit([parse_task(t) for t in tasks(200)], batch_id="gone")
    url = make_url(db_url)
    proxy = CutProxy(url.host or "127.0.0.1", int(url.port or 0))
    through = Store(url.set(port=proxy.port).render_as_string(hide_password=False))
    try:
        with BackgroundWorker(through, concurrency=16, lease_s=5, shutdown_grace_s=3) as bg:
            wait_for(lambda: status_counts(store).get("SUCCEEDED", 0) >= 16,
                     "the worker to finish some tasks", timeout=60)
            proxy.cut()
            bg.request_stop()
            stats = bg.stop(timeout=90)
    finally:
        proxy.close()
        through.close()
    assert stats.succeeded == status_counts(store).get("SUCCEEDED", 0)
    assert stats.unwritten >= 1
    assert stats.succeeded + stats.unwritten <= stats.claimed


# -- an interrupted submit whose lines name their own batch -----------------------------

def _stopped_after(specs: list[TaskSpec], n: int) -> Iterator[TaskSpec]:
    """``specs`` until ``n`` are given, then the error a bad line raises (the submit
    stops there, as one cut off would, its chunks before committed)."""
    yield from specs[:n]
    raise SpecError("stopped (test)")


def _batches(store: Store) -> dict[str, int]:
    return {r["id"]: int(r["complete"]) for r in rows(store, "SELECT id, complete FROM batch")}


def test_the_file_batch_of_an_interrupted_submit_is_not_kept_empty(
        store: Store, tmp_path: Path) -> None:
    """On MariaDB the batch named after the file stayed for good, empty and complete,
    once the submit was run again (``export`` of it: 0 tasks): the run again did not
    make it, so it did not drop it."""
    lines = [parse_task({**t, "batch_id": "sub"}) for t in tasks(20)]
    source = str(tmp_path / "big.jsonl")
    with pytest.raises(SpecError):
        store.submit(_stopped_after(lines, 5), batch_id="big", source=source)
    assert _batches(store) == {"big": 0, "sub": 0}
    report = store.submit(lines, batch_id="big", source=source)
    assert (report.inserted, report.duplicates) == (15, 5)
    assert _batches(store) == {"sub": 1}
    assert scalar(store, "SELECT COUNT(*) FROM batch_submit") == 0


def test_an_empty_batch_stays_while_another_submit_of_it_is_unfinished(
        store: Store, tmp_path: Path) -> None:
    """Two files submitted to one batch, their lines going elsewhere: the first cut off.
    The second, finished, must not drop the batch the first still writes to; the first
    run again drops it. A batch holding tasks is never dropped."""
    a, b = str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")
    shard_a = [parse_task({**t, "batch_id": "x"}) for t in tasks(20, prefix="a")]
    with pytest.raises(SpecError):
        store.submit(_stopped_after(shard_a, 5), batch_id="shared", source=a)
    store.submit([parse_task({**t, "batch_id": "y"}) for t in tasks(5, prefix="b")],
                 batch_id="shared", source=b)
    assert _batches(store) == {"shared": 0, "x": 0, "y": 1}
    store.submit(shard_a, batch_id="shared", source=a)
    assert _batches(store) == {"x": 1, "y": 1}
    # Every id already in: the batch named keeps its tasks, the lines' batch too.
    store.submit([parse_task(t) for t in tasks(3, prefix="c")], batch_id="z")
    store.submit([parse_task(t) for t in tasks(3, prefix="c")], batch_id="z")
    assert _batches(store) == {"x": 1, "y": 1, "z": 1}


# -- the listener's lost connection ------------------------------------------------------

@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_a_lost_listening_connection_is_logged_on_one_line(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    """libpq's words for a connection the server closed run over three lines
    ("... unexpectedly\\n\\tThis probably means ..."), and went to the log so."""
    heard = threading.Event()
    found = store.listen_for_tasks(heard.set)
    assert isinstance(found, ArrivalListener)
    try:
        wait_for(lambda: found.connections >= 1, "the listener to connect")
        with caplog.at_level(logging.WARNING, logger="lockgate.worker"):
            rows(store, "SELECT pg_terminate_backend(pid) AS k FROM pg_stat_activity "
                        "WHERE query LIKE 'LISTEN lockgate_tasks%' AND "
                        "datname = current_database()")
            wait_for(lambda: found.connections >= 2, "the listener to connect again",
                     timeout=30)
    finally:
        found.stop()
    said = [r.getMessage() for r in caplog.records
            if "listening for new tasks failed" in r.getMessage()]
    assert said and all("\n" not in m for m in said), said


def test_the_stop_summary_says_how_many_results_were_not_written_back(
        capsys: pytest.CaptureFixture[str]) -> None:
    # it counted them nowhere: "worker stopped: 68 succeeded" read as if all had landed
    from lockgate.cli.queue import _stopped
    from lockgate.worker.core import WorkerStats

    _stopped(WorkerStats(succeeded=4, unwritten=64))
    said = " ".join(capsys.readouterr().err.split())  # (the command's messages: stderr)
    assert "4 succeeded" in said and "64 not written back" in said
    _stopped(WorkerStats(succeeded=4))
    assert "not written back" not in capsys.readouterr().err
