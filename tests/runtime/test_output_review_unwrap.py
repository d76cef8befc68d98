"""Wrappers that are never unwrapped (review of 2026-12-06, group G).

An object that reports an error or a refusal, and a key that holds the input
(``input``, ``prompt`` ...), never give the answer, for object answers as for list
answers (one rule).
"""

from __future__ import annotations

import json

import pytest

from lockgate.runtime import parse_output
from lockgate.spec import DeliveryRule

YN = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["answer"],
    "properties": {"answer": {"enum": ["yes", "no"]}, "reason": {"type": "string"}}}})
LIST = DeliveryRule.model_validate({"schema": {"type": "array", "items": {"type": "string"}}})
ANSWER = {"answer": "no"}


@pytest.mark.parametrize("wrapper", [
    {"input": ANSWER}, {"input": json.dumps(ANSWER)}, {"prompt": json.dumps(ANSWER)},
    {"Prompt": ANSWER, "model": "x"}, {"messages": ANSWER},
    {"refusal": "I can't", "output": ANSWER}, {"status": "failed", "output": ANSWER},
    {"status": "ERROR", "result": json.dumps(ANSWER)}, {"error": ANSWER},
    {"errors": [ANSWER]}, {"state": "Rejected", "message": "quota", "data": ANSWER},
    {"result": {"error": ANSWER}}, {"data": {"input": ANSWER}},
])
def test_an_error_a_refusal_or_the_input_is_never_unwrapped(wrapper: dict[str, object]) -> None:
    parsed = parse_output(json.dumps(wrapper), YN)
    assert not parsed.usable, (parsed.status, parsed.value, parsed.fixes)


@pytest.mark.parametrize("wrapper", [
    {"input": "the review", "output": ANSWER}, {"result": ANSWER, "model": "x"},
    {"status": "ok", "output": ANSWER}, {"data": {"result": json.dumps(ANSWER)}},
])
def test_other_wrappers_still_unwrap(wrapper: dict[str, object]) -> None:
    parsed = parse_output(json.dumps(wrapper), YN)
    assert parsed.usable and parsed.value == ANSWER


@pytest.mark.parametrize("wrapper", [{"input": ["a"]}, {"error": ["a"]},
                                     {"status": "failed", "items": ["a"]}])
def test_list_answers_follow_the_same_rule(wrapper: dict[str, object]) -> None:
    assert not parse_output(json.dumps(wrapper), LIST).usable


@pytest.mark.parametrize("envelope", [
    {"error": None, "result": ANSWER}, {"error": False, "data": ANSWER},
    {"status": "ok", "error": "", "data": ANSWER}, {"errors": [], "result": ANSWER},
    {"refusal": None, "response": ANSWER}, {"success": True, "refusal": None, "output": ANSWER},
    {"status": "ok", "message": "done", "data": ANSWER},
    {"status": "success", "message": "classified", "result": ANSWER},
])
def test_a_success_envelope_is_unwrapped(envelope: dict[str, object]) -> None:
    """An error or refusal key that holds nothing, or a status that says all went
    well, reports no failure: the answer inside is delivered (it was refused whenever
    such a key was present)."""
    out = parse_output(json.dumps(envelope), YN)
    assert out.usable and out.value == ANSWER, out
