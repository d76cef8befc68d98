"""The delivery rules of the ladder, one per class of output a model gets wrong:
fallbacks, outputs with nothing recovered, wrappers, full-width syntax, several
objects, truncation, and outputs that must not break the parser."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from lockgate.runtime import ParseStatus, parse_output
from lockgate.runtime.output import INTERNAL, MAX_SEARCH
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
COMPLAINT = {"category": "物流", "severity": 4, "summary": "快递延误，客户说：“再不到就退货”。"}


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
    'Here: {"lang": "zh"} and {"id": 3}',
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


@pytest.mark.parametrize("raw", ['{"category": "物', '{"类别": ', '```json\n{"severity"'])
def test_cut_before_any_value_finished_is_invalid_json(raw: str) -> None:
    p = parse_output(raw, ALL_FALLBACK)
    assert p.status is ParseStatus.INVALID_JSON and p.truncated, p


# --- wrappers ---------------------------------------------------------------------------

@pytest.mark.parametrize("raw", [
    json.dumps({"payload": {"answer": COMPLAINT}}, ensure_ascii=False),
    json.dumps({"a": {"b": {"c": {"d": {"e": COMPLAINT}}}}}, ensure_ascii=False),
    json.dumps({"ok": True, "输出": COMPLAINT}, ensure_ascii=False),
    json.dumps({"分析": COMPLAINT, "model": "x", "ms": 12}, ensure_ascii=False),
    json.dumps({"result": COMPLAINT, "usage": {"tokens": 12}}, ensure_ascii=False),
    json.dumps({"result": json.dumps(COMPLAINT, ensure_ascii=False)}, ensure_ascii=False),
    json.dumps({"results": [COMPLAINT]}, ensure_ascii=False),
    "结果如下：" + json.dumps({"data": {"结果": COMPLAINT}}, ensure_ascii=False) + " 谢谢",
])
def test_wrappers_are_removed_at_any_depth(raw: str) -> None:
    p = parse_output(raw, ALL_FALLBACK)
    _ok(p, COMPLAINT, ParseStatus.REPAIRED)
    assert "unwrapped:object" in p.fixes


def test_a_wrapper_named_like_a_field_that_is_never_an_object_is_a_wrapper() -> None:
    raw = json.dumps({"类别": COMPLAINT}, ensure_ascii=False)  # an alias of category
    _ok(parse_output(raw, ALL_FALLBACK), COMPLAINT, ParseStatus.REPAIRED)


def test_a_wrapper_is_kept_when_the_outer_object_names_a_declared_field() -> None:
    p = parse_output('{"category": "物流", "data": {"severity": 2}}', ALL_FALLBACK)
    assert p.value == {"category": "物流", "data": {"severity": 2}, "severity": 3,
                       "summary": ""}


def test_two_objects_that_both_hold_declared_fields_are_not_guessed_between() -> None:
    raw = '{"a": {"answer": "yes", "note": ""}, "b": {"answer": "no", "note": ""}}'
    assert not parse_output(raw, YES_NO).usable


FIRST = {"answer": "yes", "note": "first"}
SECOND = {"answer": "no", "note": "second, and longer than the first one"}


# --- full-width punctuation and curly quotes as syntax ---------------------------------

@pytest.mark.parametrize("raw", [
    '｛“category”：“物流”，“severity”：4，“summary”：“快递延误，客户说：“再不到就退货”。”｝',
    '{"category"："物流"，"severity"：4，"summary"："快递延误，客户说：“再不到就退货”。"}',
    '｛"category": "物流", "severity": ４, "summary": "快递延误，客户说：“再不到就退货”。"｝',
    '好的：｛“category”：“物流”, "severity"：4，“summary”:'
    '"快递延误，客户说：“再不到就退货”。"｝谢谢',
    '```json\n{“category”: “物流”, “severity”: 4, '
    '“summary”: “快递延误，客户说：“再不到就退货”。”}\n```',
])
def test_full_width_syntax_is_converted_but_never_inside_values(raw: str) -> None:
    p = parse_output(raw, ALL_FALLBACK)
    _ok(p, COMPLAINT, ParseStatus.REPAIRED)
    assert "repaired:punctuation" in p.fixes


@pytest.mark.parametrize("first", ['｛“answer”：“yes”，“note”：“first”｝',
                                   '{“answer”：“yes”，“note”：“first”}'])
def test_a_full_width_object_is_read_in_its_place(first: str) -> None:
    raw = first + " 或者 " + json.dumps(SECOND)
    _ok(parse_output(raw, YES_NO), FIRST)


def test_an_ascii_quote_inside_a_curly_quoted_value_is_kept() -> None:
    p = parse_output('{“answer”：“yes”，“note”：“he said "ok"”}', YES_NO)
    _ok(p, {"answer": "yes", "note": 'he said "ok"'})


# --- several objects ---------------------------------------------------------------------

@pytest.mark.parametrize("raw", [
    json.dumps([FIRST, SECOND]),
    json.dumps(FIRST) + "\n" + json.dumps(SECOND),
    json.dumps(FIRST) + json.dumps(SECOND),
    json.dumps(FIRST) + "\nAnother possible result: " + json.dumps(SECOND),
    "Answer:\n" + json.dumps([FIRST, SECOND], indent=2),
    json.dumps(FIRST) + "\n" + json.dumps(SECOND)[:-9],  # a cut-off second
    "```json\n" + json.dumps(FIRST) + "\n```\nor\n```json\n" + json.dumps(SECOND) + "\n```",
])
def test_the_first_complete_object_is_the_answer(raw: str) -> None:
    _ok(parse_output(raw, YES_NO), FIRST)


@pytest.mark.parametrize("cut", ['{"answer": "no", "note": "trunc', '{"answer": "no", "no',
                                 '{"answer": "no", "note": "trunc\n\nLet me redo:'])
def test_a_cut_off_object_never_beats_a_complete_one(cut: str) -> None:
    _ok(parse_output(cut + "\n" + json.dumps(FIRST), YES_NO), FIRST)
    _ok(parse_output(json.dumps(FIRST) + "\n" + cut, YES_NO), FIRST)


def test_a_fence_inside_a_json_string_is_no_fence() -> None:
    obj = {"answer": "yes", "note": "use ```json blocks```", "x": [{"```": None}]}
    p = parse_output(json.dumps(obj) + " 0", YES_NO)
    _ok(p, {"answer": "yes", "note": "use ```json blocks```", "x": [{"```": None}]})
    p = parse_output('{"0": [{"```": null}], "": {}}0', DeliveryRule())
    _ok(p, {"0": [{"```": None}], "": {}})


def test_an_object_that_is_not_an_answer_does_not_hide_the_next() -> None:
    raw = 'Format: {"answer": "yes|no", "note": "..."}\n' + json.dumps(FIRST)
    _ok(parse_output(raw, YES_NO), FIRST)


# --- truncation --------------------------------------------------------------------------

def test_a_string_cut_off_takes_its_fallback() -> None:
    p = parse_output('{"risk_level": "safe", "score": 3, "reason": "The customer asked for '
                     'a refu', RISK)
    _ok(p, {"risk_level": "safe", "score": 3, "reason": ""}, ParseStatus.FILLED_FALLBACK)
    assert p.truncated and "truncated:reason" in p.fixes and "fallback:reason" in p.fixes


@pytest.mark.parametrize("raw", ['{"note": "ok", "answer": "ye', '{"note": "ok", "answer": "yes',
                                 '{"note": "ok", "answer": '])
def test_an_enum_cut_off_without_fallback_makes_the_output_unusable(raw: str) -> None:
    p = parse_output(raw, YES_NO)
    assert p.status is ParseStatus.SCHEMA_VIOLATION and p.truncated, p
    assert "cut off" in (p.error or "")


def test_a_number_at_the_very_end_is_not_known_to_be_finished() -> None:
    p = parse_output('{"risk_level": "safe", "reason": "ok", "score": 4', RISK)
    _ok(p, {"risk_level": "safe", "reason": "ok", "score": None})
    p = parse_output('{"risk_level": "safe", "reason": "ok", "score": 4\n', RISK)
    _ok(p, {"risk_level": "safe", "reason": "ok", "score": 4})


def test_a_cut_inside_a_wrapper_keeps_the_finished_fields() -> None:
    p = parse_output('{"out": {"risk_level": "safe", "reason": "fine", "score": 3}, "detai',
                     RISK)
    _ok(p, {"risk_level": "safe", "reason": "fine", "score": 3}, ParseStatus.REPAIRED)
    p = parse_output('{"out": {"risk_level": "safe", "reason": "fine", "detai', RISK)
    _ok(p, {"risk_level": "safe", "reason": "fine", "score": None})


def test_a_field_whose_list_is_cut_off_is_not_delivered_in_part() -> None:
    rule = DeliveryRule.model_validate({
        "schema": {"type": "object", "properties": {"answer": {"type": "string"},
                                                    "tags": {"type": "array"}}},
        "fallback_values": {"tags": []}})
    p = parse_output('{"answer": "yes", "tags": ["a", "b", "c', rule)
    _ok(p, {"answer": "yes", "tags": []}, ParseStatus.FILLED_FALLBACK)
    assert "truncated:tags" in p.fixes


def test_keep_truncated_delivers_the_cut_value() -> None:
    rule = DeliveryRule.model_validate({**RISK.model_dump(by_alias=True),
                                        "keep_truncated": True})
    p = parse_output('{"risk_level": "safe", "score": 3, "reason": "The customer asked for '
                     'a refu', rule)
    _ok(p, {"risk_level": "safe", "score": 3, "reason": "The customer asked for a refu"},
        ParseStatus.REPAIRED)
    assert p.truncated


def test_keep_truncated_is_left_out_of_the_stored_rule_when_unset() -> None:
    assert "keep_truncated" not in RISK.model_dump(by_alias=True, exclude_none=True)
    with pytest.raises(ValueError):
        DeliveryRule.model_validate({"keep_truncted": True})


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


@pytest.mark.parametrize("raw", [
    "[" * 100_000 + "]" * 100_000,
    "[" * 100_000,
    '{"a":' * 100_000,
    '{"answer":' * 300 + '"yes"' + "}" * 300,  # valid JSON deeper than orjson writes
    "{" * (MAX_SEARCH + 10),
    '{"answer": "yes", "note": "' + "x" * (10 << 20),
    "{“a”：“" + "“" * (1 << 20),
    '{"answer": "yes"' + ", " * (1 << 18),
    "<think>" + "{" * 1000 + "</think>" * 1000,
    "```" * 100_000,
])
def test_hostile_outputs_are_unusable_not_errors(raw: str) -> None:
    p = parse_output(raw, YES_NO)
    assert not p.usable and not (p.error or "").startswith(INTERNAL), p.error
    p = parse_output(raw, DeliveryRule())
    assert not (p.error or "").startswith(INTERNAL), p.error
    if p.usable:
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
