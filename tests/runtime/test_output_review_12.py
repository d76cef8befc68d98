"""Review of the output pass on corrections and reasoning in several languages (the
output7 corpus: 5,315 replies). Each defect it confirmed, as minimal examples:

* A: a correction in Chinese cut off by the end of the output ("不对，应该是：{...cut")
  delivered the draft it takes back: the words between the phrase and the bracket
  were English only. Refused, as for English.
* B: corrections written in Chinese, Japanese, Korean or Arabic (错了，正确的是：,
  以此为准：, 間違えました。正しい出力：, 아니요, 다시:, لا، الصحيح:) and "here's the
  fix:" were not read as such: the value taken back was delivered.
* C: reasoning in the non-tag forms left open (``Thinking...`` with no ``...done
  thinking.``, ``◁think▷``, ``[THINK]``, ``<|begin_of_thought|>``) was searched: a
  draft in it was delivered. Read as an unclosed ``<think>``.
* D: a headless reasoning block holding a draft, then an answer cut off: the draft was
  delivered (the whole reply was searched when the rest held no usable answer).
* E: a correction cut off after a finished field was delivered in part (the cut value
  itself was usable); refused, as the docs say.
* F: an enum label in CJK corner brackets (『positive』, 「positive」) is the member.

Then a before/after review (3,765 adversarial replies) found the rules above too broad:

* G: 应该是 / 应为 / 以…为准 and the new correction words took back the answer for
  another item's value ("第二条评论的结果应该是：", "Next review:"), a condition ("对于差评，"),
  words quoted from the input ("顾客说：“我搞错了尺码”") or prose ("说错了也没关系"), and a
  cut item after a finished answer was refused ("重新分类的候选标签：[...cut").
* I: a second review (4,007 replies) found G's narrowing too broad in turn: an inch
  mark ('a 10" tablet'), a quotation closed before the phrase or never closed, and a
  block quote ("> Correction:") made the model's own correction "quoted"; "#1", a
  ticket number, the first item (第一条, 评论1), the one before (上一条), this one
  (对于这条, 在这种情况下) and another item named in a parenthesis read as another
  item. The value taken back was delivered.
* J: a third review (2,398 replies) found G's and I's conditions applied to every
  correction phrase, also those read before this review (更正, "Correction",
  "Actually", 最终, 纠正, 不对): a label quoted for emphasis (“更正”：, **"Correction"**:)
  and words in the correction about this item (评价2星, 第三条理由, "customer #12's
  review", "per the template", 跟其他店比, 一般情况下, 换成, 对于顾客提到的...) took
  nothing back any more. Those conditions now hold only for the words and paths added
  above (B's words, 应该是 / 以此为准, A's cut paths); the others read as before.
* H: a reasoning marker in a code fence, on an indented code line or on a line of a
  string value was read as reasoning left open (refused, or the string rewritten);
  ``Thinking...`` before a reply that ends with its value is answered; CRLF as LF.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lockgate.runtime import ParseStatus, parse_output
from lockgate.spec import DeliveryRule

SENT = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["label", "confidence"],
    "properties": {"label": {"enum": ["positive", "negative", "neutral"]},
                   "confidence": {"type": "number", "minimum": 0, "maximum": 1}}}})
TASK = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["priority", "due_date"],
    "properties": {"priority": {"enum": ["low", "medium", "high"]},
                   "due_date": {"type": ["string", "null"]},
                   "assignee": {"type": "string"}}}})

DRAFT = {"label": "negative", "confidence": 0.4}
FULL = {"label": "positive", "confidence": 0.9}
D = json.dumps(DRAFT)
CUT = '{"label": "positive", "confidence": 0.9'


def _refused_as_cut(raw: str, finish_reason: str | None) -> None:
    parsed = parse_output(raw, SENT, finish_reason=finish_reason)
    assert not parsed.usable and parsed.truncated, parsed
    if finish_reason == "length":
        assert parsed.status is ParseStatus.TRUNCATED


# --- A: a correction cut off, in Chinese as in the other languages


@pytest.mark.parametrize("finish_reason", ["length", None])
@pytest.mark.parametrize("phrase", [
    "不对，应该是：", "最终答案：", "修改后：", "改为：", "纠正一下：", "错了，正确的是：",
    "以下面这个为准：", "訂正：", "최종 답변:", "تصحيح:", "Actually, correction:",
])
@pytest.mark.parametrize("gap", ["", "\n"])
def test_a_cut_correction_is_refused(phrase: str, gap: str, finish_reason: str | None) -> None:
    _refused_as_cut(D + "\n" + phrase + gap + CUT, finish_reason)


@pytest.mark.parametrize("raw", [
    D + "\n最终说明：分数在[0, 1",            # "final note: scores are in [0, 1"
    D + "\n最终的格式为：{",                  # a bracket the output ends right after
    D + "\n另一条评论应该是：" + CUT,          # another item, not a correction
])
def test_a_prose_ending_on_a_bracket_takes_nothing_back(raw: str) -> None:
    parsed = parse_output(raw, SENT, finish_reason="length")
    assert parsed.usable and parsed.value == DRAFT, parsed


# --- B: complete corrections in other languages


@pytest.mark.parametrize("phrase", [
    "错了，正确的是：", "应该是：", "不好意思，上面的有误，以此为准：", "以下面这个为准：",
    "再确认一下，应为：", "哦不，我搞错了：", "我重新检查了一下，结果是：", "纠正一下：",
    "間違えました。正しい出力：", "아니요, 다시:", "잘못했습니다. 다시:", "لا، الصحيح:",
    "EDIT: misclassified, here's the fix:", "I misclassified it. Correction:",
])
@pytest.mark.parametrize("gap", [" ", "\n"])
def test_b_correction_delivers_the_later_value(phrase: str, gap: str) -> None:
    parsed = parse_output(D + "\n\n" + phrase + gap + json.dumps(FULL), SENT)
    assert parsed.usable and parsed.value == FULL, parsed


@pytest.mark.parametrize("raw", [
    D + "\n如果是正面的，应该是：" + json.dumps(FULL),      # a condition
    D + "\n另一条评论的结果应该是：" + json.dumps(FULL),    # another item
    D + "\n再补充一个例子：" + json.dumps(FULL),            # an example
    D + "\n我们还可以参考：" + json.dumps(FULL),            # a reference
    D + "\n不正确的是：" + json.dumps(FULL),                # "what is wrong is"
    D + "\n答案不应该是：" + json.dumps(FULL),              # "should not be"
    D + "\n这个任务很简单，下面是另一个例子：" + json.dumps(FULL),
])
def test_b_other_values_do_not_replace_the_first(raw: str) -> None:
    parsed = parse_output(raw, SENT)
    assert parsed.usable and parsed.value == DRAFT, parsed


@pytest.mark.parametrize("lead", [
    "我重新读了一遍文本，结果如下：", "错了的地方已经改好：", "间違えないように：",
    "다시 말해:", "الصحيح هو:", "Here's the fix for your text:",
])
def test_b_prose_before_a_single_answer_changes_nothing(lead: str) -> None:
    parsed = parse_output(lead + "\n" + json.dumps(FULL), SENT)
    assert parsed.usable and parsed.value == FULL, parsed


# --- C: reasoning left open in the non-tag forms


OLLAMA = "Thinking...\n"
OPENERS = [OLLAMA, "◁think▷", "[THINK]", "<|begin_of_thought|>", "<think>\n"]


@pytest.mark.parametrize("finish_reason", ["length", None])
@pytest.mark.parametrize("opener", OPENERS)
def test_c_open_reasoning_is_cut_off_while_thinking(opener: str,
                                                    finish_reason: str | None) -> None:
    raw = opener + "The user is upset? maybe " + D + "\nlet me check the emoji"
    parsed = parse_output(raw, SENT, finish_reason=finish_reason)
    assert not parsed.usable and parsed.status is not ParseStatus.VALID, parsed
    assert parsed.truncated and "stripped:think" in parsed.fixes


@pytest.mark.parametrize("raw", [
    "Thinking... the review says it is great: " + json.dumps(FULL),
    "Thinking about it:\n" + json.dumps(FULL),
    "Thinking...\nmaybe " + D + "\n...done thinking.\n\n" + json.dumps(FULL),
    "◁think▷maybe " + D + "◁/think▷" + json.dumps(FULL),
    "[THINK]maybe " + D + "[/THINK]\n" + json.dumps(FULL),
    json.dumps(FULL) + "\n[THINK] is the token Magistral opens its reasoning with",
])
def test_c_closed_reasoning_and_prose_keep_the_answer(raw: str) -> None:
    parsed = parse_output(raw, SENT)
    assert parsed.usable and parsed.value == FULL, parsed


TEXT = DeliveryRule.model_validate({"format": "text"})


@pytest.mark.parametrize("raw, answer", [
    ("Paris.\n[THINK] is the token Magistral opens its reasoning with",
     "Paris.\n[THINK] is the token Magistral opens its reasoning with"),
    ("Thinking... the capital is Paris.", "Thinking... the capital is Paris."),
    ("◁think▷hmm◁/think▷Paris.", "Paris."),
    ("[THINK]hmm, maybe Lyon\n", None),
    ("Thinking...\nmaybe Lyon, let me check", None),
])
def test_c_text_answers(raw: str, answer: str | None) -> None:
    parsed = parse_output(raw, TEXT)
    assert parsed.usable == (answer is not None) and parsed.value == answer, parsed


@settings(max_examples=60, deadline=None)
@given(opener=st.sampled_from(OPENERS),
       before=st.text(st.sampled_from("abc xyz,.\n"), max_size=40),
       after=st.text(st.sampled_from("abc xyz,.\n"), max_size=40),
       finish_reason=st.sampled_from(["length", "stop", None]))
def test_c_a_draft_in_open_reasoning_is_never_delivered(opener: str, before: str, after: str,
                                                        finish_reason: str | None) -> None:
    # (words after the draft: Ollama's opener before a reply that ends with its value is
    # answered, test_h_ollama_opener_before_a_final_value_is_answered)
    raw = opener + before + " " + D + " " + after + ("hmm" if opener == OLLAMA else "")
    parsed = parse_output(raw, SENT, finish_reason=finish_reason)
    assert not parsed.usable, parsed


# --- D: a headless block's draft, then an answer cut off


@pytest.mark.parametrize("finish_reason", ["length", None])
@pytest.mark.parametrize("cut", [CUT[:20], CUT, '{"label": "positive", "confidence": 0.9, "x": [1'])
def test_d_cut_answer_after_headless_reasoning_is_not_its_draft(cut: str,
                                                                finish_reason: str | None) -> None:
    raw = "First guess:\n" + D + "\nHmm, let me re-read.\n</think>\n\n" + cut
    parsed = parse_output(raw, SENT, finish_reason=finish_reason)
    assert parsed.value != DRAFT and parsed.truncated, parsed
    if finish_reason == "length":
        assert parsed.status is ParseStatus.TRUNCATED


def test_d_answer_holding_a_closing_tag_is_still_read_whole() -> None:
    raw = '{"label": "positive", "confidence": 0.9} </think> and nothing after'
    parsed = parse_output(raw, SENT)
    assert parsed.usable and parsed.value == FULL, parsed


# --- E: a correction cut after a finished field


TASK_DRAFT = '{"priority": "medium", "due_date": null, "assignee": "Bob"}'


@pytest.mark.parametrize("finish_reason", ["length", None])
@pytest.mark.parametrize("cut", [
    '{"priority": "low", "due_date": null,',
    '{"priority": "low", "due_date": null, "assignee": "Bob"',
    '{"priority": "low", "due_date": null, "assignee": "Bo',
])
@pytest.mark.parametrize("phrase", ["Wait, correction:\n", "Actually, correction: ", "更正：\n"])
def test_e_cut_correction_is_refused_not_delivered_in_part(phrase: str, cut: str,
                                                           finish_reason: str | None) -> None:
    parsed = parse_output(TASK_DRAFT + "\n" + phrase + cut, TASK, finish_reason=finish_reason)
    assert not parsed.usable and parsed.truncated, parsed


@pytest.mark.parametrize("raw, value", [
    ('{"priority": "low", "due_date": null,', {"priority": "low", "due_date": None}),
    (TASK_DRAFT + "\nAnother possible result: " + '{"priority": "low", "due_date": null,',
     {"priority": "medium", "due_date": None, "assignee": "Bob"}),
])
def test_e_cut_value_that_corrects_nothing_keeps_its_reading(raw: str, value: Any) -> None:
    parsed = parse_output(raw, TASK)
    assert parsed.usable and parsed.value == value, parsed


# --- F: enum labels in CJK corner brackets


@pytest.mark.parametrize("label", ["『positive』", "「positive」", "「 Positive 」",
                                   "**「positive」**"])
def test_f_corner_brackets_around_a_member(label: str) -> None:
    parsed = parse_output(json.dumps({"label": label, "confidence": 0.9}, ensure_ascii=False),
                          SENT)
    assert parsed.usable and parsed.value == FULL, parsed


@pytest.mark.parametrize("enum, label", [
    (["「A」", "B"], "「B」"),                 # a member's own ends are corner brackets
    (["positive", "negative"], "『positive』と『negative』"),
])
def test_f_corner_brackets_not_taken_off(enum: list[str], label: str) -> None:
    rule = DeliveryRule.model_validate({"schema": {
        "type": "object", "required": ["label"], "properties": {"label": {"enum": enum}}}})
    parsed = parse_output(json.dumps({"label": label}, ensure_ascii=False), rule)
    assert parsed.status is ParseStatus.SCHEMA_VIOLATION, parsed


def test_e_keep_truncated_still_delivers_the_cut_correction() -> None:
    rule = DeliveryRule.model_validate({**TASK.model_dump(by_alias=True, exclude_none=True),
                                        "keep_truncated": True})
    parsed = parse_output(TASK_DRAFT + "\nWait, correction:\n"
                          '{"priority": "low", "due_date": null,', rule)
    assert parsed.usable and parsed.value["priority"] == "low", parsed


# --- G: the correction rules kept to corrections


@pytest.mark.parametrize("lead", [
    "第二条评论的结果应该是：", "下一条的结果应该是：", "后一条评论的答案应为：",
    "评论2的标签应该是：", "最后一条评论的结果应为：", "对于差评，标签应该是：",
    "换作差评，标签应该是：", "反过来，差评的结果应该是：", "差评的情况下，结果应为：",
    "颜色以实物为准：", "以下面格式为准：",
])
@pytest.mark.parametrize("sep", ["\n", "\n\n---\n"])
def test_g_should_be_for_another_item_takes_nothing_back(lead: str, sep: str) -> None:
    parsed = parse_output(D + sep + lead + json.dumps(FULL), SENT)
    assert parsed.usable and parsed.value == DRAFT, parsed


@pytest.mark.parametrize("words", [
    "顾客说：“我搞错了尺码，不过质量很好。”", "评论原文：\n> 我搞错了颜色，但还是很喜欢。",
    "评论里写着「订正：是5月买的」。", 'Customer wrote: "I misclassified my own order".',
    "说错了也没关系，可以退货。", "再核对一遍，评论确实是正面的。",
    "前面有问题的是物流，不是产品。", "標識は正しいです。間違いでしたら教えてください。",
    "I misclassified nothing; it is positive.",
])
@pytest.mark.parametrize("then", ["", "第二条评论：", "Next review:", "For review #2:",
                                  "다음 리뷰:"])
def test_g_correction_words_that_introduce_nothing(words: str, then: str) -> None:
    parsed = parse_output(D + "\n" + words + "\n" + then + json.dumps(FULL), SENT)
    assert parsed.usable and parsed.value == DRAFT, parsed


@pytest.mark.parametrize("finish_reason", ["length", None])
@pytest.mark.parametrize("tail", [
    "重新分类的候选标签：" + '["positive", "neg', "重新包装很好，另外：" + CUT,
    "注意，重新运行时格式：" + CUT, "下一条评论的结果应该是：" + CUT, "对于差评，应该是：[0, 1",
    "再确认一下输入：" + CUT, "正しい出力の例：" + CUT, "다시 말해 다음 리뷰:" + CUT,
])
def test_g_cut_item_after_a_finished_answer_keeps_it(tail: str, finish_reason: str | None) -> None:
    parsed = parse_output(D + "\n\n" + tail, SENT, finish_reason=finish_reason)
    assert parsed.usable and parsed.value == DRAFT, parsed


@settings(max_examples=60, deadline=None)
@given(words=st.text(st.sampled_from("我搞错了再确认订正间違いでした잘못했습니다 ，。"),
                     max_size=16),
       item=st.sampled_from(["第二条评论：", "下一条评论：", "评论2：", "次のレビュー：",
                             "Next review:"]))
def test_g_another_items_value_never_corrects(words: str, item: str) -> None:
    parsed = parse_output(D + "\n" + words + "\n" + item + json.dumps(FULL), SENT)
    assert parsed.usable and parsed.value == DRAFT, parsed


# --- H: reasoning markers that open nothing


REASON = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["label"],
    "properties": {"label": {"enum": ["positive", "negative"]}, "reason": {"type": "string"}}}})


@pytest.mark.parametrize("marker", ["◁think▷", "[THINK]", "<|begin_of_thought|>"])
@pytest.mark.parametrize("before", [
    "```\n{m}\n```\n", "    {m}\n\n", "Markers:\n    {m}\n\n",
    "Example of the raw stream:\n```\n{m}\nlet me think\n```\n",
    "Note:\n{m} tokens were removed by the server.\n",
])
def test_h_marker_quoted_before_the_answer(marker: str, before: str) -> None:
    parsed = parse_output(before.format(m=marker) + json.dumps(FULL), SENT)
    assert parsed.usable and parsed.value == FULL, parsed


@pytest.mark.parametrize("marker", ["◁think▷", "[THINK]", "<|begin_of_thought|>"])
@pytest.mark.parametrize("reason", ["x\n{m} y", "line1\n{m}", "a\n  {m} b", "x\n{m}y{c} z"])
def test_h_marker_on_a_line_of_a_string_stays_in_it(marker: str, reason: str) -> None:
    closer = {"◁think▷": "◁/think▷", "[THINK]": "[/THINK]"}.get(marker, "<|end_of_thought|>")
    value = {"label": "positive", "reason": reason.format(m=marker, c=closer)}
    raw = '{"label": "positive", "reason": "' + value["reason"] + '"}'
    parsed = parse_output(raw, REASON)
    assert parsed.usable and parsed.value == value, parsed


@pytest.mark.parametrize("raw", [
    OLLAMA + json.dumps(FULL), OLLAMA + "\nThe review is positive.\n\n" + json.dumps(FULL),
    OLLAMA + "```json\n" + json.dumps(FULL) + "\n```",
    "Thinking...\r\nmaybe " + D + "\r\n...done thinking.\r\n\r\n" + json.dumps(FULL),
])
def test_h_ollama_opener_before_a_final_value_is_answered(raw: str) -> None:
    parsed = parse_output(raw, SENT)
    assert parsed.usable and parsed.value == FULL, parsed


@pytest.mark.parametrize("finish_reason", ["length", None])
@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_h_ollama_opener_left_open_in_words_is_cut(newline: str,
                                                  finish_reason: str | None) -> None:
    raw = ("Thinking..." + newline + "Candidate: " + D + newline
           + "Let me double-check the details against")
    _refused_as_cut(raw, finish_reason)


# --- I: quotations and other items, as the model writes its own corrections

LONG_QUOTE = ('The customer wrote "' + "arrived late, box damaged, " * 6
              + 'never again" in the title. ')


@pytest.mark.parametrize("phrase", ["Correction:", "Final answer:", "更正："])
@pytest.mark.parametrize("before", [
    'He said it\'s a 10" tablet. ', 'The 5" screen is the complaint. ', LONG_QUOTE,
    "The title says “Love it. ", 'She wrote "great" twice. ', "评论说「很好」。",
])
def test_i_quotes_elsewhere_on_the_line_leave_the_correction(phrase: str, before: str) -> None:
    parsed = parse_output(D + "\n" + before + phrase + "\n" + json.dumps(FULL), SENT)
    assert parsed.usable and parsed.value == FULL, parsed


@pytest.mark.parametrize("line", [
    "> Correction:", ">Correction:", "> **Correction:** the label should be negative:",
    "> Final answer:", "> 更正：", ">更正：",
])
def test_i_block_quoted_correction_is_the_models(line: str) -> None:
    parsed = parse_output(D + "\n" + line + "\n" + json.dumps(FULL), SENT)
    assert parsed.usable and parsed.value == FULL, parsed


@pytest.mark.parametrize("finish_reason", ["length", None])
@pytest.mark.parametrize("line", [
    "> Correction:", "> 更正：", "> Final answer:",
    'Hmm, the 5" screen complaint is key. Actually, the correct output is:',
    'The 5" screen review: wait, I misread it. Correct output:',
])
def test_i_cut_correction_so_written_is_refused(line: str, finish_reason: str | None) -> None:
    _refused_as_cut(D + "\n" + line + "\n" + CUT, finish_reason)


@pytest.mark.parametrize("line", [
    "Correction for review #1:", "Correction for review #1 (the only one):",
    "Actually, for ticket #4521 the correct output is:", "Final answer for review #1:",
    "Wait, I made a mistake. For review #1 the correct output is:",
    "Correction — review #1 should be:", "Actually, for order #123 the correct output is:",
    "Correction (I confused this with another review):",
    "Correction (see the other items below):", "更正（我和另一条评论搞混了）：",
    "更正：第一条评论的结果应为：", "更正：第1条的结果：", "不对，第一条应该是：",
    "更正：评论1的结果：", "更正上一条回复的结果：", "更正：对于这条评论：",
    "实际上，对于这条评论，结果是：", "更正：在这种情况下，标签应为负面：",
])
@pytest.mark.parametrize("sep", ["\n", "\r\n", "\n\n"])
def test_i_correction_naming_the_current_item(line: str, sep: str) -> None:
    parsed = parse_output(D + sep + line + sep + json.dumps(FULL), SENT)
    assert parsed.usable and parsed.value == FULL, parsed


@pytest.mark.parametrize("lead", [
    "For review #2:", "I misclassified it. Next review:", "错了。第二条评论：",
    "我搞错了，第2条评论：", "评论2的结果：", "对于这类差评，答案应为：",
    "差评的情况下，结果应为：", "下一条评论的结果应该是：",
])
def test_i_other_items_are_still_other_items(lead: str) -> None:
    parsed = parse_output(D + "\n" + lead + json.dumps(FULL), SENT)
    assert parsed.usable and parsed.value == DRAFT, parsed


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 99), words=st.text(st.sampled_from("ab ,.“”"), max_size=20),
       phrase=st.sampled_from(["Correction:", "Final answer:", "更正：", "> Correction:"]))
def test_i_inch_marks_never_quote_a_correction(size: int, words: str, phrase: str) -> None:
    line = f'The {size}" model{words}. {phrase}'
    parsed = parse_output(D + "\n" + line + "\n" + json.dumps(FULL), SENT)
    assert parsed.usable and parsed.value == FULL, parsed


# --- J: the conditions of G and I hold for the words they were written for only

J_LATER = {"label": "negative", "confidence": 0.9}
J_FIRST = {"label": "positive", "confidence": 0.8}


def _delivers_the_correction(raw: str) -> None:
    parsed = parse_output(raw, SENT)
    assert parsed.usable and parsed.value == J_LATER, parsed


@pytest.mark.parametrize("label", [
    "“更正”：", '"更正"：', "“不对”，", "“纠正”：", "“最终答案”：", "“修正后”：",
    '"Correction":', '**"Correction"**:', '"Final answer":', '"Actually," ',
])
@pytest.mark.parametrize("gap", [" ", "\n", "\n\n"])
def test_j_correction_label_quoted_for_emphasis(label: str, gap: str) -> None:
    _delivers_the_correction("结果：" + json.dumps(J_FIRST) + "\n" + label + gap
                             + json.dumps(J_LATER))


@pytest.mark.parametrize("words", [
    "Correction: customer #12's review is negative:",
    "Actually, per the template the label must be negative:",
    "Actually, the customer says the sample arrived broken, so:",
    "Correction: unlike the other reviews, this one is negative:",
    "Actually, the original output was wrong, the label is:",
    "更正：按模板要求，结果应为：",
])
def test_j_english_item_words_in_an_old_correction(words: str) -> None:
    _delivers_the_correction(json.dumps(J_FIRST) + "\n" + words + " " + json.dumps(J_LATER))


@pytest.mark.parametrize("words", [
    "更正：顾客的评价2星，应为负面：", "更正：评论3句话都在抱怨，所以是负面：",
    "更正：下一条评论也类似，但这条的结果是：", "更正：顾客列出的第三条理由是质量差，应为：",
    "更正：评论中第二条抱怨（物流慢）也说明是负面的：",
])
def test_j_item_numbers_in_an_old_correction(words: str) -> None:
    _delivers_the_correction(json.dumps(J_FIRST) + "\n" + words + " " + json.dumps(J_LATER))


@pytest.mark.parametrize("words", [
    "更正：跟其他店比差很多，应为：", "更正：顾客说“另一家的更好”，所以应为：",
    "更正：顾客提到“参考价”虚高，应该是负面：",
])
def test_j_other_words_quoted_from_the_input(words: str) -> None:
    _delivers_the_correction(json.dumps(J_FIRST) + "\n" + words + " " + json.dumps(J_LATER))


@pytest.mark.parametrize("words", [
    "更正：一般情况下这种评论算负面：", "更正：通常情况下“还行”是中性，但这里语气很差，应为：",
    "纠正：一般情况下这种评论算负面：",
])
def test_j_usual_case_in_an_old_correction(words: str) -> None:
    _delivers_the_correction(json.dumps(J_FIRST) + "\n" + words + " " + json.dumps(J_LATER))


@pytest.mark.parametrize("words", [
    "更正：我把正负面弄反了，换成负面：", "更正：反过来才对，结果是：", "实际上应该换成负面：",
])
def test_j_swap_verbs_in_an_old_correction(words: str) -> None:
    _delivers_the_correction(json.dumps(J_FIRST) + "\n" + words + " " + json.dumps(J_LATER))


@pytest.mark.parametrize("words", [
    "更正：对于顾客提到的质量问题，结果应为：",
    "纠正：对于差评中常见的“退货”，这里也有，所以：",
])
@pytest.mark.parametrize("first", ["", "结果：\n", "结果：\n```json\n"])
def test_j_for_what_the_customer_said_in_an_old_correction(words: str, first: str) -> None:
    fence = "\n```" if "```" in first else ""
    raw = (first + json.dumps(J_FIRST) + fence + "\n\n" + words + "\n"
           + ("```json\n" if fence else "") + json.dumps(J_LATER) + fence)
    _delivers_the_correction(raw)


@settings(max_examples=60, deadline=None)
@given(phrase=st.sampled_from(["更正", "纠正", "Correction", "Final answer", "最终答案"]),
       quotes=st.sampled_from([("“", "”"), ('"', '"'), ('**"', '"**'), ("", "")]),
       words=st.sampled_from(["", "评价2星，", "跟其他店比差很多，", "一般情况下算负面，",
                              "unlike the other reviews, ", "per the template, ",
                              "customer #12's review, ", "对于顾客提到的问题，"]))
def test_j_old_corrections_read_as_before(phrase: str, quotes: tuple[str, str],
                                          words: str) -> None:
    raw = (json.dumps(J_FIRST) + "\n" + quotes[0] + phrase + quotes[1] + "：" + words
           + "结果是：" + json.dumps(J_LATER))
    _delivers_the_correction(raw)
