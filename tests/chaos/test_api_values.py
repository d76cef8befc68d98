"""Tasks built in Python can hold values that no task file can: a lone surrogate, an
integer beyond 64 bits. ``submit`` refuses them naming the task and the field, before
anything is written (no partial batch), instead of failing inside the store."""

from __future__ import annotations

from typing import Any

import pytest

import lockgate
from engine.support import status_counts, task, tasks
from lockgate.errors import SpecError

pytestmark = pytest.mark.chaos

CASES: dict[str, tuple[dict[str, Any], str, str]] = {
    "surrogate in metadata": (
        {"metadata": {"note": "caf\udce9"}}, "metadata", "lone surrogate"),
    "surrogate in the template": (
        {"template": [{"role": "user", "content": "hi \ud800 {text}"}]},
        "prompt_template", "lone surrogate"),
    "surrogate in model_config": (
        {"model": {"stop": ["\udfff"]}}, "model_config", "lone surrogate"),
    "int beyond 64 bits in model_config": (
        {"model": {"seed": 2**70}}, "model_config", "beyond 64 bits"),
    "int beyond 64 bits in metadata": (
        {"metadata": {"n": -(2**64)}}, "metadata", "beyond 64 bits"),
    "int beyond 64 bits in the delivery rule": (
        {"delivery": {"schema": {"type": "object", "maxProperties": 2**65}}},
        "delivery_rule", "beyond 64 bits"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_values_json_cannot_carry_are_refused_naming_the_field(db_url: str,
                                                               case: str) -> None:
    extra, field, why = CASES[case]
    good = tasks(40)
    bad = task("bad-1", "text", **extra)
    with lockgate.connect(db_url) as lg:
        with pytest.raises(SpecError) as caught:
            lg.submit([*good[:30], bad, *good[30:]], batch_id="b")
        assert (caught.value.field, caught.value.line) == (field, 31), str(caught.value)
        assert why in str(caught.value)
        assert str(caught.value).startswith(f"line 31, field '{field}'")
        assert status_counts(lg.store) == {}, "a refused submit wrote tasks"
        lg.submit(good, batch_id="b")  # the rest goes in once the task is fixed
        assert status_counts(lg.store) == {"PENDING": 40}
