"""Numbers that cannot be delivered as the model wrote them (review of 2026-12-06,
groups F and I).

A non-finite number (``1e400``, ``NaN``, ``Infinity``, ``-Infinity``) makes the output
unusable with an error naming its field, in lists too, and is never converted to a
string ("null", "NaN", "Infinity" with its sign lost) nor stored as null. An integer
that a float cannot hold exactly (past 2^53) is never delivered as if exact: not as a
float's digits in a string field, not as a rounded integer.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from lockgate.runtime import ParseStatus, parse_output
from lockgate.spec import DeliveryRule


def _rule(props: dict[str, Any], fallback: dict[str, Any] | None = None) -> DeliveryRule:
    return DeliveryRule.model_validate({
        "schema": {"type": "object", "properties": props, "required": list(props)},
        "fallback_values": fallback or {}})


STR = _rule({"x": {"type": "string"}})
STRS = _rule({"x": {"type": "array", "items": {"type": "string"}}})
NUM = _rule({"x": {"type": "number"}})
INT = _rule({"x": {"type": "integer"}})
NOSCH = DeliveryRule.model_validate({"required_keys": ["label"]})


@pytest.mark.parametrize("rule", [STR, NUM], ids=["string", "number"])
@pytest.mark.parametrize("raw", [
    '{"x": 1e400}', 'Answer: {"x": 1e999}', '{"x": -Infinity}', '{"x": NaN}',
    '{"x": Infinity,}', "{'x': -Infinity}", '```json\n{"x": NaN}\n```'])
def test_a_non_finite_number_makes_the_output_unusable(rule: DeliveryRule, raw: str) -> None:
    parsed = parse_output(raw, rule)
    assert parsed.status is ParseStatus.SCHEMA_VIOLATION, (parsed.status, parsed.value)
    assert parsed.error is not None and "x holds a number JSON cannot hold" in parsed.error


@pytest.mark.parametrize("raw, field", [
    ('{"x": [1e400, "a"]}', "x[0]"), ('{"x": ["a", -1e999]}', "x[1]"),
    ('{"x": [NaN, "a"]}', "x[0]"), ('{"x": ["a", NaN]}', None)])
def test_a_non_finite_number_in_a_list(raw: str, field: str | None) -> None:
    parsed = parse_output(raw, STRS)
    assert not parsed.usable
    if field is not None:  # (the scan reads a bare word after a list's comma as a cut)
        assert parsed.error is not None
        assert f"{field} holds a number JSON cannot hold" in parsed.error


@pytest.mark.parametrize("raw", ['{"label": "x", "s": NaN}', '{"label": NaN}',
                                 '{"label": "x", "s": [-Infinity]}'])
def test_a_non_finite_number_without_a_schema(raw: str) -> None:
    assert not parse_output(raw, NOSCH).usable


def test_a_non_finite_number_is_not_mended_by_a_fallback() -> None:
    parsed = parse_output('{"x": NaN, "y": "ok"}', _rule(
        {"x": {"type": "number"}, "y": {"type": "string"}}, fallback={"x": 0}))
    assert parsed.status is ParseStatus.SCHEMA_VIOLATION


def test_the_words_in_strings_are_not_numbers() -> None:
    parsed = parse_output('{"x": "NaN, Infinity: -Infinity",}', STR)
    assert parsed.usable and parsed.value == {"x": "NaN, Infinity: -Infinity"}


@pytest.mark.parametrize("raw", ['{"x": 18446744073709551616}', '{"x": 9007199254740993.0}',
                                 '{"x": [18446744073709551616]}'])
def test_an_integer_a_float_cannot_hold_is_not_written_as_a_string(raw: str) -> None:
    rule = STRS if "[" in raw else STR
    assert not parse_output(raw, rule).usable


@pytest.mark.parametrize("raw", ['{"x": 9007199254740993.0}',
                                 '{"x": "9007199254740993.5"}', '{"x": -18446744073709551616.0}'])
def test_an_integer_a_float_cannot_hold_is_not_delivered_as_exact(raw: str) -> None:
    parsed = parse_output(raw, INT)
    assert not parsed.usable, (parsed.status, parsed.value)


@pytest.mark.parametrize("raw, value", [
    ('{"x": 9007199254740993}', 9007199254740993), ('{"x": "9007199254740993"}',
                                                     9007199254740993),
    ('{"x": 3.0}', 3), ('{"x": 9007199254740991.0}', 9007199254740991)])
def test_exact_integers_are_still_delivered(raw: str, value: int) -> None:
    parsed = parse_output(raw, INT)
    assert parsed.usable and parsed.value == {"x": value}
    assert type(parsed.value["x"]) is int


@pytest.mark.parametrize("raw, value", [('{"x": 0.5}', "0.5"), ('{"x": 12}', "12"),
                                        ('{"x": 18446744073709551616.5}', None)])
def test_finite_numbers_still_become_strings(raw: str, value: str | None) -> None:
    parsed = parse_output(raw, STR)
    if value is None:  # (a float that large is integral: refused, as above)
        assert not parsed.usable
    else:
        assert parsed.usable and parsed.value == {"x": value}


@pytest.mark.parametrize("raw, text", [('{"x": 1e300}', "1e+300"), ('{"x": 1.8e19}', "1.8e+19")])
def test_a_large_float_written_with_few_digits_is_kept_as_written(raw: str, text: str) -> None:
    """Refusing every whole float past 2^53 refused ``1e17`` too, which is exactly the
    number the model wrote."""
    parsed = parse_output(raw, STR)
    assert parsed.usable and parsed.value == {"x": text}, (parsed.status, parsed.value)


@pytest.mark.parametrize("raw", ['{"x": 1e17}', '{"x": -2e19}', '{"x": 1.5e20}'])
def test_a_large_integral_float_written_with_few_digits_is_valid(raw: str) -> None:
    """Past 2^53 but the number written (at most 15 significant digits): exact, as
    JSON Schema's integer takes it."""
    parsed = parse_output(raw, INT)
    assert parsed.usable and parsed.value == orjson.loads(raw), (parsed.status, parsed.value)
