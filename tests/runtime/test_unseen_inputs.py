"""Inputs of shapes the render tests did not hold, each of which once gave a wrong
prompt: a value blank only once normalised got no default, a budget the template met
was broken when the condensation note did not fit too, the note was appended to an
assistant prefill, a flag made of tag characters lost them in ``emoji = "keep"``, and an
escaped backslash before a quote put a placeholder outside its JSON string."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lockgate.runtime import render
from lockgate.runtime.normalize import normalize_text
from lockgate.runtime.tokens import default_estimator
from lockgate.runtime.truncate import condense
from lockgate.spec import InputRule

from .conftest import make_config, texts

LONG = " ".join(texts()["en"][:6])


@pytest.mark.parametrize("value", ["\u200b", "\ufeff", "\u00ad", "\x00 \u200b", "\u2060", "\x00"])
def test_a_value_blank_once_normalised_takes_its_default(value: str) -> None:
    config = make_config("T: {x}", rule={"input_defaults": {"x": "DEFAULT"}})
    out = render(config, {"x": value})
    assert out.messages[0]["content"] == "T: DEFAULT"
    assert "input_default:x" in out.alerts


def test_a_value_blank_once_its_emoji_are_removed_takes_its_default() -> None:
    config = make_config("T: {x}", rule={"input_defaults": {"x": "none"},
                                         "normalize": {"emoji": "remove"}})
    assert render(config, {"x": "\U0001f44d"}).messages[0]["content"] == "T: none"


def test_a_blank_value_without_a_default_is_reported_empty() -> None:
    out = render(make_config("T: {x}"), {"x": "\u200b"})
    assert out.messages[0]["content"] == "T: " and "empty_input:x" in out.alerts


@pytest.mark.parametrize("budget", [20, 30, 40])
def test_the_budget_holds_when_the_note_does_not_fit(budget: int) -> None:
    config = make_config("Summarise: {x}", model={"max_input_tokens": budget})
    out = render(config, {"x": LONG})
    exact = default_estimator()
    sent = sum(exact.count(m["content"]) for m in out.messages)
    assert sent <= budget, (sent, out.messages)
    assert "over_budget" not in out.alerts
    assert any(n.startswith("condensed:x") for n in out.notes)


def test_a_template_over_the_budget_alone_is_still_flagged() -> None:
    config = make_config(" ".join(["Summarise this long instruction text please."] * 4) + " {x}",
                         model={"max_input_tokens": 16})
    assert "over_budget" in render(config, {"x": LONG}).alerts


def test_the_note_goes_to_the_last_user_message_never_to_a_prefill() -> None:
    prefill = '{{"label": "'
    config = make_config([{"role": "system", "content": "Label reviews."},
                          {"role": "user", "content": "Review: {x}"},
                          {"role": "assistant", "content": prefill}],
                         model={"max_input_tokens": 150})
    out = render(config, {"x": LONG})
    assert out.messages[-1] == {"role": "assistant", "content": '{"label": "'}
    assert "[Note:" in out.messages[1]["content"]


@pytest.mark.parametrize("flag", [
    "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f",  # Scotland
    "\U0001f3f4\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f",  # England
])
def test_kept_tag_sequence_flags_stay_whole(flag: str) -> None:
    assert normalize_text(f"a {flag} b", InputRule(emoji="keep")) == f"a {flag} b"
    assert normalize_text(f"a{flag}", InputRule(emoji="remove")) == "a"


def _braces(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def test_an_escaped_backslash_before_a_quote_ends_its_string() -> None:
    config = make_config('{{"path": "C:\\\\", "v": "{x}"}}')
    doc = json.loads(render(config, {"x": 'a"b'}).messages[0]["content"])
    assert doc == {"path": "C:\\", "v": 'a"b'}


@settings(max_examples=200, deadline=None)
@given(other=st.text(st.sampled_from('ab\\":, '), max_size=8),
       before=st.text(st.sampled_from('ab\\":, '), max_size=8),
       value=st.text(st.characters(exclude_categories=("Cs",)), max_size=12))
def test_property_a_value_inside_a_json_string_keeps_the_document_json(
        other: str, before: str, value: str) -> None:
    """Whatever escaped quotes and backslashes come before it (in an earlier JSON
    string, or in its own), a placeholder inside a JSON string renders to valid JSON
    holding the value."""
    template = ('{{"p": "' + _braces(json.dumps(other)[1:-1]) + '", "k": "'
                + _braces(json.dumps(before)[1:-1]) + '{x}"}}')
    out = render(make_config(template, rule={"normalize": {"nfkc": False,
                                                       "strip_invisible": False,
                                                       "emoji": "keep"}}), {"x": value})
    doc = json.loads(out.messages[0]["content"])
    assert doc == {"p": other, "k": before + (value if value.strip() else "")}


_TOKENS = ["10:30,", "1,000,000", "https://a.io/get?id=42&v=2", "v1.2", "ok.", "fine!",
           "why?", "yes,", "the", "parcel", "arrived", "late;", "refund:", "cold", "and"]


@settings(max_examples=200, deadline=None)
@given(words=st.lists(st.sampled_from(_TOKENS), min_size=8, max_size=60),
       budget=st.integers(min_value=4, max_value=40))
def test_property_condensing_keeps_its_pieces_as_written(words: list[str],
                                                          budget: int) -> None:
    """Times, thousands, URLs and versions are no sentence or clause ends: every word of
    a condensed text is a word of the input, as written (a hard cut aside)."""
    text = " ".join(words)
    result = condense(text, budget, default_estimator().count)
    if result.unit != "characters":
        assert set(result.text.split()) <= set(words), result
