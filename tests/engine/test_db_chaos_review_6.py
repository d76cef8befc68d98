"""A worker under passing database conditions that answer: a statement cancelled by
``statement_timeout`` (PostgreSQL) or ``KILL QUERY`` (MariaDB) while another session
holds the task rows' locks, a database that is read-only for a while (a failover); a
registration whose COMMIT landed but whose answer was lost; a server that refuses
connections when a worker starts. Each condition is produced by the real database
server; the tests watch its errors (SQLAlchemy events) to end it after a few of them,
never after a time."""

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

from conftest import PG_URL, require_server
from lockgate.config import Settings, WorkerSettings
from lockgate.errors import ConfigError, DatabaseUnavailable, StoreError
from lockgate.providers.base import Completion, CompletionRequest
from lockgate.simulator.responder import Responder
from lockgate.spec import parse_task
from lockgate.store import Finish, Store
from lockgate.store.engine import database_url
from lockgate.worker import Worker, WorkerStats
from lockgate.worker.writeback import ISOLATE_AFTER, WriteBack

from .support import expected_label, lockgate_cmd, rows, status_counts, tasks, text_for

N = 6
#: How many failed statements of the condition the tests let pass before they end it:
#: more than ISOLATE_AFTER, so that the write-back also bisects under it.
FAILURES = 2 * ISOLATE_AFTER + 2


def _run(worker: Worker, timeout: float = 60.0) -> WorkerStats:
    async def main() -> WorkerStats:
        return await asyncio.wait_for(worker.run(), timeout)
    return asyncio.run(main())


def _settings(**worker: Any) -> Settings:
    return Settings(worker=WorkerSettings(**{"concurrency": 16, **worker}))


class Answers:
    """The simulator's answers in process; counts the calls, and runs ``before_first``
    (from a thread, the loop going on) at the first one."""

    name = "default"

    def __init__(self, before_first: Any = None) -> None:
        self.responder = Responder()
        self.calls = 0
        self.before_first = before_first

    async def complete(self, request: CompletionRequest) -> Completion:
        self.calls += 1
        if self.calls == 1 and self.before_first is not None:
            await asyncio.to_thread(self.before_first)
        ans = self.responder.answer(request.messages)
        return Completion(content=ans.content, http_status=200, model=request.model,
                          prompt_tokens=ans.prompt_tokens,
                          completion_tokens=ans.completion_tokens)

    async def close(self) -> None:
        return None


class Watched(Store):
    """A store that counts its write-backs that failed with one of ``codes`` (a
    PostgreSQL SQLSTATE or a MySQL error number) and sets ``passed`` after
    :data:`FAILURES` of them."""

    def __init__(self, url: str, codes: set[Any]) -> None:
        super().__init__(url)
        self.codes = codes
        self.seen = 0
        self.passed = threading.Event()

    def finish(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().finish(*args, **kwargs)
        except StoreError as exc:
            orig = getattr(exc.__cause__, "orig", exc.__cause__)
            args = getattr(orig, "args", None) or (None,)
            code = args[0] if isinstance(args[0], int) else getattr(orig, "sqlstate", None)
            if code in self.codes:
                self.seen += 1
                if self.seen >= FAILURES:
                    self.passed.set()
            raise


def _all_succeeded_once(store: Store, answers: Answers, stats: WorkerStats) -> None:
    assert status_counts(store) == {"SUCCEEDED": N}
    assert answers.calls == N and stats.succeeded == N
    for r in rows(store, "SELECT t.task_id, t.result, t.attempts FROM task t"):
        n = int(r["task_id"].split("-")[1])
        assert orjson.loads(r["result"]) == {"label": expected_label(text_for(n))}
        assert r["attempts"] == 1
    traces = rows(store, "SELECT outcome, error_class, raw_output FROM task_attempt")
    assert len(traces) == N
    assert all(t["outcome"] == "succeeded" and t["error_class"] is None
               and t["raw_output"] is not None for t in traces), traces


def _locker(url: str) -> Engine:
    return create_engine(database_url(url), pool_size=1)


# -- F1: passing conditions during a write-back ---------------------------------------------

@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_a_statement_timeout_on_locked_rows_keeps_the_results(db_url: str) -> None:
    """statement_timeout (SQLSTATE 57014) while another session holds the task rows'
    locks was taken for a refused row: bisected, written FAILED storage_error, or given
    up and the provider called again."""
    store = Watched(db_url + "%20-cstatement_timeout%3D200", {"57014"})
    passed = store.passed
    locker = _locker(db_url)
    conn = locker.connect()
    try:
        store.submit([parse_task(t) for t in tasks(N)], batch_id="b")

        def lock_then_release() -> None:
            conn.execute(text("SELECT id FROM task FOR UPDATE")).fetchall()

            def release() -> None:
                passed.wait(30)
                conn.commit()
            threading.Thread(target=release, daemon=True).start()

        answers = Answers(lock_then_release)
        stats = _run(Worker(store, _settings(), burst=True, providers={"default": answers}),
                     timeout=40)
        assert passed.is_set()
        _all_succeeded_once(store, answers, stats)
    finally:
        conn.close()
        locker.dispose()
        store.close()


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_a_database_read_only_for_a_while_keeps_the_results(db_url: str) -> None:
    """A database made read-only (a failover to a standby, default_transaction_read_only;
    SQLSTATE 25006) dropped every result in flight, and the provider was called again."""
    store = Watched(db_url, {"25006"})
    passed = store.passed
    read_only = threading.Event()

    @event.listens_for(store.engine, "begin")
    def begin(conn: Any) -> None:
        if read_only.is_set():
            conn.exec_driver_sql("SET TRANSACTION READ ONLY")

    try:
        store.submit([parse_task(t) for t in tasks(N)], batch_id="b")

        def read_only_for_a_while() -> None:
            read_only.set()

            def writable() -> None:
                passed.wait(30)
                read_only.clear()
            threading.Thread(target=writable, daemon=True).start()

        answers = Answers(read_only_for_a_while)
        stats = _run(Worker(store, _settings(), burst=True, providers={"default": answers}),
                     timeout=40)
        assert passed.is_set()
        _all_succeeded_once(store, answers, stats)
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["mariadb"], indirect=True)
def test_a_write_back_killed_while_it_waits_for_a_lock_keeps_the_results(
        db_url: str) -> None:
    """KILL QUERY of a write-back waiting for the task rows' locks (MariaDB error 1317)
    was taken for a refused row: written FAILED storage_error or given up."""
    store = Watched(db_url, {1317})
    passed = store.passed
    locker = _locker(db_url)
    conn = locker.connect()
    admin = _locker(db_url)
    stop = threading.Event()
    try:
        store.submit([parse_task(t) for t in tasks(N)], batch_id="b")
        me = conn.execute(text("SELECT CONNECTION_ID()")).scalar()
        conn.commit()

        def killer() -> None:
            with admin.connect() as a:
                while not stop.is_set() and not passed.is_set():
                    for (pid,) in a.execute(text(
                            "SELECT id FROM information_schema.processlist WHERE db = "
                            "DATABASE() AND id <> CONNECTION_ID() AND id <> :me AND "
                            "info LIKE '%FROM task%FOR UPDATE%' AND time_ms > 50"),
                            {"me": me}).fetchall():
                        a.execute(text(f"KILL QUERY {int(pid)}"))
                    a.commit()
                    time.sleep(0.02)
                conn.commit()  # the locks go with enough kills seen

        def lock_rows() -> None:
            conn.execute(text("SELECT id FROM task FOR UPDATE")).fetchall()
            threading.Thread(target=killer, daemon=True).start()

        answers = Answers(lock_rows)
        stats = _run(Worker(store, _settings(), burst=True, providers={"default": answers}),
                     timeout=40)
        assert passed.is_set()
        _all_succeeded_once(store, answers, stats)
    finally:
        stop.set()
        conn.close()
        locker.dispose()
        admin.dispose()
        store.close()


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_a_row_that_times_out_every_time_does_not_hold_the_others_for_ever(
        db_url: str) -> None:
    """A passing condition that is one row's own (here: its row locked by another
    session for good) must not make every write-back wait for it: the others land, and
    after ISOLATE_AFTER failures alone the row is given up (its task runs again when its
    lease expires), not retried for ever."""
    store = Store(db_url + "%20-cstatement_timeout%3D100")
    locker = _locker(db_url)
    conn = locker.connect()
    try:
        store.submit([parse_task(t) for t in tasks(8)], batch_id="b")
        claims = sorted(store.claim(8, lease_ms=60_000, worker_id="w"), key=lambda c: c.id)
        value = orjson.dumps({"label": "no"}).decode()
        done = [Finish(id=c.id, lease_token=c.lease_token, status="SUCCEEDED", result=value,
                       parse_status="valid",
                       attempt={"attempt": c.attempt, "outcome": "succeeded",
                                "started_at": 1, "raw_output": value}) for c in claims]
        conn.execute(text("SELECT id FROM task WHERE id = :id FOR UPDATE"),
                     {"id": claims[0].id}).fetchall()

        async def db(fn: Any, *args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        wb = WriteBack(store, "w", db=db)
        batch, fresh, dropped = done[:2], done[2:], set()
        for _ in range(4 * ISOLATE_AFTER):
            landed = asyncio.run(wb.write(batch))
            dropped |= landed.dropped
            batch = landed.unwritten + fresh[:1]
            fresh = fresh[1:]
            if not batch:
                break
        assert batch == [] and dropped == {(claims[0].id, claims[0].lease_token)}
        conn.commit()
        got = {r["id"]: r for r in rows(store, "SELECT id, status, lease_token FROM task")}
        assert (got[claims[0].id]["status"], got[claims[0].id]["lease_token"]) == (
            "PENDING", claims[0].lease_token)
        assert all(got[c.id]["status"] == "SUCCEEDED" for c in claims[1:])
    finally:
        conn.close()
        locker.dispose()
        store.close()


# -- F2: registration -------------------------------------------------------------------

def test_registering_twice_with_the_same_id_succeeds(store: Store) -> None:
    first = store.register_worker("w-1", hostname="h", pid=42, concurrency=4)
    again = store.register_worker("w-1", hostname="h", pid=42, concurrency=4)
    assert again >= first
    got = rows(store, "SELECT id, hostname, pid, status FROM worker")
    assert got == [{"id": "w-1", "hostname": "h", "pid": 42, "status": "running"}]
    # a worker that stopped leaves its id to be taken again; a live other one does not
    store.heartbeat("w-1", status="stopped")
    store.register_worker("w-1", hostname="h2", pid=7, concurrency=4)
    assert rows(store, "SELECT pid, status, stopped_at FROM worker") == [
        {"pid": 7, "status": "running", "stopped_at": None}]
    with pytest.raises(ConfigError, match="already registered by another worker"):
        store.register_worker("w-1", hostname="h", pid=42, concurrency=4)


class RegistrationAckLost(Store):
    """A store whose first worker registration commits, then loses the connection before
    the worker hears of it."""

    lost = 1

    def register_worker(self, worker_id: str, **kwargs: Any) -> int:
        now = super().register_worker(worker_id, **kwargs)
        if self.lost:
            self.lost -= 1
            raise DatabaseUnavailable("connection lost during COMMIT (injected)")
        return now


def test_a_registration_whose_answer_was_lost_does_not_stop_the_worker(
        db_url: str) -> None:
    store = RegistrationAckLost(db_url)
    try:
        store.submit([parse_task(t) for t in tasks(3)], batch_id="b")
        answers = Answers()
        stats = _run(Worker(store, _settings(), burst=True, providers={"default": answers}),
                     timeout=20)
        assert store.lost == 0 and stats.succeeded == 3 and answers.calls == 3
        assert rows(store, "SELECT status FROM worker") == [{"status": "stopped"}]
    finally:
        store.close()


def test_a_permanent_registration_error_ends_the_worker_with_a_clear_error(
        store: Store, backend: str) -> None:
    store.register_worker("taken", hostname="elsewhere", pid=1, concurrency=1)
    with pytest.raises(ConfigError, match="'taken' is already registered by another"):
        _run(Worker(store, _settings(), burst=True, worker_id="taken",
                    providers={"default": Answers()}), timeout=20)
    if backend == "sqlite":
        return  # SQLite stores a value longer than its column
    # a value the column cannot hold: the same every time, no retry helps
    with pytest.raises(StoreError, match="registering the worker failed, and trying again "
                                         "cannot help"):
        _run(Worker(store, _settings(), burst=True, worker_id="w" * 100,
                    providers={"default": Answers()}), timeout=20)


# -- F3: a worker started while the server refuses connections ----------------------------

def _admin(url: str) -> Engine:
    return create_engine(database_url(url), isolation_level="AUTOCOMMIT")


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_a_worker_started_while_connections_are_refused_waits_for_them(
        backend: str, tmp_path: Path) -> None:
    require_server(backend)
    name = f"lockgate_t_{secrets.token_hex(4)}"
    base = PG_URL.split("?")[0]
    admin = _admin(base)
    with admin.connect() as c:
        c.execute(text(f"CREATE ROLE {name} LOGIN"))
        c.execute(text(f"CREATE DATABASE {name} OWNER {name} CONNECTION LIMIT 0"))
    url = f"{base.split('://')[0]}://{name}@{base.split('@', 1)[1].rsplit('/', 1)[0]}/{name}"
    log_path = tmp_path / "worker.log"
    try:
        # one-shot commands still fail at once, saying why
        status = subprocess.run(lockgate_cmd("status", "--db", url), capture_output=True,
                                text=True, timeout=60)
        assert status.returncode == 2 and "too many connections" in status.stdout + \
            status.stderr
        # a login refused is no passing condition: the worker fails at once
        wrong = url.replace(f"{name}@", f"{name}_nobody@")
        bad = subprocess.run(lockgate_cmd("worker", "--burst", "--db", wrong),
                             capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and "does not exist" in bad.stdout + bad.stderr
        with log_path.open("w") as log:
            worker = subprocess.Popen(lockgate_cmd("worker", "--burst", "--db", url),
                                      stdout=log, stderr=subprocess.STDOUT)
        try:
            for _ in range(600):  # the worker says it waits, then the limit is lifted
                if "waiting for the database" in log_path.read_text() or \
                        worker.poll() is not None:
                    break
                time.sleep(0.05)
            with admin.connect() as c:
                c.execute(text(f"ALTER DATABASE {name} CONNECTION LIMIT -1"))
            rc = worker.wait(timeout=60)
        finally:
            if worker.poll() is None:
                worker.kill()
        out = log_path.read_text()
        assert rc == 0, out
        assert "waiting for the database" in out and "too many connections" in out, out
        assert "worker stopped: 0 succeeded" in out, out
    finally:
        with admin.connect() as c:
            c.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            c.execute(text(f"DROP ROLE IF EXISTS {name}"))
        admin.dispose()
