"""One grammar for every duration lockgate reads: command-line flags (``--older-than``,
``--lease``, ``--grace``, ``--timeout``, ``--duration``, ``--deadline``) and the config
file (every setting whose name ends in ``_s``).

A duration is a plain number of seconds (``90``, ``1.5``), or one or more parts of a
number and a unit, largest first: ``250ms``, ``45s``, ``90m``, ``1h30m``, ``1.5h``,
``30d``, ``2w``, ``1d12h``. Spaces between parts are allowed; the units are ``ms``,
``s``, ``m``, ``h``, ``d`` and ``w``. ``S``, ``H``, ``D`` and ``W`` may be written in
upper case; ``m`` and ``ms`` may not: ``1M`` reads as a month as readily as a minute
(months are not a unit), so an upper-case ``M`` is refused, as are ISO 8601 durations
(``PT5M``; ``P1M`` is a month). A duration has no sign (``--deadline +90m``
means "90m from now", read by :func:`lockgate.flow.window.parse_when`).
"""

from __future__ import annotations

import math
import re
from typing import Any

from lockgate.errors import SpecError

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_ORDER = ["w", "d", "h", "m", "s", "ms"]
_PART = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|s|m|h|d|w)", re.IGNORECASE)
_ISO = re.compile(r"\s*PT?\d", re.IGNORECASE)
_NUMBER = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*")
EXAMPLES = "e.g. 45s, 90m, 1h30m, 1.5h or 30d (a plain number is seconds)"
#: The longest duration read (100 years): beyond it no time or date can be computed
#: from it, and a database column of milliseconds would overflow long before.
MAX_SECONDS = 100 * 365.25 * 86400.0


class DurationRangeError(SpecError):
    """A duration in the grammar whose value is refused: negative, zero where it must
    be longer, or over :data:`MAX_SECONDS`; ``why`` says which ("must not be
    negative", ...)."""

    def __init__(self, message: str | None = None, *, field: str | None = None,
                 line: int | None = None, why: str = "") -> None:
        super().__init__(message, field=field, line=line)
        self.why = why


def _out_of_range(shown: str, why: str, field: str | None) -> DurationRangeError:
    return DurationRangeError(f"{shown} is not a duration: it {why}", field=field, why=why)


def parse_duration(value: str | float, *, field: str | None = None,
                   allow_zero: bool = True) -> float:
    """Seconds in ``value`` (see the module docstring). Raises :class:`SpecError` naming
    ``field`` for anything else, a negative duration, one over :data:`MAX_SECONDS`, or
    zero unless ``allow_zero`` (:class:`DurationRangeError` for these three). Numbers
    take the same checks as text: ``inf``, ``nan`` and ``1e300`` are refused."""
    if isinstance(value, bool):
        raise SpecError(f"{value!r} is not a duration; {EXAMPLES}", field=field)
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:  # an int beyond a float: over any bound
            seconds = math.inf if value > 0 else -math.inf
    else:
        seconds = _parse_text(value, field)
    shown = _shown(value)
    if math.isnan(seconds):
        raise SpecError(f"{shown} is not a duration; {EXAMPLES}", field=field)
    if seconds < 0:
        raise _out_of_range(shown, "must not be negative", field)
    if seconds > MAX_SECONDS:  # inf too, and 400 digits (a float overflows to inf)
        raise _out_of_range(shown, "must be at most 100 years", field)
    if seconds == 0 and not allow_zero:
        raise _out_of_range(shown, "must be longer than zero", field)
    return seconds


def _shown(value: str | float) -> str:
    """``value`` as a message quotes it, a long one cut in the middle."""
    if isinstance(value, int) and value.bit_length() > 128:  # repr may refuse it
        return f"an integer of {value.bit_length():,} bits"
    text = repr(value)
    if len(text) <= 40:
        return text
    return f"{text[:24]}...{text[-8:]} ({len(str(value)):,} characters)"


def _parse_text(text: str, field: str | None) -> float:
    if text.strip().startswith("-"):
        # (a DurationRangeError: a caller that reads a duration among other forms, as
        # --deadline does, then says why it is refused)
        raise _out_of_range(repr(text), "must not be negative", field)
    if text.strip().startswith("+"):  # a sign, refused whatever follows it
        raise SpecError(f"{text!r} is not a duration: write it without '+'; {EXAMPLES}",
                        field=field)
    if _NUMBER.fullmatch(text):
        return float(text)
    if _ISO.match(text):  # P1M is a month, PT1M a minute: neither is read
        raise SpecError(f"{text!r} is not a duration: ISO 8601 durations (PT5M) are not "
                        f"read; {EXAMPLES}", field=field)
    total, pos, last = 0.0, 0, -1
    for m in _PART.finditer(text):
        if m.start() != pos:
            break
        written = m.group(2)
        if "M" in written:  # 1M: a minute or a month? 1MS: megaseconds?
            raise SpecError(f"{text!r}: M is ambiguous (m is minutes, ms milliseconds; "
                            "months are not a unit: write 30d)", field=field)
        if written == "mS":
            raise SpecError(f"{text!r}: write milliseconds as ms", field=field)
        unit = written.lower()
        rank = _ORDER.index(unit)
        if rank <= last:
            raise SpecError(f"{text!r}: put the larger units first, each once ({EXAMPLES})",
                            field=field)
        last = rank
        total += float(m.group(1)) * _UNITS[unit]
        pos = m.end()
    if pos == 0 or text[pos:].strip():
        raise SpecError(f"{text!r} is not a duration; {EXAMPLES}", field=field)
    return total


def duration_field(value: Any) -> Any:
    """A pydantic ``BeforeValidator`` for settings in seconds: strings in the duration
    grammar and numbers take the same checks (:func:`parse_duration`: finite, not
    negative, at most 100 years) and become seconds; the field's own bounds apply
    after. ``true`` and ``false`` are refused (pydantic would take them for 1 and 0)."""
    if isinstance(value, bool):
        raise ValueError(f"{str(value).lower()} is not a duration; {EXAMPLES}")
    if isinstance(value, str | int | float):
        try:
            seconds = parse_duration(value)
        except SpecError as exc:
            raise ValueError(exc.reason) from None
        return value if isinstance(value, int | float) else seconds  # as written: `0`
    return value


def format_duration(seconds: float) -> str:
    """Seconds in the grammar's shortest exact form (``5400`` -> ``1h30m``)."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    out, rest = [], round(seconds, 3)
    for unit in ("d", "h", "m"):
        n = int(rest // _UNITS[unit])
        if n:
            out.append(f"{n}{unit}")
            rest -= n * _UNITS[unit]
    if rest or not out:
        out.append(f"{rest:g}s")
    return "".join(out)
