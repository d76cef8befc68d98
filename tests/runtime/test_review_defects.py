"""Defects found by an independent review of the runtime, one group per defect.

Each rule is about structure and position, never about exact strings, so each has a
property over generated phrasings beside its examples:

1. words used in ordinary prose ("sample", "actually", "in conclusion") do not change
   which of several values is the answer; a value introduced by a condition or a
   contrast ("if ... it would be", "had it been", "the opposite") is not the answer;
2. a fenced value introduced as an example does not beat an unfenced answer;
3. a later value introduced by a correction phrase replaces the first (also in answer
   tags); a value labelled as the input is not the answer;
4. a string is split into a list only where that is the one reading;
5. an apostrophe in a single-quoted value is no string end;
6. an integer is read exactly or refused, never approximated;
7. a cut list that is the answer is never delivered in part;
8. a JSON string holding the answer (double encoding) in a fence or after words is
   decoded, not read as cut off;
9. JSON with its quotes written as HTML entities is read;
10. a reply that ends inside its reasoning, after some prose, was cut off.
"""

from __future__ import annotations

import html
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lockgate.runtime import ParseStatus, parse_output
from lockgate.spec import DeliveryRule

S = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["label", "score"],
    "properties": {"label": {"enum": ["positive", "negative", "neutral"]},
                   "score": {"type": "number"}, "summary": {"type": "string"}}}})
F = '{"label": "positive", "score": 0.9}'
D = '{"label": "negative", "score": 0.1}'
FV = {"label": "positive", "score": 0.9}
SETTINGS = settings(max_examples=200, deadline=None)


def _value(raw: str, rule: DeliveryRule = S) -> Any:
    p = parse_output(raw, rule)
    assert p.usable, (raw, p.status, p.error)
    return p.value


def _obj(label: str, score: float) -> str:
    return json.dumps({"label": label, "score": score})


_objects = st.tuples(st.sampled_from(["positive", "negative", "neutral"]),
                     st.sampled_from([0.1, 0.5, 0.9, 1])).map(lambda t: _obj(*t))


def _pair() -> st.SearchStrategy[tuple[str, str]]:
    """Two different values: the answer and another."""
    return st.tuples(_objects, _objects).filter(lambda t: t[0] != t[1])


def _dress(value: str, how: str) -> str:
    return {"plain": value, "fence": f"```json\n{value}\n```",
            "bare_fence": f"```\n{value}\n```"}[how]


_dressing = st.sampled_from(["plain", "fence", "bare_fence"])

# -- 1. cue words in ordinary prose; conditions and contrasts -------------------------

#: Introductions of the answer that hold words which elsewhere are cues.
_NEUTRAL_LEADS = st.sampled_from([
    "", "Here is the result for the sample you sent:", "Using the template you provided:",
    "Classification:", "Result for the review (e.g. the one above):",
    "Actually, here is the JSON:", "The sample was easy. Result:", "Sure!",
    "Based on the draft review you pasted, the output is:", "结果：",
])
#: What may come before a condition in its sentence (cue words among them).
_BEFORE_CONDITION = st.sampled_from([
    "", "Finally, ", "Actually, ", "In conclusion it is positive; ", "Note: ",
    "For reference, ", "Correction would only apply ", "To be precise, ",
])
_CONDITIONS = st.sampled_from([
    "if the customer were actually unhappy", "had it been critical", "were it sarcastic",
    "if the review said otherwise", "for contrast", "in contrast", "the opposite",
    "otherwise", "instead of that", "for comparison only", "if it were negative",
    "unless the text is ironic", "by contrast",
])
_CONSEQUENCES = st.sampled_from([
    "it would be", "the result would be", "the correct output would be", "you would get",
    "it could be", "the output might be", ":", "would give", "the final answer would be",
])


@pytest.mark.parametrize("raw", [
    f"Here is the result for the sample you sent:\n{F}\n\nHad it been critical, the "
    f"result would be {D}.",
    f"{F}\n\nIf the customer were actually unhappy it would be {D}.",
    f"{F}\n\nIn conclusion it is positive; the opposite would be {D}.",
    f"Using the template you provided:\n{F}\nFinally, for contrast, a negative review "
    f"would give {D}.",
    f"{F}\nFor reference, the correct output for a complaint would be {D}.",
])
def test_cue_words_in_prose_and_conditions_do_not_flip_the_answer(raw: str) -> None:
    assert _value(raw) == FV


@SETTINGS
@given(pair=_pair(), lead=_NEUTRAL_LEADS, before=_BEFORE_CONDITION, cond=_CONDITIONS,
       then=_CONSEQUENCES, how=_dressing, sep=st.sampled_from(["\n", "\n\n", " "]))
def test_a_value_after_a_condition_or_contrast_is_not_the_answer(
        pair: tuple[str, str], lead: str, before: str, cond: str, then: str, how: str,
        sep: str) -> None:
    answer, other = pair
    sentence = f"{before}{cond}{'' if then == ':' else ', '}{then}".strip()
    sentence = sentence[0].upper() + sentence[1:]
    raw = f"{lead}\n{_dress(answer, how)}{sep}{sentence} {_dress(other, how)}."
    assert _value(raw) == json.loads(answer)


# -- 2. a fenced example does not beat an unfenced answer ------------------------------

_EXAMPLE_INTROS = st.sampled_from([
    "Example output format:", "Example:", "Sample output:", "For example:", "e.g.",
    "Here is an example:", "Example of the expected output:", "The output format is",
    "Format:", "An example", "示例：", "Draft:", "Template:",
])
_ANSWER_INTROS = st.sampled_from([
    "For your review the result is:", "Result:", "Here is the classification:", "",
    "Now for the actual review:", "Output:", "Answer:", "根据评论，结果是：",
])


def test_a_fenced_example_does_not_beat_the_unfenced_answer() -> None:
    raw = f"Example output format:\n```json\n{D}\n```\n\nFor your review the result is: {F}"
    assert _value(raw) == FV


@SETTINGS
@given(pair=_pair(), intro=_EXAMPLE_INTROS, answer_intro=_ANSWER_INTROS,
       example_how=_dressing, answer_how=_dressing,
       sep=st.sampled_from(["\n", "\n\n", " "]))
def test_a_value_introduced_as_an_example_is_not_the_answer(
        pair: tuple[str, str], intro: str, answer_intro: str, example_how: str,
        answer_how: str, sep: str) -> None:
    answer, example = pair
    raw = (f"{intro}\n{_dress(example, example_how)}{sep}{answer_intro}\n"
           f"{_dress(answer, answer_how)}")
    assert _value(raw) == json.loads(answer)


# -- 3. corrections; the echoed input -------------------------------------------------

@pytest.mark.parametrize("raw", [
    f"{D}\n\nWait, I misread. Let me fix that:\n{F}",
    f"{D}\n\nUpdated answer:\n{F}",
    f"<answer>{D}</answer>\n\nWait, correction: <answer>{F}</answer>",
    f'Input: {{"review": "bad", "label": "negative", "score": 0.1}}\nOutput: {F}',
    f"<think>x</think>\nThe answer is {D}... wait no.\n{F}",
])
def test_a_correction_or_an_output_label_names_the_answer(raw: str) -> None:
    assert _value(raw) == FV


_CORRECTIONS = st.sampled_from([
    "Wait, I misread.", "Let me fix that:", "Updated answer:", "Corrected:",
    "Actually, that is wrong.", "Correction:", "Final answer:", "On second thought:",
    "I misread the review.", "Oops, my mistake.", "Hmm, no. Let me redo it:",
    "Scratch that.", "The correct output is:", "Revised answer:", "更正：", "最终答案：",
    "Upon re-reading:", "I made a mistake.", "Hmm, that is wrong. Revised:",
    "And a corrected version:", "Not quite.",
])
_FILLERS = st.sampled_from(["", "The reviewer is clearly pleased.", "Re-reading it:",
                            "Here it is again."])
_DRAFT_INTROS = st.sampled_from(["", "The answer is", "Result:", "First guess:",
                                 "Here is the JSON:"])


@SETTINGS
@given(pair=_pair(), draft_intro=_DRAFT_INTROS, correction=_CORRECTIONS, filler=_FILLERS,
       how=st.sampled_from(["plain", "fence", "answer_tag"]),
       after_draft=st.sampled_from(["\n", "\n\n", " ", "... "]))
def test_a_value_after_a_correction_phrase_replaces_the_first(
        pair: tuple[str, str], draft_intro: str, correction: str, filler: str, how: str,
        after_draft: str) -> None:
    answer, draft = pair

    def dress(v: str) -> str:
        return f"<answer>{v}</answer>" if how == "answer_tag" else _dress(v, how)
    raw = (f"{draft_intro} {dress(draft)}{after_draft}{correction} {filler}\n"
           f"{dress(answer)}").strip()
    assert _value(raw) == json.loads(answer)


@SETTINGS
@given(pair=_pair(), label=st.sampled_from(["Input:", "Query:", "Given:", "User input:",
                                            "The input:", "输入："]),
       out=st.sampled_from(["Output:", "Answer:", "Result:", "", "Classification:"]),
       extra=st.sampled_from(["review", "text", "id"]))
def test_a_value_labelled_as_the_input_is_not_the_answer(
        pair: tuple[str, str], label: str, out: str, extra: str) -> None:
    answer, given_ = pair
    echoed = json.dumps({extra: "some text", **json.loads(given_)})
    assert _value(f"{label} {echoed}\n{out} {answer}") == json.loads(answer)


# -- 4. a string is split only where that is the one reading -------------------------

LIST = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["city"],
    "properties": {"city": {"type": "array", "items": {"type": "string"}},
                   "colours": {"type": "array", "items": {"enum": ["red", "green", "blue"]}},
                   "ns": {"type": "array", "items": {"type": "integer"}}}}})


def test_a_comma_inside_a_value_is_no_list_separator() -> None:
    p = parse_output('{"city": "Washington, D.C."}', LIST)
    assert p.usable and p.value == {"city": ["Washington, D.C."]}
    assert "coerced:city:string->array" in p.fixes


_phrase = st.text(st.sampled_from("abc DEF.,;-'"), min_size=1, max_size=20).filter(
    lambda s: s.strip() and s.strip().lower() not in ("n", "y"))


@SETTINGS
@given(text=_phrase)
def test_a_free_string_becomes_a_list_of_itself(text: str) -> None:
    p = parse_output(json.dumps({"city": text}), LIST)
    assert p.usable and p.value["city"] == [text], (text, p.value)


@SETTINGS
@given(colours=st.lists(st.sampled_from(["red", "Green", "BLUE"]), min_size=2, max_size=4),
       ns=st.lists(st.integers(-1000, 1000), min_size=2, max_size=4),
       sep=st.sampled_from([", ", ",", "; ", " , "]))
def test_a_list_of_enum_members_or_numbers_is_split(
        colours: list[str], ns: list[int], sep: str) -> None:
    # (numbers joined by a bare "," may read as one number, "1,100": not split)
    raw = json.dumps({"city": ["x"], "colours": sep.join(colours),
                      "ns": (", " if sep == "," else sep).join(map(str, ns))})
    p = parse_output(raw, LIST)
    assert p.usable and p.value["colours"] == [c.lower() for c in colours]
    assert p.value["ns"] == ns


def test_a_number_with_a_thousands_separator_is_one_number() -> None:
    assert _value('{"city": "x", "ns": "1,234"}', LIST)["ns"] == [1234]


# -- 5. apostrophes in single-quoted values -------------------------------------------

def test_an_apostrophe_in_a_single_quoted_value_is_kept_in_place() -> None:
    p = parse_output("{'label': 'positive', 'score': 0.9, 'summary': 'don't know'}", S)
    assert p.usable and p.value["summary"] == "don't know", p.value


_words = st.sampled_from(["don't", "it's", "users'", "rock 'n' roll", "O'Brien", "ok",
                          "the", "cats'", "'tis", "fine", "isn't"])


@SETTINGS
@given(words=st.lists(_words, min_size=1, max_size=6), label_first=st.booleans())
def test_single_quoted_values_with_apostrophes_are_read_exactly(
        words: list[str], label_first: bool) -> None:
    summary = " ".join(words)
    members = ["'label': 'positive'", "'score': 0.9", f"'summary': '{summary}'"]
    if not label_first:
        members.reverse()
    p = parse_output("{" + ", ".join(members) + "}", S)
    # Delivered exactly, or refused: never a value with a quote moved.
    if p.usable:
        assert p.value == {"label": "positive", "score": 0.9, "summary": summary}, summary
    if "'" not in summary[:1] + summary[-1:]:
        assert p.usable, (summary, p.status, p.error)


# -- 6. integers read exactly or refused ---------------------------------------------

INT = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}})
NUM = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["n"], "properties": {"n": {"type": "number"}}}})


def test_an_integer_beyond_64_bits_is_refused_not_approximated() -> None:
    p = parse_output('{"n": "99999999999999999999"}', INT)
    assert p.status is ParseStatus.SCHEMA_VIOLATION, (p.status, p.value)


@SETTINGS
@given(n=st.one_of(st.integers(), st.integers(-(1 << 70), 1 << 70)),
       rule=st.sampled_from([INT, NUM]), suffix=st.sampled_from(["", ".0", ".00", ".0000"]))
def test_an_integer_string_is_read_exactly_or_refused(
        n: int, rule: DeliveryRule, suffix: str) -> None:
    if rule is NUM and suffix:
        return  # "12.0" is a float for a number field
    p = parse_output(json.dumps({"n": f"{n}{suffix}"}), rule)
    if -(1 << 63) <= n < (1 << 63):
        assert p.usable and p.value == {"n": n} and type(p.value["n"]) is int
    else:
        assert p.status is ParseStatus.SCHEMA_VIOLATION, (n, p.value)


# -- 7. a cut list that is the answer ------------------------------------------------

ARR = DeliveryRule.model_validate({"schema": {"type": "array", "items": {
    "type": "object", "required": ["name"],
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}}}})


def test_a_cut_top_level_list_is_not_delivered() -> None:
    p = parse_output('[{"name": "Ann", "age": 30}, {"name": "Bob", "age": 4', ARR)
    assert not p.usable and p.truncated, (p.status, p.value)


_people = st.lists(st.fixed_dictionaries({"name": st.sampled_from(["Ann", "Bob", "李"]),
                                          "age": st.integers(0, 120)}),
                   min_size=1, max_size=4)


@SETTINGS
@given(people=_people, where=st.floats(0, 1, exclude_max=True),
       wrapped=st.booleans(), fenced=st.booleans())
def test_a_list_answer_cut_anywhere_is_never_delivered_in_part(
        people: list[dict[str, Any]], where: float, wrapped: bool, fenced: bool) -> None:
    text = json.dumps({"people": people} if wrapped else people)
    # cut anywhere before the list's closing bracket
    cut = text[:max(1, int(text.rindex("]") * where))]
    raw = f"```json\n{cut}" if fenced else cut
    p = parse_output(raw, ARR)
    assert not p.usable, (raw, p.value)
    assert parse_output(text, ARR).value == people


# -- 8. double encoding in a fence or after words ------------------------------------

def test_a_double_encoded_answer_in_a_fence_is_decoded_not_cut() -> None:
    p = parse_output('```json\n"{\\"label\\": \\"positive\\", \\"score\\": 0.9}"\n```', S)
    assert p.usable and p.value == FV and not p.truncated, p.fixes
    assert "decoded:string" in p.fixes and not any(f.startswith("repaired:") for f in p.fixes)


def test_a_fence_closing_inside_a_string_is_no_cut() -> None:
    raw = ('```json\n{"label": "positive", "score": 0.9, "summary": "line1\n```\nline2"}'
           '\n```')
    p = parse_output(raw, S)
    assert p.usable and not p.truncated, p.fixes
    assert p.value == {**FV, "summary": "line1\n```\nline2"}


_summary = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)


@SETTINGS
@given(label=st.sampled_from(["positive", "negative"]), summary=_summary,
       how=st.sampled_from(["fence", "bare_fence", "words", "line"]))
def test_a_json_string_holding_the_answer_is_decoded(
        label: str, summary: str, how: str) -> None:
    value = {"label": label, "score": 0.5, "summary": summary}
    encoded = json.dumps(json.dumps(value))
    raw = {"fence": f"```json\n{encoded}\n```", "bare_fence": f"```\n{encoded}\n```",
           "words": f"Here it is: {encoded}", "line": f"Result\n{encoded}\n"}[how]
    p = parse_output(raw, S)
    assert p.usable and not p.truncated, (raw, p.status, p.fixes)
    assert p.value["label"] == label and p.value["score"] == 0.5
    assert "decoded:string" in p.fixes


# -- 9. HTML entities ---------------------------------------------------------------

def test_html_escaped_json_is_read() -> None:
    p = parse_output('{&quot;label&quot;: &quot;positive&quot;, &quot;score&quot;: 0.9}', S)
    assert p.usable and p.value == FV and "repaired:html" in p.fixes


@SETTINGS
@given(label=st.sampled_from(["positive", "negative"]),
       summary=st.text(st.sampled_from("ab <>&'\"x"), max_size=12), lead=st.booleans())
def test_json_with_its_quotes_as_html_entities_is_read(
        label: str, summary: str, lead: bool) -> None:
    value = {"label": label, "score": 0.5, "summary": summary}
    raw = html.escape(json.dumps(value, ensure_ascii=False), quote=True)
    if lead:
        raw = f"<p>Result: {raw}</p>"
    p = parse_output(raw, S)
    assert p.usable and p.value == value and "repaired:html" in p.fixes, (raw, p.value)


def test_a_bare_quote_means_the_entities_are_text() -> None:
    p = parse_output('{"label": "positive", "score": 0.9, "summary": "say &quot;hi&quot;"}',
                     S)
    assert p.value["summary"] == "say &quot;hi&quot;" and "repaired:html" not in p.fixes


# -- 10. cut off while thinking after some prose -------------------------------------

def test_reasoning_cut_off_after_prose_is_reported_as_truncated() -> None:
    p = parse_output(f"Let me think.\n<think>draft {D}\n", S)
    assert p.status is ParseStatus.NO_JSON_FOUND and p.truncated
    assert "max_tokens" in (p.error or "")


@SETTINGS
@given(prose=st.text(st.sampled_from("abc .,!\n"), max_size=30),
       tag=st.sampled_from(["think", "thinking", "reasoning"]),
       draft=st.sampled_from(["", D, '{"label": "neg', "Let me see"]))
def test_an_output_ending_inside_its_reasoning_was_cut_off(
        prose: str, tag: str, draft: str) -> None:
    p = parse_output(f"{prose}\n<{tag}>{draft}", S)
    assert not p.usable and p.truncated and "max_tokens" in (p.error or ""), p
