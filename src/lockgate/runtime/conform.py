"""Bringing a parsed output into the declared shape: field names, then types.

One walk over the value, guided by the compiled schema (:class:`~.schema.Node`):

* **Field names** (objects): a key the schema does not know is renamed when its folded
  form (case, ``_``/``-``/space, full-width) matches a property or a declared alias
  (``delivery_rule.aliases``), else when it is a close misspelling of exactly one
  property that is still missing (:func:`~.names.closest`) and its value can be that
  property's type (``"data": {...}`` is not ``date``, a string). A rename never
  overwrites a key that is present. Unknown keys are kept, or dropped when the schema says
  ``additionalProperties: false``.
* **Types**: a value of the wrong JSON type is converted when the conversion is
  lossless and unambiguous: ``"3"`` -> ``3``, ``"0.5"`` -> ``0.5``, ``3.0`` -> ``3``,
  ``"1,234"`` -> ``1234``, ``"true"``/``"yes"``/``"是"`` -> ``true``, ``3`` -> ``"3"``,
  ``"null"`` -> ``null``, a JSON text in a string -> the object/array it holds, a lone
  value -> a one-element array (``"Washington, D.C."`` -> ``["Washington, D.C."]``), a
  list written in a string split only where the split is the one reading (``"甲、乙"``,
  ``"red, blue"`` for an enum of colours, ``"1, 2"`` for integers); an enum member
  written in another case or width, with spaces, hyphens or underscores between its
  words, or ending a sentence -> the member (when exactly one member reads so);
  ``"Yes."`` -> ``true``. Integers are read exactly, within
  signed 64 bits.
* **Nulls**: a ``null`` in a field that is not required and whose schema does not admit
  null is dropped, as if absent (``null_dropped:...``), at any depth.

Each change is recorded as a fix (``renamed:...``, ``coerced:...``, ``dropped:...``).
"""

from __future__ import annotations

import ast
import html
import math
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

import orjson

from lockgate.runtime.names import closest, fold
from lockgate.runtime.normalize import strip_invisible
from lockgate.runtime.schema import Node, lossy_integral

_INT_RE = re.compile(r"[+-]?\d+(?:\.0*)?")
#: One to three digits (not a lone 0), one dot, exactly three digits ("10.000"): in
#: many locales a thousands separator, so in a string no integer is read from it.
_DOT_THOUSANDS_RE = re.compile(r"[+-]?[1-9]\d{0,2}\.\d{3}")
_FLOAT_RE = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
#: A number written with thousands separators: 1 to 3 digits (not a leading 0), then
#: groups of 3 ("1,234,567.5"); "0,900" (a decimal comma) is not one.
_THOUSANDS_RE = re.compile(r"[+-]?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d*)?")
#: Digits a number string may be read from (longer ones are not a model's number).
_MAX_DIGITS = 400
#: Digits of other scripts' full-width forms only (NFKC would also turn "10²" into
#: "102"), and the dashes that stand for a minus sign ("−5" is -5).
_WIDE_DIGITS = str.maketrans("０１２３４５６７８９＋－．，−–—‐‑﹣",
                             "0123456789+-.,------")
_LIST_SPLIT_RE = re.compile(r"\s*[,，、;；]\s*")
_ENUMERATION_SPLIT_RE = re.compile(r"\s*、\s*")
#: Commas and semicolons: a text with both is no list of either's parts (the commas
#: may be decimal commas, "1,5; 2,5", or belong to the items).
_COMMA_RE = re.compile("[,，]")
_SEMICOLON_RE = re.compile("[;；]")
#: A comma between two digits, no space after it: a decimal comma ("19,99") or a
#: thousands one ("1,234") as well as a list's, so no list of numbers is split there.
_DIGIT_COMMA_RE = re.compile(r"\d[,，]\d")
#: The integers a JSON value may hold exactly (signed 64 bits).
_MIN_INT, _MAX_INT = -(1 << 63), (1 << 63) - 1
#: Below this magnitude a float holds every integer exactly (2**53; 2**53 + 1 is not
#: a float, so 2**53 itself may stand for it).
_MAX_SAFE = float(1 << 53)
_TRUE = frozenset({"true", "yes", "y", "on", "1", "是", "对", "真", "正确", "有",
                   # ja, ko, ru, de/nl, fr, es/it, pt, pl, tr
                   "はい", "예", "네", "да", "ja", "oui", "sí", "si", "sì", "sim", "tak", "evet",
                   # fr, de, es, it, pt, nl; zh; informal English
                   "vrai", "wahr", "verdadero", "vero", "verdadeiro", "waar", "是的", "对的",
                   "yep", "yup", "yeah", "yea", "yah"})
_FALSE = frozenset({"false", "no", "n", "off", "0", "否", "错", "假", "错误", "无", "没有",
                    "いいえ", "아니요", "아니오", "нет", "nein", "nee", "non", "não", "nie",
                    "hayır",
                    "faux", "falsch", "falso", "onwaar", "不是", "不", "不对", "nope", "nah",
                    "nay"})
_NULL = frozenset({"null", "none", "nil", "n/a", ""})


#: At most this many fix labels are kept (then ``+N more``), each at most this long:
#: an output with 100,000 unknown keys must not make a 100,000-entry trace.
MAX_FIXES = 64
MAX_LABEL = 160
#: Unknown keys of one object considered for renaming (the rest are kept as they are).
MAX_RENAMES = 256


@dataclass(slots=True)
class Fixes:
    """The fixes applied to one output, and which kinds occurred."""

    applied: list[str] = field(default_factory=list)
    repaired: bool = False
    coerced: bool = False
    filled: bool = False
    more: int = 0

    def _add(self, label: str) -> None:
        if len(self.applied) >= MAX_FIXES:
            self.more += 1
            return
        self.applied.append(label if len(label) <= MAX_LABEL else label[:MAX_LABEL] + "...")

    def repair(self, label: str) -> None:
        self._add(label)
        self.repaired = True

    def coerce(self, label: str) -> None:
        self._add(label)
        self.coerced = True

    def fill(self, label: str) -> None:
        self._add(label)
        self.filled = True

    def copy(self) -> Fixes:
        return Fixes(list(self.applied), self.repaired, self.coerced, self.filled, self.more)

    def labels(self) -> tuple[str, ...]:
        """The labels in order (with ``+N more`` when some were left out)."""
        if self.more:
            return (*self.applied, f"+{self.more} more")
        return tuple(self.applied)


def json_type(value: Any) -> str:
    """The JSON Schema type name of a Python value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return type(value).__name__


def _type_ok(value: Any, types: frozenset[str]) -> bool:
    if not types:
        return True
    t = json_type(value)
    if t in types:
        return True
    if t == "integer" and "number" in types:
        return True
    return t == "number" and "integer" in types and float(value).is_integer()


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def conform(value: Any, node: Node, fixes: Fixes, path: str = "") -> Any:
    """Rename fields and coerce types of ``value`` towards ``node`` (see module doc)."""
    if isinstance(value, float) and node.integer_only and value.is_integer() \
            and -_MAX_SAFE < value < _MAX_SAFE:
        # 3.0 where an integer is declared: exactly 3 (only within the range a float
        # holds every integer of; 3.5 stays a violation).
        fixes.coerce(f"coerced:{path or '$'}:number->integer")
        value = int(value)
    if node.types and not _type_ok(value, node.types):
        value = _convert(value, node, fixes, path)
    if node.enum is not None and value not in node.enum:
        value = _enum_member(value, node.enum, fixes, path)
    if isinstance(value, dict) and (node.props or not node.additional):
        return _conform_object(value, node, fixes, path)
    if isinstance(value, list) and node.items is not None:
        items = node.items
        return [conform(v, items, fixes, _join(path, i)) for i, v in enumerate(value)]
    return value


def _conform_object(obj: dict[str, Any], node: Node, fixes: Fixes, path: str) -> dict[str, Any]:
    props = node.props
    unknown = [k for k in obj if k not in props]
    if unknown:
        renames = _renames(obj, unknown, node, fixes, path)
        if renames or not node.additional:
            rebuilt: dict[str, Any] = {}
            for k, v in obj.items():
                k = renames.get(k, k)
                if k not in props and not node.additional:
                    fixes.repair(f"dropped:{_join(path, k)}")
                    continue
                rebuilt[k] = v
            obj = rebuilt
    out = obj
    for name, child in props.items():
        if name not in obj:
            continue
        v = obj[name]
        if v is None and name not in node.required and not child.admits_null:
            out = _drop_null(out, obj, name, fixes, path)
            continue
        if child.types or child.enum is not None or child.structured:
            new = conform(v, child, fixes, _join(path, name))
            if new is not v:
                if out is obj:
                    out = dict(obj)
                out[name] = new
    return out


def _renames(obj: dict[str, Any], unknown: list[str], node: Node, fixes: Fixes,
             path: str) -> dict[str, str]:
    """The unknown keys of ``obj`` to rename, each to the property it names."""
    props = node.props
    renames: dict[str, str] = {}
    taken = {k for k in obj if k in props}
    for key in unknown[:MAX_RENAMES]:
        if len(taken) == len(props):
            break
        folded = fold(key)
        target = node.lookup.get(folded)
        how = "alias" if folded in node.alias_folds else "case"
        if target is None:
            target = closest(key, [p for p in props if p not in taken])
            how = "fuzzy"
            if target is not None and fold(target) != folded \
                    and not may_be(obj[key], props[target]):
                # a guess by spelling that the value contradicts: "data": {...} is
                # no misspelt "date" string
                target = None
        if target is not None and target not in taken:
            renames[key] = target
            taken.add(target)
            fixes.repair(f"renamed:{how}:{_join(path, key)}->{target}")
    return renames


def may_be(value: Any, node: Node) -> bool:
    """Whether ``value`` has, or converts to, a type the schema allows at ``node`` (an
    enum without a type allows its members' types); null and unknown types may be."""
    types = node.types or frozenset(json_type(m) for m in node.enum or ())
    if value is None or not types or _type_ok(value, types):
        return True
    return any(_to(value, t, node)[0] for t in types)


def _drop_null(out: dict[str, Any], obj: dict[str, Any], name: str, fixes: Fixes,
               path: str) -> dict[str, Any]:
    """``out`` without ``name``: a null in an optional field that cannot be null is the
    model's way of saying "unknown", taken as absent."""
    if out is obj:
        out = dict(obj)
    del out[name]
    fixes.repair(f"null_dropped:{_join(path, name)}")
    return out


def _convert(value: Any, node: Node, fixes: Fixes, path: str) -> Any:
    types = node.types
    before = json_type(value)
    for target in _order(types):
        ok, new = _to(value, target, node)
        if ok:
            fixes.coerce(f"coerced:{path or '$'}:{before}->{target}")
            return new
    return value


def _order(types: frozenset[str]) -> list[str]:
    # Prefer the most specific reading of a string: null, boolean, integer, number, ...
    rank = ["null", "boolean", "integer", "number", "array", "object", "string"]
    return sorted(types, key=lambda t: rank.index(t) if t in rank else len(rank))


def _to(value: Any, target: str, node: Node) -> tuple[bool, Any]:
    if target == "integer":
        return _to_int(value)
    if target == "number":
        return _to_number(value)
    if target == "boolean":
        return _to_bool(value)
    if target == "string":
        if isinstance(value, bool):
            return True, "true" if value else "false"
        if isinstance(value, int):
            return True, str(value)  # any size (orjson writes 64 bits)
        if isinstance(value, float) and exact_float(value):
            return True, orjson.dumps(value).decode()
        return False, value
    if target == "null":
        if isinstance(value, str) and value.strip().lower() in _NULL:
            return True, None
        return False, value
    if target == "array":
        return _to_array(value, node)
    if target == "object":
        if isinstance(value, str) and value.strip().startswith("{"):
            try:
                parsed = orjson.loads(value)
            except orjson.JSONDecodeError:
                return False, value
            return isinstance(parsed, dict), parsed
        return False, value
    return False, value


def exact_float(value: float) -> bool:
    """Whether ``value`` may be what the model wrote: finite (JSON has no infinity or
    NaN; ``1e999`` overflows), and not an integer past 2^53, where floats skip
    integers (``9007199254740993`` reads as ...992, a 20-digit integer as ``1.8e+19``):
    such a value is refused rather than passed on, or written out, as if exact."""
    return math.isfinite(value) and not lossy_integral(value)


def _clean_number(text: str) -> str:
    """A number string as Python reads it: invisible characters and surrounding space
    dropped, full-width digits made ASCII, thousands separators removed."""
    text = strip_invisible(text).translate(_WIDE_DIGITS).strip()
    if "," in text and _THOUSANDS_RE.fullmatch(text):
        text = text.replace(",", "")
    return text


def _to_int(value: Any) -> tuple[bool, Any]:
    """An integer read exactly, within signed 64 bits (beyond, it could only be stored
    as an approximating float: refused)."""
    if isinstance(value, float) and value.is_integer() and exact_float(value):
        return True, int(value)
    if isinstance(value, str):
        text = _clean_number(value)
        if len(text) <= _MAX_DIGITS and _INT_RE.fullmatch(text) \
                and not _DOT_THOUSANDS_RE.fullmatch(text):
            # "12.0", "12.00": exactly 12; "10.000" (one dot, three digits) may be ten
            # thousand written with a dot: ambiguous, refused
            number = int(text.split(".", 1)[0])
            if _MIN_INT <= number <= _MAX_INT:
                return True, number
    return False, value


def _to_number(value: Any) -> tuple[bool, Any]:
    if isinstance(value, str):
        text = _clean_number(value)
        if len(text) > _MAX_DIGITS:
            return False, value
        if _INT_RE.fullmatch(text) and "." not in text:
            whole = int(text)
            # beyond 64 bits only an approximating float: refused
            return (True, whole) if _MIN_INT <= whole <= _MAX_INT else (False, value)
        if _FLOAT_RE.fullmatch(text):
            number = float(text)
            if math.isfinite(number):  # "1e999" is no number JSON can hold
                return True, number
    return False, value


def _to_bool(value: Any) -> tuple[bool, Any]:
    if isinstance(value, str):
        text = unicodedata.normalize("NFKC", value).strip().casefold()
        for form in (text, text.rstrip(_CLOSING_MARKS)):  # "Yes." ends a sentence
            if form in _TRUE:
                return True, True
            if form in _FALSE:
                return True, False
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
        return True, bool(value)
    return False, value


#: A quoted Python string literal.
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'" + r'|"(?:[^"\\]|\\.)*"', re.S)
#: A bare item of a list written without quotes (``[billing, refund]``).
_BARE_ITEM = re.compile(r"[^\[\]{}\"',]*[^\[\]{}\"',\s][^\[\]{}\"',]*")


def _written_list(text: str) -> list[Any] | None:
    """A bracketed list written as text that is not JSON: a Python literal of strings
    (``['billing', 'refund']``), or bare words between commas (``[billing, refund]``,
    read as strings); else None (the text is then taken as one item, as before: a
    subject line "[EXTERNAL] Re: invoice [#123]" is no list)."""
    try:
        parsed = ast.literal_eval(text) if len(text) <= 10_000 else None
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        parsed = None
    if isinstance(parsed, list | tuple):
        # Strings only, one a quoted literal (Python joins 'a' 'b' into one; a True, a
        # 0x10 or a 1_000 is no text a model meant as such)
        if parsed and all(type(v) is str for v in parsed) \
                and len(_QUOTED.findall(text)) == len(parsed):
            return list(parsed)
        return None
    parts = text[1:-1].split(",")
    if all(_BARE_ITEM.fullmatch(p) for p in parts):
        return [p.strip() for p in parts]
    return None


def _to_array(value: Any, node: Node) -> tuple[bool, Any]:
    if isinstance(value, str):
        text = value.strip()
        if not text or text.lower() in _NULL:
            return False, value  # nothing said ("", "N/A"): not a one-element list
        if text.startswith("["):
            try:
                parsed = orjson.loads(text)
            except orjson.JSONDecodeError:
                parsed = _written_list(text) if text.endswith("]") else None
            if isinstance(parsed, list):
                return True, parsed
        parts = _split(text, node.items)
        if parts is not None:
            return True, parts
    if value is None or isinstance(value, list):
        return False, value
    items = node.items
    if items is not None and items.types and json_type(value) not in items.types \
            and not (isinstance(value, int) and not isinstance(value, bool)
                     and "number" in items.types) \
            and not (isinstance(value, str) and any(
                t in items.types and _to(value, t, items)[0] for t in ("integer", "number"))):
        # A lone value of another type than the items ("tags": false, "tags": 3): a
        # one-element list of it would be a value the model never gave.
        return False, value
    return True, [value]


def _split(text: str, items: Node | None) -> list[str] | None:
    """``text`` as the list it writes, where that reading is the only one: parts
    separated by the enumeration comma ``、`` (which only ever separates items), or by
    commas or semicolons when every part is a member of the items' enum or every part is
    a number of the items' type, the whole is not one ("1,234") and no comma stands
    between two digits ("19,99", "1,5, 2,5": a decimal comma, or a thousands one, as
    well as a list's: ``"1, 2"`` and ``"1; 2"`` are split). Otherwise None: a comma
    may belong to the value ("Washington, D.C.")."""
    if items is None or _LIST_SPLIT_RE.search(text) is None:
        return None
    if "、" in text and (not items.types or "string" in items.types) and items.enum is None:
        parts = [p for p in _ENUMERATION_SPLIT_RE.split(text) if p]
        if not any(_LIST_SPLIT_RE.search(p) for p in parts):
            return parts
        return None
    if _COMMA_RE.search(text) and _SEMICOLON_RE.search(text):
        return None  # "1,5; 2,5": a comma inside items separated by semicolons
    if _DIGIT_COMMA_RE.search(text) and ("integer" in items.types or "number" in items.types
                                         or any(type(m) in (int, float)
                                                for m in items.enum or ())):
        return None  # "19,99", "1,5, 2,5": a comma between digits may be a decimal one
    parts = [p for p in _LIST_SPLIT_RE.split(text) if p]
    if len(parts) < 2:
        return None
    if items.enum is not None:
        scratch = Fixes()
        if all(p in items.enum or _enum_member(p, items.enum, scratch, "") in items.enum
               for p in parts):
            return parts
        return None
    for target in ("integer", "number"):
        if target in items.types and "string" not in items.types \
                and not _to(text, target, items)[0] \
                and all(_to(p, target, items)[0] for p in parts):
            return parts
    return None


#: What may end a one-word answer as a sentence (after NFKC: ASCII forms).
_CLOSING_MARKS = " .!。"
#: Spaces, hyphens and underscores between a letter and a letter or digit: one word
#: separator (never between two digits: "1 2" is no range "1-2"; "U 235" is "U-235").
_WORD_GAP = re.compile(r"(?<=[^\W\d_])[\s_\-]+(?=[^\W_])|(?<=[^\W_])[\s_\-]+(?=[^\W\d_])")


def fold_value(text: str) -> str:
    """The form in which two enum values are the same: case, width, invisible
    characters and the amount of space between words aside. Signs, dots, dashes and
    underscores stay (unlike a field name's fold): "+1" is not "-1", "A-" not "A"."""
    text = unicodedata.normalize("NFKC", strip_invisible(text)).casefold()
    return " ".join(text.split())


def _words(folded: str) -> str:
    """A folded enum value with every space, hyphen or underscore run between two
    letters (or a letter and a digit) made one ``_``: "request changes" is
    "request_changes"; signs
    and edges stay ("+1", "-1", "A-")."""
    return _WORD_GAP.sub("_", folded)


#: A value wrapped whole in Markdown emphasis, backticks or quotes: the same mark on
#: both ends (curly quotes and CJK corner brackets in their pairs: “”, ‘’, 「」, 『』),
#: the text inside (the group after the mark) not blank.
_WRAPPED = re.compile(r"""(\*{1,3}|_{1,3}|`+|"|')(?=\S)(.+?)(?<=\S)\1|“(.+)”|‘(.+)’"""
                      r"|「(.+)」|『(.+)』", re.S)


#: The marks :func:`_unwrapped` takes off a value's ends.
_MARKS = "*_`\"'\u201c\u201d\u2018\u2019「」『』"


def _unwrapped(folded: str) -> str:
    """A folded value without the emphasis, backticks, quotes or corner brackets
    wrapped whole around it (a few levels: ``"**positive**"``); as it is when none
    is."""
    for _ in range(3):
        m = _WRAPPED.fullmatch(folded)
        inner = next((g for g in m.groups()[1:] if g is not None), "") if m is not None \
            else ""
        if m is None or m.group()[0] in inner:
            break  # (no mark of its own inside: "*a* and *b*" is no wrapped member)
        folded = " ".join(inner.split())
    return folded


def _enum_member(value: Any, enum: tuple[Any, ...], fixes: Fixes, path: str) -> Any:
    if isinstance(value, str):
        folded = fold_value(value)
        matches: list[Any] = [m for m in enum if isinstance(m, str) and fold_value(m) == folded]
        if not matches and "&" in folded and (unescaped := fold_value(
                html.unescape(value))) != folded:
            # "Café &amp; Bar": the member written as HTML ("Café & Bar")
            matches = [m for m in enum if isinstance(m, str) and fold_value(m) == unescaped]
        if not matches and folded.rstrip(_CLOSING_MARKS) != folded:
            # "positive." - a sentence's end, where no member ends so
            folded = folded.rstrip(_CLOSING_MARKS)
            matches = [m for m in enum if isinstance(m, str) and fold_value(m) == folded]
        if not matches and (inner := _unwrapped(folded)) != folded and not any(
                isinstance(m, str) and m and (m[0] in _MARKS or m[-1] in _MARKS)
                for m in enum):
            # "**positive**", "`positive`", "'positive'", "『positive』": the member
            # marked up whole (never when a member's own ends are such marks: "*A*",
            # "__init__", "'no'", "「A」")
            matches = [m for m in enum if isinstance(m, str) and fold_value(m) == inner]
        if not matches and _WORD_GAP.search(folded):
            # "Request Changes" for request_changes: only when one member reads so
            # (two that differ only in separators both match, and neither is taken)
            words = _words(folded)
            matches = [m for m in enum if isinstance(m, str) and _words(fold_value(m)) == words]
        if not matches and None in enum and fold_value(value) in _NULL:
            matches = [None]  # "null", "N/A" where null is a member (strict mode)
        if len(matches) != 1:
            num_ok, num = _to_number(value)
            matches = [m for m in enum if num_ok and not isinstance(m, bool | str) and m == num]
    elif isinstance(value, int | float) and not isinstance(value, bool):
        # str() for an int of any size (orjson writes 64 bits and raised on more)
        text = str(value) if isinstance(value, int) else orjson.dumps(value).decode()
        matches = [m for m in enum if isinstance(m, str) and m.strip() == text]
    else:
        matches = []
    if len(matches) == 1:
        fixes.coerce(f"enum:{path or '$'}")
        return matches[0]
    return value
