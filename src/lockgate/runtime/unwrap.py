"""Finding the answer inside a value read from the output (step 5 of the ladder in
:mod:`.output`): whether an object declares fields of the rule (exactly, by alias or as
a close misspelling), and the arrays and wrapper objects around the one that does.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from lockgate.runtime.conform import Fixes, may_be
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


#: Keys whose JSON text beside metadata may be the answer (never the input: prompt,
#: input, request, query, source ...); ``arguments`` as a tool call writes them
#: (``{"name": "classify", "arguments": "{\\"label\\": ...}"}``).
_ANSWER_KEYS = frozenset({"result", "results", "output", "answer", "response", "data",
                          "content", "completion", "json", "arguments", "args",
                          "parameters", "结果", "输出", "答案"})
#: Keys that hold what the model was given, never its answer: an object holding one of
#: them (as a list, an object or a text) gives no list answer.
_INPUT_KEYS = frozenset({"input", "inputs", "prompt", "prompts", "request", "query",
                         "question", "source", "context", "instruction", "instructions",
                         "messages", "inputids"})
def _input_key(key: Any) -> bool:
    """Whether ``key`` names what the model was given (:data:`_INPUT_KEYS`)."""
    return isinstance(key, str) and fold(key) in _INPUT_KEYS


#: The place of a value reached through a JSON text in a string (never a text path).
_DECODED = "\x00decoded"


def _wrapped(obj: dict[str, Any], plan: OutputPlan,
             budget: list[int]) -> tuple[str, Any] | None:
    """What a wrapper object wraps: its only value, or its only object value, or the
    only one of its object values that leads to declared fields (an object written as
    a JSON text in a string under an answer key, :data:`_ANSWER_KEYS`, counts as an
    object value unless the object may report an error: :func:`failed`). Never in an
    object whose values report an error or a refusal (:func:`reports_failure`: what it
    holds is no answer; a success envelope, ``{"error": null, "data": {...}}``, is
    unwrapped), nor under a key that holds the input (:data:`_INPUT_KEYS`: the model
    echoing what it was given) - the rule of list answers too (:func:`_list_in`)."""
    if reports_failure(obj):
        return None
    if len(obj) == 1:
        ((key, inner),) = obj.items()
        if _input_key(key):
            return None
        if isinstance(inner, str) and inner.lstrip().startswith(("{", "[")):
            try:
                inner = orjson.loads(inner)
            except orjson.JSONDecodeError:
                return None
            key = _DECODED
        return (key, inner) if isinstance(inner, dict | list) else None
    objects: list[tuple[str, Any]] = []
    decode = not failed(obj)
    for i, (k, v) in enumerate(obj.items()):
        if i >= _MAX_KEYS:
            break
        if _input_key(k):
            continue
        if isinstance(v, dict):
            objects.append((k, v))
        elif decode and isinstance(v, str) and v.lstrip()[:1] == "{" \
                and isinstance(k, str) and fold(k) in _ANSWER_KEYS:
            # the answer as a JSON text beside metadata ({"ok": true, "result": "{...}"})
            decoded = _json_text(v, dict)
            if decoded is not None:
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
        elif (call := _tool_call(current, plan)) is not None:
            key, current = call
            path = (*path, key)
            steps.append("unwrapped:tool_call")
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


#: The keys of a tool call's arguments (OpenAI ``arguments``, Llama ``parameters``),
#: and what else a call may hold beside its name.
_ARGUMENT_KEYS = frozenset({"arguments", "parameters", "args"})
_CALL_KEYS = frozenset({"id", "type", "callid", "index"})
#: A function's name (no space: "Ada Lovelace" is a person's).
_FUNCTION_NAME = re.compile(r"[A-Za-z_][\w.:-]{0,63}\Z")


def _tool_call(obj: dict[str, Any], plan: OutputPlan) -> tuple[str, Any] | None:
    """The arguments of an answer written as a tool call (``{"name": "submit_person",
    "arguments": {...}}``, ``"parameters"``, the arguments as a JSON text as OpenAI
    writes them), also where the rule declares a ``name`` field of its own: the object
    holds a function's name and its arguments (an ``id`` or ``type`` beside), the rule
    declares no field named like the arguments' key, and the arguments declare fields
    of the rule. Never an object that reads as the answer itself: the call is
    unwrapped only when the object, read as the answer, misses a required field or
    holds no declared field but ``name``, and its arguments hold strictly more of the
    declared fields than it does, among them every required one it holds (``{"name":
    "lookup_user", "parameters": {"name": "Bob"}}`` under a rule of ``name`` and
    ``input`` is delivered as written). None otherwise."""
    if len(obj) > 5 or not isinstance(obj.get("name"), str) \
            or _FUNCTION_NAME.match(obj["name"]) is None:
        return None
    found: tuple[str, Any] | None = None
    for key, value in obj.items():
        folded = fold(key) if isinstance(key, str) else ""
        if folded in _ARGUMENT_KEYS and found is None:
            if folded in plan.root.lookup:
                return None
            if isinstance(value, str) and value.lstrip()[:1] == "{":
                value = _json_text(value, dict)
                key = _DECODED
            if not isinstance(value, dict) or not declares(value, plan):
                return None
            found = (key, value)
        elif key != "name" and folded not in _CALL_KEYS:
            return None
    if found is None:
        return None
    outer = _held({k: v for k, v in obj.items() if k != found[0]}, plan)
    if not (set(plan.required) - outer or outer <= {"name"}):
        return None  # the object conforms as written: it is the answer
    inner = _held(found[1], plan)
    if (set(plan.required) & outer) - inner:
        return None  # (the arguments would lose a required field the object holds)
    return found if len(inner) > len(outer) else None


def _held(obj: dict[str, Any], plan: OutputPlan) -> set[str]:
    """The declared top-level fields an object holds (exactly or by alias) with a value
    of the field's kind (an object, an array or a scalar, as the schema types it)."""
    held: set[str] = set()
    lookup = plan.root.lookup
    for i, (k, v) in enumerate(obj.items()):
        if i >= _MAX_KEYS:
            break
        name = lookup.get(fold(k)) if isinstance(k, str) else None
        if name is None:
            continue
        node = plan.root.props.get(name)
        if node is not None and node.types and node.enum is None:
            kind = "object" if isinstance(v, dict) else "array" if isinstance(v, list) \
                else None
            if kind is not None and kind not in node.types:
                continue
            if kind is None and v is not None and node.types <= {"object", "array"}:
                continue
        held.add(name)
    return held


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
    name = list_field(value, plan)
    if name is not None:
        # the list answered bare where the object holds only that list
        fixes.repair(f"wrapped:array->{name}")
        return {name: value}, ()
    if isinstance(value, list) and value and isinstance(value[0], dict):
        fixes.repair("unwrapped:array")  # no declared field in it, but it is the answer
        return value[0], (0,)
    return value, ()


def list_field(value: Any, plan: OutputPlan) -> str | None:
    """The field a bare list answers (:func:`unwrap`), or None: the rule declares
    exactly one field, a list (an ``"array"`` type or ``items``), and ``value`` is a
    non-empty list none of whose elements declares that field (not an array around
    the answer) and each of which fits the field's items: an object holding a key of
    theirs where they are objects, a value of their type (or converting to it)."""
    if not isinstance(value, list) or not value or len(plan.fields) != 1:
        return None
    name = plan.fields[0]
    node = plan.root.props.get(name)
    if node is None or not ("array" in node.types or node.items is not None) \
            or len(value) > _MAX_KEYS:
        return None
    items = node.items
    for el in value:
        if declares(el, plan):
            return None
        if items is None:
            continue
        if items.props:
            if not isinstance(el, dict) or not any(fold(k) in items.lookup for k in el):
                return None
        elif "array" in items.types or items.items is not None:
            # a list of lists: a bare flat list is no list of them ([1, 2] is not
            # [[1], [2]], as a scalar converting to a one-item list would make it)
            return None
        elif not may_be(el, items):
            return None
    return name


def _unwrap_list(obj: dict[str, Any], plan: OutputPlan, fixes: Fixes) -> tuple[Any, Path]:
    """The list answer in an object: its only value when that is a list (the list, valid
    or not: it explains the failure); else the one list in it (beside scalar metadata,
    any number of wrappers deep: ``{"entities": [...], "count": 2}``) only when that
    list is a valid answer. An error or a refusal (:func:`failed`) is never unwrapped."""
    if failed(obj):
        return obj, ()
    if len(obj) == 1:
        ((key, inner),) = obj.items()
        if isinstance(inner, list) and not _input_key(key):
            fixes.repair("unwrapped:object")
            return inner, (key,)
    if plan.is_valid is None:
        return obj, ()
    found = _list_in(obj, plan)
    if found is not None and plan.is_valid(found[0]):
        for _ in range(found[2]):
            fixes.repair("unwrapped:object")
        return found[0], found[1]
    return obj, ()


#: Keys that say an object reports an error or a refusal, not an answer.
_ERROR_KEYS = frozenset({"error", "errors", "refusal"})
#: Keys of a status, and the values that say the call failed.
_STATUS_KEYS = frozenset({"status", "state"})
_FAILED = frozenset({"error", "failed", "failure", "refused", "rejected"})
#: Keys that explain a status (``{"status": ..., "reason": ...}``).
_REASON_KEYS = frozenset({"reason", "message"})


def failed(obj: dict[str, Any]) -> bool:
    """Whether an object reports an error or a refusal: a key named error, errors or
    refusal, a status (or state) of error, failed, failure, refused or rejected, or a
    reason or message beside a status."""
    status = False
    reason = False
    for i, (k, v) in enumerate(obj.items()):
        if i >= _MAX_KEYS:
            break
        key = fold(k) if isinstance(k, str) else ""
        if key in _ERROR_KEYS:
            return True
        if key in _STATUS_KEYS:
            status = True
            if isinstance(v, str) and v.strip().casefold() in _FAILED:
                return True
        elif key in _REASON_KEYS:
            reason = True
    return status and reason


def reports_failure(obj: dict[str, Any]) -> bool:
    """Whether an object's values say the call failed or was refused: an error, errors
    or refusal key holding something (not null, false, empty or 0), or a status (or
    state) of error, failed, failure, refused or rejected. A success envelope
    (``{"error": null, "data": ...}``, ``{"status": "ok", "message": ...}``) does not."""
    for i, (k, v) in enumerate(obj.items()):
        if i >= _MAX_KEYS:
            break
        key = fold(k) if isinstance(k, str) else ""
        if key in _ERROR_KEYS and v not in (None, False, 0, "") and v != [] and v != {}:
            return True
        if key in _STATUS_KEYS and isinstance(v, str) and v.strip().casefold() in _FAILED:
            return True
    return False


def _list_in(obj: dict[str, Any], plan: OutputPlan) -> tuple[list[Any], Path, int] | None:
    """The only list value of ``obj`` (or the only valid one, or the only one in a JSON
    text) beside scalar values, else of its only object value, and so on down: the
    list, its path, the levels removed. None when there is none or no single one, when
    lists stand beside objects, or when an object on the way reports an error or a
    refusal or holds the input (:data:`_INPUT_KEYS`)."""
    current = obj
    path: Path = ()
    for level in range(1, _MAX_UNWRAP + 1):
        if failed(current):
            return None
        lists: list[tuple[str, list[Any]]] = []
        objects: list[tuple[str, dict[str, Any]]] = []
        for i, (k, v) in enumerate(current.items()):
            if i >= _MAX_KEYS or (_input_key(k) and isinstance(v, list | dict | str)):
                return None
            if isinstance(v, list):
                lists.append((k, v))
            elif isinstance(v, dict):
                objects.append((k, v))
            elif isinstance(v, str) and v.lstrip()[:1] == "[":
                found = _json_text(v, list)
                if found is not None:
                    lists.append((_DECODED, found))
        if lists and objects:
            return None  # a list beside objects is not beside scalar metadata
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


def _json_text(text: str, kind: type[dict[str, Any]] | type[list[Any]]) -> Any:
    """``text`` read as JSON when it holds a value of ``kind``, else None."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, kind) else None
