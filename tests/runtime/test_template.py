"""Template rules: placeholders, checks at submit time, the three-section form."""

from __future__ import annotations

import json

import pytest

from lockgate.errors import TemplateError
from lockgate.runtime import INPUT_CLOSE, INPUT_OPEN, build_template, check_template, placeholders
from lockgate.runtime.template import compile_template, escape_braces
from lockgate.spec import Message


def test_placeholders_and_literal_braces() -> None:
    tpl = 'Reply as {{"label": "..."}}. Text: {text} ({lang}) {文本}'
    assert placeholders(tpl) == {"text", "lang", "文本"}
    compiled = compile_template(tpl)
    assert compiled.texts[0].literal == 'Reply as {"label": "..."}. Text:  () '


def test_placeholders_across_messages() -> None:
    tpl = (Message(role="system", content="You label {domain} texts."),
           Message(role="user", content="{text}"))
    assert placeholders(tpl) == {"domain", "text"}
    assert compile_template(tpl).roles == ("system", "user")


@pytest.mark.parametrize("template, fragment", [
    ("Hello {}", "'{}' is not a plain"),
    ("Hello {0}", "'{0}' is not a plain"),
    ("Hello {user.name}", "'{user.name}' is not a plain"),
    ("Hello {items[0]}", "'{items[0]}' is not a plain"),
    ("Hello {name!r}", "'{name!r}' is not a plain"),
    ("Hello {name:>10}", "'{name:>10}' is not a plain"),
    ('Reply {"label": 1}', "is not a plain"),
    ("Hello {name", "expected '}'"),
    ("Hello name}", "Single '}'"),
])
def test_bad_placeholder_syntax_is_refused(template: str, fragment: str) -> None:
    with pytest.raises(TemplateError) as err:
        placeholders(template)
    assert fragment in str(err.value)
    assert err.value.field == "prompt_template"
    assert "{{" in str(err.value)  # says how to write literal braces


def test_check_template_unknown_placeholder_names_the_fix() -> None:
    with pytest.raises(TemplateError) as err:
        check_template("Summarise {txet}", {"text"})
    msg = str(err.value)
    assert "['txet']" in msg and "did you mean 'text'" in msg
    assert err.value.field == "input_data"


def test_check_template_unused_input_key() -> None:
    with pytest.raises(TemplateError) as err:
        check_template("Summarise {text}", {"text", "language"})
    assert "['language']" in str(err.value)
    assert "not used" in str(err.value)


def test_check_template_accepts_defaults_and_exact_keys() -> None:
    assert check_template("{a} {b}", {"a"}, {"b": "x"}) == {"a", "b"}
    assert check_template("{a}", {"a"}) == {"a"}
    assert check_template("{a}", None) == {"a"}


def test_json_string_context_is_detected() -> None:
    tpl = 'Example: {{"text": "{text}", "n": {n}}}\nPlain: {text}\nSay "hi {name}" now'
    t = compile_template(tpl).texts[0]
    assert list(zip(t.names, t.in_json_string, strict=True)) == [
        ("text", True), ("n", False), ("text", False), ("name", True)]


def test_build_template_three_sections() -> None:
    msgs = build_template(
        system="You are a support triage assistant for {product}.",
        instruction="Classify the ticket.",
        output_schema={"category": "billing|technical", "priority": 1},
        input_fields=["subject", "body"],
    )
    assert [m.role for m in msgs] == ["system", "user"]
    user = msgs[1].content
    assert user.index("Classify") < user.index("schema") < user.index(INPUT_OPEN)
    assert user.rstrip().endswith(INPUT_CLOSE)
    assert "subject: {subject}\nbody: {body}" in user
    assert placeholders(msgs) == {"product", "subject", "body"}
    # The schema's braces were escaped: it renders back to valid JSON.
    literal = compile_template(msgs).texts[1].literal
    schema_text = literal[literal.index("{"):literal.rindex("}") + 1]
    assert json.loads(schema_text) == {"category": "billing|technical", "priority": 1}


def test_build_template_single_field_and_text_schema() -> None:
    msgs = build_template(system="S", instruction="I", output_schema="label: one word",
                          input_fields=["review"])
    assert msgs[1].content.endswith(f"{INPUT_OPEN}\n{{review}}\n{INPUT_CLOSE}")
    assert "label: one word" in msgs[1].content


@pytest.mark.parametrize("fields", [[], ["not a name"], ["1x"]])
def test_build_template_bad_fields(fields: list[str]) -> None:
    with pytest.raises(TemplateError):
        build_template(system="S", instruction="I", input_fields=fields)


def test_build_template_refuses_bad_instruction_braces() -> None:
    with pytest.raises(TemplateError):
        build_template(system="S", instruction='Return {"x": 1}', input_fields=["a"])


def test_escape_braces_roundtrip() -> None:
    text = '{"a": {"b": [1, 2]}}'
    assert compile_template(escape_braces(text)).texts[0].literal == text
