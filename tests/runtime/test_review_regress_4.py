"""Regressions of the fourth review's fix of the output pass (dashes as minus signs,
numbers followed by more, cut corrections, multilingual labels and corrections),
found by a regression review: answers the code before that fix delivered right and
the fix delivered wrong, or refused. Each test asserts the behaviour before the fix.

A. a generic label ("Data:", "Record:", "Text analysis:", "Texte :"), 例 inside an
   ordinary word (病例, 比例, 例外), Italian "Si ..." and other conditional words used
   politely, and prose that names an unclosed tag (``<input type="email">``, ``your
   <query>``) set the answer aside, so that the example before it was delivered;
B. a closing tag (``</b>``) ended the label it closes, so that "<b>If it were
   negative:</b>" no longer set its value aside;
C. correction words of other languages in a sentence, or negated ("수정 전:",
   "Korrektur: keine nötig", "En fait, l'ancien modèle donnait :");
D. the answer set aside by the same labels, a later non-answer object delivered; a
   lone negation ("Spam? No") set the answer aside;
E. an emoticon's bracket after a correction word ("Sorry :[") read as a cut
   correction (refused); Python number literals (``1_000``, ``0xff``) kept as strings;
F. digit groups in a string field joined ("555 123 456" -> "555123456"), and a dash
   before a number followed by more turned into "-" ("–5 °C" -> "-5 °C").
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
TEXT = _rule({"type": "object", "required": ["summary"],
              "properties": {"summary": {"type": "string"}, "lang": {"type": "string"}}})
FLAG = _rule({"type": "object", "required": ["is_spam"],
              "properties": {"is_spam": {"type": "boolean"}}})
STR = _rule({"type": "object", "required": ["f"],
             "properties": {"f": {"type": "string"}, "g": {"type": "string"}}})
NUM = _rule({"type": "object", "required": ["count"],
             "properties": {"count": {"type": "integer"}, "note": {"type": "string"}}})
VALUE = _rule({"type": "object", "required": ["value"],
               "properties": {"value": {"type": "number"}, "note": {"type": "string"}}})

P = '{"label": "positive", "confidence": 0.9}'  # the answer
N = '{"label": "negative", "confidence": 0.8}'  # not the answer
ANSWER = {"label": "positive", "confidence": 0.9}


def _answer(raw: str, finish: str | None = None) -> None:
    p = parse_output(raw, S, finish_reason=finish)
    assert p.usable and p.value == ANSWER, p


# A. the example before the answer, the answer set aside too ---------------------------

@pytest.mark.parametrize("label", [
    "Data:", "Record:", "Text analysis:", "Source:", "Structure:", "Texte :", "Datos:",
    "Текст:", "Text 1:", "Record 1:", "Raw JSON:", "Text sentiment:",
    "以下为该病例的分析结果：", "该案例的分类结果：", "按比例计算的结果：", "例行检查结果：",
    "条例分析结果：", "無例外、結果：", "この事例の結果：", "Si riporta di seguito il risultato:",
    "Si allega il risultato:", "Si le permite, el resultado:", "Ich würde sagen:",
    "Falls es hilft, hier das Ergebnis:", "Si vous voulez, voici le résultat :",
    "Si bien es breve, el resultado es:", "Хотелось бы отметить результат:",
    "Wenn ich es zusammenfasse:",
])
@pytest.mark.parametrize("example", ["Example output:", "For example:", "示例："])
def test_a_generic_label_keeps_the_answer_after_an_example(example: str, label: str) -> None:
    _answer(f"{example} {N}\n\n{label}\n{P}")


@pytest.mark.parametrize("prose", [
    "The form's <input type=\"email\"> field is filled, so:",
    "Your <query> is about a product review:", "Following the <format> you gave:",
    "Using the <template> tag you defined, the result is:",
    "I read your <prompt> carefully. Result:",
    "The review mentions a <question> element. Result:",
])
def test_prose_naming_a_tag_keeps_the_answer(prose: str) -> None:
    _answer(f"Example: {N}\n\n{prose}\n{P}")


def test_a_value_inside_a_not_answer_element_is_still_set_aside() -> None:
    _answer(f"<draft>{N}</draft>\n{P}")
    _answer(f"<example>\n{N}\n</example>\n{P}")


# B. a closing tag keeps the label it closes --------------------------------------------

@pytest.mark.parametrize("tag", ["b", "em", "p", "span", "strong"])
@pytest.mark.parametrize("label", [
    "If it were negative:", "Had the text been negative:", "Hypothetically:", "Otherwise:",
    "If the review were negative, the output would be:", "This would be wrong:",
    "如果是负面的：",
])
def test_a_closing_tag_keeps_its_label(tag: str, label: str) -> None:
    _answer(f"<{tag}>{label}</{tag}> {N}\n<{tag}>Actual:</{tag}> {P}")


def test_table_cells_keep_their_label() -> None:
    _answer(f"<td>If negative</td><td>{N}</td>\n<td>Answer</td><td>{P}</td>")
    _answer(f"<b>If the review were negative:</b>\n{N}\n\n<b>For this review:</b>\n{P}")


# C. correction words of other languages: only as the label of a replacement ----------

@pytest.mark.parametrize("raw", [
    f"수정 후: {P}\n수정 전: {N}", f"訂正後：{P}\n訂正前：{N}",
    f"{P}\n\n최종 확인을 위해 입력된 예시를 다시 보여드립니다: {N}",
    f"{P}\n\nPardon, voici aussi le format demandé : {N}",
    f"{P}\n\nEntschuldigung, hier noch das Format aus der Anfrage: {N}",
    f"{P}\n\nTatsächlich hatte das alte Modell Folgendes ausgegeben: {N}",
    f"{P}\n\nEigentlich hatte ich zuerst gedacht: {N}",
    f"{P}\n\nEn fait, l'ancien modèle donnait : {N}",
    f"{P}\n\nNa verdade, o modelo anterior deu: {N}",
    f"{P}\n\nНа самом деле старая модель выдала: {N}",
    f"{P}\n\n사실은 이전 모델의 출력은 다음과 같았습니다: {N}",
    f"{P}\n\n実は、前のモデルの出力は：{N}",
    f"{P}\n\nIch habe mich geirrt, als ich dachte: {N}",
    f"{P}\n\nOh, I see, the original tool printed: {N}",
    f"{P}\n\nИсправлений не требуется. Для сравнения, исходный вывод: {N}",
    f"{P}\n\nKorrektur: keine nötig. Zum Vergleich das alte Ergebnis: {N}",
    f"{P}\n\n최종 결과는 위와 같습니다. 참고로 이전 결과: {N}",
    f"{P}\n\n最終結果は上記です。参考までに以前の結果：{N}",
    f"{P}\n\nRisposta finale sopra. Per confronto, il vecchio modello: {N}",
    f"{P}\n\nDüzeltme gerekmiyor. Karşılaştırma için eski çıktı: {N}",
    f"{P}\n\nPoprawka niepotrzebna. Dla porównania stary wynik: {N}",
    f"{P}\n\nCorrección: ninguna. Para comparar, el resultado anterior: {N}",
    f"{P}\n\nAttends, pour comparer, l'ancien outil donnait : {N}",
    f"{P}\n\nPardon my French. The old tool printed: {N}",
    f"{P}\n\nScusa il ritardo. Il vecchio modello dava: {N}",
    f"{P}\n\n정답은 위와 같습니다. 이전 모델 출력: {N}",
])
def test_a_correction_word_that_introduces_no_replacement(raw: str) -> None:
    _answer(raw)


# D. the answer set aside, a later non-answer object delivered -------------------------

@pytest.mark.parametrize("label", ["Data:", "Raw JSON:", "Text analysis:", "Text summary:",
                                   "Record:", "Typical result:", "Musterlösung:",
                                   "Örnek sonuç:", "Here is the result for your example text:",
                                   "Response for the illustration text:"])
@pytest.mark.parametrize("after", ["Field descriptions:", "Explanation:"])
def test_field_descriptions_after_the_answer_are_not_delivered(label: str, after: str) -> None:
    answer = {"summary": "The parcel arrived late but intact.", "lang": "en"}
    raw = (f'{label}\n{{"summary": "The parcel arrived late but intact.", "lang": "en"}}'
           f'\n\n{after}\n{{"summary": "a one-sentence summary of the review", '
           f'"lang": "ISO 639-1 code"}}')
    p = parse_output(raw, TEXT)
    assert p.usable and p.value == answer, p


@pytest.mark.parametrize("label", [
    "Data:", "Record:", "Si riporta di seguito il risultato:", "Si precisa il risultato:",
    "以下为该病例的分析结果：", "この事例の結果：", "Text sentiment:", "Ich würde sagen:",
    "La réponse serait :", "La respuesta sería:", "Si tratta di una recensione positiva:",
    "Si noti il risultato:", "Я бы сказал так:", "Het antwoord zou zijn:", "Sarebbe:",
    "Seria assim:", "Bu olurdu:", "Ich würde es so klassifizieren:",
])
def test_a_first_guess_after_the_answer_is_not_delivered(label: str) -> None:
    _answer(f"{label} {P}\n{N} was my first guess.")


@pytest.mark.parametrize("raw", [
    'Spam? No\n{"is_spam": false}\n\n{"is_spam": true} was my first guess.',
    'Est-ce du spam ? Non\n{"is_spam": false}\n\n{"is_spam": true} était ma première idée.',
    'Нет\n{"is_spam": false}\n\nСначала я думал {"is_spam": true}.',
])
def test_a_lone_negation_sets_nothing_aside(raw: str) -> None:
    p = parse_output(raw, FLAG)
    assert p.usable and p.value == {"is_spam": False}, p


# E. emoticons are no cut corrections; Python number literals are numbers -------------

@pytest.mark.parametrize("finish", [None, "stop"])
@pytest.mark.parametrize("tail", [
    "Actually, the review is short :-[", "Sorry :[", "Sorry for the delay :-[",
    "Final answer given above. Sorry for the delay :-[", "Hmm, no :-[", "Never mind me :[",
    "Entschuldigung :-[", "Pardon :[", "Désolé, en fait :-[", "Извините :-[",
    "すみません :[", "Final answer above :-[", "Wait, sad face :[",
])
def test_an_emoticon_after_the_answer_is_no_cut_correction(tail: str,
                                                           finish: str | None) -> None:
    _answer(f"{P}\n\n{tail}", finish)


@pytest.mark.parametrize("raw, want", [
    ("{'count': 1_000}", {"count": 1000}), ("{'count': 1_234_567}", {"count": 1234567}),
    ("{'count': 0b101}", {"count": 5}), ("{'count': 0o17}", {"count": 15}),
    ("{'count': 0xff, 'note': 'hex'}", {"count": 255, "note": "hex"}),
    ("{'count': 10_000, 'note': 'ten thousand'}", {"count": 10000, "note": "ten thousand"}),
])
def test_python_number_literals_are_numbers(raw: str, want: dict[str, Any]) -> None:
    p = parse_output(raw, NUM)
    assert p.usable and p.value == want, p


def test_a_python_number_literal_in_a_number_field() -> None:
    p = parse_output("{'value': 1_000}", VALUE)
    assert p.usable and p.value == {"value": 1000}, p


# F. unquoted text in a string field is kept as written ---------------------------------

@pytest.mark.parametrize("text", ["555 123 456", "12 345", "123 456 789", "1 234",
                                  "100 000", "1'234", "–5 °C", "– 3 items", "— 2 left",
                                  "−40 degrees"])
@pytest.mark.parametrize("form", ['{{"f": {t}}}', "{{f: {t}}}", "{{'f': {t}, 'g': 'x'}}",
                                  '{{"f": {t},}}'])
def test_unquoted_text_in_a_string_field_is_kept_as_written(form: str, text: str) -> None:
    p = parse_output(form.format(t=text), STR)
    assert not p.usable or p.value["f"] == text, p


def test_a_dash_in_an_unquoted_note_is_kept() -> None:
    p = parse_output('{"count": 3, "note": − 3 items}', NUM)
    assert not p.usable or p.value == {"count": 3, "note": "− 3 items"}, p


@pytest.mark.parametrize("raw", ['{"count": 1 234}', '{"count": 555 123 456}',
                                 "{'count': 1'234}", '{"count": –5 °C}'])
def test_grouped_digits_or_more_in_a_number_field_are_never_cut(raw: str) -> None:
    p = parse_output(raw, NUM)
    assert not p.usable or p.value["count"] not in (1, 555, 5, -5), p


@pytest.mark.parametrize("dash", ["\u2212", "\u2013", "\u2014"])
def test_a_dash_before_a_whole_number_is_still_a_minus_sign(dash: str) -> None:
    p = parse_output(f'{{"value": {dash}2.5, "note": "drop"}}', VALUE)
    assert p.usable and p.value["value"] == -2.5, p
