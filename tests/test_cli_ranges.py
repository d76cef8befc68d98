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


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_an_export_to_a_full_device_names_it(tmp_path: Path) -> None:
    """``lockgate export b -o /dev/full`` said only ``[Errno 28] No space left on
    device``: the error names the path written."""
    url = f"sqlite:///{tmp_path / 'x.db'}"
    with lockgate.connect(url) as lg:
        lg.submit([{"task_id": f"t{i}", "prompt_template": "Say {x}", "input_data": {"x": i},
                    "model_config": {"name": "m"}, "delivery_rule": {"format": "text"},
                    "retry_policy": {}} for i in range(3000)], batch_id="b")
    result = CliRunner().invoke(app, ["export", "b", "-o", "/dev/full", "--db", url])
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 2, result.output
    assert lines == ["error: cannot write /dev/full: No space left on device"], lines
