"""A compiled yes/no JSON Schema check for the keywords delivery rules use.

``jsonschema`` builds a validator object per sub-schema it descends into, which costs
hundreds of microseconds for a nested output: more than all the rest of the ladder.
:func:`compile_check` turns a schema made only of common keywords into nested
closures that answer "valid?" in a few microseconds. For any other keyword it returns
``None`` and the caller keeps ``jsonschema``; ``jsonschema`` also stays the source of
error messages. The test suite checks that both agree on generated values.

Supported: ``type``, ``enum``, ``const``, ``properties``, ``required``,
``additionalProperties`` (boolean or schema), ``items`` (one schema), ``minItems``,
``maxItems``, ``minLength``, ``maxLength``, ``pattern``, ``minimum``, ``maximum``,
``exclusiveMinimum``, ``exclusiveMaximum``, ``multipleOf``, ``anyOf``, ``oneOf``,
``allOf``, ``not`` and local ``$ref`` (non-recursive). Annotations (``title``,
``description``, ``default``, ``examples``, ``format``, ...) are ignored, as
``jsonschema`` ignores them by default.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Check = Callable[[Any], bool]

_ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "format", "$schema", "$id", "$defs",
    "definitions", "$comment", "deprecated", "readOnly", "writeOnly", "contentMediaType",
    "contentEncoding",
})


class Unsupported(Exception):
    """The schema uses a keyword this module does not compile."""


def json_equal(a: Any, b: Any) -> bool:
    """Equality as JSON Schema defines it (``true`` is not ``1``; ``1`` is ``1.0``)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and a == b


def _resolve(schema: Any, root: Mapping[str, Any], depth: int) -> Any:
    while isinstance(schema, Mapping) and "$ref" in schema:
        if depth > 16:
            raise Unsupported("deep or recursive $ref")
        ref = schema["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#/") or len(schema) > 1:
            raise Unsupported("non-local $ref")
        target: Any = root
        for part in ref[2:].split("/"):
            if not isinstance(target, Mapping) or part not in target:
                raise Unsupported(f"unresolvable $ref {ref}")
            target = target[part]
        schema = target
        depth += 1
    return schema


def _compile(schema: Any, root: Mapping[str, Any], depth: int) -> Check:
    if depth > 32:
        raise Unsupported("schema too deep")
    schema = _resolve(schema, root, depth)
    if schema is True or schema == {}:
        return lambda v: True
    if schema is False:
        return lambda v: False
    if not isinstance(schema, Mapping):
        raise Unsupported("schema is not an object")
    checks: list[Check] = []
    for key, arg in schema.items():
        if key in _ANNOTATIONS:
            continue
        checks.append(_keyword(key, arg, schema, root, depth))
    if not checks:
        return lambda v: True
    if len(checks) == 1:
        return checks[0]

    return lambda v: all(c(v) for c in checks)


def _keyword(key: str, arg: Any, schema: Mapping[str, Any], root: Mapping[str, Any],
             depth: int) -> Check:
    maker = _KEYWORDS.get(key)
    if maker is None:
        raise Unsupported(f"keyword {key!r}")
    return maker(arg, schema, root, depth)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _is_integer(v: Any) -> bool:
    if isinstance(v, bool):
        return False
    return isinstance(v, int) or (isinstance(v, float) and v.is_integer())


_PREDICATES: dict[str, Check] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "number": _is_number,
    "integer": _is_integer,
}


def _type(arg: Any, *_: Any) -> Check:
    types = [arg] if isinstance(arg, str) else list(arg)
    for t in types:
        if t not in _PREDICATES:
            raise Unsupported(f"type {t!r}")
    preds = [_PREDICATES[t] for t in types]
    if len(preds) == 1:
        return preds[0]
    return lambda v: any(p(v) for p in preds)


def _enum(arg: Any, *_: Any) -> Check:
    members = list(arg)
    return lambda v: any(json_equal(v, m) for m in members)


def _const(arg: Any, *_: Any) -> Check:
    return lambda v: json_equal(v, arg)


def _properties(arg: Any, schema: Mapping[str, Any], root: Mapping[str, Any],
                depth: int) -> Check:
    props = {name: _compile(sub, root, depth + 1) for name, sub in arg.items()}

    def check(v: Any) -> bool:
        if not isinstance(v, dict):
            return True
        return all(c(v[name]) for name, c in props.items() if name in v)

    return check


def _required(arg: Any, *_: Any) -> Check:
    names = list(arg)
    return lambda v: not isinstance(v, dict) or all(n in v for n in names)


def _additional(arg: Any, schema: Mapping[str, Any], root: Mapping[str, Any],
                depth: int) -> Check:
    if "patternProperties" in schema:
        raise Unsupported("patternProperties")
    known = frozenset(schema.get("properties", {}))
    extra = _compile(arg, root, depth + 1)

    def check(v: Any) -> bool:
        if not isinstance(v, dict):
            return True
        return all(extra(val) for k, val in v.items() if k not in known)

    return check


def _items(arg: Any, schema: Mapping[str, Any], root: Mapping[str, Any], depth: int) -> Check:
    if not isinstance(arg, Mapping | bool):
        raise Unsupported("array form of items")
    item = _compile(arg, root, depth + 1)
    return lambda v: not isinstance(v, list) or all(item(x) for x in v)


def _bound(kind: type, measure: Callable[[Any], Any], op: Callable[[Any, Any], bool]) -> Callable[
        ..., Check]:
    def make(arg: Any, *_: Any) -> Check:
        if kind is float and (isinstance(arg, bool) or not isinstance(arg, int | float)):
            raise Unsupported("non-numeric bound")

        def check(v: Any) -> bool:
            if kind is float:
                if isinstance(v, bool) or not isinstance(v, int | float):
                    return True
            elif not isinstance(v, kind):
                return True
            return op(measure(v), arg)

        return check

    return make


def _pattern(arg: Any, *_: Any) -> Check:
    try:
        rx = re.compile(arg)
    except (re.error, TypeError) as exc:
        raise Unsupported(f"pattern {arg!r}") from exc
    return lambda v: not isinstance(v, str) or rx.search(v) is not None


def _multiple_of(arg: Any, *_: Any) -> Check:
    if not isinstance(arg, int) or isinstance(arg, bool) or arg <= 0:
        raise Unsupported("non-integer multipleOf")
    return lambda v: isinstance(v, bool) or not isinstance(v, int) or v % arg == 0


def _any_of(arg: Any, schema: Mapping[str, Any], root: Mapping[str, Any], depth: int) -> Check:
    subs = [_compile(s, root, depth + 1) for s in arg]
    return lambda v: any(c(v) for c in subs)


def _one_of(arg: Any, schema: Mapping[str, Any], root: Mapping[str, Any], depth: int) -> Check:
    subs = [_compile(s, root, depth + 1) for s in arg]
    return lambda v: sum(1 for c in subs if c(v)) == 1


def _all_of(arg: Any, schema: Mapping[str, Any], root: Mapping[str, Any], depth: int) -> Check:
    subs = [_compile(s, root, depth + 1) for s in arg]
    return lambda v: all(c(v) for c in subs)


def _not(arg: Any, schema: Mapping[str, Any], root: Mapping[str, Any], depth: int) -> Check:
    sub = _compile(arg, root, depth + 1)
    return lambda v: not sub(v)


def _same(value: Any) -> Any:
    return value


def _ignore(*_: Any) -> Check:
    return lambda v: True


_KEYWORDS: dict[str, Callable[..., Check]] = {
    "type": _type, "enum": _enum, "const": _const, "properties": _properties,
    "required": _required, "additionalProperties": _additional, "items": _items,
    "minItems": _bound(list, len, lambda a, b: a >= b),
    "maxItems": _bound(list, len, lambda a, b: a <= b),
    "minLength": _bound(str, len, lambda a, b: a >= b),
    "maxLength": _bound(str, len, lambda a, b: a <= b),
    "minimum": _bound(float, _same, lambda a, b: a >= b),
    "maximum": _bound(float, _same, lambda a, b: a <= b),
    "exclusiveMinimum": _bound(float, _same, lambda a, b: a > b),
    "exclusiveMaximum": _bound(float, _same, lambda a, b: a < b),
    "pattern": _pattern, "multipleOf": _multiple_of, "anyOf": _any_of, "oneOf": _one_of,
    "allOf": _all_of, "not": _not,
    # a schema ``$ref`` with siblings is rejected in _resolve; these only annotate
    "$anchor": _ignore,
}


def compile_check(schema: Mapping[str, Any]) -> Check | None:
    """A fast validity check equivalent to jsonschema's, or None if not compilable."""
    dialect = str(schema.get("$schema", ""))
    if "draft-03" in dialect or "draft-04" in dialect:
        return None  # older keyword meanings (boolean exclusiveMinimum, ...)
    try:
        return _compile(schema, schema, 0)
    except (Unsupported, RecursionError, TypeError, AttributeError):
        return None
