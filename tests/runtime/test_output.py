"""The output ladder: each step, each status, completeness and conformance."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from lockgate.errors import ErrorClass, SpecError
from lockgate.runtime import ParseStatus, check_delivery_rule, parse_output
from lockgate.spec import DeliveryRule

SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"enum": ["positive", "negative", "neutral"]},
        "score": {"type": "number"},
        "count": {"type": "integer"},
        "flag": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "meta": {"type": "object", "properties": {"source": {"type": "string"}},
                 "additionalProperties": False},
    },
    "required": ["label", "score"],
}
RULE = DeliveryRule.model_validate({"schema": SCHEMA, "fallback_values": {"tags": []},
                                    "aliases": {"label": ["sentiment", "情感"]}})
GOOD = {"label": "positive", "score": 0.9, "tags": ["a"]}


class Verdict(BaseModel):
    """A pydantic delivery model (imported by path in the rule)."""

    verdict: str
    severity: int
    note: str | None = None


def _parse(raw: str, rule: DeliveryRule = RULE) -> Any:
    return parse_output(raw, rule)


def test_valid_fast_path() -> None:
    p = _parse(json.dumps(GOOD))
    assert p.status is ParseStatus.VALID and p.value == GOOD
    assert p.fixes == () and p.completeness == 1.0 and p.conforms and p.usable
    assert p.error_class is None


def test_text_format_passes_through() -> None:
    p = parse_output("  any text  ", DeliveryRule(format="text"))
    assert p.status is ParseStatus.VALID and p.value == "  any text  "


@pytest.mark.parametrize("raw, value", [
    ('"hello"', "hello"),
    ('"[not json"', "[not json"),  # not repaired into an array: it stays the string
    ('"a {broken"', "a {broken"),
])
def test_a_json_string_stays_a_string_where_no_shape_is_expected(raw: str,
                                                                 value: str) -> None:
    p = parse_output(raw, DeliveryRule())
    assert (p.status, p.value) == (ParseStatus.VALID, value)


@pytest.mark.parametrize("raw, fix", [
    ('```json\n{"label": "positive", "score": 0.9, "tags": ["a"]}\n```', "extracted:fence"),
    ('Sure! {"label": "positive", "score": 0.9, "tags": ["a"]} Hope it helps', "extracted:chatter"),
    ("{'label': 'positive', 'score': 0.9, 'tags': ['a'],}", "repaired:python"),
    ("{'label': 'positive', 'score': 0.9, 'tags': ['a']}",
     "repaired:python"),
    ("{'label': 'positive', 'score': 0.9, 'tags': ['a']", "truncated"),
    ('{label: "positive", score: 0.9, tags: ["a"]}', "repaired:json"),
    ('[{"label": "positive", "score": 0.9, "tags": ["a"]}]', "unwrapped:array"),
    ('{"answer": {"label": "positive", "score": 0.9, "tags": ["a"]}}', "unwrapped:object"),
    (json.dumps(json.dumps(GOOD)), "decoded:string"),
    ('<think>maybe {"x": 1}</think>{"label": "positive", "score": 0.9, "tags": ["a"]}',
     "stripped:think"),
])
def test_repaired(raw: str, fix: str) -> None:
    p = _parse(raw)
    assert p.status is ParseStatus.REPAIRED, p
    assert p.value == GOOD
    assert fix in p.fixes


@pytest.mark.parametrize("raw, fix", [
    ('{"sentiment": "positive", "score": 0.9, "tags": ["a"]}', "renamed:alias:sentiment->label"),
    ('{"情感": "positive", "score": 0.9, "tags": ["a"]}', "renamed:alias:情感->label"),
    ('{"Label": "positive", "SCORE": 0.9, "tags": ["a"]}', "renamed:case:Label->label"),
    ('{"label": "positive", "scroe": 0.9, "tags": ["a"]}', "renamed:fuzzy:scroe->score"),
    ('{"label": "positive", "score": 0.9, "tag": ["a"]}', "renamed:fuzzy:tag->tags"),
])
def test_field_names(raw: str, fix: str) -> None:
    p = _parse(raw)
    assert p.status is ParseStatus.REPAIRED and p.value == GOOD
    assert fix in p.fixes


def test_rename_never_overwrites_a_present_key() -> None:
    p = _parse('{"label": "positive", "sentiment": "negative", "score": 0.9, "tags": []}')
    assert p.value["label"] == "positive" and p.value["sentiment"] == "negative"


def test_ambiguous_misspelling_is_not_renamed() -> None:
    rule = DeliveryRule.model_validate({"schema": {"type": "object", "properties": {
        "cart": {"type": "string"}, "card": {"type": "string"}}}})
    p = parse_output('{"carx": "1"}', rule)
    assert p.value == {"carx": "1"}


@pytest.mark.parametrize("raw, expected", [
    ('{"label": "positive", "score": "0.9"}', {"score": 0.9}),
    ('{"label": "POSITIVE", "score": 1}', {"label": "positive", "score": 1}),
    ('{"label": "positive", "score": 0.5, "count": "1,200"}', {"count": 1200}),
    ('{"label": "positive", "score": 0.5, "count": "3.0"}', {"count": 3}),
    ('{"label": "positive", "score": 0.5, "flag": "是"}', {"flag": True}),
    ('{"label": "positive", "score": 0.5, "flag": "No"}', {"flag": False}),
    # a comma may belong to the value: one element, as written (not split)
    ('{"label": "positive", "score": 0.5, "tags": "x, y"}', {"tags": ["x, y"]}),
    ('{"label": "positive", "score": 0.5, "tags": "x、y"}', {"tags": ["x", "y"]}),
    ('{"label": "positive", "score": 0.5, "tags": "x"}', {"tags": ["x"]}),
    ('{"label": "positive", "score": 0.5, "tags": "[\\"x\\"]"}', {"tags": ["x"]}),
    ('{"label": "positive", "score": 0.5, "meta": "{\\"source\\": \\"web\\"}"}',
     {"meta": {"source": "web"}}),
])
def test_type_coercion(raw: str, expected: dict[str, Any]) -> None:
    p = _parse(raw)
    assert p.status in (ParseStatus.COERCED, ParseStatus.FILLED_FALLBACK), p
    assert any(f.startswith(("coerced:", "enum:")) for f in p.fixes)
    for k, v in expected.items():
        assert p.value[k] == v
        assert type(p.value[k]) is type(v)


def test_lossy_coercion_is_refused() -> None:
    p = _parse('{"label": "positive", "score": 0.5, "count": "3.5"}')
    assert p.status is ParseStatus.SCHEMA_VIOLATION
    assert "count" in (p.error or "")
    assert p.error_class is ErrorClass.INVALID_OUTPUT


def test_nested_extra_field_dropped_when_closed() -> None:
    p = _parse('{"label": "positive", "score": 0.5, "tags": [], "meta": {"source": "a", "x": 1}}')
    assert p.value["meta"] == {"source": "a"}
    assert "dropped:meta.x" in p.fixes and p.status is ParseStatus.REPAIRED


def test_missing_field_filled_from_fallback() -> None:
    p = _parse('{"label": "neutral", "score": 0.5}')
    assert p.status is ParseStatus.FILLED_FALLBACK
    assert p.value["tags"] == [] and "fallback:tags" in p.fixes
    assert p.completeness == 1.0  # tags is not a required field


def test_missing_required_field_completeness_and_fallback() -> None:
    rule = DeliveryRule(required_keys=("title", "summary"), fallback_values={"summary": "n/a"})
    p = parse_output('{"title": "T"}', rule)
    assert p.status is ParseStatus.FILLED_FALLBACK
    assert p.value == {"title": "T", "summary": "n/a"}
    assert p.completeness == 0.5 and p.missing == ("summary",) and p.conforms
    bad = parse_output('{"summary": "S"}', rule)
    assert bad.status is ParseStatus.SCHEMA_VIOLATION and not bad.conforms
    assert bad.completeness == 0.5 and bad.missing == ("title",)
    assert "title" in (bad.error or "")


def test_invalid_field_replaced_by_its_fallback() -> None:
    rule = DeliveryRule.model_validate({"schema": SCHEMA, "fallback_values": {"score": 0}})
    p = parse_output('{"label": "positive", "score": "very high"}', rule)
    assert p.status is ParseStatus.FILLED_FALLBACK
    assert p.value["score"] == 0 and "fallback:score(invalid)" in p.fixes
    assert p.completeness == 0.5 and p.missing == ("score",)


def test_fallback_values_are_copied() -> None:
    a = _parse('{"label": "neutral", "score": 0.5}')
    a.value["tags"].append("mutated")
    b = _parse('{"label": "neutral", "score": 0.5}')
    assert b.value["tags"] == []


@pytest.mark.parametrize("raw, status", [
    ("I'm sorry, I can't help with that.", ParseStatus.NO_JSON_FOUND),
    ("", ParseStatus.NO_JSON_FOUND),
    ("The answer is positive [1].", ParseStatus.NO_JSON_FOUND),
    ("{{{ ]]] ::", ParseStatus.INVALID_JSON),
    ('{"lab', ParseStatus.INVALID_JSON),
    ("[", ParseStatus.INVALID_JSON),
    ('{"label": "mixed", "score": 0.5}', ParseStatus.SCHEMA_VIOLATION),
    ('{"score": 0.5}', ParseStatus.SCHEMA_VIOLATION),
    ('["positive", 0.5]', ParseStatus.SCHEMA_VIOLATION),
    ("42", ParseStatus.SCHEMA_VIOLATION),
])
def test_unusable_statuses(raw: str, status: ParseStatus) -> None:
    p = _parse(raw)
    assert p.status is status
    assert not p.usable and not p.conforms and p.error
    assert p.error_class is ErrorClass.INVALID_OUTPUT


def test_rule_without_schema_infers_types_from_fallbacks() -> None:
    rule = DeliveryRule(required_keys=("label",), fallback_values={"score": 0, "ok": False},
                        aliases={"label": ("category",)})
    p = parse_output('{"category": "x", "score": "0.25", "ok": "true"}', rule)
    assert p.value == {"label": "x", "score": 0.25, "ok": True}
    assert p.status is ParseStatus.COERCED


def test_array_expectation() -> None:
    rule = DeliveryRule.model_validate({"schema": {"type": "array", "items": {
        "type": "object", "properties": {"id": {"type": "integer"}}}}})
    assert parse_output('[{"id": 1}]', rule).status is ParseStatus.VALID
    p = parse_output('Here: [{"id": "2"}] done', rule)
    assert p.value == [{"id": 2}] and p.status is ParseStatus.COERCED
    assert parse_output('{"items": [{"id": 3}]}', rule).value == [{"id": 3}]


def test_pydantic_model_rule() -> None:
    rule = DeliveryRule(pydantic_model=f"{__name__}:Verdict",
                        aliases={"verdict": ("decision",)})
    p = parse_output('```json\n{"decision": "block", "severity": "3"}\n```', rule)
    assert p.usable and p.value == {"verdict": "block", "severity": 3, "note": None}
    assert p.status is ParseStatus.COERCED
    bad = parse_output('{"verdict": "block"}', rule)
    assert bad.status is ParseStatus.SCHEMA_VIOLATION and "severity" in (bad.error or "")


@pytest.mark.parametrize("doc, field", [
    ({"pydantic_model": "no_such_module_xyz:Model"}, "delivery_rule.pydantic_model"),
    ({"pydantic_model": "json:dumps"}, "delivery_rule.pydantic_model"),
    ({"pydantic_model": "nocolon"}, "delivery_rule.pydantic_model"),
    ({"schema": {"type": "no-such-type"}}, "delivery_rule.schema.type"),
    # the keyword at fault by its place in the schema (was: delivery_rule.schema)
    ({"schema": {"type": "object", "required": "label"}}, "delivery_rule.schema.required"),
    ({"schema": {"type": "object", "properties": {"label": {"type": "strin"}}}},
     "delivery_rule.schema.properties.label.type"),
])
def test_bad_rules_are_refused_with_the_field(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as err:  # the modules allowed: what fails is the import
        check_delivery_rule(DeliveryRule.model_validate(doc),
                            model_modules=("no_such_module_xyz", "json", "nocolon"))
    assert err.value.field == field
    assert "module the configuration allows" not in str(err.value)


def test_a_pydantic_model_outside_the_allowed_modules_is_refused_before_import() -> None:
    rule = DeliveryRule(pydantic_model="no_such_module_xyz:Model")
    with pytest.raises(SpecError) as err:
        check_delivery_rule(rule)
    assert "[runtime] model_modules" in str(err.value)
    check_delivery_rule(DeliveryRule(pydantic_model=f"{__name__}:Verdict"),
                        model_modules=(__name__.rsplit(".", 1)[0],))  # a package allows


def test_plan_cache_survives_rebuilt_rules() -> None:
    again = DeliveryRule.model_validate(RULE.model_dump(by_alias=True))
    assert parse_output('{"sentiment": "positive", "score": 0.9, "tags": ["a"]}', again).value \
        == GOOD


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**53), max_value=2**53)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
_chatter = st.text(st.characters(blacklist_characters="{}", blacklist_categories=("Cs",)),
                   max_size=80)


def _holds_no_value(chatter: str) -> bool:
    """Whether ``chatter`` alone gives no answer but one read from a list it leaves open
    (``[[]``): a list it closes (``[[]]``, ``[[1], [2]]``) is a value written before
    the object, which comes first under a rule with no schema."""
    alone = parse_output(chatter, DeliveryRule())
    return not alone.usable or "extracted:truncated" in alone.fixes


@settings(max_examples=300, deadline=None)
# (no value in the chatter before, and no "]" after: "[" + the object + "]" is a list
# that holds it)
@given(obj=st.dictionaries(st.text(max_size=10), _json_values, max_size=6),
       before=_chatter.filter(_holds_no_value),
       after=st.text(st.characters(blacklist_characters="{}]",
                                   blacklist_categories=("Cs",)), max_size=80),
       indent=st.booleans())
@example(obj={}, before="[[]", after="", indent=False)  # an open bracket before
@example(obj={"a": 1}, before="[[1], [", after="", indent=False)
@example(obj={}, before="[[]'", after="", indent=False)
@example(obj={}, before='"', after='"', indent=False)  # the whole output is a JSON string
@example(obj={}, before='"so: ', after=' ok"', indent=False)
def test_any_object_in_chatter_is_recovered_exactly(obj: dict[str, Any], before: str,
                                                    after: str, indent: bool) -> None:
    # (an escaped quote in the chatter before, '"\\"', can leave a JSON string open
    # around the object: then it is the string's text)
    assume('\\"' not in before)
    body = json.dumps(obj, ensure_ascii=False, indent=2 if indent else None)
    p = parse_output(f"{before}{body}{after}", DeliveryRule())
    assert p.usable
    assert p.value == obj


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_parse_never_raises(raw: str) -> None:
    p = _parse(raw)
    assert p.status in ParseStatus
    assert 0.0 <= p.completeness <= 1.0
