"""A database that drops its sessions: a write-back whose session is killed
(``pg_terminate_backend``, MariaDB ``KILL``) while the server answers again at once, and
a worker started while the server drops every session it takes (a fast shutdown, a
restart, an administrator's kill). Each drop is made by the real database server; the
tests count the drops and stop them by what they see, never after a time."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError

from conftest import MARIADB_URL, PG_URL, require_server
from lockgate.errors import DatabaseUnavailable
from lockgate.spec import parse_task
from lockgate.states import TaskStatus
from lockgate.store import Finish, Store
from lockgate.store.engine import database_url
from lockgate.worker.writeback import ISOLATE_AFTER, Landed, WriteBack

from .support import lockgate_cmd, rows, tasks

SERVERS = ["postgresql", "mariadb"]


def _admin(url: str) -> Engine:
    return create_engine(database_url(url), isolation_level="AUTOCOMMIT")


class Dropping(Store):
    """A store whose write-back session is killed by the server, from another session,
    as its transaction begins, whenever ``drop(rows)`` says so for the rows written."""

    def __init__(self, url: str, backend: str) -> None:
        super().__init__(url)
        self.backend = backend
        self.admin = _admin(url)
        self.drop: Any = lambda batch: False
        self.dropped = 0
        self._kill_next = False

        @event.listens_for(self.engine, "begin")
        def begin(conn: Any) -> None:
            if self._kill_next:
                self._kill_next = False
                self._kill(conn)

    def _kill(self, conn: Any) -> None:
        with self.admin.connect() as a:
            if self.backend == "postgresql":
                pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
                # waits until the session has ended
                a.execute(text("SELECT pg_terminate_backend(:pid, 10000)"), {"pid": pid})
            else:
                pid = conn.exec_driver_sql("SELECT CONNECTION_ID()").scalar()
                a.execute(text(f"KILL {int(pid)}"))
        self.dropped += 1

    def finish(self, rows: Any, *args: Any, **kwargs: Any) -> Any:
        self._kill_next = bool(self.drop(rows))
        try:
            return super().finish(rows, *args, **kwargs)
        finally:
            self._kill_next = False

    def close(self) -> None:
        self.admin.dispose()
        super().close()


async def _direct(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


def _result(c: Any, n: int) -> Finish:
    value = orjson.dumps({"label": "yes"}).decode()
    return Finish(id=c.id, lease_token=c.lease_token, status=TaskStatus.SUCCEEDED,
                  result=value, parse_status="valid",
                  attempt={"attempt": c.attempt, "outcome": "succeeded", "started_at": 1,
                           "raw_output": value, "model": "sim-small", "input_tokens": 12,
                           "output_tokens": 3, "http_status": 200},
                  model="sim-small", input_tokens=12, output_tokens=3, latency_ms=100.0,
                  http_status=200, request_id=f"req-{n}", response='{"id": "x"}')


def _hand_back(c: Any) -> Finish:
    return Finish(id=c.id, lease_token=c.lease_token, status=TaskStatus.PENDING,
                  error_class="released_at_shutdown",
                  error_message="released: worker shut down before calling",
                  release_attempt=True)


def _claimed(store: Store, n: int) -> list[Any]:
    store.submit([parse_task(t) for t in tasks(n)], batch_id="b")
    return sorted(store.claim(n, lease_ms=600_000, worker_id="w"), key=lambda c: c.id)


def _write_until_landed(wb: WriteBack, batch: list[Finish],
                        fresh: list[Finish] | None = None) -> list[Landed]:
    fresh = list(fresh or [])
    done = []
    for _ in range(12 * ISOLATE_AFTER):
        landed = asyncio.run(wb.write(batch))
        done.append(landed)
        batch = list(landed.unwritten)
        if landed.progressed():  # a new result joins once others have landed
            batch += fresh[:1]
            fresh = fresh[1:]
        if not batch:
            return done
    raise AssertionError(f"still unwritten: {batch}")


@pytest.mark.parametrize("backend", SERVERS, indirect=True)
def test_a_write_back_whose_session_is_killed_lands_whole(db_url: str,
                                                            backend: str) -> None:
    """A session dropped under the write-back while the server answers a fresh one was
    taken for a refused row once the batch was isolated: the result written with a bare
    trace (model, usage, request id and response gone, attempt storage_error), and a
    task given back uncalled written FAILED storage_error."""
    store = Dropping(db_url, backend)
    try:
        done_c, back_c = _claimed(store, 2)
        done, back = _result(done_c, 1), _hand_back(back_c)
        calls = {"n": 0}
        # three whole batches, the fourth (isolated), each row alone once, the result
        # alone again (the hand-back landed in between)
        kills = {1, 2, 3, 4, 5, 7}

        def drop(batch: Any) -> bool:
            calls["n"] += 1
            return calls["n"] in kills
        store.drop = drop
        wb = WriteBack(store, "w", db=_direct)
        landed = _write_until_landed(wb, [done, back])
        assert store.dropped == len(kills)
        assert not any(ld.replaced or ld.dropped for ld in landed)
        got = {r["id"]: r for r in rows(
            store, "SELECT id, status, result, model, input_tokens, request_id, response, "
                   "error_class, attempts FROM task")}
        assert got[done_c.id]["status"] == "SUCCEEDED"
        assert (got[done_c.id]["model"], got[done_c.id]["input_tokens"],
                got[done_c.id]["request_id"], got[done_c.id]["response"]) == (
            "sim-small", 12, "req-1", '{"id": "x"}')
        assert orjson.loads(got[done_c.id]["result"]) == {"label": "yes"}
        assert (got[back_c.id]["status"], got[back_c.id]["error_class"]) == (
            "PENDING", "released_at_shutdown")
        assert got[back_c.id]["attempts"] == 0  # given back uncalled: no attempt spent
        traces = rows(store, "SELECT task_pk, outcome, error_class, model FROM task_attempt")
        assert traces == [{"task_pk": done_c.id, "outcome": "succeeded",
                           "error_class": None, "model": "sim-small"}]
    finally:
        store.close()


@pytest.mark.parametrize("backend", SERVERS, indirect=True)
def test_a_row_whose_write_always_drops_the_session_is_refused_after_strikes(
        db_url: str, backend: str) -> None:
    """A row whose full write drops the session every time (as one larger than
    ``max_allowed_packet`` does) is put aside while the others land, and taken as
    refused only after ISOLATE_AFTER such failures: then written with a bare trace."""
    store = Dropping(db_url, backend)
    try:
        claims = _claimed(store, 2 + ISOLATE_AFTER)
        results = [_result(c, i) for i, c in enumerate(claims)]
        big = results[0]
        store.drop = lambda batch: any(f.id == big.id and f.response is not None
                                       for f in batch)
        wb = WriteBack(store, "w", db=_direct)
        landed = _write_until_landed(wb, results[:2], results[2:])
        aside = [ld for ld in landed if ld.progressed()
                 and [f.id for f in ld.unwritten] == [big.id]]
        assert len(aside) == ISOLATE_AFTER - 1
        assert [list(ld.replaced) for ld in landed if ld.replaced] == [
            [(big.id, big.lease_token)]]
        got = {r["id"]: r for r in rows(store, "SELECT id, status, model FROM task")}
        assert all(r["status"] == "SUCCEEDED" for r in got.values())
        assert got[big.id]["model"] is None
        assert all(got[c.id]["model"] == "sim-small" for c in claims[1:])
        trace = [r for r in rows(store, "SELECT task_pk, error_class FROM task_attempt")
                 if r["task_pk"] == big.id]
        assert trace == [{"task_pk": big.id, "error_class": "storage_error"}]
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_a_task_given_back_without_a_trace_is_never_failed(db_url: str) -> None:
    """A hand-back the database refuses (here a trigger refuses the task's release)
    was written FAILED storage_error: a task never called ended for good. It is given
    up instead: its lease stays, and the task runs again when it expires."""
    store = Store(db_url)
    admin = create_engine(database_url(db_url))
    name = f"refuse_{secrets.token_hex(3)}"
    try:
        done_c, back_c = _claimed(store, 2)
        with admin.begin() as c:
            c.execute(text(
                f"CREATE FUNCTION {name}() RETURNS trigger AS $$ BEGIN "
                f"IF NEW.id = {int(back_c.id)} AND NEW.status = 'PENDING' THEN "
                "RAISE EXCEPTION 'this release is refused'; END IF; RETURN NEW; END "
                "$$ LANGUAGE plpgsql"))
            c.execute(text(f"CREATE TRIGGER {name} BEFORE UPDATE ON task FOR EACH ROW "
                           f"EXECUTE FUNCTION {name}()"))
        wb = WriteBack(store, "w", db=_direct)
        landed = asyncio.run(wb.write([_result(done_c, 1), _hand_back(back_c)]))
        assert landed.unwritten == [] and not landed.replaced
        assert landed.dropped == {(back_c.id, back_c.lease_token)}
        with admin.begin() as c:
            c.execute(text(f"DROP TRIGGER {name} ON task"))
            c.execute(text(f"DROP FUNCTION {name}()"))
        got = {r["id"]: r for r in rows(
            store, "SELECT id, status, lease_token, error_class FROM task")}
        assert got[done_c.id]["status"] == "SUCCEEDED"
        assert (got[back_c.id]["status"], got[back_c.id]["lease_token"],
                got[back_c.id]["error_class"]) == ("PENDING", back_c.lease_token, None)
    finally:
        admin.dispose()
        store.close()


# -- a worker started while the server drops its sessions -----------------------------

def _own_database(backend: str) -> tuple[str, str, Engine]:
    """A new, initialised database of its own (name, URL, admin engine)."""
    name = f"lockgate_t_{secrets.token_hex(4)}"
    base = (PG_URL if backend == "postgresql" else MARIADB_URL).split("?")[0]
    admin = _admin(base)
    with admin.connect() as c:
        c.execute(text(f"CREATE DATABASE {name}"))
    url = f"{base.rsplit('/', 1)[0]}/{name}"
    subprocess.run(lockgate_cmd("init", "--db", url), check=True, capture_output=True,
                   timeout=120)
    return name, url, admin


def _kill_sessions(admin: Engine, backend: str, name: str) -> int:
    with admin.connect() as c:
        if backend == "postgresql":
            return len(c.execute(text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = :n AND pid <> pg_backend_pid()"), {"n": name}).fetchall())
        ids = c.execute(text(
            "SELECT id FROM information_schema.processlist WHERE db = :n "
            "AND id <> CONNECTION_ID()"), {"n": name}).scalars().all()
        for i in ids:
            try:
                c.execute(text(f"KILL {int(i)}"))
            except DBAPIError:  # the session ended by itself meanwhile
                continue
        return len(ids)


@pytest.mark.parametrize("backend", SERVERS, indirect=True)
def test_a_worker_started_while_sessions_are_dropped_waits(backend: str,
                                                          tmp_path: Path) -> None:
    """A worker starting while the server dropped every session it took (57P01
    "terminating connection due to administrator command", MariaDB 2013 "Lost
    connection") exited with code 2, "cannot reach the database"."""
    require_server(backend)
    name, url, admin = _own_database(backend)
    log_path = tmp_path / "worker.log"
    stop = threading.Event()
    killed = {"n": 0}

    def killer() -> None:
        while not stop.is_set():
            killed["n"] += _kill_sessions(admin, backend, name)
            time.sleep(0.002)

    try:
        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        with log_path.open("w") as log:
            worker = subprocess.Popen(lockgate_cmd("worker", "--burst", "--db", url),
                                      stdout=log, stderr=subprocess.STDOUT)
        try:
            for _ in range(1200):  # until the worker says it waits (or it ended)
                if "waiting for the database" in log_path.read_text() or \
                        worker.poll() is not None:
                    break
                time.sleep(0.05)
            stop.set()
            thread.join()
            rc = worker.wait(timeout=120)
        finally:
            stop.set()
            if worker.poll() is None:
                worker.kill()
        out = log_path.read_text()
        assert killed["n"] > 0
        assert rc == 0, out
        assert "waiting for the database" in out, out
        assert "terminating connection" in out or "Lost connection" in out or \
            "server closed the connection" in out or "gone away" in out, out
        assert "worker stopped: 0 succeeded" in out, out
    finally:
        stop.set()
        with admin.connect() as c:
            if backend == "postgresql":
                c.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            else:
                c.execute(text(f"DROP DATABASE IF EXISTS {name}"))
        admin.dispose()


def test_a_lost_session_is_told_apart_from_a_server_not_there() -> None:
    """Only a session the server took and dropped is waited for at a worker's start."""
    from lockgate.store.failures import dropped_for_now
    assert dropped_for_now(DatabaseUnavailable(
        "cannot reach the database x: terminating connection due to administrator "
        "command"))
    assert dropped_for_now(DatabaseUnavailable(
        "cannot reach the database x: (2013, 'Lost connection to MySQL server during "
        "query')"))
    assert not dropped_for_now(DatabaseUnavailable(
        "cannot reach the database x: (2003, \"Can't connect to MySQL server on "
        "'127.0.0.1' ([Errno 111] Connection refused)\")"))
    assert not dropped_for_now(DatabaseUnavailable(
        "cannot reach the database x: (2013, 'Lost connection to MySQL server during "
        "query (timed out)')"))
