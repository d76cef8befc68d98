"""Finding the JSON in a model's reply: code fences, surrounding chatter, repair.

Models wrap their JSON in Markdown fences, precede it with "Sure! Here is ...",
follow it with notes, or stop mid-object at ``max_tokens``. Three tools, used in this
order by the ladder in :mod:`lockgate.runtime.output`:

* :func:`fenced_blocks` - the bodies of Markdown code fences (an unterminated fence
  runs to the end, as in a truncated reply);
* :func:`complete_values` - every complete, strictly valid JSON object (or array)
  in the text, found by a bracket scan that respects strings and escapes, tried at
  each opening bracket so that a stray brace in the chatter cannot hide the real one;
* :func:`repair` - ``json_repair`` on a region that starts at the first opening
  bracket (closing truncated strings and brackets, trailing commas, single quotes,
  unquoted keys, comments, Python literals).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n?(.*?)(?:```|\Z)", re.S)
_STRUCT = re.compile(r'[{}\[\]"\\]')
_JSON_LANGS = frozenset({"", "json", "jsonc", "json5", "javascript", "js"})
_MAX_STARTS = 64
_MAX_CANDIDATES = 16


@dataclass(frozen=True, slots=True)
class Found:
    """A complete JSON value found in a text, with its span."""

    value: Any
    start: int
    end: int


def fenced_blocks(text: str) -> list[str]:
    """Bodies of Markdown code fences that may hold JSON, in order."""
    if "```" not in text:
        return []
    return [m.group(2) for m in _FENCE.finditer(text)
            if m.group(1).lower() in _JSON_LANGS and m.group(2).strip()]


def _match_end(text: str, start: int) -> int | None:
    """End (exclusive) of the bracketed value opening at ``start``, or None."""
    stack: list[str] = []
    in_string = False
    skip_until = -1
    for m in _STRUCT.finditer(text, start):
        i = m.start()
        if i < skip_until:
            continue
        c = m.group()
        if in_string:
            if c == "\\":
                skip_until = i + 2
            elif c == '"':
                in_string = False
            continue
        if c == '"':
            in_string = True
        elif c in "{[":
            stack.append("}" if c == "{" else "]")
        elif c in "}]":
            if not stack or stack.pop() != c:
                return None
            if not stack:
                return i + 1
    return None


def complete_values(text: str, openers: str = "{[") -> list[Found]:
    """Every complete, strictly valid JSON value opening with one of ``openers``."""
    found: list[Found] = []
    pos = 0
    starts = 0
    n = len(text)
    while pos < n and starts < _MAX_STARTS and len(found) < _MAX_CANDIDATES:
        start = min((i for i in (text.find(o, pos) for o in openers) if i >= 0), default=-1)
        if start < 0:
            break
        starts += 1
        end = _match_end(text, start)
        if end is not None:
            try:
                value = orjson.loads(text[start:end])
            except orjson.JSONDecodeError:
                pass
            else:
                found.append(Found(value, start, end))
                pos = end
                continue
        pos = start + 1
    return found


def first_opener(text: str, openers: str = "{[") -> int:
    """Index of the first opening bracket, or -1."""
    return min((i for i in (text.find(o) for o in openers) if i >= 0), default=-1)


_PYTHONISH = re.compile(r"'|\b(?:True|False|None)\b")


def python_literal(text: str) -> Any:
    """A Python dict/list literal (single quotes, ``True``/``None``), parsed safely.

    Models that think in Python write ``{'label': 'x', 'ok': True}``; ``ast.literal_eval``
    reads it exactly and far faster than a general repair. Only literals are
    evaluated, never code. ``None`` when the text is not such a literal."""
    import ast

    stripped = text.strip()
    if not stripped or stripped[0] not in "{[" or len(stripped) > 100_000 \
            or not _PYTHONISH.search(stripped):
        return None
    try:
        value = ast.literal_eval(stripped)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if not isinstance(value, dict | list):
        return None
    try:  # only JSON-representable values (no tuples, sets, bytes or complex numbers)
        return orjson.loads(orjson.dumps(value))
    except (TypeError, orjson.JSONEncodeError):
        return None


def repair(text: str) -> Any:
    """``json_repair`` on ``text``; ``None`` when nothing JSON-like comes out."""
    import json_repair

    try:
        value = json_repair.repair_json(text, return_objects=True, skip_json_loads=True)
    except (ValueError, RecursionError, IndexError, KeyError, TypeError):
        return None
    if isinstance(value, dict | list):
        return value
    return None
