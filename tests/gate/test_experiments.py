"""A/B tests of prompt versions (SPEC F3, docs/quality.md "A/B tests"), on every backend:
real workers split the tasks that follow the live version by a stable per-task hash
(retries keep their arm; pinned references and labels are not split; nothing is split
after the end or once the live pointer moved), and ``conclude`` promotes only when the
rule holds, with its figures from the quality rollups."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy import event
from typer.testing import CliRunner

from lockgate.app import Lockgate
from lockgate.cli import app
from lockgate.config import Settings
from lockgate.errors import LockgateError, NotFound, SpecError, StateConflict
from lockgate.registry.api import Prompts
from lockgate.registry.experiments import in_candidate_arm, parse_share
from lockgate.registry.resolver import PromptResolver, load
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store

from .support import BackgroundWorker, Env, LocalProvider, drive, items, rows, scalar, wait_for

MODEL = {"name": "sim-small", "temperature": 0, "timeout_ms": 20_000}
RULE = {"format": "json", "required_keys": ["label", "reason"],
        "fallback_values": {"reason": "-"}, "on_invalid": "fallback"}
_ASK = "If the text mentions refund then label = yes\nOtherwise label = no"
#: Asks for both fields the rule expects: complete answers (completeness 1).
FULL = [{"role": "system", "content": 'Reply with JSON like {{"label": "yes", "reason": '
                                      '"text"}}.\nlabel: one of yes, no\n' + _ASK},
        {"role": "user", "content": "<input>\n{text}\n</input>"}]
#: Asks for the label only (completeness 0.5, the reason filled by the fallback), with
#: a long preamble: more tokens per task than FULL.
HALF = [{"role": "system", "content": "Read the customer's message below carefully. " * 40
         + '\nReply with JSON like {{"label": "yes"}}.\n'
         f"label: one of yes, no\n{_ASK}"},
        {"role": "user", "content": "<input>\n{text}\n</input>"}]
#: Another complete version (for tests where quality does not matter).
FULL_TOO = [{"role": "system", "content": FULL[0]["content"] + "\nBe brief."}, FULL[1]]


@pytest.fixture
def lg(db_url: str, store: Store) -> Iterator[Lockgate]:
    handle = Lockgate(db_url, settings=Settings())
    try:
        yield handle
    finally:
        handle.close()


def _prompt(lg: Lockgate, live: list[dict[str, str]], name: str = "p") -> None:
    """Prompt ``name`` (v1 = ``live``) with a dataset bound, so versions can be proposed."""
    lg.prompts.create(name, live, model_config=MODEL, delivery_rule=RULE)
    lg.datasets.add(f"{name}-set", items(8, name))
    lg.gate.bind(name, f"{name}-set", thresholds=["accuracy>=0"], comparison="label:label")


def _candidate(lg: Lockgate, template: list[dict[str, str]], name: str = "p") -> int:
    """A version of ``name`` that is not live: proposed, then withdrawn before the gate
    decided (the gate refused nothing)."""
    p = lg.prompts.propose(name, template)
    lg.gate.cancel(p.update_id, reason="tested as an A/B candidate instead")
    return p.version


def _tasks(prefix: str, n: int, ref: str = "p", retries: int = 0) -> list[Any]:
    return [parse_task({"task_id": f"{prefix}-{i:05d}", "prompt_template": f"@registry:{ref}",
                        "input_data": {"text": f"order {i}: please refund me"},
                        "retry_policy": {"max_retries": retries, "base_delay_ms": 10}})
            for i in range(n)]


def _run(store: Store, batches: dict[str, list[Any]]) -> None:
    """Submit the batches and run them to the end with a real worker."""
    for batch, tasks in batches.items():
        store.submit(tasks, batch_id=batch)
    worker = BackgroundWorker(store, concurrency=64)
    try:
        wait_for(lambda: not scalar(store, "SELECT COUNT(*) FROM task WHERE status = "
                                           "'PENDING'"), "every task done", timeout=240)
    finally:
        worker.stop()


def _versions(store: Store, batch: str) -> dict[str, set[str]]:
    """Per task of ``batch``, the versions its attempts ran."""
    out: dict[str, set[str]] = {}
    for r in rows(store, "SELECT t.task_id, a.prompt_version FROM task_attempt a JOIN task t "
                         "ON t.id = a.task_pk WHERE t.batch_id = :b", b=batch):
        out.setdefault(r["task_id"], set()).add(r["prompt_version"])
    return out


def _attempts_per_task(store: Store, batch: str) -> list[int]:
    return [int(r["n"]) for r in rows(
        store, "SELECT COUNT(*) AS n FROM task_attempt a JOIN task t ON t.id = a.task_pk "
               "WHERE t.batch_id = :b GROUP BY t.id", b=batch)]


# -- the split --------------------------------------------------------------------------------


def test_the_split_follows_the_share_and_each_task_keeps_its_arm(
        lg: Lockgate, store: Store, simulator: SimulatorProcess) -> None:
    simulator.configure(rate_500=0.25, seed=11)  # some calls fail, their tasks retry
    _prompt(lg, FULL)
    cand = _candidate(lg, FULL_TOO)
    lg.prompts.label("p", "canary", 1)
    e = lg.prompts.start_experiment("p", cand, share="10%", duration="72h")
    assert (e["control_version"], e["candidate_version"], e["share_bp"]) == (1, cand, 1000)
    n = 2000
    _run(store, {"live": _tasks("t", n, retries=8),
                 "prod": _tasks("q", 200, "p@production", retries=8),
                 "pinned": _tasks("u", 200, "p@1", retries=8),
                 "label": _tasks("w", 200, "p@canary", retries=8)})
    assert scalar(store, "SELECT COUNT(*) FROM task WHERE status <> 'SUCCEEDED'") == 0
    assert max(_attempts_per_task(store, "live")) > 1, "some tasks were retried"
    ran = _versions(store, "live")
    assert len(ran) == n and all(len(v) == 1 for v in ran.values()), \
        "every attempt of a task ran the same version"
    for task_id, versions in ran.items():  # the arm is the hash's, exactly
        want = cand if in_candidate_arm(e["id"], task_id, 1000) else 1
        assert versions == {f"p@{want}"}, task_id
    taken = sum(1 for v in ran.values() if v == {f"p@{cand}"})
    sd = math.sqrt(n * 0.1 * 0.9)
    assert abs(taken - n * 0.1) < 6 * sd, taken
    prod = _versions(store, "prod")
    assert {v for vs in prod.values() for v in vs} == {"p@1", f"p@{cand}"}, \
        "NAME@production follows the live version: split too"
    for batch in ("pinned", "label"):
        assert {v for vs in _versions(store, batch).values() for v in vs} == {"p@1"}, batch


def test_no_split_after_the_end(lg: Lockgate, store: Store,
                                simulator: SimulatorProcess) -> None:
    _prompt(lg, FULL)
    cand = _candidate(lg, FULL_TOO)
    e = lg.prompts.start_experiment("p", cand, share="50%", duration="1s")
    wait_for(lambda: store.db_now() > e["ends_at"], "the experiment's end")
    _run(store, {"late": _tasks("t", 200)})
    assert {v for vs in _versions(store, "late").values() for v in vs} == {"p@1"}
    assert lg.prompts.experiment_status("p")["status"] == "RUNNING", \
        "it awaits a conclusion; only the split ended"


def test_no_split_once_a_rollback_moved_the_live_version(
        lg: Lockgate, store: Store, simulator: SimulatorProcess) -> None:
    _prompt(lg, FULL)
    assert drive(Env(store), lg.prompts.propose("p", FULL_TOO).update_id,
                 provider=LocalProvider()) == "ACTIVATED"
    cand = _candidate(lg, HALF)
    lg.prompts.start_experiment("p", cand, share="50%")
    _run(store, {"before": _tasks("b", 200)})
    assert {v for vs in _versions(store, "before").values() for v in vs} == \
        {"p@2", f"p@{cand}"}
    lg.prompts.rollback("p", to=1, reason="bad answers")
    _run(store, {"after": _tasks("a", 200)})
    assert {v for vs in _versions(store, "after").values() for v in vs} == {"p@1"}
    with pytest.raises(StateConflict, match="not the control v2"):
        lg.prompts.conclude_experiment("p", min_tasks=1)
    assert lg.prompts.stop_experiment("p")["status"] == "STOPPED"


def test_the_split_rides_on_the_pointer_refresh(lg: Lockgate, store: Store) -> None:
    """One read of the pointer and its test per refresh, none per task; the end is
    applied on the resolver's clock without another read."""
    _prompt(lg, FULL)
    cand = _candidate(lg, FULL_TOO)
    e = lg.prompts.start_experiment("p", cand, share="25%", duration="1h")
    now = [0.0]
    resolver = PromptResolver(store, refresh_s=10**6, clock=lambda: now[0])
    entry = load("h", {"prompt_template": "@registry:p", "retry_policy": {}})
    reads: list[str] = []
    event.listen(store.engine, "before_cursor_execute",
                 lambda *args: reads.append(args[2]) if "prompt" in args[2] else None)

    def versions(ids: list[str]) -> list[str | None]:
        return [asyncio.run(resolver.resolve(entry, task_id=t))[1] for t in ids]

    ids = [f"t-{i}" for i in range(1000)]
    ran = versions(ids)
    assert ran == [f"p@{cand}" if in_candidate_arm(e["id"], t, 2500) else "p@1" for t in ids]
    assert sum("experiment" in r for r in reads) == 1 and resolver.checks == 1, reads
    first = len(reads)  # the pointer with its test, and the two versions (cached after)
    assert asyncio.run(resolver.resolve(entry))[1] == "p@1", "no task id: never split"
    now[0] = 3601.0  # past the end, on the clock the read was timed by
    assert set(versions(ids)) == {"p@1"} and resolver.checks == 1
    assert len(reads) == first, "nothing read per task"


# -- concluding --------------------------------------------------------------------------------


def test_conclude_promotes_a_more_complete_cheaper_candidate_and_rollback_undoes_it(
        lg: Lockgate, store: Store, simulator: SimulatorProcess) -> None:
    _prompt(lg, HALF)
    cand = _candidate(lg, FULL)
    generation = lg.prompts.registry.prompt("p")["generation"]
    lg.prompts.start_experiment("p", f"v{cand}", share="0.5", actor="alice")
    _run(store, {"ab": _tasks("t", 400)})
    now = lg.prompts.experiment_status("p", min_tasks=50)
    assert now["status"] == "RUNNING" and now["decision"]["verdict"] == "promote"
    e = lg.prompts.conclude_experiment("p", min_tasks=50, actor="alice")
    assert e["status"] == "PROMOTED" and e["concluded_at"] is not None
    arms = e["decision"]["arms"]
    assert arms["control"]["version"] == "p@1" and arms["candidate"]["version"] == f"p@{cand}"
    assert arms["control"]["completeness"] == pytest.approx(0.5)
    assert arms["candidate"]["completeness"] == pytest.approx(1.0)
    assert arms["control"]["tasks"] + arms["candidate"]["tasks"] == 400
    assert e["decision"]["basis"] == "tokens", "no prices configured: tokens per task"
    info = lg.prompts.registry.prompt("p")
    assert (info["live_version"], info["generation"]) == (cand, generation + 1)
    audit = lg.prompts.history("p")["audit"]
    assert [(a["action"], a["from_version"], a["to_version"], a["actor"])
            for a in audit[-2:]] == [("experiment", 1, cand, "alice"),
                                     ("promote", 1, cand, "alice")]
    assert lg.prompts.experiment_status("p")["decision"] == e["decision"], "stored"
    assert lg.prompts.rollback("p")["to"] == 1, "a rollback undoes a promotion"


def test_conclude_keeps_the_control_when_the_candidate_is_less_complete(
        lg: Lockgate, store: Store, simulator: SimulatorProcess) -> None:
    _prompt(lg, FULL)
    cand = _candidate(lg, HALF)
    lg.prompts.start_experiment("p", cand, share="50%")
    _run(store, {"ab": _tasks("t", 300)})
    e = lg.prompts.conclude_experiment("p", min_tasks=50)
    assert e["status"] == "KEPT" and e["decision"]["verdict"] == "keep"
    assert "short of" in e["decision"]["why"]
    assert lg.prompts.registry.prompt("p")["live_version"] == 1
    assert lg.prompts.history("p")["audit"][-1]["action"] == "experiment-keep"


def test_conclude_refuses_under_min_tasks_unless_stopped(
        lg: Lockgate, store: Store, simulator: SimulatorProcess) -> None:
    _prompt(lg, HALF)
    cand = _candidate(lg, FULL)
    lg.prompts.start_experiment("p", cand, share="50%")
    _run(store, {"ab": _tasks("t", 40)})
    with pytest.raises(StateConflict, match=r"too few finished tasks.*needs 100") as caught:
        lg.prompts.conclude_experiment("p")
    counts = lg.prompts.experiment_status("p")["decision"]["arms"]
    assert (f"the control has {counts['control']['tasks']}, the candidate "
            f"{counts['candidate']['tasks']}") in str(caught.value)
    assert counts["control"]["tasks"] + counts["candidate"]["tasks"] == 40
    assert lg.prompts.experiment_status("p")["status"] == "RUNNING"
    e = lg.prompts.conclude_experiment("p", stop=True)
    assert e["status"] == "STOPPED" and e["decision"]["verdict"] == "undecided"
    assert lg.prompts.registry.prompt("p")["live_version"] == 1


# -- starting and stopping ----------------------------------------------------------------------


def test_one_running_experiment_per_prompt_and_stop_ends_it(lg: Lockgate) -> None:
    _prompt(lg, FULL)
    _prompt(lg, FULL, name="other")
    cand = _candidate(lg, FULL_TOO)
    first = lg.prompts.start_experiment("p", cand)
    with pytest.raises(StateConflict, match="running already"):
        lg.prompts.start_experiment("p", cand, share="1%")
    lg.prompts.start_experiment("other", _candidate(lg, HALF, "other"))  # another prompt
    stopped = lg.prompts.stop_experiment("p", reason="enough")
    assert stopped["status"] == "STOPPED" and stopped["id"] == first["id"]
    with pytest.raises(NotFound, match="no A/B test running"):
        lg.prompts.stop_experiment("p")
    again = lg.prompts.start_experiment("p", cand, share=0.02, duration="1d")
    assert again["ends_at"] - again["started_at"] == 86_400_000
    assert [(x["prompt"], x["status"]) for x in lg.prompts.experiments()] == [
        ("other", "RUNNING"), ("p", "STOPPED"), ("p", "RUNNING")]
    assert [x["id"] for x in lg.prompts.experiments("p")] == [first["id"], again["id"]]


@pytest.mark.parametrize(("share", "said"), [
    ("0", "above 0 and at most 50%"), ("0%", "above 0 and at most 50%"),
    ("60%", "above 0 and at most 50%"), (0.51, "above 0 and at most 50%"),
    ("-5%", "not a share"), ("five", "not a share"), ("5 %%", "not a share"),
    ("0.125%", "kept to 0.01%"),
])
def test_a_share_out_of_range_is_refused_naming_the_bound(lg: Lockgate, share: Any,
                                                          said: str) -> None:
    _prompt(lg, FULL)
    cand = _candidate(lg, FULL_TOO)
    with pytest.raises(SpecError, match=said) as caught:
        lg.prompts.start_experiment("p", cand, share=share)
    assert caught.value.field == "share"
    assert lg.prompts.experiments("p") == []


@pytest.mark.parametrize("duration", ["5x", "0", "-1h", "1M", "PT5M"])
def test_a_bad_duration_is_refused(lg: Lockgate, duration: str) -> None:
    _prompt(lg, FULL)
    cand = _candidate(lg, FULL_TOO)
    with pytest.raises(SpecError) as caught:
        lg.prompts.start_experiment("p", cand, duration=duration)
    assert caught.value.field == "for"


def test_mistaken_versions_are_named(lg: Lockgate) -> None:
    _prompt(lg, FULL)
    with pytest.raises(NotFound, match="no version 9"):
        lg.prompts.start_experiment("p", 9)
    with pytest.raises(NotFound, match="no label or tag 'nope'"):
        lg.prompts.start_experiment("p", "nope")
    with pytest.raises(StateConflict, match="is the live version"):
        lg.prompts.start_experiment("p", "v1")
    with pytest.raises(NotFound, match="no prompt 'missing'"):
        lg.prompts.start_experiment("missing", 1)
    pending = lg.prompts.propose("p", FULL_TOO)
    with pytest.raises(StateConflict, match=f"still being evaluated.*update "
                                            f"{pending.update_id}"):
        lg.prompts.start_experiment("p", pending.version)
    lg.gate.bind("p", "p-set", thresholds=["accuracy>=0.9"], comparison="label:label")
    rejected = lg.prompts.propose("p", HALF)
    assert drive(Env(lg.store), rejected.update_id, provider=LocalProvider()) == "REJECTED"
    with pytest.raises(StateConflict, match=r"REJECTED by the release gate.*no production "
                                            r"traffic"):
        lg.prompts.start_experiment("p", rejected.version)
    assert lg.prompts.experiments("p") == []


def test_figures_need_the_quality_loop(lg: Lockgate, store: Store) -> None:
    _prompt(lg, FULL)
    lg.prompts.start_experiment("p", _candidate(lg, FULL_TOO))
    alone = Prompts(store, Settings())  # the registry without the quality loop above it
    with pytest.raises(LockgateError, match="quality rollups"):
        alone.experiment_status("p")


# -- the hash and the share (pure) ---------------------------------------------------------------


@pytest.mark.parametrize(("text", "bp"), [("5%", 500), ("0.05", 500), ("50%", 5000),
                                          (" 2.5 % ", 250), (".3", 3000), ("0.01%", 1),
                                          (0.05, 500)])
def test_shares_are_read_exactly(text: Any, bp: int) -> None:
    assert parse_share(text) == bp


@given(st.integers(1, 10**9), st.text(min_size=1, max_size=40), st.integers(1, 4999))
def test_a_task_in_the_arm_stays_in_it_at_any_larger_share(experiment: int, task: str,
                                                          bp: int) -> None:
    if in_candidate_arm(experiment, task, bp):
        assert in_candidate_arm(experiment, task, bp + 1)
        assert in_candidate_arm(experiment, task, 5000)
    assert in_candidate_arm(experiment, task, bp) == in_candidate_arm(experiment, task, bp)


# -- the command line ---------------------------------------------------------------------------


def test_commands_start_status_conclude_list(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("LOCKGATE_DATABASE_URL", url)
    with Lockgate(url, settings=Settings()) as handle:
        _prompt(handle, FULL)
        cand = _candidate(handle, FULL_TOO)
    runner = CliRunner()

    def run(*args: str, code: int = 0) -> str:
        res = runner.invoke(app, ["prompt", "experiment", *args])
        assert res.exit_code == code, f"{args}: exit {res.exit_code}\n{res.output}"
        return res.output

    assert "--share: '60%'" in run("start", "p", "--version", str(cand), "--share", "60%",
                                   code=2)
    assert "--for:" in run("start", "p", "--version", str(cand), "--for", "soon", code=2)
    said = run("start", "p", "--version", f"v{cand}", "--share", "5%", "--for", "2h")
    assert f"runs v{cand} on 5% of the live traffic (control v1)" in said
    status = run("status", "p")
    assert "RUNNING" in status and "verdict now: undecided" in status
    assert '"share_bp": 500' in run("status", "p", "--json")
    assert "too few finished tasks" in run("conclude", "p", code=2)
    assert "STOPPED" in run("conclude", "p", "--stop")
    assert "STOPPED" in run("list", "p")
