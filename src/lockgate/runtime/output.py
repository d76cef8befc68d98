"""Output parsing, repair and validation against the delivery rule.

The ladder, cheapest first; each step runs only when the previous ones did not give a
usable output:

1. **strict** - ``orjson.loads`` of the whole reply. A reply that is valid and already
   conforms returns here (the fast path: no further work).
2. **find** - a leading ``<think>`` block is set aside; full-width punctuation and
   curly quotes are turned to ASCII where they stand as JSON syntax, never inside
   values (:func:`.scan.ascii_syntax`); then the bodies of Markdown code fences, else
   every top-level object in the text, in the order written (:func:`.scan.regions`).
3. **repair** - a region that is not strict JSON is read as a Python literal, else
   with ``json_repair``; a complete object that begins a line inside it (the model
   starting over) comes first.
4. **truncation** - a region the output ends inside (cut off at ``max_tokens``) is cut
   back to its last *finished* value and closed; a list or object field left open is
   dropped. A value counts only if the output finished it, so what was cut off takes
   its fallback (``truncated``; ``keep_truncated`` on the rule keeps cut values).
5. **shape** - an array around the object gives its first element; wrappers are
   removed, any number deep (:func:`_unwrap`).
6. **field names** - alias map, then close misspellings (:mod:`.conform`).
7. **types** - coercion to the declared schema (:mod:`.conform`).
8. **fallback** - missing (absent, null, or blank where required) fields take their
   value from ``delivery_rule.fallback_values``; so do fields whose value still
   breaks the schema. A declared fallback is the user's answer, whatever it is (``""``
   and ``null`` included): it is never judged against the schema.
9. **validate** - JSON Schema and/or the pydantic model of the rule; and at least one
   declared field must hold a non-blank value the model gave (an object made only of
   fallbacks is not an answer).

Candidates are tried in the order the model wrote them and the first usable one is
the answer: a later object never replaces an earlier usable one, and a region cut off
by the end of the output comes after every complete one. When none is usable the
status names why (for the candidate that recovered most expected fields):
``no_json_found`` (nothing JSON-like), ``invalid_json`` (JSON-like, but no declared
field could be recovered from it), ``schema_violation`` (JSON, but not the declared
shape). Otherwise the status names the strongest step that was needed: ``valid``
(none), ``repaired`` (2-6), ``coerced`` (7), ``filled_fallback`` (8).

``parse_output`` never raises on any text (lone surrogates, NUL bytes, 100,000-deep
nesting, 10 MB): only a broken delivery rule raises (``SpecError``). Texts over
:data:`MAX_SEARCH` characters are only read when they are strict JSON as a whole, and
``json_repair`` only sees regions up to :data:`MAX_REPAIR`, so the time per output is
bounded.
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, overload

import orjson

from lockgate.errors import ErrorClass
from lockgate.runtime.conform import Fixes, conform, json_type
from lockgate.runtime.extract import fenced_blocks, python_literal, repair
from lockgate.runtime.names import closest, fold
from lockgate.runtime.scan import (
    ANY_START,
    NOT_READ,
    OBJECT_START,
    Path,
    Region,
    ascii_syntax,
    may_be_wide,
    regions,
    strict_region,
    wide_bracket,
)
from lockgate.runtime.schema import Node, OutputPlan, output_plan
from lockgate.spec import DeliveryRule

log = logging.getLogger("lockgate.runtime")

#: Longest text searched for JSON in chatter (characters); longer ones must be strict
#: JSON as a whole.
MAX_SEARCH = 512 << 10
#: Longest region handed to ``json_repair`` (pure Python, 1-3 ms per KB).
MAX_REPAIR = 128 << 10
#: Keys looked at when deciding whether an object holds declared fields.
_MAX_KEYS = 256
#: Wrapper levels removed at most.
_MAX_UNWRAP = 32
#: An object at the start of a line (after text without JSON syntax, if any).
_LINE_START = re.compile(r"\n[^\n\"'{}\[\],]*\{")
_MAX_RESTARTS = 16
#: The error of an output that made the parser itself fail (a bug, logged).
INTERNAL = "internal error while parsing the output"


class ParseStatus(StrEnum):
    """How an output was obtained (usable) or why it is not (unusable)."""

    VALID = "valid"
    REPAIRED = "repaired"
    COERCED = "coerced"
    FILLED_FALLBACK = "filled_fallback"
    INVALID_JSON = "invalid_json"
    NO_JSON_FOUND = "no_json_found"
    SCHEMA_VIOLATION = "schema_violation"


USABLE = frozenset({ParseStatus.VALID, ParseStatus.REPAIRED, ParseStatus.COERCED,
                    ParseStatus.FILLED_FALLBACK})


@dataclass(frozen=True, slots=True)
class Parsed:
    """The outcome of parsing one raw output."""

    status: ParseStatus
    value: Any
    fixes: tuple[str, ...] = ()
    completeness: float = 1.0
    conforms: bool = True
    error: str | None = None
    missing: tuple[str, ...] = field(default=())

    @property
    def usable(self) -> bool:
        return self.status in USABLE

    @property
    def truncated(self) -> bool:
        """The output ended inside its JSON (cut off, e.g. at ``max_tokens``)."""
        return "truncated" in self.fixes

    @property
    def error_class(self) -> ErrorClass | None:
        """``invalid_output`` for an unusable output (retryable unless ``stop_on``)."""
        return None if self.usable else ErrorClass.INVALID_OUTPUT


_MISSING = object()


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def parse_output(raw: str, rule: DeliveryRule) -> Parsed:
    """Parse a raw model output under a delivery rule (the ladder in the module doc).

    Raises only ``SpecError`` for a delivery rule that cannot be used."""
    plan = output_plan(rule)
    try:
        return _parse(raw, plan)
    except Exception as exc:  # a parser bug must not cost the task its raw output
        log.exception("parse_output failed on a %d-character output", len(raw))
        return Parsed(ParseStatus.INVALID_JSON, None, completeness=0.0, conforms=False,
                      error=f"{INTERNAL}: {type(exc).__name__}", missing=plan.expected)


def _parse(raw: str, plan: OutputPlan) -> Parsed:
    fixes = Fixes()
    raw = _valid_unicode(raw, fixes)
    if plan.format == "text":
        return Parsed(ParseStatus.REPAIRED if fixes.repaired else ParseStatus.VALID, raw,
                      fixes.labels())
    try:
        value: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return _search(raw, plan, fixes)
    if isinstance(value, str) and any(c in value for c in "{["):
        # JSON text inside a JSON string: the answer encoded twice, or chatter that
        # happens to be quoted. Where no shape is expected, a string stays a string
        # unless an object or array is found in it as it stands (not repaired).
        inner = Fixes()
        inner.repair("decoded:string")
        found = _search(value, plan, inner)
        if found.usable and (plan.expect is not None or not any(
                f.startswith(("repaired:", "truncated")) for f in found.fixes)):
            return found
    if not fixes.applied and _fast_ok(value, plan):
        return _deliverable(Parsed(ParseStatus.VALID, value))
    return _finish(value, plan, fixes, repaired=False)


def _valid_unicode(raw: str, fixes: Fixes) -> str:
    """``raw`` with lone surrogates (from ``surrogateescape`` decoding or a broken
    escape) replaced by U+FFFD and split surrogate pairs joined."""
    if raw.isascii():
        return raw
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        fixes.repair("replaced:surrogates")
        return raw.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return raw


def _search(text: str, plan: OutputPlan, fixes: Fixes) -> Parsed:
    """Steps 2-9 on a text that is not strict JSON as a whole."""
    start_at = ANY_START if plan.expect == "array" else OBJECT_START
    if len(text) > MAX_SEARCH:
        if start_at.search(text) is None:
            return _unusable(ParseStatus.NO_JSON_FOUND, plan,
                             "no JSON object or array in the output")
        return _unusable(ParseStatus.INVALID_JSON, plan,
                         f"the output is not JSON as a whole and too long to search "
                         f"({len(text)} characters; the limit is {MAX_SEARCH})")
    if "</think>" in text and "stripped:think" not in fixes.applied:
        # Reasoning models put their scratch work first; it may hold braces of its own.
        thought = _strip_thinking(text)
        if thought is not None:
            inner = fixes.copy()
            inner.repair("stripped:think")
            found = _search(thought, plan, inner)
            if found.usable:
                return found
    if may_be_wide(text):
        # The usual reply, strict JSON after some chatter, needs no conversion; the
        # conversion could only matter where a full-width bracket came before it.
        first = _search_text(text, plan, fixes, first_strict=True)
        if first is not None:
            return first
    converted = ascii_syntax(text)
    if converted is not text:
        inner = fixes.copy()
        inner.repair("repaired:punctuation")
        found = _search_text(converted, plan, inner)
        if found.usable:
            return found
        plain = _search_text(text, plan, fixes)
        return plain if plain.usable or plain.completeness > found.completeness else found
    return _search_text(text, plan, fixes)


@overload
def _search_text(text: str, plan: OutputPlan, fixes: Fixes) -> Parsed: ...


@overload
def _search_text(text: str, plan: OutputPlan, fixes: Fixes,
                 first_strict: bool) -> Parsed | None: ...


def _search_text(text: str, plan: OutputPlan, fixes: Fixes,
                 first_strict: bool = False) -> Parsed | None:
    """Fences, then the whole text. ``first_strict``: only a usable first object that
    is strict JSON and that no full-width bracket precedes, else None."""
    start_at = ANY_START if plan.expect == "array" else OBJECT_START
    for block in fenced_blocks(text):
        inner = fixes.copy()
        inner.repair("extracted:fence")
        if first_strict:
            return _first_strict(block, plan, inner, start_at)
        found = _search_regions(block, plan, inner, start_at)
        if found.usable:
            return found
    if first_strict:
        return _first_strict(text, plan, fixes, start_at)
    return _search_regions(text, plan, fixes, start_at)


def _first_strict(text: str, plan: OutputPlan, fixes: Fixes,
                  start_at: re.Pattern[str]) -> Parsed | None:
    found = regions(text, start_at, limit=1)
    if not found or found[0].value is NOT_READ or wide_bracket(text, found[0].start):
        return None
    for value, labels, repaired, _ in _candidates(text, found[0], plan):
        inner = fixes.copy()
        for label in labels:
            inner.repair(label)
        parsed = _finish(value, plan, inner, repaired=repaired)
        return parsed if parsed.usable else None
    return None


def _search_regions(text: str, plan: OutputPlan, fixes: Fixes,
                    start_at: re.Pattern[str]) -> Parsed:
    found = regions(text, start_at)
    if not found:
        return _unusable(ParseStatus.NO_JSON_FOUND, plan, "no JSON object or array in the output")
    failures: list[Parsed] = []
    for region in found:
        for value, labels, repaired, cut in _candidates(text, region, plan):
            inner = fixes.copy()
            for label in labels:
                inner.repair(label)
            parsed = _finish(value, plan, inner, repaired=repaired, cut=cut)
            if parsed.usable:
                return parsed
            failures.append(parsed)
    if not failures:
        if not found[-1].closed:
            return _unusable(ParseStatus.INVALID_JSON, plan,
                             "the output was cut off before any value in it finished",
                             (*fixes.labels(), "truncated"))
        return _unusable(ParseStatus.INVALID_JSON, plan,
                         "the output holds JSON-like text that could not be read",
                         fixes.labels())
    # The failure that recovered most of the expected fields explains best; the first
    # such one (max keeps the first of equals).
    return max(failures, key=lambda p: (p.completeness,
                                        p.status is ParseStatus.SCHEMA_VIOLATION))


def _unusable(status: ParseStatus, plan: OutputPlan, error: str,
              fixes: tuple[str, ...] = ()) -> Parsed:
    return Parsed(status, None, fixes, completeness=0.0, conforms=False, error=error,
                  missing=plan.expected)


#: (value, fix labels, needed repair?, the cut region it was read from - or None)
Candidate = tuple[Any, tuple[str, ...], bool, Region | None]


def _candidates(text: str, region: Region, plan: OutputPlan) -> Iterator[Candidate]:
    """The values a region may hold, best first."""
    whole = region.start == len(text) - len(text.lstrip()) and (
        not region.closed or region.end == len(text.rstrip()))
    where = () if whole else ("extracted:chatter",)
    if region.closed:
        if region.value is not NOT_READ:
            yield region.value, where, False, None
            return
        body = text[region.start:region.end]
        yield from _restarts(text, region)
        yield from _read(body, where, None, strict=False)
        return
    own: Iterator[Candidate] = iter(())
    if plan.keep_truncated:
        own = _read(text[region.start:] + region.tail, (*where, "truncated"), None)
    elif region.safe_end > region.start + 1:  # some value finished before the cut
        own = _read(region.trimmed(text), (*where, "truncated"), region)
    inner = (c for s, e in region.inner
             for c in _read(text[s:e], ("extracted:chatter",), None, repair_it=False))
    if text[region.start] == "[" and plan.expect != "array":
        # A bracket that never closes before the end: the complete objects in it first
        # (the first of them is the answer, as for an array of objects).
        yield from inner
        yield from own
    else:
        yield from own
        yield from inner


def _restarts(text: str, region: Region) -> Iterator[Candidate]:
    """Complete objects that begin a line inside a region that is not JSON as written:
    the model started over after an answer it did not finish (``{"a": "cut`` then a
    new line and a whole object). They come before a repair of the region, which would
    mix the two."""
    for tried, m in enumerate(_LINE_START.finditer(text, region.start + 1, region.end)):
        if tried >= _MAX_RESTARTS:
            return
        inner = strict_region(text, m.end() - 1)
        if inner is not None and inner.end <= region.end:
            yield inner.value, ("extracted:chatter",), False, None


def _read(body: str, labels: tuple[str, ...], cut: Region | None, *, strict: bool = True,
          repair_it: bool = True) -> Iterator[Candidate]:
    """The value of one region's text: strict JSON, a Python literal, or repaired."""
    cut_off = "truncated" in labels
    if strict:
        try:
            yield orjson.loads(body), labels, cut_off, cut
            return
        except orjson.JSONDecodeError:
            pass
    literal = python_literal(body)
    if literal is not None:
        yield literal, (*labels, "repaired:python"), True, cut
        return
    if repair_it and len(body) <= MAX_REPAIR:
        value = repair(body)
        if value is not None:
            yield value, (*labels, "repaired:json"), True, cut


def _strip_thinking(text: str) -> str | None:
    """The reply after a leading reasoning block (``<think>...</think>``), if any."""
    end = text.find("</think>")
    head = text[:end]
    if head.lstrip().startswith("<think>") or ("{" not in head and "[" not in head):
        return text[end + len("</think>"):]
    return None


def _declares(value: Any, plan: OutputPlan) -> bool:
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
    return not (isinstance(value, dict) and node is not None and _holds_no_object(node))


def _holds_no_object(node: Node) -> bool:
    if node.enum is not None:
        return not any(isinstance(m, dict) for m in node.enum)
    return bool(node.types) and "object" not in node.types and not node.props


def _fast_ok(value: Any, plan: OutputPlan) -> bool:
    if plan.expect == "object":
        if not isinstance(value, dict):
            return False
        for k in plan.required:
            if _blank(value.get(k)):
                return False
        for k in plan.fallback:
            if value.get(k) is None:
                return False
        if plan.fields and all(_blank(value.get(k)) for k in plan.fields):
            return False
        if not _keys_known(value, plan.root):
            return False
    elif plan.expect == "array" and not isinstance(value, list):
        return False
    if plan.is_valid is not None and not plan.is_valid(value):
        return False
    return plan.model is None


def _keys_known(value: Any, node: Node) -> bool:
    if isinstance(value, dict):
        props = node.props
        if props or not node.additional:
            for k, v in value.items():
                child = props.get(k)
                if child is None or (child.structured and not _keys_known(v, child)):
                    return False
        return True
    if isinstance(value, list) and node.items is not None and node.items.structured:
        return all(_keys_known(v, node.items) for v in value)
    return True


#: The place of a value reached through a JSON text in a string (never a text path).
_DECODED = "\x00decoded"


def _wrapped(obj: dict[str, Any], plan: OutputPlan,
             budget: list[int]) -> tuple[str, Any] | None:
    """What a wrapper object wraps: its only value, or its only object value, or the
    only one of its object values that leads to declared fields."""
    if len(obj) == 1:
        ((key, inner),) = obj.items()
        if isinstance(inner, str) and inner.lstrip().startswith(("{", "[")):
            try:
                inner = orjson.loads(inner)
            except orjson.JSONDecodeError:
                return None
            key = _DECODED
        return (key, inner) if isinstance(inner, dict | list) else None
    objects = [(k, v) for k, v in obj.items() if isinstance(v, dict)]
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
        elif _declares(current, plan):
            return current, path, steps
        else:
            picked = _wrapped(current, plan, budget)
            if picked is None:
                return None
            key, current = picked
            path = (*path, key)
            steps.append("unwrapped:object")
    return None


def _unwrap(value: Any, plan: OutputPlan, fixes: Fixes) -> tuple[Any, Path]:
    """The answer inside ``value`` and its path: the first element of an array; while
    an object holds none of the declared fields, its only value, its only object
    value, or the only one of its object values that leads to declared fields."""
    if plan.expect == "array":
        if isinstance(value, dict) and len(value) == 1:
            ((key, inner),) = value.items()
            if isinstance(inner, list):
                fixes.repair("unwrapped:object")
                return inner, (key,)
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


def _drop_cut(value: Any, where: Path, cut: Region | None, fixes: Fixes) -> Any:
    """Remove the fields whose value the output was cut off in: they were closed by the
    scan, not finished by the model (a cut scalar was already left out)."""
    if cut is None:
        return value
    if cut.dropped is not None:
        fixes.repair(f"truncated:{_place(cut.dropped, where)}")
    n = len(where)
    if isinstance(value, dict):
        gone = [k for k in value if (*where, k) in cut.open_paths]
        if gone:
            value = {k: v for k, v in value.items() if k not in gone}
            for k in gone:
                fixes.repair(f"truncated:{k}")
    elif isinstance(value, list) and where in cut.open_paths:
        gone_at = {p[n] for p in cut.open_paths if len(p) == n + 1 and p[:n] == where}
        if gone_at:
            value = [v for i, v in enumerate(value) if i not in gone_at]
            fixes.repair(f"truncated:{_place((*where, min(gone_at)), where)}")
    return value


def _place(path: Path, where: Path) -> str:
    if path[:len(where)] == where:
        path = path[len(where):]
    return ".".join(f"[{p}]" if isinstance(p, int) else p for p in path).replace(".[", "[") \
        or "$"


def _finish(value: Any, plan: OutputPlan, fixes: Fixes, *, repaired: bool,
            cut: Region | None = None) -> Parsed:
    """Steps 4-9 on a value read from the output (``cut``: the region it was cut
    back from)."""
    value, where = _unwrap(value, plan, fixes)
    value = _drop_cut(value, where, cut, fixes)
    nothing = ParseStatus.INVALID_JSON if repaired else ParseStatus.SCHEMA_VIOLATION
    if repaired and plan.known and not _declares(value, plan):
        # A repair that recovers none of the expected fields is no recovery.
        return _unusable(ParseStatus.INVALID_JSON, plan, _cut(
            "the output holds JSON-like text that could not be repaired into the "
            "expected fields", fixes), fixes.labels())
    if plan.expect is not None and json_type(value) != plan.expect:
        return Parsed(nothing, value, fixes.labels(), completeness=0.0, conforms=False,
                      error=f"expected a JSON {plan.expect}, got {json_type(value)}",
                      missing=plan.expected)
    value = conform(value, plan.root, fixes)
    completeness, missing = _completeness(value, plan)
    own = value
    filled: set[str] = set()
    if isinstance(value, dict):
        value = _fill(value, plan, fixes, filled)
    error = _violation(value, plan, filled)
    if error is not None and isinstance(value, dict):
        value, refilled = _fill_invalid(value, plan, fixes, filled)
        if refilled:
            filled.update(refilled)
            error = _violation(value, plan, filled)
            completeness, missing = _completeness_after(value, plan, completeness, missing,
                                                        refilled)
    if plan.expect == "object" and plan.fields and isinstance(own, dict) and not any(
            k in own and k not in filled and not _blank(own[k]) for k in plan.fields):
        return Parsed(nothing, value, fixes.labels(), completeness=completeness,
                      conforms=False, missing=missing, error=_cut(
                          f"no declared field ({', '.join(plan.fields[:8])}) holds a "
                          "value from the output", fixes))
    if error is None and plan.model is not None:
        value, error = _model_check(value, plan, fixes, filled)
    if error is not None:
        return Parsed(ParseStatus.SCHEMA_VIOLATION, value, fixes.labels(),
                      completeness=completeness, conforms=False, error=_cut(error, fixes),
                      missing=missing)
    status = ParseStatus.FILLED_FALLBACK if fixes.filled else ParseStatus.COERCED \
        if fixes.coerced else ParseStatus.REPAIRED if fixes.repaired else ParseStatus.VALID
    return _deliverable(Parsed(status, value, fixes.labels(), completeness=completeness,
                               missing=missing))


def _cut(error: str, fixes: Fixes) -> str:
    if "truncated" in fixes.applied:
        return f"{error} (the output was cut off inside its JSON)"
    return error


def _deliverable(parsed: Parsed) -> Parsed:
    """The parsed output if its value can be stored as JSON: integers beyond 64 bits
    become floats (as ``orjson`` reads them), stray surrogates U+FFFD; nesting deeper
    than ``orjson`` writes (254 levels) makes it unusable."""
    try:
        orjson.dumps(parsed.value)
        return parsed
    except TypeError:
        pass
    try:
        value = _json_safe(parsed.value)
        orjson.dumps(value)
    except (TypeError, RecursionError) as exc:
        return Parsed(ParseStatus.INVALID_JSON, None, parsed.fixes, completeness=0.0,
                      conforms=False, error=f"the value cannot be written as JSON: {exc}",
                      missing=parsed.missing)
    return Parsed(ParseStatus.REPAIRED if parsed.status is ParseStatus.VALID else parsed.status,
                  value, (*parsed.fixes, "repaired:sanitized"), parsed.completeness,
                  parsed.conforms, parsed.error, parsed.missing)


def _json_safe(value: Any, depth: int = 0) -> Any:
    if depth > 256:
        raise TypeError("nested deeper than 254 levels")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    if isinstance(value, bool) or value is None or isinstance(value, float):
        return value
    if isinstance(value, int):
        return value if -(1 << 63) <= value < (1 << 64) else float(value)
    if isinstance(value, dict):
        return {_json_safe(k, depth + 1): _json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v, depth + 1) for v in value]
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def _completeness(value: Any, plan: OutputPlan) -> tuple[float, tuple[str, ...]]:
    if not plan.expected or not isinstance(value, dict):
        return 1.0, ()
    missing = tuple(k for k in plan.expected if _blank(value.get(k)))
    return 1.0 - len(missing) / len(plan.expected), missing


def _completeness_after(value: Any, plan: OutputPlan, completeness: float,
                        missing: tuple[str, ...], refilled: list[str]) -> tuple[
                            float, tuple[str, ...]]:
    extra = tuple(k for k in refilled if k in plan.expected and k not in missing)
    if not extra:
        return completeness, missing
    missing = missing + extra
    return 1.0 - len(missing) / len(plan.expected), missing


def _fill(value: dict[str, Any], plan: OutputPlan, fixes: Fixes,
          filled: set[str]) -> dict[str, Any]:
    out = value
    for k, fallback in plan.fallback.items():
        current = value.get(k, _MISSING)
        if current is _MISSING or current is None or (k in plan.required and _blank(current)):
            if out is value:
                out = dict(value)
            out[k] = copy.deepcopy(fallback)
            filled.add(k)
            fixes.fill(f"fallback:{k}")
    return out


def _violation(value: Any, plan: OutputPlan, filled: set[str]) -> str | None:
    """Why ``value`` breaks the rule; fields filled from fallbacks are the user's own
    answer and are not judged."""
    if isinstance(value, dict):
        absent = [k for k in plan.required if k not in filled and _blank(value.get(k))]
        if absent:
            return f"missing required field(s) {absent} and no fallback value"
    if plan.is_valid is not None and not plan.is_valid(value):
        assert plan.errors is not None
        for where, message in plan.errors(value):
            if where and where[0] in filled:
                continue
            place = ".".join(str(p) for p in where) or "$"
            return _short(f"{place}: {message}")
    return None


def _short(error: str) -> str:
    """An error message of bounded length (jsonschema quotes the offending value)."""
    return error if len(error) <= 500 else error[:500] + "..."


def _fill_invalid(value: dict[str, Any], plan: OutputPlan, fixes: Fixes,
                  filled: set[str]) -> tuple[dict[str, Any], list[str]]:
    """Replace top-level fields that still violate the schema by their fallback."""
    if plan.errors is None or not plan.fallback:
        return value, []
    bad = {where[0] for where, _ in plan.errors(value)
           if where and where[0] in plan.fallback and where[0] not in filled}
    if not bad:
        return value, []
    out = dict(value)
    for k in sorted(bad):
        out[k] = copy.deepcopy(plan.fallback[k])
        fixes.fill(f"fallback:{k}(invalid)")
    return out, sorted(bad)


def _model_check(value: Any, plan: OutputPlan, fixes: Fixes,
                 filled: set[str]) -> tuple[Any, str | None]:
    from pydantic import ValidationError

    try:
        inst = plan.model.model_validate(value)
    except ValidationError as exc:
        errors = [e for e in exc.errors() if not (e["loc"] and e["loc"][0] in filled)]
        if not errors:
            return value, None  # only fallbacks break the model: they are delivered
        err = errors[0]
        place = ".".join(str(p) for p in err["loc"]) or "$"
        return value, _short(f"{place}: {err['msg']}")
    dumped = inst.model_dump(mode="json", by_alias=True)
    if isinstance(value, dict) and isinstance(dumped, dict) and any(
            k in dumped and dumped[k] != v for k, v in value.items()):
        fixes.coerce("coerced:model")
    return dumped, None


__all__ = ["INTERNAL", "MAX_REPAIR", "MAX_SEARCH", "USABLE", "ParseStatus", "Parsed",
           "parse_output"]
