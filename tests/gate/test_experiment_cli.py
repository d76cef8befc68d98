"""What the A/B test and ``prompt create`` commands print (docs/quality.md "A/B tests",
docs/gate.md): the arms table at any width names both arms and their versions, control
first; ``stop`` names the version that is live; ``create`` says first what is really
wrong (a missing file, a prompt that exists) before asking for --model-config."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from lockgate.app import Lockgate
from lockgate.cli import app
from lockgate.config import Settings

from .support import GOOD, Env, drive

FIGURES = ("tasks", "completeness", "conformance", "cost/task", "tokens/task", "errors",
           "p95 ms")


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    """Registry and gate APIs on a SQLite file the commands read through
    LOCKGATE_DATABASE_URL."""
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("LOCKGATE_DATABASE_URL", url)
    with Lockgate(url, settings=Settings()) as handle:
        yield Env(handle.store)


def lockgate(*args: str, code: int = 0, columns: int | None = None) -> Result:
    res = CliRunner().invoke(app, list(args),
                             env={"COLUMNS": str(columns)} if columns else None)
    assert res.exit_code == code, f"{args}: exit {res.exit_code}\n{res.output}"
    return res


@pytest.mark.parametrize("columns", [80, 60])
def test_a_narrow_terminal_shows_both_arms_and_versions_control_first(
        env: Env, columns: int) -> None:
    """At 80 columns the seven figure columns squeezed the arm and version columns to
    nothing (rows began │││), so control and candidate could not be told apart; and a
    concluded test listed the candidate first."""
    env.setup("complaints", thresholds=["accuracy>=0"])
    cand = env.prompts.propose("complaints", GOOD)
    env.gate.cancel(cand.update_id, reason="tested as an A/B candidate instead")
    lockgate("prompt", "experiment", "start", "complaints", "--version", str(cand.version))
    running = lockgate("prompt", "experiment", "status", "complaints",
                       columns=columns).stdout
    lockgate("prompt", "experiment", "conclude", "complaints", "--stop")
    ended = lockgate("prompt", "experiment", "status", "complaints", columns=columns).stdout
    for text in (running, ended):
        assert "…" not in text and "│││" not in text, text
        assert max(len(line) for line in text.splitlines()) <= columns, text
        words = text.replace("│", " ").replace("┃", " ").split()
        assert "complaints@1" in words and f"complaints@{cand.version}" in words, text
        for header in FIGURES:
            assert header in text, f"{header!r} cut:\n{text}"
        control, candidate = words.index("control"), words.index("candidate")
        assert control < candidate, f"control first:\n{text}"
        # each version stands with its arm: the control's before the candidate's
        assert words.index("complaints@1") < words.index(f"complaints@{cand.version}")


def test_a_wide_terminal_keeps_one_row_per_arm(env: Env) -> None:
    env.setup("complaints", thresholds=["accuracy>=0"])
    cand = env.prompts.propose("complaints", GOOD)
    env.gate.cancel(cand.update_id, reason="tested as an A/B candidate instead")
    lockgate("prompt", "experiment", "start", "complaints", "--version", str(cand.version))
    lockgate("prompt", "experiment", "conclude", "complaints", "--stop")
    text = lockgate("prompt", "experiment", "status", "complaints", columns=200).stdout
    rows = [line.replace("│", " ").split() for line in text.splitlines()]
    header = ["arm", "version", *" ".join(FIGURES).split()]
    assert any(r == header for r in (line.replace("┃", " ").split()
                                     for line in text.splitlines())), text
    arms = [r[:3] for r in rows if r[:1] in (["control"], ["candidate"])]
    assert arms == [["control", "complaints@1", "0"],
                    ["candidate", f"complaints@{cand.version}", "0"]], text


def test_stop_after_a_rollback_names_the_live_version(env: Env) -> None:
    """``stop`` said "live stays v2" (the control) after a rollback made v1 live."""
    env.setup(thresholds=["accuracy>=0"])
    assert drive(env, env.prompts.propose("p", GOOD).update_id) == "ACTIVATED"
    assert env.live() == 2
    lockgate("prompt", "experiment", "start", "p", "--version", "1", "--share", "10%")
    lockgate("prompt", "rollback", "p", "--reason", "test")
    assert env.live() == 1
    said = " ".join(lockgate("prompt", "experiment", "stop", "p").output.split())
    assert "STOPPED; live stays v1" in said and "live stays v2" not in said, said
    assert said.endswith("(the control, v2, is no longer live)"), said


def test_stop_names_the_control_while_it_is_live(env: Env) -> None:
    env.setup(thresholds=["accuracy>=0"])
    cand = env.prompts.propose("p", GOOD)
    env.gate.cancel(cand.update_id, reason="tested as an A/B candidate instead")
    lockgate("prompt", "experiment", "start", "p", "--version", str(cand.version))
    said = " ".join(lockgate("prompt", "experiment", "stop", "p").output.split())
    assert said.endswith("STOPPED; live stays v1"), said


def test_create_names_an_existing_prompt_before_the_model_config(
        env: Env, tmp_path: Path) -> None:
    """Without --model-config ``create`` of an existing prompt asked for it "for a new
    prompt"; the real reason (it exists: propose) appeared only once it was given."""
    text = tmp_path / "c1.txt"
    text.write_text("v1 {text}\n")
    lockgate("prompt", "create", "p", "-f", str(text), "--model-config", '{"name": "m"}')
    given = lockgate("prompt", "create", "p", "-f", str(text), "--model-config",
                     '{"name": "m"}', code=2)
    bare = lockgate("prompt", "create", "p", "-f", str(text), code=2)
    for res in (given, bare):
        said = " ".join(res.output.split())
        assert "prompt 'p' already exists; change it with `lockgate prompt propose`" in said
        assert "--model-config" not in said


def test_create_names_a_missing_file_before_the_model_config(
        env: Env, tmp_path: Path) -> None:
    said = " ".join(lockgate("prompt", "create", "q", "-f", str(tmp_path / "nosuch.txt"),
                             code=2).output.split())
    assert "nosuch.txt" in said and "--model-config" not in said, said


def test_create_still_asks_for_the_model_config_of_a_new_prompt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new prompt without --model-config is refused as before, and the database it
    would have been created in is not made."""
    db = tmp_path / "new.db"
    monkeypatch.setenv("LOCKGATE_DATABASE_URL", f"sqlite:///{db}")
    text = tmp_path / "c1.txt"
    text.write_text("v1 {text}\n")
    said = " ".join(lockgate("prompt", "create", "q", "-f", str(text), code=2)
                    .output.split())
    assert "--model-config is required for a new prompt" in said, said
    assert not db.exists()
