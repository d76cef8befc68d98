"""Reading the JSON in a model's reply: code fences, Python literals, repair.

Models wrap their JSON in Markdown fences, precede it with "Sure! Here is ...",
follow it with notes, or stop mid-object at ``max_tokens``. The ladder in
:mod:`lockgate.runtime.output` finds the regions with :mod:`.scan` and reads them with:

* :func:`fenced_blocks` - the bodies of Markdown code fences (an unterminated fence
  runs to the end, as in a truncated reply);
* :func:`python_literal` - ``{'a': True, 'b': None}`` read exactly;
* :func:`repair` - ``json_repair`` on one region (trailing commas, single quotes,
  unquoted keys, comments, unescaped inner quotes, missing brackets).
"""

from __future__ import annotations

import re
from typing import Any

import orjson

# A fence opens at the start of a line (so a "```" inside a JSON string is no fence);
# an unterminated one runs to the end.
_FENCE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+.-]*)[^\n{\[]*\n?(.*?)(?:```|\Z)",
                    re.S | re.M)
_JSON_LANGS = frozenset({"", "json", "jsonc", "json5", "javascript", "js"})


def fenced_blocks(text: str) -> list[str]:
    """Bodies of Markdown code fences that may hold JSON (that begin with a bracket),
    in order."""
    if "```" not in text:
        return []
    return [m.group(2) for m in _FENCE.finditer(text)
            if m.group(1).lower() in _JSON_LANGS and m.group(2).lstrip()[:1] in ("{", "[")]


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
