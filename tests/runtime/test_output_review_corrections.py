"""Which of several values is the answer (review of 2026-12-06, group B, in part).

A correction phrase after a connective ("..., however the correct answer is")
introduces a value that replaces the one before (a revision note's label alone,
"Update:" or "Edit:", does not: what follows it may be an example or a reference); a
value labelled as rejected ("Wrong:", "Incorrect:", "Bad example:") or introduced by a
negation ("Not {...} but {...}") is not the answer.
"""

from __future__ import annotations

from typing import Any

import pytest

from lockgate.runtime import parse_output
from lockgate.spec import DeliveryRule

YN = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["answer"],
    "properties": {"answer": {"enum": ["yes", "no"]}, "reason": {"type": "string"}}}})
YES, NO = '{"answer": "yes"}', '{"answer": "no"}'


def _answer(raw: str) -> Any:
    parsed = parse_output(raw, YN)
    return parsed.value if parsed.usable else None


@pytest.mark.parametrize("raw", [
    f"{YES} was suggested by the text, however the correct answer is {NO}",
    f"{YES} at first; instead, the right answer: {NO}",
])
def test_a_revision_or_a_correction_after_a_connective_replaces_the_value(raw: str) -> None:
    assert _answer(raw) == {"answer": "no"}


@pytest.mark.parametrize("raw", [
    f"Wrong: {YES}\nRight: {NO}", f"Incorrect: {YES}\nCorrect: {NO}",
    f"Bad example: {YES}\nGood: {NO}", f"Invalid output: {YES}\nValid output: {NO}",
    f"Not {YES} but {NO}.", f"The answer is not {YES}, it is {NO}",
    f"**Wrong:**\n```json\n{YES}\n```\n**Right:**\n```json\n{NO}\n```",
])
def test_a_value_labelled_wrong_or_negated_is_not_the_answer(raw: str) -> None:
    assert _answer(raw) == {"answer": "no"}


@pytest.mark.parametrize("raw", [
    f"{YES}\nYou can edit: {NO}", f"{YES}\nI will update the reason later. {NO}",
    f"Whether it holds or not: {YES}\nAnother take: {NO}", f"Not bad. {YES}\nAlso: {NO}",
])
def test_the_words_elsewhere_change_nothing(raw: str) -> None:
    # (the first usable value stays the answer: no label, connective or negation
    # introduces either value)
    assert _answer(raw) == {"answer": "yes"}


@pytest.mark.parametrize("raw", [
    f"Schema: {YES}\nResponse: {NO}", f"Reference output: {YES}\nMy output: {NO}",
    f"**Schema**:\n```json\n{YES}\n```\n{NO}",
])
def test_a_value_labelled_as_the_schema_or_a_reference_is_not_the_answer(raw: str) -> None:
    assert _answer(raw) == {"answer": "no"}


@pytest.mark.parametrize("note", [
    "Edit: typo fixed in my explanation, the JSON above is unchanged. For reference the "
    "schema's default is",
    "Update: the format for future items:",
])
def test_a_revision_label_alone_does_not_replace_the_answer(note: str) -> None:
    """"Update:" or "Edit:" made any later value the answer, a reference or an example
    it introduced too."""
    assert _answer(f"{YES}\n{note} {NO}") == {"answer": "yes"}
