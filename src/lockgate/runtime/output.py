"""Output parsing and validation against the delivery rule."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import orjson

from lockgate.spec import DeliveryRule


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


def parse_output(raw: str, rule: DeliveryRule) -> Parsed:
    """Parse a raw model output under a delivery rule."""
    if rule.format == "text":
        return Parsed(ParseStatus.VALID, raw)
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        status = ParseStatus.INVALID_JSON if "{" in raw or "[" in raw else \
            ParseStatus.NO_JSON_FOUND
        return Parsed(status, None, completeness=0.0, conforms=False, error=str(exc))
    required = rule.required_keys
    if not isinstance(value, dict):
        if required:
            return Parsed(ParseStatus.SCHEMA_VIOLATION, value, completeness=0.0,
                          conforms=False, error="expected a JSON object")
        return Parsed(ParseStatus.VALID, value)
    present = [k for k in required if value.get(k) not in (None, "")]
    completeness = len(present) / len(required) if required else 1.0
    missing = tuple(k for k in required if k not in present)
    if not missing:
        return Parsed(ParseStatus.VALID, value, completeness=completeness)
    if all(k in rule.fallback_values for k in missing):
        filled = dict(value)
        for k in missing:
            filled[k] = rule.fallback_values[k]
        return Parsed(ParseStatus.FILLED_FALLBACK, filled,
                      fixes=tuple(f"fallback:{k}" for k in missing),
                      completeness=completeness, missing=missing)
    return Parsed(ParseStatus.SCHEMA_VIOLATION, value, completeness=completeness,
                  conforms=False, error=f"missing required key(s): {list(missing)}",
                  missing=missing)
