"""Output review 13: which value is the answer when a correction is unusable, follows
an answer tag, or a conclusion introduces it; example labels; an example under a
refusal."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from lockgate.runtime import parse_output
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
SENT2 = DeliveryRule.model_validate(
    {
        "schema": {
            "type": "object",
            "properties": {
                "label": {"enum": ["positive", "negative", "neutral"]},
                "score": {"type": "number", "minimum": 0, "maximum": 1},
            },
            "required": ["label", "score"],
        }
    }
)
NEG = {"label": "negative"}

_case = st.sampled_from([str, str.lower, str.upper, str.title])
_ws = st.sampled_from(["\n", " ", "\n\n", "\r\n"])


@settings(max_examples=150, deadline=None)
@given(
    phrase=st.sampled_from(
        [
            "Actually, the correct output is:",
            "Correction:",
            "Wait, that's wrong. Correct output:",
            "更正：",
            "Final answer:",
            "I misread. The correct output is",
        ]
    ),
    bad=st.sampled_from(
        [
            '{"label": "mixed"}',
            '{"label": "negative", "score": 7}',
            '{"labl": "negative", "score": "x"}',
            '{"label": "negative"}',
        ]
    ),
    first=st.sampled_from(
        ['{"label": "positive", "score": 0.9}', '{ "score" : 0.9 , "label" : "positive" }']
    ),
    ws=_ws,
    fenced=st.booleans(),
)
def test_an_unusable_correction_takes_the_value_before_back(
    phrase: str, bad: str, first: str, ws: str, fenced: bool
) -> None:
    if fenced:
        first, bad = f"```json\n{first}\n```", f"```json\n{bad}\n```"
    p = parse_output(first + ws + phrase + ws + bad, SENT2)
    assert not p.usable and p.status.value == "schema_violation", p
    assert "correction" in (p.error or "")


def test_a_usable_correction_still_replaces_and_an_example_after_changes_nothing() -> None:
    raw = '{"label": "positive"}\nActually, the correct output is {"label": "negative"}'
    assert parse_output(raw, SENT).value == NEG
    raw = '{"label": "negative"}\nFor example: {"label": "mixed"}'
    assert parse_output(raw, SENT).value == NEG


@settings(max_examples=150, deadline=None)
@given(
    label=st.sampled_from(
        [
            "Hmm, no",
            "Never mind",
            "Korrektur",
            "Fix",
            "Erratum",
            "Исправление",
            "Disregard the previous output",
        ]
    ),
    case=_case,
    ws=st.sampled_from(["\n", " ", "\n\n"]),
    end=st.sampled_from([":", "."]),
)
def test_a_correction_label_before_an_answer_tag_counts(
    label: str, case, ws: str, end: str
) -> None:
    raw = (
        '<answer>{"label": "positive"}</answer>'
        + ws
        + case(label)
        + end
        + ws
        + '<answer>{"label": "negative"}</answer>'
    )
    assert parse_output(raw, SENT).value == NEG


def test_an_answer_tag_after_prose_with_a_correction_word_changes_nothing() -> None:
    raw = (
        '<answer>{"label": "positive"}</answer>\nKorrektur: keine nötig.\n'
        '<answer>{"label": "negative"}</answer>'
    )
    assert parse_output(raw, SENT).value == {"label": "positive"}


@settings(max_examples=150, deadline=None)
@given(
    first=st.sampled_from(
        [
            '{"label": "positive"}',
            'At first glance {"label": "positive"} fits, but',
            'The tone is {"label": "neutral"}-ish.',
        ]
    ),
    conclusion=st.sampled_from(
        [
            "Therefore the output is:",
            "Thus:",
            "Hence the final output:",
            "So the answer is:",
            "Consequently, the label is",
            "Thus, my classification:",
        ]
    ),
    case=st.sampled_from([str, str.lower]),
    ws=_ws,
)
def test_a_conclusion_selects_the_later_value(first: str, conclusion: str, case, ws: str) -> None:
    raw = first + " The customer is clearly upset." + ws + case(conclusion) + ws + json.dumps(NEG)
    assert parse_output(raw, SENT).value == NEG


@settings(max_examples=100, deadline=None)
@given(
    lead=st.sampled_from(
        [
            "The response should look like",
            "It should look like this:",
            "Use this format:",
            "Expected format:",
            "Here is the required structure:",
        ]
    ),
    ws=_ws,
)
def test_format_labels_are_examples(lead: str, ws: str) -> None:
    raw = f'{lead} {{"label": "positive"}}{ws}My classification: {json.dumps(NEG)}'
    assert parse_output(raw, SENT).value == NEG


@settings(max_examples=100, deadline=None)
@given(
    refusal=st.sampled_from(
        [
            "I can't classify this.",
            "I cannot determine the sentiment.",
            "Sorry, I'm unable to classify this content.",
            "i CANNOT tell.",
        ]
    ),
    lead=st.sampled_from(
        [
            "A valid response would look like",
            "The expected format is",
            "Use this format:",
            "It should look like this:",
            "Example:",
        ]
    ),
    ws=_ws,
)
def test_an_example_under_a_refusal_is_no_answer(refusal: str, lead: str, ws: str) -> None:
    p = parse_output(f'{refusal}{ws}{lead} {{"label": "positive"}}', SENT)
    assert not p.usable and p.status.value == "no_json_found", p


def test_an_example_alone_is_still_delivered() -> None:
    # (the documented rule: an example left alone is read as the value)
    assert parse_output('Example: {"label": "positive"}', SENT).value == {"label": "positive"}
    # (a refusal quoted from the input is not the model's)
    raw = 'The review says "I can\'t believe it".\nExample: {"label": "positive"}'
    assert parse_output(raw, SENT).usable
