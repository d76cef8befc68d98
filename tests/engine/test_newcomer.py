"""What a new user meets in the first hour, checked line by line: the version, help that
shows what it says, batch-level recovery, registry references checked at submit,
narrow terminals, and where a re-submitted file's tasks already are."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from lockgate.app import Lockgate
from lockgate.cli import app
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Finish, Store

from .support import tasks, write_jsonl


def lockgate(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def flat(text: str) -> str:
    return " ".join(text.split())


def test_version_and_help_say_what_they_mean() -> None:
    import lockgate as pkg

    assert lockgate("--version").stdout == f"lockgate {pkg.__version__}\n"
    help_text = flat(lockgate("worker", "--help").stdout)
    assert "[worker], [flow], [gate] and [runtime]" in help_text  # not eaten as markup
    assert "--lease DURATION" in help_text and "1h30m" in help_text
    assert "<bool>" not in help_text
    submit_help = flat(lockgate("submit", "--help").stdout)
    assert "--input-format FORMAT" in submit_help
    run_help = flat(lockgate("run", "--help").stdout)
    assert "--skip-invalid" in run_help and "--rejects FILE" in run_help
    sim = CliRunner().invoke(app, ["simulate", "--help"])
    assert sim.stdout.startswith("usage: lockgate simulate"), sim.stdout


def test_a_batch_is_recovered_at_once_from_the_command_line(
        db_url: str, store: Store) -> None:
    store.submit([parse_task(t) for t in tasks(4)], batch_id="b")
    claims = store.claim(4, lease_ms=60_000, worker_id="w")
    store.finish([Finish(id=c.id, lease_token=c.lease_token, status="DEAD",
                         error_class="connection_error" if i < 3 else "timeout",
                         attempt={"attempt": 1, "started_at": 0, "outcome": "dead"})
                  for i, c in enumerate(claims)], worker_id="w")
    r = lockgate("tasks", "retry", "--batch", "b", "--error-class", "connection_error",
                 "--db", db_url)
    assert r.exit_code == 0, r.output
    assert r.stderr == ("batch b: 3 FAILED or DEAD task(s) with error class "
                        "connection_error PENDING again\n")
    again = lockgate("tasks", "retry", "--batch", "b", "--status", "DEAD", "--db", db_url)
    assert again.stderr == "batch b: 1 DEAD task(s) PENDING again\n"
    assert lockgate("tasks", "retry", "--batch", "b", "--db", db_url).stderr == (
        "batch b: 0 FAILED or DEAD task(s) PENDING again\n")
    bad = lockgate("tasks", "retry", "--batch", "nope", "--db", db_url)
    assert bad.exit_code == 2 and bad.stderr.startswith("error: no batch 'nope'")
    both = lockgate("tasks", "retry", "t-00000", "--batch", "b", "--db", db_url)
    assert both.exit_code == 2 and "give a TASK_ID or --batch BATCH" in both.stderr


def test_a_misspelt_registry_reference_is_refused_at_submit(
        db_url: str, tmp_path: Path) -> None:
    with Lockgate(db_url) as lg:
        lg.prompts.create("complaints", "Classify: {text}", model_config={"name": "m"})
    line = {"task_id": "r1", "prompt_template": "@registry:complaint",
            "input_data": {"text": "x"}}
    path = write_jsonl(tmp_path / "refs.jsonl", [line, {**line, "task_id": "r2",
                                                        "prompt_template":
                                                        "@registry:complaints@9"}])
    r = lockgate("submit", path, "--db", db_url)
    assert r.exit_code == 2
    err = flat(r.stderr)
    assert ("line 1, field 'prompt_template': @registry:complaint: no prompt 'complaint'"
            in err and "did you mean @registry:complaints?" in err)
    assert ("line 2, field 'prompt_template': @registry:complaints@9: prompt 'complaints' "
            "has no version 9" in err)
    ok = write_jsonl(tmp_path / "ok.jsonl", [{**line, "prompt_template":
                                              "@registry:complaints"}])
    assert lockgate("submit", ok, "--db", db_url).exit_code == 0


def test_status_fits_an_80_column_terminal_without_cutting_words(
        db_url: str, store: Store, simulator: SimulatorProcess) -> None:
    long_batch = "regulatory-complaints-2026-12-nightly"
    store.submit([parse_task(t) for t in tasks(2)], batch_id=long_batch)
    r = CliRunner().invoke(app, ["status", "--db", db_url], terminal_width=80)
    assert r.exit_code == 0, r.output
    assert "…" not in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 80
    first_cells = [line.split("│")[1].strip() for line in r.stdout.splitlines()
                   if line.startswith("│")]
    assert long_batch in "".join(first_cells)  # wrapped inside its cell, whole


def test_bind_confirms_every_setting_it_stored(db_url: str, tmp_path: Path) -> None:
    with Lockgate(db_url) as lg:
        lg.prompts.create("p", "Say yes or no: {text}", model_config={"name": "m"})
    items = write_jsonl(tmp_path / "items.jsonl",
                        [{"id": "1", "input": {"text": "a"}, "expected": "yes"}])
    assert lockgate("dataset", "add", "d", items, "--db", db_url).exit_code == 0
    r = lockgate("bind", "p", "d", "-t", "accuracy>=0.9", "--confidence", "0.95",
                 "--min-samples", "50", "--non-inferiority", "0.02", "--db", db_url)
    assert r.exit_code == 0, r.output
    assert flat(r.stderr) == (
        "p / d: accuracy >= 0.9 (compare exact; Wilson bound at 0.95 confidence must clear "
        "each threshold; at least 50 samples; accuracy not worse than live by more than "
        "0.02)")


@pytest.mark.parametrize("flag, value", [("--older-than", "1h30m"), ("--older-than", "1.5h"),
                                         ("--older-than", "90m"), ("--older-than", "5400")])
def test_every_duration_flag_takes_the_one_grammar(db_url: str, flag: str,
                                                    value: str) -> None:
    r = lockgate("cleanup", flag, value, "--db", db_url)
    assert r.exit_code == 0, r.output
