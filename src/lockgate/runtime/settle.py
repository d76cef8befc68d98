"""Settling a value read from the output (steps 4-9 of the ladder in :mod:`.output`):
the answer unwrapped (:mod:`.unwrap`), fields the output was cut off in dropped, names
and types conformed, fallbacks filled, the schema and model checked, the value made
storable as JSON. Also the outcome (:class:`ParseStatus`, :class:`Parsed`) and the fast
check of a strict reply that needs none of this.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import Any

import orjson

from lockgate.errors import ErrorClass
from lockgate.runtime.conform import Fixes, conform, json_type
from lockgate.runtime.scan import Path, Region
from lockgate.runtime.schema import Node, OutputPlan, blank, takes_fallback, unanswered
from lockgate.runtime.unwrap import declares, unwrap


class ParseStatus(StrEnum):
    """How an output was obtained (usable) or why it is not (unusable)."""

    VALID = "valid"
    REPAIRED = "repaired"
    COERCED = "coerced"
    FILLED_FALLBACK = "filled_fallback"
    INVALID_JSON = "invalid_json"
    NO_JSON_FOUND = "no_json_found"
    SCHEMA_VIOLATION = "schema_violation"
    #: The provider reported the answer cut off at max_tokens (finish_reason "length")
    #: and it was not complete before the cut (:mod:`.finish`).
    TRUNCATED = "truncated"


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


def unusable(status: ParseStatus, plan: OutputPlan, error: str,
             fixes: tuple[str, ...] = ()) -> Parsed:
    return Parsed(status, None, fixes, completeness=0.0, conforms=False, error=error,
                  missing=plan.expected)


#: Bytes mapped so that a number's exponent reads ``1e1`` or ``1e2`` (digits to ``1``,
#: signs to ``2``, ``E`` to ``e``, all else to a space): a JSON float is written with a
#: fraction (``.``) or an exponent.
_EXPONENT_MAP = bytes(49 if 48 <= i <= 57 else 50 if i in (43, 45) else
                      101 if i in (69, 101) else 32 for i in range(256))
_EXPONENT = re.compile(rb"1e[12]")


def _floatish(raw: str) -> bool:
    """Whether ``raw`` may hold a float: a ``.``, or a digit, ``e`` or ``E`` and a digit
    or sign (on the text's bytes mapped by :data:`_EXPONENT_MAP`, which a pattern with a
    literal start finds fast: a pattern on the text itself costs more than the walk it
    spares)."""
    return "." in raw or _EXPONENT.search(
        raw.encode("utf-8", "surrogatepass").translate(_EXPONENT_MAP)) is not None


def _may_look(raw: str | None, plan: OutputPlan) -> bool:
    """Whether the value read from ``raw`` may hold a null to drop or an integral float
    to convert (:func:`_needs_conform`): only when ``raw`` holds ``null`` or a number's
    fraction or exponent (or is not given)."""
    return plan.needs_look and (raw is None or (plan.look_null and "null" in raw) or (
        plan.look_int and _floatish(raw)))


def fast_ok(value: Any, plan: OutputPlan, raw: str | None = None) -> bool:
    """Whether ``value`` (read as strict JSON from ``raw``, when given) is delivered as
    it stands: nothing to rename, convert, drop or fill."""
    if plan.expect == "object":
        if not isinstance(value, dict):
            return False
        props = plan.root.props
        for k in plan.required:
            if unanswered(value, k, props.get(k)):
                return False
        for k in plan.fallback:
            if takes_fallback(value, k, plan):
                return False
        if plan.fields and all(blank(value.get(k)) for k in plan.fields):
            return False
        if not _keys_known(value, plan.root):
            return False
        if _may_look(raw, plan) and _needs_conform(value, plan.root):
            return False
    elif plan.expect == "array" and (not isinstance(value, list) or (
            _may_look(raw, plan) and _needs_conform(value, plan.root))):
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


def _needs_conform(value: Any, node: Node) -> bool:
    """Whether ``value`` holds a float with no fraction where an integer is declared,
    or a null in an optional field that refuses null (walked without recursion, only
    where the schema has such places: :attr:`.Node.deep`)."""
    stack: list[tuple[Any, Node]] = [(value, node)]
    while stack:
        v, n = stack.pop()
        if isinstance(v, dict):
            for k in n.no_null:
                if k in v and v[k] is None:
                    return True
            stack.extend((v[k], c) for k, c in n.props.items() if c.deep and k in v)
        elif isinstance(v, float):
            if n.integer_only and v.is_integer():
                return True
        elif isinstance(v, list) and n.items is not None and n.items.deep:
            stack.extend((item, n.items) for item in v)
    return False


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


def finish(value: Any, plan: OutputPlan, fixes: Fixes, *, repaired: bool,
           cut: Region | None = None) -> Parsed:
    """Steps 4-9 on a value read from the output (``cut``: the region it was cut
    back from)."""
    read = value
    value, where = unwrap(value, plan, fixes)
    if cut is not None and ((isinstance(value, list) and plan.expect != "object")
                            or (isinstance(read, list) and isinstance(value, dict)
                                and not where)) and where in cut.open_paths:
        # The answer is a list the output was cut off in: never delivered in part (as a
        # list field, which is dropped).
        fixes.repair(f"truncated:{_place(where, ()) if where else '$'}")
        return Parsed(ParseStatus.SCHEMA_VIOLATION, None, fixes.labels(), completeness=0.0,
                      conforms=False, missing=plan.expected,
                      error="the output was cut off inside the list that is the answer "
                      "(a cut list is never delivered in part; raise max_tokens)")
    value = _drop_cut(value, where, cut, fixes)
    nothing = ParseStatus.INVALID_JSON if repaired else ParseStatus.SCHEMA_VIOLATION
    if repaired and plan.known and not declares(value, plan):
        # A repair that recovers none of the expected fields is no recovery.
        return unusable(ParseStatus.INVALID_JSON, plan, _cut(
            "the output holds JSON-like text that could not be repaired into the "
            "expected fields", fixes), fixes.labels())
    if plan.expect is not None and json_type(value) != plan.expect:
        return Parsed(nothing, value, fixes.labels(), completeness=0.0, conforms=False,
                      error=f"expected a JSON {plan.expect}, got {json_type(value)}",
                      missing=plan.expected)
    value = conform(value, plan.root, fixes)
    completeness, missing = _completeness(value, plan)
    own = value
    too_large = _too_large(value)
    filled: set[str] = set()
    if isinstance(value, dict):
        value = _fill(value, plan, fixes, filled)
    error = too_large or _violation(value, plan, filled)
    if error is not None and isinstance(value, dict):
        value, refilled = _fill_invalid(value, plan, fixes, filled)
        if refilled:
            filled.update(refilled)
            error = _violation(value, plan, filled)
            completeness, missing = _completeness_after(value, plan, completeness, missing,
                                                        refilled)
    if plan.expect == "object" and plan.fields and isinstance(own, dict) and not any(
            k in own and k not in filled and not blank(own[k]) for k in plan.fields):
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
    return deliverable(Parsed(status, value, fixes.labels(), completeness=completeness,
                              missing=missing))


def _cut(error: str, fixes: Fixes) -> str:
    if "truncated" in fixes.applied:
        return f"{error} (the output was cut off inside its JSON)"
    return error


def deliverable(parsed: Parsed) -> Parsed:
    """The parsed output if its value can be stored as JSON: integers beyond 64 bits
    become floats (as ``orjson`` reads them; :func:`finish` refuses those no float
    holds exactly, :func:`_too_large`), stray surrogates U+FFFD; nesting deeper than
    ``orjson`` writes (254 levels) makes it unusable."""
    try:
        # orjson writes inf and nan as null: a null in the text asks for a look.
        if b"null" not in orjson.dumps(parsed.value) or _finite(parsed.value):
            return parsed
        return Parsed(ParseStatus.SCHEMA_VIOLATION, None, parsed.fixes, completeness=0.0,
                      conforms=False, error="the output holds a number JSON cannot hold "
                      "(infinite or not a number, e.g. 1e999)", missing=parsed.missing)
    except TypeError:
        pass
    try:
        value = _json_safe(parsed.value)
        orjson.dumps(value)
    except (TypeError, RecursionError, OverflowError) as exc:
        return Parsed(ParseStatus.INVALID_JSON, None, parsed.fixes, completeness=0.0,
                      conforms=False, error=f"the value cannot be written as JSON: {exc}",
                      missing=parsed.missing)
    return Parsed(ParseStatus.REPAIRED if parsed.status is ParseStatus.VALID else parsed.status,
                  value, (*parsed.fixes, "repaired:sanitized"), parsed.completeness,
                  parsed.conforms, parsed.error, parsed.missing)


def _finite(value: Any, depth: int = 0) -> bool:
    """Whether no float in ``value`` is infinite or NaN."""
    if isinstance(value, float):
        return math.isfinite(value)
    if depth > 256:
        return True  # orjson refuses it anyway
    if isinstance(value, dict):
        return all(_finite(v, depth + 1) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v, depth + 1) for v in value)
    return True


def _json_safe(value: Any, depth: int = 0) -> Any:
    if depth > 256:
        raise TypeError("nested deeper than 254 levels")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise TypeError(f"{value} is no JSON number")
        return value
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        if _MIN_INT <= value <= _MAX_INT:
            return value
        try:  # (one the float holds exactly: finish refuses the others, _too_large)
            return float(value)
        except OverflowError:
            raise TypeError("an integer too large for a JSON number") from None
    if isinstance(value, dict):
        return {_json_safe(k, depth + 1): _json_safe(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v, depth + 1) for v in value]
    raise TypeError(f"not a JSON value: {type(value).__name__}")


#: The integers a JSON value is stored with exactly (as ``orjson`` reads and writes
#: them: signed 64 bits and unsigned 64 bits).
_MIN_INT, _MAX_INT = -(1 << 63), (1 << 64) - 1


def _too_large(value: Any) -> str | None:
    """Why ``value`` cannot be stored as read: an integer beyond 64 bits (read by a
    Python literal or the repair, where strict JSON would read a float) that no float
    is exactly, naming its field; None when there is none. It is refused
    (``schema_violation``) rather than delivered as an approximating float
    (``123456789012345678901234567890`` is not ``1.2345678901234568e+29``); one whose
    float's shortest form is the number written (``10**30``, ``1e+30``) is stored as
    that float (:func:`deliverable`), as strict JSON reads it. Walked without
    recursion."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        v, path = stack.pop()
        if isinstance(v, int) and not isinstance(v, bool):
            if not _MIN_INT <= v <= _MAX_INT and not _float_exact(v):
                shown = str(v) if v.bit_length() <= 256 else f"{v.bit_length()} bits"
                return (f"{path or '$'} holds an integer beyond 64 bits ({shown}), which "
                        "could only be stored as an approximating float; declare the "
                        "field a string to keep such numbers as written")
        elif isinstance(v, dict):
            stack.extend((c, f"{path}.{k}" if path else str(k)) for k, c in v.items())
        elif isinstance(v, list):
            stack.extend((c, f"{path}[{i}]") for i, c in enumerate(v))
    return None


def _float_exact(number: int) -> bool:
    """Whether the float nearest ``number`` is written exactly as ``number`` (its
    shortest form: ``10**30`` is ``1e+30``; ``10**30 + 1`` is not)."""
    try:
        return Decimal(repr(float(number))) == number
    except OverflowError:
        return False


def _completeness(value: Any, plan: OutputPlan) -> tuple[float, tuple[str, ...]]:
    if not plan.expected or not isinstance(value, dict):
        return 1.0, ()
    props = plan.root.props
    missing = tuple(k for k in plan.expected if unanswered(value, k, props.get(k)))
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
        if takes_fallback(value, k, plan):
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
        props = plan.root.props
        absent = [k for k in plan.required
                  if k not in filled and unanswered(value, k, props.get(k))]
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
