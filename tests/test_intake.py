"""A submit checks each distinct config once and each task's own fields by a fast path:
every task must come out as the full check (``parse_task`` + ``check_spec``) makes it,
and every bad task must be refused with the full check's words."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from lockgate.errors import SpecError
from lockgate.files import Checks, Intake
from lockgate.spec import parse_task
from lockgate.store.store import new_task


def _line(i: int, **over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "task_id": f"t-{i}", "batch_id": "b",
        "prompt_template": [{"role": "system", "content": "Label it."},
                            {"role": "user", "content": "{text}"}],
        "input_data": {"text": f"row {i}"},
        "model_config": {"name": "m", "max_tokens": 8},
        "delivery_rule": {"format": "json", "required_keys": ["label"]},
        "retry_policy": {"max_retries": 2},
    }
    return base | over


def _full(obj: dict[str, Any], line: int, checks: Checks) -> Any:
    """The row a fresh intake makes (every task on the full path)."""
    return Intake(checks).line(orjson.dumps(obj), line)


GOOD = [
    _line(2),
    _line(3, priority=7, metadata={"source": "crm", "n": [1, 2]}),
    _line(4, batch_id=None),
    _line(5, metadata={}),
    _line(6, input_data={"text": "ünïcode ✓ \u2028"}),
    _line(8, input_data={"text": "x"}, task_id="t-\u00e9"),
]

BAD = [
    _line(10, task_id=""),
    _line(11, task_id=" padded"),
    _line(12, task_id="gate:x"),
    _line(13, task_id="x" * 192),
    _line(14, task_id=17),
    _line(15, priority="high"),
    _line(16, priority=1001),
    _line(17, priority=None),
    _line(18, priority=True),  # not a number (pydantic had taken it for 1)
    _line(19, metadata=[1]),
    _line(20, batch_id="tab\there"),
    _line(21, input_data={"txt": "missing placeholder"}),
    _line(22, input_data={"text": "x", "extra": "unused"}),
    _line(23, input_data="not a mapping"),
    _line(24, input_data={"text": "y" * 2000}),
    _line(25, colour="red"),
    _line(26, input_data={"text": "x", "deep": [[[[[[[[[[]]]]]]]]]]}),
]


@pytest.mark.parametrize("obj", GOOD, ids=lambda o: o["task_id"])
def test_a_task_of_a_known_config_comes_out_as_the_full_check_makes_it(
        obj: dict[str, Any]) -> None:
    checks = Checks(max_input_bytes=1000)
    warm = Intake(checks)
    first = warm.line(orjson.dumps(_line(1)), 1)
    got = warm.line(orjson.dumps(obj), 9)
    want = _full(obj, 9, checks)
    assert got == want
    direct = new_task(parse_task(copy.deepcopy(obj)))
    if obj.get("metadata") == {}:
        # An intake keeps an empty metadata object (store.new_task alone writes NULL).
        direct = direct._replace(metadata_json="{}")
    assert got == direct
    if obj["input_data"] == _line(0)["input_data"] | {"text": obj["input_data"]["text"]}:
        assert got.config is first.config  # one config object for the whole file


@pytest.mark.parametrize("obj", BAD, ids=lambda o: o["task_id"] if isinstance(
    o["task_id"], str) and o["task_id"].isprintable() else repr(o["task_id"])[:12])
def test_a_bad_task_of_a_known_config_is_refused_in_the_full_checks_words(
        obj: dict[str, Any]) -> None:
    checks = Checks(max_input_bytes=1000)
    warm = Intake(checks)
    warm.line(orjson.dumps(_line(1)), 1)
    with pytest.raises(SpecError) as fresh:
        _full(obj, 9, checks)
    with pytest.raises(SpecError) as fast:
        warm.line(orjson.dumps(obj), 9)
    assert str(fast.value) == str(fresh.value)
    assert fast.value.field == fresh.value.field


def test_configs_that_differ_in_any_way_are_checked_and_stored_apart() -> None:
    intake = Intake()
    a = intake.line(orjson.dumps(_line(1)), 1)
    b = intake.line(orjson.dumps(_line(2, model_config={"name": "m", "max_tokens": 9})), 2)
    c = intake.line(orjson.dumps(_line(3, retry_policy={"max_retries": 2, "jitter": 0})), 3)
    assert len({a.config.hash, b.config.hash, c.config.hash}) == 3
    # Written another way, the same config: checked apart, stored once.
    d = intake.line(orjson.dumps(_line(5, model_config={"max_tokens": 8.0, "name": "m"})), 5)
    assert d.config.hash == a.config.hash
    with pytest.raises(SpecError, match="max_retries"):
        intake.line(orjson.dumps(_line(4, retry_policy={"max_retries": -1})), 4)


@pytest.mark.parametrize(("template", "field", "message"), [
    ([{"role": "sytem", "content": "x"}, {"role": "user", "content": "{text}"}],
     "prompt_template[0].role", "Input should be 'system', 'user', 'assistant' or "
                                "'developer'"),
    ([{"role": "user"}], "prompt_template[0].content", "is required"),
    (5, "prompt_template", "must be a string or a list"),
])
def test_a_bad_prompt_template_is_named_by_its_place_not_by_pydantic_s_union(
        template: Any, field: str, message: str) -> None:
    """A typo in a message's role was reported as ``field 'prompt_template.str': Input
    should be a valid string; also 'prompt_template.tuple[Message, ...][0].role' ...``:
    the branches of the field's type, named by pydantic, for a list of messages."""
    line = _line(1, prompt_template=template)
    with pytest.raises(SpecError) as caught:
        parse_task(line)
    assert (caught.value.field, caught.value.reason) == (field, message)
