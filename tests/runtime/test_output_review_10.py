"""Review of the output pass (1,311 answers): templates echoed before the answer,
Python's ``#`` comments, tuples, lists written as text in array fields, numbers cut in
their exponent, enum members wrapped in Markdown or quotes.

* D1: an object whose every value is a placeholder (``...``, ``<name>``, ``{name}``,
  ``{{name}}``, ``your name here``, ``<0-1>``) is a template echoed before the answer:
  the value after it is the answer. Alone, it is read as before; ordinary words
  ("string", "Unknown", "N/A") are values.
* D2: a ``#`` comment after a value (or a comma) is taken out as ``//`` is; ``#``
  inside strings stays.
* D3: a Python tuple is a list, every item kept.
* D4: a bracketed list written as text in an array field is the list it writes.
* D9: a number whose exponent has no digit (``0.9e``) was cut off: refused.
* D10: an enum member wrapped whole in Markdown emphasis, backticks or quotes is the
  member.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from lockgate.runtime import parse_output
from lockgate.spec import DeliveryRule

FLAT = {"schema": {"type": "object", "required": ["name", "city"], "properties": {
    "name": {"type": "string"}, "city": {"type": "string"}, "age": {"type": "integer"}},
    "additionalProperties": False}}
KEYS = {"required_keys": ["answer", "confidence"]}
MULTI = {"schema": {"type": "object", "required": ["label", "score"], "properties": {
    "label": {"enum": ["positive", "negative", "neutral"]},
    "score": {"type": "number", "minimum": 0, "maximum": 1},
    "summary": {"type": "string"}}}}
LIST = {"schema": {"type": "object", "required": ["tags"], "properties": {
    "tags": {"type": "array", "items": {"type": "string"}}}}}
LABEL = {"schema": {"type": "object", "required": ["label"], "properties": {
    "label": {"enum": ["positive", "negative", "neutral"]}}}}
SUMMARY = {"schema": {"type": "object", "required": ["title", "summary"], "properties": {
    "title": {"type": "string"}, "summary": {"type": "string"}}}}
TEMPLATE = {"schema": {"type": "object", "required": ["template"], "properties": {
    "template": {"type": "string"}}}}
ANNA = {"name": "Anna", "city": "Berlin"}


def parse(answer: str, rule: dict[str, Any]) -> Any:
    return parse_output(answer, DeliveryRule.model_validate(rule))


def value(answer: str, rule: dict[str, Any]) -> Any:
    parsed = parse(answer, rule)
    assert parsed.usable, parsed.error
    return parsed.value


# --- D1: a template echoed before the answer ------------------------------------------

@pytest.mark.parametrize("name, city", [
    ("...", "..."), ("…", "…"), ("<name>", "<city>"), ("<customer name>", "<customer city>"),
    ("{name}", "{city}"), ("{{name}}", "{{ city }}"), ("your name here", "your city here"),
    ("<string>", "<string>"), ("[name]", "[city]"), ("$name", "${city}"),
])
@pytest.mark.parametrize("lead", ["", "Sure.\n", "Using this structure "])
def test_echoed_template_gives_way_to_the_answer(name: str, city: str, lead: str) -> None:
    answer = f'{lead}{{"name": "{name}", "city": "{city}"}}\n\n{{"name": "Anna", "city": "Berlin"}}'
    assert value(answer, FLAT) == ANNA


def test_echoed_template_with_a_range() -> None:
    answer = ('{"answer": "<answer>", "confidence": "<0-1>"}\n'
              '{"answer": "Paris", "confidence": 0.9}')
    assert value(answer, KEYS) == {"answer": "Paris", "confidence": 0.9}
    # a template with a number in it is a value
    answer = ('{"answer": "...", "confidence": 0.5}\n'
              '{"answer": "Paris", "confidence": 0.9}')
    assert value(answer, KEYS) == {"answer": "...", "confidence": 0.5}


@pytest.mark.parametrize("first", [
    {"name": "string", "city": "string"}, {"name": "Unknown", "city": "N/A"},
    {"name": "...", "city": "Berlin"}, {"name": "Name", "city": "City"},
])
def test_ordinary_words_are_no_placeholders(first: dict[str, str]) -> None:
    echoed = '{"name": "<name>", "city": "<city>"}\n\n{"name": "Bob", "city": "Rome"}'
    assert value(echoed, FLAT) == {"name": "Bob", "city": "Rome"}
    answer = json.dumps(first) + '\n\n{"name": "Bob", "city": "Rome"}'
    assert value(answer, FLAT) == first
    # a template alone is read as before
    assert value('{"name": "<name>", "city": "<city>"}', FLAT) == {
        "name": "<name>", "city": "<city>"}


# --- D2: Python's # comments ----------------------------------------------------------

@pytest.mark.parametrize("answer", [
    '{\n  "name": "Anna",\n  "city": "Berlin"  # from the signature\n}',
    "{\n  'name': 'Anna',\n  'city': 'Berlin'  # from the signature\n}",
    '{"name": "Anna", "city": "Berlin" # signature\n}',
    "{'name': 'Anna', 'city': 'Berlin', # comment\n}",
    '```python\n{\n    "name": "Anna",\n    "city": "Berlin",  # signature\n}\n```',
])
def test_hash_comment_is_taken_out(answer: str) -> None:
    assert value(answer, FLAT) == ANNA
    # a # inside a string stays
    for name in ("Anna # 2", 'The "best" # choice'):
        written = name.join(['{"name": "', '", "city": "Berlin"}'])
        assert value(written, FLAT) == {"name": name, "city": "Berlin"}


def test_hash_comment_keeps_a_later_field() -> None:
    answer = '{\n  "label": "negative",\n  "score": 0.2,\n  "summary": "Late delivery"  # short\n}'
    assert value(answer, MULTI) == {"label": "negative", "score": 0.2,
                                    "summary": "Late delivery"}
    # after a comma, on a line of its own
    answer = '{\n  "name": "Anna",  # first name\n  "city": "Berlin"\n}'
    assert value(answer, FLAT) == ANNA


def test_hash_comment_is_no_fallback_case() -> None:
    rule = {**FLAT, "fallback_values": {"city": "UNKNOWN"}}
    answer = '{\n  "name": "Anna",\n  "city": "Berlin"  # from the signature\n}'
    assert value(answer, rule) == ANNA


# --- D3: tuples -----------------------------------------------------------------------

@pytest.mark.parametrize("answer, tags", [
    ("{'tags': ('billing', 'refund')}", ["billing", "refund"]),
    ('{"tags": ("billing", "refund")}', ["billing", "refund"]),
    ("```python\n{'tags': ('billing', 'refund', 'urgent')}\n```",
     ["billing", "refund", "urgent"]),
])
def test_tuple_is_a_whole_list(answer: str, tags: list[str]) -> None:
    assert value(answer, LIST)["tags"] == tags
    assert value("{'tags': ('a', 'b'), 'note': 1}", LIST)["tags"] == ["a", "b"]


def test_tuple_in_a_string_field_is_refused() -> None:
    parsed = parse("{'label': 'negative', 'score': 0.2, 'summary': ('late', 'broken')}",
                   MULTI)
    assert not parsed.usable
    # a parenthesis inside a string stays
    answer = '{"name": "see (a "b"), then", "city": "Berlin"}'
    assert value(answer, FLAT) == {"name": 'see (a "b"), then', "city": "Berlin"}


# --- D4: a list written as text ------------------------------------------------------

@pytest.mark.parametrize("answer, tags", [
    ("{\"tags\": \"['billing', 'refund']\"}", ["billing", "refund"]),
    ("{'tags': \"['billing']\"}", ["billing"]),
    ('{"tags": "[billing, refund]"}', ["billing", "refund"]),
])
def test_list_written_as_text_is_the_list(answer: str, tags: list[str]) -> None:
    assert value(answer, LIST)["tags"] == tags


@pytest.mark.parametrize("subject", [
    "[EXTERNAL] Re: invoice [#123]", "[WIP] fix login [draft]", "[PATCH v3] net: fix [bug]",
])
def test_bracketed_text_that_is_no_list_stays_one_item(subject: str) -> None:
    assert value(json.dumps({"tags": subject}), LIST)["tags"] == [subject]


@pytest.mark.parametrize("text", ["['a' 'b']", "[True, False]", "[0x10, 2]", "[1_000]"])
def test_python_literals_no_model_means_as_text_are_not_read(text: str) -> None:
    # (Python joins 'a' 'b' into "ab", reads True as a bool, 0x10 as 16)
    assert value(json.dumps({"tags": text}), LIST)["tags"] == [text]


def test_quoted_items_may_hold_commas() -> None:
    assert value('{"tags": "[\'a, b\', \'c\']"}', LIST)["tags"] == ["a, b", "c"]


# --- where a # or a ) inside a string of several lines is no end ----------------------

@pytest.mark.parametrize("answer, text", [
    ('{"title": "T", "summary": "Just read "1984" #books\nSo good!"}',
     'Just read "1984" #books\nSo good!'),
    ('{"title": "T", "summary": "def f():\n    print("hello")\n    return 1"\n}',
     'def f():\n    print("hello")\n    return 1'),
    ('{"title": "T", "summary": "see (the "manual")\nmore text"}',
     'see (the "manual")\nmore text'),
])
def test_quote_then_hash_or_parenthesis_inside_a_long_string(answer: str, text: str) -> None:
    assert value(answer, SUMMARY)["summary"] == text


# --- placeholders that are the value ----------------------------------------------------

@pytest.mark.parametrize("answer, kept", [
    ('{"template": "{first_name}"}\n\nRendered: {"template": "Ann"}', "{first_name}"),
    ('The placeholder is:\n{"template": "<unk>"}\nWhen rendered it becomes '
     '{"template": "Alice"}', "<unk>"),
    ('{"template": "{{customer}}"}\nPreview: {"template": "Bob"}', "{{customer}}"),
])
def test_a_placeholder_naming_another_thing_is_a_value(answer: str, kept: str) -> None:
    assert value(answer, TEMPLATE)["template"] == kept


@pytest.mark.parametrize("label, enum", [
    ("**'no'**", ["yes", "no", "'no'"]), ("**A**", ["A", "*A*", "B"]),
    ("`__init__`", ["__init__", "init"]),
])
def test_members_with_marks_of_their_own_are_not_unwrapped(label: str,
                                                            enum: list[str]) -> None:
    rule = {"schema": {"type": "object", "required": ["label"],
                       "properties": {"label": {"enum": enum}}}}
    parsed = parse(json.dumps({"label": label}), rule)
    assert not parsed.usable or parsed.value["label"] == label.strip("*`")


# --- D9: a number cut in its exponent -------------------------------------------------

@pytest.mark.parametrize("number", ["0.9e", "0.9E", "0.9e-", "1e+"])
def test_number_without_exponent_digits_is_refused(number: str) -> None:
    parsed = parse(f'{{"label": "positive", "score": {number}}}', MULTI)
    assert not parsed.usable
    assert value('{"label": "positive", "score": 9e-1,}', MULTI)["score"] == 0.9


# --- D10: enum members wrapped in Markdown or quotes ----------------------------------

@pytest.mark.parametrize("label", [
    "**positive**", "`positive`", '\\"positive\\"', "'positive'", "*positive*",
    "__positive__", "**'positive'**",
])
def test_wrapped_member_is_the_member(label: str) -> None:
    assert value(f'{{"label": "{label}"}}', LABEL) == {"label": "positive"}


@pytest.mark.parametrize("label", ["*positive* or *negative*", "**maybe**", "`pos`"])
def test_wrapped_non_member_is_refused(label: str) -> None:
    assert value('{"label": "**negative**"}', LABEL) == {"label": "negative"}
    assert not parse(f'{{"label": "{label}"}}', LABEL).usable


@pytest.mark.parametrize("answer", ["", " \n\t"])
def test_an_empty_answer_says_it_is_empty(answer: str) -> None:
    parsed = parse(answer, LABEL)
    assert not parsed.usable
    assert parsed.error == "no JSON object or array in the output (it is empty)"
    assert parse("I cannot help.", LABEL).error == "no JSON object or array in the output"
