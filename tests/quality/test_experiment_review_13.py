"""An A/B test that can no longer split the traffic says so (docs/quality.md "A/B
tests"): once a rollback moved the live version away from the control, or once its time
(``--for``) is up, ``status`` (the CLI and the Python API's ``splitting`` and
``split_reason``) and ``list`` said RUNNING as if tasks still reached the candidate, and
``conclude`` answered "too few finished tasks ... let it run longer", naming the moved
control only under ``--min-tasks 1``, and advising a wait that adds no candidate task."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from gate.support import GOOD, MEDIOCRE, Env, LocalProvider, drive, run_worker, wait_for
from lockgate.app import Lockgate
from lockgate.cli import app
from lockgate.config import Settings
from lockgate.errors import StateConflict
from lockgate.spec import parse_task
from lockgate.store import Store

BETTER = [{"role": "system", "content": GOOD[0]["content"] + "\nBe brief."}, GOOD[1]]


@pytest.fixture
def lg(db_url: str, store: Store) -> Iterator[Lockgate]:
    handle = Lockgate(db_url, settings=Settings())
    try:
        yield handle
    finally:
        handle.close()


def _candidate(env: Env, template: list[dict[str, str]]) -> int:
    """A version that is not live: proposed, then withdrawn before the gate decided."""
    p = env.prompts.propose("p", template)
    env.gate.cancel(p.update_id, reason="tested as an A/B candidate instead")
    return p.version


def _control_v2(env: Env) -> int:
    """Prompt ``p`` with v2 live (through the gate, so v1 is there to roll back to) and
    a candidate v3."""
    env.setup(live=MEDIOCRE, thresholds=["accuracy>=0"])
    assert drive(env, env.prompts.propose("p", GOOD).update_id,
                 provider=LocalProvider()) == "ACTIVATED"
    return _candidate(env, BETTER)


def _tasks(prefix: str, n: int) -> list[Any]:
    return [parse_task({"task_id": f"{prefix}-{i:04d}", "prompt_template": "@registry:p",
                        "input_data": {"text": f"order {i}: please refund me"}})
            for i in range(n)]


def test_a_rollback_suspends_the_split_and_conclude_names_it_first(lg: Lockgate) -> None:
    env = Env(lg.store)
    cand = _control_v2(env)
    lg.prompts.start_experiment("p", cand, share="30%", duration="1h")
    running = lg.prompts.experiment_status("p")
    assert (running["splitting"], running["split_reason"]) == (True, None)
    assert lg.prompts.experiments("p")[-1]["splitting"] is True

    lg.prompts.rollback("p", to=1, reason="bad answers")
    with pytest.raises(StateConflict, match="not the control v2") as caught:
        lg.prompts.conclude_experiment("p")  # default --min-tasks: no arm has enough
    assert "too few" not in str(caught.value) and "run longer" not in str(caught.value)
    assert "experiment stop p" in str(caught.value)

    e = lg.prompts.experiment_status("p")
    assert e["status"] == "RUNNING" and e["splitting"] is False
    assert "live version of 'p' is v1 now, not the control v2" in e["split_reason"]
    listed = lg.prompts.experiments("p")[-1]
    assert (listed["splitting"], listed["split_reason"]) == (False, e["split_reason"])
    stopped = lg.prompts.conclude_experiment("p", stop=True)
    assert stopped["status"] == "STOPPED" and stopped["splitting"] is False
    assert stopped["decision"]["verdict"] == "undecided"
    assert "not the control v2" in stopped["decision"]["why"]
    assert lg.prompts.registry.prompt("p")["live_version"] == 1


def test_after_its_end_it_is_not_splitting_and_conclude_never_says_wait(
        lg: Lockgate) -> None:
    env = Env(lg.store)
    env.setup(live=MEDIOCRE, thresholds=["accuracy>=0"])
    cand = _candidate(env, GOOD)
    started = lg.prompts.start_experiment("p", cand, share="50%", duration="1s")
    wait_for(lambda: lg.store.db_now() > started["ends_at"], "the experiment's end")
    lg.store.submit(_tasks("late", 40), batch_id="late")
    run_worker(lg.store, gate=False, provider=LocalProvider())

    with pytest.raises(StateConflict, match="too few finished tasks") as caught:
        lg.prompts.conclude_experiment("p")
    said = str(caught.value)
    assert "the control has 40, the candidate 0" in said, said
    assert "run longer" not in said, said
    assert "lower --min-tasks" in said and "--stop" in said, said

    e = lg.prompts.experiment_status("p")
    assert e["status"] == "RUNNING" and e["splitting"] is False
    assert "time (--for) is up" in e["split_reason"]
    assert lg.prompts.experiments("p")[-1]["splitting"] is False
    assert lg.prompts.conclude_experiment("p", stop=True)["status"] == "STOPPED"


# -- the command line (SQLite) ------------------------------------------------------------


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("LOCKGATE_DATABASE_URL", url)
    with Lockgate(url, settings=Settings()) as handle:
        yield Env(handle.store)


def lockgate(*args: str, code: int = 0) -> Result:
    res = CliRunner().invoke(app, list(args), env={"COLUMNS": "200"})
    assert res.exit_code == code, f"{args}: exit {res.exit_code}\n{res.output}"
    return res


def _flat(res: Result) -> str:
    return " ".join(res.output.split())


def test_the_commands_say_a_rollback_suspended_the_split(cli_env: Env) -> None:
    cand = _control_v2(cli_env)
    lockgate("prompt", "experiment", "start", "p", "--version", str(cand), "--share", "30%")
    before = _flat(lockgate("prompt", "experiment", "status", "p"))
    assert "RUNNING v3" in before and "not splitting" not in before, before
    lockgate("prompt", "rollback", "p", "--reason", "x")
    said = _flat(lockgate("prompt", "experiment", "conclude", "p", code=2))
    assert "not the control v2" in said and "too few" not in said, said

    status = _flat(lockgate("prompt", "experiment", "status", "p"))
    assert "RUNNING (not splitting) v3 on 30% against v2" in status, status
    assert ("not splitting traffic: the live version of 'p' is v1 now, not the control v2"
            in status), status
    assert '"splitting": false' in lockgate("prompt", "experiment", "status", "p",
                                            "--json").output
    assert "RUNNING (not splitting)" in _flat(lockgate("prompt", "experiment", "list", "p"))


def test_the_commands_say_the_time_is_up(cli_env: Env) -> None:
    cli_env.setup(live=MEDIOCRE, thresholds=["accuracy>=0"])
    cand = _candidate(cli_env, GOOD)
    lockgate("prompt", "experiment", "start", "p", "--version", str(cand), "--for", "1s")
    ends = cli_env.store.db_now() + 1000
    wait_for(lambda: cli_env.store.db_now() > ends, "the experiment's end")
    said = _flat(lockgate("prompt", "experiment", "conclude", "p", code=2))
    assert "too few finished tasks" in said and "run longer" not in said, said
    status = _flat(lockgate("prompt", "experiment", "status", "p"))
    assert "RUNNING (not splitting)" in status and "time (--for) is up" in status, status
    assert "RUNNING (not splitting)" in _flat(lockgate("prompt", "experiment", "list"))
