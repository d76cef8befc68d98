"""`lockgate bind --remove`, thresholds the statistical guard makes impossible, and the
exit status of `--wait` when the decision has not come yet (docs/gate.md)."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from lockgate.cli import app
from lockgate.cli.registry import NOT_ACTIVATED
from lockgate.errors import ConfigError

from .support import DELIVERY, GOOD, MEDIOCRE, MODEL, Env, items


def _template_file(path: Path, template: list[dict[str, str]]) -> Path:
    path.write_text("".join(f"[{m['role']}]\n{m['content']}\n" for m in template),
                    encoding="utf-8")
    return path


@pytest.fixture
def runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    """A prompt ``p`` with a dataset ``d`` of 20 items, on a SQLite file."""
    monkeypatch.setenv("LOCKGATE_DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    r = CliRunner()
    _run(r, "prompt", "create", "p", "--file", str(_template_file(tmp_path / "v1.txt",
                                                                    MEDIOCRE)),
         "--model-config", json.dumps(MODEL), "--delivery-rule", json.dumps(DELIVERY))
    data = tmp_path / "d.jsonl"
    data.write_bytes(b"".join(orjson.dumps(i) + b"\n" for i in items(20)))
    _run(r, "dataset", "add", "d", str(data))
    return r


def _run(runner: CliRunner, *args: str, code: int = 0) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code == code, f"{args}: exit {res.exit_code}\n{res.output}"
    return res.output


def test_bind_remove_takes_no_threshold_and_names_a_missing_dataset(
        runner: CliRunner) -> None:
    # docs: `--remove` unbinds; it failed with "Missing option '--threshold'"
    _run(runner, "bind", "p", "d", "-t", "accuracy>=0.9", "--compare", "label:label")
    assert "p / d: unbound" in _run(runner, "bind", "p", "d", "--remove")
    assert "p / d: not bound" in _run(runner, "bind", "p", "d", "--remove")
    # a dataset that does not exist is named as every other command names it (exit 2)
    out = _run(runner, "bind", "p", "nope", "--remove", code=2)
    assert "no dataset 'nope'" in out and "not bound" not in out
    assert "no prompt" in _run(runner, "bind", "q", "d", "--remove", code=2)
    # --remove with thresholds is contradictory; a binding without one is refused
    assert "takes no --threshold" in _run(runner, "bind", "p", "d", "--remove", "-t",
                                          "accuracy>=0.9", code=2)
    assert "at least one threshold" in _run(runner, "bind", "p", "d", code=2)


@pytest.mark.parametrize("threshold", ["accuracy>=1", "error_ratio<=0", "recall>=1",
                                       "precision>=1.0", "error_ratio<=0.0"])
def test_a_threshold_the_wilson_guard_can_never_clear_is_refused(
        runner: CliRunner, threshold: str) -> None:
    # A Wilson lower bound is always below 1 and an upper bound above 0: with
    # --confidence, these bars rejected every candidate, a perfect one included.
    base = ["bind", "p", "d", "--compare", "label:label", "--positive", "yes"]
    out = _run(runner, *base, "-t", threshold, "--confidence", "0.95", code=2)
    metric = threshold.split("<")[0].split(">")[0]
    assert f"'{metric} " in out and "can never be met with --confidence 0.95" in out
    assert "Wilson" in out and "bind without --confidence" in out
    assert "Traceback" not in out and out.count("\n") <= 2, out
    # without the guard the value itself is compared: reachable, so accepted
    _run(runner, *base, "-t", threshold)
    _run(runner, *base, "-t", threshold, "--min-samples", "10")


def test_bars_the_wilson_guard_can_clear_are_accepted(env: Env) -> None:
    env.prompts.create("p", MEDIOCRE, model_config=MODEL, delivery_rule=DELIVERY)
    env.datasets.add("d", items(20))
    for t in ("accuracy>=0.99", "accuracy>0.999", "error_ratio<=0.001", "error_ratio<0.01",
              "accuracy==1", "f1>=1", "latency_p95_ms<=0"):
        env.gate.bind("p", "d", thresholds=[t], comparison="label:label", positive="yes",
                      confidence=0.95)
    with pytest.raises(ConfigError, match="accuracy >= 1' can never be met"):
        env.gate.bind("p", "d", thresholds=["accuracy>=1"], confidence=0.9)


def test_a_wait_that_times_out_exits_3_saying_how_to_wait_again(
        runner: CliRunner, tmp_path: Path) -> None:
    # docs: `--wait` exits 0 when the candidate went live and 3 otherwise; a wait that
    # timed out exited 2, the code of a usage error.
    _run(runner, "bind", "p", "d", "-t", "accuracy>=0.9", "--compare", "label:label")
    good = str(_template_file(tmp_path / "v2.txt", GOOD))
    out = _run(runner, "prompt", "propose", "p", "--file", good, "--wait", "--timeout", "0s",
               code=NOT_ACTIVATED)
    assert "is still PENDING after 0s" in out and "not decided yet" in out
    assert "lockgate gate status 1 --wait" in out, out
    out = _run(runner, "gate", "status", "1", "--wait", "--timeout", "0s",
               code=NOT_ACTIVATED)
    assert "still PENDING" in out and "lockgate gate status 1 --wait" in out
    res = runner.invoke(app, ["gate", "status", "1", "--wait", "--timeout", "0s", "--json"])
    assert res.exit_code == NOT_ACTIVATED, res.output
    assert json.loads(res.stdout)["status"] == "PENDING"
    # a usage error still exits 2
    _run(runner, "gate", "status", "1", "--wait", "--timeout", "soon", code=2)
    _run(runner, "gate", "status", "99", "--wait", "--timeout", "0s", code=2)
