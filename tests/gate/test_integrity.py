"""The release gate's evaluations cannot be steered from outside: their task ids are a
namespace nobody may submit into, run items point at their own task rows, a step that
lost its lease cannot clear another worker's, and a database that drops connections
does not fail an evaluation."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from sqlalchemy import event, text
from sqlalchemy.exc import OperationalError

from lockgate.errors import SpecError, StoreError
from lockgate.spec import parse_task
from lockgate.states import RunStatus
from lockgate.store import schema

from .support import GOOD, MODEL, Env, drive, execute, rows, scalar


def _task(task_id: str, batch_id: str | None = None) -> dict[str, Any]:
    line: dict[str, Any] = {
        "task_id": task_id, "prompt_template": "{text}", "input_data": {"text": "x"},
        "model_config": MODEL, "delivery_rule": {}, "retry_policy": {}}
    if batch_id is not None:
        line["batch_id"] = batch_id
    return line


def test_the_gate_namespace_is_refused_at_submit(env: Env) -> None:
    with pytest.raises(SpecError, match="reserved") as err:
        parse_task(_task("gate:u1:d1:candidate:1"), line=4)
    assert (err.value.field, err.value.line) == ("task_id", 4)
    with pytest.raises(SpecError, match="reserved") as err:
        parse_task(_task("t1", batch_id="gate:u1:d1:candidate"))
    assert err.value.field == "batch_id"
    with pytest.raises(SpecError, match="reserved"):
        env.store.submit([parse_task(_task("t1"))], batch_id="gate:u1:d1:candidate")
    assert scalar(env.store, "SELECT COUNT(*) FROM task") == 0
    assert scalar(env.store, "SELECT COUNT(*) FROM batch") == 0


def test_a_planted_task_with_an_evaluation_id_fails_the_run_instead_of_being_scored(
        env: Env) -> None:
    """A row that took an evaluation's task id before the evaluation (written past
    submit's check, as an older database may hold) is never scored as the candidate's
    answer: the run fails and says why."""
    env.setup(thresholds=["accuracy>=0.9"], datasets={"d": 8})
    p = env.prompts.propose("p", GOOD)
    roles = env.roles()
    roles.start(p.update_id)
    (run,) = env.gate.gs.runs(p.update_id)
    first = scalar(env.store, "SELECT MIN(id) FROM dataset_item")
    now = env.store.db_now()
    with env.store.engine.begin() as conn:  # a planted, already "answered" task
        conn.execute(schema.task.insert(), [{
            "task_id": f"{run['batch_id']}:{first}", "batch_id": "mine",
            "config_hash": run["config_hash"], "input_data": "{}", "status": "SUCCEEDED",
            "result": orjson.dumps({"label": "yes"}).decode(), "visible_at": now,
            "created_at": now, "updated_at": now}])
    assert roles.materialize(run)
    (run,) = env.gate.gs.runs(p.update_id)
    assert run["status"] == RunStatus.FAILED
    assert "did not create" in run["reason"]
    assert scalar(env.store, "SELECT COUNT(*) FROM prompt_run_item") == 0
    drive(env, p.update_id)
    assert env.status(p.update_id) == "FAILED" and env.live() == 1


def test_run_items_are_joined_to_their_own_task_rows(env: Env) -> None:
    env.setup(thresholds=["accuracy>=0.9"], datasets={"d": 8})
    p = env.prompts.propose("p", GOOD)
    roles = env.roles()
    roles.start(p.update_id)
    (run,) = env.gate.gs.runs(p.update_id)
    roles.materialize(run)
    linked = rows(env.store, "SELECT i.task_id, t.task_id AS own FROM prompt_run_item i "
                             "JOIN task t ON t.id = i.task_pk")
    assert len(linked) == 8 and all(r["task_id"] == r["own"] for r in linked)
    execute(env.store)
    drive(env, p.update_id)
    assert env.status(p.update_id) == "ACTIVATED"


def test_a_step_that_lost_its_lease_cannot_clear_the_holders(env: Env) -> None:
    env.setup(datasets={"d": 8})
    p = env.prompts.propose("p", GOOD)
    env.roles().start(p.update_id)
    (run,) = env.gate.gs.runs(p.update_id)
    gs = env.gate.gs
    assert gs.claim_run(int(run["id"]), RunStatus.MATERIALIZING, token="a" * 32,
                        lease_ms=60_000, worker_id="holder")
    assert gs.step_failed(int(run["id"]), "late failure", token="b" * 32,
                          max_failures=1) is None
    (after,) = gs.runs(p.update_id)
    assert (after["lease_token"], after["failures"], after["status"]) == (
        "a" * 32, 0, RunStatus.MATERIALIZING)
    assert gs.step_failed(int(run["id"]), "own failure", token="a" * 32,
                          max_failures=3) is None
    (after,) = gs.runs(p.update_id)
    assert (after["lease_token"], after["failures"]) == (None, 1)


def test_dropped_connections_do_not_fail_an_evaluation(env: Env) -> None:
    """Connections that drop under the roles' reads and writes come out as StoreError,
    which the gate service backs off from; no step failure is counted, and the
    evaluation completes once the database answers again."""
    env.setup(thresholds=["accuracy>=0.9"], datasets={"d": 8})
    p = env.prompts.propose("p", GOOD)
    drops = {"FROM dataset_item": 3, "prompt_run_item i LEFT JOIN task": 3}

    def drop(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        for marker, left in drops.items():
            if marker in statement and left:
                drops[marker] = left - 1
                raise OperationalError(statement, {}, Exception("server closed the connection"))

    event.listen(env.store.engine, "before_cursor_execute", drop)
    try:
        roles = env.roles(max_failures=3)
        errors = 0
        for _ in range(60):
            try:
                roles.tick()
            except StoreError:
                errors += 1  # what GateService backs off from
            execute(env.store)
            if env.status(p.update_id) not in ("PENDING", "EVALUATING"):
                break
    finally:
        event.remove(env.store.engine, "before_cursor_execute", drop)
    assert drops == {"FROM dataset_item": 0, "prompt_run_item i LEFT JOIN task": 0}, (
        env.status(p.update_id), errors,
        rows(env.store, "SELECT status, reason, failures FROM prompt_run"))
    assert errors == 6
    assert scalar(env.store, "SELECT MAX(failures) FROM prompt_run") == 0
    assert env.status(p.update_id) == "ACTIVATED"


def test_a_snapshot_keeps_no_credentials_of_an_endpoint(store: Any) -> None:
    from lockgate.config import Endpoint, Settings

    leaky = Settings(endpoint=(Endpoint(
        name="main", base_url="https://app:s3cret@llm.example/v1?api_key=t0ken"),))
    env = Env(store, leaky)
    env.setup(datasets={"d": 4})
    p = env.prompts.propose("p", GOOD)
    raw = scalar(store, "SELECT snapshot FROM prompt_update WHERE id = :u", u=p.update_id)
    assert "s3cret" not in raw and "t0ken" not in raw
    path = orjson.loads(raw)["execution_path"]
    assert path["settings"]["endpoints"][0]["base_url"] == "https://llm.example/v1"


def test_retention_leaves_the_tasks_and_traces_of_an_evaluation_in_progress(
        env: Env) -> None:
    # `lockgate cleanup` between the calls and the Finalize of a run deleted the
    # attempts its token counts come from: cost_per_item became 0 and passed.
    env.setup(thresholds=["accuracy>=0.9", "cost_per_item<=0.000001"], prices=(10.0, 30.0))
    p = env.prompts.propose("p", GOOD)
    roles = env.roles()
    roles.advance(p.update_id, "PENDING")
    roles.advance(p.update_id, "EVALUATING")  # materialised
    execute(env.store)  # every item answered
    attempts = scalar(env.store, "SELECT COUNT(*) FROM task_attempt")
    assert attempts > 0
    deleted = env.store.cleanup(older_than_ms=0, tasks=True)
    assert deleted == {"attempts": 0, "tasks": 0}
    assert drive(env, p.update_id) == "REJECTED"
    [run] = env.gate.status(p.update_id)["runs"]
    assert run["metrics"]["cost_per_item"] > 0.000001
    # once decided, retention takes them like any others
    assert env.store.cleanup(older_than_ms=0, tasks=True)["attempts"] == attempts


def test_a_snapshot_no_decision_can_be_taken_on_fails_its_update_not_the_workers(
        env: Env) -> None:
    # A binding that validated when bound but not when frozen (here: written over in
    # the database) made Reconcile raise in every worker that ran the gate, each tick:
    # the workers stopped and the update stayed EVALUATING.
    env.setup()
    p = env.prompts.propose("p", GOOD)
    with env.store.engine.begin() as c:
        snap = orjson.loads(c.execute(text("SELECT snapshot FROM prompt_update WHERE id = :u"),
                                      {"u": p.update_id}).scalar_one())
        snap["datasets"][0]["binding"]["thresholds"][0]["value"] = None
        c.execute(text("UPDATE prompt_update SET snapshot = :s WHERE id = :u"),
                  {"s": orjson.dumps(snap).decode(), "u": p.update_id})
    assert drive(env, p.update_id) == "FAILED"
    st = env.gate.status(p.update_id)
    assert st["reason"].startswith("reconcile: ValidationError") and "thresholds" in st["reason"]
    assert env.live() == 1
