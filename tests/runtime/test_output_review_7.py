"""Regression review of the 2026-12-07 change (970 adversarial answers, 199 of them read
right before it and wrong after). The rules it added are narrowed:

* T: an answer written as a tool call is its arguments only where the object, read as
  the answer, misses a required field or holds no declared field but ``name``, and
  the arguments hold more of the declared fields (never an object that conforms as
  written: ``{"name": "lookup_user", "parameters": {"name": "Bob"}}``).
* R1: a reasoning section whose body is a value right under its label ("## Analysis"
  then a fence) gives way to a later labelled value only if that value declares every
  declared field the first one does.
* R2: the answer label after a reasoning label stands outside every value (not a bare
  key of a JSON5 object: ``answer: {...}``).
* C: after 訂正/수정/최종 ... only an ending meaning done, corrected, a version or the
  result makes the label a correction ("訂正します：", "수정된 결과:"), not "before",
  the target, a request, an example, a format or a list of changes ("訂正する前の出力：",
  "수정할 원본:", "정답 예시:", "수정 내용:").
* F: a correction label followed by a fence counts only if the value stands in that
  fence (not "Korrektur:\\n```\\nkeine nötig\\n```" with an example further below).
* Q: a draft or example label qualified as revised, final, filled in, a version or for
  this input ("Entwurf (überarbeitet):", "下書き（最終）：", "Beispiel (dein Text):")
  is no such label; when every value is labelled a draft, the last is the answer.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from lockgate.runtime import parse_output
from lockgate.spec import DeliveryRule

SENT = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["label", "confidence"],
    "properties": {"label": {"enum": ["positive", "negative", "neutral", "mixed"]},
                   "confidence": {"type": "number", "minimum": 0, "maximum": 1}}}})
CALL = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["name"],
    "properties": {"name": {"type": "string"}, "input": {"type": "object"}}}})
EVENT = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["name", "type"],
    "properties": {"id": {"type": "string"}, "name": {"type": "string"},
                   "type": {"type": "string"}, "payload": {"type": "object"}}}})
TOOL_USE = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["name", "id"],
    "properties": {"id": {"type": "string"}, "name": {"type": "string"},
                   "input": {"type": "object"}, "type": {"enum": ["tool_use"]}}}})
MODEL = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["name"],
    "properties": {"name": {"type": "string"}, "learning_rate": {"type": "number"},
                   "epochs": {"type": "integer"}}}})
PERSON = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["name", "age"],
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                   "email": {"type": ["string", "null"]}}}})
PAPER = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["title"],
    "properties": {"title": {"type": "string"},
                   "authors": {"type": "array", "items": {"type": "string"}},
                   "year": {"type": "integer"}}}})
ANY = DeliveryRule()

POS = {"label": "positive", "confidence": 0.9}
NEG = {"label": "negative", "confidence": 0.8}
PAPER_FULL = {"title": "Attention Is All You Need", "authors": ["Vaswani", "Shazeer"],
              "year": 2017}


def _j(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _fenced(value: Any) -> str:
    return "```json\n" + json.dumps(value, indent=2, ensure_ascii=False) + "\n```"


def _delivers(raw: str, rule: DeliveryRule, value: Any) -> None:
    parsed = parse_output(raw, rule)
    assert parsed.usable and parsed.value == value, parsed


# --- T: tool calls ----------------------------------------------------------------------


@pytest.mark.parametrize("key", ["arguments", "parameters", "args"])
@pytest.mark.parametrize("rule, value", [
    (CALL, {"name": "lookup_user", "ARGS": {"name": "Bob"}}),
    (CALL, {"name": "search", "ARGS": {"name": "Paris", "limit": 5}}),
    (CALL, {"name": "create_user", "ARGS": {"name": "Bob", "input": "x"}}),
    (EVENT, {"id": "evt_1", "name": "page_view", "type": "nav", "ARGS": {"type": "landing"}}),
    (EVENT, {"id": "e0", "name": "click", "type": "ui", "ARGS": {"name": "submit",
                                                                "type": "primary"}}),
    (TOOL_USE, {"type": "tool_use", "id": "toolu_01", "name": "get_weather",
                "ARGS": {"name": "Paris"}}),
    (TOOL_USE, {"id": "toolu_01", "name": "lookup", "ARGS": '{"id": "u42", "name": "Bob"}'}),
    (MODEL, {"name": "resnet50", "ARGS": {"learning_rate": 0.001, "epochs": 10}}),
], ids=["name-only", "extra-arg", "mistyped-arg", "event", "event-both", "tool-use",
        "json-text", "loses-required"])
def test_an_object_that_conforms_as_written_is_no_tool_call(
        key: str, rule: DeliveryRule, value: dict[str, Any]) -> None:
    value = {key if k == "ARGS" else k: v for k, v in value.items()}
    _delivers(_j(value), rule, value)
    _delivers(f"Here is the event:\n{_fenced([value])}", rule, value)


def test_a_tool_call_whose_arguments_hold_the_answer_is_still_unwrapped() -> None:
    ada = {"name": "Ada", "age": 36, "email": None}
    _delivers(_j({"name": "submit_person", "arguments": ada}), PERSON, ada)
    _delivers(_j({"name": "submit", "parameters": _j(ada)}), PERSON, ada)
    args = {"name": "basket", "type": "cart", "id": "x"}
    _delivers(_j({"name": "checkout", "arguments": args}), EVENT, args)


# --- R1/R2: labelled reasoning sections -------------------------------------------------


@pytest.mark.parametrize("raw", [
    f"## Analysis\n```json\n{_j(PAPER_FULL)}\n```\n\n## Result\n"
    + _j({"title": PAPER_FULL["title"]}),
    f"**Analysis**\n```json\n{_j(PAPER_FULL)}\n```\n\n**Result**\n"
    + _j({"title": PAPER_FULL["title"]}),
    f"Analysis:\n{_j(PAPER_FULL)}\n\nOutput: " + _j({"authors": ["Vaswani"]}),
    f"考察：\n{_j(PAPER_FULL)}\n\n結果：\n" + _j({"title": PAPER_FULL["title"]}),
    f"考察：\n{_j(PAPER_FULL)}\n\n答え：\n" + _j({"title": PAPER_FULL["title"]}),
], ids=["heading", "bold", "colon", "ja", "ja-answer"])
def test_a_reasoning_section_that_is_a_value_keeps_it_over_a_later_part(raw: str) -> None:
    _delivers(raw, PAPER, PAPER_FULL)


def test_a_value_right_under_a_reasoning_label_gives_way_to_a_full_answer() -> None:
    raw = f"## Analysis\n```json\n{_j(NEG)}\n```\n\n## Answer\n{_j(POS)}"
    _delivers(raw, SENT, POS)
    _delivers(f"Reasoning: I think {_j(NEG)}\nAnswer: {_j(POS)}", SENT, POS)


@pytest.mark.parametrize("raw, value", [
    ("Thought: here it is\n{\n  reasoning: 'short',\n  answer: {label: 'positive', "
     "score: 0.9}\n}", {"reasoning": "short", "answer": {"label": "positive", "score": 0.9}}),
    ("Reasoning: computed below.\n{\n  steps: [{n: 1}],\n  output: {sum: 6}\n}",
     {"steps": [{"n": 1}], "output": {"sum": 6}}),
    ("Analysis:\n{\n  reasoning: \"warm tone\",\n  output: {label: \"positive\"}\n}",
     {"reasoning": "warm tone", "output": {"label": "positive"}}),
    ("Reasoning: see below\n{\n  note: 'a } in a string',\n  result: {label: 'x'}\n}",
     {"note": "a } in a string", "result": {"label": "x"}}),
], ids=["answer-key", "output-key", "double-quoted", "bracket-in-string"])
def test_an_answer_label_inside_the_value_is_a_key(raw: str, value: Any) -> None:
    _delivers(raw, ANY, value)


# --- C: corrections in Japanese and Korean ------------------------------------------------


@pytest.mark.parametrize("label", [
    "訂正する前の出力：", "수정하기 전:", "수정 이전:", "訂正以前：", "最終チェック前：",
    "수정할 원본:", "訂正対象：", "수정 요청:", "수정 대상:", "訂正依頼：", "実は入力：",
    "정답 예시:", "最終回答の例：", "最終出力例：", "수정 예시:", "최종 답변 형식:",
    "正しくは次の形式：", "수정 내용:", "수정 사항:", "訂正内容：", "訂正点：", "修正前：",
])
@pytest.mark.parametrize("show", [_j, _fenced], ids=["chatter", "fenced"])
def test_a_word_after_a_correction_that_is_no_correction(label: str, show: Any) -> None:
    _delivers(f"{show(POS)}\n\n{label}\n{show(NEG)}", SENT, POS)


@pytest.mark.parametrize("label", [
    "訂正：", "訂正します：", "訂正いたします：", "訂正版：", "訂正後：", "最終回答：",
    "수정된 결과:", "수정본:", "정정합니다:", "수정했습니다:", "정정된 답변:", "최종 답변:",
    "수정 후:", "実際は次の通りです：",
])
@pytest.mark.parametrize("show", [_j, _fenced], ids=["chatter", "fenced"])
def test_a_correction_with_its_ending_still_replaces_the_value_before(label: str,
                                                                      show: Any) -> None:
    _delivers(f"{show(NEG)}\n\n{label}\n{show(POS)}", SENT, POS)


def test_after_and_before_the_correction_in_that_order() -> None:
    _delivers(f"수정 후:\n{_j(POS)}\n\n수정 이전:\n{_j(NEG)}", SENT, POS)
    _delivers(f"訂正後：\n{_fenced(POS)}\n\n訂正する前：\n{_fenced(NEG)}", SENT, POS)


# --- F: a label, then a fence that holds no value ------------------------------------------


@pytest.mark.parametrize("label, note, later", [
    ("Korrektur:", "keine nötig", "Zum Vergleich ein negatives Beispiel:"),
    ("実は：", "肯定的なレビューです", "参考までに入力："),
    ("사실은:", "긍정적인 리뷰입니다", "참고로 입력:"),
    ("정정:", "없음", "참고용 부정 예시:"),
    ("Correction:", "none needed", "For comparison, a negative one:"),
])
@pytest.mark.parametrize("show", [_j, _fenced], ids=["chatter", "fenced"])
def test_a_label_over_a_fence_of_prose_introduces_no_later_value(
        label: str, note: str, later: str, show: Any) -> None:
    raw = f"{show(POS)}\n\n{label}\n```\n{note}\n```\n{later}\n{show(NEG)}"
    _delivers(raw, SENT, POS)


@pytest.mark.parametrize("label", ["Korrektur:", "訂正：", "수정된 결과:", "Poprawka:"])
def test_a_label_over_the_fence_of_its_value_is_still_a_correction(label: str) -> None:
    _delivers(f"{_fenced(NEG)}\n\n{label}\n{_fenced(POS)}", SENT, POS)
    _delivers(f"{_j(NEG)}\n\n{label}\n```\n{_j(POS)}\n```", SENT, POS)


# --- Q: qualified draft labels ----------------------------------------------------------------


@pytest.mark.parametrize("first, second", [
    ("Entwurf:", "Entwurf (überarbeitet):"), ("Borrador:", "Vorlage (ausgefüllt):"),
    ("Plantilla:", "Borrador (corregido):"), ("Borrador:", "Borrador (versión final):"),
    ("下書き：", "下書き（最終）："), ("초안:", "초안 (최종):"), ("Szkic:", "Szkic (ostateczny):"),
    ("Черновик:", "Черновик (v2):"), ("Entwurf:", "Entwurf (Version 2):"),
    ("例：", "Beispiel (dein Text):"), ("Voorbeeld:", "例（今回の入力）："),
    ("Örnek:", "Ejemplo (su reseña):"), ("Draft:", "Draft (v2):"), ("草稿：", "草稿（最终版）："),
    ("Brouillon :", "草稿（修改后）："),
])
@pytest.mark.parametrize("show", [_j, _fenced], ids=["chatter", "fenced"])
def test_a_draft_label_qualified_as_done_introduces_the_answer(first: str, second: str,
                                                               show: Any) -> None:
    _delivers(f"{first}\n{show(NEG)}\n\n{second}\n{show(POS)}", SENT, POS)


@pytest.mark.parametrize("first, second", [
    ("Draft:", "Draft 2:"), ("Entwurf 1:", "Entwurf 2:"), ("Черновик:", "Черновик:"),
])
def test_when_every_value_is_a_draft_the_last_is_the_answer(first: str, second: str) -> None:
    _delivers(f"{first}\n{_j(NEG)}\n\n{second}\n{_j(POS)}", SENT, POS)


@pytest.mark.parametrize("label", ["下書き（誤り）：", "Черновик (неверно):",
                                   "Borrador (incorrecto):", "Entwurf (falsch):"])
def test_a_draft_label_qualified_as_wrong_still_marks_its_value(label: str) -> None:
    _delivers(f"{label} {_j(NEG)}\n\n{_j(POS)}", SENT, POS)
    _delivers(f"Draft:\n{_j(POS)}\n\n{label}\n{_j(NEG)}", SENT, POS)


@pytest.mark.parametrize("label", ["Beispiel 1:", "Ejemplo 2:", "Пример 1:", "Przykład #1:"])
def test_a_numbered_example_label_marks_its_value(label: str) -> None:
    _delivers(f"{label}\n{_j(NEG)}\n\nAntwort:\n{_j(POS)}", SENT, POS)
