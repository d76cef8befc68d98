"""Defects in how values are judged, found by a third review of the output runtime:

F. a required field whose schema admits null (OpenAI strict-mode schemas: ``["string",
   "null"]``, a ``null`` enum member, ``anyOf`` with ``{"type": "null"}``, OpenAPI's
   ``nullable: true``) holding ``null`` is given, not missing; where the schema does
   not admit null it is still missing;
G. an enum member written with spaces, hyphens or underscores between its words
   (``"Request Changes"`` for ``request_changes``) is that member, when exactly one
   member reads so;
H. a yes/no answer ending a sentence (``"Yes."``, ``"no!"``) is a boolean;
I. a key is never renamed by a close misspelling to a field its value cannot be
   (``"data": {...}`` is not ``date``, a string field).

Each test failed on the code before the fix.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lockgate.errors import SpecError
from lockgate.runtime import ParseStatus, parse_output
from lockgate.runtime.schema import check_result
from lockgate.spec import DeliveryRule

SETTINGS = settings(max_examples=120, deadline=None)


def _rule(schema: dict[str, Any], **extra: Any) -> DeliveryRule:
    return DeliveryRule.model_validate({"schema": schema, **extra})


# F. required fields that admit null ---------------------------------------------------

STRICT_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False,
    "required": ["title", "due_date", "assignee", "priority"],
    "properties": {"title": {"type": "string"},
                   "due_date": {"type": ["string", "null"]},
                   "assignee": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                   "priority": {"enum": ["low", "medium", "high", None]}}}
STRICT = _rule(STRICT_SCHEMA)
TASK = {"title": "Fix login bug", "due_date": None, "assignee": None, "priority": "high"}

PERSON = _rule({
    "type": "object", "required": ["name", "age", "email"],
    "properties": {"name": {"type": "string"}, "age": {"type": ["integer", "null"]},
                   "email": {"type": ["string", "null"]}}})


@pytest.mark.parametrize(("raw", "value"), [
    (json.dumps(TASK), TASK),
    (json.dumps({**TASK, "due_date": "2024-06-01"}), {**TASK, "due_date": "2024-06-01"}),
    (json.dumps({**TASK, "assignee": "bob", "priority": None}),
     {**TASK, "assignee": "bob", "priority": None}),
    (json.dumps({**TASK, "title": "Write docs", "due_date": None, "assignee": None,
                 "priority": None}),
     {"title": "Write docs", "due_date": None, "assignee": None, "priority": None}),
    ("```json\n" + json.dumps(TASK, indent=2) + "\n```", TASK),
    ("Here is the task:\n" + json.dumps(TASK), TASK),
])
def test_strict_mode_nulls_in_required_fields_are_delivered(raw: str, value: Any) -> None:
    p = parse_output(raw, STRICT)
    assert p.usable and p.value == value, p
    assert p.error is None and p.conforms
    assert p.completeness == 1.0 and p.missing == ()


def test_strict_mode_null_beside_an_unknown_key_is_delivered_complete() -> None:
    # the slow path (an unknown key dropped) judges as the fast path does
    p = parse_output(json.dumps({**TASK, "notes": "x"}), STRICT)
    assert p.usable and p.value == TASK, p
    assert p.status is ParseStatus.REPAIRED and "dropped:notes" in p.fixes
    assert p.completeness == 1.0 and p.missing == ()


@pytest.mark.parametrize(("raw", "value"), [
    ('{"name": "Li Wei", "age": null, "email": null}',
     {"name": "Li Wei", "age": None, "email": None}),
    ('{"name": "Li Wei", "age": "null", "email": "li@x.cn"}',
     {"name": "Li Wei", "age": None, "email": "li@x.cn"}),
    ('{"name": "Li Wei", "age": "N/A", "email": "li@x.cn"}',
     {"name": "Li Wei", "age": None, "email": "li@x.cn"}),
    ("{'name': 'Li Wei', 'age': None, 'email': None}",
     {"name": "Li Wei", "age": None, "email": None}),
])
def test_nulls_and_null_words_in_nullable_required_fields(raw: str, value: Any) -> None:
    p = parse_output(raw, PERSON)
    assert p.usable and p.value == value, p
    assert p.completeness == 1.0 and p.missing == ()


@pytest.mark.parametrize("field", [
    {"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]},
    {"oneOf": [{"type": "string"}, {"type": "null"}]},
    {"anyOf": [{"$ref": "#/$defs/When"}, {"type": "null"}]},
    {"type": "string", "nullable": True},
    {"type": "string", "enum": ["a", "b"], "nullable": True},
    {"const": None},
])
def test_every_way_of_admitting_null_admits_it_when_required(field: dict[str, Any]) -> None:
    rule = _rule({"type": "object", "required": ["name", "when"],
                  "$defs": {"When": {"type": "string"}},
                  "properties": {"name": {"type": "string"}, "when": field}})
    p = parse_output('{"name": "x", "when": null}', rule)
    assert p.usable and p.value == {"name": "x", "when": None}, p
    assert p.completeness == 1.0


def test_nullable_true_keeps_its_type_for_other_values() -> None:
    rule = _rule({"type": "object", "required": ["n"],
                  "properties": {"n": {"type": "integer", "nullable": True},
                                 "nullable": {"type": "string"}}})
    assert parse_output('{"n": "7"}', rule).value == {"n": 7}
    assert not parse_output('{"n": "seven"}', rule).usable
    # a property named "nullable" is a field, not the keyword
    assert parse_output('{"n": null, "nullable": "yes"}', rule).value == {
        "n": None, "nullable": "yes"}


@pytest.mark.parametrize(("rule", "raw", "missing"), [
    (PERSON, '{"name": null, "age": 3, "email": "a@b.c"}', "name"),
    (_rule({"type": "object", "required": ["label", "score"],
            "properties": {"label": {"enum": ["pos", "neg"]}, "score": {"type": "number"}}}),
     '{"label": null, "score": 0.5}', "label"),
    (_rule({"type": "object", "required": ["label", "score"],
            "properties": {"label": {}, "score": {"type": "number"}}}),
     '{"label": null, "score": 0.5}', "label"),
    (DeliveryRule.model_validate({"required_keys": ["answer", "why"]}),
     '{"answer": null, "why": "because"}', "answer"),
])
def test_a_null_where_the_schema_does_not_name_null_is_still_missing(
        rule: DeliveryRule, raw: str, missing: str) -> None:
    p = parse_output(raw, rule)
    assert p.status is ParseStatus.SCHEMA_VIOLATION, p
    assert "missing required field" in (p.error or "") and missing in (p.error or "")
    assert missing in p.missing


def test_blank_string_in_a_nullable_required_field_is_still_missing() -> None:
    p = parse_output('{"name": "Li", "age": 3, "email": "  "}', PERSON)
    assert p.status is ParseStatus.SCHEMA_VIOLATION and "email" in p.missing, p


def test_a_fallback_never_replaces_a_null_the_schema_admits() -> None:
    rule = _rule(PERSON.json_schema or {}, fallback_values={"email": "none@x", "age": 0})
    p = parse_output('{"name": "Li", "age": null, "email": null}', rule)
    assert p.status is ParseStatus.VALID and p.value == {
        "name": "Li", "age": None, "email": None}, p
    # absent fields still take theirs
    q = parse_output('{"name": "Li"}', rule)
    assert q.status is ParseStatus.FILLED_FALLBACK
    assert q.value == {"name": "Li", "age": 0, "email": "none@x"}
    assert q.completeness == pytest.approx(1 / 3)


def test_a_fallback_still_replaces_a_null_the_schema_refuses() -> None:
    rule = _rule({"type": "object", "required": ["name", "age"],
                  "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}},
                 fallback_values={"age": 0})
    p = parse_output('{"name": "Li", "age": null}', rule)
    assert p.status is ParseStatus.FILLED_FALLBACK and p.value == {"name": "Li", "age": 0}
    assert p.missing == ("age",)


def test_a_resolved_result_is_judged_as_a_worker_judges_an_answer() -> None:
    check_result(STRICT, TASK)
    with pytest.raises(SpecError, match="empty"):
        check_result(STRICT, {**TASK, "title": None})


_SCALAR = st.one_of(st.none(), st.text(max_size=12).filter(lambda s: s.strip() != ""))


@SETTINGS
@given(title=st.text(min_size=1, max_size=20).filter(str.strip),
       due=_SCALAR, assignee=_SCALAR,
       priority=st.sampled_from(["low", "medium", "high", None]))
def test_any_value_valid_under_a_strict_mode_schema_is_delivered_equal(
        title: str, due: str | None, assignee: str | None, priority: str | None) -> None:
    value = {"title": title, "due_date": due, "assignee": assignee, "priority": priority}
    p = parse_output(json.dumps(value, ensure_ascii=False), STRICT)
    assert p.status is ParseStatus.VALID and p.value == value, p
    assert p.completeness == 1.0 and p.missing == ()
    q = parse_output(json.dumps({**value, "extra": 1}, ensure_ascii=False), STRICT)
    assert q.usable and q.value == value and q.completeness == 1.0, q


# G. enum members written with spaces ------------------------------------------------

REVIEW = _rule({"type": "object", "required": ["verdict"],
                "properties": {"verdict": {"enum": ["approve", "request_changes", "comment",
                                                    "needs-info"]}}})


@pytest.mark.parametrize(("written", "member"), [
    ("Request Changes", "request_changes"),
    ("request changes", "request_changes"),
    ("Request-Changes", "request_changes"),
    ("request  changes", "request_changes"),
    ("Request changes.", "request_changes"),
    ("REQUEST CHANGES", "request_changes"),
    ("needs info", "needs-info"),
    ("Needs_Info", "needs-info"),
])
def test_enum_member_written_with_other_separators(written: str, member: str) -> None:
    p = parse_output(json.dumps({"verdict": written}), REVIEW)
    assert p.usable and p.value == {"verdict": member}, p
    assert "enum:verdict" in p.fixes


@pytest.mark.parametrize(("enum", "written"), [
    (["in progress", "in_progress", "done"], "In-Progress"),   # two members read so
    (["a-b", "a_b"], "a b"),
    (["+1", "-1", "0"], "1"),                                  # signs are not separators
    (["+1", "-1", "0"], "_1"),
    (["A", "A-", "B"], "A_"),
    (["request_changes", "approve"], "requestchanges"),          # words stay apart
    (["request_changes", "approve"], "request changes please"),
    (["request_changes", "approve"], "request, changes"),
])
def test_enum_separator_folding_never_picks_a_wrong_member(enum: list[str],
                                                           written: str) -> None:
    rule = _rule({"type": "object", "required": ["v"], "properties": {"v": {"enum": enum}}})
    p = parse_output(json.dumps({"v": written}), rule)
    assert not p.usable, p


_WORD = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=6)


@SETTINGS
@given(members=st.lists(st.lists(_WORD, min_size=1, max_size=3), min_size=1, max_size=5,
                        unique_by=tuple),
       pick=st.integers(min_value=0), data=st.data())
def test_a_member_with_any_separators_and_case_is_that_member(
        members: list[list[str]], pick: int, data: st.DataObject) -> None:
    enum = ["_".join(words) for words in members]
    words = members[pick % len(members)]
    seps = data.draw(st.lists(st.sampled_from([" ", "_", "-", "  "]),
                              min_size=len(words) - 1, max_size=len(words) - 1))
    written = words[0] + "".join(s + w for s, w in zip(seps, words[1:], strict=True))
    if data.draw(st.booleans()):
        written = written.title()
    rule = _rule({"type": "object", "required": ["v"], "properties": {"v": {"enum": enum}}})
    p = parse_output(json.dumps({"v": written}), rule)
    assert p.usable and p.value == {"v": "_".join(words)}, (enum, written, p)


# H. booleans ending a sentence --------------------------------------------------------

YESNO = _rule({"type": "object", "required": ["answer"],
               "properties": {"answer": {"type": "boolean"},
                              "explanation": {"type": "string"}}})


@pytest.mark.parametrize(("written", "value"), [
    ("Yes.", True), ("No.", False), ("yes!", True), ("NO!", False), ("Yes。", True),
    ("否。", False), ("True.", True), ("no .", False),
])
def test_yes_no_ending_a_sentence_is_a_boolean(written: str, value: bool) -> None:
    p = parse_output(json.dumps({"answer": written}, ensure_ascii=False), YESNO)
    assert p.usable and p.value == {"answer": value}, p
    assert p.status is ParseStatus.COERCED


@pytest.mark.parametrize("written", ["not sure.", "maybe.", "yes?", "Yes, mostly.", ".", "!"])
def test_other_sentences_are_no_boolean(written: str) -> None:
    p = parse_output(json.dumps({"answer": written}), YESNO)
    assert not p.usable, p


# I. fuzzy renames respect the value's type -----------------------------------------

INVOICE_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["vendor", "total", "currency"],
    "properties": {"vendor": {"type": "string"}, "total": {"type": "number"},
                   "currency": {"enum": ["USD", "EUR", "GBP"]},
                   "date": {"type": ["string", "null"]},
                   "address": {"type": "object", "properties": {"city": {"type": "string"}}}}}
INVOICE = _rule(INVOICE_SCHEMA)
BASE = {"vendor": "Globex GmbH", "total": 99.5, "currency": "GBP"}


@pytest.mark.parametrize("extra", [
    {"data": {"source": "pdf"}},
    {"data": ["pdf", "email"]},
    {"dates": {"issued": "2024-01-01"}},
    {"adress": "Beijing"},
    {"adress": ["Beijing"]},
])
def test_no_fuzzy_rename_to_a_field_the_value_cannot_be(extra: dict[str, Any]) -> None:
    p = parse_output(json.dumps({**BASE, **extra}), INVOICE)
    assert p.usable and p.value == {**BASE, **extra}, p
    assert not any(f.startswith("renamed:") for f in p.fixes)


def test_unrenamed_key_is_dropped_where_additional_properties_are_refused() -> None:
    rule = _rule({**INVOICE_SCHEMA, "additionalProperties": False})
    p = parse_output(json.dumps({**BASE, "data": {"source": "pdf"}}), rule)
    assert p.usable and p.value == BASE and "dropped:data" in p.fixes, p


@pytest.mark.parametrize(("extra", "renamed", "fix"), [
    ({"dat": "2024-01-01"}, {"date": "2024-01-01"}, "renamed:fuzzy:dat->date"),
    ({"data": None}, {"date": None}, "renamed:fuzzy:data->date"),
    ({"adress": {"city": "Beijing"}}, {"address": {"city": "Beijing"}},
     "renamed:fuzzy:adress->address"),
    ({"adress": '{"city": "Beijing"}'}, {"address": {"city": "Beijing"}},
     "renamed:fuzzy:adress->address"),
    ({"Date": {"x": 1}}, None, "renamed:case:Date->date"),  # a fold match is no guess
])
def test_fuzzy_renames_that_fit_the_type_still_happen(extra: dict[str, Any],
                                                     renamed: Any, fix: str) -> None:
    p = parse_output(json.dumps({**BASE, **extra}), INVOICE)
    assert fix in p.fixes, p
    if renamed is not None:
        assert p.usable and p.value == {**BASE, **renamed}, p


def test_fuzzy_rename_of_a_numeric_string_to_a_number_field() -> None:
    p = parse_output('{"vendor": "G", "totl": "99.5", "currency": "GBP"}', INVOICE)
    assert p.usable and p.value == {**BASE, "vendor": "G"}, p
    assert "renamed:fuzzy:totl->total" in p.fixes


# F (enum). a null word where null is an enum member ---------------------------------

@pytest.mark.parametrize("written", ["null", "N/A", "None", ""])
def test_a_null_word_is_the_null_member_of_an_enum(written: str) -> None:
    p = parse_output(json.dumps({**TASK, "priority": written}), STRICT)
    assert p.usable and p.value == {**TASK, "priority": None}, p
    assert p.completeness == 1.0


@pytest.mark.parametrize(("enum", "written"), [
    (["pos", "neg"], "N/A"),            # no null member
    (["pos", "neg", None], "."),        # a stop alone says nothing
    (["pos", "neg", None], "none yet"),
])
def test_no_null_member_from_other_words(enum: list[Any], written: str) -> None:
    rule = _rule({"type": "object", "required": ["v", "w"],
                  "properties": {"v": {"enum": enum}, "w": {"type": "string"}}})
    p = parse_output(json.dumps({"v": written, "w": "x"}), rule)
    assert not p.usable, p


def test_a_member_spelt_like_a_null_word_stays_that_member() -> None:
    rule = _rule({"type": "object", "required": ["v"],
                  "properties": {"v": {"enum": ["none", "some", None]}}})
    assert parse_output('{"v": "None"}', rule).value == {"v": "none"}
    assert parse_output('{"v": "N/A"}', rule).value == {"v": None}


def test_an_object_of_admitted_nulls_only_is_still_no_answer() -> None:
    rule = _rule({"type": "object", "required": ["name", "email"],
                  "properties": {"name": {"type": ["string", "null"]},
                                 "email": {"type": ["string", "null"]}}})
    p = parse_output('{"name": null, "email": null}', rule)
    assert p.status is ParseStatus.SCHEMA_VIOLATION and "no declared field" in (p.error or "")
    # an echoed template of nulls does not hide the answer after it
    q = parse_output('{"name": null, "email": null}\n\n{"name": "Li", "email": null}', rule)
    assert q.usable and q.value == {"name": "Li", "email": None}, q
