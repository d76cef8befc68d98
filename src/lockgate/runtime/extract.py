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


#: A JSON string (kept), a comment (dropped: ``//``, ``/* */``, and Python's ``#``
#: after a space or a comma) or a comma before a closing bracket (dropped).
_LENIENT = re.compile(r'("(?:[^"\\\n]|\\.)*")|//[^\n]*|/\*(?s:.*?)\*/|(?<=[\s,])#[^\n]*'
                      r'|,(?=\s*[}\]])')


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
    if "," not in text and "/" not in text and "#" not in text \
            and "undefined" not in text:
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


#: A string (kept), or a number whose exponent has no digit (``0.9e``, ``2E-``) where a
#: value stands: cut off (it may have been ``0.9e-5``), never the number before its
#: ``e``.
_OPEN_EXPONENT = re.compile(r"""("(?:[^"\\]|\\.)*"|'(?:[^'\\\n]|\\.)*')"""
                            r"|(?<=[:\[,])(\s*)-?\d+(?:\.\d*)?[eE][-+]?(?=\s*(?:[,}\]]|\Z))")


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
    if "e" in text or "E" in text:
        text = _OPEN_EXPONENT.sub(lambda m: m.group(1) or f"{m.group(2)}1e999", text)
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


#: Dashes that stand for a minus sign right before a digit where a value starts: the
#: minus sign, en and em dashes, hyphens, the small and the full-width hyphen-minus.
_DASHES = "\u2212\u2013\u2014\u2010\u2011\ufe63\uff0d"
_LITERAL = r"(?:true|false|null|True|False|None)(?![\w$])"
#: A bare value: a number (its sign an ASCII or another dash), or a literal, or a
#: negated literal (``!true``), or a dash not right before a digit (``− 5``, ``−−5``,
#: ``-true``), or a mark of approximation or comparison before a number or literal
#: (``~5``, ``≈5``, ``>5``, ``±5``: kept whole, so refused by a number field).
_BARE_VALUE = re.compile(
    r"[-" + _DASHES + r"]?\d+(?:\.\d*)?(?:[eE][+-]?\d+)?"
    r"|!?(?:true|false|null|True|False|None)(?![\w$])"
    r"|[-" + _DASHES + r"](?=[ \t]*(?:[-" + _DASHES + r"\d]|" + _LITERAL + r"))"
    r"|[~≈∼≃<>≤≥≲≳±∓≠](?=[ \t]*(?:[-+" + _DASHES + r"\d.]|" + _LITERAL + r"))")
#: What ends a bare value: a comma, a semicolon, a closing bracket, a line break; looked for at most
#: this far (a bound on the work per value: linear over a text).
_VALUE_END = re.compile(r"[,;}\]\n]")
_MAX_REST = 1024
#: The separators a number's digit groups may be written with: space, no-break and
#: narrow no-break space, thin and figure space, zero-width space, apostrophes (a
#: number followed by one is followed by more: the text is kept as written).
_GROUP_SEPS = " \u00a0\u202f\u2009\u2007\u200b'\u2019"
#: A number as Python writes it (``1_000``, ``0xff``, ``0o17``, ``0b101``): left as
#: written, for the repair reads it as the number.
_PY_NUMBER = re.compile(r"[-+]?(?:0[xX][0-9a-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+"
                        r"|\d[\d_]*(?:\.[\d_]*)?(?:[eE][+-]?\d+)?)")
#: What may follow a whole bare value on its line: space, a comment, or the next
#: quoted or bare key (a comma left out: ``{n: 5 m: 6}``).
_VALUE_TAIL_OK = re.compile(r"[^\S\n]*(?:\Z|//|/\*|#)|[^\S\n]+(?:[\"']|[A-Za-z_$][\w$-]*[ \t]*:)")
#: Quotation marks of other languages that a model may write as a string's quotes
#: where a key or value starts (``«C'est bien»``, ``»so«``, ``„so“``, ``「良い」``): the
#: string they enclose on one line, when JSON syntax follows the closing one. A repair
#: would keep the closing mark in the value ("C'est bien»").
_QUOTE_PAIRS = {"«": "»", "»": "«", "‹": "›", "„": "“", "‚": "‘", "「": "」", "『": "』"}
_QUOTE_CLOSES = frozenset(_QUOTE_PAIRS.values())
_AFTER_QUOTED = re.compile(r"[ \t\r\n]*(?:[,:}\]]|\Z)")
#: The longest string so enclosed (a bound on the look for its closing mark).
_MAX_QUOTED = 4096
#: Digits after commas, right after a number ("3,5", "1,000,000").
_COMMA_DIGITS = re.compile(r"(?:,\d+)+")
#: A double-quoted string (to its end, or the end of the text).
_DQ_STRING = re.compile(r'"(?:[^"\\]|\\.)*+(?:"|\Z)', re.S)
#: The start of a single-quoted string: only where a key or value starts.
_SQ_STRING = re.compile(r"'(?:[^'\\\n]|\\.)*'(?=\s*(?:[:,}\]]|\Z))")


def bare_values(text: str) -> str | None:
    """``text`` with its bare values read as written, never cut short; None when
    there is nothing to change. Where a value starts (after a colon, or in a list):

    * a dash before a digit is a minus sign when the whole value is that number
      (``−5``, ``–2.5`` are -5, -2.5: a repair would drop the dash and deliver the
      positive number); followed by more (``–5 °C``) the value is the text as written;
    * a number followed, before the next comma, semicolon, closing bracket or line
      end, by more than space (not the next key, ``{n: 5 m: 6}``) is one value, not
      its first token: it becomes the string written
      (``1 234 567``, ``1'234``, ``1 2``, ``2 million``, ``3 or 4``, ``5 - 2``,
      ``0. 5``, ``3½``, ``1 299,99``; a string field's text, "555 123 456" keeps its
      spaces), which no number field takes as a number of its own (refused, never
      the first token; digit groups are never joined here). So does a literal
      followed by more (``true or false``) or negated (``!true``), and a number
      followed by a comma and a digit after an object key (a decimal comma). A number
      as Python writes it (``1_000``, ``0xff``) is left to the repair, which reads it;
      one written with a leading zero (``02134``, ``007``: no JSON number, and the
      repair would drop its zeros) becomes the string written: a string field keeps
      it, a number field reads the decimal number from it.

    A string in other quotation marks (``«C'est bien»``, :data:`_QUOTE_PAIRS`) where a
    key or value starts is read as a JSON string.

    Linear: one pass, strings skipped."""
    if not any(c in text for c in _DASHES) and _NUMBER_THEN_MORE.search(text) is None \
            and "!" not in text and not any(c in text for c in _QUOTE_PAIRS):
        return None
    out: list[str] = []
    stack: list[str] = []
    last = ""  # the last character outside strings that was not space
    copied = i = 0
    n = len(text)
    changed = False
    while i < n:
        c = text[i]
        if c == '"':
            m = _DQ_STRING.match(text, i)
            i = m.end() if m is not None else n
            last = '"'
            continue
        if c == "'" and last in "{[,:":
            m = _SQ_STRING.match(text, i)
            if m is not None:
                i = m.end()
                last = "'"
                continue
        if c.isspace():
            i += 1
            continue
        if c in _QUOTE_PAIRS and last in "{[,:":
            close = text.find(_QUOTE_PAIRS[c], i + 1, min(n, i + _MAX_QUOTED))
            if close > 0 and "\n" not in text[i:close] \
                    and _AFTER_QUOTED.match(text, close + 1) is not None:
                out.append(text[copied:i])
                out.append(orjson.dumps(text[i + 1:close]).decode())
                changed = True
                copied = i = close + 1
                last = '"'
                continue
        if c in "{[":
            stack.append(c)
        elif c in "}]":
            if stack:
                stack.pop()
        elif (last == ":" or (last in "[," and stack and stack[-1] == "[")) and (
                m := _BARE_VALUE.match(text, i)) is not None:
            new = _bare_value(text, i, m.end(), last == ":")
            if new is not None:
                out.append(text[copied:i])
                out.append(new[0])
                changed = True
                copied = i = new[1]
            else:
                i = m.end()
            last = "0"
            continue
        last = ":" if c == ":" and _keys_colon(text, i) else "x" if c == ":" else c
        i += 1
    if not changed:
        return None
    out.append(text[copied:])
    return "".join(out)


def _keys_colon(text: str, at: int) -> bool:
    """Whether the colon at ``at`` ends a key: a quoted one (in other quotation marks
    too, ``«q»:``), or one bare word right
    after an opening brace or a comma (``{label: 1}``), not a colon inside an unquoted
    value (``{note: at 12:30 or so}``)."""
    j = at - 1
    while j >= 0 and text[j] in " \t\r\n":
        j -= 1
    if j < 0 or text[j] in "\"'" or text[j] in _QUOTE_CLOSES:
        return True
    while j >= 0 and (text[j].isalnum() or text[j] in "_$-"):
        j -= 1
    while j >= 0 and text[j] in " \t\r\n":
        j -= 1
    return j < 0 or text[j] in "{,"


#: A digit or literal followed by more than space before a comma, a closing bracket
#: or a line end (the cheap test of :func:`bare_values`; it may say yes too often).
_NUMBER_THEN_MORE = re.compile(
    r"[~≈∼≃<>≤≥≲≳±∓≠][ \t]*[\d.tfnTFN+-]|-[ \t]*[tfTF]"
    r"|\d[^\d\s,}\].eE\"'/#]|\d\.[ \t]|\d,\d|-[ \t]*[-" + _DASHES + r"]|-[ \t]+\d"
    r"|(?:\d|true|false|null|True|False|None)[ \t" + _GROUP_SEPS[1:] + r"]+[^\s,}\]/#]"
    r"|(?<![\w.])0\d")
#: A number written with a leading zero (``02134``, ``007``, ``-00.5``): no JSON number,
#: and the repair reads it as a number without its zeros (a zip code, a phone number
#: or a code would lose them).
_LEADING_ZERO = re.compile(r"-?0\d+(?:\.\d*)?(?:[eE][+-]?\d+)?")


def _bare_value(text: str, start: int, end: int, keyed: bool) -> tuple[str, int] | None:
    """What to write for the bare value ``text[start:end]`` and where what it replaces
    ends (see :func:`bare_values`); None to keep it as written."""
    value = text[start:end]
    signed = value[:1] in _DASHES
    if signed:
        value = "-" + value[1:]
    found = _VALUE_END.search(text, end, end + _MAX_REST)
    stop = found.start() if found is not None else min(len(text), end + _MAX_REST)
    decimal = keyed and value[-1:].isdigit() and text[stop:stop + 1] == "," \
        and text[stop + 1:stop + 2].isdigit()
    rest = text[end:stop]
    if not decimal and not value.startswith("!") and _VALUE_TAIL_OK.match(rest):
        if _LEADING_ZERO.fullmatch(value):
            # "02134", "007": the text as written (a string field keeps its zeros; a
            # number field reads the decimal number, as from the string "007")
            return orjson.dumps(text[start:end]).decode(), end
        return (value, end) if signed else None
    if decimal:  # "3,5", "1 299,99", "1,000,000": its digits after commas belong to it
        after = _COMMA_DIGITS.match(text, stop).end()  # type: ignore[union-attr]
        found = _VALUE_END.search(text, after, after + _MAX_REST)
        stop = found.start() if found is not None else min(len(text), after + _MAX_REST)
    whole = text[start:stop].rstrip()
    if not decimal and not signed and _PY_NUMBER.fullmatch(whole) is not None:
        return None  # "1_000", "0xff": the number as Python writes it
    # (kept as written: "–5 °C", "555 123 456" are a string field's text, and no
    # number field takes them)
    return orjson.dumps(whole).decode(), start + len(whole)
