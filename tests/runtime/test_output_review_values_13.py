"""Values the output pass changed while converting them (review 13, "values").

* A number written with a leading zero (``02134``, ``0049301234``, ``[007, 042]``) is
  no JSON number; the repair read it as an integer without its zeros, and a string
  field got ``"2134"`` as if the conversion were lossless. It is now the text as
  written: a string field keeps its zeros; an integer or number field reads the
  decimal number from it (``007`` is 7, as the string ``"007"`` is), status
  ``coerced``.
* An integer beyond 64 bits read by a Python literal or the repair was delivered as
  an approximating float (``1.2345678901234568e+29`` in an integer field); it is now
  refused (``schema_violation``, naming its field), as strict JSON's reading of it
  is in an integer field, unless the float's shortest form is the number written
  (``10**30`` is ``1e+30``). A string field still takes its digits as written.
* A list of numbers written in a string with decimal commas (``"19,99"``,
  ``"1,5, 2,5"``) was split at them into separate numbers; a comma between two
  digits is now never a list's separator for numeric items (``"1, 2"`` and ``"1; 2"``
  still are).
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lockgate.runtime import ParseStatus, parse_output
from lockgate.spec import DeliveryRule


def _rule(props: dict[str, Any]) -> DeliveryRule:
    return DeliveryRule.model_validate({
        "schema": {"type": "object", "properties": props, "required": [next(iter(props))]}})


CODES = _rule({"zip": {"type": "string"}, "phone": {"type": "string"},
               "codes": {"type": "array", "items": {"type": "string"}}})
NUMBERS = _rule({"n": {"type": "integer"}, "x": {"type": "number"},
                 "ns": {"type": "array", "items": {"type": "integer"}}})
PERSON = _rule({"name": {"type": "string"}, "age": {"type": "integer"},
                "score": {"type": "number"}, "any": {}})
PRICES = _rule({"prices": {"type": "array", "items": {"type": "number"}}})
COUNTS = _rule({"counts": {"type": "array", "items": {"type": "integer"}}})
STARS = _rule({"stars": {"type": "array", "items": {"enum": [1, 2, 3, 4, 5]}}})


# -- 1. leading zeros -------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "value"), [
    ('{"zip": 02134}', {"zip": "02134"}),
    ('{"zip": 00501}', {"zip": "00501"}),
    ("{'zip': 01234}", {"zip": "01234"}),
    ('{"zip": "x", "phone": 0049301234}', {"zip": "x", "phone": "0049301234"}),
    ('{"zip": "x", "codes": [007, 042]}', {"zip": "x", "codes": ["007", "042"]}),
    ('```json\n{"zip": 02134, "phone": "1"}\n```', {"zip": "02134", "phone": "1"}),
    ("{zip: 02134, phone: -007}", {"zip": "02134", "phone": "-007"}),
])
def test_a_number_with_leading_zeros_keeps_them_in_a_string_field(
        raw: str, value: dict[str, Any]) -> None:
    parsed = parse_output(raw, CODES)
    assert parsed.usable and parsed.value == value, (parsed.status, parsed.value, parsed.error)


@pytest.mark.parametrize(("raw", "value"), [
    ('{"n": 007}', {"n": 7}),
    ('{"n": 1, "x": 00.5}', {"n": 1, "x": 0.5}),
    ('{"n": -012}', {"n": -12}),
    ('{"n": 1, "ns": [01, 002, 3]}', {"n": 1, "ns": [1, 2, 3]}),
])
def test_a_number_with_leading_zeros_is_its_decimal_number_in_a_number_field(
        raw: str, value: dict[str, Any]) -> None:
    parsed = parse_output(raw, NUMBERS)
    assert parsed.usable and parsed.value == value, (parsed.status, parsed.value, parsed.error)
    assert parsed.status is ParseStatus.COERCED


@settings(max_examples=150, deadline=None)
@given(zeros=st.integers(1, 4), digits=st.text("0123456789", min_size=1, max_size=12),
       python=st.booleans())
def test_leading_zeros_are_never_lost_in_a_string_field(zeros: int, digits: str,
                                                        python: bool) -> None:
    written = "0" * zeros + digits
    raw = (f"{{'zip': {written}, 'phone': None}}" if python
           else f'{{"zip": {written}, "codes": [{written}, 1]}}')
    parsed = parse_output(raw, CODES)
    assert parsed.usable, (raw, parsed.error)
    assert parsed.value["zip"] == written
    if not python:
        assert parsed.value["codes"] == [written, "1"]


# -- 2. integers beyond 64 bits ---------------------------------------------------------

BIG = "123456789012345678901234567890"


@pytest.mark.parametrize("raw", [
    f"{{'name': 'A', 'age': {BIG}}}",
    "{'name': 'A', 'age': 18446744073709551616}",
    "{'name': 'A', 'age': -9223372036854775809}",
    f"{{name: 'A', age: {BIG}}}",
    f"{{'name': 'A', 'age': 1, 'score': {BIG}}}",
    f"{{'name': 'A', 'age': 1, 'any': [1, {BIG}]}}",
])
def test_an_integer_beyond_64_bits_is_refused_never_a_float(raw: str) -> None:
    parsed = parse_output(raw, PERSON)
    assert parsed.status is ParseStatus.SCHEMA_VIOLATION, (parsed.status, parsed.value)
    assert parsed.error is not None and "beyond 64 bits" in parsed.error


def test_an_integer_beyond_64_bits_is_refused_as_strict_json_is() -> None:
    for raw in (f'{{"name": "A", "age": {BIG}}}', f"{{'name': 'A', 'age': {BIG}}}"):
        assert parse_output(raw, PERSON).status is ParseStatus.SCHEMA_VIOLATION, raw


@pytest.mark.parametrize("raw", ["{'name': 'A', 'age': 18446744073709551615}",
                                 "{'name': 'A', 'age': -9223372036854775808}"])
def test_an_integer_within_64_bits_is_still_delivered(raw: str) -> None:
    # (as strict JSON's reader, orjson, reads and writes it exactly)
    parsed = parse_output(raw, PERSON)
    assert parsed.usable and type(parsed.value["age"]) is int, parsed


def test_an_integer_beyond_64_bits_keeps_its_digits_in_a_string_field() -> None:
    parsed = parse_output(f"{{'zip': {BIG}, 'phone': None}}", CODES)
    assert parsed.usable and parsed.value == {"zip": BIG}


@settings(max_examples=100, deadline=None)
@given(n=st.one_of(st.integers(1 << 64, 10 ** 60), st.integers(-(10 ** 60), -(1 << 63) - 1)))
def test_no_integer_beyond_64_bits_is_delivered_as_an_approximation(n: int) -> None:
    for field in ("age", "score", "any"):
        parsed = parse_output(f"{{'name': 'A', 'age': 1, '{field}': {n}}}", PERSON)
        if parsed.usable:  # only as a float whose shortest form is the number written
            assert Decimal(repr(parsed.value[field])) == n, (n, parsed.value)
        else:
            assert parsed.status is ParseStatus.SCHEMA_VIOLATION, (n, parsed.status)


@pytest.mark.parametrize("n", [10 ** 30, -(10 ** 20), 19 * 10 ** 18])
def test_an_integer_beyond_64_bits_a_float_holds_exactly_is_that_float(n: int) -> None:
    # as strict JSON reads it (orjson: 1e+30), also in an integer field
    for raw in (f'{{"name": "A", "age": {n}}}', f"{{'name': 'A', 'age': {n}}}"):
        parsed = parse_output(raw, PERSON)
        assert parsed.usable and parsed.value["age"] == float(n), (raw, parsed)
    parsed = parse_output(f"{{'name': 'A', 'age': {n + 1}}}", PERSON)
    assert parsed.status is ParseStatus.SCHEMA_VIOLATION


# -- 3. decimal commas in a list of numbers ---------------------------------------------

@pytest.mark.parametrize("text", ["19,99", "2,50", "0,5", "2,5", "1,5, 2,5", "3,14159",
                                  "1,5,2,5", "1，5"])
def test_a_decimal_comma_does_not_split_a_list_of_numbers(text: str) -> None:
    parsed = parse_output(f'{{"prices": "{text}"}}', PRICES)
    assert parsed.status is ParseStatus.SCHEMA_VIOLATION, (parsed.status, parsed.value)


@pytest.mark.parametrize(("rule", "field", "text"), [
    (COUNTS, "counts", "1,2"), (COUNTS, "counts", "10,20, 30"), (STARS, "stars", "4,5")])
def test_a_comma_between_digits_is_no_separator_of_integers(rule: DeliveryRule, field: str,
                                                            text: str) -> None:
    parsed = parse_output(f'{{"{field}": "{text}"}}', rule)
    assert parsed.status is ParseStatus.SCHEMA_VIOLATION, (parsed.status, parsed.value)


@settings(max_examples=100, deadline=None)
@given(xs=st.lists(st.integers(0, 999), min_size=2, max_size=6),
       sep=st.sampled_from([", ", "; ", " ,  ", ";"]))
def test_numbers_separated_by_comma_space_or_semicolon_are_still_split(xs: list[int],
                                                                       sep: str) -> None:
    for rule, field in ((PRICES, "prices"), (COUNTS, "counts")):
        parsed = parse_output(f'{{"{field}": "{sep.join(map(str, xs))}"}}', rule)
        assert parsed.usable and parsed.value == {field: xs}, (sep, parsed.error)
