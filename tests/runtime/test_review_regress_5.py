"""Regressions of the fifth review's fix of the output pass (a171154, 4ec4d21), found
by a second regression review: answers the code before that fix delivered right and
the fix delivered wrong, or refused. Each test asserts the behaviour before the fix.

1. an innocent label on the answer (a head word with a free word: "Before noon:",
   "Eingabe erfolgreich:", "Faux positif :"; a CJK input or error word with more:
   入力確認：, 错误类型：; a CJK example word inside a longer label: サンプル数：) or a
   first-person choice hedge ("Si tuviera que elegir, sería:", もし一つ選ぶなら：) set
   the answer aside, so that a later object was delivered;
2. a bare number followed by ``;`` or by an unquoted next key swallowed the rest
   (``{"zip": 10115; "city": "Berlin"}``, ``{n: 5 m: 6}``); a key in guillemets or
   low-high quotes left the closing mark in the value ("Paul»");
3. "Never mind" and "Disregard the previous ..." in a sentence read as a correction;
4. prose ending on an open bracket ("Final note: scores are in [0, 1") read as a cut
   correction (refused).
"""

from __future__ import annotations

from typing import Any

import pytest

from lockgate.runtime import parse_output
from lockgate.spec import DeliveryRule


def _rule(schema: dict[str, Any]) -> DeliveryRule:
    return DeliveryRule.model_validate({"schema": schema})


S = _rule({"type": "object", "required": ["label", "confidence"], "properties": {
    "label": {"enum": ["positive", "negative", "neutral"]},
    "confidence": {"type": "number", "minimum": 0, "maximum": 1}}})
E = '{"label": "positive", "confidence": 0.9}'
P = '{"label": "negative", "confidence": 0.1}'


# 1. innocent labels and choice hedges -------------------------------------------------

@pytest.mark.parametrize("label", [
    "Before noon:", "Before tax:", "Provided sources:", "Received payment:",
    "Eingabevalidierung:", "Eingabe erfolgreich:", "Falsch verbunden:",
    "Entrée principale :", "Faux positif :", "Schéma thérapeutique :", "Entrada procesada:",
    "Вход выполнен:", "Схема лечения:", "Yanlış alarm:", "Errata corrige:",
    "入力確認：", "入力ミス：", "誤り箇所：", "错误类型：", "错误原因：",
    "입력 분석:", "틀린 부분:",
    "サンプル数：", "テンプレート名：", "下書き保存：",
    "Wenn ich mich festlegen müsste, wäre es:", "Si je devais trancher, ce serait :",
    "Si tuviera que elegir, sería:", "Если бы пришлось выбирать, то:",
    "لو كان علي الاختيار:", "もし一つ選ぶなら：", "もし分類するなら：",
])
def test_an_innocent_label_keeps_its_answer(label: str) -> None:
    p = parse_output(f"{label} {E}\n\nThe original metadata was {P}", S)
    assert p.usable and p.value["label"] == "positive", p


@pytest.mark.parametrize("label", [
    "Beispiel-Ausgabe:", "Exemple de sortie :", "出力例：", "示例：", "入力：", "错误：",
    "Wenn es negativ wäre:", "Eingabe:", "Faux :",
])
def test_an_exact_label_still_sets_its_value_aside(label: str) -> None:
    p = parse_output(f"{label} {P}\nAnswer: {E}", S)
    assert p.usable and p.value["label"] == "positive", p


# 2. bare values -------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "schema", "value"), [
    ('{"zip": 10115; "city": "Berlin"}',
     {"zip": {"type": "integer"}, "city": {"type": "string"}}, {"zip": 10115, "city": "Berlin"}),
    ("{n: 5 m: 6}", {"n": {"type": "integer"}, "m": {"type": "integer"}}, {"n": 5, "m": 6}),
    ('{ age: 31 name: "Ann" }', {"age": {"type": "integer"}, "name": {"type": "string"}},
     {"age": 31, "name": "Ann"}),
    ('{"xs": [1;2;3]}', {"xs": {"type": "array", "items": {"type": "integer"}}},
     {"xs": [1, 2, 3]}),
    ('{"n": 5;}', {"n": {"type": "integer"}}, {"n": 5}),
    ("{ok: true n: 1}", {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
     {"ok": True, "n": 1}),
])
def test_a_semicolon_or_a_bare_key_ends_a_bare_value(
        raw: str, schema: dict[str, Any], value: dict[str, Any]) -> None:
    p = parse_output(raw, _rule({"type": "object", "required": [next(iter(schema))],
                                 "properties": schema}))
    assert p.usable and p.value == value, p


@pytest.mark.parametrize("raw", ["{«q»: «Paul»}", "{„q“: „Paul“}"])
def test_a_key_in_other_quotation_marks_leaves_no_mark_in_the_value(raw: str) -> None:
    p = parse_output(raw, _rule({"type": "object", "required": ["q"],
                                 "properties": {"q": {"type": "string"}}}))
    assert not p.usable or p.value == {"q": "Paul"}, p


# 3. "Never mind" and "Disregard" in a sentence ------------------------------------------

@pytest.mark.parametrize("intro", [
    "Never mind, I see you also asked for the raw scores:",
    "Never mind — here is the debug trace too:",
    "Disregard the previous output's whitespace; the raw record for reference:",
])
def test_never_mind_in_a_sentence_is_no_correction(intro: str) -> None:
    p = parse_output(f"{E}\n{intro} {P}", S)
    assert p.usable and p.value["label"] == "positive", p


@pytest.mark.parametrize("intro", ["Never mind, it should be:",
                                   "Never mind, here's the right one:",
                                   "Disregard the previous output. Correct:"])
def test_never_mind_right_before_the_value_corrects_it(intro: str) -> None:
    p = parse_output(f"{E}\n{intro} {P}", S)
    assert p.usable and p.value["label"] == "negative", p


# 4. prose that ends on an open bracket --------------------------------------------------

@pytest.mark.parametrize("tail", [
    "Final note: scores are in [0, 1", 'Finally, remember arrays use ["a"',
    'In conclusion, the field {"label"', 'Sorry for the delay. Format: {"label"',
    'The correct answer is above. Valid labels: ["positive", "neg',
])
def test_prose_ending_on_a_bracket_is_no_cut_correction(tail: str) -> None:
    p = parse_output(f"{E}\n{tail}", S, finish_reason="stop")
    assert p.usable and p.value["label"] == "positive", p


@pytest.mark.parametrize("intro", ["Actually, the correct output is ", "Correction: ",
                                   "Final answer: ", "No wait, it's ", "Fixed JSON: ",
                                   "Never mind, here's the right one: "])
def test_a_cut_correction_is_still_refused(intro: str) -> None:
    p = parse_output(f'{E}\n{intro}{{"label": "neg', S, finish_reason="stop")
    assert not p.usable, p


def test_a_full_width_dash_before_more_is_kept_as_written() -> None:
    p = parse_output('{"n": －5 °C}', _rule({"type": "object", "required": ["n"],
                                             "properties": {"n": {"type": "string"}}}))
    assert not p.usable or p.value == {"n": "－5 °C"}, p
