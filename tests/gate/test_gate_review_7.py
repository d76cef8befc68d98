"""Review 7 of the gate: what a scorer may return (numpy's scalars, Decimal, Fraction;
NaN is no score), `--min-samples` before `--undefined pass`, and bindings to a dataset
without items (docs/gate.md)."""

from __future__ import annotations

import json
import math
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from lockgate.cli import app
from lockgate.errors import SpecError
from lockgate.gate.binding import BindingSettings, Comparison, parse_threshold
from lockgate.gate.compare import Comparator
from lockgate.gate.decision import check_threshold, decide
from lockgate.gate.metrics import Sample, compute

from .support import DELIVERY, GOOD, MEDIOCRE, MODEL, Env, drive, rows, yes_no

# -- what a scorer returns -------------------------------------------------------------------


def scorer_returns_input(expected: Any, actual: Any, input: Any) -> Any:
    """A user scorer whose result is whatever the test passes as the input."""
    return input


def scorer_decimal(expected: Any, actual: Any, input: Any) -> Decimal:
    """A user scorer that scores in Decimal, as money-minded code does."""
    return Decimal(1) if actual["label"] == expected else Decimal(0)


def scorer_nan(expected: Any, actual: Any, input: Any) -> float:
    """A user scorer that cannot score (its model of the answer found nothing)."""
    return math.nan


class Whole:
    """A number type of a user's own: an integer by ``__index__``."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __index__(self) -> int:
        return self.n


class Real:
    """A number type of a user's own: a real by ``__float__``."""

    def __init__(self, x: float) -> None:
        self.x = x

    def __float__(self) -> float:
        return self.x


def _scorer(name: str) -> Comparator:
    return Comparator(Comparison(kind="scorer", scorer=f"{__name__}:{name}"))


@pytest.mark.parametrize(("result", "match"), [
    (Decimal(1), True), (Decimal("0.5"), True), (Decimal("0.4999"), False),
    (Decimal(0), False), (Decimal("-1"), False), (Decimal("Infinity"), True),
    (Fraction(1, 2), True), (Fraction(49, 100), False), (Fraction(3), True),
    (Whole(1), True), (Whole(0), False), (Whole(10**400), True), (Whole(-5), False),
    (Real(0.75), True), (Real(0.25), False),
    (10**400, True), (True, True), (False, False), (1, True), (0.5, True), (0.49, False),
])
def test_a_scorer_may_return_any_real_number_or_bool(result: Any, match: bool) -> None:
    # A Decimal made every item an ERROR ("returned Decimal; return a bool or a
    # number"), and a correct candidate was rejected.
    assert _scorer("scorer_returns_input")(None, None, result).match is match


def test_numpy_booleans_and_numbers_are_scored_by_their_value() -> None:
    # numpy 2 names its boolean type "bool": "scorer ... returned bool; return a bool or
    # a number" contradicted itself, and every item was an ERROR.
    np = pytest.importorskip("numpy")
    score = _scorer("scorer_returns_input")
    cases = [(np.True_, True), (np.False_, False), (np.array([1, 1]).all(), True),
             (np.array(["a"]) == "b", None), (np.int64(1), True), (np.int8(0), False),
             (np.uint64(3), True), (np.float32(0.5), True), (np.float16(0.25), False),
             (np.float64(0.7), True), (np.array(0.6), True), (np.array(False), False)]
    for value, match in cases:
        if match is None:  # an array of several (or one) values is not a score
            with pytest.raises(TypeError, match=r"returned numpy\.ndarray"):
                score(None, None, value)
        else:
            assert score(None, None, value).match is match, repr(value)


@pytest.mark.parametrize(("result", "named"), [
    ("yes", "returned str;"), (None, "returned NoneType;"), (1j, "returned complex;"),
    ([1], "returned list;"), ({"score": 1}, "returned dict;"),
    (Decimal("sNaN"), "returned decimal.Decimal Decimal('sNaN')"),
])
def test_a_result_that_is_no_number_names_its_type(result: Any, named: str) -> None:
    with pytest.raises(TypeError, match="return a bool or a number") as err:
        _scorer("scorer_returns_input")(None, None, result)
    assert named in str(err.value)


@pytest.mark.parametrize("nan", [math.nan, -math.nan, Decimal("NaN"), Real(math.nan)])
def test_a_scorer_returning_nan_is_an_error_not_a_mismatch(nan: Any) -> None:
    # NaN >= 0.5 is False: an unscorable output counted silently as a mismatch, while
    # None (the other way of saying "cannot score") was an error.
    with pytest.raises(ValueError, match=r"returned NaN"):
        _scorer("scorer_returns_input")(None, None, nan)


@given(st.one_of(st.floats(allow_nan=False), st.fractions(-10**6, 10**6),
                 st.decimals(allow_nan=False)))
def test_a_number_matches_when_it_is_at_least_one_half_as_a_float(x: Any) -> None:
    assert _scorer("scorer_returns_input")(None, None, x).match is (float(x) >= 0.5)


@given(st.integers())
def test_an_integer_matches_exactly_when_it_is_one_or_more(n: int) -> None:
    for value in (n, Whole(n)):
        assert _scorer("scorer_returns_input")(None, None, value).match is (n >= 1)


def test_a_decimal_scorer_activates_a_correct_candidate(env: Env) -> None:
    env.setup(comparison=f"scorer:{__name__}:scorer_decimal")
    p = env.prompts.propose("p", GOOD)
    assert drive(env, p.update_id) == "ACTIVATED"
    assert env.live() == 2


def test_items_a_scorer_returns_nan_for_are_errors_saying_so(env: Env) -> None:
    env.setup(comparison=f"scorer:{__name__}:scorer_nan", thresholds=["accuracy>=0"])
    p = env.prompts.propose("p", GOOD)
    drive(env, p.update_id)
    found = rows(env.store, "SELECT verdict, error FROM prompt_run_item WHERE run_id = :r",
                 r=env.gate.gs.runs(p.update_id)[0]["id"])
    assert len(found) == 40
    assert all(r["verdict"] == "ERROR" and "returned NaN" in r["error"] for r in found)


# -- --min-samples before --undefined pass ------------------------------------------------


def _settings(threshold: str, **kw: Any) -> BindingSettings:
    return BindingSettings(thresholds=(parse_threshold(threshold),),
                           comparison=Comparison(kind="label", field="label"),
                           positive_label="yes", **kw)


@pytest.mark.parametrize("threshold", ["precision>=0.1", "recall<=0.5", "f1>=0"])
@pytest.mark.parametrize("confidence", [None, 0.95])
def test_an_undefined_metric_does_not_pass_a_minimum_sample_size(
        threshold: str, confidence: float | None) -> None:
    # --undefined pass let a metric with 0 observations through --min-samples 3.
    metrics = compute([Sample("MATCH", "no", "no")] * 10, positive="yes")
    s = _settings(threshold, undefined="pass",
                  guard={"confidence": confidence, "min_samples": 3})
    c = check_threshold(s.thresholds[0], metrics, s)
    assert (c.passed, c.n, c.value) == (False, 0, None)
    assert c.note == "0 samples < minimum 3"
    d = decide([{"name": "d", "id": 1, "binding": s.model_dump(mode="json")}],
               [{"dataset_id": 1, "subject": "candidate", "status": "FINALIZED",
                 "metrics": metrics, "reason": None}])
    metric = threshold.split("<")[0].split(">")[0]
    assert (d.outcome, d.reason) == ("reject", f"d: {metric}: 0 samples < minimum 3")


@pytest.mark.parametrize("guard", [None, {"min_samples": 0}, {"confidence": 0.95}])
def test_without_a_minimum_an_undefined_metric_passes_when_the_binding_says_so(
        guard: dict[str, Any] | None) -> None:
    metrics = compute([Sample("MATCH", "no", "no")] * 10, positive="yes")
    s = _settings("precision>=0.1", undefined="pass", guard=guard)
    assert check_threshold(s.thresholds[0], metrics, s).passed


@given(labels=st.lists(st.tuples(st.sampled_from(["yes", "no"]),
                                 st.sampled_from(["yes", "no"])), max_size=12),
       minimum=st.integers(0, 8), undefined=st.sampled_from(["pass", "fail"]),
       metric=st.sampled_from(["precision", "recall", "f1", "accuracy"]))
def test_no_metric_below_the_minimum_sample_size_passes(
        labels: list[tuple[str, str]], minimum: int, undefined: str, metric: str) -> None:
    samples = [Sample("MATCH" if p == t else "MISMATCH", p, t) for p, t in labels]
    metrics = compute(samples, positive="yes")
    s = _settings(f"{metric}>=0", undefined=undefined, guard={"min_samples": minimum})
    c = check_threshold(s.thresholds[0], metrics, s)
    assert c.n is not None
    if c.n < minimum:
        assert not c.passed
    else:  # at or above the minimum, the value (or the undefined policy) decides
        assert c.passed is (metrics[metric] is not None or undefined == "pass")


def test_a_candidate_with_no_predicted_positive_is_rejected_under_min_samples(
        env: Env) -> None:
    env.setup(thresholds=["precision>=0.1"], positive="yes", undefined="pass",
              min_samples=3)
    p = env.prompts.propose("p", yes_no("zzz"))  # never says yes: precision is 0/0
    assert drive(env, p.update_id) == "REJECTED"
    assert env.gate.status(p.update_id)["reason"] == "p-set: precision: 0 samples < minimum 3"
    assert env.live() == 1


# -- binding to a dataset without items ----------------------------------------------------


@pytest.mark.parametrize(("comparison", "positive"), [
    ("fields:category", None), ("fields:category,emotion", None),
    ("label:category", None), ("label:category", "x"),
    ({"kind": "label", "field": "answer", "ignore_case": True}, "Yes"),
])
def test_a_comparison_that_reads_the_dataset_is_refused_on_an_empty_one(
        env: Env, comparison: Any, positive: Any) -> None:
    # fields: said "(fields held: none: its expected values are not objects)" of an
    # empty dataset, and a --positive label that no item holds was accepted there.
    env.prompts.create("p", MEDIOCRE, model_config=MODEL, delivery_rule=DELIVERY)
    env.datasets.add("e", [])
    with pytest.raises(SpecError, match=r"^dataset 'e' is empty: the comparison "
                                        r"(fields|label):.* cannot be checked .*"
                                        r"`lockgate dataset add e FILE`\), then bind$"):
        env.gate.bind("p", "e", thresholds=["accuracy>=0.5"], comparison=comparison,
                      positive=positive)
    assert env.gate.bindings("p") == []


def test_a_dataset_emptied_by_replace_is_refused_and_one_filled_is_bound(env: Env) -> None:
    env.prompts.create("p", MEDIOCRE, model_config=MODEL, delivery_rule=DELIVERY)
    filled = [{"id": "a", "input": {"text": "t"}, "expected": {"category": "x"}}]
    env.datasets.add("e", filled)
    env.gate.bind("p", "e", thresholds=["accuracy>=0.5"], comparison="label:category",
                  positive="x")
    env.datasets.add("e", [], replace=True)  # the current revision has no items
    with pytest.raises(SpecError, match="dataset 'e' is empty"):
        env.gate.bind("p", "e", thresholds=["accuracy>=0.5"], comparison="fields:category")
    env.datasets.add("e", filled, replace=True)
    env.gate.bind("p", "e", thresholds=["accuracy>=0.5"], comparison="fields:category")


def test_the_store_alone_does_not_call_an_empty_dataset_one_without_objects(
        env: Env) -> None:
    env.prompts.create("p", MEDIOCRE, model_config=MODEL, delivery_rule=DELIVERY)
    env.datasets.add("e", [])
    with pytest.raises(SpecError, match="fields held: none: the dataset has no items"):
        env.gate.gs.bind("p", "e", {}, expected_fields=("category",))


@pytest.mark.parametrize("comparison", ["exact", f"scorer:{__name__}:scorer_decimal"])
def test_a_comparison_that_reads_nothing_binds_to_an_empty_dataset(
        env: Env, comparison: str) -> None:
    env.prompts.create("p", MEDIOCRE, model_config=MODEL, delivery_rule=DELIVERY)
    env.datasets.add("e", [])
    env.gate.bind("p", "e", thresholds=["accuracy>=0.5"], comparison=comparison)
    assert [b["dataset"] for b in env.gate.bindings("p")] == ["e"]


def test_the_cli_says_the_dataset_is_empty(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    template = tmp_path / "v1.txt"
    template.write_text("".join(f"[{m['role']}]\n{m['content']}\n" for m in MEDIOCRE),
                        encoding="utf-8")
    (tmp_path / "empty.jsonl").write_text("", encoding="utf-8")
    runner = CliRunner()
    for args in (["prompt", "create", "c", "--file", str(template), "--model-config",
                  json.dumps(MODEL), "--delivery-rule", json.dumps(DELIVERY)],
                 ["dataset", "add", "e", str(tmp_path / "empty.jsonl")]):
        assert runner.invoke(app, args).exit_code == 0
    for compare in (["--compare", "fields:category"],
                    ["--compare", "label:category", "--positive", "x"]):
        res = runner.invoke(app, ["bind", "c", "e", "-t", "accuracy>=0.5", *compare])
        assert res.exit_code == 2, res.output
        assert "dataset 'e' is empty" in res.output
        assert "not objects" not in res.output
