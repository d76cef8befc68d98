"""Answers the provider reports as cut off at max_tokens (``finish_reason`` "length").

The text alone may not show the cut (prose cut mid-sentence, JSON the ladder closes and
delivers in part): with the provider's report, an answer that was not complete before
the cut is ``truncated`` (unusable, ``invalid_output``), and a JSON answer whose brackets
all closed before it is delivered as parsed. ``stop`` (or no reason) changes nothing.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lockgate.errors import ErrorClass
from lockgate.runtime import ParseStatus, parse_output
from lockgate.runtime.finish import ended_inside
from lockgate.spec import DeliveryRule

SCHEMA = {"type": "object", "required": ["label", "reason"],
          "properties": {"label": {"enum": ["yes", "no"]}, "reason": {"type": "string"}}}
#: A cut ``reason`` takes its fallback: the ladder alone would deliver a cut answer.
JSON_RULE = DeliveryRule.model_validate({"schema": SCHEMA,
                                         "fallback_values": {"reason": "unknown"}})
TEXT_RULE = DeliveryRule.model_validate({"format": "text"})

CUT_JSON = '{"label": "yes", "reason": "the customer wan'
CUT_BEFORE_CLOSE = '{"label": "yes", "reason": "late parcel"'
COMPLETE_THEN_CUT = ('{"label": "yes", "reason": "late parcel"}\n\n'
                     "Explanation: the customer says the parcel is la")


@pytest.mark.parametrize("reason", ["length", "max_tokens", "MAX_TOKENS"])
def test_a_cut_text_answer_is_truncated_naming_the_cause_and_the_fix(reason: str) -> None:
    text = "The answer is cut off in the mid"
    assert parse_output(text, TEXT_RULE).usable, "the text alone does not show the cut"
    parsed = parse_output(text, TEXT_RULE, finish_reason=reason)
    assert parsed.status is ParseStatus.TRUNCATED and not parsed.usable
    assert parsed.value is None and not parsed.conforms
    assert parsed.error_class is ErrorClass.INVALID_OUTPUT
    assert parsed.error == (
        f'the answer was cut off at max_tokens (finish_reason "{reason.lower()}"): raise '
        "model_config.max_tokens or ask for a shorter answer")
    assert parsed.fixes == ("truncated", f"finish_reason:{reason.lower()}")


@pytest.mark.parametrize("raw", [CUT_JSON, CUT_BEFORE_CLOSE], ids=["in-a-value", "before-close"])
def test_cut_json_the_repair_would_deliver_is_truncated(raw: str) -> None:
    assert parse_output(raw, JSON_RULE).usable, "without the report the repair delivers it"
    parsed = parse_output(raw, JSON_RULE, finish_reason="length")
    assert parsed.status is ParseStatus.TRUNCATED and parsed.value is None
    assert parsed.error is not None and parsed.error.startswith(
        'the JSON answer was cut off at max_tokens (finish_reason "length")')
    assert parsed.truncated and parsed.fixes[-1] == "finish_reason:length"


@pytest.mark.parametrize("raw", [
    COMPLETE_THEN_CUT,
    '```json\n{"label": "no", "reason": "ok"}\n```\nNotes: {the reply went on and',
    'Here it is: {"label": "no", "reason": "ok"} and [{"more": "th',
], ids=["chatter-after", "fence-then-braces", "cut-region-after"])
def test_json_complete_before_the_cut_is_delivered_as_parsed(raw: str) -> None:
    plain = parse_output(raw, JSON_RULE)
    parsed = parse_output(raw, JSON_RULE, finish_reason="length")
    assert parsed.usable and parsed.value == plain.value
    assert parsed.status is plain.status
    assert parsed.fixes == (*plain.fixes, "finish_reason:length"), "the cut is on record"


@pytest.mark.parametrize("reason", [None, "stop", "end_turn", "content_filter"])
@pytest.mark.parametrize("raw,rule", [
    (CUT_JSON, JSON_RULE), (COMPLETE_THEN_CUT, JSON_RULE),
    ("The answer is cut off in the mid", TEXT_RULE), ("no json here", JSON_RULE),
])
def test_other_finish_reasons_change_nothing(raw: str, rule: DeliveryRule,
                                             reason: str | None) -> None:
    assert parse_output(raw, rule, finish_reason=reason) == parse_output(raw, rule)


def test_a_complete_object_inside_a_cut_list_is_not_delivered() -> None:
    raw = '[{"label": "yes", "reason": "a"}, {"label": "n'
    assert parse_output(raw, JSON_RULE).usable  # the first element, as for a whole list
    assert parse_output(raw, JSON_RULE, finish_reason="length").status \
        is ParseStatus.TRUNCATED


@pytest.mark.parametrize("raw", [
    '[1, {"label": "yes", "reason": "a"}, 3',
    '{"x": [1, {"label": "yes", "reason": "a"}, 3',
    '["a", {"label": "yes", "reason": "a"}',
])
def test_a_complete_object_inside_a_list_of_other_things_is_not_delivered(raw: str) -> None:
    # The ladder reads the object as a region of its own (the list is no array of
    # objects): complete, but the output ended inside the list around it.
    parsed = parse_output(raw, JSON_RULE, finish_reason="length")
    assert parsed.status is ParseStatus.TRUNCATED


def test_escaped_json_complete_before_a_cut_is_delivered() -> None:
    raw = '{\\"label\\": \\"yes\\", \\"reason\\": \\"a\\"} and then {cu'
    parsed = parse_output(raw, JSON_RULE, finish_reason="length")
    assert parsed.usable and parsed.value == {"label": "yes", "reason": "a"}


@pytest.mark.parametrize("raw", ["Sure! Let me look at the customer's message fi",
                                 "<think>The customer wants a refund, so the la"])
def test_a_reply_cut_before_its_json_began_is_truncated(raw: str) -> None:
    assert parse_output(raw, JSON_RULE).status is ParseStatus.NO_JSON_FOUND
    parsed = parse_output(raw, JSON_RULE, finish_reason="length")
    assert parsed.status is ParseStatus.TRUNCATED
    assert parsed.error is not None and "raise model_config.max_tokens" in parsed.error


def test_a_complete_answer_that_is_wrong_keeps_its_own_status() -> None:
    raw = '{"label": "maybe", "reason": "x"}\nThe label is uncertain becau'
    plain = parse_output(raw, JSON_RULE)
    assert plain.status is ParseStatus.SCHEMA_VIOLATION
    parsed = parse_output(raw, JSON_RULE, finish_reason="length")
    assert (parsed.status, parsed.error) == (plain.status, plain.error)
    assert parsed.fixes == (*plain.fixes, "finish_reason:length")


def test_keep_truncated_still_delivers_the_cut_values_it_asks_for() -> None:
    rule = DeliveryRule.model_validate({"schema": SCHEMA, "keep_truncated": True})
    parsed = parse_output(CUT_JSON, rule, finish_reason="length")
    assert parsed.usable and parsed.value == {"label": "yes", "reason": "the customer wan"}
    assert parsed.truncated and parsed.fixes[-1] == "finish_reason:length"


# -- any JSON document, cut anywhere inside -------------------------------------------------

_SCALARS = (st.none() | st.booleans() | st.integers(-10**6, 10**6)
            | st.floats(allow_nan=False, allow_infinity=False, width=32)
            | st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
            | st.sampled_from(["yes", "no", "{", "}", "[1]", '{"label": "yes"}', "\\", "```"]))
_KEYS = st.sampled_from(["label", "reason", "result", "data", "items", "note", "x", "结果"])
_DOCS = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=12,
).filter(lambda d: isinstance(d, dict | list) and len(d) > 0)
_RULES = [
    JSON_RULE,
    DeliveryRule.model_validate({}),  # any JSON, no declared shape
    DeliveryRule.model_validate({"required_keys": ["label"],
                                 "fallback_values": {"reason": ""}}),
    DeliveryRule.model_validate({"schema": {"type": "array"}}),
]


#: What may stand before an answer, brackets left open in prose and reasoning included.
_CHATTER = ["", "Sure:\n", "```json\n", "See [1 below:\n", "Sure :-[ here:\n",
            "<think>Options are [yes or {no</think>\n", "(a) {see the note\n"]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=_DOCS, indent=st.booleans(), where=st.floats(0.0, 1.0),
       rule=st.sampled_from(_RULES), chatter=st.sampled_from(_CHATTER))
@example(doc={"label": "yes", "reason": "late"}, indent=False, where=0.99, rule=JSON_RULE,
         chatter="")
@example(doc=[{"label": "yes", "reason": "a"}, {"label": "no"}], indent=False, where=0.7,
         rule=JSON_RULE, chatter="")
@example(doc={"result": {"label": "yes", "reason": "a"}, "x": 1}, indent=True, where=0.8,
         rule=JSON_RULE, chatter="Sure:\n")
@example(doc=[1, {"label": "yes", "reason": "a"}, 3], indent=False, where=0.9,
         rule=JSON_RULE, chatter="")  # the object is a region of its own, complete
def test_json_cut_anywhere_inside_is_never_delivered_with_finish_reason_length(
        doc: Any, indent: bool, where: float, rule: DeliveryRule, chatter: str) -> None:
    text = orjson.dumps(doc, option=orjson.OPT_INDENT_2 if indent else 0).decode()
    cut = min(len(text) - 1, max(1, int(len(text) * where)))  # inside: never whole
    raw = chatter + text[:cut]
    parsed = parse_output(raw, rule, finish_reason="length")
    assert not parsed.usable, (raw, parsed)
    assert parsed.status is ParseStatus.TRUNCATED, (raw, parsed)
    assert parsed.value is None


# -- a complete answer, brackets left open elsewhere, cut after it ---------------------------

@pytest.mark.parametrize("raw", [
    '<think>Options are [yes or no; the customer says</think>\n{"label": "yes", '
    '"reason": "late"}\n\nWhy: the parcel was la',
    '<think>maybe {label: yes...</think>{"label": "yes", "reason": "late"}\nNote: it is la',
    'Here is my answer (see [1 below:\n{"label": "yes", "reason": "late"}\n\nWhy: it wa',
    'Sure :-[ here:\n{"label": "yes", "reason": "late"}\n\nWhy: it wa',
    "{'label': 'yes', 'reason': 'late { parcel'}\n\nWhy: the parcel was la",
    '{"label": "yes", // see [1\n "reason": "late"}\n\nWhy: the parcel was la',
    '{"label": "yes", /* [todo */ "reason": "late"}\n\nWhy: the parcel was la',
    '｛"label"： "yes"， "reason"： "late"｝\n\n[Why: the parcel was la',
], ids=["reasoning-bracket", "reasoning-brace", "prose-bracket", "emoticon",
        "python-quotes", "line-comment", "block-comment", "full-width"])
def test_a_complete_answer_is_delivered_though_a_bracket_elsewhere_stays_open(
        raw: str) -> None:
    # The first bracket never closed is in reasoning, prose, a Python-quoted string or a
    # comment: not where the answer began, so the cut fell after the answer.
    plain = parse_output(raw, JSON_RULE)
    assert plain.usable
    parsed = parse_output(raw, JSON_RULE, finish_reason="length")
    assert parsed.usable and parsed.value == plain.value, parsed
    assert parsed.fixes == (*plain.fixes, "finish_reason:length")


_WORDS = st.lists(st.sampled_from(["the", "parcel", "was", "late", "(see", "[1", ":-[",
                                   "don't", '6"', "it's", "{", "{see", "->", "a/b", "x]"]),
                  max_size=12).map(" ".join)


@settings(max_examples=300, deadline=None)
@example(label="yes", reason="0", before='{ 6" 6" the :-[ [1', after="", where=0.0)
@example(label="yes", reason="{", before='[1 6"', after="", where=0.0)  # an inch mark
@given(label=st.sampled_from(["yes", "no"]),
       reason=st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=20),
       before=_WORDS, after=_WORDS, where=st.floats(0.0, 1.0))
def test_a_complete_answer_cut_in_the_prose_after_it_is_delivered(
        label: str, reason: str, before: str, after: str, where: float) -> None:
    doc = {"label": label, "reason": reason}
    tail = "\n\nExplanation: " + after
    raw = (before + "\n" if before else "") + orjson.dumps(doc).decode() \
        + tail[:max(1, int(len(tail) * where))]
    plain = parse_output(raw, JSON_RULE)
    if plain.value != doc or ended_inside(plain):
        return  # the prose misleads the ladder, or reads as a bracket the answer is in
    parsed = parse_output(raw, JSON_RULE, finish_reason="length")
    assert parsed.usable and parsed.value == doc, (raw, parsed)
