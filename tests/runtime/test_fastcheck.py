"""The compiled schema check agrees with jsonschema."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from lockgate.runtime.fastcheck import compile_check, json_equal

from .conftest import corpus_rules


class Item(BaseModel):
    """A nested pydantic model: its schema uses $defs, $ref and anyOf-null."""

    name: str
    qty: int = 1
    note: str | None = None


class Order(BaseModel):
    """An order of items."""

    items: list[Item]
    total: float
    express: bool = False


EXTRA_SCHEMAS: list[dict[str, Any]] = [
    Order.model_json_schema(),
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0,
                                            "exclusiveMaximum": 10, "multipleOf": 2},
                                      "s": {"type": "string", "minLength": 2,
                                            "maxLength": 4, "pattern": "^[a-z]+$"},
                                      "c": {"const": [1, {"a": True}]},
                                      "u": {"type": ["string", "null"]},
                                      "x": {"not": {"type": "string"}},
                                      "o": {"oneOf": [{"type": "integer"},
                                                      {"type": "number"}]}},
     "additionalProperties": {"type": "boolean"}},
    {"type": "array", "items": {"enum": [1, "1", True, None]}, "minItems": 1, "maxItems": 3},
]
SCHEMAS = [r.json_schema for r in corpus_rules().values() if r.json_schema] + EXTRA_SCHEMAS

_scalar = (st.none() | st.booleans() | st.integers(-20, 20)
           | st.floats(-20, 20, allow_nan=False) | st.text(max_size=5)
           | st.sampled_from(["positive", "billing", "地点", "abc", "1"]))
_keys = st.sampled_from(["sentiment", "score", "keywords", "category", "priority", "customer",
                         "name", "email", "actions", "action", "due_days", "verdict",
                         "severity", "商品名称", "价格", "实体列表", "名称", "类型", "items",
                         "total", "qty", "n", "s", "c", "u", "x", "o", "extra"])
_values = st.recursive(_scalar, lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(_keys, inner, max_size=5), max_leaves=15)


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: str(s)[:40])
def test_compilable(schema: dict[str, Any]) -> None:
    assert compile_check(schema) is not None


def test_unknown_keywords_fall_back() -> None:
    assert compile_check({"minProperties": 1}) is None
    assert compile_check({"$schema": "http://json-schema.org/draft-04/schema#"}) is None
    assert compile_check({"properties": {"a": {"$ref": "https://example.com/s"}}}) is None


@settings(max_examples=300, deadline=None)
@given(value=_values, index=st.integers(0, len(SCHEMAS) - 1))
def test_agrees_with_jsonschema(value: Any, index: int) -> None:
    schema = SCHEMAS[index]
    check = compile_check(schema)
    validator = jsonschema.validators.validator_for(schema)(schema)
    if check is not None:
        assert check(value) == validator.is_valid(value)


def test_json_equal() -> None:
    assert json_equal(1, 1.0) and not json_equal(1, True) and not json_equal(0, False)
    assert json_equal({"a": [1, {"b": None}]}, {"a": [1.0, {"b": None}]})
    assert not json_equal([1], [1, 2]) and not json_equal("1", 1)
