"""Defects of the output pass's search found by a third review, one group per defect.

A. a self-correction between two values ("Refining:", "Here's the improved version:",
   "Adjusted output:", "Second attempt:", "... instead:", "that doesn't look right",
   修改后：) makes the later value the answer; the words must introduce the later value
   or follow the first one right away, and a later example or condition never wins;
B. an inch mark (a bare ``"`` that no JSON syntax follows) inside a string is text;
C. in a single-quoted (Python literal) answer, a reasoning tag or ``&quot;`` inside a
   string is content: no block is set aside, no entity undone;
D. a bare ``undefined`` (JavaScript) where a value stands reads as ``null``;
J. an answer after thousands of brace groups (a long LaTeX derivation) is found: the
   last regions of the text are tried, however many come before them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from lockgate.runtime import parse_output
from lockgate.spec import DeliveryRule

SENT = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["label", "confidence"],
    "properties": {"label": {"enum": ["positive", "negative", "neutral"]},
                   "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                   "reasons": {"type": "array", "items": {"type": "string"}}}}})
RATING = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["rating"],
    "properties": {"rating": {"type": "integer", "minimum": 1, "maximum": 5},
                   "rationale": {"type": "string"}}}})
ZH = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["情感", "理由"],
    "properties": {"情感": {"enum": ["正面", "负面", "中性"]}, "理由": {"type": "string"}}}})
SETTINGS = settings(max_examples=150, deadline=None)

DRAFT = '{"label": "neutral", "confidence": 0.5}'
FINAL = '{"label": "negative", "confidence": 0.7}'
DRAFT_V = {"label": "neutral", "confidence": 0.5}
FINAL_V = {"label": "negative", "confidence": 0.7}


def _fence(value: str) -> str:
    return f"```json\n{value}\n```"


def _value(raw: str, rule: DeliveryRule = SENT) -> Any:
    p = parse_output(raw, rule)
    assert p.usable, (raw, p.status, p.error)
    return p.value


# A. self-corrections ------------------------------------------------------------------

CORRECTIONS = [
    "Refining:", "Here's the improved version:", "Better:",
    "Hmm, the confidence is too high and the label is off. Adjusted:",
    "Adjusted output:", "Improved:", "Here is a refined version:", "Modified version:",
    "Let me adjust that:", "Changing my answer to:", "Re-evaluated:", "Second attempt:",
    "Refined answer:", "The label should be negative instead:",
    "Hmm, that doesn't look right.", "Double-checking, I think this is more accurate:",
    "That's not right, the review complains about shipping.",
    "Another attempt, reading the sarcasm:", "**Revised version:**",
    "Here is an improved version of the JSON:", "I think this one is better:",
]


@pytest.mark.parametrize("cue", CORRECTIONS)
@pytest.mark.parametrize("fenced", [True, False])
def test_a_self_correction_makes_the_later_value_the_answer(cue: str, fenced: bool) -> None:
    a, b = (_fence(DRAFT), _fence(FINAL)) if fenced else (DRAFT, FINAL)
    assert _value(f"{a}\n\n{cue}\n{b}") == FINAL_V


@pytest.mark.parametrize("cue", ["修改后：", "调整后的结果：", "改为：", "更正后的结果：",
                                 "修正后：", "重新判断："])
def test_a_chinese_self_correction_makes_the_later_value_the_answer(cue: str) -> None:
    draft = json.dumps({"情感": "中性", "理由": "评价一般"}, ensure_ascii=False)
    final = json.dumps({"情感": "负面", "理由": "物流太慢"}, ensure_ascii=False)
    raw = f"{_fence(draft)}\n\n{cue}\n{_fence(final)}"
    assert _value(raw, ZH) == {"情感": "负面", "理由": "物流太慢"}


@pytest.mark.parametrize("raw", [
    # the words right after the first value, the later value given without words
    f"{DRAFT}\nHmm, that doesn't look right. Looking at the shipping complaint again,"
    f" the tone is clearly upset and the customer wants a refund.\n{FINAL}",
    # introducing the later value, after other prose
    f"{_fence(DRAFT)}\nThe customer mentions a refund twice and the delivery was late by "
    f"a week, which is a strong signal.\nHere is the improved version:\n{_fence(FINAL)}",
])
def test_the_correction_may_follow_the_first_value_or_introduce_the_later(raw: str) -> None:
    assert _value(raw) == FINAL_V


@pytest.mark.parametrize("raw", [
    # an example or a condition after the corrected value does not win
    f"{DRAFT}\nRefined answer:\n{FINAL}\nFor example, a happy review gives "
    '{"label": "positive", "confidence": 0.9}',
    f"{DRAFT}\nImproved:\n{FINAL}\nIf the review were glowing it would be "
    '{"label": "positive", "confidence": 0.9}',
    f"{DRAFT}\nBetter:\n{FINAL}\nAnother possible result: "
    '{"label": "positive", "confidence": 0.9}',
])
def test_values_after_the_corrected_one_that_are_examples_or_conditions_do_not_win(
        raw: str) -> None:
    assert _value(raw) == FINAL_V


@pytest.mark.parametrize("raw", [
    # a revision word far from both values (neither right after the first one nor
    # introducing the later one) is prose
    f"{DRAFT}\nThe review is short. The product was improved in version two, the "
    f"customer says, and shipping changed too. Nothing else stands out.\n"
    f"Also:\n{FINAL}",
    # a condition: what the answer would be, not a correction
    f"{DRAFT}\nIf the customer had been angrier, a better answer would instead be:\n{FINAL}",
    # a later value introduced as an example, after a correction word
    f"{DRAFT}\nRefining the format is up to you; for example:\n{FINAL}",
    # the revision label alone ("Update:", "Edit:") does not replace the answer
    f"{DRAFT}\nUpdate: the format for future items:\n{FINAL}",
    f"{DRAFT}\nThat's right, and to compare, {FINAL}",
    # a revised version that is the subject of the prose (a product's), not the answer's
    f"{DRAFT}\nThe customer says an improved version of the app is due. Also:\n{FINAL}",
])
def test_revision_words_elsewhere_or_under_a_condition_change_nothing(raw: str) -> None:
    assert _value(raw) == DRAFT_V


@SETTINGS
@given(cue=st.sampled_from(CORRECTIONS),
       lead=st.sampled_from(["", "Sure.\n", "Here is the result:\n", "结果：\n"]),
       fenced=st.booleans(),
       tail=st.sampled_from(["", "\nLet me know if you need changes.",
                             '\nFor example: {"label": "positive", "confidence": 1}']))
def test_a_correction_picks_the_later_value_whatever_surrounds_it(
        cue: str, lead: str, fenced: bool, tail: str) -> None:
    a, b = (_fence(DRAFT), _fence(FINAL)) if fenced else (DRAFT, FINAL)
    assert _value(f"{lead}{a}\n\n{cue}\n{b}{tail}") == FINAL_V


# B. inch marks --------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "rule", "want"), [
    ('{"rating": 2, "rationale": "The 5" screen is too small"}', RATING,
     {"rating": 2, "rationale": 'The 5" screen is too small'}),
    ('{"rating":2,"rationale":"Screen is 27" wide"}', RATING,
     {"rating": 2, "rationale": 'Screen is 27" wide'}),
    ('{"label": "negative", "confidence": 0.7, "reasons": ["slow", "a 12" pizza arrived '
     'cold"]}', SENT,
     {"label": "negative", "confidence": 0.7, "reasons": ["slow", 'a 12" pizza arrived cold']}),
    ('{"label": "negative", "confidence": 0.7, "reasons": ["5" screen too small"]}', SENT,
     {"label": "negative", "confidence": 0.7, "reasons": ['5" screen too small']}),
    ('Here you go:\n```json\n{"rating": 1, "rationale": "A 65" TV, "wall mount" missing"}'
     '\n```', RATING, {"rating": 1, "rationale": 'A 65" TV, "wall mount" missing'}),
    ('{"rationale": "The 5" screen is too small",\n "rating": 2,}', RATING,
     {"rating": 2, "rationale": 'The 5" screen is too small'}),
])
def test_an_inch_mark_inside_a_string_is_text(raw: str, rule: DeliveryRule,
                                              want: dict[str, Any]) -> None:
    assert _value(raw, rule) == want


@pytest.mark.parametrize(("raw", "want"), [
    # an inch mark that ends the string before a separator, doubled or escaped
    ('{"rating": 3, "rationale": "a 5"", "x": 1}', {"rating": 3, "rationale": 'a 5"', "x": 1}),
    ('{"rating": 3, "rationale": "a 5\\""}', {"rating": 3, "rationale": 'a 5"'}),
    # a closing quote that is missing stays json_repair's to mend
    ('{"rating": 3, "rationale": "fine, "extra": 1}', None),
])
def test_quotes_that_end_a_string_are_unchanged(raw: str, want: dict[str, Any] | None) -> None:
    p = parse_output(raw, RATING)
    assert p.usable, (p.status, p.error)
    if want is not None:
        assert p.value == want
    else:
        assert p.value["rating"] == 3


@pytest.mark.parametrize(("raw", "want"), [
    ('{"label": "negative", "confidence": 0.7, "reasons": ["slow" "cold"]}', ["slow", "cold"]),
    ('{"label": "negative", "reasons": ["slow" , "cold" "late"], "confidence": 0.7}',
     ["slow", "cold", "late"]),
    ('{"label": "negative", "confidence": 0.7, "reasons": ["He said "no" twice"]}',
     ['He said "no" twice']),
])
def test_strings_missing_a_comma_between_them_stay_two(raw: str, want: list[str]) -> None:
    # (a quote then a space and another quote: a missing comma, not an inch mark)
    assert _value(raw)["reasons"] == want


_WORDS = st.from_regex(r"[a-z]{1,8}( [a-z]{1,8}){0,5}", fullmatch=True)
_BEFORE = st.from_regex(r"([A-Za-z]{1,8} ){0,4}", fullmatch=True)


@SETTINGS
@given(before=_BEFORE, inches=st.integers(1, 99), words=_WORDS, in_list=st.booleans(),
       first=st.booleans())
def test_any_string_with_a_lone_inch_mark_before_words_round_trips(
        before: str, inches: int, words: str, in_list: bool, first: bool) -> None:
    text = f"{before}{inches}\" {words}"
    raw_string = f'"{text}"'
    if in_list:
        members = ['"label": "negative"', '"confidence": 0.5',
                   f'"reasons": ["ok", {raw_string}]']
        rule, want = SENT, {"label": "negative", "confidence": 0.5, "reasons": ["ok", text]}
    else:
        members = ['"rating": 2', f'"rationale": {raw_string}']
        rule, want = RATING, {"rating": 2, "rationale": text}
    if first:
        members.reverse()
    raw = "{" + ", ".join(members) + "}"
    assert _value(raw, rule) == want


# C. single-quoted answers holding markup ---------------------------------------------

@pytest.mark.parametrize(("raw", "rule", "want"), [
    ("{'rating': 4, 'rationale': 'Tags like ><think> appear in the answer'}", RATING,
     {"rating": 4, "rationale": "Tags like ><think> appear in the answer"}),
    ("{'rating': 4, 'rationale': 'Uses <br><think> markup'}", RATING,
     {"rating": 4, "rationale": "Uses <br><think> markup"}),
    ("{'rating': 4,\n 'rationale': '<think>quoted</think> is shown raw'}", RATING,
     {"rating": 4, "rationale": "<think>quoted</think> is shown raw"}),
    ("{'rating': 4, 'rationale': 'he typed {&quot;x&quot;: 1} in the form'}", RATING,
     {"rating": 4, "rationale": "he typed {&quot;x&quot;: 1} in the form"}),
    ("{'label': 'negative', 'confidence': 0.7, 'reasons': ['raw HTML: {&quot;id&quot;: 5}']}",
     SENT, {"label": "negative", "confidence": 0.7,
            "reasons": ["raw HTML: {&quot;id&quot;: 5}"]}),
])
def test_markup_in_a_single_quoted_string_is_content(raw: str, rule: DeliveryRule,
                                                     want: dict[str, Any]) -> None:
    p = parse_output(raw, rule)
    assert p.usable and p.value == want, (p.status, p.value, p.fixes)
    assert "stripped:think" not in p.fixes and "repaired:html" not in p.fixes
    assert not p.truncated


@pytest.mark.parametrize(("raw", "fix"), [
    # reasoning before a single-quoted answer is still set aside
    ("<think>\nMaybe {'rating': 1}?\n</think>\n{'rating': 4, 'rationale': 'fine'}",
     "stripped:think"),
    # JSON all in entities is still read with them undone, an apostrophe in it or not
    ("{&quot;rating&quot;: 4, &quot;rationale&quot;: &quot;it's fine&quot;}",
     "repaired:html"),
])
def test_reasoning_and_entity_json_outside_strings_are_still_read(raw: str, fix: str) -> None:
    p = parse_output(raw, RATING)
    assert p.usable and p.value["rating"] == 4 and fix in p.fixes, (p.status, p.value)


_MARKUP = st.lists(st.sampled_from(["<think>", "</think>", "<answer>", "</answer>",
                                    "<analysis>", "&quot;", "&amp;", "{", "}", ">", "<br>",
                                    ": ", ", ", "x", " ", "ok", "[1]", '"']),
                   min_size=1, max_size=12).map("".join)


@SETTINGS
@given(text=_MARKUP, first=st.booleans())
@example(text="</think>&quot;: ", first=False)  # a closing tag no tag opened, in a string
def test_any_markup_in_a_single_quoted_string_is_delivered_as_written(
        text: str, first: bool) -> None:
    members = ["'rating': 4", f"'rationale': '{text}'"]
    if first:
        members.reverse()
    p = parse_output("{" + ", ".join(members) + "}", RATING)
    assert p.usable and p.value == {"rating": 4, "rationale": text}, (p.status, p.value)


# D. undefined ---------------------------------------------------------------------------

@pytest.mark.parametrize("raw", [
    '{"label":"negative","confidence":0.7,"reasons": undefined}',
    '{"label": "negative", "reasons": undefined, "confidence": 0.7}',
    "{'label': 'negative', 'confidence': 0.7, 'reasons': undefined}",
    '```js\n{label: "negative", confidence: 0.7, reasons: undefined}\n```',
])
def test_undefined_reads_as_null(raw: str) -> None:
    assert _value(raw) == {"label": "negative", "confidence": 0.7}


def test_undefined_inside_a_string_is_text() -> None:
    raw = '{"label": "negative", "confidence": 0.7, "reasons": ["x, undefined", "undefined"],}'
    assert _value(raw)["reasons"] == ["x, undefined", "undefined"]


def test_undefined_in_a_required_field_is_a_missing_value() -> None:
    p = parse_output('{"label": undefined, "confidence": 0.7}', SENT)
    assert not p.usable and "label" in (p.error or "")
    assert p.value is None or p.value.get("label") != "undefined"


# J. many brace groups before the answer ------------------------------------------------

def _latex(groups: int) -> str:
    # two brace groups per step: `groups` in all
    return " ".join(f"Consider $\\frac{{a_{i}}}{{b}}$." for i in range(groups // 2))


@pytest.mark.parametrize("groups", [1_200, 2_400, 20_000])
def test_an_answer_after_thousands_of_brace_groups_is_found(groups: int) -> None:
    raw = f"Let me work through this. {_latex(groups)}\n\nFinal answer:\n{FINAL}"
    assert _value(raw) == FINAL_V


def test_an_answer_after_many_groups_and_before_a_closing_note_is_found() -> None:
    raw = (f"{_latex(3_000)}\n\nFinal answer:\n{FINAL}\n"
           "Note: {a_1} and {b} above are symbols, see {x}.")
    assert _value(raw) == FINAL_V


def test_the_answer_is_the_last_of_many_regions_even_in_a_fence() -> None:
    raw = f"{_latex(5_000)}\n```json\n{FINAL}\n```"
    assert _value(raw) == FINAL_V


@pytest.mark.parametrize("groups", [200, 20_000])
def test_without_an_answer_many_groups_give_no_answer(groups: int) -> None:
    p = parse_output(f"{_latex(groups)} So nothing to report.", SENT)
    assert not p.usable


def test_the_first_usable_value_among_many_groups_stays_the_answer() -> None:
    raw = f"{DRAFT}\n{_latex(3_000)}\n{FINAL}"
    assert _value(raw) == DRAFT_V
