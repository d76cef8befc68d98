"""Output review 14: a value mentioned inside a sentence loses to a later one that stands
on its own; a correction in words after the last value that names another enum member
makes the output unusable."""

from __future__ import annotations

import json

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
                "score": {"type": "number", "minimum": 0, "maximum": 1},
            },
            "required": ["label"],
        }
    }
)
ZH = DeliveryRule.model_validate(
    {
        "schema": {
            "type": "object",
            "properties": {"label": {"enum": ["正面", "负面", "中性"]}},
            "required": ["label"],
        }
    }
)
POS = {"label": "positive"}
NEG = {"label": "negative"}


# A. a value mentioned inside a sentence --------------------------------------------------


def test_a_value_mentioned_mid_sentence_loses_to_a_later_one_on_its_own() -> None:
    raw = (
        'The review suggests {"label":"positive"} at first glance, but the last sentence '
        'suggests otherwise.\n\nAnswer: {"label":"negative"}'
    )
    parsed = parse_output(raw, SENT)
    assert parsed.usable and parsed.value == NEG, parsed


@settings(max_examples=150, deadline=None)
@given(
    before=st.sampled_from(
        ["The wording suggests", "At first glance", "The tone is", "I considered", "Maybe"]
    ),
    after=st.sampled_from(
        ["at first glance", "fits, but", "-ish.", "was my first thought", "` came to mind"]
    ),
    first=st.sampled_from(["positive", "neutral"]),
    label=st.sampled_from(
        ["Answer:", "answer :", "ANSWER:\n", "**Final:**", "So:\n", "Result:", "", "答案："]
    ),
    spaces=st.sampled_from(["", " ", "  "]),
    mid=st.sampled_from(["\n\n", "\n", " The customer wants a refund.\n\n"]),
    fenced=st.booleans(),
)
def test_a_mention_never_beats_a_later_standalone_value(
    before: str, after: str, first: str, label: str, spaces: str, mid: str, fenced: bool
) -> None:
    opening = "`" if after.startswith("`") else ""
    mention = f"{before} {opening}{json.dumps({'label': first})}{spaces}{after}"
    answer = json.dumps(NEG)
    if fenced and label:
        answer = f"```json\n{answer}\n```"
        label = label.rstrip() + "\n"
    parsed = parse_output(f"{mention}{mid}{label}{spaces}{answer}{spaces}", SENT)
    assert parsed.usable and parsed.value == NEG, parsed


@pytest.mark.parametrize(
    "raw",
    [
        # the first value stands on its own, or ends its clause: the first stays
        f"{json.dumps(POS)}\n\nAnswer: {json.dumps(NEG)}",
        f"Answer: {json.dumps(POS)} (high confidence)\nAnswer: {json.dumps(NEG)}",
        f"My first guess was {json.dumps(POS)}, but the reviewer liked it.\n\n"
        f"Answer: {json.dumps(NEG)}",
        f"I think {json.dumps(POS)}.\nAnswer: {json.dumps(NEG)}",
        # the later value is a mention too, or an example: no standalone value
        f"I think {json.dumps(POS)} fits.\nAnother is {json.dumps(NEG)} maybe",
        f"I think {json.dumps(POS)} fits.\nExample: {json.dumps(NEG)}",
        f"I think {json.dumps(POS)} fits.\nThe other reading is {json.dumps(NEG)}.",
    ],
)
def test_a_values_that_stand_alone_or_end_a_clause_keep_the_first(raw: str) -> None:
    parsed = parse_output(raw, SENT)
    assert parsed.usable and parsed.value == POS, parsed


# B. a correction in words after the last value ------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        '{"label": "positive"}\n\nWait, I misread the review. It is actually negative.',
        '{"label": "positive"}\nActually, on reflection this review is sarcastic, so it '
        "should be negative.",
        '```json\n{"label": "positive"}\n```\nPlease ignore the above; the correct label is '
        '"negative".',
        'The answer is {"label": "positive"}.\nOops, my mistake: NEGATIVE.',
    ],
)
def test_b_a_correction_in_words_naming_another_member_is_unusable(raw: str) -> None:
    parsed = parse_output(raw, SENT)
    assert not parsed.usable and parsed.status is ParseStatus.SCHEMA_VIOLATION, parsed
    assert "takes its value back in prose" in (parsed.error or ""), parsed
    assert "'negative'" in (parsed.error or "") and "'label'" in (parsed.error or "")


@settings(max_examples=150, deadline=None)
@given(
    phrase=st.sampled_from(
        [
            "Wait,",
            "wait -",
            "Actually,",
            "ACTUALLY",
            "Hmm, no,",
            "Sorry,",
            "I misread.",
            "Oops,",
            "On second thought,",
            "Scratch that,",
            "My mistake:",
        ]
    ),
    words=st.sampled_from(
        [
            "it is negative.",
            "it's actually Negative.",
            "it should be negative instead.",
            'the correct label is "negative".',
            "negative!",
            "this review is negative",
        ]
    ),
    sep=st.sampled_from(["\n", "\n\n", " ", "\n  "]),
    fenced=st.booleans(),
)
def test_b_retractions_in_words_vary(phrase: str, words: str, sep: str, fenced: bool) -> None:
    value = json.dumps(POS)
    if fenced:
        value = f"```json\n{value}\n```"
    parsed = parse_output(f"{value}{sep}{phrase} {words}", SENT)
    assert not parsed.usable and parsed.status is ParseStatus.SCHEMA_VIOLATION, parsed


def test_b_a_member_written_in_an_unspaced_script_is_found() -> None:
    parsed = parse_output('{"label": "正面"}\n不对，应该是负面。', ZH)
    assert not parsed.usable and "'负面'" in (parsed.error or ""), parsed


@pytest.mark.parametrize(
    "tail",
    [
        "Actually, it is quite positive overall.",  # the same member
        "The negative words are outweighed.",  # no correction phrase
        "Actually, it is not negative.",  # negated
        "Wait, it sounds negative at first, but overall positive.",  # restated
        "Actually, if the sarcasm were meant, it would be negative.",  # a condition
        "Wait, is it negative?",  # a question
        'The reviewer wrote: "Actually, it was negative at first."',  # quoted
        "In conclusion, the negative points are minor.",  # a conclusion
        "Wait, the negative aspects are minor.",  # the member as an adjective
        "Wait, let me explain.\n\nThe text is negative.",  # another passage
        "Wait, it is negative:\n" + json.dumps(NEG),  # a value follows: it is chosen
    ],
)
def test_b_words_that_take_nothing_back(tail: str) -> None:
    parsed = parse_output(json.dumps(POS) + "\n" + tail, SENT)
    assert parsed.usable, parsed
    assert parsed.value == (NEG if tail.endswith("}") else POS), parsed


def test_b_words_before_the_value_take_nothing_back() -> None:
    parsed = parse_output("Wait, I misread. It is actually negative.\n" + json.dumps(POS), SENT)
    assert parsed.usable and parsed.value == POS, parsed


def test_b_unspaced_negation_takes_nothing_back() -> None:
    parsed = parse_output('{"label": "正面"}\n不对，不是负面。', ZH)
    assert parsed.usable and parsed.value == {"label": "正面"}, parsed
