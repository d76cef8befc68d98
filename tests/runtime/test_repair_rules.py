"""The delivery rules of the ladder, one per class of output a model gets wrong:
fallbacks, outputs with nothing recovered, wrappers, full-width syntax, several
objects, truncation, and outputs that must not break the parser."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from lockgate.runtime import ParseStatus, parse_output
from lockgate.runtime.output import INTERNAL
from lockgate.spec import DeliveryRule

YES_NO = DeliveryRule.model_validate({
    "schema": {"type": "object",
               "properties": {"answer": {"enum": ["yes", "no"]}, "note": {"type": "string"}},
               "required": ["answer", "note"]},
    "fallback_values": {"note": ""},
    "aliases": {"answer": ["回答"]},
})

RISK = DeliveryRule.model_validate({
    "schema": {"type": "object",
               "properties": {"risk_level": {"enum": ["safe", "unsafe"]},
                              "reason": {"type": "string"},
                              "score": {"type": "integer", "minimum": 0, "maximum": 100}},
               "required": ["risk_level", "reason"]},
    "fallback_values": {"reason": "", "score": None},
})

# Every field has a fallback: only the model's own fields can make an answer.
ALL_FALLBACK = DeliveryRule.model_validate({
    "schema": {"type": "object",
               "properties": {"category": {"enum": ["物流", "质量", "其他"]},
                              "severity": {"type": "integer", "minimum": 1, "maximum": 5},
                              "summary": {"type": "string"}},
               "required": ["category", "severity", "summary"]},
    "fallback_values": {"category": "其他", "severity": 3, "summary": ""},
    "aliases": {"category": ["类别"], "severity": ["严重程度"]},
})


def _ok(p: Any, value: Any, status: ParseStatus | None = None) -> None:
    assert p.usable, p
    assert p.value == value, p
    if status is not None:
        assert p.status is status, p


# --- fallbacks are the user's answer, "" and null included -----------------------------

@pytest.mark.parametrize("raw", ['{"answer": "yes"}', '{"answer": "yes", "note": null}',
                                 '{"answer": "yes", "note": ""}', '{"answer": "yes", "note": " "}'])
def test_an_empty_fallback_for_a_required_field_is_delivered(raw: str) -> None:
    p = parse_output(raw, YES_NO)
    _ok(p, {"answer": "yes", "note": ""}, ParseStatus.FILLED_FALLBACK)
    assert "fallback:note" in p.fixes and p.error is None and p.conforms


def test_a_null_fallback_is_delivered_even_where_the_schema_wants_a_number() -> None:
    p = parse_output('{"risk_level": "unsafe"}', RISK)
    _ok(p, {"risk_level": "unsafe", "reason": "", "score": None}, ParseStatus.FILLED_FALLBACK)
    assert p.completeness == 0.5 and p.missing == ("reason",)


def test_a_value_the_model_gave_is_still_judged() -> None:
    p = parse_output('{"risk_level": "maybe", "reason": "x"}', RISK)
    assert p.status is ParseStatus.SCHEMA_VIOLATION and "risk_level" in (p.error or "")
    p = parse_output('{"risk_level": "safe", "reason": "x", "score": 900}', RISK)
    _ok(p, {"risk_level": "safe", "reason": "x", "score": None}, ParseStatus.FILLED_FALLBACK)
    assert "fallback:score(invalid)" in p.fixes


# --- nothing recovered is never an answer -----------------------------------------------

@pytest.mark.parametrize("raw", [
    '{"payload": {"answer": {"text": "x"}}}',
    '{"ok": true, "输出": {"描述": "无法判断"}}',
    '{"分析": {"foo": 1}, "model": "x", "ms": 12}',
    '{}',
    '{"category": null, "severity": "", "summary": "  "}',
    '{"category": "不确定", "severity": "很高"}',  # both replaced by their fallbacks
    '[{"text": "x"}]',
])
def test_no_declared_field_from_the_model_is_unusable_whatever_the_fallbacks(raw: str) -> None:
    p = parse_output(raw, ALL_FALLBACK)
    assert p.status is ParseStatus.SCHEMA_VIOLATION, p
    assert not p.usable and "no declared field" in (p.error or "")


def test_a_blank_string_is_not_a_one_element_list() -> None:
    rule = DeliveryRule.model_validate({
        "schema": {"type": "object", "properties": {"answer": {"type": "string"},
                                                    "tags": {"type": "array"}}},
        "fallback_values": {"answer": "", "tags": []}})
    p = parse_output('{"answer": null, "tags": " "}', rule)
    assert p.status is ParseStatus.SCHEMA_VIOLATION, p


# --- outputs that must not break the parser -----------------------------------------------

@pytest.mark.parametrize("raw", [
    "\ud800",
    '{"answer": "yes", "note": "\ud800"}',
    '{"answer": "yes", "note": "\ud800',
    '{"answer": "yes", "note": "\\ud800"}x',
    b'{"answer": "yes", "note": "\xff\xfe"}'.decode("utf-8", "surrogateescape"),
])
def test_lone_surrogates_are_replaced_not_raised(raw: str) -> None:
    p = parse_output(raw, YES_NO)
    assert not (p.error or "").startswith(INTERNAL)
    assert p.usable and p.value["answer"] == "yes" if "yes" in raw else True
    orjson.dumps(p.value)


def test_a_text_rule_gets_a_storable_text() -> None:
    p = parse_output("ok \ud83d", DeliveryRule(format="text"))
    assert p.value == "ok \ufffd" and p.status is ParseStatus.REPAIRED


def test_nul_bytes_and_huge_integers_are_storable() -> None:
    p = parse_output('\x00{"answer": "yes", "note": "a\x00b", "n": 1' + "0" * 30 + ",}", YES_NO)
    assert p.usable and p.value["note"] == "a\x00b"
    orjson.dumps(p.value)


def test_json_nested_deeper_than_orjson_writes_is_unusable() -> None:
    raw = "[" * 300 + "]" * 300
    p = parse_output(raw, DeliveryRule())
    assert p.status is ParseStatus.INVALID_JSON and "cannot be written" in (p.error or "")


def test_fix_labels_are_bounded() -> None:
    rule = DeliveryRule.model_validate({"schema": {
        "type": "object", "properties": {"answer": {"type": "string"}},
        "additionalProperties": False}})
    raw = json.dumps({"answer": "yes", **{f"k{i}" * 50: i for i in range(5000)}})
    p = parse_output(raw, rule)
    assert p.value == {"answer": "yes"}
    assert len(p.fixes) == 65 and p.fixes[-1] == f"+{5000 - 64} more"
    assert max(len(f) for f in p.fixes) <= 170
