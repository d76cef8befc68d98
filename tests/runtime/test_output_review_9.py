"""Review of the output pass (2,089 answers): corrections in other words, dotted
thousands in integer strings, strings meaning null where the schema names null, answers
after an assistant prefill, a bare list for a one-list object, yes/no words and short
sentences in boolean fields, prose after a value inside a closed object.

* D1: a correction worded as a verdict on the value before ("... is wrong; it should
  be ...", "The previous JSON had an error. Here it is fixed:"), a label ("Fix:",
  "Erratum:", "Amended:"), "I'd change it to", "should read", or a bare "No" right
  before the later value: the later value is the answer.
* D2: "10.000" in a string is refused in an integer field (a dotted thousands
  separator in many locales); "12.0" and a JSON number 10.000 are still 12 and 10.
* D3: the documented reading of strings meaning null (kept as it was; the docs now
  say it): converted where the schema names null and the string breaks the schema,
  delivered as written where a string is valid; a blank string is missing where
  required.
* D4: :func:`with_prefill` joins an assistant prefill and its continuation.
* D6: a bare list answers an object whose one field is that list.
* D7: yes/no words of more languages, and short sentences opened by one.
* D8: prose between a finished value and the closing brace is dropped; the object is
  never reported as cut off.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import lockgate.runtime
from lockgate.runtime import ParseStatus, parse_output, render
from lockgate.spec import DeliveryRule

from .conftest import make_config


def with_prefill(messages: list[dict[str, str]], content: str) -> str:
    """:func:`lockgate.runtime.with_prefill` (looked up when called: the tests of the
    other defects run where it does not exist)."""
    join = lockgate.runtime.with_prefill  # type: ignore[attr-defined,unused-ignore]
    answer: str = join(messages, content)
    return answer

SENTIMENT_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["label", "score"],
    "properties": {"label": {"enum": ["positive", "negative", "neutral"]},
                   "score": {"type": "number"}}}
SENTIMENT = DeliveryRule.model_validate({"schema": SENTIMENT_SCHEMA})
FIRST = '{"label": "neutral", "score": 0.5}'
SECOND = '{"label": "negative", "score": 0.2}'
NEGATIVE = {"label": "negative", "score": 0.2}
NEUTRAL = {"label": "neutral", "score": 0.5}


def _value(raw: str, rule: DeliveryRule = SENTIMENT) -> Any:
    parsed = parse_output(raw, rule)
    return parsed.value if parsed.usable else parsed.status


# -- D1: corrections ------------------------------------------------------------------

@pytest.mark.parametrize("between", [
    " is wrong; it should be ",
    " was incorrect. It should be ",
    "\nThe previous JSON had an error. Here it is fixed:\n",
    "\nThe above output contains a mistake.\n",
    "\nFix: ",
    "\nErratum: ",
    "\nAmended: ",
    "\nRevision:\n",
    "\nAfter double-checking, I'd change it to ",
    "\nThe label should read ",
    "\n\nIt should instead be:\n",
])
def test_a_correction_in_other_words_delivers_the_later_value(between: str) -> None:
    assert _value(FIRST + between + SECOND) == NEGATIVE


@pytest.mark.parametrize("between", [
    "\nNo other review was given. Another example: ",
    "\nFor example: ",
    "\nTo fix the format of the next record, see: ",
    "\nNo second review needed. Second review: ",
    "\nIs it wrong? No. Here is the second review: ",
    "\nIf the review were angrier, it should be ",
    "\nIs review 2 also neutral? No: ",
    "\nSame for the second text? No.\n",
    "\nNo, ",
])
def test_no_and_fix_in_prose_do_not_make_a_correction(between: str) -> None:
    assert _value(FIRST + between + SECOND) == NEUTRAL


def test_a_no_before_the_first_value_corrects_nothing_after_it() -> None:
    assert _value("No, " + FIRST + "\nAlso here: " + SECOND) == NEUTRAL


def test_fix_inside_the_answer_is_content() -> None:
    rule = DeliveryRule.model_validate({"schema": {
        "type": "object", "required": ["action"],
        "properties": {"action": {"type": "string"}}}})
    raw = '{"action": "Fix: restart the router"}\nSee also {"action": "ignore"}'
    assert _value(raw, rule) == {"action": "Fix: restart the router"}


# -- D2: dotted thousands in an integer string ----------------------------------------

INTEGER = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["count"], "properties": {"count": {"type": "integer"}}}})


@pytest.mark.parametrize("text", ["10.000", "1.500", "-2.000", "+999.000"])
def test_a_dot_and_three_digits_in_an_integer_string_is_refused(text: str) -> None:
    parsed = parse_output(json.dumps({"count": text}), INTEGER)
    assert not parsed.usable and parsed.status is ParseStatus.SCHEMA_VIOLATION


@pytest.mark.parametrize(("raw", "value"), [
    ('{"count": "12.0"}', 12), ('{"count": "12.00"}', 12), ('{"count": "12.0000"}', 12),
    ('{"count": "12"}', 12), ('{"count": 10.000}', 10), ('{"count": "1,500"}', 1500),
])
def test_other_integral_integer_strings_and_number_literals_stay_read(raw: str,
                                                                      value: int) -> None:
    assert _value(raw, INTEGER) == {"count": value}


# -- D3: strings meaning null (the docs now say what the code does) ------------------

NULLABLE_FORMS: list[dict[str, Any]] = [
    {"type": ["string", "null"]},
    {"type": "string", "nullable": True},
    {"anyOf": [{"type": "string"}, {"type": "null"}]},
]


def _note_rule(note: dict[str, Any], required: bool = True) -> DeliveryRule:
    return DeliveryRule.model_validate({"schema": {
        "type": "object", "required": ["label", "note"] if required else ["label"],
        "properties": {"label": {"type": "string"}, "note": note}}})


@pytest.mark.parametrize("note", NULLABLE_FORMS)
@pytest.mark.parametrize("text", ["null", "None", "nil", "N/A"])
def test_a_null_word_where_a_string_is_valid_is_delivered_as_written(
        note: dict[str, Any], text: str) -> None:
    assert _value(json.dumps({"label": "x", "note": text}), _note_rule(note)) == {
        "label": "x", "note": text}


@pytest.mark.parametrize("note", NULLABLE_FORMS)
def test_a_blank_string_in_a_required_nullable_field_is_missing(
        note: dict[str, Any]) -> None:
    parsed = parse_output('{"label": "x", "note": ""}', _note_rule(note))
    assert not parsed.usable and "note" in parsed.missing


@pytest.mark.parametrize("note", [{"type": ["integer", "null"]}, {"type": "null"},
                                  {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                                  {"enum": ["a", None]}])
@pytest.mark.parametrize("text", ["null", "None", "nil", "N/A", ""])
def test_a_null_word_that_breaks_the_schema_is_null_where_it_names_null(
        note: dict[str, Any], text: str) -> None:
    parsed = parse_output(json.dumps({"label": "x", "note": text}), _note_rule(note))
    assert parsed.usable and parsed.value == {"label": "x", "note": None}


# -- D4: answers after an assistant prefill -------------------------------------------

def _prefilled(prefill: str) -> Any:
    config = make_config([{"role": "user", "content": "Classify: {text}"},
                          {"role": "assistant", "content": prefill}],
                         rule={"schema": SENTIMENT_SCHEMA})
    return config, render(config, {"text": "The delivery was late and the box broken."})


def test_the_continuation_of_a_rendered_prefill_is_parsed_with_it() -> None:
    config, rendered = _prefilled("{{")
    assert rendered.messages[-1] == {"role": "assistant", "content": "{"}
    answer = with_prefill(rendered.messages, '"label": "negative", "score": 0.2}')
    assert answer == '{"label": "negative", "score": 0.2}'
    assert parse_output(answer, config.delivery_rule).value == NEGATIVE


def test_a_longer_prefill_is_joined_as_written() -> None:
    config, rendered = _prefilled('{{"label": "')
    answer = with_prefill(rendered.messages, 'negative", "score": 0.2}')
    assert parse_output(answer, config.delivery_rule).value == NEGATIVE


@pytest.mark.parametrize("content", [SECOND, "\n  " + SECOND])
def test_a_whole_answer_after_a_prefill_is_not_doubled(content: str) -> None:
    config, rendered = _prefilled("{{")
    assert with_prefill(rendered.messages, content) == content
    assert parse_output(with_prefill(rendered.messages, content),
                        config.delivery_rule).value == NEGATIVE


@pytest.mark.parametrize("last", [{"role": "user", "content": "Classify"},
                                  {"role": "assistant", "content": "  \n"}])
def test_without_a_prefill_the_reply_is_parsed_as_it_is(last: dict[str, str]) -> None:
    assert with_prefill([last], '"label": "x"}') == '"label": "x"}'
    assert with_prefill([], SECOND) == SECOND


# -- D6: a bare list for an object of one list field ----------------------------------

ENTITIES = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["entities"],
    "properties": {"entities": {"type": "array", "items": {
        "type": "object", "required": ["text", "type"],
        "properties": {"text": {"type": "string"}, "type": {"type": "string"}}}}}}})
BARE = [{"text": "Tim Cook", "type": "PERSON"}, {"text": "北京", "type": "LOC"}]


@pytest.mark.parametrize("raw", [json.dumps(BARE, ensure_ascii=False),
                                 "```json\n" + json.dumps(BARE, indent=2) + "\n```"])
def test_a_bare_list_answers_the_one_list_field(raw: str) -> None:
    parsed = parse_output(raw, ENTITIES)
    assert parsed.usable and parsed.value == {"entities": BARE}
    assert "wrapped:array->entities" in parsed.fixes


def test_a_bare_list_of_strings_answers_a_one_string_list_field() -> None:
    rule = DeliveryRule.model_validate({"schema": {
        "type": "object", "required": ["tags"],
        "properties": {"tags": {"type": "array", "items": {"type": "string"}}}}})
    assert _value('["a", "b"]', rule) == {"tags": ["a", "b"]}


def test_an_array_around_the_answer_is_still_unwrapped() -> None:
    assert _value(json.dumps([{"entities": BARE}]), ENTITIES) == {"entities": BARE}


@pytest.mark.parametrize("raw", ['[{"foo": 1}]', "[]", '["Tim Cook"]'])
def test_a_list_whose_items_do_not_fit_is_not_wrapped(raw: str) -> None:
    assert not parse_output(raw, ENTITIES).usable


def test_a_bare_list_is_not_wrapped_where_the_object_has_other_fields() -> None:
    rule = DeliveryRule.model_validate({"schema": {
        "type": "object", "required": ["entities"],
        "properties": {"entities": ENTITIES.json_schema["properties"]["entities"],
                       "count": {"type": "integer"}}}})
    assert not parse_output(json.dumps(BARE), rule).usable


def test_a_bare_list_cut_off_is_not_delivered() -> None:
    raw = json.dumps(BARE)[:-20]
    assert not parse_output(raw, ENTITIES, finish_reason="length").usable


# -- D7: yes/no words and sentences -----------------------------------------------------

YES_NO = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["answer"], "properties": {"answer": {"type": "boolean"}}}})


@pytest.mark.parametrize(("word", "value"), [
    ("vrai", True), ("faux", False), ("wahr", True), ("falsch", False),
    ("verdadero", True), ("falso", False), ("vero", True), ("verdadeiro", True),
    ("waar", True), ("onwaar", False), ("是的", True), ("不是", False), ("不", False),
    ("yep", True), ("nope", False), ("yeah", True), ("nah", False), ("Si", True),
])
def test_yes_no_words_are_booleans(word: str, value: bool) -> None:
    assert _value(json.dumps({"answer": word}), YES_NO) == {"answer": value}


@pytest.mark.parametrize("text", [
    # a sentence is not read as its first word: it may say the opposite, hedge or be
    # no answer at all
    "Yes, it is.", "No, it's spam.", "No. 5", "No-brainer.", "Yes-man", "Non-spam",
    "Yeah, right.", "Yes, if the sender is unknown.", "No, hard to say.",
    "Yes, but no.", "No... actually yes", "yes, maybe", "Yes?", "No idea", "T", "F",
    "不，这是垃圾邮件。",
])
def test_a_sentence_is_not_a_boolean(text: str) -> None:
    assert not parse_output(json.dumps({"answer": text}), YES_NO).usable


# -- prose after a value inside an object ----------------------------------------------

@pytest.mark.parametrize("raw", [
    '{"score": 0.2, "label": "negative" (actually positive)}',
    '{"score": 0.2, "label": "negative" — no wait, it is positive}',
    '{"score": 0.2, "label": "negative" or maybe positive}',
])
def test_prose_that_may_change_the_last_value_is_not_dropped(raw: str) -> None:
    # prose after a value may withdraw it: the first value is never delivered for it
    parsed = parse_output(raw, SENTIMENT)
    assert not (parsed.usable and parsed.value.get("label") == "negative"), parsed.value


@pytest.mark.parametrize("raw", [
    '{\n  "score": 0.2 as a rough guess,\n  "label": "negative"\n}',
    '{"score": 0.2 - 0.3, "label": "negative"}',
])
def test_words_after_a_number_are_not_dropped(raw: str) -> None:
    # "0.8 - 0.9", "1 234", "false maybe": more after a number or a literal is no
    # prose to drop, the value is not read
    assert not parse_output(raw, SENTIMENT).usable


def test_an_object_cut_off_after_prose_is_still_cut_off() -> None:
    parsed = parse_output('{"score": 0.2, "label": "negative" — the customer', SENTIMENT,
                          finish_reason="length")
    assert not parsed.usable


ROWS = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["rows"], "properties": {"rows": {
        "type": "array", "items": {"type": "array", "items": {"type": "integer"}}}}}})


@pytest.mark.parametrize("raw", ["[1, 2]", "[1, [2, 3]]", '["a", "b"]'])
def test_a_flat_list_is_not_wrapped_as_a_list_of_lists(raw: str) -> None:
    # a scalar would convert to a one-item list: [1, 2] is no [[1], [2]]
    parsed = parse_output(raw, ROWS)
    assert not (parsed.usable and parsed.value == {"rows": [[1], [2]]}), parsed.value
    assert not parsed.usable or "wrapped:array->rows" not in parsed.fixes
