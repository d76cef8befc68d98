"""Review of 2026-12-07 (a 4,253-answer corpus the ladder had not seen).

* D1/D2: a Unicode space or format character (no-break space, thin space, zero-width
  space, BOM, word joiner, soft hyphen, line separator, NEL, VT, FF ...) between JSON
  tokens is JSON's own whitespace: it never makes a string run on (the answer read as
  cut off), nor reaches ``json_repair`` as text. Inside strings it is kept as written.
* D3: JSON written as the inside of a JSON string (``{\\n  \\"a\\": 1}``) is read with
  every escape decoded, ``\\n`` included.
* D4: a value in a section labelled as reasoning ("Reasoning:", "## Thinking",
  思考过程：) is a draft when a later value is introduced by an answer label.
* D5: corrections in other languages between fenced values, inflected forms, and
  draft labels with a qualifier ("Черновик (неверно):").
* D6: ``format: "text"`` sets reasoning aside; a blank answer is none.
* D7: an elision (``...``) in a list is no cut.
* Clear answers: HTML quote entities as JSON syntax (also in ``<pre><code
  class=...>``), an enum member written with ``&amp;``, yes/no in more languages,
  answers written as tool calls.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lockgate.runtime import ParseStatus, parse_output
from lockgate.spec import DeliveryRule

SENT = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["label", "confidence"],
    "properties": {"label": {"enum": ["positive", "negative", "neutral", "mixed"]},
                   "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                   "reasons": {"type": "array", "items": {"type": "string"}}}}})
CAT = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["category"],
    "properties": {"category": {"enum": ["Café & Bar", "Restaurant", "Shop"]},
                   "note": {"type": "string"}}}})
PERSON = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["name", "age"],
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                   "email": {"type": ["string", "null"]},
                   "tags": {"type": "array", "items": {"type": "string"}},
                   "address": {"type": "object", "required": ["city"],
                               "properties": {"city": {"type": "string"},
                                              "country": {"type": "string"}}}}}})
SPAM = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["is_spam", "reason"],
    "properties": {"is_spam": {"type": "boolean"}, "reason": {"type": "string"}}}})
ANY = DeliveryRule()
TEXT = DeliveryRule(format="text")

#: Unicode spaces (Zs but U+0020, line/paragraph separators, NEL, VT, FF) and format
#: characters (Cf) a model or the text around it leaves between tokens.
BLANKS = ["\u00a0", "\u202f", "\u2009", "\u2003", "\u2000", "\u205f", "\u1680", "\u3000",
          "\u2028", "\u2029", "\u0085", "\x0b", "\x0c", "\u200b", "\u200c", "\u200d",
          "\u200e", "\u200f", "\ufeff", "\u2060", "\u00ad", "\u202a", "\u2066", "\u180e"]

A = {"label": "positive", "confidence": 0.92, "reasons": ["fast delivery", "good fit"]}
B = {"label": "negative", "confidence": 0.81, "reasons": ["arrived broken"]}
ADA = {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org",
       "tags": ["math", "poetry"], "address": {"city": "London", "country": "UK"}}


def _j(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# --- D1/D2: Unicode blanks between tokens ---------------------------------------------


@pytest.mark.parametrize("finish", [None, "stop"])
@pytest.mark.parametrize("blank", BLANKS, ids=lambda c: f"U+{ord(c):04X}")
def test_a_unicode_blank_before_a_closing_bracket_is_whitespace(blank: str,
                                                                finish: str | None) -> None:
    raw = ('{"label": "positive", "confidence": 0.92, "reasons": ["fast delivery", '
           f'"good fit"{blank}]{blank}}}')
    parsed = parse_output(raw, SENT, finish_reason=finish)
    assert parsed.usable and parsed.value == A, parsed
    assert not parsed.truncated


@pytest.mark.parametrize("blank", BLANKS, ids=lambda c: f"U+{ord(c):04X}")
def test_a_unicode_blank_before_a_colon_or_after_a_comma_is_whitespace(blank: str) -> None:
    raw = f'{{"category"{blank}: "Café & Bar",{blank}"note"{blank}:{blank}"espresso bar"{blank}}}'
    parsed = parse_output(raw, CAT)
    assert parsed.usable and parsed.value == {"category": "Café & Bar",
                                              "note": "espresso bar"}, parsed


@pytest.mark.parametrize("blank", ["\u200b", "\ufeff", "\u2060", "\u00ad", "\u00a0"],
                         ids=lambda c: f"U+{ord(c):04X}")
def test_format_characters_between_tokens_never_become_values(blank: str) -> None:
    raw = (f'{{{blank}"name":{blank} "Ada Lovelace",{blank} "age":{blank} 36,{blank} '
           f'"email":{blank} "ada@example.org",{blank} "tags":{blank} [{blank}],{blank} '
           f'"address":{blank} {{{blank}"city":{blank} "London",{blank} "country":{blank} '
           f'"UK"}}}}')
    parsed = parse_output(raw, PERSON)
    assert parsed.usable and parsed.value == {**ADA, "tags": []}, parsed


def test_a_no_break_space_in_a_value_is_kept_and_before_the_brace_is_not_a_cut() -> None:
    raw = '{"category": "Café & Bar", "note": "espresso\u00a0bar\u200b"\u00a0}'
    parsed = parse_output(raw, CAT, finish_reason="length")
    assert parsed.usable and parsed.value == {"category": "Café & Bar",
                                              "note": "espresso\u00a0bar\u200b"}


_KEYS = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8)
_TEXTS = st.text(alphabet=st.sampled_from(
    [*"abc xyz:,{}[]\"'\\", *BLANKS, "é", "中"]), max_size=12)
_SCALARS = st.one_of(st.integers(-10**6, 10**6), st.booleans(), st.none(), _TEXTS)
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(_KEYS, inner, max_size=3)), max_leaves=8)
_OBJECTS = st.dictionaries(_KEYS, _VALUES, min_size=1, max_size=4)


def _render(value: Any, blank: Any) -> str:
    """``value`` as JSON with ``blank()`` between every two tokens."""
    if isinstance(value, dict):
        items = [f"{blank()}{_j(k)}{blank()}:{blank()}{_render(v, blank)}{blank()}"
                 for k, v in value.items()]
        return "{" + blank() + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + blank() + ",".join(
            f"{blank()}{_render(v, blank)}{blank()}" for v in value) + "]"
    return _j(value)


@settings(max_examples=150, deadline=None)
@given(obj=_OBJECTS, data=st.data())
def test_unicode_blanks_between_tokens_never_change_the_value(obj: dict[str, Any],
                                                              data: Any) -> None:
    """Any Unicode space or format character between the tokens of a valid object
    leaves the delivered value as it is (and the characters inside its strings are
    kept as written)."""
    gaps = st.text(alphabet=st.sampled_from([" ", *BLANKS]), max_size=2)
    raw = _render(obj, lambda: data.draw(gaps))
    parsed = parse_output(raw, ANY)
    assert parsed.usable and parsed.value == obj, (raw, parsed)


# --- D3: JSON written as the inside of a JSON string -------------------------------------


@pytest.mark.parametrize("raw, value", [
    ('{\\n  \\"label\\": \\"positive\\",\\n  \\"confidence\\": 0.92,\\n  \\"reasons\\": '
     '[\\n    \\"fast delivery\\",\\n    \\"good fit\\"\\n  ]\\n}', A),
    ('{\\n\\t\\"label\\": \\"negative\\",\\r\\n\\t\\"confidence\\": 0.81,\\n\\t\\"reasons\\": '
     '[\\"arrived broken\\"]\\n}', B),
    ('Here it is: {\\"label\\": \\"mixed\\", \\"confidence\\": 0.7, \\"reasons\\": '
     '[\\"\\u5473\\u9053\\u4e0d\\u9519\\", \\"a \\\\\\"quote\\\\\\"\\"]}',
     {"label": "mixed", "confidence": 0.7, "reasons": ["味道不错", 'a "quote"']}),
])
def test_json_written_as_a_string_body_is_read_with_its_escapes_decoded(
        raw: str, value: dict[str, Any]) -> None:
    parsed = parse_output(raw, SENT)
    assert parsed.usable and parsed.value == value, parsed
    assert "unescaped" in parsed.fixes


# --- D4: labelled reasoning sections ----------------------------------------------------

DRAFT, FINAL = _j(B), _j(A)


@pytest.mark.parametrize("raw", [
    f"reasoning_content: I think {DRAFT}\ncontent: {FINAL}",
    f"Reasoning: I think {DRAFT}\nAnswer: {FINAL}",
    f"Thought: maybe {DRAFT}\nOutput: {FINAL}",
    f"**Reasoning:** I first guessed {DRAFT}.\n\n**Answer:**\n{FINAL}",
    f"## Thinking\nMaybe {DRAFT}\n\n## Answer\n{FINAL}",
    f"### Analysis\nFirst draft: {DRAFT}\n\n### Final answer\n```json\n{FINAL}\n```",
    f"思考过程：我觉得是 {DRAFT}\n\n答案：{FINAL}",
    f"考え：たぶん {DRAFT}\n\n回答：{FINAL}",
    f"Рассуждение: возможно {DRAFT}\n\nОтвет: {FINAL}",
    f"Razonamiento: quizá {DRAFT}\n\nRespuesta: {FINAL}",
    f"Thinking process: {DRAFT} looks wrong.\nFinal Answer: {FINAL}",
], ids=["rc", "reasoning", "thought", "bold", "heading", "analysis", "zh", "ja", "ru", "es",
        "process"])
def test_a_value_in_a_labelled_reasoning_section_is_a_draft(raw: str) -> None:
    parsed = parse_output(raw, SENT)
    assert parsed.usable and parsed.value == A, parsed


@pytest.mark.parametrize("raw, value", [
    (f"Answer: {FINAL}", A),  # an answer label alone
    (f"Reasoning: the review praises the delivery.\nAnswer: {FINAL}", A),
    (f"Reasoning: I think it is {FINAL}", A),  # one value only: it is the answer
    (f"Reasoning: I think {FINAL}\nAnswer: as above.", A),  # no value after the label
    (f"{FINAL}\nReasoning: unlike {DRAFT}, it is praised.\nAnswer: {DRAFT}", A),
], ids=["answer-only", "no-draft", "one-value", "no-later-value", "value-first"])
def test_a_reasoning_label_without_a_later_labelled_answer_changes_nothing(
        raw: str, value: dict[str, Any]) -> None:
    parsed = parse_output(raw, SENT)
    assert parsed.usable and parsed.value == value, parsed


# --- D5: corrections in other languages ---------------------------------------------------

_FIRST = {"label": "positive", "confidence": 0.9}
_SECOND = {"label": "negative", "confidence": 0.8}


def _fenced(value: dict[str, Any]) -> str:
    return "```json\n" + json.dumps(value, indent=2) + "\n```"


@pytest.mark.parametrize("phrase", [
    "Korrektur:", "Endgültige Antwort:", "Исправление:", "Окончательный ответ:", "تصحيح:",
    "訂正：", "최종 답변:", "Poprawka:", "すみません、訂正します：", "죄송합니다. 수정된 결과:",
    "Подождите, я ошибся. Исправленный вариант:", "Perdón, corrijo:", "सुधार:",
])
@pytest.mark.parametrize("fenced", [False, True], ids=["chatter", "fenced"])
def test_a_correction_in_another_language_replaces_the_value_before(phrase: str,
                                                                    fenced: bool) -> None:
    show = _fenced if fenced else _j
    raw = f"{show(_FIRST)}\n\n{phrase}\n\n{show(_SECOND)}"
    parsed = parse_output(raw, SENT)
    assert parsed.usable and parsed.value == _SECOND, parsed


@pytest.mark.parametrize("label", ["下書き（誤り）：", "Черновик (неверно):",
                                   "Borrador (incorrecto):", "Entwurf (falsch):"])
def test_a_draft_label_with_a_qualifier_marks_the_first_value(label: str) -> None:
    raw = f"{label} {_j(_FIRST)}\n\n{_j(_SECOND)}"
    parsed = parse_output(raw, SENT)
    assert parsed.usable and parsed.value == _SECOND, parsed


@pytest.mark.parametrize("phrase", ["訂正前：", "수정 전:"])
def test_before_the_correction_is_no_correction(phrase: str) -> None:
    raw = f"{_j(_FIRST)}\n\n{phrase}\n{_j(_SECOND)}"
    parsed = parse_output(raw, SENT)
    assert parsed.usable and parsed.value == _FIRST, parsed


# --- D6: text answers -------------------------------------------------------------------


@pytest.mark.parametrize("raw, value", [
    ("<think>hmm</think>The capital is Paris.", "The capital is Paris."),
    ("<think>\nLet me recall...\n</think>\n\n巴黎。", "巴黎。"),
    ("Thinking...\nhmm\n...done thinking.\n\nThe answer is 42.", "The answer is 42."),
    ("◁think▷hmm◁/think▷Paris.", "Paris."),
    ("<|channel|>analysis<|message|>hmm<|end|><|start|>assistant<|channel|>final"
     "<|message|>The answer is 42.", "The answer is 42."),
])
def test_a_text_answer_has_its_reasoning_set_aside(raw: str, value: str) -> None:
    parsed = parse_output(raw, TEXT)
    assert parsed.usable and parsed.value == value, parsed
    assert "stripped:think" in parsed.fixes


@pytest.mark.parametrize("raw", ["", " ", "\n\n", "\u200b", "\ufeff \u00a0",
                                 "<think>I am still thinking about Paris.</think>",
                                 "<think>still thinking", "<think>x</think>\n\u200b\n"])
def test_a_blank_or_reasoning_only_text_answer_is_no_answer(raw: str) -> None:
    parsed = parse_output(raw, TEXT)
    assert not parsed.usable and parsed.status is ParseStatus.NO_JSON_FOUND, parsed


def test_a_text_answer_without_reasoning_is_kept_as_written() -> None:
    parsed = parse_output("  any text\u00a0 ", TEXT)
    assert parsed.status is ParseStatus.VALID and parsed.value == "  any text\u00a0 "


# --- D7: an elision in a list ------------------------------------------------------------


@pytest.mark.parametrize("tail", [", ...]", ", …]", ", ... ]", ",\u00a0...\u00a0]"])
def test_an_elision_in_a_list_drops_only_itself(tail: str) -> None:
    raw = '{"label": "negative", "confidence": 0.8, "reasons": ["slow", "rude"' + tail + "}"
    parsed = parse_output(raw, SENT)
    assert parsed.usable and not parsed.truncated
    assert parsed.value == {"label": "negative", "confidence": 0.8, "reasons": ["slow", "rude"]}


# --- clear answers ------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [
    "{&#34;label&#34;: &#34;positive&#34;, &#34;confidence&#34;: 0.92, &#34;reasons&#34;: "
    "[&#34;fast delivery&#34;, &#34;good fit&#34;]}",
    "{&#x22;label&#x22;: &#x22;positive&#x22;, &#x22;confidence&#x22;: 0.92, "
    "&#x22;reasons&#x22;: [&#x22;fast delivery&#x22;, &#x22;good fit&#x22;]}",
    '<pre><code class="language-json">{\n  &quot;label&quot;: &quot;positive&quot;,\n  '
    "&quot;confidence&quot;: 0.92,\n  &quot;reasons&quot;: [&quot;fast delivery&quot;, "
    "&quot;good fit&quot;]\n}</code></pre>",
])
def test_html_quote_entities_as_json_syntax_are_read(raw: str) -> None:
    parsed = parse_output(raw, SENT)
    assert parsed.usable and parsed.value == A, parsed


def test_an_enum_member_written_as_html_is_the_member() -> None:
    parsed = parse_output('{"category": "Café &amp; Bar"}', CAT)
    assert parsed.usable and parsed.value == {"category": "Café & Bar"}


@pytest.mark.parametrize("word, value", [("はい", True), ("いいえ", False), ("да", True),
                                         ("Нет", False), ("ja", True), ("nein", False),
                                         ("oui", True), ("sí", True), ("não", False)])
def test_yes_and_no_in_more_languages_are_booleans(word: str, value: bool) -> None:
    parsed = parse_output(_j({"is_spam": word, "reason": "r"}), SPAM)
    assert parsed.usable and parsed.value == {"is_spam": value, "reason": "r"}, parsed


_ARGS = _j(ADA)


@pytest.mark.parametrize("raw", [
    '<|python_tag|>{"name": "submit_person", "parameters": ' + _ARGS + "}",
    '{"name": "submit_person", "arguments": ' + _ARGS + "}",
    '{"type": "function", "function": {"name": "submit_person", "arguments": '
    + _j(_ARGS) + "}}",
    '{"tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "submit", '
    '"arguments": ' + _j(_ARGS) + "}}]}",
    '[TOOL_CALLS][{"name": "submit", "arguments": ' + _ARGS + "}]",
    '<tool_call>\n{"name": "submit", "arguments": ' + _ARGS + "}\n</tool_call>",
])
def test_an_answer_written_as_a_tool_call_is_its_arguments(raw: str) -> None:
    parsed = parse_output(raw, PERSON)
    assert parsed.usable and parsed.value == ADA, parsed


def test_a_person_named_like_a_call_is_no_tool_call() -> None:
    """A name with a space is a person's; an object with no declared field in its
    arguments is not unwrapped."""
    parsed = parse_output('{"name": "Ada Lovelace", "age": 36, "parameters": {"x": 1}}',
                          PERSON)
    assert parsed.usable and parsed.value["name"] == "Ada Lovelace"
    parsed = parse_output('{"name": "submit", "arguments": {"x": 1}}', PERSON)
    assert not parsed.usable


# --- D8: several answers in an array (the rule kept) ----------------------------------------


def test_an_array_of_several_objects_still_gives_its_first() -> None:
    """The documented rule (step 5): an array around the object gives its first
    element; the project's corpus holds 64 such answers (``several_array``)."""
    parsed = parse_output(f"[{_j(_FIRST)}, {_j(_SECOND)}]", SENT)
    assert parsed.usable and parsed.value == _FIRST


@pytest.mark.parametrize("raw", ["Models close their reasoning with </think> and answer.",
                                 "Use <think> tags like <think>x</think> inline.",
                                 "I wrote <thinking> in the doc."])
def test_a_text_answer_that_names_the_tags_is_kept(raw: str) -> None:
    parsed = parse_output(raw, TEXT)
    assert parsed.status is ParseStatus.VALID and parsed.value == raw


def test_a_headless_reasoning_block_before_a_text_answer_is_set_aside() -> None:
    parsed = parse_output("The user asks for the capital.\n</think>\n\nParis.", TEXT)
    assert parsed.usable and parsed.value == "Paris."


def test_a_blank_inside_a_bare_word_is_kept_as_written() -> None:
    """Only blanks next to JSON syntax or white space are whitespace: inside an unquoted
    value (``New\\u00a0York``) they are its text."""
    parsed = parse_output('{"mood": "ok", city: New\u00a0York\u00a0}', ANY)
    assert parsed.usable and parsed.value == {"mood": "ok", "city": "New\u00a0York"}
