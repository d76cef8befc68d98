"""Fitting text into a token budget: sentence splitting, TextRank, safe cuts."""

from __future__ import annotations

import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lockgate.runtime.tokens import CALIBRATED, default_estimator
from lockgate.runtime.truncate import condense, hard_cut, split_sentences, textrank

from .conftest import texts

COUNTERS = [pytest.param(CALIBRATED.count, id="calibrated"),
            pytest.param(default_estimator().count, id="default")]


def _sentences() -> list[str]:
    out: list[str] = []
    for group in texts().values():
        for paragraph in group:
            out.extend(s.strip() for s in split_sentences(paragraph))
    return out


ALL_SENTENCES = _sentences()


def test_split_english() -> None:
    text = 'Prices rose 3.5% in May. "Is it over?" she asked! Visit example.com today.\nNext'
    assert [s.strip() for s in split_sentences(text)] == [
        "Prices rose 3.5% in May.", '"Is it over?"', "she asked!",
        "Visit example.com today.", "Next"]


def test_split_chinese_without_spaces() -> None:
    text = "我周一下单了。周三就到了！质量怎么样？“很好。”总体满意"
    assert split_sentences(text) == [
        "我周一下单了。", "周三就到了！", "质量怎么样？", "“很好。”", "总体满意"]


def test_split_clauses() -> None:
    assert split_sentences("包装很结实，机器没有划痕；噪音小", clauses=True) == [
        "包装很结实，", "机器没有划痕；", "噪音小"]


@given(st.text(max_size=300))
@settings(max_examples=200, deadline=None)
def test_split_is_lossless(text: str) -> None:
    assert "".join(split_sentences(text)) == text
    assert "".join(split_sentences(text, clauses=True)) == text


def test_textrank_prefers_central_sentences() -> None:
    sentences = [
        "The battery lasts two days.",
        "Battery life is the main selling point and the battery charges fast.",
        "I bought it in blue.",
        "A long battery life matters to me.",
    ]
    scores = textrank(sentences)
    assert scores.index(max(scores)) in (1, 3)  # the sentences about battery life
    assert scores[2] == min(scores)  # the off-topic one
    assert textrank([]) == []


def test_textrank_chinese_bigrams() -> None:
    sentences = ["物流很快，包装完好。", "空气净化器噪音很小。", "净化器的噪音比想象中小。",
                 "价格偏高。"]
    scores = textrank(sentences)
    assert max(scores[1], scores[2]) > max(scores[0], scores[3])


@pytest.mark.parametrize("count", COUNTERS)
@pytest.mark.parametrize("group", ["en", "zh", "mixed"])
def test_condense_keeps_order_and_budget(count: object, group: str) -> None:
    assert callable(count)
    for paragraph in texts()[group]:
        full = count(paragraph)
        budget = max(8, full // 2)
        result = condense(paragraph, budget, count)
        assert result.tokens <= budget
        assert count(result.text) <= budget
        assert result.condensed
        kept = [s.strip() for s in split_sentences(result.text)]
        originals = [s.strip() for s in split_sentences(paragraph)]
        positions = [originals.index(s) for s in kept if s in originals]
        assert positions == sorted(positions)
        if result.unit == "sentences":
            assert len(positions) == len(kept)


def test_condense_returns_text_unchanged_within_budget() -> None:
    text = texts()["en"][0]
    result = condense(text, 10_000, CALIBRATED.count)
    assert result.text == text
    assert not result.condensed


def test_condense_one_long_chinese_sentence_uses_clauses() -> None:
    clauses = ["这个产品的质量很好", "物流速度也非常快", "客服态度耐心细致", "价格比较实惠"]
    text = "，".join(clauses * 5) + "。"
    result = condense(text, 30, CALIBRATED.count)
    assert result.unit == "clauses"
    assert 0 < CALIBRATED.count(result.text) <= 30


@pytest.mark.parametrize("text", ["e\u0301" * 40, "👨‍👩‍👧" * 20, "🇨🇳🇯🇵" * 20, "a\u20e3" * 40])
def test_hard_cut_never_splits_a_grapheme(text: str) -> None:
    for budget in (1, 3, 7, 15):
        cut = hard_cut(text, budget, default_estimator().count)
        assert text.startswith(cut)
        rest = text[len(cut):]
        if rest:
            assert not unicodedata.combining(rest[0])
            assert rest[0] not in "\u200d\ufe0f\u20e3"
            assert not cut.endswith("\u200d")
        if "🇨" in text:
            assert cut.count("🇨") == cut.count("🇳")


def test_budget_zero_gives_empty_text() -> None:
    assert condense("Some text here. And more.", 0, CALIBRATED.count).text == ""
    assert hard_cut("abc", 0, CALIBRATED.count) == ""


@given(sentences=st.lists(st.sampled_from(ALL_SENTENCES), min_size=1, max_size=25),
       budget=st.integers(min_value=0, max_value=400),
       joiner=st.sampled_from([" ", "", "\n"]))
@settings(max_examples=150, deadline=None)
def test_condense_within_budget_for_every_input(sentences: list[str], budget: int,
                                                joiner: str) -> None:
    text = joiner.join(sentences)
    count = default_estimator().count
    result = condense(text, budget, count)
    assert count(result.text) <= budget
    assert result.tokens == count(result.text)
    if result.unit == "sentences" and result.text:
        originals = [s.strip() for s in split_sentences(text)]
        kept = [s.strip() for s in split_sentences(result.text)]
        cursor = 0
        for s in kept:  # a subsequence of the original sentences, in order
            cursor = originals.index(s, cursor) + 1


@given(text=st.text(max_size=400), budget=st.integers(min_value=0, max_value=60))
@settings(max_examples=150, deadline=None)
def test_condense_arbitrary_unicode_within_budget(text: str, budget: int) -> None:
    count = CALIBRATED.count
    result = condense(text, budget, count)
    assert count(result.text) <= budget or result.text == text


# Long inputs: repeated lines, the title, bounded work ----------------------------------

EX = default_estimator()
LINES = ["Order 4411 shipped late and the customer asked for a refund",
         "The courier lost the parcel near the depot",
         "Please reply within two working days",
         "Kind regards, the support team",
         "--",
         "退款已经处理，请查收",
         "  retries: 3",
         "The app crashes on login since the last update"]


@given(st.lists(st.sampled_from(LINES), min_size=2, max_size=120), st.integers(5, 150))
@settings(max_examples=150, deadline=None)
def test_repeated_lines_are_kept_at_most_once(lines: list[str], budget: int) -> None:
    result = condense("\n".join(lines), budget, EX.count)
    if not result.condensed or result.unit == "characters":
        return  # within budget: the text as it is; or one cut piece
    kept = [line.strip() for line in result.text.split("\n") if line.strip()]
    assert len(kept) == len(set(kept)), kept


def _prose(seed: int, sentences: int) -> str:
    """A long document: paragraphs of sentences over a few hundred words."""
    import random
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ner", "sta", "ve", "dor", "pal", "rin", "tu", "qua", "sel"]
    words = sorted({"".join(rng.choice(syllables) for _ in range(rng.randint(2, 3)))
                    for _ in range(400)})
    paragraphs = []
    for _ in range(max(1, sentences // 6)):
        paragraphs.append(" ".join(
            " ".join(rng.choice(words) for _ in range(rng.randint(6, 20))).capitalize() + "."
            for _ in range(6)))
    return "\n\n".join(paragraphs)


@given(st.integers(0, 2**32 - 1), st.sampled_from([36, 300, 1500, 3000]))
@settings(max_examples=12, deadline=None)
def test_the_first_line_survives_when_a_tenth_of_the_text_fits(seed: int,
                                                             sentences: int) -> None:
    # The title shares no word with the text: no centrality keeps it, only its place.
    title = "Quarterly review of the Northwind delivery backlog"
    text = title + "\n\n" + _prose(seed, sentences)
    budget = EX.count(text) // 10
    result = condense(text, budget, EX.count)
    assert result.condensed and result.tokens <= budget
    assert result.text.startswith(title + "\n")


def test_a_footer_repeated_in_every_mail_of_a_thread_is_kept_once() -> None:
    footer = ("CONFIDENTIALITY NOTICE: This e-mail message, including any attachments, is "
              "for the sole use of the intended recipient and may contain confidential "
              "information.")
    mails = [f"From: agent{i % 7}@example.com\nSubject: Re: case 4411\n\n"
             f"{_prose(i, 6)}\n\n--\n{footer}" for i in range(300)]
    for budget in (500, 2000):
        result = condense("\n\n".join(mails), budget, EX.count)
        assert result.text.count("CONFIDENTIALITY NOTICE") <= 1
        assert result.text.count("Subject: Re: case 4411") <= 1


def test_a_long_repetitive_input_condenses_in_bounded_time() -> None:
    import time
    csv = "\n".join(f"{i},{LINES[i % 8][:20]},{i * 7 % 1000}" for i in range(6000))
    start = time.perf_counter()
    result = condense(csv, 300, EX.count)
    assert result.tokens <= 300
    assert time.perf_counter() - start < 2.0  # the exact graph took seconds
