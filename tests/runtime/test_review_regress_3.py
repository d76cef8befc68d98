"""Regressions of the third review's changes to the output pass, one group per defect.

R1. a comparison or a note after the first value ("more accurate than the baseline",
    "Double-checked. For reference, ...", "the second review:", 另一条) is no revision:
    a revision word counts only where it plainly introduces the later value as the
    corrected answer, or as a verdict on the first value right after it;
R2. a single-quoted "string" in reasoning never swallows the tag that closes it;
R3. a string ending in a quoted word keeps its closing quote;
P.  a long run of blank lines between two values is searched in linear time.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from lockgate.runtime import parse_output
from lockgate.spec import DeliveryRule

from .test_review_search_3 import RATING, SENT, ZH

TEXT = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}}})

A = '{"label": "positive", "confidence": 0.9}'
B = '{"label": "negative", "confidence": 0.6}'
A_V = {"label": "positive", "confidence": 0.9}
B_V = {"label": "negative", "confidence": 0.6}


def _value(raw: str, rule: DeliveryRule = SENT) -> Any:
    p = parse_output(raw, rule)
    assert p.usable, (raw, p.status, p.error)
    return p.value


def _fence(value: str) -> str:
    return f"```json\n{value}\n```"


# R1. notes and comparisons after the first value ----------------------------------------

@pytest.mark.parametrize("raw", [
    f"{A}\n\nThis is more accurate than what the old model produced, which was:\n{B}",
    f"{A}\n\nThis is more accurate than the baseline. The baseline output was:\n{B}",
    f"{A}\n\nI believe this is more accurate than the keyword approach, which gave:\n{B}",
    f"{A}\n\nIt's more appropriate than a neutral label. Input was classified by the old "
    f"system as:\n{B}",
    f"{A}\n\nHere it is more precise than the rule-based output, shown for reference:\n{B}",
    f"{A}\n\n(The confidence is more accurate than usual because the review is long.) "
    f"Next review: {B}",
    f"Output: {A}\n\nNote: some clients expect a different label set instead. The raw "
    f"classifier said:\n{B}",
    f"Review 1: {A}\nThe customer asked for a refund instead. Review 2: {B}",
    f"{A}\n\nThat's not quite right for sarcastic reviews in general, but it fits here. "
    f"A sarcastic one:\n{B}",
    f"{A}\n\nDouble-checking: all fields are present. The same for the second review:\n{B}",
    f"{A}\nDouble-check with the rubric: {B} is the rubric's sample for a negative review.",
    f"{A}\n\nLet me double-check the second review as well:\n{B}",
    f"Final answer: {A}\n\nRe-examining the other review (#2), which is about shipping:\n{B}",
    f"{_fence(A)}\n\nThis is more accurate than the previous model's output:\n{_fence(B)}",
    f"{_fence(A)}\n\nDouble-checked. For reference, the negative template is:\n{_fence(B)}",
])
def test_comparisons_and_notes_after_the_first_value_are_no_revision(raw: str) -> None:
    assert _value(raw) == A_V


@pytest.mark.parametrize("raw", [
    '{"情感": "正面", "理由": "好"}\n调整后的运费政策让顾客不满，但这是另一条评论：'
    '{"情感": "负面", "理由": "差"}',
    '最终答案：{"情感": "正面", "理由": "好"}\n修改建议：商家可以改进包装。参考另一条：'
    '{"情感": "负面", "理由": "差"}',
])
def test_chinese_revision_words_not_right_before_the_value_are_no_revision(raw: str) -> None:
    assert _value(raw, ZH) == {"情感": "正面", "理由": "好"}


@pytest.mark.parametrize("raw", [
    # a verdict on the first value, then the later value introduced as another item
    f"{A}\nThat doesn't seem right. For reference, the template is:\n{B}",
    f"{A}\nHmm, that doesn't look right. The second review:\n{B}",
])
def test_a_verdict_does_not_pick_a_value_introduced_as_another_item(raw: str) -> None:
    assert _value(raw) == A_V


@pytest.mark.parametrize("raw", [
    f"{A}\n\nDouble-checking, I think this is more accurate:\n{B}",
    f"{A}\n\nThe label should be negative instead:\n{B}",
    f"{A}\n\nThat's not right.\n{B}",
    f"{A}\n\nI think this one is better:\n{B}",
])
def test_revisions_that_introduce_the_later_value_still_count(raw: str) -> None:
    assert _value(raw) == B_V


# R2. single-quoted strings in reasoning -----------------------------------------------

@pytest.mark.parametrize("raw", [
    "<think>Labels are [positive, negative, neutral. The answer: 'positive</think>"
    "{'label': 'positive', 'confidence': 0.9}",
    "<think>Options {a: 'x', b: 'it's</think>'}\n" + A,
    "<think>Set {a, b, c: 'd</think>'\n" + A,
    "<think>The list is [1, 2: 'x</think>', 3\n" + A,
    "<think>[draft: 'tone is good</think>'] " + A,
    "<think>\nThe reviewer says the phone is great (5 stars [verified.\nSo the label is: "
    "'positive</think>{'label': 'positive', 'confidence': 0.9}",
    "<think>Options [positive, negative, neutral. My pick: 'positive'</think>"
    "{'label': 'positive', 'confidence': 0.9}",
    "<think>options {a: 'x', b: 'it's</think>'}\n" + A,
])
def test_a_single_quote_in_reasoning_never_swallows_its_closing_tag(raw: str) -> None:
    p = parse_output(raw, SENT)
    assert p.usable and p.value == A_V, (p.status, p.error)
    assert "stripped:think" in p.fixes


# R3. a quoted word ending a string ----------------------------------------------------

@pytest.mark.parametrize(("raw", "rule", "want"), [
    ('{"rating": 2, "rationale": "called it "awful"}', RATING,
     {"rating": 2, "rationale": 'called it "awful"'}),
    ('{\n  "rating": 2,\n  "rationale": "Customer called it "awful"\n}', RATING,
     {"rating": 2, "rationale": 'Customer called it "awful"'}),
    ('{"text": "The product is "great"\n}', TEXT, {"text": 'The product is "great"'}),
    ('{"text": "He said "hi"\n}', TEXT, {"text": 'He said "hi"'}),
])
def test_a_quoted_word_ending_a_string_keeps_its_quote(raw: str, rule: DeliveryRule,
                                                       want: dict[str, Any]) -> None:
    assert _value(raw, rule) == want


# P. long runs between values ----------------------------------------------------------

@pytest.mark.parametrize("gap", ["\n" * 200_000, " " * 200_000, "\n \t" * 60_000])
def test_a_long_blank_run_between_two_values_is_searched(gap: str) -> None:
    # (linear: 200 KB of blank lines between two values parses in milliseconds)
    assert _value(A + gap + B) == A_V
    assert _value(A + gap + "Actually:\n" + B) == B_V


def test_a_long_blank_run_between_a_correction_and_the_value() -> None:
    raw = A + "\nActually, the label is wrong." + "\n" * 200_000 + B
    assert _value(raw) == A_V  # (the correction is far from the later value)
    raw = A + "\n" * 200_000 + "Refined answer:\n" + B
    assert _value(raw) == B_V


def test_many_small_objects_without_an_answer() -> None:
    raw = "".join(json.dumps({"s": i}) + " " for i in range(40_000))
    assert not parse_output(raw, SENT).usable


_RANGES = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["k"],
    "properties": {"k": {"enum": ["1-2", "3-4", "5+", "U-235", "U-238"]}}}})


@pytest.mark.parametrize(("raw", "want"), [
    ('{"k": "1 2"}', None), ('{"k": "3  4"}', None),  # digits apart: no range
    ('{"k": "U 235"}', "U-235"), ('{"k": "u_238"}', "U-238"),  # a letter and a digit
])
def test_separators_between_two_digits_make_no_enum_member(raw: str, want: str | None) -> None:
    p = parse_output(raw, _RANGES)
    if want is None:
        assert not p.usable, p
    else:
        assert p.usable and p.value == {"k": want}, p
