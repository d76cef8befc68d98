"""A delivery rule compiled once: the expected shape, names, types and validators.

:func:`output_plan` turns a :class:`~lockgate.spec.DeliveryRule` into an
:class:`OutputPlan`, cached per rule object (and by content, for rules rebuilt from
storage), so the repair ladder never re-reads the schema per output. The schema used
to walk an output comes from, in order: ``delivery_rule.schema`` (JSON Schema), the
JSON Schema of ``delivery_rule.pydantic_model``, or one synthesised from the types of
``fallback_values`` (a numeric fallback makes the field a number), so that even a
rule without a schema gets name repair and type coercion.

The walker understands ``type`` (one or a list), ``enum``/``const``, ``properties``,
``required``, ``additionalProperties: false``, ``items``, local ``$ref``
(``#/$defs/...``, ``#/definitions/...``) and nullable ``anyOf``/``oneOf`` (``X | None``
from pydantic). Anything else is left to the validator. OpenAPI's ``nullable: true``
(Gemini, OpenAPI 3.0 schemas) is read as its JSON Schema meaning, ``null`` added to the
``type`` and to an ``enum``, for the walk and the validator alike (:func:`openapi_nulls`).
"""

from __future__ import annotations

import copy
import importlib
import threading
import weakref
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from lockgate.errors import SpecError
from lockgate.runtime.fastcheck import compile_check
from lockgate.runtime.names import fold
from lockgate.spec import DeliveryRule, canonical_json

_MAX_DEPTH = 12


@dataclass(slots=True)
class Node:
    """What the schema says about one position in the output."""

    types: frozenset[str] = frozenset()
    enum: tuple[Any, ...] | None = None
    props: dict[str, Node] = field(default_factory=dict)
    required: tuple[str, ...] = ()
    additional: bool = True
    items: Node | None = None
    #: folded alias or folded property name -> property name
    lookup: dict[str, str] = field(default_factory=dict)
    #: folded names that came from the rule's alias map (for the fix label)
    alias_folds: frozenset[str] = frozenset()
    #: optional properties that refuse null (a null there is dropped)
    no_null: frozenset[str] = frozenset()
    #: whether this node or one below is integer-only or has such properties
    deep: bool = False
    #: whether the schema names null here in a way the type and enum do not show
    #: (an ``anyOf``/``oneOf`` of several types with a ``{"type": "null"}`` option)
    null_option: bool = False

    @property
    def structured(self) -> bool:
        return bool(self.props) or self.items is not None or not self.additional

    @property
    def integer_only(self) -> bool:
        """Whether the position holds integers and no other numbers."""
        return "integer" in self.types and "number" not in self.types

    @property
    def admits_null(self) -> bool:
        """Whether ``null`` may stand here (as far as the walker knows: a position of
        no known type or enum admits anything)."""
        if self.enum is not None:
            return None in self.enum
        return not self.types or "null" in self.types

    @property
    def declares_null(self) -> bool:
        """Whether the schema names null here: a ``"null"`` type, a ``null`` enum member
        or ``const``, a ``{"type": "null"}`` option. A required field holding null is
        then given (the model's "none"); a position of no known type is not enough."""
        if self.enum is not None:
            return None in self.enum
        return "null" in self.types or self.null_option


@dataclass(slots=True)
class OutputPlan:
    """Everything the ladder needs about one delivery rule, computed once."""

    format: str
    expect: str | None
    root: Node
    required: tuple[str, ...]
    expected: tuple[str, ...]
    fallback: dict[str, Any]
    is_valid: Callable[[Any], bool] | None
    errors: Callable[[Any], list[tuple[tuple[Any, ...], str]]] | None
    model: Any
    known: frozenset[str]
    #: the declared top-level fields (schema properties, required keys, fallbacks)
    fields: tuple[str, ...] = ()
    keep_truncated: bool = False
    #: whether some position is integer-only or an optional field refuses null (the
    #: fast path then checks for a float like ``3.0`` or such a ``null``)
    needs_look: bool = False
    #: whether some optional field refuses null (a ``null`` in the text is looked at)
    look_null: bool = False
    #: whether some position is integer-only (a fraction or exponent is looked at)
    look_int: bool = False


def _resolve(node: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    seen = 0
    while "$ref" in node and seen < _MAX_DEPTH:
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return {}
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part, {}) if isinstance(target, Mapping) else {}
        node = target if isinstance(target, Mapping) else {}
        seen += 1
    return node


def _compile(schema: Mapping[str, Any], root: Mapping[str, Any],
             aliases: Mapping[str, tuple[str, ...]], depth: int = 0) -> Node:
    schema = _resolve(schema, root)
    if depth > _MAX_DEPTH or not isinstance(schema, Mapping):
        return Node()
    nullable = False
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list):
            real = [o for o in options if not (isinstance(o, Mapping) and o.get("type") == "null")]
            nullable = len(real) < len(options)
            if len(real) == 1 and isinstance(real[0], Mapping):
                rest = {k: v for k, v in schema.items() if k != key}
                merged = {**rest, **_resolve(real[0], root)}
                node = _compile(merged, root, aliases, depth + 1)
                if nullable and node.types:
                    node.types = node.types | {"null"}
                if nullable and node.enum is not None and None not in node.enum:
                    node.enum = (*node.enum, None)
                if nullable and not node.types and node.enum is None:
                    node.null_option = True
                return node
            return Node(null_option=nullable)
    all_of = schema.get("allOf")
    if isinstance(all_of, list) and len(all_of) == 1 and isinstance(all_of[0], Mapping):
        rest = {k: v for k, v in schema.items() if k != "allOf"}
        schema = {**rest, **_resolve(all_of[0], root)}
    raw_type = schema.get("type")
    types = frozenset([raw_type] if isinstance(raw_type, str) else raw_type or ())
    enum: tuple[Any, ...] | None = None
    if isinstance(schema.get("enum"), list):
        enum = tuple(schema["enum"])
    elif "const" in schema:
        enum = (schema["const"],)
    node = Node(types=types, enum=enum)
    props = schema.get("properties")
    if isinstance(props, Mapping):
        node.props = {name: _compile(sub, root, aliases, depth + 1) for name, sub in props.items()}
        if not types:
            node.types = frozenset({"object"})
    if isinstance(schema.get("required"), list):
        node.required = tuple(str(r) for r in schema["required"])
    node.additional = schema.get("additionalProperties", True) is not False
    items = schema.get("items")
    if isinstance(items, Mapping):
        node.items = _compile(items, root, aliases, depth + 1)
    _index_names(node, aliases)
    node.no_null = frozenset(n for n, c in node.props.items()
                             if n not in node.required and not c.admits_null)
    node.deep = node.integer_only or bool(node.no_null) or any(
        c.deep for c in node.props.values()) or (node.items is not None and node.items.deep)
    return node


def _index_names(node: Node, aliases: Mapping[str, tuple[str, ...]]) -> None:
    names = list(node.props) + [r for r in node.required if r not in node.props]
    lookup = {fold(n): n for n in names}
    alias_folds: set[str] = set()
    for canonical, alts in aliases.items():
        if canonical in lookup.values():
            for alt in alts:
                f = fold(alt)
                if f not in lookup:
                    lookup[f] = canonical
                    alias_folds.add(f)
    node.lookup = lookup
    node.alias_folds = frozenset(alias_folds)


# An integer fallback (``0``) does not make the field an integer: a score may be 0.5.
_PY_TYPES: tuple[tuple[type, str], ...] = (
    (bool, "boolean"), (int, "number"), (float, "number"),
)


def _synthesised(rule: DeliveryRule) -> dict[str, Any]:
    props: dict[str, Any] = {}
    for name in (*rule.required_keys, *rule.fallback_values, *rule.aliases):
        props.setdefault(name, {})
    for name, value in rule.fallback_values.items():
        for py, json_type in _PY_TYPES:
            if isinstance(value, py):
                props[name] = {"type": json_type}
                break
    return {"type": "object", "properties": props} if props else {}


def _load_model(path: str) -> Any:
    from pydantic import BaseModel

    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise SpecError("must be 'module:Class'", field="delivery_rule.pydantic_model")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise SpecError(f"cannot import {path!r}: {exc}",
                        field="delivery_rule.pydantic_model") from None
    if not (isinstance(obj, type) and issubclass(obj, BaseModel)):
        raise SpecError(f"{path!r} is not a pydantic model class",
                        field="delivery_rule.pydantic_model")
    return obj


#: JSON Schema's type names (a misspelt one is refused by a metaschema ``anyOf`` whose
#: message names none of them).
_TYPES = "string, number, integer, boolean, object, array or null"


#: Keywords whose value is a schema, a list of schemas, or a map of names to schemas.
_SUB_SCHEMA = ("items", "additionalProperties", "not", "if", "then", "else", "contains",
               "propertyNames", "additionalItems", "unevaluatedItems",
               "unevaluatedProperties", "contentSchema")
_SUB_SCHEMAS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions",
                "dependentSchemas")


def _mentions_nullable(schema: Any) -> bool:
    """Whether ``"nullable"`` occurs in the schema at all (cheap: most have none)."""
    try:
        return b'"nullable"' in canonical_json(schema)
    except (TypeError, ValueError):
        return False


def openapi_nulls(schema: Any, depth: int = 0) -> Any:
    """``schema`` with OpenAPI's ``nullable: true`` written as JSON Schema says it:
    ``"null"`` added to its ``type`` and, when it has one, to its ``enum`` (a property
    named ``nullable`` is a field, not the keyword). JSON Schema itself ignores the
    keyword, so such a schema would refuse the null it means to admit."""
    if depth > 64 or not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = dict(schema)
    for key in _SUB_SCHEMA:
        if isinstance(out.get(key), Mapping):
            out[key] = openapi_nulls(out[key], depth + 1)
    for key in _SUB_SCHEMAS:
        if isinstance(out.get(key), list):
            out[key] = [openapi_nulls(s, depth + 1) for s in out[key]]
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), Mapping):
            out[key] = {n: openapi_nulls(s, depth + 1) for n, s in out[key].items()}
    if out.get("nullable") is True:
        del out["nullable"]
        kind = out.get("type")
        if isinstance(kind, str) and kind != "null":
            out["type"] = [kind, "null"]
        elif isinstance(kind, list) and "null" not in kind:
            out["type"] = [*kind, "null"]
        if isinstance(out.get("enum"), list) and None not in out["enum"]:
            out["enum"] = [*out["enum"], None]
    return out


def _schema_error(exc: Any) -> SpecError:
    """A metaschema's refusal of an output schema, naming the keyword at fault by its
    place in the schema (``delivery_rule.schema.properties.label.type``)."""
    path = [str(p) for p in exc.path]
    message = exc.message
    if path and path[-1] == "type" and exc.validator == "anyOf":
        message = f"{message}; a type is one of {_TYPES}"
    elif path and path[-1] == "required" and exc.validator == "type":
        message = f"{message}; `required` lists property names: [\"label\"]"
    return SpecError(f"not a valid JSON Schema: {message}",
                     field=".".join(["delivery_rule.schema", *path]))


def _validator(schema: Mapping[str, Any]) -> tuple[Callable[[Any], bool],
                                                   Callable[[Any], list[tuple[tuple[Any, ...],
                                                                              str]]]]:
    import jsonschema
    from jsonschema.exceptions import SchemaError

    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except SchemaError as exc:
        raise _schema_error(exc) from None
    validator = cls(schema)
    fast = compile_check(schema)

    def errors(value: Any) -> list[tuple[tuple[Any, ...], str]]:
        errs = sorted(validator.iter_errors(value), key=jsonschema.exceptions.relevance)
        return [(tuple(e.absolute_path), e.message) for e in errs]

    return fast or validator.is_valid, errors


def _build(rule: DeliveryRule) -> OutputPlan:
    model = _load_model(rule.pydantic_model) if rule.pydantic_model else None
    walk_schema: Mapping[str, Any]
    if rule.json_schema:
        walk_schema = rule.json_schema
        if _mentions_nullable(walk_schema):
            walk_schema = openapi_nulls(walk_schema)
    elif model is not None:
        walk_schema = model.model_json_schema()
    else:
        walk_schema = _synthesised(rule)
    is_valid, errors = _validator(walk_schema) if walk_schema else (None, None)
    root = _compile(walk_schema, walk_schema, rule.aliases) if walk_schema else Node()
    if is_valid is not None and errors is not None:
        is_valid, errors = _exact_numbers(root, is_valid, errors)
    if root.types & {"object"} or root.props or rule.required_keys or rule.fallback_values:
        expect: str | None = "object"
    elif root.types == frozenset({"array"}):
        expect = "array"
    else:
        expect = None
    if expect == "object":
        extra = [k for k in (*rule.required_keys, *rule.fallback_values) if k not in root.props]
        for k in extra:
            root.props[k] = Node()
        if extra:
            _index_names(root, rule.aliases)
    required = tuple(dict.fromkeys((*rule.required_keys, *root.required)))
    expected = required or tuple(root.props)
    return OutputPlan(
        format=rule.format, expect=expect, root=root, required=required, expected=expected,
        fallback=dict(rule.fallback_values), is_valid=is_valid, errors=errors, model=model,
        known=frozenset(root.lookup), fields=tuple(root.props),
        keep_truncated=bool(rule.keep_truncated),
        needs_look=root.deep, look_null=_anywhere(root, "no_null"),
        look_int=_anywhere(root, "integer_only"),
    )


Errors = Callable[[Any], list[tuple[tuple[Any, ...], str]]]
#: Beyond this magnitude floats skip integers: an integral float there may not be
#: the integer the model wrote.
_MAX_SAFE = float(1 << 53)


def _exact_numbers(root: Node, is_valid: Callable[[Any], bool], errors: Errors
                   ) -> tuple[Callable[[Any], bool], Errors]:
    """The validity check and errors of a schema, refusing numbers that are not what
    the model wrote, which JSON Schema accepts: an infinite or NaN float (``1e999``,
    ``NaN``: JSON has none; stored, they would become null) and, where only integers
    are declared, an integral float past 2^53 (``9007199254740993.0`` reads as ...992).
    Such an error has no place (``()``): the whole output is unusable, never mended by
    a field's fallback."""
    def valid(value: Any) -> bool:
        return inexact_number(value, root) is None and is_valid(value)

    def errs(value: Any) -> list[tuple[tuple[Any, ...], str]]:
        bad = inexact_number(value, root)
        return [((), bad), *errors(value)] if bad else errors(value)

    return valid, errs


def lossy_integral(v: float) -> bool:
    """Whether an integral float may not be the integer the model wrote: past 2^53 a
    float skips integers (``9007199254740993`` reads as ...992, a 20-digit integer as
    ``1.8446744073709552e+19``). One whose shortest form has at most 15 significant
    digits (``1e17``, ``1.8e19``) is the number written, exactly."""
    if not v.is_integer() or abs(v) < _MAX_SAFE:
        return False
    mantissa = repr(abs(v)).split("e")[0].replace(".", "").strip("0")
    return len(mantissa) > 15


def inexact_number(value: Any, root: Node) -> str | None:
    """Why a number in ``value`` cannot be delivered as the model wrote it (naming its
    field), or None; ``root``: the schema's node for ``value``."""
    stack: list[tuple[Any, Node | None, str]] = [(value, root, "")]
    while stack:
        v, node, path = stack.pop()
        if isinstance(v, float):
            if v != v or v in (float("inf"), float("-inf")):
                return (f"{path or '$'} holds a number JSON cannot hold (infinite or "
                        "not a number: 1e999, NaN, Infinity)")
            if node is not None and node.integer_only and lossy_integral(v):
                return (f"{path or '$'} holds an integer too large to be read exactly "
                        f"({v!r}: beyond 2^53 a float skips integers); write it as an "
                        "integer without a fraction or exponent")
        elif isinstance(v, dict):
            props = node.props if node is not None else {}
            stack.extend((c, props.get(k), f"{path}.{k}" if path else str(k))
                         for k, c in v.items())
        elif isinstance(v, list):
            items = node.items if node is not None else None
            stack.extend((c, items, f"{path}[{i}]") for i, c in enumerate(v))
    return None


def _anywhere(root: Node, what: str) -> bool:
    """Whether a node of the tree under ``root`` (where it is :attr:`Node.deep`) has
    ``what`` (a truthy attribute)."""
    stack = [root] if root.deep else []
    while stack:
        node = stack.pop()
        if getattr(node, what):
            return True
        stack.extend(c for c in node.props.values() if c.deep)
        if node.items is not None and node.items.deep:
            stack.append(node.items)
    return False


class _PlanCache:
    """Plans by rule identity (fast) and by rule content (rules rebuilt from storage)."""

    def __init__(self, size: int = 1024) -> None:
        self._by_id: dict[int, tuple[weakref.ReferenceType[Any], OutputPlan]] = {}
        self._by_content: dict[bytes, OutputPlan] = {}
        self._size = size
        self._lock = threading.Lock()

    def get(self, rule: DeliveryRule) -> OutputPlan:
        hit = self._by_id.get(id(rule))
        if hit is not None and hit[0]() is rule:
            return hit[1]
        key = canonical_json(rule.model_dump(by_alias=True))
        plan = self._by_content.get(key)
        if plan is None:
            plan = _build(rule)
        with self._lock:
            if len(self._by_content) >= self._size:
                self._by_content.clear()
            if len(self._by_id) >= self._size:
                self._by_id.clear()
            self._by_content[key] = plan
            self._by_id[id(rule)] = (weakref.ref(rule), plan)
        return plan


_plans = _PlanCache()


def output_plan(rule: DeliveryRule) -> OutputPlan:
    """The compiled plan for a rule; raises SpecError when its schema/model is bad."""
    return _plans.get(rule)


def model_allowed(path: str, modules: Collection[str]) -> bool:
    """Whether ``module:Class`` lies in one of ``modules`` (a module or a package)."""
    module = path.partition(":")[0]
    return any(module == m or module.startswith(m + ".") for m in modules)


def check_delivery_rule(rule: DeliveryRule, *, model_modules: Collection[str] = ()) -> None:
    """Refuse a rule whose schema or pydantic model cannot be used (at submit time).

    A ``pydantic_model`` is imported by every worker that runs the task, so only models
    from the modules the operator lists (``[runtime] model_modules``) are accepted; the
    check comes before any import."""
    if rule.pydantic_model and not model_allowed(rule.pydantic_model, model_modules):
        raise SpecError(
            f"{rule.pydantic_model!r} is not in a module the configuration allows; list "
            "its module under [runtime] model_modules in lockgate.toml (workers import it)",
            field="delivery_rule.pydantic_model")
    output_plan(rule)


def blank(value: Any, node: Node | None = None) -> bool:
    """A required field's value that does not count as given: a string of whitespace
    only, or null unless the field's schema (``node``) names null
    (:attr:`Node.declares_null`: OpenAI strict mode's ``["string", "null"]``)."""
    if value is None:
        return node is None or not node.declares_null
    return isinstance(value, str) and not value.strip()


def unanswered(value: Mapping[str, Any], name: str, node: Node | None) -> bool:
    """Whether field ``name`` of ``value`` is not given: absent or :func:`blank`."""
    return name not in value or blank(value[name], node)


def takes_fallback(value: Mapping[str, Any], k: str, plan: OutputPlan) -> bool:
    """Whether field ``k`` of ``value`` takes its fallback value: absent, null where its
    schema does not name null, or (required) blank."""
    if k not in value:
        return True
    current = value[k]
    node = plan.root.props.get(k)
    if current is None:
        return node is None or not node.declares_null
    return k in plan.required and blank(current, node)


def check_result(rule: DeliveryRule, value: Any, *, model_modules: Collection[str] = ()) -> Any:
    """A result given by a person (``lockgate tasks resolve``) as the task's delivery
    rule delivers it: fields its ``fallback_values`` name that are absent, null or
    (required) blank take their fallback, as in a worker's answer, and are not judged
    again. Refused when the rule would not deliver it: the wrong format, a required key
    missing, or a value its output schema (JSON Schema, or the pydantic model's)
    refuses; one :class:`SpecError` naming the first field at fault (``result.label``)."""
    if rule.format == "text":
        if not isinstance(value, str):
            raise SpecError("this task delivers text: give a JSON string", field="result")
        return value
    if rule.pydantic_model and not model_allowed(rule.pydantic_model, model_modules):
        raise SpecError(f"the task's output model {rule.pydantic_model!r} is not in a module "
                        "listed under [runtime] model_modules, so it cannot be checked here",
                        field="delivery_rule.pydantic_model")
    plan = output_plan(rule)
    if plan.expect == "object" and not isinstance(value, dict):
        raise SpecError("must be a JSON object", field="result")
    if plan.expect == "array" and not isinstance(value, list):
        raise SpecError("must be a JSON array", field="result")
    filled: set[str] = set()
    if isinstance(value, dict):
        fills = {k: fb for k, fb in plan.fallback.items() if takes_fallback(value, k, plan)}
        if fills:
            value = {**value, **copy.deepcopy(fills)}
            filled = set(fills)
        for k in plan.required:
            if k in filled:
                continue
            if k not in value:
                raise SpecError(f"required key '{k}' is missing", field=f"result.{k}")
            if blank(value[k], plan.root.props.get(k)):  # as a worker judges an answer
                raise SpecError(f"required key '{k}' is empty: give it a value",
                                field=f"result.{k}")
    if plan.errors is not None:
        # (a fallback is the user's own answer, whatever it is: not judged)
        errs = [e for e in plan.errors(value) if not (e[0] and e[0][0] in filled)]
        if errs:
            path, message = errs[0]
            where = ".".join(["result", *(str(p) for p in path)])
            raise SpecError(message, field=where)
    return value
