"""Output pass: values introduced as not the answer by the words right before them.

* D5: a value introduced as context (the previous customer, a comparison, a baseline,
  a default, a prior, the old value, a label qualified "given as context"), as an
  earlier step's output, or struck through (``~~{...}~~``, ``<del>``) is set aside for
  the value after it; one taken back ("Hmm, looking again", "After checking ...:") is
  replaced by the later one. Alone, each is read as before.
* D6: a value in a row of a Markdown table of examples (its header says Example,
  Expected or Sample, or the line before it says the rows are examples) is set aside
  for the value after the table; a table of other values is read as before.
"""

from __future__ import annotations

from typing import Any

import pytest

from lockgate.runtime import parse_output
from lockgate.spec import DeliveryRule

FLAT = {"schema": {"type": "object", "required": ["name", "city"], "properties": {
    "name": {"type": "string"}, "city": {"type": "string"}},
    "additionalProperties": False}}
MULTI = {"schema": {"type": "object", "required": ["label", "score"], "properties": {
    "label": {"enum": ["positive", "negative", "neutral"]},
    "score": {"type": "number", "minimum": 0, "maximum": 1}}}}
ANNA = {"name": "Anna", "city": "Berlin"}
BOB = '{"name": "Bob", "city": "Rome"}'
NEG = {"label": "negative", "score": 0.2}
OTHER = '{"label": "neutral", "score": 0.5}'


def value(answer: str, rule: dict[str, Any]) -> Any:
    parsed = parse_output(answer, DeliveryRule.model_validate(rule))
    assert parsed.usable, parsed.error
    return parsed.value


# --- D5: an earlier value introduced as not the answer -------------------------------

@pytest.mark.parametrize("answer", [
    f'The previous customer was {BOB}; this one is {{"name": "Anna", "city": "Berlin"}}',
    f'Compare with last week: {BOB}.\n\n{{"name": "Anna", "city": "Berlin"}}',
    'Step 1 output: {"name": "Anna", "city": "?"}\n'
    'Step 2 output: {"name": "Anna", "city": "Berlin"}',
    '{"name": "Anna", "city": "Unknown"}\n\nHmm, looking again, the city is Berlin.\n'
    '{"name": "Anna", "city": "Berlin"}',
    '{"name": "Anna", "city": "?"}\n\nAfter checking the signature: '
    '{"name": "Anna", "city": "Berlin"}',
    f'- Bob (not this one): {BOB}\n- Answer: {{"name": "Anna", "city": "Berlin"}}',
])
def test_context_before_the_answer_is_set_aside(answer: str) -> None:
    assert value(answer, FLAT) == ANNA


@pytest.mark.parametrize("first, second", [
    ("Baseline:", "Mine:"), ("Default:", "\nActual:"), ("Prior:", "Posterior:"),
    ("Old:", "New:"), ("Review 1 (given as context):", "Review 2 (the one you asked about):"),
])
def test_a_label_of_context_sets_its_value_aside(first: str, second: str) -> None:
    answer = f'{first} {OTHER}\n{second} {{"label": "negative", "score": 0.2}}'
    assert value(answer, MULTI) == NEG


@pytest.mark.parametrize("answer", [
    f'~~{OTHER}~~ {{"label": "negative", "score": 0.2}}',
    f'<del>{OTHER}</del>\n{{"label": "negative", "score": 0.2}}',
    f'<strike>{OTHER}</strike> {{"label": "negative", "score": 0.2}}',
])
def test_a_value_struck_through_is_set_aside(answer: str) -> None:
    assert value(answer, MULTI) == NEG


@pytest.mark.parametrize("answer, alone", [
    (f'Default: {OTHER}\n\nActual: {{"label": "negative", "score": 0.2}}',
     'Default: {"label": "negative", "score": 0.2}'),
    (f'Old: {OTHER}\nNew: {{"label": "negative", "score": 0.2}}',
     'Old: {"label": "negative", "score": 0.2}\nNew: (unchanged)'),
    (f'Step 1 output: {OTHER}\nStep 2 output: {{"label": "negative", "score": 0.2}}',
     'Step 2 output: {"label": "negative", "score": 0.2}'),
    (f'~~{OTHER}~~ {{"label": "negative", "score": 0.2}}',
     '~~{"label": "negative", "score": 0.2}~~'),
    (f'~~{OTHER}~~ {{"label": "negative", "score": 0.2}}',
     '{"label": "negative", "score": 0.2, "summary": "~~old~~ new"} ~~ok~~'),
    (f'The previous customer was {OTHER}; this one is {{"label": "negative", "score": 0.2}}',
     'The previous customer was {"label": "negative", "score": 0.2}'),
])
def test_alone_such_a_value_is_still_read(answer: str, alone: str) -> None:
    assert value(answer, MULTI) == NEG
    assert {k: v for k, v in value(alone, MULTI).items() if k != "summary"} == NEG


@pytest.mark.parametrize("answer, kept", [
    (f'Old: {OTHER}\nNew: {{"label": "negative", "score": 0.2}}',
     f'{{"label": "negative", "score": 0.2}}\nOld label: {OTHER}'),
    (f'Step 1 output: {OTHER}\nStep 2 output: {{"label": "negative", "score": 0.2}}',
     f'Step 1 output: {{"label": "negative", "score": 0.2}}\nNotes: {OTHER}'),
    (f'Default: {OTHER}\n\nActual: {{"label": "negative", "score": 0.2}}',
     f'{{"label": "negative", "score": 0.2}}\n\nDefault: {OTHER}'),
    (f'Baseline: {OTHER}\nMine: {{"label": "negative", "score": 0.2}}',
     f'Old label: {{"label": "negative", "score": 0.2}}\nBaseline: {OTHER}'),
])
def test_the_answer_before_such_a_value_stays(answer: str, kept: str) -> None:
    assert value(answer, MULTI) == NEG
    assert value(kept, MULTI) == NEG


# --- D6: a Markdown table of examples -------------------------------------------------

@pytest.mark.parametrize("answer", [
    f'| Example | JSON |\n|---|---|\n| 1 | {BOB} |\n\nResult: {{"name": "Anna", '
    '"city": "Berlin"}',
    f'Examples of the format:\n\n| input | output |\n|---|---|\n| "Hi, Bob from Rome" | {BOB} '
    '|\n\nFor your text: {"name": "Anna", "city": "Berlin"}',
    f'| text | expected |\n|:---|:---:|\n| "Bob" | {BOB} |\n| "Eve" | {BOB} |\n\n'
    '{"name": "Anna", "city": "Berlin"}',
])
def test_values_in_a_table_of_examples_are_set_aside(answer: str) -> None:
    assert value(answer, FLAT) == ANNA


@pytest.mark.parametrize("answer", [
    '| Field | JSON |\n|---|---|\n| person | {"name": "Anna", "city": "Berlin"} |\n\n'
    f'For comparison: {BOB}',
    '| Expected output |\n|---|\n| {"name": "Anna", "city": "Berlin"} |',
    '| input | output |\n|---|---|\n| "Anna from Berlin" | {"name": "Anna", "city": '
    '"Berlin"} |',
])
def test_a_table_of_other_values_is_read(answer: str) -> None:
    examples = (f'| Example | JSON |\n|---|---|\n| 1 | {BOB} |\n\n'
                'Result: {"name": "Anna", "city": "Berlin"}')
    assert value(examples, FLAT) == ANNA
    assert value(answer, FLAT) == ANNA
