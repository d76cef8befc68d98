"""The REVIEW state: tasks held for a person by an open completeness circuit whose
fallback is ``review``, then exported, resolved, cancelled; on every backend, with a real
worker and the simulator."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner, Result

from engine.support import TEMPLATE, attempts_of, status_counts, task, task_row, write_jsonl
from helpers import rows
from lockgate import Lockgate
from lockgate.cli import app
from lockgate.config import CircuitSettings, QualitySettings, Settings, WorkerSettings
from lockgate.errors import NotFound, SpecError, StateConflict
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import template_key

KEY = template_key(TEMPLATE)
SCHEMA = {"type": "object", "properties": {"label": {"type": "string",
                                                     "enum": ["yes", "no"]}},
          "required": ["label"]}


def _settings(**circuit: object) -> Settings:
    c = CircuitSettings(**{"prompt": KEY, "fallback": "review", "probe_share": 0.0,
                           **circuit})  # type: ignore[arg-type]
    return Settings(worker=WorkerSettings(concurrency=8, poll_max_s=0.05),
                    quality=QualitySettings(circuit=(c,), circuit_every_s=0.1,
                                            circuit_refresh_s=0.05))


def _config(tmp_path: Path, **circuit: object) -> Path:
    extra = "".join(f"{k} = {orjson.dumps(v).decode()}\n" for k, v in circuit.items())
    path = tmp_path / "lockgate.toml"
    path.write_text(f'[[quality.circuit]]\nprompt = "{KEY}"\nfallback = "review"\n'
                    f"probe_share = 0.0\n{extra}")
    return path


def lockgate(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def _hold(lg: Lockgate, n: int, batch: str = "b") -> None:
    lg.submit([task(f"{batch}-{i}", f"order {i}", delivery={"schema": SCHEMA})
               for i in range(n)], batch_id=batch)
    lg.open_circuit(KEY, actor="alice", reason="drill")
    stats = lg.run_worker(burst=True)  # returns: REVIEW tasks are not a worker's work
    assert stats.review == n and stats.succeeded == 0


def test_review_is_held_exported_resolved_and_cancelled(
        db_url: str, simulator: SimulatorProcess, tmp_path: Path) -> None:
    with Lockgate(db_url, settings=_settings()) as lg:
        _hold(lg, 4)
        assert simulator.stats()["requests"] == 0  # held without calling the model
        st = lg.status()
        assert st.batches["b"] == {"REVIEW": 4} and st.review == 4
        [c] = st.circuits
        assert (c.prompt, c.state, c.manual, c.changed_by) == (KEY, "OPEN", True, "alice")
        held = task_row(lg.store, "b-0")
        assert (held["status"], held["finished_at"]) == ("REVIEW", None)
        assert "completeness circuit" in held["error_message"]

        items = {i.task_id: i for i in lg.review("b")}
        assert sorted(items) == ["b-0", "b-1", "b-2", "b-3"]
        one = items["b-1"]
        assert one.input == {"text": "order 1"} and one.prompt == KEY
        assert one.messages[-1]["role"] == "user" and "order 1" in one.messages[-1]["content"]
        assert one.output_schema == SCHEMA and one.last_output is None

        # one line naming the field, nothing changed
        with pytest.raises(SpecError, match=r"result\.label.*is not one of"):
            lg.resolve("b-0", {"label": "maybe"})
        with pytest.raises(SpecError, match=r"result\.label.*missing"):
            lg.resolve("b-0", {})
        # refused as a worker refuses a model's answer: a required field null or blank
        for empty in (None, "", "  "):
            with pytest.raises(SpecError, match=r"result\.label.*empty"):
                lg.resolve("b-0", {"label": empty})
        assert task_row(lg.store, "b-0")["status"] == "REVIEW"

        lg.resolve("b-0", {"label": "yes"}, actor="bob", reason="checked by hand")
        done = task_row(lg.store, "b-0")
        assert (done["status"], orjson.loads(done["result"]), done["parse_status"]) == \
            ("SUCCEEDED", {"label": "yes"}, "resolved")
        assert done["finished_at"] is not None
        trail = attempts_of(lg.store, "b-0")
        assert [a["outcome"] for a in trail] == ["review", "resolved"]
        assert (trail[-1]["worker_id"], trail[-1]["error_message"]) == \
            ("bob", "checked by hand")
        [res] = [r for r in lg.results("b") if r.task_id == "b-0"]
        assert res.result == {"label": "yes"} and res.error is None
        # the rollups count it as a task of the prompt it was held under; the holds
        # are no attempt of it (no call, no model)
        [q] = lg.quality(KEY, since="1h")
        assert (q.prompt, q.tasks, q.attempts, q.calls) == (KEY, 1, 1, 0)

        with pytest.raises(StateConflict, match="it is SUCCEEDED, and resolve needs REVIEW"):
            lg.resolve("b-0", {"label": "no"})
        with pytest.raises(NotFound):
            lg.resolve("nosuch", {"label": "no"})

        lg.cancel("b-1")  # REVIEW -> CANCELLED
        assert task_row(lg.store, "b-1")["status"] == "CANCELLED"
        with pytest.raises(StateConflict):
            lg.resolve("b-1", {"label": "no"})

        # retention keeps the held tasks and the prompt they were held with
        lg.store.cleanup(older_than_ms=0, tasks=True)
        assert status_counts(lg.store) == {"REVIEW": 2}
        assert [i.task_id for i in lg.review()] == ["b-2", "b-3"]
        assert all(i.messages for i in lg.review())
        assert lg.summary("b").throughput is None


def test_a_resolved_result_takes_the_rules_fallbacks_as_an_answer_does(
        db_url: str, simulator: SimulatorProcess) -> None:
    """A model's answer with ``summary`` blank is delivered with its fallback
    (``filled_fallback``); the same result given by a person was refused ("required key
    'summary' is empty"), and leaving the key out as "missing"."""
    schema = {"type": "object", "required": ["label", "summary"],
              "properties": {"label": {"type": "string", "enum": ["yes", "no"]},
                             "summary": {"type": "string", "minLength": 1}}}
    delivery = {"schema": schema, "required_keys": ["label", "summary"],
                "fallback_values": {"summary": "(none)"}}
    with Lockgate(db_url, settings=_settings()) as lg:
        lg.submit([task(f"f-{i}", f"order {i}", delivery=delivery) for i in range(3)],
                  batch_id="f")
        lg.open_circuit(KEY, actor="alice", reason="drill")
        assert lg.run_worker(burst=True).review == 3
        lg.resolve("f-0", {"label": "no", "summary": ""})
        lg.resolve("f-1", {"label": "yes"})
        lg.resolve("f-2", {"label": "yes", "summary": "late parcel"})
        got = {r.task_id: r.result for r in lg.results("f")}
        assert got == {"f-0": {"label": "no", "summary": "(none)"},
                       "f-1": {"label": "yes", "summary": "(none)"},
                       "f-2": {"label": "yes", "summary": "late parcel"}}
        # a field without a fallback is judged as before
        lg.submit([task("g-0", delivery=delivery)], batch_id="g")
        assert lg.run_worker(burst=True).review == 1
        with pytest.raises(SpecError, match=r"result\.label.*missing"):
            lg.resolve("g-0", {"summary": "x"})


def test_review_from_the_command_line(db_url: str, simulator: SimulatorProcess,
                                      tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    with Lockgate(db_url, settings=_settings()) as lg:
        _hold(lg, 3)
    result = lockgate("status", "--db", db_url, "--config", cfg)
    assert result.exit_code == 0, result.output
    assert "REVIEW" in result.stdout and "held for review: 3 task(s)" in result.output
    assert "completeness circuits" in result.stdout
    st = orjson.loads(lockgate("status", "--json", "--db", db_url, "--config", cfg).stdout)
    assert st["batches"]["b"] == {"REVIEW": 3}
    assert [(c["prompt"], c["state"], c["fallback_kind"]) for c in st["circuits"]] == \
        [(KEY, "OPEN", "review")]

    out = tmp_path / "review.jsonl"
    result = lockgate("export", "--review", "--batch", "b", "-o", out, "--db", db_url)
    assert result.exit_code == 0, result.output
    lines = [orjson.loads(x) for x in out.read_text().splitlines()]
    assert [x["task_id"] for x in lines] == ["b-0", "b-1", "b-2"]
    assert lines[0]["input"] == {"text": "order 0"} and lines[0]["messages"]
    result = lockgate("export", "--review", "--format", "csv", "--db", db_url)
    table = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [r["task_id"] for r in table] == ["b-0", "b-1", "b-2"]
    assert orjson.loads(table[2]["input"]) == {"text": "order 2"}
    # every column the JSON lines have that a person reads (attempts was missing)
    assert table[0]["attempts"] == str(lines[0]["attempts"])
    result = lockgate("export", "--review", "--format", "openai-batch", "--db", db_url)
    first = orjson.loads(result.stdout.splitlines()[0])
    assert first["custom_id"] == "b-0"
    # a request line the Batch API (and lockgate's own openai-batch input) takes: the
    # body names the model (it held only the messages)
    assert first["body"]["model"] and first["body"]["messages"]
    again_in = tmp_path / "again.jsonl"
    again_in.write_text(result.stdout)
    checked = lockgate("submit", again_in, "--input-format", "openai-batch", "--batch",
                       "again", "--db", db_url)
    assert checked.exit_code == 0, checked.output

    answer = write_jsonl(tmp_path / "answer.json", [{"label": "no"}])
    result = lockgate("tasks", "resolve", "b-0", "--result", f"@{answer}", "--actor", "carol",
                      "--reason", "looked", "--db", db_url)
    assert result.exit_code == 0, result.output
    assert task_row_status(db_url, "b-0") == "SUCCEEDED"

    bad = lockgate("tasks", "resolve", "b-1", "--result", '{"label": 3}', "--db", db_url)
    assert bad.exit_code == 2 and bad.output.count("\n") == 1
    assert "result.label" in bad.output
    again = lockgate("tasks", "resolve", "b-0", "--result", '{"label": "no"}', "--db", db_url)
    assert again.exit_code == 2 and "resolve needs REVIEW" in again.output
    nojson = lockgate("tasks", "resolve", "b-1", "--result", "{nope", "--db", db_url)
    assert nojson.exit_code == 2 and "result" in nojson.output
    # An integer beyond 64 bits was read as a float and stored with its digits lost.
    big = lockgate("tasks", "resolve", "b-1", "--result",
                   '{"label": "no", "order": 12345678901234567890123}', "--db", db_url)
    assert big.exit_code == 2 and "result.order" in big.output
    assert "beyond 64 bits" in big.output and task_row_status(db_url, "b-1") == "REVIEW"
    with Lockgate(db_url, migrate=False) as lg:  # the Python API: no bare TypeError
        for value in ({"label": "no", "order": 10**30}, {"label": "no", "tags": {1}}):
            with pytest.raises(SpecError) as err:
                lg.resolve("b-1", value)
            assert err.value.field == "result"
    assert lockgate("tasks", "cancel", "b-2", "--db", db_url).exit_code == 0
    assert lockgate("export", "--db", db_url).exit_code == 2  # a batch, or --review


def task_row_status(db_url: str, task_id: str) -> str:
    with Lockgate(db_url, migrate=False) as lg:
        return str(rows(lg.store, "SELECT status FROM task WHERE task_id = :t",
                        t=task_id)[0]["status"])


def test_the_asyncio_api_reviews_and_resolves(db_url: str, simulator: SimulatorProcess) -> None:
    import asyncio

    import lockgate

    with Lockgate(db_url, settings=_settings()) as lg:
        _hold(lg, 2)

    async def main() -> None:
        alg = await lockgate.connect_async(db_url, settings=_settings())
        async with alg:
            assert [c.state for c in await alg.circuits()] == ["OPEN"]
            items = await alg.review("b")
            assert [i.task_id for i in items] == ["b-0", "b-1"]
            await alg.resolve("b-0", {"label": "no"}, actor="dana")
            assert (await alg.status()).review == 1
            assert (await alg.close_circuit(KEY)).state == "CLOSED"
            assert (await alg.open_circuit(KEY)).manual

    asyncio.run(main())


def test_holds_and_resolutions_are_no_calls_of_a_model(
        db_url: str, simulator: SimulatorProcess) -> None:
    # `lg.quality(by="model")` had a row of model '' beside the real model, with an
    # attempt per hold and a task per resolution; the holds inflated the version's
    # attempts.
    with Lockgate(db_url, settings=_settings()) as lg:
        lg.submit([task(f"a-{i}", f"order {i}", delivery={"schema": SCHEMA})
                   for i in range(3)], batch_id="a")
        assert lg.run_worker(burst=True).succeeded == 3  # the circuit is closed
        _hold(lg, 4)
        lg.resolve("b-0", {"label": "yes"}, actor="bob")
        by_model = {r.model: r for r in lg.quality(KEY, since="1h", by="model")}
        assert "" not in by_model and "(review)" in by_model and len(by_model) == 2
        [model] = [m for m in by_model if m != "(review)"]
        called = by_model[model]
        assert (called.attempts, called.tasks, called.calls) == (3, 3, 3)
        person = by_model["(review)"]
        assert (person.attempts, person.tasks, person.calls, person.completeness) == \
            (1, 1, 0, None)
        [version] = lg.quality(KEY, since="1h")
        assert (version.attempts, version.tasks, version.calls) == (4, 4, 3)
