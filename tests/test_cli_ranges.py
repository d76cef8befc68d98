"""Numbers and durations beyond what a database column or a date can hold: one line
naming the problem and exit code 2, as every other bad value (each was a traceback,
``OverflowError: Python int too large to convert to SQLite INTEGER``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import lockgate
from lockgate.cli import app

HUGE = "99999999999999999999"


@pytest.mark.parametrize("args, words", [
    (["alerts", "show", HUGE], "out of range"),
    (["alerts", "ack", HUGE], "out of range"),
    (["quality", "--since", "99999999999w"], "at most 100 years"),
    (["quality", "--since", HUGE], "at most 100 years"),
    (["cleanup", "--older-than", "99999999999w"], "at most 100 years"),
])
def test_a_number_beyond_range_is_one_line_and_exit_code_2(
        args: list[str], words: str, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    lockgate.connect(url).close()
    result = CliRunner().invoke(app, [*args, "--db", url])
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        repr(result.exception)
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], lines
