"""Read the output schema and labelling rules out of a prompt's instruction text.

The simulator answers like a model that follows instructions literally: it outputs the
fields the prompt asks for, restricted to the values the prompt allows, and labels with
the rules the prompt states. So a better prompt (more, better rules) really scores
higher in a release gate than a worse one. The grammar is documented in
``docs/simulator.md``; in short:

* **schema**: the first JSON object in the instructions. A JSON Schema (an object with
  ``properties``) gives names, types, ``enum`` and ``minimum``/``maximum``; a plain
  example gives names and types from the example values (``"a|b|c"`` means one of
  a, b, c);
* **value lines**: ``field: one of a, b, c`` / ``field：取值 a、b、c`` / ``field: yes/no``
  / ``field: integer 1-5`` / ``field: text, at most 30 characters``;
* **rules**: ``if the text mentions k1|k2 then field = value`` (also ``->``, ``→``,
  ``如果文本提到 k1、k2 则 field = value``), ``k1|k2 -> field = value`` and
  ``otherwise field = value``; the first matching rule per field wins.

Parsing happens once per distinct instruction text (callers cache it); nothing here
runs per request.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import Any

import orjson

#: Field kinds the simulator can produce.
ENUM, INT, NUMBER, BOOL, TEXT, LIST, NULL = "enum", "int", "number", "bool", "text", "list", "null"

DEFAULT_INT_RANGE = (0, 10)


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One output field: its kind and the values it may take."""

    name: str
    kind: str
    choices: tuple[str, ...] = ()
    lo: int = DEFAULT_INT_RANGE[0]
    hi: int = DEFAULT_INT_RANGE[1]
    max_chars: int | None = None


@dataclass(frozen=True, slots=True)
class Rule:
    """A labelling rule: when any keyword occurs (or always, if none), assign values."""

    keywords: tuple[str, ...]
    assignments: tuple[tuple[str, Any], ...]
    #: The keywords plus their full-width spellings: what inputs are searched for.
    forms: tuple[str, ...] = ()
    #: The field a single-assignment rule sets (lets decided fields skip the search).
    single: str | None = None

    @classmethod
    def make(cls, keywords: tuple[str, ...], assignments: tuple[tuple[str, Any], ...]) -> Rule:
        """A rule with its search forms precomputed (none for an ``otherwise`` rule)."""
        forms = tuple(form for kw in keywords for form in keyword_forms(kw))
        single = assignments[0][0] if len(assignments) == 1 else None
        return cls(keywords, assignments, forms, single)


@dataclass(frozen=True, slots=True)
class PromptSpec:
    """What a prompt asks for; ``fields`` empty means a plain-text answer."""

    fields: tuple[FieldSpec, ...]
    rules: tuple[Rule, ...]
    #: How many distinct fields the rules can set (rule evaluation stops when all are).
    rule_fields: int = 0

    @property
    def wants_json(self) -> bool:
        return bool(self.fields)


def fold(text: str) -> str:
    """The form keywords are kept in: NFKC (full-width -> half-width), then lower case."""
    return unicodedata.normalize("NFKC", text).lower()


_TO_FULL_WIDTH = {c: c + 0xFEE0 for c in range(0x21, 0x7F)}


def keyword_forms(keyword: str) -> tuple[str, ...]:
    """The folded keyword and, if it has ASCII, its full-width spelling.

    Inputs are only lower-cased per request (NFKC costs more than everything else the
    request path does), so the full-width variant lets ``ＡＰＰ`` in an input match a
    rule written as ``app`` without normalising each input.
    """
    folded = fold(keyword)
    wide = folded.translate(_TO_FULL_WIDTH)
    return (folded,) if wide == folded else (folded, wide)


# ---------------------------------------------------------------------------- JSON schema

def _json_objects(text: str) -> list[str]:
    """Balanced ``{...}`` spans in ``text`` (string-aware), outermost only."""
    spans: list[str] = []
    depth = 0
    start = -1
    in_str = False
    escaped = False
    for i, ch in enumerate(text):
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"' and depth:
            in_str = True
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0:
                spans.append(text[start:i + 1])
    return spans


def _example_field(name: str, value: Any) -> FieldSpec:
    if isinstance(value, bool):
        return FieldSpec(name, BOOL)
    if isinstance(value, int):
        return FieldSpec(name, INT)
    if isinstance(value, float):
        return FieldSpec(name, NUMBER)
    if isinstance(value, list):
        return FieldSpec(name, LIST)
    if value is None:
        return FieldSpec(name, NULL)
    if isinstance(value, str) and "|" in value:
        choices = tuple(v.strip() for v in value.split("|") if v.strip())
        if len(choices) > 1:
            return FieldSpec(name, ENUM, choices)
    return FieldSpec(name, TEXT)


_SCHEMA_TYPES = {"integer": INT, "number": NUMBER, "boolean": BOOL, "string": TEXT,
                 "array": LIST, "null": NULL}


def _schema_field(name: str, prop: Any) -> FieldSpec:
    if not isinstance(prop, dict):
        return FieldSpec(name, TEXT)
    if isinstance(prop.get("enum"), list) and prop["enum"]:
        return FieldSpec(name, ENUM, tuple(str(v) for v in prop["enum"]))
    kind = _SCHEMA_TYPES.get(str(prop.get("type")), TEXT)
    if kind == INT:
        lo = prop.get("minimum", DEFAULT_INT_RANGE[0])
        hi = prop.get("maximum", DEFAULT_INT_RANGE[1])
        if isinstance(lo, int) and isinstance(hi, int) and lo <= hi:
            return FieldSpec(name, INT, lo=lo, hi=hi)
    if kind == TEXT and isinstance(prop.get("maxLength"), int):
        return FieldSpec(name, TEXT, max_chars=prop["maxLength"])
    return FieldSpec(name, kind)


def schema_fields(text: str) -> list[FieldSpec]:
    """Fields from the first JSON object in ``text`` that parses (schema or example)."""
    for span in _json_objects(text):
        try:
            doc = orjson.loads(span)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(doc, dict) or not doc:
            continue
        props = doc.get("properties")
        if isinstance(props, dict) and props:
            return [_schema_field(str(k), v) for k, v in props.items()]
        return [_example_field(str(k), v) for k, v in doc.items()]
    return []


# ---------------------------------------------------------------------------- value lines

_BULLET = re.compile(r"^\s*(?:[-*•·+]|\d{1,3}[.)、]|[(（]\d{1,3}[)）])\s*")
_QUOTES = "`\"'“”‘’「」『』 \t"
_TRAIL = " \t.。;；,，!！"
_PARENS = re.compile(r"[(（][^)）]*[)）]")
_NAME = r"[`\"'“”]?(?P<name>[A-Za-z_][A-Za-z0-9_\-]*)[`\"'“”]?"
_VALUE_LINE = re.compile(rf"^{_NAME}\s*(?:[(（][^)）]*[)）])?\s*[:：]\s*(?P<spec>.+)$")
_ENUM_MARK = re.compile(
    r"(?:must\s+be\s+)?(?:one\s+of|any\s+of|either|选自|取值(?:范围)?(?:为|是)?|"
    r"可选值?(?:为|有|是)?|以下之一|其中之一|之一)\s*[:：]?", re.IGNORECASE)
_VALUE_SEP = re.compile(r"\s*(?:[,，、|/;；]|\s+or\s+|\s+或\s+)\s*", re.IGNORECASE)
_YES_NO = re.compile(r"^[`\"']?(yes|no)[`\"']?\s*(?:/|\||or|或)\s*[`\"']?(yes|no)\b", re.I)
_BOOL_MARK = re.compile(r"\b(?:boolean|bool|true\s*(?:/|or)\s*false)\b|布尔", re.I)
_INT_MARK = re.compile(r"\b(?:integer|int|number|score|rating)\b|整数|数字|分数|评分|分值", re.I)
_RANGE = re.compile(
    r"(-?\d+)\s*(?:-|–|—|~|～|\.\.|to|至|到|and)\s*(-?\d+)", re.IGNORECASE)
_LEADING_RANGE = re.compile(r"^\s*(?:from\s+|between\s+)?(-?\d+)\s*(?:-|–|~|～|\.\.|to|至|到)"
                            r"\s*(-?\d+)\b", re.IGNORECASE)
_TEXT_MARK = re.compile(
    r"\b(?:text|string|summary|sentence|words?|characters?|chars|excerpt|description)\b|"
    r"文本|摘要|字符串|概括|总结|描述|字", re.IGNORECASE)
_MAX_CHARS = re.compile(
    r"(?:at\s+most|up\s+to|max(?:imum)?|no\s+more\s+than|under|<=|≤|不超过|最多|少于)\s*"
    r"(\d+)|(\d+)\s*(?:个)?(?:字|字符)以内", re.IGNORECASE)


def split_values(text: str) -> tuple[str, ...]:
    """Split ``a, b、c | d or e`` into its values, without quotes and trailing dots."""
    out: list[str] = []
    for part in _VALUE_SEP.split(_PARENS.sub("", text)):
        value = part.strip(_QUOTES).rstrip(_TRAIL).strip(_QUOTES)
        if value and value not in out:
            out.append(value)
    return tuple(out)


def _field_from_spec(name: str, spec: str) -> FieldSpec | None:
    """Classify the right-hand side of a value line; None if it declares nothing."""
    if _YES_NO.match(spec.strip()):
        return FieldSpec(name, ENUM, ("yes", "no"))
    mark = _ENUM_MARK.search(spec)
    if mark:
        choices = tuple(v for v in split_values(spec[mark.end():]) if len(v) <= 40)
        if choices:
            return FieldSpec(name, ENUM, choices)
    if _BOOL_MARK.search(spec):
        return FieldSpec(name, BOOL)
    rng = _LEADING_RANGE.match(spec)
    if rng is None and _INT_MARK.search(spec):
        rng = _RANGE.search(spec)
        if rng is None:
            return FieldSpec(name, INT)
    if rng:
        lo, hi = int(rng.group(1)), int(rng.group(2))
        return FieldSpec(name, INT, lo=min(lo, hi), hi=max(lo, hi))
    if _TEXT_MARK.search(spec):
        m = _MAX_CHARS.search(spec)
        limit = int(m.group(1) or m.group(2)) if m else None
        return FieldSpec(name, TEXT, max_chars=limit)
    return None


def strip_bullet(line: str) -> str:
    """A line without its list marker (``-``, ``*``, ``1.``, ``(2)``) and outer spaces."""
    return _BULLET.sub("", line, count=1).strip()


def value_lines(lines: list[str]) -> list[FieldSpec]:
    """Fields declared by value lines, in order of first appearance."""
    found: dict[str, FieldSpec] = {}
    for line in lines:
        m = _VALUE_LINE.match(line)
        if m is None:
            continue
        spec = _field_from_spec(m.group("name"), m.group("spec"))
        if spec is not None and spec.name not in found:
            found[spec.name] = spec
    return list(found.values())


def merge_fields(example: list[FieldSpec], declared: list[FieldSpec]) -> tuple[FieldSpec, ...]:
    """The schema's fields refined by value lines; lines alone when there is no schema."""
    if not example:
        return tuple(declared)
    by_name = {f.name: f for f in declared}
    merged: list[FieldSpec] = []
    for f in example:
        d = by_name.get(f.name)
        if d is None:
            merged.append(f)
        elif d.kind == TEXT and f.kind == TEXT:
            merged.append(d)
        elif d.kind == TEXT:
            merged.append(f)
        else:
            merged.append(d)
    return tuple(merged)


# ---------------------------------------------------------------------------- rules

_IF = r"(?:if|when|whenever|如果|若|假如|当)"
_SUBJECT = (r"(?:the\s+)?(?:text|input|complaint|message|review|content|customer|user|it|"
            r"文本|输入|内容|投诉|评论|用户|客户|原文)?(?:\s*(?:中|里|内))?")
_VERB = (r"(?:mentions?|contains?|includes?|says|has|uses|refers\s+to|talks\s+about|"
         r"提到|提及|包含|含有|出现|涉及|说到|谈到)")
_ANY = r"(?:\s*(?:any\s+of|one\s+of|either|任一|任意|以下任一|其中之一|之一)(?:\s*of)?)?"
_THEN = r"(?:\bthen\b|->|→|=>|⇒|则|那么|就)"
_RULE = re.compile(
    rf"^{_IF}\s*{_SUBJECT}\s*{_VERB}{_ANY}\s*[:：]?\s*(?P<kw>.+?)\s*[,，]?\s*{_THEN}\s*"
    r"(?P<assign>.+)$", re.IGNORECASE)
_ARROW = re.compile(r"^(?P<kw>[^:：=]+?)\s*(?:->|→|=>|⇒)\s*(?P<assign>.+)$")
_DEFAULT = re.compile(
    r"^(?:otherwise|else|by\s+default|default|in\s+all\s+other\s+cases|否则|其他情况(?:下)?|"
    r"其它情况(?:下)?|其余情况(?:下)?|默认)\s*[:：,，]?\s*(?:(?:then|set|则|就)\s*)?"
    r"(?P<assign>.+)$", re.IGNORECASE)
_ASSIGN_SEP = re.compile(r"\s*(?:;|；|,|，|\band\b|并且|且)\s*", re.IGNORECASE)
_ASSIGN = re.compile(
    r"^(?:set\s+|设置\s*)?[`\"'“”]?(?P<field>[A-Za-z_][A-Za-z0-9_\-]*)[`\"'“”]?\s*"
    r"(?:=|:|：|\bis\b|\bto\b|为|设为|取|是)\s*(?P<value>.+)$", re.IGNORECASE)
_KEYWORD_SEP = re.compile(r"\s*(?:[|、,，/]|\s+or\s+)\s*", re.IGNORECASE)


def _coerce(field: FieldSpec, raw: str) -> tuple[bool, Any]:
    """A rule's value in the field's type; (False, None) when it cannot be one."""
    value = raw.strip(_QUOTES).rstrip(_TRAIL).strip(_QUOTES)
    if not value:
        return False, None
    if field.kind == ENUM:
        folded = value.casefold()
        for choice in field.choices:
            if choice.casefold() == folded:
                return True, choice
        return True, value  # a value outside the list: the prompt's mistake, obeyed
    if field.kind in (INT, NUMBER):
        try:
            return True, int(value) if field.kind == INT else float(value)
        except ValueError:
            return False, None
    if field.kind == BOOL:
        folded = value.casefold()
        if folded in ("true", "yes", "是", "1"):
            return True, True
        if folded in ("false", "no", "否", "0"):
            return True, False
        return False, None
    return True, value


def _assignments(text: str, fields: dict[str, FieldSpec]) -> tuple[tuple[str, Any], ...]:
    out: list[tuple[str, Any]] = []
    for part in _ASSIGN_SEP.split(text.strip()):
        m = _ASSIGN.match(part.strip())
        if m is None or m.group("field") not in fields:
            continue
        ok, value = _coerce(fields[m.group("field")], m.group("value"))
        if ok:
            out.append((m.group("field"), value))
    return tuple(out)


def keywords(text: str) -> tuple[str, ...]:
    """The keywords of a rule, folded for matching; quotes and blanks dropped."""
    out: list[str] = []
    for part in _KEYWORD_SEP.split(text):
        kw = fold(part.strip(_QUOTES))
        if kw and kw not in out:
            out.append(kw)
    return tuple(out)


def parse_rule(line: str, fields: dict[str, FieldSpec]) -> Rule | None:
    """A rule from one (bullet-stripped) line, or None if the line is not a rule."""
    m = _DEFAULT.match(line)
    if m:
        assigns = _assignments(m.group("assign"), fields)
        return Rule.make((), assigns) if assigns else None
    m = _RULE.match(line) or _ARROW.match(line)
    if m is None:
        return None
    kws = keywords(m.group("kw"))
    assigns = _assignments(m.group("assign"), fields)
    if not kws or not assigns:
        return None
    return Rule.make(kws, assigns)


def parse_instructions(text: str) -> PromptSpec:
    """Parse instruction text (everything but the input) into fields and rules."""
    lines = [strip_bullet(line) for line in text.splitlines()]
    lines = [line for line in lines if line]
    fields = merge_fields(schema_fields(text), value_lines(lines))
    by_name = {f.name: f for f in fields}
    rules: list[Rule] = []
    if by_name:
        for line in lines:
            rule = parse_rule(line, by_name)
            if rule is not None:
                rules.append(rule)
    ruled = {name for rule in rules for name, _value in rule.assignments}
    return PromptSpec(fields, tuple(rules), len(ruled))
