"""The prompt registry on every backend: versions, labels, rollback and its audit trail,
datasets and their revisions, and what a worker runs for a registry reference."""

from __future__ import annotations

import pytest

from lockgate.errors import NotFound, SpecError, StateConflict
from lockgate.registry.resolver import Entry, PromptResolver, load
from lockgate.spec import parse_task
from lockgate.store import Store

from .support import (
    BAD,
    DELIVERY,
    GOOD,
    MEDIOCRE,
    MODEL,
    Env,
    LocalProvider,
    drive,
    items,
    rows,
    run_worker,
)


def test_versions_are_immutable_and_content_addressed(env: Env) -> None:
    v1 = env.prompts.create("p", MEDIOCRE, model_config=MODEL, delivery_rule=DELIVERY,
                            tag="prompt-v1.0.0", note="first")
    assert (v1.version, v1.ref, env.live()) == (1, "p@1", 1)
    with pytest.raises(StateConflict, match="already exists"):
        env.prompts.create("p", GOOD, model_config=MODEL)
    env.datasets.add("d", items(8))
    env.gate.bind("p", "d", thresholds=["accuracy>=0"], comparison="label:label")
    with pytest.raises(StateConflict, match="already live"):
        env.prompts.propose("p")  # nothing changed
    a = env.prompts.propose("p", GOOD, tag="prompt-v1.1.0")
    b = env.prompts.propose("p", GOOD)  # same content: the same version, re-proposed
    assert (a.version, a.new_version, b.version, b.new_version) == (2, True, 2, False)
    with pytest.raises(StateConflict, match=r"tag 'prompt-v1\.0\.0' already names version 1"):
        env.prompts.propose("p", BAD, tag="prompt-v1.0.0")
    c = env.prompts.propose("p", model_config={**MODEL, "temperature": 0.5})
    assert c.version == 3  # a model-config change is a new version too
    assert env.prompts.version("p", "prompt-v1.1.0").version == 2
    assert env.prompts.version("p", "v1").template == v1.template
    assert env.prompts.version("p").version == 1  # live: nothing activated yet
    assert env.prompts.resolve("p@2").version == 2
    hist = env.prompts.history("p")
    assert [v.version for v in hist["versions"]] == [1, 2, 3]
    assert [(r["action"], r["update_id"]) for r in hist["audit"]] == [
        ("create", None), ("propose", a.update_id), ("cancel", a.update_id),
        ("propose", b.update_id), ("cancel", b.update_id), ("propose", c.update_id)]
    assert "-If the text mentions refund then" in env.prompts.diff("p", 1, 2)
    shown = env.prompts.show("p", "prompt-v1.0.0")
    assert shown["version"].note == "first" and "[model_config]" in shown["text"]
    with pytest.raises(NotFound):
        env.prompts.version("p", 9)
    with pytest.raises(NotFound):
        env.prompts.version("p", "no-such-tag")
    with pytest.raises(SpecError):
        env.prompts.create("bad name", GOOD, model_config=MODEL)


def test_labels_point_at_versions_and_production_is_the_live_version(env: Env) -> None:
    env.setup(thresholds=["accuracy>=0"])
    p = env.prompts.propose("p", GOOD)
    drive(env, p.update_id)
    assert env.prompts.label("p", "canary", 1) is None
    assert env.prompts.label("p", "canary", "v2", reason="try") == 1
    assert env.prompts.resolve("p@canary").version == 2
    assert env.prompts.resolve("p@production").version == env.live() == 2
    with pytest.raises(StateConflict, match="production"):
        env.prompts.label("p", "production", 1)
    with pytest.raises(SpecError):
        env.prompts.label("p", "9lives", 1)
    with pytest.raises(NotFound):
        env.prompts.resolve("p@nolabel")
    audit = env.prompts.history("p")["audit"]
    assert [(r["action"], r["label"], r["from_version"], r["to_version"])
            for r in audit if r["action"] == "label"] == [("label", "canary", None, 1),
                                                          ("label", "canary", 1, 2)]


def test_rollback_is_an_audited_compare_and_swap_to_a_version_that_was_live(env: Env) -> None:
    env.setup(thresholds=["accuracy>=0"])
    for tpl in (GOOD, BAD):
        drive(env, env.prompts.propose("p", tpl).update_id)
    assert env.live() == 3
    gen = env.prompts.registry.prompt("p")["generation"]
    r = env.prompts.rollback("p", reason="bad labels", actor="alice")
    assert (r["from"], r["to"], r["generation"]) == (3, 2, gen + 1)
    assert env.live() == 2
    env.prompts.rollback("p", to=1, actor="bob")
    assert env.live() == 1
    with pytest.raises(StateConflict, match="already live"):
        env.prompts.rollback("p", to=1)
    env.prompts.propose("p", yes_no_never_live())
    with pytest.raises(StateConflict, match="was never live"):
        env.prompts.rollback("p", to=4)
    audit = [r for r in env.prompts.history("p")["audit"] if r["action"] == "rollback"]
    assert [(r["from_version"], r["to_version"], r["actor"], r["reason"]) for r in audit] == [
        (3, 2, "alice", "bad labels"), (2, 1, "bob", None)]
    assert all(r["created_at"] > 0 for r in audit)
    # without --to: back to the version live before the last change (here: undo)
    assert env.prompts.rollback("p")["to"] == 2


def yes_no_never_live() -> list[dict[str, str]]:
    from .support import yes_no

    return yes_no("nothing")


def test_first_rollback_without_history_is_refused(env: Env) -> None:
    env.setup()
    with pytest.raises(StateConflict, match="no earlier live version"):
        env.prompts.rollback("p")


def test_dataset_revisions_are_immutable_snapshots(env: Env) -> None:
    r1 = env.datasets.add("d", items(4))
    hash1 = env.datasets.show("d")["items_hash"]
    assert (r1["revision"], r1["added"], r1["items"]) == (1, 4, 4)
    again = env.datasets.add("d", items(4))
    assert (again["revision"], again["unchanged"]) == (1, 4)  # idempotent: no new revision
    changed = items(4)
    changed[0]["expected"] = "no"
    r2 = env.datasets.add("d", changed[:3], replace=True)
    assert (r2["revision"], r2["changed"], r2["retired"], r2["items"]) == (2, 1, 1, 3)
    old = env.datasets.items("d", revision=1)
    new = env.datasets.items("d")
    assert [i["expected"] for i in old] == ["yes", "yes", "no", "no"]
    assert sorted(i["id"] for i in new) == ["i-0000", "i-0001", "i-0002"]
    assert {i["id"]: i["expected"] for i in new}["i-0000"] == "no"
    info = env.datasets.show("d", limit=2)
    assert info["input_keys"] == ["text"] and len(info["sample"]) == 2
    assert info["items_hash"] != hash1 and len(hash1) == 64
    with pytest.raises(StateConflict, match="twice"):
        env.datasets.add("d", items(2) + items(1))
    with pytest.raises(NotFound):
        env.datasets.show("missing")


def test_resolver_checks_the_pointer_at_most_every_refresh_interval(env: Env) -> None:
    env.setup(thresholds=["accuracy>=0"])
    now = [0.0]
    resolver = PromptResolver(env.store, refresh_s=1.0, clock=lambda: now[0])
    live = load("h-live", {"prompt_template": "@registry:p",
                           "retry_policy": {}, "model_config": {"name": "other"}})
    pinned = load("h-pin", {"prompt_template": "@registry:p@1", "retry_policy": {}})

    import asyncio

    def resolve(entry: Entry, h: str) -> tuple[str, str]:
        config, version = asyncio.run(resolver.resolve(entry))
        return config.model.name, str(version)

    assert resolve(live, "h-live") == ("other", "p@1")  # the task's model overrides
    assert resolve(pinned, "h-pin") == ("sim-small", "p@1")
    drive(env, env.prompts.propose("p", GOOD).update_id)
    now[0] = 0.5
    assert resolve(live, "h-live")[1] == "p@1"  # cached: within the refresh interval
    now[0] = 1.01
    assert resolve(live, "h-live")[1] == "p@2"
    assert resolve(pinned, "h-pin")[1] == "p@1"
    assert resolver.checks == 2
    missing = load("h-x", {"prompt_template": "@registry:nope", "retry_policy": {}})
    with pytest.raises(NotFound):
        resolve(missing, "h-x")


def test_worker_runs_registry_references_and_traces_the_version(env: Env, store: Store) -> None:
    env.setup(thresholds=["accuracy>=0"])
    tasks = [parse_task({"task_id": f"t{i}", "prompt_template": ref,
                         "input_data": {"text": "please refund me"}})
             for i, ref in enumerate(["@registry:p", "@registry:p@1", "@registry:nope",
                                      "@registry:p@7"])]
    tasks.append(parse_task({"task_id": "t9", "prompt_template": "@registry:p",
                             "input_data": {"wrong": "x"}}))
    store.submit(tasks, batch_id="refs")
    run_worker(store, gate=False, provider=LocalProvider())
    got = {r["task_id"]: r for r in rows(
        store, "SELECT t.task_id, t.status, t.result, t.error_message, a.prompt_version "
               "FROM task t JOIN task_attempt a ON a.task_pk = t.id")}
    assert got["t0"]["status"] == "SUCCEEDED" and got["t0"]["prompt_version"] == "p@1"
    assert got["t0"]["result"] == '{"label":"yes"}'
    assert got["t1"]["prompt_version"] == "p@1"
    assert got["t2"]["status"] == "FAILED" and "no prompt 'nope'" in got["t2"]["error_message"]
    assert got["t3"]["status"] == "FAILED" and "no version 7" in got["t3"]["error_message"]
    assert got["t9"]["status"] == "FAILED"  # the placeholder has no value: render error
