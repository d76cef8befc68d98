"""Review 13 of the gate: a candidate that answered no item is never activated, whatever
`--undefined` says, and the binding's refusals name the option to fix and the values it
takes (docs/gate.md)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from lockgate.cli import app
from lockgate.errors import ConfigError, SpecError
from lockgate.gate.binding import BindingSettings, parse_threshold
from lockgate.gate.decision import check_non_inferiority, check_threshold, decide
from lockgate.gate.metrics import Sample, compute

from .support import DELIVERY, GOOD, MEDIOCRE, MODEL, Env, LocalProvider, drive

#: No retries: a refused request ends the item's task at once.
NO_RETRY = {"max_retries": 0, "base_delay_ms": 0}


def _refusing() -> LocalProvider:
    """Every call answered HTTP 400 (invalid_request): an error of the candidate's."""
    return LocalProvider(fail=lambda _text: True)


# -- a candidate that answered nothing ---------------------------------------------------------


def test_undefined_pass_does_not_activate_a_candidate_whose_every_item_errored(
        env: Env) -> None:
    # Every request refused: precision and latency_p95_ms were undefined for want of a
    # single answer, `--undefined pass` passed both, and the candidate went live.
    env.setup(thresholds=["latency_p95_ms<=5000", "precision>=0.9"], positive="yes",
              undefined="pass")
    p = env.prompts.propose("p", GOOD, retry_policy=NO_RETRY)
    assert drive(env, p.update_id, provider=_refusing()) == "REJECTED"
    assert env.live() == 1
    st = env.gate.status(p.update_id)
    ds = st["decision"]["datasets"][0]
    assert ds["metrics"]["counts"]["error"] == ds["metrics"]["counts"]["items"] == 40
    assert [c["passed"] for c in ds["checks"]] == [False, False]
    assert all("no item was answered" in c["note"] for c in ds["checks"])
    assert "--undefined pass excuses an empty denominator" in ds["checks"][0]["note"]
    assert st["reason"] == ("p-set: no item was answered (all 40 evaluated items ended "
                            "in an error)")


def test_no_threshold_passes_a_candidate_that_answered_nothing(env: Env) -> None:
    # tokens_per_item stays defined (0 tokens for refused requests) and met its bar.
    env.setup(thresholds=["tokens_per_item<=100000"], undefined="pass")
    p = env.prompts.propose("p", GOOD, retry_policy=NO_RETRY)
    assert drive(env, p.update_id, provider=_refusing()) == "REJECTED"
    assert env.live() == 1
    assert "no item was answered" in env.gate.status(p.update_id)["reason"]


def _one(binding: dict[str, Any], metrics: dict[str, Any]) -> Any:
    run = {"dataset_id": 1, "subject": "candidate", "status": "FINALIZED",
           "metrics": metrics, "reason": None}
    return decide([{"name": "d", "id": 1, "binding": binding}], [run])


def test_a_latency_of_errored_attempts_does_not_pass_a_candidate() -> None:
    # An item can end ERROR after a call that returned (its output failed the delivery
    # rule): its latency is not an answer's.
    metrics = compute([Sample("ERROR", latency_ms=120.0)] * 10)
    assert metrics["latency_p95_ms"] == 120.0
    binding = {"thresholds": [{"metric": "latency_p95_ms", "op": "<=", "value": 5000}],
               "undefined": "pass"}
    d = _one(binding, metrics)
    assert d.outcome == "reject"
    assert d.reason == "d: no item was answered (all 10 evaluated items ended in an error)"


def test_an_empty_denominator_of_answered_items_still_passes_under_undefined_pass() -> None:
    # What `--undefined pass` is for: every item answered, none predicted positive.
    metrics = compute([Sample("MATCH", "no", "no", latency_ms=10.0)] * 4
                      + [Sample("ERROR", truth="no")], positive="yes")
    assert metrics["precision"] is None
    binding = {"thresholds": [{"metric": "precision", "op": ">=", "value": 0.9}],
               "positive_label": "yes", "comparison": {"kind": "label", "field": "label"},
               "undefined": "pass"}
    assert _one(binding, metrics).outcome == "activate"


def test_an_undefined_check_of_a_silent_candidate_fails_and_says_why() -> None:
    metrics = compute([Sample("ERROR", truth="yes")] * 3 + [Sample("ERROR", truth="no")],
                      positive="yes")
    settings = BindingSettings(thresholds=(parse_threshold("precision>=0.5"),),
                               positive_label="yes", undefined="pass",
                               comparison={"kind": "label", "field": "x"},  # type: ignore[arg-type]
                               non_inferiority={"metric": "precision"})  # type: ignore[arg-type]
    c = check_threshold(settings.thresholds[0], metrics, settings)
    assert not c.passed and c.value is None
    assert c.note is not None and c.note.startswith(
        "undefined: no item was answered (all 4 evaluated items ended in an error)")
    ni = check_non_inferiority(settings, metrics, {"precision": 0.5})
    assert ni is not None and not ni.passed and "no item was answered" in (ni.note or "")


# -- refusals that name the option -------------------------------------------------------------


def _refusal(env: Env, **bind: Any) -> str:
    env.prompts.create("p", MEDIOCRE, model_config=MODEL, delivery_rule=DELIVERY)
    env.datasets.add("d", [{"id": "a", "input": {"text": "t"}, "expected": "yes"}])
    bind.setdefault("thresholds", ["accuracy>=0.5"])
    with pytest.raises(ConfigError) as exc:
        env.gate.bind("p", "d", comparison="label:label", **bind)
    return str(exc.value)


def test_cost_without_prices_names_the_price_options(env: Env) -> None:
    msg = _refusal(env, thresholds=["cost_per_item<=0.01"])
    assert "--price-in" in msg and "--price-out" in msg, msg


@pytest.mark.parametrize(("bind", "option", "accepted"), [
    ({"confidence": 1.5}, "--confidence", "above 0.5 and below 1"),
    ({"confidence": 0.2}, "--confidence", "above 0.5 and below 1"),
    ({"min_samples": -3}, "--min-samples", "0 or more"),
    ({"non_inferiority": -0.1}, "--non-inferiority", "0 or more"),
    ({"undefined": "maybe"}, "--undefined", "fail or pass"),
    ({"thresholds": ["cost_per_item<=1"], "prices": (-1.0, 1.0)}, "--price-in",
     "0 or more"),
])
def test_a_refused_guard_value_names_its_option_and_range(
        env: Env, bind: dict[str, Any], option: str, accepted: str) -> None:
    msg = _refusal(env, **bind)
    assert option in msg and accepted in msg, msg
    assert "Input should be" not in msg


@pytest.mark.parametrize("metric", ["accuracy", "f1", "error_ratio"])
def test_a_margin_beyond_a_bounded_metric_is_refused(env: Env, metric: str) -> None:
    # live - 2 is below any accuracy: a margin every candidate would meet.
    msg = _refusal(env, non_inferiority={"metric": metric, "margin": 2},
                   **({"positive": "yes"} if metric == "f1" else {}))
    assert "--non-inferiority" in msg and "between 0 and 1" in msg and "got 2" in msg, msg


def test_a_large_margin_on_an_unbounded_metric_is_kept(env: Env) -> None:
    env.prompts.create("p", MEDIOCRE, model_config=MODEL, delivery_rule=DELIVERY)
    env.datasets.add("d", [{"id": "a", "input": {"text": "t"}, "expected": "yes"}])
    s = env.gate.bind("p", "d", thresholds=["accuracy>=0.5"], comparison="label:label",
                      non_inferiority={"metric": "latency_p95_ms", "margin": 250})
    assert s.non_inferiority is not None and s.non_inferiority.margin == 250


def test_the_cli_names_the_option_of_a_bad_confidence(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    template = tmp_path / "v1.txt"
    template.write_text("".join(f"[{m['role']}]\n{m['content']}\n" for m in MEDIOCRE),
                        encoding="utf-8")
    (tmp_path / "d.jsonl").write_text(json.dumps(
        {"id": "a", "input": {"text": "t"}, "expected": "yes"}) + "\n", encoding="utf-8")
    runner = CliRunner()
    for args in (["prompt", "create", "c", "--file", str(template), "--model-config",
                  json.dumps(MODEL), "--delivery-rule", json.dumps(DELIVERY)],
                 ["dataset", "add", "d", str(tmp_path / "d.jsonl")]):
        assert runner.invoke(app, args).exit_code == 0
    res = runner.invoke(app, ["bind", "c", "d", "-t", "accuracy>=0.5", "--compare",
                              "label:label", "--confidence", "1.5"])
    assert res.exit_code == 2, res.output
    assert "--confidence" in res.output and "below 1" in res.output, res.output


def test_a_misspelt_retry_policy_key_says_what_was_meant(env: Env) -> None:
    env.setup()
    with pytest.raises(SpecError) as exc:
        env.prompts.propose("p", GOOD, retry_policy={"max_retry": 3})
    assert "retry_policy.max_retry" in str(exc.value)
    assert "did you mean 'max_retries'?" in str(exc.value)
