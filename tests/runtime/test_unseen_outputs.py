"""Outputs of shapes the corpus did not hold, each of which once gave a wrong answer, an
internal error or a misleading one: reasoning drafts taken for the answer, a nested
object taken for the whole, a fence closed inside a string, enum values folded like
field names ("1" became "-1"), an echoed schema taken for the answer, numbers JSON
cannot hold, lossy number readings, JSON escapes read as Python's, escaped JSON, and
invisible characters in values. Properties generalise the first three."""

from __future__ import annotations

import json
import math
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lockgate.runtime import ParseStatus, parse_output
from lockgate.runtime.conform import fold_value
from lockgate.runtime.output import INTERNAL
from lockgate.spec import DeliveryRule

LABELS = ["positive", "negative", "neutral"]
SENTIMENT = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["label", "score"],
    "properties": {"label": {"enum": LABELS}, "score": {"type": "number"},
                   "summary": {"type": "string"}}}})
AMOUNT = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["amount"],
    "properties": {"amount": {"type": "number"}, "count": {"type": "integer"},
                   "note": {"type": "string"}}}})
KEYS = DeliveryRule(required_keys=("answer", "confidence"))
DRAFT = '{"label": "negative", "score": 0.2}'
FINAL = '{"label": "positive", "score": 0.9}'
SETTINGS = settings(max_examples=200, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _failed(raw: str, rule: DeliveryRule) -> Any:
    p = parse_output(raw, rule)
    assert not p.usable, p
    assert p.error and not p.error.startswith(INTERNAL), p
    return p


def _answer(raw: str, rule: DeliveryRule) -> Any:
    p = parse_output(raw, rule)
    assert p.usable, p
    return p.value


# -- reasoning -------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [
    f"<think>Draft: {DRAFT}. But wait, the review",  # cut off while thinking
    f"<think>Draft: {DRAFT}</think>\nI can't help with that.",
    f"<think>Draft: {DRAFT}</think>",
    f"<think>one</think>\n<think>Draft: {DRAFT}</think>\n",
    f"<think>Draft: {DRAFT}</think>\n" + '{"label": "great", "score": 0.9}',
])
def test_a_draft_in_the_reasoning_is_never_the_answer(raw: str) -> None:
    _failed(raw, SENTIMENT)


def test_an_output_cut_off_while_thinking_says_so() -> None:
    p = _failed(f"<think>Draft: {DRAFT}. Hmm", SENTIMENT)
    assert "reasoning" in p.error and "max_tokens" in p.error
    assert "truncated" in p.fixes


@pytest.mark.parametrize("raw", [
    f"<think>Draft: {DRAFT}</think>\n{FINAL}",
    f"<think>a</think>\n<think>Draft: {DRAFT}</think>\n{FINAL}",
    # the chat template opened the block in the prompt: the reply starts inside it
    f"Draft: {DRAFT}? No, clearly positive.\n</think>\n{FINAL}",
    f"Thinking with no braces\n</think>\n{FINAL}",
    f"<think>a</think><think>Draft: {DRAFT}</think>{FINAL}",
    f"<thinking>Hmm {DRAFT} no.</thinking>\n{FINAL}",
    f"<THINK>{DRAFT}</THINK>{FINAL}",
    f"<reasoning>{DRAFT}</reasoning>\n\n{FINAL}",
])
def test_the_answer_after_the_reasoning_wins(raw: str) -> None:
    assert _answer(raw, SENTIMENT) == json.loads(FINAL)


def test_an_answer_that_mentions_the_tag_is_still_read() -> None:
    raw = '{"label": "positive", "score": 0.9, "summary": "a </think> tag",}'
    assert _answer(raw, SENTIMENT)["summary"] == "a </think> tag"


_prose = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="<>{}[]"),
                 max_size=40)
_answers = st.fixed_dictionaries({
    "label": st.sampled_from(LABELS),
    "score": st.floats(min_value=-1e6, max_value=1e6, allow_nan=False),
    "summary": st.text(st.characters(exclude_categories=("Cs",)), max_size=20)})


@SETTINGS
@given(draft=_answers, final=_answers, before=_prose, after=_prose, headless=st.booleans())
@example(draft={"label": "positive", "score": 0.0, "summary": "{"},
         final={"label": "positive", "score": 0.0, "summary": ""}, before='"', after="",
         headless=False)  # a quote before the draft: its "string" ran past </think>
@example(draft={"label": "positive", "score": 0.0, "summary": "["},
         final={"label": "positive", "score": 0.0, "summary": ""}, before='"', after="",
         headless=True)  # the same where the chat template opened the block
def test_property_reasoning_drafts_never_leak(draft: dict[str, Any], final: dict[str, Any],
                                              before: str, after: str,
                                              headless: bool) -> None:
    thinking = f"{before}{json.dumps(draft)}{after}"
    opening = "" if headless else "<think>"
    p = parse_output(f"{opening}{thinking}\n</think>\n{json.dumps(final)}", SENTIMENT)
    assert p.usable and p.value == final, p
    # Cut off before the answer: nothing usable, whatever the draft said.
    assert not parse_output(f"<think>{thinking}", SENTIMENT).usable
    assert not parse_output(f"<think>{thinking}</think>\n{after}", SENTIMENT).usable


# -- nested objects, fences ------------------------------------------------------------


@pytest.mark.parametrize("flaw", [",\n}", "\n}  // done", ",\n} trailing words"])
def test_a_nested_object_never_replaces_the_top_level_answer(flaw: str) -> None:
    raw = ('{\n "label": "negative",\n "score": 0.2,\n "aspects": [\n'
           '  {"label": "positive", "score": 0.9},\n  {"label": "neutral", "score": 0.5}\n ]'
           + flaw)
    value = _answer(raw, SENTIMENT)
    assert (value["label"], value["score"]) == ("negative", 0.2)
    assert len(value["aspects"]) == 2


def test_a_model_starting_over_after_a_cut_line_is_still_read() -> None:
    raw = '{"label": "posi\n{"label": "negative", "score": 0.2}'
    assert _answer(raw, SENTIMENT) == {"label": "negative", "score": 0.2}


@SETTINGS
@given(top=_answers, nested=st.lists(_answers, min_size=1, max_size=3),
       key=st.sampled_from(["aspects", "items", "details"]), indent=st.booleans())
def test_property_a_flawed_outer_object_keeps_its_own_values(
        top: dict[str, Any], nested: list[dict[str, Any]], key: str, indent: bool) -> None:
    obj = {**top, key: nested}
    text = json.dumps(obj, indent=2 if indent else None, ensure_ascii=False)
    flawed = text[:-1].rstrip() + ",\n}"  # a trailing comma: not strict JSON
    p = parse_output(flawed, SENTIMENT)
    assert p.usable and p.value == obj, p


@pytest.mark.parametrize("summary", ["wrap code in ``` fences", "a```", "```json {}```x"])
def test_a_fence_inside_a_string_does_not_close_the_block(summary: str) -> None:
    body = json.dumps({"label": "positive", "score": 0.9, "summary": summary})
    p = parse_output(f"Here you go:\n```json\n{body}\n```\nDone.", SENTIMENT)
    assert p.usable and p.value["summary"] == summary and "truncated" not in p.fixes, p


def test_a_fence_closed_on_the_last_line_of_json_still_closes() -> None:
    raw = f"```json\n{FINAL}```\nthen\n```json\n{DRAFT}\n```"
    assert _answer(raw, SENTIMENT) == json.loads(FINAL)


# -- enum values -------------------------------------------------------------------------


@pytest.mark.parametrize(("enum", "given", "expected"), [
    (["+1", "-1"], "1", None),
    (["A+", "A-", "B+", "B-"], "A", None),
    (["3.5", "4.0"], "35", None),
    (["in_stock", "in-stock"], "instock", None),
    (["+1", "-1"], " +1 ", "+1"),
    (["Very Positive", "Negative"], "very   positive", "Very Positive"),
    (["ＡＢ", "CD"], "ab", "ＡＢ"),
    (["positive", "negative"], "positive\u200b", "positive"),
    (["positive", "negative"], "Positive.", "positive"),
    (["A", "A."], "a.", "A."),
])
def test_enum_values_fold_without_losing_signs_or_dots(enum: list[str], given: str,
                                                      expected: str | None) -> None:
    rule = DeliveryRule.model_validate({"schema": {
        "type": "object", "required": ["v"], "properties": {"v": {"enum": enum}}}})
    p = parse_output(json.dumps({"v": given}), rule)
    if expected is None:
        assert p.status is ParseStatus.SCHEMA_VIOLATION, p
    else:
        assert p.usable and p.value == {"v": expected}, p


_marks = st.text(st.sampled_from("+-._ aB1"), min_size=1, max_size=5)


@SETTINGS
@given(enum=st.lists(_marks, min_size=1, max_size=5, unique=True), given=_marks)
def test_property_an_enum_value_is_only_ever_matched_to_its_own_fold(
        enum: list[str], given: str) -> None:
    rule = DeliveryRule.model_validate({"schema": {
        "type": "object", "required": ["v"], "properties": {"v": {"enum": enum}}}})
    p = parse_output(json.dumps({"v": given}), rule)
    if p.usable:  # the same value, or the same once a sentence's final stop is off, or
        # the member inside Markdown emphasis (_1_ is 1 in italics)
        folded = fold_value(given)
        bare = given.strip()
        inner = fold_value(bare[1:-1]) if len(bare) > 2 and bare[0] == bare[-1] == "_" \
            else folded
        assert fold_value(p.value["v"]) in (folded, folded.rstrip(" .!"), inner), (p, given)


# -- schema echoes, numbers, escapes ---------------------------------------------------


def test_an_echoed_schema_is_not_the_answer() -> None:
    raw = ('Schema: {"properties": {"answer": {"type": "string"}, "confidence": '
           '{"type": "number"}}}\nAnswer: {"answer": "Paris", "confidence": 0.8}')
    assert _answer(raw, KEYS) == {"answer": "Paris", "confidence": 0.8}
    _failed('{"properties": {"answer": {"type": "string"}, "confidence": '
            '{"type": "number", "description": "0-1"}}}', KEYS)


def test_an_object_value_of_an_untyped_field_is_still_an_answer() -> None:
    raw = '{"answer": {"city": "Paris"}, "confidence": 0.8}'
    assert _answer(raw, KEYS) == {"answer": {"city": "Paris"}, "confidence": 0.8}


@pytest.mark.parametrize("raw", ['{"amount": 1e999}', '{"amount": "1e999"}',
                                 '{"amount": -1e999,}', '{"amount": NaN}'])
def test_a_number_json_cannot_hold_is_refused(raw: str) -> None:
    p = _failed(raw, AMOUNT)
    assert p.status is ParseStatus.SCHEMA_VIOLATION or "JSON" in p.error


@pytest.mark.parametrize("raw", [
    '{"amount": "' + "9" * 400 + '"}',
    '{"amount": ' + "9" * 400 + "}",
    '{"amount": 1, "count": "' + "9" * 400 + '.0"}',
    '{"amount": "' + "9" * 5000 + '"}',
])
def test_overlong_numbers_are_refused_with_a_reason(raw: str) -> None:
    _failed(raw, AMOUNT)


def test_an_overlong_integer_becomes_the_string_a_field_asks_for() -> None:
    digits = "9" * 400
    assert _answer('{"amount": 1, "note": ' + digits + "}", AMOUNT)["note"] == digits


@pytest.mark.parametrize(("given", "expected"), [
    ("1,234", 1234), ("-12,000", -12000), ("1,234,567.5", 1234567.5), (" ４２ ", 42),
    ("0,900", None), ("12,34", None), ("10²", None), ("1e999", None)])
def test_numbers_are_read_exactly_or_not_at_all(given: str, expected: Any) -> None:
    p = parse_output(json.dumps({"amount": given}), AMOUNT)
    if expected is None:
        assert p.status is ParseStatus.SCHEMA_VIOLATION, p
    else:
        assert p.usable and p.value == {"amount": expected}, p


def test_a_large_integer_string_is_read_exactly() -> None:
    value = _answer('{"amount": 1, "count": "9007199254740993.0"}', AMOUNT)
    assert value["count"] == 9007199254740993


@pytest.mark.parametrize(("raw", "summary"), [
    ('{"label": "positive", "score": 0.9, "summary": "it\'s at https:\\/\\/x.io",}',
     "it's at https://x.io"),
    ('{"label": "positive", "score": 0.9, "summary": "it\'s \\ud83d\\ude00",}',
     "it's \U0001f600"),
    ('{"label": "positive", "score": 0.9, "summary": "a\\\\/b",}', "a\\/b"),
])
def test_json_escapes_are_read_as_json(raw: str, summary: str) -> None:
    assert _answer(raw, SENTIMENT)["summary"] == summary


def test_python_literals_are_still_read() -> None:
    raw = "{'label': 'positive', 'score': 0.9, 'summary': 'it\\'s fine', 'x': None}"
    assert _answer(raw, SENTIMENT)["summary"] == "it's fine"


def test_json_escaped_as_a_string_is_unescaped() -> None:
    raw = ('Result: {\\"label\\": \\"positive\\", \\"score\\": 0.9, '
           '\\"summary\\": \\"a \\\\\\"b\\\\\\"\\"}')
    value = _answer(raw, SENTIMENT)
    assert value == {"label": "positive", "score": 0.9, "summary": 'a "b"'}


def test_invisible_characters_in_values_are_tolerated() -> None:
    value = _answer('{"label": "positive\u200b", "score": "0.9\ufeff"}', SENTIMENT)
    assert value == {"label": "positive", "score": 0.9}


@SETTINGS
@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers())
def test_property_a_usable_number_is_always_finite_and_stored_as_read(x: Any) -> None:
    raw = '{"amount": ' + (repr(x) if isinstance(x, float) else str(x)) + "}"
    p = parse_output(raw, AMOUNT)
    if p.usable:
        stored = orjson.loads(orjson.dumps(p.value))["amount"]
        assert stored is not None and math.isfinite(stored)
        assert stored == x or (isinstance(x, int) and abs(x) >= 1 << 63)
