"""Bindings checked against their dataset on every backend: what a comparison reads from
the expected values must be there."""

from __future__ import annotations

import pytest

from lockgate.errors import SpecError

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
