"""Chaos review 13: an interrupted submit whose lines all name their own batch listed
the file's default batch (which none of them went to) as incomplete, and a session
the database server ended (PostgreSQL ``pg_terminate_backend``, MariaDB ``KILL``) was
reported as a server that cannot be reached, with a hint to check the URL. Each
interruption is a real one (the rows iterator raising ``KeyboardInterrupt`` after a
chunk committed, as Ctrl-C or a kill leaves a submit), each kill made by the real
server."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import Connection
from typer.testing import CliRunner, Result

import lockgate.app as app_module
from conftest import require_server
from lockgate.app import Lockgate
from lockgate.cli import app
from lockgate.errors import DatabaseUnavailable
from lockgate.flow.window import BatchPlan
from lockgate.store import Store
from lockgate.store.engine import database_url
from lockgate.store.failures import dropped_for_now, map_db_errors
from lockgate.store.store import NewTask

from .support import rows, task, tasks, write_jsonl

SERVERS = ["postgresql", "mariadb"]
#: The rows read before the submit is interrupted: two chunks of ten are handed over
#: (and committed), the five rows after them are not.
STOP_AT = 25
WRITTEN = 20


def lockgate(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def _small_chunks(monkeypatch: pytest.MonkeyPatch, lg: Lockgate) -> None:
    monkeypatch.setattr("lockgate.store.store.SUBMIT_FIRST_CHUNK_ROWS", 10)
    monkeypatch.setattr(lg.store.dialect, "submit_chunk_rows", 10)


def _interrupted_after(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """The rows a submit writes stop after ``n`` (as Ctrl-C stops it)."""
    into = app_module._into

    def stopping(rows: Iterable[NewTask], batch_id: str, named: bool) -> Iterator[NewTask]:
        for i, row in enumerate(into(rows, batch_id, named)):
            if i == n:
                raise KeyboardInterrupt
            yield row

    monkeypatch.setattr(app_module, "_into", stopping)


def _batches(store: Store) -> list[tuple[str, int]]:
    return sorted((str(r["id"]), int(r["complete"]))
                  for r in rows(store, "SELECT id, complete FROM batch"))


def _submits(store: Store) -> list[str]:
    return sorted(str(r["batch_id"]) for r in rows(store, "SELECT batch_id FROM batch_submit"))


def _submit(lg: Lockgate, how: str, path: Path, lines: list[dict[str, Any]],
            **kwargs: Any) -> Any:
    if how == "memory":
        return lg.submit(lines, **kwargs)
    return lg.submit_file(path, stream=how == "stream", **kwargs)


# -- 1. an interrupted submit lists only the batches its lines went to -----------------


@pytest.mark.parametrize("how", ["memory", "whole", "stream"])
def test_an_interrupted_submit_whose_lines_name_their_batch_leaves_no_default_batch(
        db_url: str, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        how: str) -> None:
    """Every line names ``d_cs``: the file's default batch (``t50``, its name) was made,
    incomplete, before any line was written; ``status`` told to run a submit of it
    again, though no task of the file belongs to it."""
    lines = [{**t, "batch_id": "d_cs"} for t in tasks(50)]
    path = write_jsonl(tmp_path / "t50.jsonl", lines)
    with Lockgate(db_url, migrate=False) as lg:
        _small_chunks(monkeypatch, lg)
        with monkeypatch.context() as m:
            _interrupted_after(m, STOP_AT)
            with pytest.raises(KeyboardInterrupt):
                _submit(lg, how, path, lines)
        assert _batches(store) == [("d_cs", 0)]
        assert _submits(store) == ["d_cs"]
        st = lg.status()
        assert st.incomplete_batches == ["d_cs"]
        assert list(st.unfinished_submits) == ["d_cs"]
        report = _submit(lg, how, path, lines)
        assert report.batches == ("d_cs",)
        assert report.inserted + report.duplicates == 50
        assert _batches(store) == [("d_cs", 1)] and _submits(store) == []
        assert lg.status().incomplete_batches == []
    out = lockgate("status", "--db", db_url).output
    assert "incomplete" not in out and "t50" not in out, out


def test_the_default_batch_opened_with_its_first_task_gets_the_plan(
        db_url: str, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines naming no batch after lines that name one: the file's batch is opened when
    the first of them is written, with the plan's weight and deadline, and incomplete
    till the submit ends."""
    lines = [{**t, "batch_id": "named"} if i < 12 else t
             for i, t in enumerate(tasks(40))]
    path = write_jsonl(tmp_path / "mix.jsonl", lines)
    plan = BatchPlan(base_weight=3.0, deadline_ms=4_102_444_800_000)
    with Lockgate(db_url, migrate=False) as lg:
        _small_chunks(monkeypatch, lg)
        with monkeypatch.context() as m:
            _interrupted_after(m, STOP_AT)
            with pytest.raises(KeyboardInterrupt):
                lg.submit_file(path, plan=plan, stream=True)
        assert _batches(store) == [("mix", 0), ("named", 0)]
        got = rows(store, "SELECT base_weight, deadline_at FROM batch WHERE id = 'mix'")
        assert (float(got[0]["base_weight"]), int(got[0]["deadline_at"])) == (
            3.0, 4_102_444_800_000)
        report = lg.submit_file(path, plan=plan, stream=True)
        assert (report.inserted, report.duplicates) == (40 - WRITTEN, WRITTEN)
        assert set(report.batches) == {"mix", "named"}
        assert _batches(store) == [("mix", 1), ("named", 1)] and _submits(store) == []
        for b in ("mix", "named"):
            got = rows(store, f"SELECT base_weight, deadline_at FROM batch WHERE id = '{b}'")
            assert (float(got[0]["base_weight"]), int(got[0]["deadline_at"])) == (
                3.0, 4_102_444_800_000)


@pytest.mark.parametrize("named", [False, True], ids=["default", "named"])
def test_a_submit_interrupted_before_its_first_chunk(
        db_url: str, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        named: bool) -> None:
    """A batch named by the caller (``--batch``) is marked incomplete at once; the
    file's default batch, only where lines naming none go, is made by the first of them
    written."""
    lines = tasks(30)
    path = write_jsonl(tmp_path / "early.jsonl", lines)
    with Lockgate(db_url, migrate=False) as lg:
        _small_chunks(monkeypatch, lg)
        with monkeypatch.context() as m:
            _interrupted_after(m, 5)
            with pytest.raises(KeyboardInterrupt):
                lg.submit_file(path, stream=True, batch_id="b" if named else None)
        assert _batches(store) == ([("b", 0)] if named else [])
        assert lg.status().incomplete_batches == (["b"] if named else [])


def test_a_streamed_submit_stopped_at_its_first_line_names_no_batch(
        db_url: str, store: Store, tmp_path: Path) -> None:
    """Without a batch named, a bad first line leaves no batch: the message does not
    say one is marked incomplete."""
    path = write_jsonl(tmp_path / "first.jsonl",
                       [task("t-bad", model={"temperature": 9}), *tasks(3)])
    result = lockgate("submit", path, "--stream", "--db", db_url)
    assert result.exit_code == 2, result.output
    err = " ".join(result.output.split())
    assert "line 1" in err and "marked incomplete" not in err, err
    assert "nothing was submitted" in err, err
    assert _batches(store) == []


# -- 2. a session the server ended is not "cannot reach" -------------------------------


def _admin(url: str) -> Engine:
    return create_engine(database_url(url), isolation_level="AUTOCOMMIT")


def _kill(admin: Engine, backend: str, session: int) -> None:
    with admin.connect() as a:
        a.execute(text(f"SELECT pg_terminate_backend({session})" if backend == "postgresql"
                       else f"KILL {session}"))


def _session(conn: Connection, backend: str) -> int:
    return int(conn.exec_driver_sql("SELECT pg_backend_pid()" if backend == "postgresql"
                                    else "SELECT CONNECTION_ID()").scalar_one())


@pytest.mark.parametrize("backend", SERVERS, indirect=True)
def test_a_session_the_server_ended_is_reported_as_closed(backend: str,
                                                         db_url: str) -> None:
    """PostgreSQL 57P01 "terminating connection due to administrator command", MariaDB
    2013 "Lost connection": reported as "cannot reach the database ... Is the server
    running, and is the URL right?". Still unavailable (workers retry it)."""
    require_server(backend)
    store = Store(db_url)
    admin = _admin(db_url)
    try:
        with store.engine.connect() as conn:
            session = _session(conn, backend)
            conn.commit()
            _kill(admin, backend, session)
            with pytest.raises(DatabaseUnavailable) as info, map_db_errors(db_url):
                conn.exec_driver_sql("SELECT 1")
        error = info.value
        message = str(error)
        assert message.startswith("the database server closed the session"), message
        assert "terminating connection" in message or "Lost connection" in message, message
        assert "Is the server running" not in message and "--db" not in message, message
        assert error.transient and dropped_for_now(error)
    finally:
        admin.dispose()
        store.close()


@pytest.mark.parametrize("backend", SERVERS, indirect=True)
def test_a_submit_whose_session_the_server_ended_says_so(
        backend: str, db_url: str, tmp_path: Path) -> None:
    """The submit's exit-2 error named the URL as a likely cause. The session is ended
    by the server as the submit writes its batch, and gone before the statement is
    sent."""
    require_server(backend)
    admin = _admin(db_url)
    name = db_url.rsplit("/", 1)[1].split("?")[0]
    killed: list[int] = []

    def before(conn: Connection, cursor: Any, statement: str, *args: Any) -> None:
        if killed or conn.engine is admin or conn.engine.url.database != name \
                or not statement.lstrip().upper().startswith("INSERT"):
            return
        dbapi = conn.connection.dbapi_connection
        assert dbapi is not None
        session = int(dbapi.info.backend_pid if backend == "postgresql"
                      else dbapi.thread_id())
        _kill(admin, backend, session)
        killed.append(session)
        _wait_gone(admin, backend, session)

    path = write_jsonl(tmp_path / "k.jsonl", tasks(3))
    event.listen(Engine, "before_cursor_execute", before)
    try:
        result = lockgate("submit", path, "--batch", "k", "--db", db_url)
    finally:
        event.remove(Engine, "before_cursor_execute", before)
        admin.dispose()
    assert killed
    assert result.exit_code == 2, result.output
    err = " ".join(result.output.split())
    assert "the database server closed the session" in err, err
    assert "Is the server running" not in err, err


def _wait_gone(admin: Engine, backend: str, session: int) -> None:
    """Until the server lists the session no more."""
    query = ("SELECT COUNT(*) FROM pg_stat_activity WHERE pid = :s"
             if backend == "postgresql"
             else "SELECT COUNT(*) FROM information_schema.processlist WHERE id = :s")
    with admin.connect() as a:
        while a.execute(text(query), {"s": session}).scalar_one():
            time.sleep(0.01)


def test_a_server_that_is_not_there_still_says_cannot_reach() -> None:
    with pytest.raises(DatabaseUnavailable) as info:
        Store("postgresql://app:secret@127.0.0.1:9/lockgate").ping()
    message = str(info.value)
    assert message.startswith("cannot reach the database postgresql://app:***@"), message
    assert "Is the server running" in message and not dropped_for_now(info.value)
    assert orjson.dumps(message)  # one plain line
