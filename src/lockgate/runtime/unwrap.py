"""Finding the answer inside a value read from the output (step 5 of the ladder in
:mod:`.output`): whether an object declares fields of the rule (exactly, by alias or as
a close misspelling), and the arrays and wrapper objects around the one that does.
"""

from __future__ import annotations

from typing import Any

import orjson

from lockgate.runtime.conform import Fixes
from lockgate.runtime.names import closest, fold
from lockgate.runtime.scan import Path
from lockgate.runtime.schema import Node, OutputPlan

#: Keys looked at when deciding whether an object holds declared fields.
_MAX_KEYS = 256
#: Wrapper levels removed at most.
_MAX_UNWRAP = 32


def declares(value: Any, plan: OutputPlan) -> bool:
    """Whether an object has a key naming a declared field (exactly, by alias, or as a
    close misspelling) with a value that may be that field's: an object where the
    field is not declared as one is a wrapper that happens to share its name."""
    if not isinstance(value, dict) or not plan.known:
        return False
    lookup = plan.root.lookup
    unknown: list[tuple[str, Any]] = []
    for i, (k, v) in enumerate(value.items()):
        if i >= _MAX_KEYS:
            break
        name = lookup.get(fold(k))
        if name is None:
            unknown.append((k, v))
        elif _may_hold(name, v, plan):
            return True
    for k, v in unknown:  # exact names first: a misspelling costs an edit distance
        name = closest(k, plan.fields)
        if name is not None and _may_hold(name, v, plan):
            return True
    return False


def _may_hold(name: str, value: Any, plan: OutputPlan) -> bool:
    node = plan.root.props.get(name)
    if not isinstance(value, dict):
        return True
    if node is not None and _holds_no_object(node):
        return False
    # A field of no declared type may hold an object, but not the description of the
    # field itself: a model that echoes the schema ({"properties": {"answer": {"type":
    # "string"}}}) has not answered.
    return (node is not None and bool(node.types)) or not _describes_a_field(value)


#: The keywords of a JSON Schema that describe a field.
_SCHEMA_WORDS = frozenset({
    "type", "description", "enum", "const", "items", "properties", "required", "format",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength",
    "maxLength", "minItems", "maxItems", "pattern", "default", "title", "examples",
    "additionalProperties", "anyOf", "oneOf", "allOf", "$ref", "nullable"})


def _describes_a_field(value: dict[str, Any]) -> bool:
    """Whether an object reads as a JSON Schema's description of a field (only schema
    keywords, among them a type, an enum or a reference)."""
    return bool(value) and value.keys() <= _SCHEMA_WORDS and any(
        k in value for k in ("type", "enum", "const", "$ref", "anyOf", "oneOf", "allOf"))


def _holds_no_object(node: Node) -> bool:
    if node.enum is not None:
        return not any(isinstance(m, dict) for m in node.enum)
    return bool(node.types) and "object" not in node.types and not node.props


#: The place of a value reached through a JSON text in a string (never a text path).
_DECODED = "\x00decoded"


def _wrapped(obj: dict[str, Any], plan: OutputPlan,
             budget: list[int]) -> tuple[str, Any] | None:
    """What a wrapper object wraps: its only value, or its only object value, or the
    only one of its object values that leads to declared fields (an object written as
    a JSON text in a string counts as an object value)."""
    if len(obj) == 1:
        ((key, inner),) = obj.items()
        if isinstance(inner, str) and inner.lstrip().startswith(("{", "[")):
            try:
                inner = orjson.loads(inner)
            except orjson.JSONDecodeError:
                return None
            key = _DECODED
        return (key, inner) if isinstance(inner, dict | list) else None
    objects: list[tuple[str, Any]] = []
    for i, (k, v) in enumerate(obj.items()):
        if i >= _MAX_KEYS:
            break
        if isinstance(v, dict):
            objects.append((k, v))
        elif isinstance(v, str) and v.lstrip()[:1] == "{":
            # the answer as a JSON text beside metadata ({"ok": true, "result": "{...}"})
            try:
                decoded = orjson.loads(v)
            except orjson.JSONDecodeError:
                continue
            if isinstance(decoded, dict):
                objects.append((_DECODED, decoded))
    if len(objects) == 1:
        return objects[0]
    if 1 < len(objects) <= 8:
        leading = [(k, v) for k, v in objects if _descend(v, plan, budget) is not None]
        if len(leading) == 1:
            return leading[0]
    return None


def _descend(value: Any, plan: OutputPlan,
             budget: list[int]) -> tuple[Any, Path, list[str]] | None:
    """Follow arrays (first element) and wrappers from ``value`` down to an object that
    holds declared fields: the object, its path, the fixes. None if there is none."""
    current = value
    path: Path = ()
    steps: list[str] = []
    for _ in range(_MAX_UNWRAP):
        budget[0] -= 1
        if budget[0] < 0:
            return None
        if isinstance(current, list):
            if not current or not isinstance(current[0], dict):
                return None
            current, path = current[0], (*path, 0)
            steps.append("unwrapped:array")
        elif not isinstance(current, dict):
            return None
        elif declares(current, plan):
            return current, path, steps
        else:
            picked = _wrapped(current, plan, budget)
            if picked is None:
                return None
            key, current = picked
            path = (*path, key)
            steps.append("unwrapped:object")
    return None


def unwrap(value: Any, plan: OutputPlan, fixes: Fixes) -> tuple[Any, Path]:
    """The answer inside ``value`` and its path: the first element of an array; while
    an object holds none of the declared fields, its only value, its only object
    value, or the only one of its object values that leads to declared fields."""
    if plan.expect == "array":
        if isinstance(value, dict):
            return _unwrap_list(value, plan, fixes)
        return value, ()
    if plan.expect != "object":
        return value, ()
    found = _descend(value, plan, [64])
    if found is not None:
        for label in found[2]:
            fixes.repair(label)
        return found[0], found[1]
    if isinstance(value, list) and value and isinstance(value[0], dict):
        fixes.repair("unwrapped:array")  # no declared field in it, but it is the answer
        return value[0], (0,)
    return value, ()


def _unwrap_list(obj: dict[str, Any], plan: OutputPlan, fixes: Fixes) -> tuple[Any, Path]:
    """The list answer in an object: the one list in it (beside scalar metadata, any
    number of wrappers deep: ``{"entities": [...], "count": 2}``) when it is a valid
    answer; else the object itself as the list's one item when it holds fields of the
    items (``{"name": "Paris"}``); else that list anyway (it explains the failure)."""
    found = _list_in(obj, plan)
    if found is not None and (plan.is_valid is None or plan.is_valid(found[0])):
        for _ in range(found[2]):
            fixes.repair("unwrapped:object")
        return found[0], found[1]
    items = plan.root.items
    if items is not None and items.props and any(
            fold(k) in items.lookup for k in list(obj)[:_MAX_KEYS]):
        fixes.coerce("coerced:$:object->array")
        return [obj], ()
    if found is not None:
        for _ in range(found[2]):
            fixes.repair("unwrapped:object")
        return found[0], found[1]
    return obj, ()


def _list_in(obj: dict[str, Any], plan: OutputPlan) -> tuple[list[Any], Path, int] | None:
    """The only list value of ``obj`` (or the only valid one, or the only one in a JSON
    text), else of its only object value, and so on down: the list, its path, the
    levels removed. None when there is none or no single one."""
    current = obj
    path: Path = ()
    for level in range(1, _MAX_UNWRAP + 1):
        lists: list[tuple[str, list[Any]]] = []
        objects: list[tuple[str, dict[str, Any]]] = []
        for i, (k, v) in enumerate(current.items()):
            if i >= _MAX_KEYS:
                return None
            if isinstance(v, list):
                lists.append((k, v))
            elif isinstance(v, dict):
                objects.append((k, v))
            elif isinstance(v, str) and v.lstrip()[:1] == "[":
                try:
                    decoded = orjson.loads(v)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(decoded, list):
                    lists.append((_DECODED, decoded))
        if len(lists) > 1 and plan.is_valid is not None:
            lists = [(k, v) for k, v in lists if plan.is_valid(v)]
        if len(lists) == 1:
            key, found = lists[0]
            return found, (*path, key), level
        if lists or len(objects) != 1:
            return None
        key, current = objects[0]
        path = (*path, key)
    return None
