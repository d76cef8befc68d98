"""Defects of the output pass found by a fourth review (its corpus of 1,927 answers):

1. a Unicode minus or dash right before a bare number was dropped (``−5`` gave 5): it
   is a minus sign;
2. a bare number followed by more of its value was cut at the first space or mark
   (``1 234`` gave 1, ``3 or 4`` gave 3, ``2 million`` gave 2): it is kept whole, as
   written (a string no number field accepts: refused; a string field keeps the text,
   "555 123 456"), and no key is made of the rest;
3. a correction whose object the output ends inside delivered the value it corrects:
   refused (cut off);
4. a first value labelled as an example, a template, the input, a condition or a
   wrong value in another language than English (or inside ``<example>``,
   ``<draft>``, ``<input>``, ``<schema>``) was delivered instead of the answer after
   it;
5. corrections in other languages (and a few more English phrasings) were not
   recognised: they count as the label right before the replacement value;
6. ``"1,5; 2,5"`` read as the list [1, 5, 2, 5]; a string in guillemets kept its
   closing mark.

Each test failed on the code before the fix. A regression review then narrowed the
fix (tests/runtime/test_review_regress_4.py): digit groups are no longer joined, generic
labels, conditional words alone, lone negations and correction words inside a sentence
are no longer read; the cases taken out are kept below as strict xfails.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lockgate.runtime import parse_output
from lockgate.spec import DeliveryRule

SETTINGS = settings(max_examples=150, deadline=None)


def _rule(schema: dict[str, Any], **extra: Any) -> DeliveryRule:
    return DeliveryRule.model_validate({"schema": schema, **extra})


NUM = _rule({"type": "object", "required": ["count"],
             "properties": {"count": {"type": "integer"}, "value": {"type": "number"},
                            "note": {"type": "string"}}})
FLOAT = _rule({"type": "object", "required": ["value"],
               "properties": {"value": {"type": "number"}, "note": {"type": "string"}}})
LIST = _rule({"type": "object", "required": ["values"],
              "properties": {"values": {"type": "array", "items": {"type": "number"}}}})
ITEMS = _rule({"type": "object", "required": ["items"], "properties": {"items": {
    "type": "array", "items": {"type": "object", "required": ["name", "qty"],
                               "properties": {"name": {"type": "string"},
                                              "qty": {"type": "integer"}}}}}})
FLAG = _rule({"type": "object", "required": ["is_spam"],
              "properties": {"is_spam": {"type": "boolean"}}})
TEXT = _rule({"type": "object", "required": ["summary"],
              "properties": {"summary": {"type": "string"}, "lang": {"type": "string"}}})
S = _rule({"type": "object", "required": ["label", "confidence"], "properties": {
    "label": {"type": "string", "enum": ["positive", "negative", "neutral"]},
    "confidence": {"type": "number"}}})

DASHES = ["\u2212", "\u2013", "\u2014", "\u2010", "\u2011", "\ufe63", "\uff0d"]


# 1. a dash before a bare number is a minus sign ---------------------------------------

@pytest.mark.parametrize("dash", DASHES)
@pytest.mark.parametrize("form", ['{{"value": {d}2.5, "note": "drop"}}',
                                  "{{'value': {d}2.5, 'note': 'drop'}}",
                                  '{{"value": {d}2.5}}', "{{value: {d}2.5}}"])
def test_a_dash_before_a_number_is_a_minus_sign(dash: str, form: str) -> None:
    p = parse_output(form.format(d=dash), FLOAT)
    assert not p.usable or p.value["value"] == -2.5, p


@pytest.mark.parametrize("dash", DASHES)
def test_a_dash_in_a_list_is_a_minus_sign(dash: str) -> None:
    for raw in (f'{{"values": [{dash}1, 2, {dash}3.5]}}', f"{{'values': [{dash}1, 2, {dash}3.5]}}"):
        p = parse_output(raw, LIST)
        assert p.usable and p.value["values"] == [-1, 2, -3.5], p


@SETTINGS
@given(n=st.integers(min_value=1, max_value=10**9), dash=st.sampled_from(DASHES),
       space=st.sampled_from(["", " ", "  "]), more=st.sampled_from(["", "-", DASHES[0]]))
def test_a_dash_is_never_dropped(n: int, dash: str, space: str, more: str) -> None:
    p = parse_output(f'{{"count": {dash}{more}{space}{n}, "note": "x"}}', NUM)
    assert not (p.usable and p.value["count"] == n), p


# 2. a bare number followed by more of its value ----------------------------------------

# (Changed after the regression review: digit groups were joined into the number,
# which made a string field's "555 123 456" "555123456"; they are kept as written now,
# so a number field refuses them, never the first group.)
@pytest.mark.parametrize("raw, want", [
    ('{"count": 1 234}', 1234),
    ('{"count": 1 234 567}', 1234567),
    ('{"count": 1\u00a0234}', 1234),
    ('{"count": 1\u202f234, "note": "x"}', 1234),
    ('{"count": 1\u2009234}', 1234),
    ('{"count": 1\u200b234}', 1234),
    ('{"count": 1\'234}', 1234),
    ("{'count': 1'234'567}", 1234567),
    ('{"count": -12 345 678}', -12345678),
    ('{"count": 12, "value": 1 234.5}', 12),
])
def test_digit_groups_are_never_cut_to_their_first_group(raw: str, want: int) -> None:
    p = parse_output(raw, NUM)
    assert not p.usable or p.value["count"] == want, p


@pytest.mark.parametrize("raw", [
    '{"count": 1 2}', '{"count": 12 34}', '{"count": 1 234 56}', '{"count": 2 million}',
    '{"count": 3 thousand}', '{"count": 3 or 4}', '{"count": 3 oder 4}', '{"count": 3 to 4}',
    '{"count": 3 bis 4}', '{"count": 3~4}', '{"count": 3\u20134}', '{"count": 5 - 2}',
    '{"count": 2 * 3}', '{"count": 7 out of 10}', '{"count": 7 von 10}', '{"count": 3 kg}',
    '{"count": 3\u00bd}', '{"count": 3 1/2}', '{"count": 1 234\'567}',
    '{"count": 1, "value": 0. 5}', '{"count": 1, "value": 3 . 5}',
    '{"count": 1, "value": 0.8 - 0.9}', '{"count": 1, "value": 1 299,99, "note": "EUR"}',
    '{"count": 4, "value": 2024-01-05}', "{'count': 3 or 4}",
])
def test_a_number_followed_by_more_is_not_its_first_token(raw: str) -> None:
    p = parse_output(raw, NUM)
    first = raw.split(": ", 1)[1].split(",")[0].split(" ")[0]
    if p.usable:
        cut = json.loads(first) if first.lstrip("-").isdigit() else None
        assert p.value.get("count") != cut or raw.count(":") > 1, p
        assert "value" not in p.value or raw.count('"value"') == 0 \
            or not isinstance(p.value["value"], int | float), p
        assert all(not k.endswith("}") for k in p.value), p


@pytest.mark.parametrize("raw", ['{"is_spam": true or false}', '{"is_spam": !true}',
                                 '{"is_spam": false maybe}'])
def test_a_literal_followed_by_more_or_negated_is_refused(raw: str) -> None:
    assert not parse_output(raw, FLAG).usable


@pytest.mark.parametrize("sep", [" ", "\u202f"])
def test_no_key_is_made_of_a_numbers_rest(sep: str) -> None:
    p = parse_output(f'{{"items": [{{"name": "Schrauben", "qty": 1{sep}200}}]}}', ITEMS)
    assert not p.usable or p.value == {"items": [{"name": "Schrauben", "qty": 1200}]}, p
    p = parse_output(f'{{"items": [{{"name": "Schrauben", "qty": 1{sep}20}}]}}', ITEMS)
    assert not p.usable or all(set(i) <= {"name", "qty"} and i["qty"] != 1
                               for i in p.value["items"]), p


@SETTINGS
@given(a=st.integers(min_value=1, max_value=999), b=st.integers(min_value=0, max_value=99999),
       sep=st.sampled_from([" ", "\u00a0", "\u202f", "'", " or ", " - ", "~", " to "]))
def test_a_first_token_is_never_delivered(a: int, b: int, sep: str) -> None:
    raw = f'{{"count": {a}{sep}{b}, "note": "x"}}'
    p = parse_output(raw, NUM)
    if p.usable:
        grouped = sep in (" ", "\u00a0", "\u202f", "'") and len(str(b)) == 3
        assert grouped and p.value["count"] == int(f"{a}{b}"), p


@pytest.mark.parametrize("raw, want", [
    ('{"count": 5 }', 5), ('{"count": 5 // five\n}', 5), ('{"count": 5 "note": "x"}', 5),
    ('{"count": 1,000,000}', 1000000), ("{'count': 5 , 'note': 'x'}", 5),
])
def test_whole_numbers_are_still_read(raw: str, want: int) -> None:
    p = parse_output(raw, NUM)
    assert p.usable and p.value["count"] == want, p


def test_many_items_parse_fast() -> None:
    items = ", ".join(f'{{"name": "n{i} \u2013 x", "qty": \u2212{i} }}' for i in range(2000))
    raw = '{"items": [' + items + "]}"
    assert len(raw) > 56_000
    t0 = time.perf_counter()
    p = parse_output(raw, ITEMS)
    assert time.perf_counter() - t0 < 0.5
    assert p.usable and p.value["items"][5]["qty"] == -5


# 3. a cut correction is refused --------------------------------------------------------

E = '{"label": "positive", "confidence": 0.5}'
P = '{"label": "negative", "confidence": 0.85}'


@pytest.mark.parametrize("finish", [None, "length", "stop"])
@pytest.mark.parametrize("intro", [
    "Actually, the correct output is ", "Correction: ", "Final answer: ",
    "Wait, actually the correct answer is ", "更正：", "Korrektur: ", "En realidad: ",
    "Let me fix that: ",
])
@pytest.mark.parametrize("cut", ['{"label": "negative", "confidence": 0.8',
                                 '{"label": "negative", "confi', '{"label": "neg'])
def test_a_cut_correction_is_refused(finish: str | None, intro: str, cut: str) -> None:
    p = parse_output(f"{E}\n{intro}{cut}", S, finish_reason=finish)
    assert not p.usable and "truncated" in p.fixes, p


def test_a_cut_final_answer_after_a_draft_is_refused() -> None:
    p = parse_output(f'Draft: {E}\nFinal answer: {{"label": "negative", "conf', S,
                     finish_reason="length")
    assert not p.usable, p


def test_a_cut_object_that_corrects_nothing_keeps_the_answer() -> None:
    p = parse_output(f'{E}\nAnother review: {{"label": "neg', S)
    assert p.usable and p.value["label"] == "positive", p


# 4. labelled examples, templates, echoes, conditions and wrong values ------------------

@pytest.mark.parametrize("label, answer", [
    ("Beispiel:", "Antwort:"), ("Beispielausgabe:", "Ausgabe:"), ("Exemple :", "Réponse :"),
    ("Exemple de sortie :", "Sortie :"), ("Par exemple :", "Réponse :"),
    ("Ejemplo:", "Respuesta:"), ("Esempio:", "Risposta:"), ("Exemplo:", "Resposta:"),
    ("Пример:", "Ответ:"), ("例：", "回答："), ("出力例：", "出力："), ("範例：", "答案："),
    ("مثال:", "الإجابة:"), ("예시:", "답변:"), ("Örnek:", "Cevap:"), ("Voorbeeld:", "Antwoord:"),
    ("Przykład:", "Odpowiedź:"), ("Vorlage:", "Antwort:"), ("模板：", ""),
    ("Like this:", "Result:"), ("JSON schema:", "Result:"), ("Eg:", "Result:"),
    ("An illustrative output:", "Result:"), ("Something like:", "Result:"),
    ("For reference, a typical output looks like:", "Result:"), ("Demo:", "Result:"),
    ("Eingabe:", "Ausgabe:"), ("Entrée :", "Sortie :"), ("入力：", "出力："),
    ("Entrada:", "Salida:"),
    ("Вход:", "Выход:"), ("Before:", "After:"), ("Received:", "Returned:"),
    ("Falsch:", "Richtig:"), ("Faux :", "Correct :"), ("Incorrecto:", "Correcto:"),
    ("誤り：", "正しい："), ("Неправильно:", "Правильно:"),
    ("Wenn die Bewertung positiv wäre:", "Tatsächlich:"), ("Si c'était positif :", "En réalité :"),
    ("Si fuera positivo:", "En realidad:"), ("もし肯定的なら", "実際は"),
    ("Если бы отзыв был положительным:", "На самом деле:"), ("Sonst:", "Ergebnis:"),
    ("Andernfalls", "Antwort:"),
])
@pytest.mark.parametrize("fenced", [False, True])
def test_a_labelled_first_value_is_not_the_answer(label: str, answer: str,
                                                  fenced: bool) -> None:
    if fenced:
        raw = f"{label}\n```json\n{E}\n```\n{answer}\n```json\n{P}\n```"
    else:
        raw = f"{label} {E}\n{answer} {P}"
    p = parse_output(raw, S)
    assert p.usable and p.value["label"] == "negative", p


# (Taken out after the regression review, xfail: labels as generic as "Structure:",
# "Text:", "Record:", "Data:" introduce answers as often ("Text analysis:", "Record
# 1:"), and a lone negation ("Spam? No") is no contrast. Not read: the first value is
# delivered, as before the fix.)
@pytest.mark.xfail(strict=True, reason="generic labels and lone negations are not read")
@pytest.mark.parametrize("label, answer", [
    ("Structure:", "Result:"), ("Raw:", "Clean:"), ("Text:", "Result:"),
    ("Record:", "Normalized record:"), ("The data:", "Output:"), ("Nicht", "sondern"),
    ("Pas", "mais"),
])
def test_generic_labels_are_not_read(label: str, answer: str) -> None:
    p = parse_output(f"{label} {E}\n{answer} {P}", S)
    assert p.usable and p.value["label"] == "negative", p


@pytest.mark.parametrize("tag", ["example", "draft", "input", "schema", "template"])
def test_a_value_in_a_not_answer_tag_is_not_the_answer(tag: str) -> None:
    p = parse_output(f"<{tag}>{E}</{tag}>\n{P}", S)
    assert p.usable and p.value["label"] == "negative", p


@pytest.mark.parametrize("raw", [
    f"Beispiel: {E}",  # only one value: still the answer
    f"Antwort: {E}\nBeispiel: {P}", f"Als JSON: {E}\nZum Vergleich: {P}",
    f"The answer looks like this: {E}\nFor a negative review: {P}",
    f"Not an example but the output: {E}\nExample: {P}",
    f"Answer: {E}\nNormalized record: {P}", f"出力：{E}\n入力に対する別の例：{P}",
    f"错误已更正：{E}\n原始：{P}", f"{E}\nCorrect: yes, that is it. Another review: {P}",
    f"Output: {E}\nThis is more accurate than the baseline {P}",
])
def test_the_first_value_stays_where_nothing_sets_it_aside(raw: str) -> None:
    p = parse_output(raw, S)
    assert p.usable and p.value["label"] == "positive", p


# 5. corrections in other languages -----------------------------------------------------

@pytest.mark.parametrize("intro", [
    "Korrektur:", "Corrección:", "En realidad:", "Исправление:", "Нет, на самом деле:", "訂正：",
    "いや、正しくは：", "수정:", "تصحيح:", "Hmm, no —", "Hmm, no.", "Never mind, it should be",
    "Disregard the previous output.", "The above is incorrect. Correct:", "Correzione:",
    "Na verdade:", "Poprawka:", "Düzeltme:", "Eigenlijk:", "Richtig:",
])
def test_a_correction_in_other_words_replaces_the_value(intro: str) -> None:
    p = parse_output(f"{E}\n{intro} {P}", S)
    assert p.usable and p.value["label"] == "negative", p


# (Taken out after the regression review, xfail: a word of another language for
# "actually", "sorry", "wait" or "I was wrong" counts only as the label right before
# the value ("En realidad: {", "Nein, warte: {"): in a sentence it introduced other
# values as often ("En fait, l'ancien modèle donnait : {", "Entschuldigung, hier noch
# das Format: {"); "Oh, I see" likewise. Not read: the first value is delivered.)
@pytest.mark.xfail(strict=True, reason="a correction word in a sentence is not read")
@pytest.mark.parametrize("intro", [
    "Moment, eigentlich ist es negativ:", "En fait, c'est négatif :",
    "Oh, I see, it's sarcasm. So:", "Entschuldigung, Fehler:", "Perdón, error:",
])
def test_a_correction_word_inside_a_sentence_is_not_read(intro: str) -> None:
    p = parse_output(f"{E}\n{intro} {P}", S)
    assert p.usable and p.value["label"] == "negative", p


# 6. lists with decimal commas, guillemets ----------------------------------------------

@pytest.mark.parametrize("raw", ['{"values": "1,5; 2,5"}', '{"values": "1,5;2,5;3"}',
                                 '{"values": "0,5 ; 1"}'])
def test_commas_inside_semicolon_lists_are_not_separators(raw: str) -> None:
    p = parse_output(raw, LIST)
    assert not p.usable or p.value["values"] in ([1.5, 2.5], [1.5, 2.5, 3], [0.5, 1]), p


@pytest.mark.parametrize("raw, want", [
    ('{"summary": «C\'est bien», "lang": "fr"}', "C'est bien"),
    ('{"summary": »So gut«}', "So gut"), ('{"summary": „Sehr gut“, "lang": "de"}', "Sehr gut"),
    ("{'summary': «Très bien»}", "Très bien"), ('{"summary": 「良い」, "lang": "ja"}', "良い"),
    ('{"summary": 『良い』}', "良い"),
])
def test_guillemets_delimit_a_string(raw: str, want: str) -> None:
    p = parse_output(raw, TEXT)
    assert not p.usable or p.value["summary"] == want, p
    assert p.usable, p


def test_guillemets_in_a_list() -> None:
    rule = _rule({"type": "object", "required": ["tags"], "properties": {
        "tags": {"type": "array", "items": {"type": "string"}}}})
    p = parse_output('{"tags": [' + ", ".join(["«x»"] * 3000) + "]}", rule)
    assert p.usable and p.value["tags"] == ["x"] * 3000, p


@pytest.mark.parametrize("raw", [
    f'```json\n{E}\n```\nCorrection:\n```json\n{{"label": "neg',
    f'<answer>{E}</answer>\nCorrection: <answer>{{"label": "neg',
    f'Answer:\n```json\n{E}\n```\nActually, the correct output is {{"label": "negative", "co',
])
def test_a_cut_correction_after_a_fence_or_tag_is_refused(raw: str) -> None:
    p = parse_output(raw, S)
    assert not p.usable and "truncated" in p.fixes, p


@pytest.mark.parametrize("raw", ['{"count": ~5}', '{"count": ≈5}', '{"count": >5}',
                                 '{"count": < 5}', '{"count": ±5}', '{"count": −−5}',
                                 '{"count": − 5}'])
def test_a_mark_before_a_number_is_kept_with_it(raw: str) -> None:
    assert not parse_output(raw, NUM).usable


@pytest.mark.parametrize("raw", ['{"is_spam": ~true}', '{"is_spam": -true}',
                                 '{"is_spam": − false}'])
def test_a_mark_before_a_literal_is_kept_with_it(raw: str) -> None:
    assert not parse_output(raw, FLAG).usable


@pytest.mark.parametrize("dash", ["\u2212", "\u2013", "\ufe63"])
def test_a_dash_in_a_number_string_is_a_minus_sign(dash: str) -> None:
    p = parse_output(f'{{"count": "{dash}3", "value": "{dash}0.5"}}', NUM)
    assert p.usable and p.value["count"] == -3 and p.value["value"] == -0.5, p


def test_a_colon_inside_an_unquoted_value_starts_no_value() -> None:
    p = parse_output("{note: at 12:30 or so, count: 3}", NUM)
    assert p.usable and p.value == {"note": "at 12:30 or so", "count": 3}, p


@pytest.mark.parametrize("label", [
    "Beispiel-Ausgabe:", "Ejemplo de salida:", "Exemple de réponse :",
    "Пример вывода:", "示例输出：", "サンプル出力：", "출력 예시:", "Örnek çıktı:",
    "Voorbeelduitvoer:", "Esempio di output:", "Exemplo de saída:",
    "Texto de entrada:", "Исходные данные:", "入力データ：", "입력:", "Zum Beispiel:",
    "Por ejemplo:", "Например:", "例えば：", "예를 들어:", "Bijvoorbeeld:", "Örneğin:",
    "على سبيل المثال:", "Modèle :", "Se fosse positivo:",
    "Gdyby była pozytywna:", "Eğer olumlu olsaydı:", "لو كانت إيجابية:", "만약 긍정적이라면:",
])
def test_more_labels_of_a_value_that_is_not_the_answer(label: str) -> None:
    p = parse_output(f"{label} {E}\nAntwort: {P}", S)
    assert p.usable and p.value["label"] == "negative", p


# (Taken out after the regression review, xfail: an example's word before another
# word ("Musterlösung:", "Örnek sonuç:" introduce answers) and "als" (also "as": "Als
# JSON:") without a counterfactual verb are not read; the first value is delivered.)
@pytest.mark.xfail(strict=True, reason="such labels are not read")
@pytest.mark.parametrize("label", ["Musterantwort:", "Przykładowa odpowiedź:",
                                   "Als het positief was:"])
def test_labels_no_longer_read(label: str) -> None:
    p = parse_output(f"{label} {E}\nAntwort: {P}", S)
    assert p.usable and p.value["label"] == "negative", p


@pytest.mark.parametrize("intro", [
    "Korrigiert:", "Korrigierte Antwort:", "Nein, warte:", "Réponse corrigée :",
    "Respuesta corregida:", "Resposta corrigida:", "Исправленный ответ:", "Gecorrigeerd:",
    "Poprawiona odpowiedź:", "Düzeltilmiş cevap:", "الإجابة المصححة:", "انتظر، في الواقع:",
    "待って、実際は：", "最終回答：", "Son cevap:", "Definitief antwoord:", "Nee, wacht:",
    "Nie, czekaj:", "Hayır, bekle:", "No, espera:", "Ой, ошибся:",
])
def test_more_corrections_in_other_languages(intro: str) -> None:
    p = parse_output(f"{E}\n{intro} {P}", S)
    assert p.usable and p.value["label"] == "negative", p


def test_every_value_inside_an_examples_tag_is_not_the_answer() -> None:
    other = '{"label": "neutral", "confidence": 0.1}'
    p = parse_output(f"<examples>\n{E}\n{other}\n</examples>\n{P}", S)
    assert p.usable and p.value["label"] == "negative", p
