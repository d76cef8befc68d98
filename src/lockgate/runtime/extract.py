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
#: A fence closes where ``` begins a line or ends one (a JSON string cannot hold a line
#: break, so ``` inside one is followed by more of its line), or at the end of the text.
_FENCE = re.compile(r"^[ \t]*```[ \t]*([A-Za-z0-9_+.-]*)[^\n{\[]*\n?(.*?)"
                    r"(?:^[ \t]*```|```[ \t]*$|\Z)", re.S | re.M)
_JSON_LANGS = frozenset({"", "json", "jsonc", "json5", "javascript", "js"})


def fenced_blocks(text: str) -> list[str]:
    """Bodies of Markdown code fences that may hold JSON (that begin with a bracket),
    in order."""
    return [body for _start, _end, body in fenced_spans(text)]


def fenced_spans(text: str) -> list[tuple[int, int, str]]:
    """:func:`fenced_blocks` with where each fence starts and ends in ``text``."""
    if "```" not in text:
        return []
    return [(m.start(), m.end(), m.group(2)) for m in _FENCE.finditer(text)
            if m.group(1).lower() in _JSON_LANGS and m.group(2).lstrip()[:1] in ("{", "[")]


_PYTHONISH = re.compile(r"'|\b(?:True|False|None)\b")
#: Escapes JSON reads otherwise than Python: ``\/`` (a slash), a surrogate pair (one
#: character) and Markdown's ``\_`` (read by :func:`repair` as ``_``; Python keeps the
#: backslash). A text with one is JSON with a flaw (an apostrophe in a value, a
#: trailing comma), not a Python literal.
_JSON_ESCAPES = re.compile(r"\\(?:[/_]|u[dD][89abAB])")


def python_literal(text: str) -> Any:
    """A Python dict/list literal (single quotes, ``True``/``None``), parsed safely.

    Models that think in Python write ``{'label': 'x', 'ok': True}``; ``ast.literal_eval``
    reads it exactly and far faster than a general repair. Only literals are
    evaluated, never code. ``None`` when the text is not such a literal."""
    import ast

    stripped = text.strip()
    if not stripped or stripped[0] not in "{[" or len(stripped) > 100_000 \
            or not _PYTHONISH.search(stripped) or _JSON_ESCAPES.search(stripped):
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


#: What may follow the quote that ends a string: a colon, a closing bracket, the end,
#: or a comma and then the start of a key or a value.
_ENDS_STRING = re.compile(
    r"""\s*(?:[:}\]]|\Z|,\s*(?:['"{\[\d\-]|(?:True|False|None|true|false|null)\b|\Z))""")


def escape_apostrophes(text: str) -> str | None:
    """A single-quoted literal with its apostrophes escaped: inside a single-quoted
    string, a quote ends the string only where JSON syntax follows it (a colon, a
    closing bracket, a comma and another key or value); elsewhere (``'don't know'``,
    ``'the users' choice'``) it is an apostrophe. None when there is none."""
    if "'" not in text:
        return None
    out: list[str] = []
    quote = ""  # the quote of the string the walk is in, if any
    changed = False
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if quote and c == "\\":
            out.append(text[i:i + 2])
            i += 2
            continue
        if not quote:
            if c in "'\"":
                quote = c
        elif c == quote:
            if quote == "'" and _ENDS_STRING.match(text, i + 1) is None:
                out.append("\\'")
                changed = True
                i += 1
                continue
            quote = ""
        out.append(c)
        i += 1
    return "".join(out) if changed else None


#: ``\/``, ``\f`` and ``\_`` after an even number of backslashes (so escaped
#: themselves not). ``\_`` is no JSON escape: it is Markdown's (models trained on
#: Markdown write ``"is\_spam"``; LaTeX's means the same), an underscore.
_REPAIR_ESCAPES = re.compile(r"(?<!\\)((?:\\\\)*)\\([/f_])")


def _plain_escape(m: re.Match[str]) -> str:
    return m.group(1) + {"/": "/", "_": "_"}.get(m.group(2), "\\u000c")


#: A JSON string (kept), a comment (dropped) or a comma before a closing bracket
#: (dropped).
_LENIENT = re.compile(r'("(?:[^"\\\n]|\\.)*")|//[^\n]*|/\*(?s:.*?)\*/|,(?=\s*[}\]])')


#: A string (kept), or JavaScript's bare ``undefined`` where a value stands: after a
#: colon, an opening bracket or a comma, before a comma, a closing bracket or the end.
_UNDEFINED = re.compile(r"""("(?:[^"\\]|\\.)*"|'(?:[^'\\\n]|\\.)*')"""
                        r"|(?<=[:\[,])(\s*)undefined(?=\s*(?:[,}\]]|\Z))")


def undefined_as_null(text: str) -> str:
    """``text`` with JavaScript's bare ``undefined`` values as ``null`` (a value not
    given: the rule's handling of a null or missing field applies), never inside a
    string; json_repair would make it the string "undefined"."""
    if "undefined" not in text:
        return text
    return _UNDEFINED.sub(lambda m: m.group(1) or f"{m.group(2)}null", text)


def lenient_json(text: str) -> Any:
    """JSON with the flaws models add most (trailing commas, ``//`` and ``/* */``
    comments, a bare ``undefined``) taken out, read by the strict parser: exact where a
    general repair is not (``json_repair`` drops a string's trailing ``\\n``). ``None``
    when the text is still not strict JSON (or not an object or array)."""
    if "," not in text and "/" not in text and "undefined" not in text:
        return None
    cleaned = _LENIENT.sub(lambda m: m.group(1) or "", undefined_as_null(text))
    if cleaned == text:
        return None
    try:
        value = orjson.loads(cleaned)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict | list) else None


#: A string (double- or single-quoted), skipped when counting bare pairs.
_STRINGS = re.compile(r""""(?:[^"\\]|\\.)*"|'(?:[^'\\\n]|\\.)*'""")
#: An unquoted key followed by an unquoted word value (``label: positive``): json_repair
#: looks ahead to the end of the text for each such value, so its work grows with
#: their count times the text's length. ``true``, ``false``, ``null`` and numbers it
#: reads in linear time: they do not count.
_BARE_PAIR = re.compile(
    r"(?<![\w$])[^\W\d][\w$-]*[ \t]*:[ \t\n]*(?!(?:true|false|null)(?![\w$]))[^\W\d]")
#: Most bare pairs times characters handed to json_repair (about 40 ns a unit: 150 ms).
MAX_BARE_WORK = 4_000_000
#: Shorter texts are never refused (their work is small whatever they hold).
_BARE_FREE = 2048


def repair_cost(text: str) -> int:
    """The work ``json_repair`` would do on ``text`` beyond a linear pass: its bare
    key/value pairs times its length (0 for short texts)."""
    if len(text) <= _BARE_FREE or ":" not in text:
        return 0
    outside = _STRINGS.sub('""', text) if ('"' in text or "'" in text) else text
    return sum(1 for _ in _BARE_PAIR.finditer(outside)) * len(text)


def too_costly(text: str) -> bool:
    """Whether :func:`repair` refuses ``text`` for its many bare pairs."""
    return repair_cost(text) > MAX_BARE_WORK


#: A JSON string (kept), or a bare ``NaN`` / ``Infinity`` (JavaScript's, JSON5's) where
#: a value stands: after a colon, an opening bracket or a comma.
_NON_FINITE = re.compile(r'("(?:[^"\\]|\\.)*")|(?<=[:\[,])(\s*)([-+]?)(NaN|Infinity)\b')


def _as_overflow(m: re.Match[str]) -> str:
    """A bare non-finite number as one that overflows (``1e999``), which reads as an
    infinite float the ladder refuses; json_repair would make ``NaN`` the string
    "NaN" and ``-Infinity`` the string "Infinity" (its sign lost): a wrong value."""
    if m.group(1):
        return m.group(1)
    return f"{m.group(2)}{'-' if m.group(3) == '-' else ''}1e999"


def repair(text: str) -> Any:
    """``json_repair`` on ``text``; ``None`` when nothing JSON-like comes out, and when
    the repair would cost too much (:data:`MAX_BARE_WORK`: many bare pairs)."""
    import json_repair

    if too_costly(text):
        return None

    if "\\/" in text or "\\f" in text or "\\_" in text:
        # Escapes json_repair keeps as written ("\\/" stays two characters).
        text = _REPAIR_ESCAPES.sub(_plain_escape, text)
    if "NaN" in text or "Infinity" in text:
        text = _NON_FINITE.sub(_as_overflow, text)
    text = undefined_as_null(text)
    try:
        value = json_repair.repair_json(text, return_objects=True, skip_json_loads=True)
    except Exception:
        # Whatever json_repair raises (ValueError, IndexError, an internal
        # AssertionError ...), this region is unreadable; the others are still tried.
        return None
    if isinstance(value, dict | list):
        return value
    return None
