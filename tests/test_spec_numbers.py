"""JSON's ``true``/``false`` where a task's spec takes a number are refused with the
field named, on the first task of a config and on the tasks after it (the intake's fast
path); pydantic had read them as 1 and 0 (``"temperature": true`` ran at 1.0)."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lockgate.errors import SpecError
from lockgate.files import Intake

BASE: dict[str, Any] = {
    "task_id": "t1", "prompt_template": "Label: {text}", "input_data": {"text": "hi"},
    "model_config": {"name": "m"}, "delivery_rule": {"format": "text"}, "retry_policy": {}}

#: Every number of a spec, with a value it takes.
NUMBERS = [
    (("retry_policy", "max_retries"), 2), (("retry_policy", "base_delay_ms"), 10),
    (("retry_policy", "backoff_factor"), 1.5), (("retry_policy", "jitter"), 0.1),
    (("retry_policy", "cap_ms"), 1000), (("model_config", "temperature"), 0.7),
    (("model_config", "temperature_jitter"), 0.1), (("model_config", "top_p"), 0.9),
    (("model_config", "top_k"), 5), (("model_config", "max_tokens"), 100),
    (("model_config", "timeout_ms"), 5000), (("model_config", "max_input_tokens"), 500),
    (("model_config", "seed"), 7), (("priority",), 3),
]


def _with(path: tuple[str, ...], value: Any, task_id: str = "t1") -> dict[str, Any]:
    task = copy.deepcopy(BASE)
    task["task_id"] = task_id
    where = task
    for key in path[:-1]:
        where = where[key]
    where[path[-1]] = value
    return task


@given(st.sampled_from(NUMBERS), st.booleans(), st.booleans())
def test_true_or_false_for_a_number_is_refused_naming_the_field(
        number: tuple[tuple[str, ...], Any], flag: bool, config_known: bool) -> None:
    path, good = number
    intake = Intake()
    intake.line(orjson.dumps(_with(path, good, "t0")), 1)  # the number itself passes
    if config_known and path != ("priority",):
        # The same config seen before: only the task's own fields differ.
        intake.line(orjson.dumps(_with(path, good, "t1")), 2)
    with pytest.raises(SpecError, match=rf"{str(flag).lower()} is not a number") as err:
        intake.line(orjson.dumps(_with(path, flag, "t2")), 3)
    assert err.value.field == ".".join(path)
    assert err.value.line == 3
