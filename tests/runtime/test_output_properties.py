"""Properties of the output ladder over generated outputs (hypothesis).

(a) a valid object in any number of single-key wrappers and chatter comes back equal;
(b) a valid object cut at any byte never yields a field value that was not complete
    in the text;
(c) an output from which no declared field is recovered is never usable;
(d) ``parse_output`` never raises (arbitrary text, bytes decoded with surrogates, lone
    surrogates, NUL bytes, JSON-like fragments), and a usable value can always be
    written as JSON.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lockgate.runtime import ParseStatus, parse_output
from lockgate.runtime.output import INTERNAL
from lockgate.spec import DeliveryRule

# Field names that neither fold to nor are close misspellings of each other, of the
# wrapper names, or of the unrelated keys below.
FIELDS = ["category", "severity", "summary", "级别", "模块", "原因", "answer", "note",
          "risk_level", "confidence", "tags", "需要告警"]
WRAPPERS = ["result", "data", "output", "payload", "response", "输出", "结果", "答案", "分析"]
UNRELATED = ["text", "lang", "id", "model", "ms", "描述", "来源", "备选", "input"]
KINDS = ["string", "integer", "number", "boolean", "enum", "strings"]
ENUM = ["物流", "质量", "yes", "no", "safe", "unsafe"]
SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


def _schema(fields: dict[str, str]) -> dict[str, Any]:
    props: dict[str, Any] = {}
    for name, kind in fields.items():
        if kind == "enum":
            props[name] = {"enum": ENUM}
        elif kind == "strings":
            props[name] = {"type": "array", "items": {"type": "string"}}
        else:
            props[name] = {"type": kind}
    return {"type": "object", "properties": props}


_texts = st.text(st.characters(exclude_categories=("Cs",)), max_size=40)


def _value(kind: str) -> st.SearchStrategy[Any]:
    return {
        "string": _texts,
        "integer": st.integers(min_value=-10**6, max_value=10**6),
        "number": st.floats(allow_nan=False, allow_infinity=False, width=32),
        "boolean": st.booleans(),
        "enum": st.sampled_from(ENUM),
        "strings": st.lists(_texts, max_size=3),
    }[kind]


@st.composite
def _task(draw: st.DrawFn) -> tuple[dict[str, str], dict[str, Any]]:
    """Declared fields with their kinds, and an object giving some of them (one at
    least with a non-blank value)."""
    names = draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=4, unique=True))
    fields = {n: draw(st.sampled_from(KINDS)) for n in names}
    obj = {n: draw(_value(k)) for n, k in fields.items()}
    keep = draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
    obj = {n: v for n, v in obj.items() if n in keep}
    if all(v is None or (isinstance(v, str) and not v.strip()) for v in obj.values()):
        obj[next(iter(obj))] = "x"
    return fields, obj


def _chatter() -> st.SearchStrategy[str]:
    # No bracket of any width: a bracket in the chatter is JSON-like text of its own.
    return st.text(st.characters(exclude_categories=("Cs",), exclude_characters="{}[]｛｝［］"),
                   max_size=60)


def _dump(value: Any, indent: bool, ascii_only: bool) -> str:
    return json.dumps(value, ensure_ascii=ascii_only, indent=2 if indent else None)


@SETTINGS
@given(task=_task(), wrappers=st.lists(st.sampled_from(WRAPPERS), max_size=5),
       before=_chatter(), after=_chatter(), indent=st.booleans(), ascii_only=st.booleans())
@example(task=({"answer": "enum", "note": "string"}, {"answer": "yes", "note": "a: “b”，c"}),
         wrappers=["输出", "payload"], before="好的：", after="", indent=False,
         ascii_only=False)
def test_a_wrapped_object_in_chatter_comes_back_equal(
        task: tuple[dict[str, str], dict[str, Any]], wrappers: list[str], before: str,
        after: str, indent: bool, ascii_only: bool) -> None:
    fields, obj = task
    rule = DeliveryRule.model_validate({"schema": _schema(fields)})
    wrapped: Any = obj
    for w in wrappers:
        wrapped = {w: wrapped}
    p = parse_output(f"{before}{_dump(wrapped, indent, ascii_only)}{after}", rule)
    assert p.usable, p
    assert p.value == obj


@SETTINGS
@given(task=_task(), wrappers=st.lists(st.sampled_from(WRAPPERS), max_size=2),
       indent=st.booleans(), ascii_only=st.booleans(), data=st.data())
def test_b_a_cut_object_yields_only_values_that_were_complete(
        task: tuple[dict[str, str], dict[str, Any]], wrappers: list[str], indent: bool,
        ascii_only: bool, data: st.DataObject) -> None:
    fields, obj = task
    rule = DeliveryRule.model_validate({"schema": _schema(fields)})
    wrapped: Any = obj
    for w in wrappers:
        wrapped = {w: wrapped}
    raw = _dump(wrapped, indent, ascii_only).encode()
    cut = data.draw(st.integers(min_value=0, max_value=len(raw) - 1), label="cut")
    p = parse_output(raw[:cut].decode("utf-8", "ignore"), rule)
    assert p.status in ParseStatus
    if p.usable:
        assert set(p.value) <= set(fields)
        for name, value in p.value.items():
            assert name in obj and value == obj[name], (name, value)


@st.composite
def _nothing(draw: st.DrawFn) -> tuple[DeliveryRule, str]:
    """A rule with a fallback for every field, and an output from which no declared
    field can be recovered: unrelated keys, blank or invalid declared values, any
    wrappers and chatter, possibly cut off."""
    names = draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=4, unique=True))
    fields = {n: draw(st.sampled_from(["string", "integer", "enum"])) for n in names}
    fallbacks = {n: draw(st.sampled_from(["", None, 0, "物流", "n/a"])) for n in names}
    required = draw(st.lists(st.sampled_from(names), unique=True))
    schema = {**_schema(fields), "required": required}
    rule = DeliveryRule.model_validate({"schema": schema, "fallback_values": fallbacks})
    blank = st.sampled_from([None, "", "  ", "\n"])
    invalid = {"string": blank, "integer": st.sampled_from(["abc", "很多", None, ""]),
               "enum": st.sampled_from(["zzz-unknown", "不确定", None, "", 3])}
    obj: dict[str, Any] = {}
    for n in draw(st.lists(st.sampled_from(names), unique=True)):
        obj[n] = draw(invalid[fields[n]])
    # Unrelated values hold no bracket: a JSON text inside a string is read as an
    # answer of its own (and may hold declared fields).
    plain = _chatter()
    for k in draw(st.lists(st.sampled_from(UNRELATED), unique=True)):
        obj[k] = draw(st.one_of(plain, st.integers(), st.lists(plain, max_size=2),
                                st.dictionaries(st.sampled_from(UNRELATED), plain,
                                                max_size=2)))
    wrapped: Any = obj
    for w in draw(st.lists(st.sampled_from(WRAPPERS), max_size=3)):
        wrapped = {w: wrapped, **draw(st.dictionaries(st.sampled_from(UNRELATED), plain,
                                                      max_size=2))}
    text = json.dumps(wrapped, ensure_ascii=draw(st.booleans()))
    if draw(st.booleans()):  # cut off: the output ends there (no chatter after it, which
        # could complete the cut text into a value)
        return rule, draw(_chatter()) + text[:draw(st.integers(0, len(text)))]
    return rule, draw(_chatter()) + text + draw(_chatter())


@SETTINGS
@given(case=_nothing())
@example(case=(DeliveryRule.model_validate({
    "schema": {"type": "object", "properties": {"a": {"type": "string"},
                                                "b": {"type": "string"}}},
    "fallback_values": {"a": "", "b": ""}}), '{"payload": {"answer": {"x": 1}}}'))
def test_c_no_declared_field_recovered_is_never_usable(case: tuple[DeliveryRule, str]) -> None:
    rule, raw = case
    p = parse_output(raw, rule)
    assert not p.usable, p
    assert p.status in (ParseStatus.SCHEMA_VIOLATION, ParseStatus.INVALID_JSON,
                        ParseStatus.NO_JSON_FOUND)


RULES = [
    DeliveryRule(),
    DeliveryRule(format="text"),
    DeliveryRule.model_validate({"schema": _schema({"answer": "enum", "note": "string",
                                                    "tags": "strings"}),
                                 "fallback_values": {"note": "", "tags": None},
                                 "aliases": {"answer": ["回答"]}}),
    DeliveryRule.model_validate({"schema": {"type": "array", "items": {"type": "object"}}}),
    DeliveryRule.model_validate({"required_keys": ["级别"], "fallback_values": {"原因": ""},
                                 "keep_truncated": True}),
]
_FRAGMENTS = ['{', '}', '[', ']', '"', "'", ':', ',', '：', '，', '“', '”', '‘', '’', '｛', '｝',
              '［', '］', '＂', '\\', '\\u', 'd800', 'true', 'None', '1', '-', '.', 'e9', ' ',
              '\n', '\x00', '\ud800', '\udfff', '\ud83d\ude00', '```', '```json\n', '<think>',
              '</think>', '//', '/*', '*/', 'answer', 'note', '回答', 'yes', '级别', '　', '４']
_json_like = st.lists(st.sampled_from(_FRAGMENTS), max_size=80).map("".join)
_any_text = st.one_of(
    st.text(max_size=300),
    st.text(st.characters(categories=("Cs", "Cc", "Lo", "Po", "Ps", "Pe")), max_size=100),
    st.binary(max_size=300).map(lambda b: b.decode("utf-8", "surrogateescape")),
    st.binary(max_size=300).map(lambda b: b.decode("utf-8", "surrogatepass")
                                if _decodes(b) else b.decode("latin-1")),
    _json_like,
)


def _decodes(b: bytes) -> bool:
    try:
        b.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        return False
    return True


def _check(raw: str, rule: DeliveryRule) -> None:
    p = parse_output(raw, rule)
    assert p.status in ParseStatus
    assert not (p.error or "").startswith(INTERNAL), p.error
    assert 0.0 <= p.completeness <= 1.0
    if p.usable:
        orjson.dumps(p.value)  # the worker stores it as JSON


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=_any_text, rule=st.sampled_from(RULES))
@example(raw="\ud800", rule=RULES[2])
@example(raw='{"answer": "yes", "note": "\ud800"}', rule=RULES[2])
@example(raw='{"answer": "yes", "note": "\\ud800"', rule=RULES[2])
@example(raw='{"answer": "yes", "note": "a\x00b"}\x00', rule=RULES[2])
def test_d_parse_never_raises(raw: str, rule: DeliveryRule) -> None:
    _check(raw, rule)
