"""Defects found by a second review of the output runtime, one group per defect.

1. whatever ``json_repair`` raises makes that region unreadable, never the output;
2. a float with zero fraction in an integer field is delivered as an integer;
3. a ``null`` in an optional field whose schema does not admit null is dropped;
4. bracketed prose before a list answer (a citation ``[1]`` inside a sentence,
   ``[Note]`` opening a line) is not the answer when a strict list of strings follows;
5. a list answer wrapped in an object beside scalar metadata, when it validates;
6. a wrapper holding the answer as a JSON text under an answer key beside metadata is
   unwrapped;
7. (reverted) a later value after an answer label or a draft word does not replace the
   first value: only the correction phrases do;
8. a text that closes all its brackets is not reported as cut off;
9. ``json_repair`` work is bounded on many bare values (not on true/false/null);
10. regressions of the first fixes (R1-R11 of the third review): each test below
    failed on the code before them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lockgate.runtime import ParseStatus, parse_output
from lockgate.runtime.output import INTERNAL
from lockgate.spec import DeliveryRule

S = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["label", "score"],
    "properties": {"label": {"enum": ["positive", "negative", "neutral"]},
                   "score": {"type": "number"}, "summary": {"type": "string"}}}})
G = '{"label": "positive", "score": 0.9}'
N = '{"label": "negative", "score": 0.2}'
GV = {"label": "positive", "score": 0.9}
SETTINGS = settings(max_examples=150, deadline=None)
#: Status values that report a failure (such a wrapper is never unwrapped).
_FAILED = frozenset({"error", "failed", "failure", "refused", "rejected"})


def _rule(schema: dict[str, Any], **extra: Any) -> DeliveryRule:
    return DeliveryRule.model_validate({"schema": schema, **extra})


# 1. json_repair failures --------------------------------------------------------------

@pytest.mark.parametrize("raw", [
    "{'```json```5'}\n" + G,
    "Draft {'```json```5'} then " + G,
])
def test_json_repair_assertion_fails_only_its_region(raw: str) -> None:
    p = parse_output(raw, S)
    assert p.usable and p.value == GV, p
    assert not (p.error or "").startswith(INTERNAL)


def test_json_repair_assertion_alone_is_invalid_json_not_internal() -> None:
    p = parse_output("{'```json```5'}", S)
    assert not p.usable
    assert not (p.error or "").startswith(INTERNAL), p.error


@SETTINGS
@given(exc=st.sampled_from([AssertionError, ValueError, IndexError, KeyError, TypeError,
                            AttributeError, RecursionError, UnicodeDecodeError,
                            ZeroDivisionError, RuntimeError]),
       lead=st.sampled_from(["{label: positive, score: 0.9", "{'a': 'b' 'c'}", "{x y z}"]))
def test_any_json_repair_exception_fails_only_its_region(exc: type[Exception],
                                                         lead: str) -> None:
    import json_repair

    def broken(*_a: Any, **_k: Any) -> Any:
        if exc is UnicodeDecodeError:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad")
        raise exc("boom")

    original = json_repair.repair_json
    json_repair.repair_json = broken
    try:
        p = parse_output(f"{lead}\n\n{G}", S)
    finally:
        json_repair.repair_json = original
    assert p.usable and p.value == GV, p


# 2. integral floats in integer fields ----------------------------------------------------

INT = _rule({"type": "object", "properties": {"n": {"type": "integer"}}})


@pytest.mark.parametrize("raw", ['{"n": 3.0}', 'Result: {"n": 3.0}', '{"n": 3.000}',
                                 "{'n': 3.0}"])
def test_integral_float_in_integer_field_becomes_int(raw: str) -> None:
    p = parse_output(raw, INT)
    assert p.usable, p
    assert p.value == {"n": 3} and type(p.value["n"]) is int, p
    assert p.status is ParseStatus.COERCED


def test_fractional_float_in_integer_field_stays_a_violation() -> None:
    p = parse_output('{"n": 3.5}', INT)
    assert p.status is ParseStatus.SCHEMA_VIOLATION


@SETTINGS
@given(n=st.integers(min_value=-(1 << 53) + 1, max_value=(1 << 53) - 1),
       where=st.sampled_from(["top", "nested", "list"]))
def test_integral_floats_are_delivered_as_ints(n: int, where: str) -> None:
    schema: dict[str, Any] = {"type": "integer"}
    value: Any = float(n)
    if where == "nested":
        schema = {"type": "object", "properties": {"m": schema}}
        value = {"m": value}
    elif where == "list":
        schema = {"type": "array", "items": schema}
        value = [value, value]
    rule = _rule({"type": "object", "required": ["k"], "properties": {"k": schema}})
    p = parse_output(json.dumps({"k": value}), rule)
    assert p.usable, p

    def ints(v: Any) -> bool:
        if isinstance(v, dict):
            return all(ints(x) for x in v.values())
        if isinstance(v, list):
            return all(ints(x) for x in v)
        return type(v) is int and v == n
    assert ints(p.value["k"]), p.value


# 3. null in optional fields ------------------------------------------------------------

TICKET = _rule({
    "type": "object", "required": ["customer", "actions"],
    "properties": {
        "customer": {"type": "object", "required": ["name"],
                     "properties": {"name": {"type": "string"}, "email": {"type": "string"}}},
        "actions": {"type": "array", "items": {
            "type": "object", "required": ["action"],
            "properties": {"action": {"type": "string"}, "due_days": {"type": "integer"}}}}}},
    fallback_values={"actions": []})


def test_null_in_optional_field_is_dropped() -> None:
    p = parse_output('{"label": "positive", "score": 0.9, "summary": null}', S)
    assert p.status is ParseStatus.REPAIRED, p
    assert p.value == GV
    assert "null_dropped:summary" in p.fixes


def test_null_in_nested_optional_fields_is_dropped() -> None:
    raw = json.dumps({"customer": {"name": "Ann", "email": None},
                      "actions": [{"action": "call", "due_days": None},
                                  {"action": "mail", "due_days": 2}]})
    p = parse_output(raw, TICKET)
    assert p.status is ParseStatus.REPAIRED, p
    assert p.value == {"customer": {"name": "Ann"},
                       "actions": [{"action": "call"}, {"action": "mail", "due_days": 2}]}
    assert "null_dropped:customer.email" in p.fixes
    assert "null_dropped:actions[0].due_days" in p.fixes


def test_null_in_required_field_is_unchanged() -> None:
    p = parse_output('{"label": null, "score": 0.9}', S)
    assert p.status is ParseStatus.SCHEMA_VIOLATION
    p = parse_output('{"customer": {"name": null}, "actions": []}', TICKET)
    assert p.status is ParseStatus.SCHEMA_VIOLATION


def test_null_kept_where_the_schema_admits_it() -> None:
    rule = _rule({"type": "object", "required": ["a"], "properties": {
        "a": {"type": "string"}, "b": {"type": ["string", "null"]},
        "c": {"anyOf": [{"enum": ["x", "y"]}, {"type": "null"}]}, "d": {}}})
    p = parse_output('{"a": "v", "b": null, "c": null, "d": null}', rule)
    assert p.status is ParseStatus.VALID, p
    assert p.value == {"a": "v", "b": None, "c": None, "d": None}


_KIND_SCHEMAS = {"string": {"type": "string"}, "integer": {"type": "integer"},
                 "number": {"type": "number"}, "boolean": {"type": "boolean"},
                 "enum": {"enum": ["a", "b"]},
                 "object": {"type": "object", "properties": {"x": {"type": "string"}}},
                 "array": {"type": "array", "items": {"type": "string"}}}


@SETTINGS
@given(kinds=st.dictionaries(st.sampled_from(["f1", "f2", "f3", "f4"]),
                             st.sampled_from(sorted(_KIND_SCHEMAS)), min_size=1, max_size=4),
       nulls=st.sets(st.sampled_from(["f1", "f2", "f3", "f4"])),
       depth=st.sampled_from(["top", "object", "array"]))
def test_optional_nulls_never_reject(kinds: dict[str, str], nulls: set[str],
                                     depth: str) -> None:
    inner = {"type": "object", "required": ["id"],
             "properties": {"id": {"type": "string"},
                            **{k: _KIND_SCHEMAS[v] for k, v in kinds.items()}}}
    obj = {"id": "x", **{k: None for k in kinds if k in nulls}}
    if depth == "top":
        schema, value, expect = inner, obj, {"id": "x"}
    elif depth == "object":
        schema = {"type": "object", "required": ["id"],
                  "properties": {"id": {"type": "string"}, "sub": inner}}
        value, expect = {"id": "y", "sub": obj}, {"id": "y", "sub": {"id": "x"}}
    else:
        schema = {"type": "object", "required": ["id"],
                  "properties": {"id": {"type": "string"},
                                 "subs": {"type": "array", "items": inner}}}
        value, expect = {"id": "y", "subs": [obj, obj]}, {"id": "y",
                                                          "subs": [{"id": "x"}, {"id": "x"}]}
    p = parse_output(json.dumps(value), _rule(schema))
    assert p.usable, p
    assert p.value == expect
    assert p.status is (ParseStatus.REPAIRED if any(k in nulls for k in kinds)
                        else ParseStatus.VALID)


# 4. bracketed prose before a list answer -----------------------------------------------

STRINGS = _rule({"type": "array", "items": {"type": "string"}})
INTS = _rule({"type": "array", "items": {"type": "integer"}})


@pytest.mark.parametrize(("raw", "rule", "expect"), [
    ('Based on the text [1], the entities are: ["Paris", "Bob"]', STRINGS, ["Paris", "Bob"]),
    ('[Note] The list:\n["Paris", "Bob"]', STRINGS, ["Paris", "Bob"]),
    ('As shown in [2, 5], the names are ["Paris", "Bob"]', STRINGS, ["Paris", "Bob"]),
])
def test_bracketed_prose_loses_to_the_list(raw: str, rule: DeliveryRule,
                                           expect: list[Any]) -> None:
    p = parse_output(raw, rule)
    assert p.usable and p.value == expect, p


@pytest.mark.parametrize(("raw", "expect"), [
    ("[Paris, Bob]", ["Paris", "Bob"]),
    ("The list: [Paris, Bob]", ["Paris", "Bob"]),
    ("[1]", ["1"]),
])
def test_a_repaired_list_alone_is_still_the_answer(raw: str, expect: list[Any]) -> None:
    p = parse_output(raw, STRINGS)
    assert p.usable and p.value == expect, p


_WORDS = st.text(st.characters(categories=("Lu", "Ll")), min_size=1, max_size=8).filter(
    lambda w: w not in ("true", "false", "null", "True", "False", "None"))  # literals
_ITEMS = st.lists(st.text(st.characters(categories=("Lu", "Ll", "Nd", "Zs")), max_size=12)
                  .filter(str.strip), min_size=1, max_size=4)  # a blank item is no answer


@SETTINGS
@given(lead=st.one_of(
    st.builds(lambda w: f"[{w}] The list:", _WORDS),
    st.builds(lambda n, w: f"As the text says [{n}], {w} are:",
              st.integers(min_value=0, max_value=999),
              # (not a word that states a condition: "if" makes the list hypothetical)
              st.sampled_from(["the names", "entities", "Tags", "die Namen", "名字"]))),
    sep=st.sampled_from([" ", "\n", "\n\n"]), items=_ITEMS)
def test_a_strict_list_beats_bracketed_words_before_it(lead: str, sep: str,
                                                       items: list[str]) -> None:
    p = parse_output(f"{lead}{sep}{json.dumps(items, ensure_ascii=False)}", STRINGS)
    assert p.usable and p.value == items, (p, lead)


# 5. list answers wrapped, in JSON Lines, or a lone item ----------------------------------

LIST = _rule({"type": "array", "items": {"type": "object", "required": ["name"],
                                         "properties": {"name": {"type": "string"}}}})
PB = [{"name": "Paris"}, {"name": "Bob"}]


@pytest.mark.parametrize(("raw", "expect"), [
    ('{"entities": [{"name": "Paris"}], "count": 1}', [{"name": "Paris"}]),
    ('{"result": {"entities": [{"name": "Paris"}, {"name": "Bob"}]}}', PB),
    ('{"ok": true, "data": {"items": [{"name": "Paris"}, {"name": "Bob"}], "n": 2}}', PB),
])
def test_list_answer_shapes(raw: str, expect: list[Any]) -> None:
    p = parse_output(raw, LIST)
    assert p.usable and p.value == expect, p


def test_cut_list_answers_stay_unusable() -> None:
    p = parse_output('{"entities": [{"name": "Paris"}, {"name": "Bo', LIST)
    assert not p.usable and p.truncated, p


@pytest.mark.parametrize("raw", [
    '{"name": "Paris"}\n{"name": "Bob"}',
    'Here they are:\n{"name": "Paris"}\n{"name": "Bob"}\n',
    '{"name": "Paris"}\n{"name": "Bob"}\n{"name": "Ev',
    '{"name": "Paris"}',
])
def test_objects_without_brackets_are_no_list_answer(raw: str) -> None:
    # JSON Lines and a lone object are not read as a list (examples and candidates are
    # written so too): the output is refused, never delivered in part.
    p = parse_output(raw, LIST)
    assert not p.usable, p


@SETTINGS
@given(names=st.lists(st.text(st.characters(categories=("Lu", "Ll", "Nd")), min_size=1,
                              max_size=10), min_size=1, max_size=4),
       wrappers=st.lists(st.sampled_from(["result", "data", "output", "entities", "结果"]),
                         min_size=1, max_size=3, unique=True),
       meta=st.dictionaries(st.sampled_from(["count", "ok", "model", "ms", "status"]),
                            st.one_of(st.integers(), st.booleans(),
                                      st.sampled_from(["ok", "success", "", "x1"])),
                            max_size=3))
def test_list_answers_come_back(names: list[str], wrappers: list[str],
                                meta: dict[str, Any]) -> None:
    items = [{"name": n} for n in names]
    value: Any = items
    for w in wrappers:
        value = {w: value}
    value = {**meta, **value}
    raw = json.dumps(value, ensure_ascii=False)
    p = parse_output(raw, LIST)
    assert p.usable and p.value == items, (p, raw)


# 6. a wrapper holding the answer as JSON text beside metadata ----------------------------

@pytest.mark.parametrize("wrapper", [
    {"ok": True, "result": G},
    {"status": "success", "data": G},
    {"status": "success", "data": G, "meta": {"model": "x"}},
    {"note": "{not json", "data": G},
])
def test_wrapper_with_json_text_beside_metadata(wrapper: dict[str, Any]) -> None:
    p = parse_output(json.dumps(wrapper), S)
    assert p.status is ParseStatus.REPAIRED and p.value == GV, p
    assert "unwrapped:object" in p.fixes


@SETTINGS
@given(key=st.sampled_from(["result", "data", "output", "response", "结果"]),
       meta=st.dictionaries(st.sampled_from(["ok", "status", "model", "ms", "id"]),
                            st.one_of(st.integers(), st.booleans(),
                                      st.text(st.characters(exclude_characters="{["),
                                              max_size=10).filter(
                                          lambda t: t.strip().casefold() not in _FAILED)),
                            min_size=1, max_size=3),
       label=st.sampled_from(["positive", "negative", "neutral"]),
       score=st.floats(min_value=0, max_value=1), indent=st.sampled_from([None, 2]),
       chatter=st.sampled_from(["", "Here is the response: "]))
def test_json_text_answers_beside_metadata_come_back(
        key: str, meta: dict[str, Any], label: str, score: float, indent: int | None,
        chatter: str) -> None:
    answer = {"label": label, "score": score}
    wrapper = {**meta, key: json.dumps(answer, indent=indent)}
    p = parse_output(chatter + json.dumps(wrapper, ensure_ascii=False), S)
    assert p.usable and p.value == answer, p


# 7. self-corrections: only the correction phrases name a later value -----------------

@pytest.mark.parametrize("raw", [
    f"Draft reasoning gives {N}.\n\nFinal:\n```json\n{G}\n```",
    f"{N}\n\nCorrected:\n{G}",
    f"{N}\nFinal answer:\n{G}",
    f"{N}\nSo the answer is {G}",
    f"{N}\n最终答案：{G}",
])
def test_the_corrected_value_is_the_answer(raw: str) -> None:
    p = parse_output(raw, S)
    assert p.usable and p.value == GV, p


@pytest.mark.parametrize("raw", [
    f"Answer: {G}\n\nFor example: {N}",
    f"Answer: {G}\nIf the review were negative it would be {N}.",
    f"{G}\n结果：{N}",
    f"At first glance the text is long. {G}\nAnother possible result: {N}",
])
def test_the_first_value_stays_without_a_correction(raw: str) -> None:
    p = parse_output(raw, S)
    assert p.usable and p.value == GV, p


# 8. no "cut off" for texts that close their brackets -------------------------------------

@pytest.mark.parametrize(("raw", "says"), [
    ('{"label" = "positive", "score" = 0.9}', "expected ':'"),
    ('Result: "{\\"label\\": \\"great\\", \\"score\\": 0.9}"', "label"),
    ('"{\\"label\\": \\"great\\", \\"score\\": 0.9}"', "label"),
])
def test_a_closed_text_is_not_reported_cut_off(raw: str, says: str) -> None:
    p = parse_output(raw, S)
    assert not p.usable
    assert not p.truncated, p
    assert "cut off" not in (p.error or ""), p.error
    assert says in (p.error or ""), p.error


def test_escaped_json_after_a_bare_quote_is_read_not_cut() -> None:
    p = parse_output('Here is the "result": {\\"label\\": \\"positive\\", '
                     '\\"score\\": 0.9}', S)
    assert p.usable and p.value == GV, p
    p = parse_output('Here is the "result": {\\"label\\": \\"great\\", '
                     '\\"score\\": 0.9}', S)
    assert not p.usable and not p.truncated and "label" in (p.error or ""), p


@pytest.mark.parametrize("raw", ['{"label": "posi', '{"label" = "positive", "score" = 0.9',
                                 'Result: {\\"label\\": \\"great\\"'])
def test_a_cut_text_is_still_reported_cut_off(raw: str) -> None:
    p = parse_output(raw, S)
    assert not p.usable and p.truncated, p


@SETTINGS
@given(sep=st.sampled_from([" = ", " => ", " -> ", " ", " := "]),
       label=st.sampled_from(["positive", "negative"]),
       score=st.floats(min_value=0, max_value=1), chatter=st.sampled_from(["", "Result: "]))
def test_broken_but_closed_objects_are_not_truncated(sep: str, label: str, score: float,
                                                     chatter: str) -> None:
    raw = f'{chatter}{{"label"{sep}"{label}", "score"{sep}{score}}}'
    p = parse_output(raw, S)
    if not p.usable:
        assert not p.truncated and "cut off" not in (p.error or ""), p


# 9. json_repair's work is bounded --------------------------------------------------------

def test_many_bare_pairs_are_refused_not_repaired_slowly() -> None:
    # json_repair's work on bare key/value pairs grows with their count times the text
    # length (seconds for 3,000 pairs); such a region is refused (timed by a script,
    # not here).
    p = parse_output("{label: positive, score: 0.9, "
                     + ", ".join(f"k{i}: v{i}" for i in range(1000)) + "}", S)
    assert p.status is ParseStatus.INVALID_JSON
    assert not (p.error or "").startswith(INTERNAL)
    from lockgate.runtime.extract import MAX_BARE_WORK, repair, repair_cost

    many = "{" + ", ".join(f"k{i}: v{i}" for i in range(3000)) + "}"
    assert repair_cost(many) > MAX_BARE_WORK
    assert repair(many) is None


def test_a_few_bare_pairs_are_still_repaired() -> None:
    p = parse_output("{label: positive, score: 0.9, "
                     + ", ".join(f"k{i}: v{i}" for i in range(200)) + "}", S)
    assert p.usable and p.value["label"] == "positive" and p.value["score"] == 0.9
    p = parse_output("{label: positive, score: 0.9}", S)
    assert p.usable and p.value == GV


@SETTINGS
@given(n=st.integers(min_value=0, max_value=3000), pad=st.integers(min_value=0,
                                                                  max_value=5000))
def test_repair_cost_counts_bare_pairs_outside_strings(n: int, pad: int) -> None:
    from lockgate.runtime.extract import repair_cost

    quoted = '{"s": "' + "a: b, " * n + "x" * pad + '"}'
    assert repair_cost(quoted) == 0  # pairs inside a string cost nothing
    bare = "{" + ", ".join(f"k{i}: v{i}" for i in range(n)) + "x" * pad + "}"
    assert repair_cost(bare) in (0, n * len(bare))


# 10. regressions of the first fixes (third review) ---------------------------------------

ENT = _rule({"type": "array", "items": {"type": "object", "required": ["name", "type"],
                                        "properties": {"name": {"type": "string"},
                                                       "type": {"type": "string"}}}})
CAT = _rule({"type": "object", "required": ["category"],
             "properties": {"category": {"type": "string"}, "priority": {"type": "integer"}}})
L2 = '[{"name": "Apple", "type": "ORG"}, {"name": "Tim Cook", "type": "PER"}]'
L2V = [{"name": "Apple", "type": "ORG"}, {"name": "Tim Cook", "type": "PER"}]


@pytest.mark.parametrize("raw", [
    f'{G}\n\nReview: "Worst purchase ever, broke in a day."\nAnswer: {N}',
    f"Answer: {G}\n\nReview: \"Broke in a day.\"\nAnswer: {N}",
    f"{G}\n\n### Next example\nText: terrible service\nAnswer:\n{N}",
    f"答案：{G}\n\n评论：很差\n答案：{N}",
    f'**Answer:** {G}\n\n---\n**Review 2:** "meh"\n**Answer:** {N}',
    f"My first guess was {G}, but the reviewer clearly liked it.\n\nAnswer: {N}",
    # ("Before: {G}\nAfter: {N}" was here: "Before:" labels the input echoed, so the
    # value after it is the answer, test_review_i18n_4.py)
])
def test_r1_a_later_answer_label_does_not_replace_the_first_value(raw: str) -> None:
    # Few-shot continuations label every value "Answer:": the first value stays.
    p = parse_output(raw, S)
    assert p.usable and p.value == GV, p


@settings(max_examples=100, deadline=None)
@given(label=st.sampled_from(["Answer: ", "答案：", "After: ", "Answer:\n"]),
       first_label=st.sampled_from(["", "Sure. ", "Output: "]),
       between=st.sampled_from(["\n", "\n\nReview: \"broke\"\n", "\n\nInput: meh\n"]),
       bad=st.sampled_from(["negative", "neutral"]))
def test_r1_labels_never_name_a_later_value(label: str, first_label: str, between: str,
                                            bad: str) -> None:
    later = json.dumps({"label": bad, "score": 0.2})
    p = parse_output(f"{first_label}{G}{between}{label}{later}", S)
    assert p.usable and p.value == GV, p


@pytest.mark.parametrize(("raw", "expect"), [
    ('The customer originally bought a laptop.\n{"category": "hardware", "priority": 2}\n'
     'But the follow-up mentions billing too, for which a separate ticket is '
     '{"category": "billing", "priority": 3}', "hardware"),
    ('Initially, the ticket describes a billing problem.\n```json\n{"category": "billing"}'
     '\n```\nHowever, the ticket also mentions login issues. For reference, a login ticket'
     ' is categorized as:\n```json\n{"category": "account"}\n```', "billing"),
    ('用户最初反馈的是账单问题。\n{"category": "billing"}\n用户不但提到账单，还提到登录问题，'
     '登录问题的分类为：{"category": "account"}', "billing"),
    ('初步分析：用户反馈付款失败。\n{"category": "billing", "priority": 1}\n该工单不但涉及付款，'
     '也附带了一个建议：{"category": "feedback", "priority": 3}', "billing"),
    ('The ticket was originally filed under sales.\n{"category": "billing", "priority": 2}'
     '\n\nIt was escalated, but the priority of the related ticket #123 stays '
     '{"category": "sales", "priority": 4}.', "billing"),
])
def test_r2_draft_words_in_prose_do_not_replace_the_first_value(raw: str,
                                                                expect: str) -> None:
    p = parse_output(raw, CAT)
    assert p.usable and p.value["category"] == expect, p


@settings(max_examples=100, deadline=None)
@given(draft=st.sampled_from(["My first guess was", "Initially I thought", "Originally:",
                              "一开始我认为是", "初步判断为", "起初我以为", "本来是"]),
       contrast=st.sampled_from([", but the text praises it.", ". However, it praises it.",
                                 "。不过再看一遍，", "，但仔细阅读后发现是正面的。"]),
       sep=st.sampled_from([" ", "\n", "\n\n"]))
def test_r2_a_draft_word_and_a_contrast_name_no_later_value(draft: str, contrast: str,
                                                           sep: str) -> None:
    p = parse_output(f"{draft} {G}{contrast}{sep}{N}", S)
    assert p.usable and p.value == GV, p


@pytest.mark.parametrize("raw", [
    'Each item has the form {"name": "...", "type": "..."}. Here is the list:\n' + L2,
    'The first entity I found: {"name": "Apple", "type": "ORG"}. Full list:\n' + L2,
])
def test_r3_an_object_before_a_list_is_no_one_item_list(raw: str) -> None:
    p = parse_output(raw, ENT)
    assert p.usable and p.value == L2V, p


@pytest.mark.parametrize("raw", [
    '{"name": "Apple", "type": "ORG"}',
    '{"type": "error", "name": "InvalidInput", "message": "The text is empty"}',
    '{"name": "Apple", "type": "ORG"},\n{"name": "Tim Cook", "type": "PER"}',
    '1. {"name": "Apple", "type": "ORG"}\n2. {"name": "Tim Cook", "type": "PER"}',
    '- {"name": "Apple", "type": "ORG"}\n- {"name": "Tim Cook", "type": "PER"}',
    'Extracted 2 entities {"name": "Apple", "type": "ORG"} and '
    '{"name": "Tim Cook", "type": "PER"}.',
])
def test_r3_r4_objects_without_brackets_are_refused(raw: str) -> None:
    # Never the first of several (or a lone object) delivered as the whole list.
    p = parse_output(raw, ENT)
    assert not p.usable, p


@pytest.mark.parametrize("raw", [
    'Candidates:\n{"name": "Apple", "type": "ORG"}\n{"name": "Tim Cook", "type": "PER"}\n'
    '{"name": "iPhone", "type": "PRODUCT"}\n\nFinal answer (only ORG and PER):\n' + L2,
    'Example output:\n{"name": "X", "type": "ORG"}\n{"name": "Y", "type": "PER"}\n\n'
    'Answer:\n' + L2,
    'Wrong:\n{"name": "apple", "type": "org"}\n{"name": "tim", "type": "per"}\nRight:\n' + L2,
])
def test_r5_object_lines_never_beat_the_list(raw: str) -> None:
    p = parse_output(raw, ENT)
    assert p.usable and p.value == L2V, p


@pytest.mark.parametrize(("raw", "expect"), [
    ('Tags: [python, django]\n(do not use generic tags like ["code", "programming"])',
     ["python", "django"]),
    ('Entities: [Apple, Tim Cook]\n\nTheir names in the KB are ["apple", "tim"].',
     ["Apple", "Tim Cook"]),
    ('[positive, negative]\n\nNote: earlier runs returned ["neutral"].',
     ["positive", "negative"]),
    ('[Paris, London, Berlin]\n\nCapitals not in the text: ["Rome"]',
     ["Paris", "London", "Berlin"]),
    ('Answer: [apple, banana, cherry] - fruits only, not ["carrot"].',
     ["apple", "banana", "cherry"]),
    ('Answer [final]\n["Paris", "Bob"]', ["final"]),
])
def test_r6_a_list_the_model_wrote_unquoted_stays_the_answer(raw: str,
                                                             expect: list[str]) -> None:
    p = parse_output(raw, STRINGS)
    assert p.usable and p.value == expect, p


@pytest.mark.parametrize(("raw", "rule", "expect"), [
    ("Relevant documents: [2], the others [1, 3, 4] are off-topic.", INTS, [2]),
    ("The answer is [3], since among [1, 2, 3, 4] only 3 is prime.", INTS, [3]),
    ("The answer is [3], since among [1, 2, 3, 4] only 3 is prime.", STRINGS, ["3"]),
    ("[4], because document [4] says so; document [1, 2] mention it: [1, 2]", INTS, [4]),
    ("Step [1]: read the docs. Then [2, 5].", INTS, [1]),
])
def test_r7_a_number_list_followed_by_prose_is_no_citation(
        raw: str, rule: DeliveryRule, expect: list[Any]) -> None:
    p = parse_output(raw, rule)
    assert p.usable and p.value == expect, p


@pytest.mark.parametrize(("raw", "rule"), [
    ('{"result": {"tags": ["a", "b"]}, "input_ids": [101, 2023]}', STRINGS),
    ('{"answer": {"keywords": ["x", "y"]}, "citations": [1, 3]}', STRINGS),
    ('{"input": ["the", "cat", "sat"], "output": {"nouns": ["cat"]}}', STRINGS),
    ('{"input": ["the", "cat", "sat"], "ok": true}', STRINGS),
])
def test_r8_a_wrapper_never_gives_a_list_that_is_not_the_answer(
        raw: str, rule: DeliveryRule) -> None:
    p = parse_output(raw, rule)
    assert not p.usable, p


@pytest.mark.parametrize(("raw", "rule"), [
    ('{"status": "refused", "reason": "policy", "categories": ["violence"]}', STRINGS),
    ('{"error": "Could not find any company names", "suggestions": ["Maybe Acme"]}',
     STRINGS),
    ('{"status": "error", "message": "input too long", "entities": []}', ENT),
    ('{"error": {"code": 400, "details": [{"name": "text", "type": "missing"}]}}', ENT),
    ('{"errors": ["bad input"]}', STRINGS),
    ('{"result": {"refusal": "no", "items": ["x"]}}', STRINGS),
])
def test_r9_errors_and_refusals_are_never_unwrapped(raw: str, rule: DeliveryRule) -> None:
    p = parse_output(raw, rule)
    assert not p.usable, p


@SETTINGS
@given(key=st.sampled_from(["error", "Errors", "refusal", "status", "State"]),
       value=st.sampled_from(["error", "FAILED", "failure", "Refused", "rejected"]),
       reason=st.booleans(), items=st.lists(st.text(max_size=5), max_size=3))
def test_r9_failure_reports_are_refused(key: str, value: str, reason: bool,
                                        items: list[str]) -> None:
    obj: dict[str, Any] = {key: value, "items": items, "count": len(items)}
    if reason:
        obj["reason"] = "policy"
    p = parse_output(json.dumps(obj), STRINGS)
    assert not p.usable, p


def test_r9_a_reason_beside_a_status_is_refused() -> None:
    p = parse_output('{"status": "done", "reason": "policy", "items": ["x"]}', STRINGS)
    assert not p.usable, p


@pytest.mark.parametrize("raw", [
    '{"prompt": "{\\"label\\": \\"neutral\\", \\"score\\": 0.5}", "completion": "positive"}',
    '{"request": "{\\"label\\": \\"positive\\", \\"score\\": 0.9}", "error": "timeout"}',
    '{"input": "{\\"label\\": \\"positive\\", \\"score\\": 0.9}", "ms": 12}',
    '{"result": "{\\"label\\": \\"positive\\", \\"score\\": 0.9}", "status": "failed"}',
])
def test_r10_json_text_beside_metadata_only_under_an_answer_key(raw: str) -> None:
    p = parse_output(raw, S)
    assert not p.usable, p


def test_r10_the_input_text_is_not_the_answer() -> None:
    p = parse_output('{"input": "{\\"category\\": \\"unknown\\"}", "status": "failed"}', CAT)
    assert not p.usable, p


FLAGS = _rule({"type": "array", "items": {
    "type": "object", "required": ["id"],
    "properties": {"id": {"type": "integer"}, "read": {"type": "boolean"},
                   "write": {"type": "boolean"}, "admin": {"type": "boolean"},
                   "owner": {"type": ["string", "null"]}}}})


@pytest.mark.parametrize("n", [140, 180])
def test_r11_literals_do_not_count_as_costly_pairs(n: int) -> None:
    # json_repair reads true/false/null and numbers in linear time: a JS-object answer
    # of 9-12 KB made of them is repaired (15-30 ms), not refused.
    raw = "[\n" + ",\n".join(f"  {{id: {i}, read: true, write: false, admin: false, "
                             f"owner: null}}" for i in range(n)) + "\n]"
    p = parse_output(raw, FLAGS)
    assert p.usable and len(p.value) == n, p
    from lockgate.runtime.extract import repair_cost

    assert repair_cost(raw) == 0


def test_r11_a_refused_repair_says_why() -> None:
    p = parse_output("{label: positive, score: 0.9, "
                     + ", ".join(f"k{i}: v{i}" for i in range(1000)) + "}", S)
    assert p.status is ParseStatus.INVALID_JSON
    assert "too costly to repair" in (p.error or ""), p.error


@pytest.mark.parametrize("raw", ['{"n": 9007199254740993.0}', '{"n": 9007199254740992.0}',
                                 '{"n": -9007199254740992.0}'])
def test_integral_floats_beyond_2_53_are_not_called_exact(raw: str) -> None:
    # 9007199254740993.0 reads as the float 2**53: converting it would pass a lossy
    # reading off as lossless.
    p = parse_output(raw, INT)
    assert not any(f.startswith("coerced:n:number->integer") for f in p.fixes), p
    assert type((p.value or {}).get("n")) is not int, p


def test_a_citation_at_the_end_of_its_line_stays_the_answer() -> None:
    p = parse_output('The answer is [3]\nOther candidates: ["1", "2"]', STRINGS)
    assert p.usable and p.value == ["3"], p


@pytest.mark.parametrize(("raw", "expect"), [
    ('{"n": 1e3}', 1000), ('{"n": 2E+2}', 200), ('{"n": 4.0}', 4),
])
def test_integral_floats_with_exponents_are_converted(raw: str, expect: int) -> None:
    # The fast path's cheap look at the text must not miss an exponent.
    p = parse_output(raw, INT)
    assert p.usable and p.value == {"n": expect} and type(p.value["n"]) is int, p
