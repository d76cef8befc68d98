"""The command line's error boundary: every command, against a database that does not
answer or does not exist, says so in one line and exits with code 2 — no traceback, no
password. Commands are found by walking the app, so a new command is covered at once."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

import lockgate
from lockgate.cli import app

#: Arguments that get past each command's own checks to its database call.
ARGS: dict[str, list[str]] = {
    "init": [], "status": [], "export": ["b"], "cleanup": [],
    "submit": ["{tasks}"], "run": ["{tasks}"], "worker": ["--burst"],
    "tasks show": ["t1"], "tasks retry": ["t1"], "tasks cancel": ["t1"],
    "tasks resolve": ["t1", "--result", '{"label": "yes"}'],
    "circuit list": [], "circuit open": ["p"], "circuit close": ["p"],
    "prompt create": ["p", "-f", "{prompt}", "--model-config", '{"name": "m"}'],
    "prompt propose": ["p", "-f", "{prompt}"], "prompt show": ["p"],
    "prompt history": ["p"], "prompt diff": ["p", "1"], "prompt rollback": ["p"],
    "prompt label": ["p", "canary", "1"], "prompt list": [],
    "prompt experiment start": ["p", "--version", "2", "--share", "5%"],
    "prompt experiment status": ["p"], "prompt experiment conclude": ["p"],
    "prompt experiment stop": ["p"], "prompt experiment list": [],
    "dataset add": ["d", "{items}"], "dataset show": ["d"], "dataset list": [],
    "bind": ["p", "d", "-t", "accuracy>=0.9"],
    "gate status": ["1"], "gate list": [], "gate cancel": ["1"],
    "quality": ["p", "--since", "1h"],
    "alerts list": [], "alerts show": ["1"], "alerts ack": ["1"],
}
#: Commands that open no database.
NO_DATABASE = {"simulate"}
#: Commands that may create a SQLite file (they write tasks, prompts or datasets).
CREATORS = {"init", "submit", "run", "worker", "prompt create", "dataset add"}

STOPPED = {
    "postgresql": ("postgresql://app:s3cret@127.0.0.1:9/lockgate",
                   "cannot reach the database postgresql://app:***@127.0.0.1:9/lockgate"),
    "mysql": ("mysql://app:s3cret@127.0.0.1:9/lockgate",
              "cannot reach the database mysql://app:***@127.0.0.1:9/lockgate"),
}


def _commands(group: Any, prefix: str = "") -> Iterator[str]:
    for name, cmd in sorted(group.commands.items()):
        full = f"{prefix}{name}"
        if hasattr(cmd, "commands"):  # a group of commands
            yield from _commands(cmd, full + " ")
        else:
            yield full


COMMANDS = [c for c in _commands(get_command(app)) if c not in NO_DATABASE]


def test_every_command_has_arguments_here() -> None:
    assert set(COMMANDS) == set(ARGS), "add the new command to ARGS"


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"task_id": "t1", "prompt_template": "{x}", "input_data": {"x": "1"}, '
                     '"model_config": {"name": "m"}, "delivery_rule": {}, '
                     '"retry_policy": {}}\n')
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("[user]\nClassify {text}\n")
    items = tmp_path / "items.jsonl"
    items.write_text('{"id": "1", "input": {"text": "a"}, "expected": "yes"}\n')
    return {"tasks": str(tasks), "prompt": str(prompt), "items": str(items)}


def _run(command: str, db: str, files: dict[str, str]) -> tuple[int, str]:
    args = [*command.split(), *(files.get(a.strip('{}'), a) for a in ARGS[command]), "--db", db]
    result = CliRunner().invoke(app, args)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{command}: {result.exception!r}\n{result.output}")
    return result.exit_code, result.output


@pytest.mark.parametrize("server", sorted(STOPPED))
@pytest.mark.parametrize("command", COMMANDS)
def test_a_stopped_server_is_one_line_and_exit_code_2(
        command: str, server: str, files: dict[str, str]) -> None:
    url, expected = STOPPED[server]
    code, output = _run(command, url, files)
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert code == 2, output
    assert "Traceback" not in output and "s3cret" not in output, output
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert len(errors) == 1 and expected in " ".join(lines), output


@pytest.mark.parametrize("command", COMMANDS)
def test_a_missing_sqlite_file_is_never_created_by_commands_that_only_read_or_change_it(
        command: str, files: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "typo.db"
    code, output = _run(command, f"sqlite:///{path}", files)
    if command in CREATORS:
        return  # these make the database (and say so on success)
    assert code == 2, output
    assert f"no lockgate database at sqlite:///{path}" in output.splitlines()[0]
    assert not path.exists(), f"{command} created {path}"


def test_the_app_is_a_typer_app() -> None:
    assert isinstance(app, typer.Typer)


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path) -> None:
    """``lockgate export b | head -1``: the closed pipe was reported as an error
    (``error: [Errno 32] Broken pipe``, exit code 2). It ends quietly now, with the
    shell's code for it (141), as ``yes | head`` does."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    with lockgate.connect(url) as lg:
        lg.submit([{"task_id": f"t{i}", "prompt_template": "Say {x}", "input_data": {"x": i},
                    "model_config": {"name": "m"}, "delivery_rule": {"format": "text"},
                    "retry_policy": {}} for i in range(5000)], batch_id="b")
    proc = subprocess.Popen([sys.executable, "-m", "lockgate.cli", "export", "b", "--db", url],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith(b'{"task_id":"t0"')
    proc.stdout.close()
    with proc.stderr:
        err = proc.stderr.read()
    assert proc.wait(60) == 141 and err == b"", err
