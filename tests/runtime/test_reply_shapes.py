"""Replies that hold more than one JSON value: which one is the answer.

Reasoning set aside in every form models write it (tags, bracketed markers, an
unparsed harmony channel, Ollama's ``Thinking...`` lines), answer containers read
first, and among several usable values the one the reply itself names: a value
introduced as an example or a draft is not the answer, a later one introduced as the
correction or the final answer replaces the first. Without such words the first
usable value stays the answer."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lockgate.runtime import parse_output
from lockgate.spec import DeliveryRule

LABEL = DeliveryRule.model_validate({"schema": {
    "type": "object", "properties": {"label": {"enum": ["positive", "negative", "neutral"]}},
    "required": ["label"]}})
YESNO = DeliveryRule.model_validate({"schema": {
    "type": "object", "properties": {"answer": {"enum": ["yes", "no"]},
                                     "reason": {"type": "string"}},
    "required": ["answer"]}})
POS = {"label": "positive"}


def _value(raw: str, rule: DeliveryRule = LABEL) -> Any:
    p = parse_output(raw, rule)
    assert p.usable, (raw, p.status, p.error)
    return p.value


@pytest.mark.parametrize("raw", [
    'Thinking...\nA first guess would be {"label": "negative"} because of "cheap".\n'
    '...done thinking.\n\n{"label": "positive"}',
    '<scratchpad>\nInitial read: {"label": "negative"}\n</scratchpad>\n{"label": "positive"}',
    '<thought>{"label": "neutral"} seems safe</thought>\n{"label": "positive"}',
    '◁think▷Maybe {"label": "negative"}? No.◁/think▷{"label": "positive"}',
    '[THINK]Candidate: {"label": "negative"}. Re-reading.[/THINK]\n{"label": "positive"}',
    '<|begin_of_thought|>{"label": "negative"}?<|end_of_thought|>\n{"label": "positive"}',
    '<seed:think>Try {"label":"negative"}... wrong.</seed:think>{"label": "positive"}',
    '<analysis>Looks like {"label": "negative"} at first</analysis>\n{"label": "positive"}',
    '<|channel|>analysis<|message|>User wants JSON. {"label": "negative"}? No.<|end|>'
    '<|start|>assistant<|channel|>final<|message|>{"label": "positive"}<|return|>',
])
def test_reasoning_in_every_form_is_set_aside(raw: str) -> None:
    p = parse_output(raw, LABEL)
    assert p.usable and p.value == POS, (p.status, p.value)
    assert "stripped:think" in p.fixes


@pytest.mark.parametrize("raw", [
    '<draft>{"label": "negative"}</draft>\n<output>{"label": "positive"}</output>',
    'Options: {"label": "negative"}, {"label": "neutral"}\n<answer>{"label": "positive"}'
    '</answer>',
    '<final>{"label": "positive"}</final>\nA weaker reading: {"label": "neutral"}',
    '<|begin_of_solution|>{"label": "positive"}<|end_of_solution|>',
])
def test_an_answer_container_holds_the_answer(raw: str) -> None:
    p = parse_output(raw, LABEL)
    assert p.usable and p.value == POS and "extracted:answer" in p.fixes


@pytest.mark.parametrize(("raw", "rule", "want"), [
    ('Draft:\n```json\n{"label": "negative"}\n```\nWait, I misread the sarcasm. '
     'Final answer:\n```json\n{"label": "positive"}\n```', LABEL, POS),
    ('```json\n{"answer": "no"}\n```\n\nActually, correction: the user does ask for a '
     'refund. The correct output is:\n\n```json\n{"answer": "yes", "reason": "refund"}\n```',
     YESNO, {"answer": "yes", "reason": "refund"}),
    ('The output format is {"label": "neutral"} with one of three values. For the given '
     'review, the result is:\n{"label": "positive"}', LABEL, POS),
    ('Example of the expected output:\n```json\n{"answer": "no", "reason": "example"}\n```'
     '\nYour message:\n```json\n{"answer": "yes", "reason": "refund"}\n```', YESNO,
     {"answer": "yes", "reason": "refund"}),
    ('First attempt {"label": "negative"}. On second thought: {"label": "positive"}',
     LABEL, POS),
    ('示例：{"label": "neutral"}\n根据评论，最终答案：{"label": "positive"}', LABEL, POS),
    ('初步判断 {"label": "negative"}，更正：{"label": "positive"}', LABEL, POS),
])
def test_the_value_the_reply_names_as_the_answer_is_delivered(
        raw: str, rule: DeliveryRule, want: dict[str, Any]) -> None:
    assert _value(raw, rule) == want


@pytest.mark.parametrize("raw", [
    '{"label": "positive"}\nAnother possible result: {"label": "neutral"}',
    'Here is the output in the required format:\n{"label": "positive"}\n'
    'If the tone were flat it would be {"label": "neutral"}.',
    '```json\n{"label": "positive"}\n```\n```json\n{"label": "negative"}\n```',
    'Here is the answer: {"label": "positive"}. If the review were flat, the output would '
    'instead be {"label": "neutral"}, which is correct only then.',
])
def test_without_such_words_the_first_usable_value_stays_the_answer(raw: str) -> None:
    assert _value(raw) == POS


_words = st.sampled_from(["", "Sure. ", "Note: ", "Here you go\n", "结果：", "Output: "])


@settings(max_examples=200, deadline=None)
@given(first=st.sampled_from(["positive", "negative", "neutral"]),
       second=st.sampled_from(["positive", "negative", "neutral"]),
       lead=_words, mid=_words, fenced=st.booleans())
def test_two_values_without_words_for_either_give_the_first(
        first: str, second: str, lead: str, mid: str, fenced: bool) -> None:
    a, b = json.dumps({"label": first}), json.dumps({"label": second})
    if fenced:
        a, b = f"```json\n{a}\n```", f"```json\n{b}\n```"
    assert _value(f"{lead}{a}\n{mid}{b}") == {"label": first}


@settings(max_examples=200, deadline=None)
@given(draft=st.sampled_from(["negative", "neutral"]),
       cue=st.sampled_from(["Final answer:", "Correction:", "Actually,", "The correct output "
                            "is", "最终答案：", "更正："]),
       fenced=st.booleans())
def test_a_value_introduced_as_the_correction_replaces_the_first(
        draft: str, cue: str, fenced: bool) -> None:
    a, b = json.dumps({"label": draft}), json.dumps(POS)
    if fenced:
        a, b = f"```json\n{a}\n```", f"```json\n{b}\n```"
    assert _value(f"{a}\nHmm, let me check again.\n{cue}\n{b}") == POS


SCORE = DeliveryRule.model_validate({
    "schema": {"type": "object", "properties": {
        "score": {"type": "number"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["score"]},
    "fallback_values": {"tags": []}})


@pytest.mark.parametrize("tags", ['"null"', '"None"', '"N/A"', "false", "3", '"  "'])
def test_a_list_field_given_no_value_or_another_type_takes_its_fallback(tags: str) -> None:
    # Each was wrapped into a list of one invented element (["null"], ["false"], ["3"]).
    p = parse_output(f'{{"score": 0.5, "tags": {tags}}}', SCORE)
    assert p.usable and p.value == {"score": 0.5, "tags": []}, (p.status, p.value)


def test_a_lone_item_of_the_item_type_is_still_a_list_of_one() -> None:
    assert _value('{"score": 0.5, "tags": "price"}', SCORE) == {"score": 0.5,
                                                                 "tags": ["price"]}


def test_an_integer_beyond_64_bits_against_an_enum_is_no_internal_error() -> None:
    p = parse_output("{'label': 123456789012345678901234567890}", LABEL)
    assert not p.usable and "internal error" not in (p.error or "")


@pytest.mark.parametrize(("raw", "want"), [
    ('```json\n{\n  "answer": "no", // the user did not ask for a refund\n'
     '  "reason": "only thanks" // short\n}\n```', {"answer": "no", "reason": "only thanks"}),
    ('{"reason": "asks for money back", // evidence\n  "answer": "yes" // decision\n}',
     {"answer": "yes", "reason": "asks for money back"}),
    ('{\n  "answer": "yes" // clear request\n}', {"answer": "yes"}),
    ('{"answer": "no" /* final */}', {"answer": "no"}),
])
def test_a_comment_after_a_string_is_no_cut_off(raw: str, want: dict[str, Any]) -> None:
    # The scan took the closing quote before a comment for text inside the string, so a
    # reply that had finished counted as cut off: fields dropped, `truncated` set.
    p = parse_output(raw, YESNO)
    assert p.usable and p.value == want and not p.truncated, (p.status, p.value, p.fixes)


def test_an_answer_after_many_brace_groups_is_found() -> None:
    # 80 brace groups of LaTeX first: only the first 64 regions were tried.
    working = " + ".join(f"\\frac{{{i}}}{{{i + 1}}}" for i in range(40))
    assert _value(f"Let x = {working}. So the answer: {json.dumps(POS)}") == POS


@pytest.mark.parametrize("raw", [
    '{"name": "classify", "arguments": "{\\"answer\\": \\"yes\\", \\"reason\\": \\"late\\"}"}',
    '{"type": "function", "function": {"name": "classify", "arguments": '
    '"{\\"answer\\": \\"yes\\", \\"reason\\": \\"late\\"}"}}',
    '<tool_call>\n{"name": "classify", "parameters": "{\\"answer\\": \\"yes\\", '
    '\\"reason\\": \\"late\\"}"}\n</tool_call>',
    '{"name": "classify", "arguments": {"answer": "yes", "reason": "late"}}',
], ids=["openai-arguments-text", "openai-tool-call", "parameters-text", "arguments-object"])
def test_an_answer_written_as_a_tool_call_is_read_from_its_arguments(raw: str) -> None:
    # Models trained on function calling answer with the call: the arguments, often as a
    # JSON text in a string, are the answer.
    assert _value(raw, YESNO) == {"answer": "yes", "reason": "late"}
