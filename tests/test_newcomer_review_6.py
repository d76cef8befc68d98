"""A sixth newcomer's review: a simulator port beyond 65535 wrapped to another port,
``gate.wait(timeout="10m")`` failing with a TypeError, ``--deadline 1M`` losing the
reason every other duration gives, a list given for an endpoint's ``model`` and a
deadline years in the past taken without a word."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from lockgate import Lockgate
from lockgate.cli import app
from lockgate.config import load_settings
from lockgate.errors import ConfigError, LockgateError, SpecError
from lockgate.flow.window import parse_when


@pytest.mark.parametrize("port", ["99999", "65537", "-1", "http"])
def test_the_simulator_refuses_a_port_that_is_none(port: str) -> None:
    # (99999 had listened on 34463, 65537 on port 1)
    res = subprocess.run([sys.executable, "-m", "lockgate.simulator", "--port", port],
                         capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 2, res.stderr
    assert "argument --port" in res.stderr and "is not a port (0-65535" in res.stderr
    assert "listening" not in res.stdout + res.stderr


@pytest.mark.parametrize("when, reason", [
    ("1M", "M is ambiguous"), ("+1M", "M is ambiguous"),
    ("PT5M", "ISO 8601 durations (PT5M) are not read"),
])
def test_a_deadline_says_what_is_wrong_with_its_duration(when: str, reason: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_when(when, datetime.now(UTC))
    assert err.value.field == "deadline"
    assert reason in str(err.value) and "ISO 8601, e.g." in str(err.value)


def test_a_deadline_that_is_neither_keeps_the_general_message() -> None:
    with pytest.raises(SpecError, match=r"is neither a time .* nor a duration from now"):
        parse_when("next tuesday", datetime.now(UTC))


def test_gate_wait_takes_the_duration_grammar(tmp_path: Path) -> None:
    lg = Lockgate(f"sqlite:///{tmp_path / 'lg.db'}")
    try:
        for bad in ("10 mins", "-5", "1M"):
            with pytest.raises(SpecError) as err:
                lg.gate.wait(1, timeout=bad)
            assert err.value.field == "timeout"
        # a duration it reads goes on to the update (none here): no TypeError
        with pytest.raises(LockgateError) as found:
            lg.gate.wait(12345, timeout="10m")
        assert not isinstance(found.value, SpecError)
    finally:
        lg.close()


def test_a_list_given_for_model_points_to_models(tmp_path: Path) -> None:
    cfg = tmp_path / "lockgate.toml"
    cfg.write_text('[[endpoint]]\nname = "a"\nbase_url = "http://127.0.0.1:9/v1"\n'
                   'model = ["x", "y"]\n')
    with pytest.raises(ConfigError) as err:
        load_settings(cfg)
    assert "'model': takes one value, not a list; several go in 'models' " \
           '(models = ["x", "y"])' in str(err.value)


def test_a_deadline_in_the_past_is_pointed_out(tmp_path: Path) -> None:
    tasks = tmp_path / "y.jsonl"
    tasks.write_text(orjson.dumps({
        "task_id": "a1", "prompt_template": "hi {x}", "input_data": {"x": "1"},
        "model_config": {"name": "m"}, "delivery_rule": {"format": "text"},
        "retry_policy": {"max_retries": 1}}).decode() + "\n")
    db = f"sqlite:///{tmp_path / 'lg.db'}"
    res = CliRunner().invoke(app, ["submit", str(tasks), "--batch", "y", "--deadline",
                                   "2020-01-01T00:00", "--db", db], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "the deadline 2020-01-01 00:00:00 has passed" in " ".join(res.output.split())
    res = CliRunner().invoke(app, ["submit", str(tasks), "--batch", "z", "--deadline",
                                   "2h", "--db", db], catch_exceptions=False)
    assert "has passed" not in res.output
