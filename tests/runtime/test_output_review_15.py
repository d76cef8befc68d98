"""Output review 15: a bracket left open in the prose before an object (read as a list
the output was cut inside) never makes an element that is no object (``[]``, ``[1]``)
the answer ahead of the complete object that follows it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lockgate.runtime import parse_output
from lockgate.runtime.settle import ParseStatus
from lockgate.spec import DeliveryRule

SENT = DeliveryRule.model_validate(
    {
        "schema": {
            "type": "object",
            "properties": {
                "label": {"enum": ["positive", "negative", "neutral"]},
                "score": {"type": "number"},
            },
            "required": ["label"],
        }
    }
)


@pytest.mark.parametrize(
    "raw, value",
    [
        ("[[]{}", {}),
        ("[[]'{}", {}),
        ("[['{}", {}),
        ('[[1]{"a": 1}', {"a": 1}),
        ("[ []{}", {}),
        ('a[[]{"a": 1}', {"a": 1}),
        ('[[1], {"a": 1}', {"a": 1}),
        ('See [[2], [3] and {"a": 1}', {"a": 1}),
        ('[[{"a": 1}]{"b": 2}', {"b": 2}),
        # (as before: no open bracket, or an object first)
        ("[]{}", {}),
        ("[{}", {}),
        ("x [] {}", {}),
        ('[{"a": 1}, {"b": 2}', {"a": 1}),
    ],
)
def test_an_object_after_an_open_bracket_beats_the_elements_before_it(raw: str, value: Any) -> None:
    p = parse_output(raw, DeliveryRule())
    assert p.usable, p
    assert p.value == value


def test_a_cut_list_of_lists_still_gives_its_first_element() -> None:
    # (no object in it: its first complete element, as before)
    p = parse_output("[[1], [2]", DeliveryRule())
    assert (p.usable, p.value) == (True, [1])


def test_a_declared_object_after_an_open_bracket() -> None:
    p = parse_output('[[1] {"label": "negative", "score": 0.2}', SENT)
    assert p.usable and p.value == {"label": "negative", "score": 0.2}


def test_a_provider_cut_is_still_refused() -> None:
    p = parse_output("[[]{}", DeliveryRule(), finish_reason="length")
    assert p.status is ParseStatus.TRUNCATED and not p.usable


def _holds_no_value(chatter: str) -> bool:
    """Whether ``chatter`` alone gives no answer but one read from a list it leaves open
    (``[[]``): a list it closes (``[[]]``) is a value written before the object."""
    alone = parse_output(chatter, DeliveryRule())
    return not alone.usable or "extracted:truncated" in alone.fixes


_bits = st.sampled_from(["[", "]", "[]", "[1]", "[[", " ", ",", "a", "1", "\n", ":", "'"])
_bracketed = st.lists(_bits, max_size=8).map("".join)
#: (no closing bracket after the object: ``[`` + the object + ``]`` is a list holding it)
_words = st.lists(st.sampled_from([" ", ",", "a", "1", "\n", ":", "'", "."]), max_size=6).map(
    "".join
)
_ints = st.integers(min_value=-(2**53), max_value=2**53)
_objects = st.dictionaries(
    st.text(max_size=5),
    st.none() | _ints | st.text(max_size=5) | st.lists(_ints, max_size=3),
    max_size=3,
)


@settings(max_examples=500, deadline=None)
@given(obj=_objects, before=_bracketed.filter(_holds_no_value), after=_words, indent=st.booleans())
def test_an_object_after_stray_brackets_is_recovered_exactly(
    obj: dict[str, Any], before: str, after: str, indent: bool
) -> None:
    body = json.dumps(obj, ensure_ascii=False, indent=2 if indent else None)
    p = parse_output(f"{before}{body}{after}", DeliveryRule())
    assert p.usable, p
    assert p.value == obj
