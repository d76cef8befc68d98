"""The Python API: ``lockgate.connect(url)`` and ``await lockgate.connect_async(url)``."""

from __future__ import annotations

import asyncio

import orjson
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
        assert [r["task_id"] for r in results] == [t["task_id"] for t in lines]
        for i, r in enumerate(results):
            assert r["status"] == "SUCCEEDED"
            assert orjson.loads(r["result"]) == {"label": expected_label(text_for(i))}
            assert r["input_tokens"] > 0 and r["model"] == "sim-small"
        assert lg.status()["batches"] == {"api": {"SUCCEEDED": 25}}
        assert list(lg.results("other")) == []
        assert status_counts(lg.store) == {"SUCCEEDED": 25}


def test_connect_refuses_a_bad_task_naming_the_field(db_url: str) -> None:
    with lockgate.connect(db_url) as lg:
        bad = task("bad", retry={"backoff_factor": 0.5})
        with pytest.raises(lockgate.SpecError) as err:
            lg.submit([task("good"), bad])
        assert err.value.field == "retry_policy.backoff_factor"
        assert err.value.line == 2
        assert "greater than or equal to 1" in str(err.value)
        assert list(lg.results()) == [], "nothing of a refused submission is stored"
        with pytest.raises(lockgate.NotFound):
            lg.task("bad")


def test_connect_reads_the_url_from_the_environment(db_url: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_DATABASE_URL", db_url)
    with lockgate.connect() as lg:
        lg.submit([task("env")], batch_id="e")
    with lockgate.connect(db_url) as lg:
        assert lg.task("env")["batch_id"] == "e"


def test_connect_async(db_url: str, simulator: SimulatorProcess) -> None:
    async def main() -> None:
        lg = await lockgate.connect_async(db_url)
        async with lg:
            report = await lg.submit(tasks(12), batch_id="aio")
            assert report.inserted == 12
            stats = await lg.run_worker(burst=True, concurrency=4)
            assert stats.succeeded == 12
            results = await lg.results("aio")
            assert {r["status"] for r in results} == {"SUCCEEDED"}
            assert [orjson.loads(r["result"])["label"] for r in results] == [
                expected_label(text_for(i)) for i in range(12)]
            assert (await lg.status())["batches"] == {"aio": {"SUCCEEDED": 12}}
            with pytest.raises(lockgate.StateConflict, match="it is SUCCEEDED"):
                await lg.retry("t-00003")
            await lg.submit([task("late")], batch_id="aio")
            await lg.cancel("late")
            assert (await lg.task("late"))["status"] == "CANCELLED"
            with pytest.raises(lockgate.StateConflict):
                await lg.cancel("late")
            await lg.retry("late")
            assert (await lg.task("late"))["status"] == "PENDING"

    asyncio.run(main())
