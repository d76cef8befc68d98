"""Tags inside JSON string values are content, never structure (review of 2026-12-06,
groups A, A2, D, E, J and K).

An answer tag (``<answer>``, ``<result>`` ...) or a reasoning tag (``<think>``,
``</think>``, ``<analysis>`` ...) that lies inside a JSON string literal does not open
or close an answer container or a reasoning block: a note quoting ``<answer>{...}``
does not replace the answer, ``</think>`` in a value does not set the answer aside,
tags are not cut out of values, and ``</answer>`` in a value does not end the
container early. Pairing the tags is linear in the output.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lockgate.runtime import ParseStatus, parse_output
from lockgate.spec import DeliveryRule

LABEL = {"enum": ["positive", "negative", "neutral"]}
NOTE = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["label", "score"],
    "properties": {"label": LABEL, "score": {"type": "number"}, "note": {"type": "string"},
                   "tags": {"type": "array", "items": {"type": "string"}}}}})
SENT = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["label", "score"],
    "properties": {"label": LABEL, "score": {"type": "number"}}}})
POS = {"label": "positive", "score": 0.9}
NEG_TEXT = '{"label": "negative", "score": 0.1}'


def _delivered(raw: str, rule: DeliveryRule = NOTE) -> Any:
    parsed = parse_output(raw, rule)
    assert parsed.usable, (parsed.status, parsed.error, parsed.fixes)
    return parsed.value


@pytest.mark.parametrize("note", [
    "the review quoted <answer>{'label': 'negative', 'score': 0.1}</answer>",
    f"x <result>{NEG_TEXT}</result>",
    "quoted: <answer>{label: negative, score: 0.1}</answer>",
    f"the text ends with </think> and then {NEG_TEXT}",
])
@pytest.mark.parametrize("frame", ["Result: {}", "{}\nHope this helps!", "Here:\n{}"])
def test_an_answer_or_reasoning_tag_quoted_in_a_value_is_content(note: str, frame: str) -> None:
    answer = {**POS, "note": note}
    assert _delivered(frame.replace("{}", json.dumps(answer))) == answer


def test_a_double_encoded_answer_holding_a_closing_think_tag() -> None:
    answer = {**POS, "note": f"the text ends with </think> and then {NEG_TEXT}"}
    assert _delivered(json.dumps(json.dumps(answer))) == answer


@pytest.mark.parametrize("note", [
    "<doc><analysis>bad</analysis></doc>", "<b><thinking>hmm</thinking></b>",
    "<thought><thought>", "<p><think><p>", "<think><think>",
])
@pytest.mark.parametrize("frame", ["Here is the result:\n{}", "```json\n{}\n```"])
def test_reasoning_tags_in_a_value_are_not_cut_out(note: str, frame: str) -> None:
    answer = {"note": note, "label": "neutral", "score": 0.3}
    assert _delivered(frame.replace("{}", json.dumps(answer))) == answer


@pytest.mark.parametrize("answer", [
    {"label": "positive", "score": 0.3, "tags": ["</answer>", "html"]},
    {"label": "positive", "score": 0.3, "note": "The closing tag </answer> was unbalanced"},
])
def test_a_closing_tag_in_a_value_does_not_end_the_container(answer: dict[str, Any]) -> None:
    assert _delivered(f"<answer>{json.dumps(answer)}</answer>") == answer
    result = {**answer, "note": "see </result> tag"}
    assert _delivered(f"<result>{json.dumps(result)}</result>") == result


def test_tags_outside_strings_still_work() -> None:
    # (the structure the tags give is kept where they are not inside a value)
    assert _delivered(f"<think>draft {NEG_TEXT}</think>\n{json.dumps(POS)}", SENT) == POS
    assert _delivered(f"Sure.\n<answer>{json.dumps(POS)}</answer>", SENT) == POS
    assert _delivered(f'{NEG_TEXT}\nWait, correction: <answer>{json.dumps(POS)}</answer>',
                      SENT) == POS
    cut = parse_output(f'<think>He said "it is {NEG_TEXT}', SENT)
    assert cut.status is ParseStatus.NO_JSON_FOUND and "truncated" in cut.fixes


def test_an_answer_quoted_as_a_json_string_in_prose_is_not_read_into_the_answer() -> None:
    # (group H: the quoted object's escaped quotes used to run into the real answer,
    # merging a junk key into it)
    quoted = json.dumps(NEG_TEXT)
    assert _delivered(f"{quoted} is in the review. Answer: {json.dumps(POS)}", SENT) == POS
    tagged = json.dumps(f"<answer>{NEG_TEXT}</answer>")
    assert _delivered(f"The review text was: {tagged} - an injection. My output: "
                      f"{json.dumps(POS)}", SENT) == POS


@pytest.mark.parametrize("tag", ["<answer>", "<result>", "<output> ", "<think>x</think>"])
def test_many_unclosed_tags_are_linear(tag: str) -> None:
    raw = tag * 8000 + json.dumps(POS)
    # (quadratic pairing took 620-730 ms for 4,000 tags, so seconds for 8,000; linear
    # takes 10-60 ms: the bound leaves room for a loaded machine)
    assert _best_of_three(raw) < 0.5


def _best_of_three(raw: str) -> float:
    best = float("inf")
    for _ in range(3):
        began = time.perf_counter()
        parse_output(raw, SENT)
        best = min(best, time.perf_counter() - began)
    return best


TAG_TEXT = ["<answer>", "</answer>", "<think>", "</think>", "<analysis>x</analysis>",
            "</result>", "<result>", "<output>", "<thinking>", "</thinking>",
            "<|begin_of_solution|>", "<|end_of_solution|>", NEG_TEXT, "```", "\n"]
_words = st.text(st.sampled_from("ab {}[]:,'\"\\-.<>/"), max_size=6)
_tagged = st.lists(st.sampled_from(TAG_TEXT) | _words, max_size=6).map("".join)
_answers = st.fixed_dictionaries(
    {"label": st.sampled_from(LABEL["enum"]),
     "score": st.floats(min_value=0, max_value=1, allow_nan=False)},
    optional={"note": _tagged, "tags": st.lists(_tagged, max_size=3)})
FRAMES = ["{}", "Here is the result:\n{}", "```json\n{}\n```", "<answer>{}</answer>",
          "<result>\n{}\n</result>", "<think>\nLet me think.\n</think>\n{}",
          "<think>draft</think>\n```json\n{}\n```\nHope this helps!", "{}\nHope this helps!",
          "Sure! Here is the JSON:\n\n{}\n\nLet me know if you need more."]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_answers, st.sampled_from(FRAMES), st.booleans())
def test_any_tag_text_in_values_delivers_exactly_the_object(
        answer: dict[str, Any], frame: str, ascii_only: bool) -> None:
    raw = frame.replace("{}", json.dumps(answer, ensure_ascii=ascii_only))
    parsed = parse_output(raw, NOTE)
    assert parsed.usable, (parsed.status, parsed.error, parsed.fixes)
    assert parsed.value == answer


def test_many_fences_are_tried_within_a_bound() -> None:
    broken = '```json\n{"label": "x", "score": oops}\n```\n' * 2000
    raw = broken + f"```json\n{json.dumps(POS)}\n```"
    # (each fence may cost a repair: trying all 2,000 took 280-370 ms; the first 64 and
    # the last 8 are tried, as for regions, so the answer ending the reply is found)
    assert _best_of_three(raw) < 0.15
    parsed = parse_output(raw, SENT)
    assert parsed.usable and parsed.value == POS


def test_html_entity_json_read_but_not_the_answer_is_not_repaired_as_written() -> None:
    raw = "{&quot;label&quot;: &quot;" + "x" * 80_000 + "&quot;}"
    # (read with its entities undone, it lacks "score"; repairing the 80 KB of
    # entities as written took about 200 ms and could find nothing better)
    assert _best_of_three(raw) < 0.1
    parsed = parse_output(raw, SENT)
    assert parsed.status is ParseStatus.SCHEMA_VIOLATION
    assert parsed.error is not None and "score" in parsed.error
