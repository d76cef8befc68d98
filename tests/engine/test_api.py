"""The Python API: ``lockgate.connect(url)`` and ``await lockgate.connect_async(url)``."""

from __future__ import annotations

import asyncio

import pytest

import lockgate
from lockgate.simulator.testing import SimulatorProcess

from .support import expected_label, status_counts, task, tasks, text_for


def test_connect_submit_run_worker_results(db_url: str, simulator: SimulatorProcess) -> None:
    lines = tasks(25)
    with lockgate.connect(db_url) as lg:
        report = lg.submit(lines, batch_id="api")
        assert (report.batch_id, report.inserted, report.duplicates) == ("api", 25, 0)
        assert lg.submit(lines, batch_id="api").inserted == 0
        stats = lg.run_worker(burst=True, concurrency=8)
        assert (stats.succeeded, stats.failed, stats.discarded) == (25, 0, 0)
        results = list(lg.results("api"))
        assert [r.task_id for r in results] == [t["task_id"] for t in lines]
        for i, r in enumerate(results):
            assert r.status == "SUCCEEDED" and r.error is None
            assert r.result == {"label": expected_label(text_for(i))}  # a Python value
            assert r.usage is not None and r.usage.input_tokens > 0  # type: ignore[operator]
            assert r.usage.model == "sim-small"
            assert r.created_at.tzinfo is not None and r.finished_at >= r.created_at  # type: ignore[operator]
        assert lg.status().batches == {"api": {"SUCCEEDED": 25}}
        with pytest.raises(lockgate.NotFound, match="no batch 'other'"):
            lg.results("other")  # as the CLI says it, not an empty stream
        assert status_counts(lg.store) == {"SUCCEEDED": 25}
        view = lg.task("t-00003")
        assert view.input_data == {"text": text_for(3)} and view.metadata is None
        assert view.result == {"label": expected_label(text_for(3))}
        (attempt,) = view.attempt_log
        assert attempt.outcome == "succeeded" and attempt.prompt is not None
        assert attempt.started_at.tzinfo is not None and attempt.error is None
        row = results[3].to_dict()  # the shape files have: ISO-8601 UTC, nested error
        assert row["created_at"].endswith("Z") and row["error"] is None
        assert row["result"] == {"label": expected_label(text_for(3))}


def test_connect_refuses_a_bad_task_naming_the_field(db_url: str) -> None:
    with lockgate.connect(db_url) as lg:
        bad = task("bad", retry={"backoff_factor": 0.5})
        with pytest.raises(lockgate.SpecError) as err:
            lg.submit([task("good"), bad])
        assert err.value.field == "retry_policy.backoff_factor"
        assert err.value.line == 2
        assert "greater than or equal to 1" in str(err.value)
        assert list(lg.results()) == [], "nothing of a refused submission is stored"
        assert lg.status().batches == {}
        with pytest.raises(lockgate.NotFound):
            lg.task("bad")


def test_connect_reads_the_url_from_the_environment(db_url: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_DATABASE_URL", db_url)
    with lockgate.connect() as lg:
        lg.submit([task("env")], batch_id="e")
    with lockgate.connect(db_url) as lg:
        assert lg.task("env").batch_id == "e"


def test_connect_async(db_url: str, simulator: SimulatorProcess) -> None:
    async def main() -> None:
        lg = await lockgate.connect_async(db_url)
        async with lg:
            report = await lg.submit(tasks(12), batch_id="aio")
            assert report.inserted == 12
            stats = await lg.run_worker(burst=True, concurrency=4)
            assert stats.succeeded == 12
            results = await lg.results("aio")
            assert {r.status for r in results} == {"SUCCEEDED"}
            assert [r.result["label"] for r in results] == [
                expected_label(text_for(i)) for i in range(12)]
            assert (await lg.status()).batches == {"aio": {"SUCCEEDED": 12}}
            with pytest.raises(lockgate.StateConflict, match="it is SUCCEEDED"):
                await lg.retry("t-00003")
            await lg.submit([task("late")], batch_id="aio")
            await lg.cancel("late")
            assert (await lg.task("late")).status == "CANCELLED"
            with pytest.raises(lockgate.StateConflict):
                await lg.cancel("late")
            await lg.retry("late")
            assert (await lg.task("late")).status == "PENDING"
            assert await lg.retry_batch("aio") == 0

    asyncio.run(main())


def test_a_batch_is_recovered_at_once_by_state_and_error_class(
        db_url: str, simulator: SimulatorProcess) -> None:
    """``retry_batch`` puts a batch's FAILED/DEAD tasks (optionally of one error class)
    back to PENDING in one transaction, and a second call finds nothing."""
    from lockgate.store import Finish

    with lockgate.connect(db_url) as lg:
        lg.submit(tasks(6), batch_id="b")
        claims = sorted(lg.store.claim(6, lease_ms=60_000, worker_id="w"),
                        key=lambda c: c.task_id)
        ends = [("DEAD", "connection_error"), ("DEAD", "connection_error"),
                ("FAILED", "invalid_request"), ("DEAD", "timeout"), ("SUCCEEDED", None),
                ("FAILED", "connection_error")]
        lg.store.finish([Finish(id=c.id, lease_token=c.lease_token, status=st,
                                result='{"label": "no"}' if st == "SUCCEEDED" else None,
                                error_class=ec, attempt={"attempt": 1, "started_at": 0,
                                                         "outcome": st.lower()})
                         for c, (st, ec) in zip(claims, ends, strict=True)], worker_id="w")
        assert lg.retry_batch("b", statuses=["DEAD"], error_class="connection_error") == 2
        assert lg.retry_batch("b", statuses=["DEAD"], error_class="connection_error") == 0
        assert lg.retry_batch("b", statuses="FAILED") == 2  # one state as a string
        assert lg.retry_batch("b") == 1  # the other DEAD one
        assert lg.retry_batch("b") == 0
        assert {r.task_id: r.status for r in lg.results("b")} == {
            c.task_id: "SUCCEEDED" if st == "SUCCEEDED" else "PENDING"
            for c, (st, _ec) in zip(claims, ends, strict=True)}
        view = lg.task(claims[0].task_id)
        assert (view.attempts, view.error, view.result) == (0, None, None)
        with pytest.raises(lockgate.NotFound):
            lg.retry_batch("nope")
        with pytest.raises(lockgate.SpecError,
                           match=r"FAILED, DEAD or CANCELLED, not PENDING, SUCCEEDED$"):
            lg.retry_batch("b", statuses=["succeeded", "PENDING", "DEAD"])
