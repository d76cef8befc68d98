"""Review 4: a threshold no value of its metric can meet is refused for every metric
(latency, tokens and cost are never negative)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from lockgate.cli import app
from lockgate.errors import ConfigError
from lockgate.gate.binding import parse_threshold, settings_from

PRICES = {"input_per_mtok": 1.0, "output_per_mtok": 2.0}


@pytest.mark.parametrize("text", ["latency_p95_ms<=-1", "latency_p50_ms<0",
                                  "tokens_per_item==-3", "cost_per_item<=-0.5"])
def test_a_negative_bound_on_a_metric_that_is_never_negative_is_refused(text: str) -> None:
    # where a binding is made (bind, gate.bind): parse_threshold alone keeps it
    t = parse_threshold(text)
    with pytest.raises(ConfigError) as err:
        settings_from({"thresholds": [t.model_dump()], "prices": PRICES})
    said = str(err.value)
    assert t.metric in said and "0 or more" in said and "can never be met" in said


@pytest.mark.parametrize("text", ["latency_p95_ms<=0", "latency_p95_ms<=2000",
                                  "tokens_per_item>=-1", "cost_per_item<0.01"])
def test_a_bound_some_value_can_meet_is_taken(text: str) -> None:
    t = parse_threshold(text)
    assert settings_from({"thresholds": [t.model_dump()], "prices": PRICES}).thresholds == (t,)


def test_bind_refuses_a_negative_latency_bound(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_DATABASE_URL", f"sqlite:///{tmp_path / 'g.db'}")
    runner = CliRunner()
    assert runner.invoke(app, ["init"]).exit_code == 0
    res = runner.invoke(app, ["bind", "p", "d", "-t", "latency_p95_ms<=-1"])
    assert res.exit_code == 2, res.output
    said = " ".join(res.stderr.split())
    assert "latency_p95_ms is 0 or more" in said
