"""Output parsing, repair and validation against the delivery rule (SPEC R4, F1).

The ladder, cheapest first; each step runs only when the previous ones did not give a
valid output:

1. **strict** - ``orjson.loads`` of the whole reply. A reply that is valid and already
   conforms returns here (the fast path: no further work).
2. **extract** - the body of a Markdown code fence, else the complete JSON object
   (or array) in the surrounding chatter that best matches the expected fields.
3. **repair** - ``json_repair`` on the fenced body or on the text from the first
   opening bracket: truncated output, trailing commas, single quotes, unquoted keys,
   comments, Python literals. A repair that recovers none of the expected fields is
   no recovery (``invalid_json``).
4. **field names** - alias map, then close misspellings (:mod:`.conform`).
5. **types** - coercion to the declared schema (:mod:`.conform`).
6. **fallback** - missing (absent, null, or blank where required) fields filled from
   ``delivery_rule.fallback_values``; so are fields whose value still violates the
   schema, when a fallback exists for them. A declared fallback is the user's answer,
   whatever it is (``""`` and ``null`` included): it is never judged against the
   schema or the pydantic model.
7. **validate** - JSON Schema and/or the pydantic model of the rule; and at least one
   declared field must hold a non-blank value the model gave (an object made only of
   fallbacks is not an answer).

The status names the strongest step that was needed: ``valid`` (none),
``repaired`` (2-4), ``coerced`` (5), ``filled_fallback`` (6); or why the output is not
usable: ``no_json_found`` (nothing JSON-like), ``invalid_json`` (JSON-like but not
recoverable), ``schema_violation`` (JSON, but not the declared shape). Completeness is
measured on what the model produced, before any fallback.

``parse_output`` never raises on any text: only a broken delivery rule raises
(``SpecError``). Lone surrogates become U+FFFD, and a value ``orjson`` cannot write
(nested deeper than 254 levels) makes the output unusable.
"""

from __future__ import annotations

import copy
import logging
import re
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson

from lockgate.errors import ErrorClass
from lockgate.runtime.conform import Fixes, conform, json_type
from lockgate.runtime.extract import (
    Found,
    complete_values,
    fenced_blocks,
    first_opener,
    python_literal,
    repair,
)
from lockgate.runtime.names import closest, fold
from lockgate.runtime.schema import Node, OutputPlan, output_plan
from lockgate.spec import DeliveryRule

log = logging.getLogger("lockgate.runtime")

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
        value = _MISSING
    if value is not _MISSING:
        if isinstance(value, str) and any(c in value for c in "{["):
            # JSON text inside a JSON string: the answer encoded twice, or chatter that
            # happens to be quoted. Where no shape is expected, a string stays a string
            # unless an object or array is found in it as it stands (not repaired).
            found = Fixes()
            inner = _recover(value, plan, found)
            if isinstance(inner, dict | list) and (plan.expect is not None or not any(
                    f.startswith("repaired:") for f in found.applied)):
                for label in found.applied:
                    fixes.repair(label)
                fixes.repair("decoded:string")
                value = inner
        if not fixes.applied and _fast_ok(value, plan):
            return _deliverable(Parsed(ParseStatus.VALID, value))
    else:
        value = _recover(raw, plan, fixes)
        if isinstance(value, Parsed):
            return value
    return _finish(value, plan, fixes)


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


def _recover(text: str, plan: OutputPlan, fixes: Fixes) -> Any:
    """Steps 2-3: extract from fences or chatter, else repair. Parsed on failure."""
    openers = "[" if plan.expect == "array" else "{" if plan.expect == "object" else "{["
    if plan.expect == "array" and "{" in text and "[" not in text:
        openers = "{"
    if "</think>" in text:
        # Reasoning models put their scratch work first; it may hold braces of its own.
        thought = _strip_thinking(text)
        if thought is not None:
            inner = Fixes()
            value = _recover(thought, plan, inner)
            if not isinstance(value, Parsed):
                fixes.repair("stripped:think")
                for label in inner.applied:
                    fixes.repair(label)
                return value
    blocks = fenced_blocks(text)
    for block in blocks:
        try:
            value = orjson.loads(block)
        except orjson.JSONDecodeError:
            continue
        if isinstance(value, dict | list):
            fixes.repair("extracted:fence")
            return value
    start = first_opener(text, openers)
    best = _best(complete_values(text, openers), plan) if start >= 0 else None
    best_score = _score(best.value, plan) if best is not None else (0, 0)
    usable_best = best is not None and (not plan.known or best_score[1] > 0)
    if best is not None and usable_best and best.start == start:
        # The first opening bracket starts a complete value: no broken outer object.
        fixes.repair("extracted:chatter")
        return best.value
    regions = [b for b in blocks if first_opener(b, openers) >= 0]
    if start >= 0:
        close = text.rfind("]" if openers == "[" else "}")
        if close > start:
            regions.append(text[start:close + 1])
        regions.append(text[start:])
    fixed = _repair_regions(list(dict.fromkeys(r.strip() for r in regions)), plan,
                            best_score if usable_best else None)
    if fixed is not None:
        fixes.repair(fixed[1])
        return fixed[0]
    if best is not None and usable_best:
        fixes.repair("extracted:chatter")
        return best.value
    if start < 0 and not _ARRAY_START.search(text):
        return Parsed(ParseStatus.NO_JSON_FOUND, None, completeness=0.0, conforms=False,
                      error="no JSON object or array in the output", missing=plan.expected)
    return Parsed(ParseStatus.INVALID_JSON, None, completeness=0.0, conforms=False,
                  error="the output holds JSON-like text that could not be repaired "
                        "into the expected fields", missing=plan.expected)


def _repair_regions(regions: list[str], plan: OutputPlan,
                    to_beat: tuple[int, int] | None) -> tuple[Any, str] | None:
    """Step 3 on candidate regions: a Python literal, else ``json_repair``; the value
    and its fix label, when it recovers expected fields (and beats ``to_beat``)."""
    if not regions:
        return None
    literal = python_literal(regions[0])
    if literal is not None and (not plan.known or _score(literal, plan)[1] > 0):
        return literal, "repaired:python"
    repaired = [v for v in (repair(r) for r in regions) if v is not None]
    pick = _best([Found(v, 0, _size(v)) for v in _flatten(repaired, plan)], plan)
    if pick is None:
        return None
    score = _score(pick.value, plan)
    if (plan.known and score[1] == 0) or (to_beat is not None and score <= to_beat):
        return None
    return pick.value, "repaired:json"


def _size(value: Any) -> int:
    try:
        return len(orjson.dumps(value))
    except TypeError:  # a lone surrogate from an escape, an integer beyond 64 bits
        return 0


def _strip_thinking(text: str) -> str | None:
    """The reply after a leading reasoning block (``<think>...</think>``), if any."""
    end = text.find("</think>")
    head = text[:end]
    if head.lstrip().startswith("<think>") or first_opener(head) < 0:
        return text[end + len("</think>"):]
    return None


# "[" that may open an array of objects (or a cut-off one), not a citation like "[1]".
_ARRAY_START = re.compile(r"\[\s*(?:\{|$)")


def _flatten(values: list[Any], plan: OutputPlan) -> list[Any]:
    out: list[Any] = []
    for v in values:
        out.append(v)
        if plan.expect == "object" and isinstance(v, list):
            out.extend(x for x in v if isinstance(x, dict))
    return out


def _score(value: Any, plan: OutputPlan) -> tuple[int, int]:
    shape = 1 if plan.expect is None or json_type(value) == plan.expect else 0
    if isinstance(value, dict) and plan.known:
        props = list(plan.root.props)
        hits = sum(1 for k in value if fold(k) in plan.known or closest(k, props) is not None)
        return shape, hits
    return shape, 0


def _best(found: list[Found], plan: OutputPlan) -> Found | None:
    if not found:
        return None
    return max(found, key=lambda f: (*_score(f.value, plan), f.end - f.start, -f.start))


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


def _unwrap(value: Any, plan: OutputPlan, fixes: Fixes) -> Any:
    if plan.expect == "object" and isinstance(value, list):
        dicts = [v for v in value if isinstance(v, dict)]
        if len(dicts) == 1 and len(value) == 1:
            fixes.repair("unwrapped:array")
            return dicts[0]
    if plan.expect == "object" and isinstance(value, dict) and len(value) == 1 \
            and _score(value, plan)[1] == 0:
        (inner,) = value.values()
        if isinstance(inner, dict) and _score(inner, plan)[1] > 0:
            fixes.repair("unwrapped:object")
            return inner
    if plan.expect == "array" and isinstance(value, dict) and len(value) == 1:
        (inner,) = value.values()
        if isinstance(inner, list):
            fixes.repair("unwrapped:object")
            return inner
    return value


def _finish(value: Any, plan: OutputPlan, fixes: Fixes) -> Parsed:
    """Steps 4-7 on a parsed value."""
    value = _unwrap(value, plan, fixes)
    if plan.expect is not None and json_type(value) != plan.expect:
        return Parsed(ParseStatus.SCHEMA_VIOLATION, value, fixes.labels(),
                      completeness=0.0, conforms=False,
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
        return Parsed(ParseStatus.SCHEMA_VIOLATION, value, fixes.labels(),
                      completeness=completeness, conforms=False, missing=missing,
                      error=f"no declared field ({', '.join(plan.fields[:8])}) holds a "
                            "value from the output")
    if error is None and plan.model is not None:
        value, error = _model_check(value, plan, fixes, filled)
    if error is not None:
        return Parsed(ParseStatus.SCHEMA_VIOLATION, value, fixes.labels(),
                      completeness=completeness, conforms=False, error=error, missing=missing)
    status = ParseStatus.FILLED_FALLBACK if fixes.filled else ParseStatus.COERCED \
        if fixes.coerced else ParseStatus.REPAIRED if fixes.repaired else ParseStatus.VALID
    return _deliverable(Parsed(status, value, fixes.labels(), completeness=completeness,
                               missing=missing))


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


__all__ = ["INTERNAL", "USABLE", "ParseStatus", "Parsed", "parse_output"]
