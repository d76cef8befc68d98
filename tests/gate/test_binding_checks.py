"""Bindings checked against their dataset on every backend: what a comparison reads from
the expected values must be there, and so must a positive label."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lockgate.errors import SpecError
from lockgate.gate.binding import Comparison
from lockgate.gate.compare import check_labels, same

from .support import DELIVERY, MEDIOCRE, MODEL, Env


def _dataset(env: Env, name: str, expected: list[object]) -> None:
    env.datasets.add(name, [{"id": f"i{k}", "input": {"text": f"t{k}"}, "expected": e}
                            for k, e in enumerate(expected)], replace=True)


def test_a_fields_comparison_names_fields_the_expected_objects_hold(env: Env) -> None:
    # A misspelt field is absent from the expected object and from the output alike:
    # every item matched, and a candidate wrong on all of them was activated.
    env.prompts.create("p", MEDIOCRE, model_config=MODEL, delivery_rule=DELIVERY)
    _dataset(env, "d", [{"answer": "B", "why": "x"}, {"answer": "A"}])
    with pytest.raises(SpecError, match=r"holds field 'answr' \(fields held: answer, why\)"):
        env.gate.bind("p", "d", thresholds=["accuracy>=0.9"], comparison="fields:answr")
    with pytest.raises(SpecError, match="fields 'answr', 'whyy'"):
        env.gate.bind("p", "d", thresholds=["accuracy>=0.9"],
                      comparison="fields:answer,answr,whyy")
    assert env.gate.bindings("p") == []
    # A field one expected object holds is a field of the dataset (optional elsewhere).
    env.gate.bind("p", "d", thresholds=["accuracy>=0.9"], comparison="fields:answer,why")
    assert [b["dataset"] for b in env.gate.bindings("p")] == ["d"]
    # Checked against the dataset's current revision, at every bind.
    _dataset(env, "d", [{"answer": "B"}])
    with pytest.raises(SpecError, match="'why'"):
        env.gate.bind("p", "d", thresholds=["accuracy>=0.8"], comparison="fields:answer,why")
    _dataset(env, "labels", ["yes", "no"])
    with pytest.raises(SpecError, match="none: its expected values are not objects"):
        env.gate.bind("p", "labels", thresholds=["accuracy>=0.9"], comparison="fields:label")
    env.gate.bind("p", "labels", thresholds=["accuracy>=0.9"], comparison="label:label")


def test_a_positive_label_no_item_has_is_refused_naming_the_labels(env: Env) -> None:
    # Every item's label is yes or no: --positive Yes made recall undefined on every
    # run, and every candidate was rejected as "recall undefined".
    env.prompts.create("p", MEDIOCRE, model_config=MODEL, delivery_rule=DELIVERY)
    _dataset(env, "d", ["yes", "no", "no"])
    recall = {"thresholds": ["recall>=0.9"], "comparison": "label:answer"}
    with pytest.raises(SpecError, match=r"^positive: no expected value of dataset 'd' has "
                                        r"the label \"Yes\" \(labels held: \"no\", \"yes\"\); "
                                        r"give one of them with --positive \(the `positive` "
                                        r"argument in Python\), or compare with "
                                        r"--ignore-case$"):
        env.gate.bind("p", "d", positive="Yes", **recall)
    with pytest.raises(SpecError, match=r"label 1 \(labels held: \"no\", \"yes\"\); give one "
                                        r"of them with --positive \(the `positive` argument "
                                        r"in Python\)$"):
        env.gate.bind("p", "d", positive=1, **recall)
    assert env.gate.bindings("p") == []
    env.gate.bind("p", "d", positive="yes", **recall)
    env.gate.bind("p", "d", positive="Yes", thresholds=["recall>=0.9"],  # case-blind
                  comparison={"kind": "label", "field": "answer", "ignore_case": True})
    # labels held in expected objects, under the compared field
    _dataset(env, "objs", [{"answer": True, "why": "x"}, {"answer": False}])
    with pytest.raises(SpecError, match=r"has the label \"true\" \(labels held: false, "
                                        r"true\)"):
        env.gate.bind("p", "objs", positive="true", **recall)
    env.gate.bind("p", "objs", positive=True, **recall)
    assert sorted(b["dataset"] for b in env.gate.bindings("p")) == ["d", "objs"]


def test_a_label_field_no_expected_object_holds_is_refused(env: Env) -> None:
    # With the field misspelt, each item's label was its whole expected object, which no
    # output field equals: every candidate scored 0.
    env.prompts.create("p", MEDIOCRE, model_config=MODEL, delivery_rule=DELIVERY)
    _dataset(env, "d", [{"answer": "yes", "why": "x"}, {"answer": "no"}])
    with pytest.raises(SpecError, match=r"^comparison: no expected value of dataset 'd' holds "
                                        r"field 'anwser' \(fields held: answer, why\); name "
                                        r"the field that holds the label after label:$"):
        env.gate.bind("p", "d", thresholds=["accuracy>=0.9"], comparison="label:anwser")
    assert env.gate.bindings("p") == []
    env.gate.bind("p", "d", thresholds=["accuracy>=0.9"], comparison="label:answer")
    # expected values that are the labels themselves need no field
    _dataset(env, "plain", ["yes", "no"])
    env.gate.bind("p", "plain", thresholds=["accuracy>=0.9"], comparison="label:anything")
    assert sorted(b["dataset"] for b in env.gate.bindings("p")) == ["d", "plain"]


_LABELS = ["yes", "no", "Yes", 1, 1.0, True, False, 0, None, [1]]


@given(labels=st.lists(st.sampled_from(_LABELS), min_size=1, max_size=30),
       positive=st.sampled_from([x for x in _LABELS if x is not None]),
       ignore_case=st.booleans())
def test_a_positive_label_is_refused_exactly_when_no_item_has_it(
        labels: list[Any], positive: Any, ignore_case: bool) -> None:
    spec = Comparison(kind="label", field="answer", ignore_case=ignore_case)
    fold = (lambda v: v.casefold() if isinstance(v, str) else v) if ignore_case \
        else (lambda v: v)
    held = any(same(fold(x), fold(positive)) for x in labels)  # as the metrics count it
    try:
        check_labels(spec, positive, "d", iter(labels))
    except SpecError as exc:
        assert not held and "labels held: " in str(exc)
    else:
        assert held
