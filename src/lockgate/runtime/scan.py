"""A tolerant, single-pass scan of JSON-like text (used by :mod:`.search`).

Two jobs that a JSON repair library cannot do for the ladder:

* :func:`ascii_syntax` - full-width punctuation (``｛ ｝ ［ ］ ： ，``) and curly quotes
  (``“ ” ‘ ’ ＂``) written *as JSON syntax* become their ASCII forms; the same
  characters inside string values are left alone (a curly-quoted string becomes an
  ASCII-quoted one, its inner ``"`` escaped); the full-width dash ``－`` is left to the
  bare value it stands in (``extract.bare_values``: ``－5 °C`` kept as written).
* :func:`plain_blanks` - Unicode spaces and format characters (no-break space,
  zero-width space, BOM ...) between the tokens of a region become JSON's whitespace;
  inside strings they are kept.
* :func:`regions` - where each top-level object (or array) in a reply starts and ends,
  in order. A region the text ends inside is *cut*: the scan records where its last
  finished value ended and which brackets close it there, so that a string, number or
  key cut off by the end of the output is never taken for the model's value.

Both read strings the way a model writes them: a quote ends a string only where JSON
syntax may follow it (a ``:``, ``,`` then a key or value, a closing bracket, a line
break or the end of the text), so an unescaped inner quote (``"He said "hi" twice"``)
does not end it; nor does a quote only a key may end (a value's quote before a colon,
``"dit "parfait"\u00a0: il"``) when the next quote on its line that may end it does.
On valid JSON this is exactly JSON's own reading. Everything is
linear in the length of the text: no backtracking regular expressions, no recursion,
the open brackets kept as a linked list so that a snapshot costs nothing.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import orjson

#: The value of a region not read as strict JSON.
NOT_READ: Any = object()

#: Blank outside strings, as JSON's own whitespace is: every Unicode space but the ASCII
#: one (category Zs, the line and paragraph separators, U+0085, VT, FF and the
#: information separators Python counts as space) and every format character
#: (category Cf: zero-width space, BOM, word joiner, soft hyphen, direction marks).
#: Models and the text around them leave these between tokens (a no-break space before
#: ``}``, a zero-width space after ``:``); inside strings they are text, kept as written.
_SPACES = "\x0b\x0c\x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_FORMATS = ("\xad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f"
            "\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd"
            "\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
            "\U000e0001\U000e0020-\U000e007f")
_BLANKS = _SPACES + _FORMATS

#: After a closing quote: what may follow the end of a JSON string (full-width forms
#: included, for :func:`ascii_syntax`), a ``//`` or ``/*`` comment included (the lenient
#: reading takes those out), and Python's ``#`` one after a blank or a comma, when no
#: quote follows on its line and the next line goes on with a key or a closing bracket;
#: a closing parenthesis (a Python tuple's last item) that a closing bracket, or a
#: comma and a key follow, or a line that goes on so (a quote and a ``#`` or a ``)``
#: inside a string of several lines, ``print("hello")``, is no end: the text after it
#: is no JSON syntax). A comma must be followed by something that can start a key or a
#: value (or a comment, or an elision: ``"rude", ...]``, the ``...`` followed by a
#: closing bracket that JSON syntax follows, or by a comma and a value), else the quote
#: is taken as part of the text. A few of these ends are weaker (:func:`_weak_end`).
#: The end of a line that goes on as JSON syntax: a closing bracket or a key next.
_GOES_ON = r"""(?:\Z|\r?\n\s*(?:[}\]]|\Z|["'][^"'\n]{0,40}["'][ \t]*:))"""
_CLOSES = re.compile(
    r"""[ \t\u3000""" + _BLANKS + r"""]*+(?:[\r\n]|[:：}｝\]］]|\Z|//|/\*
        |(?<=[ \t])\#(?=[^\n"]*""" + _GOES_ON + r""")
        |\)[ \t]*(?:[}\]]|""" + _GOES_ON + r"""|,\s*["'][^"'\n]{0,40}["'][ \t]*:)
        |[,，][\s""" + _FORMATS + r"""]*+(?:["“”＂'‘＇{｛\[［}｝\]］,，\d\-]
        |\Z|//|/\*|\#(?=[^\n"]*""" + _GOES_ON + r""")|(?:true|false|null|True|False|None)\b
        |(?:\.\.\.|…)[\s""" + _BLANKS + r"""]*(?:[\]}][\s""" + _BLANKS + r"""]*
            (?:[,，}｝\]］\r\n<`]|\Z)
            |,[\s""" + _BLANKS + r"""]*(?:["“”＂'‘＇{｛\[［\d\-]|true|false|null))
        |[^\W\d][\w.\- ]{0,40}?["”’]?[ \t""" + _BLANKS + r"""]*[:：]))""",
    re.X)
_DQ = re.compile(r'[^"\\]*+(?:\\.[^"\\]*+)*+"', re.S)
_SQ = re.compile(r"[^'\\]*+(?:\\.[^'\\]*+)*+'", re.S)
_TOKEN = re.compile(
    r"""[\s""" + _FORMATS + r"""]*+(?:(?P<open>[{\[])|(?P<close>[}\]])|(?P<comma>,)|(?P<colon>:)
    |(?P<quote>["'])|(?P<comment>//[^\n]*+|/\*(?:[^*]|\*(?!/))*+(?:\*/|\Z))
    |(?P<word>[^\s""" + _FORMATS + r""",:{}\[\]"'/][^\s,:{}\[\]"]*+|/)
    |(?P<end>\Z))""", re.X | re.S)
_LITERALS = frozenset({"true", "false", "null", "True", "False", "None"})

#: Region starts: ``{`` always; ``[`` only where it opens an array of objects or arrays
#: (or the text ends), so a citation like ``[1]`` is not taken for JSON.
OBJECT_START = re.compile(r"\{|\[(?=\s*+(?:[{\[]|\Z))")
ANY_START = re.compile(r"[{\[]")

_MAX_INNER = 16

# An open bracket: (closing char, its place in its parent - a key or an index -,
# parent, start offset).
_Node = tuple[str, "str | int | None", "_Node | None", int]
Path = tuple[str | int, ...]
#: Open brackets deeper than this are not reported (wrappers are removed at most 32
#: deep, so deeper ones never hold a field of the answer).
_MAX_OPEN_DEPTH = 40

_KEY, _COLON, _VALUE, _AFTER = range(4)


@dataclass(slots=True)
class Region:
    """One top-level bracketed value in a text."""

    start: int
    end: int
    closed: bool
    #: A cut region: the end of its last finished value (or of its opening bracket),
    #: the brackets that close it there, where the value cut off stood (keys and
    #: indices from the region's root), and every bracket still open at the end of
    #: the last finished value (the root is ``()``): those were closed by the scan,
    #: not by the model.
    safe_end: int = -1
    closers: str = ""
    dropped: Path | None = None
    open_paths: frozenset[Path] = frozenset()
    #: A cut region: what closes it at the very end (the open string's quote, if any,
    #: then the open brackets), for a rule that keeps cut values.
    tail: str = ""
    #: A cut region: the shallowest complete values inside it (start, end), in order.
    inner: list[tuple[int, int]] = field(default_factory=list)
    #: A region that is strict JSON as written: its value.
    value: Any = NOT_READ

    def trimmed(self, text: str) -> str:
        """A cut region up to its last finished value, closed."""
        return text[self.start:self.safe_end] + self.closers


def _string_end(text: str, start: int) -> int | None:
    """End (exclusive) of the string opening at ``start``; None if the text ends in it."""
    return _quote_end(text, start, _DQ if text[start] == '"' else _SQ, None)


def _quote_end(text: str, start: int, body: re.Pattern[str] | None,
               closing: re.Pattern[str] | None) -> int | None:
    """End (exclusive) of the string opening at ``start``: after the first quote that
    :data:`_CLOSES` follows, unless that end is weak (:func:`_weak_end`) and the next
    such quote, on the same line, is not; None if the text ends in it. ``body``
    matches the rest of an ASCII-quoted string up to its next quote; else ``closing``
    finds the next quote that may close a curly or full-width one."""
    pos = start + 1
    weak = -1
    limit = len(text)
    value: bool | None = None
    while True:
        if body is not None:
            m = body.match(text, pos)
        else:
            assert closing is not None
            m = closing.search(text, pos)
        if m is None or m.end() > limit:
            return weak if weak >= 0 else None
        pos = m.end()
        if _CLOSES.match(text, pos) is None:
            continue
        if value is None:
            value = _in_value(text, start)
        if not _weak_end(text, pos, value):
            return pos
        if weak >= 0:
            return weak  # (the next end is weak too: the first stands)
        weak = pos
        newline = text.find("\n", pos)
        limit = len(text) if newline < 0 else newline


#: A quote that a colon follows (blanks between): a string so ended is a key.
_COLON_AFTER = re.compile(r"[ \t\u3000" + _BLANKS + r"]*+[:：]")
#: A quote that a Unicode blank (one JSON does not count as whitespace, and that
#: :func:`plain_blanks` makes one) and a closing bracket follow, and then, on its
#: line, anything but JSON syntax: ``"The sign read "OPEN"\u00a0} but it was closed"``.
_BLANK_BRACKET = re.compile(
    r"[ \t\u3000]*+[" + _BLANKS.replace("\u3000", "") + r"][ \t" + _BLANKS + r"]*+[}｝\]］]"
    r"[ \t" + _BLANKS + r"]*+(?![,，}｝\]］\r\n<`]|\Z|//|/\*)")
_BLANK_BEFORE = re.compile(r"[\s" + _FORMATS + r"]")


def _weak_end(text: str, pos: int, value: bool) -> bool:
    """Whether the quote before ``pos`` ends its string only when the next quote that may
    end it, on its line, is weak too or none: a value's string (one after a colon)
    followed by a colon, which only a key may be (``"remarque": "Le client dit
    "parfait"\u00a0: il reviendra"``); or a quote that a Unicode blank, a closing bracket
    and text follow (:data:`_BLANK_BRACKET`)."""
    return ((value and _COLON_AFTER.match(text, pos) is not None)
            or _BLANK_BRACKET.match(text, pos) is not None)


def _in_value(text: str, start: int) -> bool:
    """Whether the string opening at ``start`` stands after a colon (blanks between): a
    value, never a key."""
    i = start
    while i > 0 and _BLANK_BEFORE.match(text, i - 1) is not None:
        i -= 1
    return i > 0 and text[i - 1] in ":："


def string_closes(text: str, pos: int) -> bool:
    """Whether a quote just before ``pos`` may end a string: JSON syntax follows it."""
    return _CLOSES.match(text, pos) is not None


def escape_inner_quotes(text: str) -> str | None:
    """``text`` with each double quote inside a string that does not end it escaped,
    read as the scan reads strings (a quote ends a string only where JSON syntax may
    follow it): ``"The 5" screen"`` is ``"The 5\\" screen"``, an inch mark as text
    (``json_repair`` ends the string there, or keeps the closing quote in the value).
    Single-quoted strings are skipped as they are. None when no quote is escaped,
    when the text ends inside a string, when a quote that does not end its string
    is followed by a space and another quote (``["slow" "cold"]``: a comma missing
    between two strings is as likely, and json_repair reads it so), or when a string
    would hold a quotation that opens (a quote after a space, before a word) and
    never closes: ``"called it "awful"}`` lacks its own closing quote, and
    json_repair keeps the quotation's end."""
    if text.count('"') < 3:
        return None
    out: list[str] = []
    pos = done = 0
    while (m := _QUOTE.search(text, pos)) is not None:
        start = m.start()
        if text[start] == "'":
            end = _string_end(text, start)
            if end is None:
                return None
            pos = end
            continue
        end = _string_end(text, start)
        if end is None:
            return None
        at = start + 1
        opening = 0  # escaped quotes that open a quotation ( "awful), less those closing
        while True:
            inner = _DQ.match(text, at)
            assert inner is not None  # (the string ends at ``end``)
            at = inner.end()
            if at == end:
                break
            if _NEXT_STRING.match(text, at):
                return None  # "a" "b": a comma missing between strings, more likely
            out.append(text[done:at - 1])  # a quote no JSON syntax follows: text
            out.append('\\"')
            done = at
            before = text[at - 2] if at - 2 > start else " "
            after = text[at:at + 1] or " "
            if before.isspace() and not after.isspace():
                opening += 1
            elif opening and not before.isspace() and not after[0].isalnum():
                opening -= 1
        if opening:
            # A quotation left open ("called it "awful"}): the string's own closing
            # quote is more likely missing, the last quote the quotation's end;
            # json_repair reads it so.
            return None
        pos = at
    if not out:
        return None
    out.append(text[done:])
    return "".join(out)


_QUOTE = re.compile("[\"']")
_NEXT_STRING = re.compile('[ \t]+"')


def regions(text: str, start_at: re.Pattern[str], limit: int = 64, *,
            pos: int = 0) -> list[Region]:
    """The top-level regions of ``text`` from ``pos`` in order (at most ``limit``);
    only the last one can be cut."""
    out: list[Region] = []
    while len(out) < limit:
        m = start_at.search(text, pos)
        if m is None:
            break
        region = strict_region(text, m.start()) or _scan(text, m.start())
        out.append(region)
        if not region.closed:
            break
        pos = region.end
    return out


def last_regions(text: str, start_at: re.Pattern[str], count: int, *,
                 pos: int = 0) -> list[Region]:
    """The last ``count`` top-level regions of ``text`` from ``pos`` (only the last can
    be cut), however many come before them: each is read once by the state machine
    (linear in the text, where a failed strict read of every region would cost the
    length before it), the strict JSON among those kept then read as such."""
    kept: deque[Region] = deque(maxlen=count)
    while (m := start_at.search(text, pos)) is not None:
        flat = _FLAT.match(text, m.start())  # {a_0}: nothing in it the scan reads
        region = Region(m.start(), flat.end(), True) if flat else (
            _simple_region(text, m.start()) or _scan(text, m.start()))
        kept.append(region)
        if not region.closed:
            break
        pos = region.end
    for region in kept:
        if region.closed and region.value is NOT_READ:
            with suppress(orjson.JSONDecodeError):
                region.value = orjson.loads(text[region.start:region.end])
    return list(kept)


#: A bracket group with no bracket, quote or comment inside (LaTeX's ``{a_0}``).
_FLAT = re.compile(r"[{\[][^{}\[\]\"'/]*+[}\]]")
#: A bracket group with no bracket inside but in double-quoted strings, no single
#: quote or comment (``{"s": 1}``): when it is strict JSON, the scan reads it the same.
_SIMPLE = re.compile(r"""[{\[](?:[^{}\[\]"'/]++|"(?:[^"\\\n]|\\.)*+")*+[}\]]""")


def _simple_region(text: str, start: int) -> Region | None:
    """The region at ``start`` when it is a flat group of strict JSON (read by a regular
    expression and ``orjson``, without the state machine); else None."""
    m = _SIMPLE.match(text, start)
    if m is None:
        return None
    try:
        value = orjson.loads(text[start:m.end()])
    except orjson.JSONDecodeError:
        return None
    return Region(start, m.end(), True, value=value)
_DECODER = json.JSONDecoder()
#: Where strict JSON may start: an object's first key or its end, or an array.
_STRICT_START = re.compile(r'\{[ \t\r\n]*+["}]|\[')


def strict_region(text: str, start: int) -> Region | None:
    """The region at ``start`` if it is strict JSON as written (the common case, read
    by the C scanners of ``json`` and ``orjson`` instead of the state machine). A
    bracket that cannot start strict JSON (``{x}``) is not tried: a failed read costs
    the length of the text before it (its error counts the lines)."""
    if _STRICT_START.match(text, start) is None:
        return None
    try:
        end = _DECODER.raw_decode(text, start)[1]
        value = orjson.loads(text[start:end])
    except (ValueError, RecursionError):  # JSONDecodeError is a ValueError
        return None
    return Region(start, end, True, value=value)


def _places(node: _Node | None) -> list[str | int]:
    """The keys and indices leading to ``node`` from the root."""
    places: list[str | int] = []
    while node is not None:
        if node[1] is not None:
            places.append(node[1])
        node = node[2]
    places.reverse()
    return places


def _closers(node: _Node | None) -> str:
    out = []
    while node is not None:
        out.append(node[0])
        node = node[2]
    return "".join(out)


def _key(raw: str) -> str:
    """A key as it reads once parsed (escapes decoded where they are valid)."""
    if "\\" not in raw:
        return raw
    try:
        decoded = orjson.loads(f'"{raw}"')
    except orjson.JSONDecodeError:
        return raw
    return decoded if isinstance(decoded, str) else raw


def _scan(text: str, start: int) -> Region:  # noqa: C901 - one state machine
    n = len(text)
    node: _Node | None = ("}" if text[start] == "{" else "]", None, None, start)
    counts = [0]  # per open bracket: commas seen at its level (an array's index)
    depth = 1
    state = _KEY if text[start] == "{" else _VALUE
    safe_pos, safe_node = start + 1, node
    key: str | None = None
    quote = ""
    inner: list[tuple[int, int]] = []
    inner_depth = 1 << 30
    pos = start + 1
    while True:
        assert node is not None
        m = _TOKEN.match(text, pos)
        assert m is not None  # the last alternative matches at the end
        kind = m.lastgroup or "end"
        i = m.start(kind)
        pos = m.end()
        in_object = node[0] == "}"
        if kind == "quote":
            end = _string_end(text, i)
            if end is None:  # cut inside a string
                if state in (_KEY, _AFTER) and in_object:
                    key = text[i + 1:i + 41]
                quote = text[i]
                break
            pos = end
            if in_object and state in (_KEY, _AFTER):
                key, state = _key(text[i + 1:end - 1]), _COLON
            else:
                safe_pos, safe_node, state = end, node, _AFTER
        elif kind == "word":
            word = m.group(kind)
            finished = pos < n or word in _LITERALS
            if in_object and state in (_KEY, _AFTER):
                key = word
                if not finished:
                    break
                state = _COLON
            elif not finished:
                break
            elif state != _AFTER:
                safe_pos, safe_node, state = pos, node, _AFTER
        elif kind == "open":
            place = key if in_object else counts[-1]
            node = ("}" if text[i] == "{" else "]", place, node, i)
            counts.append(0)
            depth += 1
            state = _KEY if text[i] == "{" else _VALUE
            key = None
        elif kind == "close":
            depth -= 1
            if depth == 0:
                return Region(start, pos, True)
            opened = node[3]
            node = node[2]
            counts.pop()
            safe_pos, safe_node, state, key = pos, node, _AFTER, None
            if depth < inner_depth:
                inner, inner_depth = [(opened, pos)], depth
            elif depth == inner_depth and len(inner) < _MAX_INNER:
                inner.append((opened, pos))
        elif kind == "comma":
            state, key = (_KEY if in_object else _VALUE), None
            counts[-1] += 1
        elif kind == "colon":
            state = _VALUE
        elif kind == "end":
            break
    dropped: Path | None = None
    if text[safe_pos:].strip(" \t\r\n,"):
        assert node is not None
        if node[0] == "]":
            dropped = (*_places(node), counts[-1])
        else:
            dropped = (*_places(node), key) if key is not None else tuple(_places(node))
    chain = _places(safe_node)[:_MAX_OPEN_DEPTH]
    open_paths = frozenset(tuple(chain[:d]) for d in range(len(chain) + 1))
    return Region(start, n, False, safe_pos, _closers(safe_node), dropped, open_paths,
                  quote + _closers(node), inner)


# --- full-width JSON syntax ---------------------------------------------------------

# Where full-width forms of ASCII (U+FF01-U+FF5E: ｛ ｝ ［ ］ ： ， ４ ...), the
# ideographic space or curly quotes may stand as JSON syntax: next to a quote, a
# bracket, a number or a literal. Chinese prose (``好的，结果如下：``) does not match, so
# the conversion is skipped for the common reply.
_FULLWIDTH = re.compile(
    r"""[｛［＂＇]|[{\[,:：，]\s*[“‘”]|[”’]\s*[:：,，}\]]|["\d\]}]\s*[：，]|[：，]\s*["\d\-]
    |[:：]\s*[０-９－]|(?:true|false|null)\s*[：，]|[{\[,:"]\s*\u3000|\u3000\s*[:,}\]"]""",
    re.X)
_OPEN_QUOTES = {'"': None, "'": None, "“": re.compile('[”“"＂]'), "”": re.compile('[”“"＂]'),
                "＂": re.compile('[＂”"]'), "‘": re.compile("[’'＇]"), "＇": re.compile("[＇’']")}
_JSON_CHARS = re.compile("""[{}\\[\\]:,"'“”‘’\u3000\uff01-\uff5e]""")
_BARE_QUOTE = re.compile(r'(?<!\\)"')
_START = re.compile(r"[{｛]|[\[［](?=\s*+(?:[{｛\[［]|\Z))")


_WIDE = re.compile("[\uff01-\uff5e\u3000“”‘’]")
_WIDE_BRACKET = re.compile("[｛［]")


def may_be_wide(text: str) -> bool:
    """Whether ``text`` holds a full-width form or a curly quote at all."""
    return _WIDE.search(text) is not None


def wide_bracket(text: str, end: int) -> bool:
    """Whether a full-width bracket stands before ``end``."""
    return _WIDE_BRACKET.search(text, 0, end) is not None


def ascii_syntax(text: str) -> str:
    """``text`` with full-width JSON punctuation and curly quotes turned to ASCII where
    they stand as JSON syntax (see the module doc); ``text`` itself if there is none."""
    if not may_be_wide(text) or _FULLWIDTH.search(text) is None:
        return text
    return _by_regions(text, _START, _convert_region)


def _by_regions(text: str, start: re.Pattern[str],
                region: Callable[[str, int, list[str]], int]) -> str:
    """``text`` with each region that a match of ``start`` opens rewritten by
    ``region`` (which appends the region as rewritten to its list and returns where the
    region ended), the text between regions as it is; ``text`` itself if nothing
    changed."""
    out: list[str] = []
    pos = 0
    n = len(text)
    while pos < n:
        m = start.search(text, pos)
        if m is None:
            break
        out.append(text[pos:m.start()])
        pos = region(text, m.start(), out)
    out.append(text[pos:])
    rewritten = "".join(out)
    return text if rewritten == text else rewritten


def _convert_region(text: str, start: int, out: list[str]) -> int:
    """Convert one bracketed region starting at ``start``; returns where it ended."""
    depth = 0
    pos = start
    while (m := _JSON_CHARS.search(text, pos)) is not None:
        i = m.start()
        c = m.group()
        out.append(text[pos:i])
        pos = i + 1
        if c in _OPEN_QUOTES:
            pos = _convert_string(text, i, out)
            continue
        if c == "\u3000":
            c = " "
        elif c == "\uff0d":
            pass  # a minus sign, read with the value (extract.bare_values: "－5 °C")
        elif c >= "\uff01":
            c = chr(ord(c) - 0xFEE0)  # the ASCII character of a full-width form
        out.append(c)
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth <= 0:
                return pos
    out.append(text[pos:])
    return len(text)


def _convert_string(text: str, start: int, out: list[str]) -> int:
    """Copy the string opening at ``start`` with ASCII delimiters; returns its end."""
    opening = text[start]
    if opening in "\"'":
        end = _string_end(text, start)
        end = len(text) if end is None else end
        out.append(text[start:end])
        return end
    end = _quote_end(text, start, None, _OPEN_QUOTES[opening])
    if end is None:
        out.append('"' + _escape_quotes(text[start + 1:]))
        return len(text)
    out.append('"' + _escape_quotes(text[start + 1:end - 1]) + '"')
    return end


def _escape_quotes(s: str) -> str:
    if '"' not in s:
        return s
    # an ASCII quote inside a curly-quoted string is text: escape it (unless it is)
    return _BARE_QUOTE.sub(r'\\"', s)


# --- Unicode blanks between tokens --------------------------------------------------

_BLANK = re.compile(f"[{_BLANKS}]")
_ASCII_BLANKS = "\x0b\x0c\x1c\x1d\x1e\x1f"
_FORMAT = re.compile(f"[{_FORMATS}]")
#: In a region: a bracket, a quote (ASCII, curly or full-width: a string starts) or a
#: run of blanks.
_REGION_CHARS = re.compile(f"""[{{}}\\[\\]"'“”‘＂＇]|[{_BLANKS}]+""")
#: What a run of blanks between two of is inside a bare word, kept as written (an
#: emoji sequence's zero-width joiner, ``New\u00a0York`` unquoted): anything but JSON
#: syntax and white space.
_SYNTAX = frozenset("{}[]:,\"'：，｛｝［］“”‘’＂＇")


def plain_blanks(text: str) -> str:
    """``text`` with the Unicode blanks of :data:`_BLANKS` that stand between the tokens
    of its bracketed regions made plain: a space as an ASCII space, a format character
    removed (``{"a": 1\\u00a0}`` is ``{"a": 1 }``), so that strict JSON, the scan and
    ``json_repair`` read them as JSON's own whitespace. Strings (read as the scan reads
    them) keep theirs as written, and so does the text outside the regions. ``text``
    itself when there is none."""
    if (not any(c in text for c in _ASCII_BLANKS) if text.isascii()
            else _BLANK.search(text) is None):
        return text
    return _by_regions(text, ANY_START, _plain_region)


def _plain_region(text: str, start: int, out: list[str]) -> int:
    """Copy the region opening at ``start`` with its blanks made plain; its end."""
    depth = 0
    pos = start
    while (m := _REGION_CHARS.search(text, pos)) is not None:
        i = m.start()
        c = m.group()
        out.append(text[pos:i])
        pos = i + 1
        if c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
        elif c in _OPEN_QUOTES:
            end = _quoted_end(text, i)
            out.append(text[i:end])
            pos = end
            continue
        else:
            pos = m.end()
            if _in_word(text, i, pos):
                out.append(c)
                continue
            c = " " if _FORMAT.sub("", c) else ""
        out.append(c)
        if depth <= 0:
            return pos
    out.append(text[pos:])
    return len(text)


def _in_word(text: str, start: int, end: int) -> bool:
    """Whether the run of blanks ``text[start:end]`` stands inside a bare word: neither
    side is JSON syntax, white space or an edge of the text."""
    if start == 0 or end >= len(text):
        return False
    before, after = text[start - 1], text[end]
    return not (before in _SYNTAX or after in _SYNTAX or before.isspace()
                or after.isspace())


def _quoted_end(text: str, start: int) -> int:
    """The end of the string opening at ``start`` (any of :data:`_OPEN_QUOTES`), the
    end of the text if it is left open."""
    closing = _OPEN_QUOTES.get(text[start])
    end = (_string_end(text, start) if closing is None
           else _quote_end(text, start, None, closing))
    return len(text) if end is None else end
