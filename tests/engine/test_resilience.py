"""A worker under database trouble: rows the database refuses, errors between a claim and
the calls, acknowledgements lost after a commit, clocks that disagree, and results that
pile up while the database is slow. Each test injects the fault into a real database
session (a :class:`Store` subclass that fails on cue) or a provider, never a stand-in
for the store."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import orjson
import pytest
from sqlalchemy import event, text

from lockgate.config import Settings, WorkerSettings
from lockgate.errors import DatabaseUnavailable
from lockgate.providers.base import Completion, CompletionRequest
from lockgate.providers.openai import OpenAICompatible, token_count
from lockgate.simulator.responder import Responder
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import ClaimedTask, Finish, FinishReport, Store
from lockgate.store.store import AttemptObserver
from lockgate.worker import Worker, WorkerStats
from lockgate.worker.writeback import WriteBack

from .support import expected_label, rows, scalar, status_counts, task, tasks, text_for


def _run(worker: Worker, timeout: float = 60.0) -> WorkerStats:
    async def main() -> WorkerStats:
        return await asyncio.wait_for(worker.run(), timeout)
    return asyncio.run(main())


class Answers:
    """The simulator's deterministic answers in process; inputs that contain ``poison``
    come back with a usage figure no integer column holds (a provider that breaks its
    own contract)."""

    name = "default"

    def __init__(self) -> None:
        self.responder = Responder()
        self.calls = 0

    async def complete(self, request: CompletionRequest) -> Completion:
        self.calls += 1
        ans = self.responder.answer(request.messages)
        poisoned = "poison" in request.messages[-1]["content"]
        return Completion(content=ans.content, http_status=200, model=request.model,
                          prompt_tokens=10**30 if poisoned else ans.prompt_tokens,
                          completion_tokens=ans.completion_tokens)

    async def close(self) -> None:
        return None


def settings(**worker: Any) -> Settings:
    return Settings(worker=WorkerSettings(**{"concurrency": 16, **worker}))


# -- rows the database refuses --------------------------------------------------------------

def _finish(c: ClaimedTask, **trace: Any) -> Finish:
    value = orjson.dumps({"label": "no"}).decode()
    return Finish(id=c.id, lease_token=c.lease_token, status="SUCCEEDED", result=value,
                  parse_status="valid",
                  attempt={"attempt": c.attempt, "outcome": "succeeded", "started_at": 1,
                           "raw_output": value, **trace})


def test_rows_the_database_refuses_are_isolated_and_the_rest_lands(store: Store) -> None:
    store.submit([parse_task(t) for t in tasks(8)], batch_id="b")
    claims = sorted(store.claim(8, lease_ms=60_000, worker_id="w"), key=lambda c: c.id)
    batch = [_finish(c) for c in claims]
    batch[2] = _finish(claims[2], input_tokens=10**30)  # the trace cannot be stored
    batch[5].result = 10**30  # type: ignore[assignment]  # nor can the task's result
    batch[6] = _finish(claims[6], attempt=None)  # nor any form of it (attempt NOT NULL)

    async def db(fn: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    landed = asyncio.run(WriteBack(store, "w", db=db).write(batch))
    claim = [(c.id, c.lease_token) for c in claims]
    assert landed.unwritten == []
    assert landed.applied == {claim[i] for i in (0, 1, 2, 3, 4, 5, 7)}
    assert set(landed.replaced) == {claim[2], claim[5]} and landed.dropped == {claim[6]}
    got = {r["id"]: r for r in rows(store, "SELECT t.id, t.status, t.error_class, "
                                          "t.lease_token, a.error_class AS trace_error, "
                                          "a.raw_output FROM task t LEFT JOIN task_attempt a "
                                          "ON a.task_pk = t.id")}
    for i in (0, 1, 3, 4, 7):
        assert got[claims[i].id]["status"] == "SUCCEEDED"
        assert got[claims[i].id]["raw_output"] is not None  # the full trace
    kept = got[claims[2].id]  # the answer is kept; the trace is bare and says why
    assert (kept["status"], kept["trace_error"], kept["raw_output"]) == (
        "SUCCEEDED", "storage_error", None)
    failed = got[claims[5].id]
    assert (failed["status"], failed["error_class"]) == ("FAILED", "storage_error")
    dropped = got[claims[6].id]  # untouched: it runs again when its lease expires
    assert (dropped["status"], dropped["lease_token"]) == ("PENDING", claims[6].lease_token)


def test_an_answer_the_database_refuses_does_not_wedge_the_worker(store: Store) -> None:
    """A provider's usage figure that no integer column holds once made every write-back
    of its batch fail, retried forever while the worker renewed the batch's leases."""
    specs = [parse_task(task(f"t-{i:02d}", ("poison " if i % 10 == 3 else "") + text_for(i)))
             for i in range(40)]
    store.submit(specs, batch_id="b")
    stats = _run(Worker(store, settings(flush_rows=16), burst=True,
                        providers={"default": Answers()}))
    assert status_counts(store) == {"SUCCEEDED": 40}
    assert stats.succeeded == 40
    bare = rows(store, "SELECT t.task_id, a.error_class, a.input_tokens FROM task t "
                       "JOIN task_attempt a ON a.task_pk = t.id WHERE a.error_class IS NOT NULL")
    assert sorted(r["task_id"] for r in bare) == ["t-03", "t-13", "t-23", "t-33"]
    assert {(r["error_class"], r["input_tokens"]) for r in bare} == {("storage_error", None)}


def test_usage_figures_a_provider_gets_wrong_are_not_taken_as_counts() -> None:
    assert [token_count(v) for v in (12, 12.0, 0, 2**31 - 1)] == [12, 12, 0, 2**31 - 1]
    assert [token_count(v) for v in (12.5, -1, 2**31, 10**30, "12", None, True, [3])] \
        == [None] * 8
    answer = OpenAICompatible._completion(
        {"choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}],
         "usage": {"prompt_tokens": 1e30, "completion_tokens": "7"}, "model": ["x"]},
        200, {}, "m")
    assert (answer.prompt_tokens, answer.completion_tokens, answer.model) == (None, None, "m")


# -- database errors around the hot path ----------------------------------------------------

class Flaky(Store):
    """A store whose named operations fail ``times`` times with a lost connection."""

    def __init__(self, url: str, **times: int) -> None:
        super().__init__(url)
        self.times = dict(times)
        self.failed: dict[str, int] = {}

    def _trip(self, name: str) -> None:
        if self.times.get(name, 0) > 0:
            self.times[name] -= 1
            self.failed[name] = self.failed.get(name, 0) + 1
            raise DatabaseUnavailable(f"{name}: connection lost (injected)")

    def configs(self, hashes: Any) -> dict[str, dict[str, Any]]:
        self._trip("configs")
        return super().configs(hashes)

    def queue_state(self, pool: str | None = None) -> tuple[bool, int | None, int]:
        self._trip("queue_state")
        return super().queue_state(pool)

    def register_worker(self, worker_id: str, **kwargs: Any) -> int:
        self._trip("register_worker")
        return super().register_worker(worker_id, **kwargs)


def test_database_errors_between_claim_and_call_do_not_stop_the_worker(
        db_url: str, simulator: SimulatorProcess) -> None:
    flaky = Flaky(db_url, configs=2, queue_state=2, register_worker=1)
    try:
        flaky.submit([parse_task(t) for t in tasks(30)], batch_id="b")
        stats = _run(Worker(flaky, settings(), burst=True))
        assert flaky.failed == {"configs": 2, "queue_state": 2, "register_worker": 1}
        assert stats.succeeded == 30
        assert status_counts(flaky) == {"SUCCEEDED": 30}
        for r in rows(flaky, "SELECT t.task_id, t.result, t.attempts FROM task t"):
            n = int(r["task_id"].split("-")[1])
            assert orjson.loads(r["result"]) == {"label": expected_label(text_for(n))}
            assert r["attempts"] == 1
    finally:
        flaky.close()


class LostAck(Store):
    """A store whose first write-back commits, then loses the connection before the
    worker hears of it."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.lost = 1

    def finish(self, rows: Sequence[Finish], *, worker_id: str,
               observe: AttemptObserver | None = None) -> FinishReport:
        report = super().finish(rows, worker_id=worker_id, observe=observe)
        if self.lost:
            self.lost -= 1
            raise DatabaseUnavailable("connection lost after COMMIT (injected)")
        return report


def test_a_write_back_whose_acknowledgement_was_lost_is_not_a_lost_lease(
        db_url: str, simulator: SimulatorProcess) -> None:
    store = LostAck(db_url)
    try:
        store.submit([parse_task(t) for t in tasks(20)], batch_id="b")
        stats = _run(Worker(store, settings(), burst=True))
        assert store.lost == 0
        assert (stats.succeeded, stats.discarded) == (20, 0)
        assert rows(store, "SELECT outcome, COUNT(*) AS n FROM task_attempt "
                           "GROUP BY outcome") == [{"outcome": "succeeded", "n": 20}]
    finally:
        store.close()


class Slow(Store):
    """A store whose write-backs take ``delay_s`` each (a database under load)."""

    def __init__(self, url: str, delay_s: float) -> None:
        super().__init__(url)
        self.delay_s = delay_s

    def finish(self, rows: Sequence[Finish], *, worker_id: str,
               observe: AttemptObserver | None = None) -> FinishReport:
        time.sleep(self.delay_s)
        return super().finish(rows, worker_id=worker_id, observe=observe)


def test_results_waiting_for_a_slow_write_back_hold_claiming_back(
        db_url: str, simulator: SimulatorProcess) -> None:
    """Back-pressure: results that wait for their write-back still hold leases, so a
    worker holds at most ``concurrency + prefetch + flush_rows`` tasks however slow the
    database, and claims again as flushes free room."""
    store = Slow(db_url, delay_s=0.15)
    try:
        store.submit([parse_task(t) for t in tasks(300)], batch_id="b")
        worker = Worker(store, settings(concurrency=8, claim_batch=8, flush_rows=8,
                                        prefetch=2, flush_interval_s=0.01), burst=True)
        most = 0
        start = worker._start

        async def counting(claimed: list[ClaimedTask], asked: float) -> None:
            nonlocal most
            await start(claimed, asked)
            most = max(most, len(worker._held))

        worker._start = counting  # type: ignore[method-assign]
        stats = _run(worker, timeout=120)
        assert (stats.claimed, stats.succeeded) == (300, 300)
        assert 8 < most <= 8 + 2 + 8, most  # results piled up, within the bound
    finally:
        store.close()


# -- clocks ---------------------------------------------------------------------------------

def test_attempts_are_stamped_on_the_database_clock(
        store: Store, simulator: SimulatorProcess) -> None:
    """A worker whose clock is two hours fast stamps its attempts on the database's
    clock, which retention and failure rates compare them with."""
    store.submit([parse_task(t) for t in tasks(5)], batch_id="b")
    fast = Worker(store, settings(), burst=True, wall_clock=lambda: time.time() + 7200)
    _run(fast)
    now = store.db_now()
    started = [int(r["started_at"]) for r in rows(store, "SELECT started_at FROM task_attempt")]
    assert len(started) == 5
    assert all(abs(now - s) < 60_000 for s in started), (now, started)
    deleted = store.cleanup(older_than_ms=0)
    assert deleted["attempts"] == 5
    assert scalar(store, "SELECT COUNT(*) FROM task_attempt") == 0


def test_a_negative_retention_age_is_refused(store: Store) -> None:
    from lockgate.errors import SpecError

    with pytest.raises(SpecError, match="must not be negative"):
        store.cleanup(older_than_ms=-1)


# -- what a task may make a worker do -------------------------------------------------------

def test_a_worker_imports_no_output_model_outside_the_allowed_modules(
        store: Store, simulator: SimulatorProcess, tmp_path: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``delivery_rule.pydantic_model`` names a module every worker would import: only
    modules listed in ``[runtime] model_modules`` are, others fail the task unimported."""
    (tmp_path / "planted_module.py").write_text(
        "import pathlib\npathlib.Path(__file__).with_name('imported').write_text('x')\n"
        "from pydantic import BaseModel\nclass M(BaseModel):\n    label: str\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = parse_task(task("t-1", delivery={"pydantic_model": "planted_module:M"}))
    store.submit([spec], batch_id="b")  # past submit's own check, as an old row would be
    _run(Worker(store, settings(), burst=True))
    row = rows(store, "SELECT status, error_class, error_message FROM task")[0]
    assert (row["status"], row["error_class"]) == ("FAILED", "invalid_request")
    assert "[runtime] model_modules" in row["error_message"]
    assert not (tmp_path / "imported").exists()
    assert simulator.stats()["requests"] == 0


def test_request_fields_lockgate_decides_cannot_be_replaced(
        simulator: SimulatorProcess) -> None:
    async def call() -> Completion:
        client = OpenAICompatible("sim", simulator.url)
        try:
            return await client.complete(CompletionRequest(
                messages=[{"role": "user", "content": 'Reply with JSON like {"label": "x"}'}],
                model="sim-small", timeout_s=10,
                params={"model": "planted", "messages": [], "stream": True}))
        finally:
            await client.close()

    answer = asyncio.run(call())
    assert answer.model == "sim-small" and answer.content


class Hostile:
    """Answers chosen by the task's text: megabytes, a lone surrogate, NUL, deep nesting."""

    name = "default"

    ANSWERS: ClassVar[dict[str, str]] = {
        "huge": "x" * (10 << 20),
        "surrogate": '{"label": "y\ud800es"}',
        "nul": '{"label": "no\x00"}',
        "deep": "[" * 100_000 + "]" * 100_000,
        "fine": '{"label": "no"}',
    }

    async def complete(self, request: CompletionRequest) -> Completion:
        kind = request.messages[-1]["content"].split("kind=")[1].split()[0]
        return Completion(content=self.ANSWERS[kind], http_status=200, model=request.model)

    async def close(self) -> None:
        return None


def test_hostile_answers_end_their_tasks_cleanly_with_the_raw_output_kept(
        store: Store) -> None:
    kinds = list(Hostile.ANSWERS)
    store.submit([parse_task(task(f"t-{k}", f"kind={k} ", retry={"max_retries": 0}))
                  for k in kinds], batch_id="b")
    stats = _run(Worker(store, settings(), burst=True, providers={"default": Hostile()}))
    assert stats.finished == len(kinds)
    got = {r["task_id"]: r for r in rows(
        store, "SELECT t.task_id, t.status, t.result, a.parse_status, a.raw_output "
               "FROM task t JOIN task_attempt a ON a.task_pk = t.id")}
    assert set(got) == {f"t-{k}" for k in kinds}
    huge = got["t-huge"]
    assert huge["status"] == "DEAD" and huge["parse_status"] == "no_json_found"
    assert huge["raw_output"].startswith("xxx") and huge["raw_output"].endswith(
        f"[lockgate: {(10 << 20) - (1 << 20):,} more characters not kept]")
    assert got["t-surrogate"]["raw_output"] == '{"label": "y\ufffdes"}'
    assert got["t-nul"]["raw_output"] == '{"label": "no\ufffd"}'
    assert got["t-deep"]["status"] == "DEAD" and len(got["t-deep"]["raw_output"]) > 1000
    assert got["t-fine"]["status"] == "SUCCEEDED"


def test_a_connection_lost_while_pooled_is_one_warning_line_not_a_traceback(
        store: Store, backend: str, caplog: pytest.LogCaptureFixture) -> None:
    """A session the server ended (a restart, a KILL) while its connection sat in the
    pool: SQLAlchemy's reset of it on return failed, logged as an ERROR with a traceback
    in the worker's log (MariaDB). The pool replaces such a connection by itself."""
    if backend == "sqlite":
        pytest.skip("SQLite has no server session to end")
    own = "SELECT CONNECTION_ID()" if backend == "mariadb" else "SELECT pg_backend_pid()"
    end = "KILL {}" if backend == "mariadb" else "SELECT pg_terminate_backend({})"
    conn = store.engine.connect()
    session = conn.execute(text(own)).scalar()
    conn.commit()
    with store.engine.connect() as other:
        other.execute(text(end.format(session)))
        other.commit()
    time.sleep(0.3)
    with caplog.at_level(logging.WARNING, logger="sqlalchemy.pool"):
        conn.close()  # the reset on return meets the ended session
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert all(r.exc_info is None for r in caplog.records)
    assert scalar(store, "SELECT 1") == 1  # and the pool goes on with a new connection


def test_a_results_stream_whose_connection_is_lost_says_so_in_one_error(
        store: Store, backend: str, caplog: pytest.LogCaptureFixture) -> None:
    """Found by a chaos review (MariaDB): a session ended while `export` streamed its
    results came out as "database error: Can't reconnect until invalid transaction is
    rolled back" (the session settings set back on a lost connection), after about a
    hundred lines of "Error closing cursor" tracebacks."""
    if backend == "sqlite":
        pytest.skip("SQLite has no server session to end")
    n = 20_000
    store.submit((parse_task(task(f"big-{i}", f"order {i}")) for i in range(n)),
                 batch_id="big")
    with store.engine.begin() as conn:  # rows far larger than the sockets' buffers
        conn.execute(text("UPDATE task SET error_message = REPEAT('x', 3000)"))
    readers: list[int] = []

    def note(conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if "ORDER BY" in statement and "request_id" in statement:
            raw = conn.connection.driver_connection
            readers.append(raw.thread_id() if backend == "mariadb" else raw.info.backend_pid)

    event.listen(store.engine, "before_cursor_execute", note)
    stream = store.results("big")
    assert next(stream).task_id  # the read is open and streaming
    event.remove(store.engine, "before_cursor_execute", note)
    [reader] = readers
    end = "KILL {}" if backend == "mariadb" else "SELECT pg_terminate_backend({})"
    with store.engine.connect() as other:
        other.execute(text(end.format(reader)))
        other.commit()
    with caplog.at_level(logging.DEBUG, logger="sqlalchemy.pool"), \
            pytest.raises(DatabaseUnavailable, match="the database server closed the session"):
        for _ in stream:
            pass
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == [], \
        [r.getMessage() for r in caplog.records]
    assert scalar(store, "SELECT 1") == 1
