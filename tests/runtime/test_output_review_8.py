"""Regression review of b4da096 (1,913 adversarial answers, right before it, wrong after).

* R1: a string value holding an unescaped quotation followed by a Unicode blank and a
  colon (French typography: ``"Le client dit "parfait"\\u00a0: il reviendra"``) is not
  ended at the quotation: a value's string never ends where only a key may (before a
  colon) when another quote on its line can end it; the ASCII-space form too. A
  quotation followed by a Unicode blank, a closing bracket and text does not end it
  either. Between tokens those blanks stay JSON's whitespace.
* R2: JSON written as the inside of a string whose escapes are not all valid keeps a
  surrogate pair's two escapes as one character (``\\ud83d\\ude00`` 😀).
* R3: a text answer keeps the reasoning tags it shows in a code fence, an indented
  code line or a block quote, the tags it names in prose ("<think> tags mark ..."),
  and the reasoning-named elements of an XML answer; only blocks that open the reply
  are set aside.
* R5: ``...`` after an inner quotation is an elision only before a closing bracket that
  JSON syntax follows, or before a comma and a value.
"""

from __future__ import annotations

import json

import pytest

from lockgate.runtime import parse_output
from lockgate.spec import DeliveryRule

NOTE = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["title", "body"],
    "properties": {"title": {"type": "string"}, "body": {"type": "string"},
                   "tags": {"type": "array", "items": {"type": "string"}}}}})
LIST = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["items"],
    "properties": {"items": {"type": "array", "items": {"type": "string"}},
                   "total": {"type": "integer"}}}})
TEXT = DeliveryRule(format="text")

FRENCH_BLANKS = ["\u00a0", "\u202f", "\u2009", "\u200b", " "]


def _value(raw: str, rule: DeliveryRule, finish: str | None = None) -> object:
    parsed = parse_output(raw, rule, finish_reason=finish)
    assert parsed.usable, parsed.error
    return parsed.value


# --- R1 -----------------------------------------------------------------------------

@pytest.mark.parametrize("blank", FRENCH_BLANKS, ids=lambda c: f"U+{ord(c):04X}")
@pytest.mark.parametrize("wrap", ["{}", "```json\n{}\n```", "Voici :\n{}"])
def test_a_quotation_before_a_blank_and_a_colon_does_not_end_a_value(blank: str,
                                                                      wrap: str) -> None:
    body = f'Le client écrit "parfait"{blank}: il reviendra'
    raw = wrap.replace("{}", '{"title": "Avis", "body": "' + body + '"}')
    assert _value(raw, NOTE) == {"title": "Avis", "body": body}


@pytest.mark.parametrize("blank", FRENCH_BLANKS, ids=lambda c: f"U+{ord(c):04X}")
def test_a_quotation_before_a_colon_in_a_value_with_more_fields(blank: str) -> None:
    body = f'Option "Premium"{blank}: 12\u00a0€ par mois'
    raw = ('{\n  "title": "Boutique",\n  "body": "' + body + '",\n  "tags": ["prix"]\n}')
    assert _value(raw, NOTE, "stop") == {"title": "Boutique", "body": body,
                                         "tags": ["prix"]}


@pytest.mark.parametrize("blank", ["\u00a0", "\u202f", "\u200b", "\u2009"],
                         ids=lambda c: f"U+{ord(c):04X}")
@pytest.mark.parametrize("text", ['The sign read "OPEN"<b>} but it was closed',
                                  'Title: "Dune"<b>] (1965)'])
def test_a_quotation_before_a_blank_a_bracket_and_text_does_not_end_a_value(
        blank: str, text: str) -> None:
    body = text.replace("<b>", blank)
    raw = '```json\n{"title": "Q", "body": "' + body + '"}\n```'
    assert _value(raw, NOTE) == {"title": "Q", "body": body}


@pytest.mark.parametrize("blank", ["\u00a0", "\u202f", "\u200b", "\ufeff"],
                         ids=lambda c: f"U+{ord(c):04X}")
def test_unicode_blanks_between_tokens_stay_whitespace(blank: str) -> None:
    value = {"title": "x", "body": 'a "b" c', "tags": ["y"]}
    raw = ('{"title": "x"' + blank + ', "body"' + blank + ': "a \\"b\\" c"' + blank
           + ', "tags": ["y"' + blank + "]" + blank + "}")
    assert _value(raw, NOTE) == value
    raw = '{"title": "x"' + blank + '}\nHope this helps'
    assert _value(raw, DeliveryRule()) == {"title": "x"}


def test_a_key_still_ends_before_a_spaced_colon() -> None:
    assert _value('{"title" : "T", "body"\u00a0: "B"}', NOTE) == {"title": "T", "body": "B"}


# --- R2 -----------------------------------------------------------------------------

@pytest.mark.parametrize("escapes, char", [("\\ud83d\\ude00", "😀"), ("\\ud83d\\ude80", "🚀"),
                                           ("\\ud83c\\uddeb\\ud83c\\uddf7", "🇫🇷"),
                                           ("\\uD83D\\uDE0A", "😊")])
@pytest.mark.parametrize("loose", ["\\'", "\\d", "\\%"])
def test_a_surrogate_pair_in_an_over_escaped_string_body_is_one_character(
        escapes: str, char: str, loose: str) -> None:
    raw = ('{\\"title\\": \\"Emoji\\", \\"body\\": \\"C' + loose + "est super " + escapes
           + '\\"}')
    value = _value(raw, NOTE)
    assert isinstance(value, dict)
    assert value["body"].endswith("est super " + char)
    assert "\ufffd" not in value["body"]


def test_a_lone_surrogate_escape_is_not_two_replacement_characters() -> None:
    raw = '{\\"title\\": \\"E\\", \\"body\\": \\"it\\\'s \\ud83d\\ude0a and \\ud83d x\\"}'
    value = _value(raw, NOTE)
    assert isinstance(value, dict)
    assert value["body"].startswith("it's 😊 and ")
    assert value["body"].count("\ufffd") <= 1


# --- R3 -----------------------------------------------------------------------------

@pytest.mark.parametrize("raw", [
    "Example:\n```\n<think>\nreasoning here\n</think>\nfinal answer\n```",
    "```xml\n<think>\n  <step>1</step>\n</think>\n```",
    "Use this format:\n```\nreasoning\n</think>\nanswer\n```",
    "The template is:\n\n    <think>\n    reasoning\n    </think>\n    answer",
    "> <think>\n> quoted reasoning\n> </think>\n> quoted answer\n\nThat is the shape.",
])
def test_reasoning_tags_shown_as_code_or_quoted_are_kept(raw: str) -> None:
    assert _value(raw, TEXT) == raw


@pytest.mark.parametrize("raw", [
    "<think> is a tag",
    "<think> tags mark the reasoning section in R1 outputs.",
    "Strip everything before </think>\nand keep the rest.",
    "Here is the explanation:\n\n<thinking> blocks hold the draft\n",
])
def test_reasoning_tags_named_in_prose_are_kept(raw: str) -> None:
    assert _value(raw, TEXT) == raw


@pytest.mark.parametrize("raw", [
    "<response>\n  <reasoning>The customer thanks the agent.</reasoning>\n"
    "  <label>positive</label>\n</response>",
    "<report><analysis>Stable.</analysis></report>",
    "<evaluation>\n<reasoning>\nThe essay is clear.\n</reasoning>\n<score>8</score>\n"
    "</evaluation>",
    "Here is my review:\n<analysis>\nGood structure, weak conclusion.\n</analysis>\n"
    "Grade: B",
])
def test_reasoning_named_elements_inside_an_answer_are_kept(raw: str) -> None:
    assert _value(raw, TEXT) == raw


@pytest.mark.parametrize("raw, answer", [
    ("<think>\nThe user greets me.\n</think>\n\nHello there!", "Hello there!"),
    ("<think>Short.</think>\nHello", "Hello"),
    ("<think> Okay, a greeting.</think>\n\nHello", "Hello"),
    ("the user greets me\n</think>\n\nHello", "Hello"),
    ("<think>\nA\n</think>\n<reasoning>\nB\n</reasoning>\nHello", "Hello"),
    ("<think>\nI will write:\n```\ncode\n```\n</think>\nHello", "Hello"),
])
def test_reasoning_that_opens_a_text_answer_is_still_set_aside(raw: str, answer: str) -> None:
    assert _value(raw, TEXT) == answer


# --- R5 -----------------------------------------------------------------------------

@pytest.mark.parametrize("ellipsis", ["...", "…"])
def test_an_ellipsis_after_a_quotation_in_a_string_is_text(ellipsis: str) -> None:
    body = f'Tags "x", {ellipsis}, etc'
    raw = '```json\n{"title": "T", "body": "' + body + '"}\n```'
    assert _value(raw, NOTE) == {"title": "T", "body": body}
    item = f'He said "wait", {ellipsis}]'
    raw = 'Here:\n{"items": ["' + item + '"], "total": 1}'
    assert _value(raw, LIST) == {"items": [item], "total": 1}


@pytest.mark.parametrize("tail", ["...]", "...\n]", "..., \"c\"]"])
def test_a_list_elision_still_reads(tail: str) -> None:
    raw = '{"items": ["a", "b", ' + tail + ', "total": 3}'
    value = _value(raw, LIST)
    assert isinstance(value, dict)
    assert value["items"][:2] == ["a", "b"] and value["total"] == 3
    assert json.dumps(value)
