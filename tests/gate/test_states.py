"""Every arrow of the release gate's state machines, taken step by step on every backend,
and that no terminal state is ever left (docs/gate.md, "State machines").

Role steps are called one at a time (:class:`GateRoles`), and evaluation tasks are run
through the real execution path in process (:func:`support.execute`), so each test
controls exactly which step happens when.
"""

from __future__ import annotations

from typing import Any

import pytest

from lockgate.config import Endpoint, Settings
from lockgate.errors import ConfigError
from lockgate.gate.binding import BindingSettings
from lockgate.states import ARROWS, TERMINAL_RUNS, TERMINAL_UPDATES, RunStatus, UpdateStatus
from lockgate.store.gate import GateStore

from .support import (
    BAD,
    GOOD,
    Env,
    LocalProvider,
    accuracy_of,
    drive,
    execute,
    items,
    rows,
    scalar,
    wait_for,
    yes_no,
)

BETTER = yes_no("refund|money back|reimburse|refunded")


def runs(env: Env, update_id: int) -> list[dict[str, Any]]:
    return env.gate.gs.runs(update_id)


def run_statuses(env: Env, update_id: int) -> list[str]:
    return [r["status"] for r in runs(env, update_id)]


def test_no_arrow_leaves_a_terminal_state() -> None:
    terminal = {"prompt_update": TERMINAL_UPDATES, "prompt_run": TERMINAL_RUNS,
                "prompt_run_item": {"MATCH", "MISMATCH", "ERROR"}}
    for table, arrows in ARROWS.items():
        assert not [a for a in arrows if a[0] in terminal[table]], table
        assert all(a[0] != a[1] for a in arrows)


def test_a_passing_candidate_is_activated_step_by_step(env: Env) -> None:
    env.setup()
    p = env.prompts.propose("p", GOOD)
    roles = env.roles()
    gs = env.gate.gs
    assert env.status(p.update_id) == "PENDING"
    assert roles.start(p.update_id) and not roles.start(p.update_id)  # once only
    assert env.status(p.update_id) == "EVALUATING"
    (run,) = runs(env, p.update_id)
    assert run["status"] == "MATERIALIZING"
    assert roles.materialize(run)
    (run,) = runs(env, p.update_id)
    assert (run["status"], run["materialized"], run["expected_items"]) == ("EXECUTING", 40, 40)
    assert gs.task_counts([run["batch_id"]]) == {run["batch_id"]: {"PENDING": 40}}
    assert not roles.finalize(run)  # tasks are still pending: Finalize must wait
    execute(env.store)
    assert roles.finalize(run)
    (run,) = runs(env, p.update_id)
    assert run["status"] == "FINALIZED" and run["metrics"]["accuracy"] == 1.0
    assert gs.verdict_counts([run["id"]]) == {run["id"]: {"MATCH": 40}}
    assert env.status(p.update_id) == "EVALUATING" and env.live() == 1
    assert roles.reconcile(p.update_id)
    st = env.gate.status(p.update_id)
    assert (st["status"], st["reason"], env.live()) == ("ACTIVATED", "passed every threshold", 2)
    assert st["decision"]["outcome"] == "activate"
    versions = {r["prompt_version"] for r in rows(
        env.store, "SELECT a.prompt_version FROM task_attempt a JOIN task t "
                   "ON t.id = a.task_pk WHERE t.batch_id = :b", b=run["batch_id"])}
    assert versions == {"p@2"}, "every evaluation call is traced to the candidate version"
    actions = [r["action"] for r in env.prompts.history("p")["audit"]]
    assert actions == ["create", "propose", "activate"]


def test_a_failing_candidate_is_rejected_and_live_is_unchanged(env: Env) -> None:
    env.setup(datasets={"a": 20, "b": 20})
    p = env.prompts.propose("p", BAD)
    assert drive(env, p.update_id) == "REJECTED"
    st = env.gate.status(p.update_id)
    assert env.live() == 1
    assert accuracy_of(BAD, 20) == 0.25
    assert st["reason"] == "a: accuracy 0.25 not >= 0.9; b: accuracy 0.25 not >= 0.9"
    assert [d["passed"] for d in st["decision"]["datasets"]] == [False, False]


def test_a_newer_submission_cancels_older_ones_and_their_work(env: Env) -> None:
    env.setup()
    gs = env.gate.gs
    first = env.prompts.propose("p", BETTER)  # cancelled while PENDING
    second = env.prompts.propose("p", GOOD)
    assert (second.superseded, env.status(first.update_id)) == ([first.update_id],
                                                                "CANCELLED")
    roles = env.roles()
    roles.start(second.update_id)
    roles.materialize(runs(env, second.update_id)[0])
    held = env.store.claim(5, lease_ms=60_000, worker_id="slow")  # calls in flight
    third = env.prompts.propose("p", BETTER)
    assert env.status(second.update_id) == "CANCELLED"
    assert "superseded by update" in str(env.gate.status(second.update_id)["reason"])
    assert run_statuses(env, second.update_id) == ["CANCELLED"]
    batch = runs(env, second.update_id)[0]["batch_id"]
    assert gs.task_counts([batch])[batch] == {"CANCELLED": 40}
    from lockgate.store import Finish

    report = env.store.finish([Finish(id=t.id, lease_token=t.lease_token, status="SUCCEEDED",
                                      result='{"label": "yes"}') for t in held],
                              worker_id="slow")
    assert report.applied == [] and len(report.discarded) == 5, \
        "in-flight results of a cancelled evaluation are fenced out"
    assert gs.activate(second.update_id, {}).status == "CANCELLED"
    assert not gs.conclude(second.update_id, UpdateStatus.REJECTED, "x", {})
    assert third.version == first.version == 2, "re-proposed content is the same version"
    assert drive(env, third.update_id) == "ACTIVATED" and env.live() == 2


def test_withdrawn_candidates_are_cancelled_in_either_state(env: Env) -> None:
    env.setup()
    a = env.prompts.propose("p", GOOD)
    assert env.gate.cancel(a.update_id, reason="changed my mind")
    assert not env.gate.cancel(a.update_id)
    assert env.status(a.update_id) == "CANCELLED"
    b = env.prompts.propose("p", BETTER)
    env.roles().start(b.update_id)
    assert run_statuses(env, b.update_id) == ["MATERIALIZING"]
    assert env.gate.cancel(b.update_id)
    assert run_statuses(env, b.update_id) == ["CANCELLED"]
    assert [r["action"] for r in env.prompts.history("p")["audit"]][-1] == "cancel"


def test_a_candidate_whose_base_moved_ends_stale(env: Env) -> None:
    env.setup(thresholds=["accuracy>=0.4"])
    drive(env, env.prompts.propose("p", BETTER).update_id)
    assert env.live() == 2
    slow = env.prompts.propose("p", GOOD)
    roles = env.roles()
    roles.start(slow.update_id)
    roles.materialize(runs(env, slow.update_id)[0])
    execute(env.store)
    env.prompts.rollback("p", to=1, reason="incident")
    assert drive(env, slow.update_id) == "STALE"
    st = env.gate.status(slow.update_id)
    assert "moved from v2 to v1" in st["reason"] and st["decision"]["outcome"] == "activate"
    assert env.live() == 1, "a stale evaluation never activates"


def test_an_empty_dataset_run_is_empty_and_rejects(env: Env) -> None:
    env.setup()
    env.datasets.add("nothing", [])
    env.gate.bind("p", "nothing", thresholds=["accuracy>=0"])
    p = env.prompts.propose("p", GOOD)
    assert drive(env, p.update_id) == "REJECTED"
    by_ds = {r["dataset_name"]: r["status"] for r in runs(env, p.update_id)}
    assert by_ds == {"nothing": "EMPTY", "p-set": "FINALIZED"}
    assert "nothing: the dataset snapshot is empty" in env.gate.status(p.update_id)["reason"]


def test_a_run_whose_steps_keep_failing_fails_the_update(env: Env,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    env.setup()
    p = env.prompts.propose("p", GOOD)

    def broken(*_a: Any, **_k: Any) -> str:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(GateStore, "materialize_page", broken)
    roles = env.roles()
    roles.start(p.update_id)
    for _ in range(3):
        roles.advance(p.update_id, "EVALUATING")
    (run,) = runs(env, p.update_id)
    assert (run["status"], run["failures"]) == ("FAILED", 3)
    assert "disk on fire" in run["reason"]
    roles.advance(p.update_id, "EVALUATING")
    st = env.gate.status(p.update_id)
    assert st["status"] == "FAILED" and "could not complete" in st["reason"]
    assert env.live() == 1


def test_an_executing_run_fails_when_its_scorer_cannot_be_loaded(
        env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    env.setup()
    p = env.prompts.propose("p", GOOD)
    roles = env.roles()
    roles.start(p.update_id)
    roles.materialize(runs(env, p.update_id)[0])
    execute(env.store)

    def gone(*_a: Any) -> Any:
        raise ConfigError("cannot import scorer 'team.scorers:f': No module named 'team'")

    monkeypatch.setattr("lockgate.gate.roles.Comparator", gone)
    roles.advance(p.update_id, "EVALUATING")
    assert run_statuses(env, p.update_id) == ["FAILED"]
    assert env.status(p.update_id) == "FAILED"


def test_items_get_error_verdicts_and_undefined_metrics_fail_by_default(env: Env) -> None:
    never_yes = yes_no("zzz")  # predicts no positive at all: precision is 0/0
    for name, undefined in (("strict", "fail"), ("lenient", "pass")):
        env.setup(name, datasets={f"{name}-set": 40},
                  thresholds=["precision>=0.5", "error_ratio<=0.3"], positive="yes",
                  undefined=undefined)
    provider = LocalProvider(fail=lambda text: "colour" in text)
    strict = env.prompts.propose("strict", never_yes)
    lenient = env.prompts.propose("lenient", never_yes)
    assert drive(env, strict.update_id, provider=provider) == "REJECTED"
    assert drive(env, lenient.update_id, provider=provider) == "ACTIVATED"
    st = env.gate.status(strict.update_id)
    m = st["decision"]["datasets"][0]["metrics"]
    assert (m["precision"], m["error_ratio"], m["counts"]["error"]) == (None, 0.25, 10)
    assert st["reason"] == "strict-set: precision undefined"
    errors = rows(env.store, "SELECT verdict, error FROM prompt_run_item WHERE run_id = :r "
                             "AND verdict = 'ERROR'", r=runs(env, strict.update_id)[0]["id"])
    assert len(errors) == 10 and all("task FAILED: invalid_request" in e["error"]
                                     for e in errors)


def test_the_snapshot_is_frozen_at_submission(env: Env) -> None:
    env.setup(thresholds=["accuracy>=0.9"])
    p = env.prompts.propose("p", GOOD)
    u = env.gate.status(p.update_id)
    snap = u["snapshot"]
    assert snap["candidate"]["content_hash"] == env.prompts.version("p", 2).content_hash
    assert (snap["base"]["version"], snap["base_generation"]) == (1, 1)
    assert snap["datasets"][0]["items"] == 40 and snap["datasets"][0]["revision"] == 1
    assert snap["execution_path"]["lockgate"] and len(snap["execution_path"]
                                                       ["settings_hash"]) == 64
    assert len(u["snapshot_hash"]) == 64
    # later changes: more items, an unreachable threshold, an unbound dataset
    env.datasets.add("p-set", items(80, "p-set"))
    # (bound past the check that refuses it today: the point is that no later binding,
    # however strict, reaches a snapshot already frozen)
    strict = BindingSettings.model_validate({"thresholds": [{"metric": "accuracy",
                                                              "op": ">=", "value": 2.0}]})
    env.gate.gs.bind("p", "p-set", strict.model_dump(mode="json"))
    assert drive(env, p.update_id) == "ACTIVATED"
    (run,) = runs(env, p.update_id)
    assert run["expected_items"] == run["materialized"] == 40
    assert env.gate.status(p.update_id)["snapshot_hash"] == u["snapshot_hash"]


def test_materialisation_resumes_idempotently_after_a_lost_lease(env: Env) -> None:
    env.setup()
    p = env.prompts.propose("p", GOOD)
    gs = env.gate.gs
    env.roles().start(p.update_id)
    (run,) = runs(env, p.update_id)
    rid = int(run["id"])
    # a worker takes the lease, writes one page, and dies: its lease runs out
    assert gs.claim_run(rid, RunStatus.MATERIALIZING, token="dead", lease_ms=1,
                        worker_id="w1")
    assert gs.materialize_page(rid, token="dead", lease_ms=1, revision=1, page=7) == "more"
    wait_for(lambda: env.roles("w2", page=10).materialize(runs(env, p.update_id)[0]),
             "another worker to take the expired lease over", timeout=10)
    (run,) = runs(env, p.update_id)
    assert (run["status"], run["materialized"]) == ("EXECUTING", 40)
    assert scalar(env.store, "SELECT COUNT(*) FROM task WHERE batch_id = :b",
                  b=run["batch_id"]) == 40
    assert scalar(env.store, "SELECT COUNT(DISTINCT item_id) FROM prompt_run_item "
                             "WHERE run_id = :r", r=rid) == 40
    # the dead worker comes back: its fenced writes change nothing
    assert gs.materialize_page(rid, token="dead", lease_ms=1000, revision=1, page=7) == "lost"
    assert drive(env, p.update_id) == "ACTIVATED"


def test_finalisation_resumes_after_a_lost_lease(env: Env) -> None:
    env.setup()
    p = env.prompts.propose("p", GOOD)
    gs = env.gate.gs
    roles = env.roles()
    roles.start(p.update_id)
    roles.materialize(runs(env, p.update_id)[0])
    execute(env.store)
    rid = int(runs(env, p.update_id)[0]["id"])
    assert gs.claim_run(rid, RunStatus.EXECUTING, token="dead", lease_ms=1, worker_id="w1",
                        require_tasks_done=True)
    part = gs.undecided_items(rid, limit=5)
    from lockgate.gate.roles import score_item

    comp = roles.comparator(roles.settings_for(runs(env, p.update_id)[0]))
    assert gs.record_verdicts(rid, token="dead", lease_ms=1,
                              verdicts=[score_item(comp, r) for r in part])
    wait_for(lambda: env.roles("w2").finalize(runs(env, p.update_id)[0]),
             "another worker to finalise after the lease expired", timeout=10)
    assert run_statuses(env, p.update_id) == ["FINALIZED"]
    assert not gs.record_verdicts(rid, token="dead", lease_ms=1000, verdicts=[])
    assert not gs.finish_run(rid, token="dead", status=RunStatus.FINALIZED, metrics={},
                             reason=None)
    assert gs.verdict_counts([rid]) == {rid: {"MATCH": 40}}


def _terminal_updates(env: Env, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """One update in each terminal state."""
    out: dict[str, int] = {}
    env.setup("act")
    out["ACTIVATED"] = env.prompts.propose("act", GOOD).update_id
    drive(env, out["ACTIVATED"])
    env.setup("rej")
    out["REJECTED"] = env.prompts.propose("rej", BAD).update_id
    drive(env, out["REJECTED"])
    env.setup("can")
    out["CANCELLED"] = env.prompts.propose("can", GOOD).update_id
    env.roles().start(out["CANCELLED"])
    env.prompts.propose("can", BETTER)
    env.setup("sta", thresholds=["accuracy>=0.4"])
    drive(env, env.prompts.propose("sta", BETTER).update_id)
    out["STALE"] = env.prompts.propose("sta", GOOD).update_id
    env.roles().start(out["STALE"])
    env.prompts.rollback("sta")
    drive(env, out["STALE"])
    env.setup("fai")
    out["FAILED"] = env.prompts.propose("fai", GOOD).update_id
    env.roles().start(out["FAILED"])
    with monkeypatch.context() as m:
        m.setattr(GateStore, "materialize_page", lambda *a, **k: 1 / 0)
        for _ in range(3):
            env.roles().advance(out["FAILED"], "EVALUATING")
    drive(env, out["FAILED"])
    return out


def test_terminal_states_are_never_left(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = _terminal_updates(env, monkeypatch)
    gs = env.gate.gs
    before = {s: env.gate.status(u) for s, u in ids.items()}
    assert {s: st["status"] for s, st in before.items()} == {s: s for s in ids}
    lives = {n: env.live(n) for n in ("act", "rej", "can", "sta", "fai")}
    for state, uid in ids.items():
        assert not gs.start(uid, [])
        assert not gs.cancel(uid, "late")
        assert gs.activate(uid, {}).status == state
        for to in (UpdateStatus.REJECTED, UpdateStatus.FAILED):
            assert not gs.conclude(uid, to, "late", {})
        env.roles().advance(uid, "EVALUATING")  # a confused worker: changes nothing
        for run in runs(env, uid):
            rid = int(run["id"])
            assert run["status"] in TERMINAL_RUNS
            for status in RunStatus:
                assert not gs.claim_run(rid, status, token="t", lease_ms=1000, worker_id="x")
            assert gs.materialize_page(rid, token="t", lease_ms=1000, revision=1,
                                       page=10) == "lost"
            assert not gs.record_verdicts(rid, token="t", lease_ms=1000, verdicts=[])
            for to in (RunStatus.FINALIZED, RunStatus.FAILED):
                assert not gs.finish_run(rid, token="t", status=to, metrics={}, reason=None)
        after = env.gate.status(uid)
        assert (after["status"], after["decided_at"], after["decision"]) == (
            state, before[state]["decided_at"], before[state]["decision"])
        assert [(r["status"], r["metrics"]) for r in after["runs"]] == [
            (r["status"], r["metrics"]) for r in before[state]["runs"]]
    assert {n: env.live(n) for n in lives} == lives
    with pytest.raises(AssertionError, match="not an allowed transition"), \
            env.store.engine.begin() as conn:
        gs._move(conn, "prompt_update", [ids["ACTIVATED"]], ["ACTIVATED"], "EVALUATING", 0)


def test_evaluation_tasks_go_to_the_pool_of_the_candidates_model(env: Env) -> None:
    """Routing as at submit: a ``--pool gpu`` worker evaluates candidates for models
    served from that pool; a model no endpoint routes stays in the default pool."""
    settings = Settings(endpoint=(
        Endpoint(name="gpu-box", base_url="http://127.0.0.1:9/v1", models=("sim-small",),
                 pool="gpu"),
        Endpoint(name="hosted", base_url="http://127.0.0.1:9/v1")))
    env.setup()
    p = env.prompts.propose("p", GOOD)
    roles = env.roles(pool_of=settings.pool_of_document)
    assert roles.start(p.update_id)
    (run,) = runs(env, p.update_id)
    assert roles.materialize(run)
    assert rows(env.store, "SELECT pool, COUNT(*) AS n FROM task WHERE batch_id = :b "
                           "GROUP BY pool", b=run["batch_id"]) == [{"pool": "gpu", "n": 40}]
    assert Settings().pool_of_document({"prompt_template": "x"}) == "default"
