"""Input normalisation: NFKC, emoji tags, invisible characters."""

from __future__ import annotations

import unicodedata

import emoji
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from lockgate.runtime import normalize_text, normalize_value
from lockgate.runtime.normalize import replace_emoji, strip_invisible
from lockgate.spec import InputRule

DEFAULT = InputRule()
EMOJI_SAMPLE = sorted(emoji.EMOJI_DATA)[::7]


def test_full_width_punctuation_becomes_half_width() -> None:
    assert normalize_text("价格：１２３元，好评！（ＡＢＣ）", DEFAULT) == "价格:123元,好评!(ABC)"
    assert normalize_text("全角\u3000空格", DEFAULT) == "全角 空格"


def test_invisible_characters_are_removed() -> None:
    text = "a\u200bb\ufeffc\u00add\u202ee\u2060f\x07g\u3164h"
    assert normalize_text(text, DEFAULT) == "abcdefgh"
    assert normalize_text("line1\u2028line2\tx\r\n", DEFAULT) == "line1\nline2\tx\r\n"


def test_emoji_become_tags() -> None:
    assert normalize_text("好评👍 love ❤️", DEFAULT) == "好评:thumbs_up: love :red_heart:"
    assert normalize_text("👨‍👩‍👧 1️⃣ 🇨🇳", DEFAULT) == \
        ":family_man_woman_girl: :keycap_1: :China:"


def test_emoji_remove_and_keep() -> None:
    remove = InputRule(emoji="remove")
    assert normalize_text("great 👍🏽 product", remove) == "great  product"
    keep = InputRule(emoji="keep")
    family = "👨‍👩‍👧"
    assert normalize_text(f"a\u200b{family}\ufe0f", keep) == f"a{family}\ufe0f"


def test_each_step_can_be_switched_off() -> None:
    off = InputRule(nfkc=False, strip_invisible=False, emoji="keep")
    text = "ＡＢ\u200b👍"
    assert normalize_text(text, off) == text


def test_normalize_value_walks_structures() -> None:
    value = {"名称": "Ｘ\u200b", "tags": ["ａ", 1, None, {"k": "👍"}], "n": 3.5}
    assert normalize_value(value, DEFAULT) == {
        "名称": "X", "tags": ["a", 1, None, {"k": ":thumbs_up:"}], "n": 3.5}


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(st.text(max_size=8), st.sampled_from(EMOJI_SAMPLE)), max_size=8))
@example(["\ufe0e"])  # a lone variation selector
@example(["a\ufe0fb", "\U0001f44d\ufe0e"])
def test_emoji_tags_match_the_emoji_library(pieces: list[str]) -> None:
    text = "".join(pieces)
    assert replace_emoji(text, tag=True) == emoji.demojize(text)


@settings(max_examples=150, deadline=None)
@given(st.text())
def test_nfkc_matches_unicodedata(text: str) -> None:
    # The ``nfkc`` step is NFKC per character, except where the compatibility form
    # carries meaning (superscripts, subscripts, circled forms, fractions, compatibility
    # jamo, U+2139, spacing accents), then NFC over the text.
    rule = InputRule(strip_invisible=False, emoji="keep")

    def fold(ch: str) -> str:
        decomposition = unicodedata.decomposition(ch)
        points = [p for p in decomposition.split() if not p.startswith("<")]
        if decomposition.startswith(("<super>", "<sub>", "<circle>", "<fraction>")) \
                or 0x3131 <= ord(ch) <= 0x318E or ch == "\u2139" \
                or (len(points) > 1 and points[0] == "0020"):
            return ch
        return unicodedata.normalize("NFKC", ch)

    expected = unicodedata.normalize("NFC", "".join(map(fold, text)))
    assert normalize_text(text, rule) == expected


_JOINING = ((0x0600, 0x06FF), (0x0700, 0x074F), (0x0750, 0x077F), (0x08A0, 0x08FF),
            (0x0900, 0x0DFF), (0x0F00, 0x0FFF), (0x1000, 0x109F), (0x1780, 0x17FF),
            (0xFB50, 0xFDFF), (0xFE70, 0xFEFF))


def _joining(ch: str) -> bool:
    return any(a <= ord(ch) <= b for a, b in _JOINING) and unicodedata.category(ch)[0] in "LM"


@settings(max_examples=150, deadline=None)
@given(st.text())
@example("pass\u200dword \u200c退\u200d款")
def test_normalised_text_has_no_format_characters(text: str) -> None:
    out = normalize_text(text, DEFAULT)
    # joiners stay only next to a letter or mark of a script that uses them
    assert not any(unicodedata.category(c) == "Cf" for c in out if c not in "\u200c\u200d")
    for i, c in enumerate(out):
        if c in "\u200c\u200d":
            run = i + 1
            while run < len(out) and out[run] in "\u200c\u200d":
                run += 1
            start = i
            while start > 0 and out[start - 1] in "\u200c\u200d":
                start -= 1
            assert (start > 0 and _joining(out[start - 1])) \
                or (run < len(out) and _joining(out[run])), repr(out)
    assert normalize_text(out, DEFAULT) == out  # idempotent


@pytest.mark.parametrize("text", ["", "plain ascii", "中文没有表情"])
def test_nothing_to_do_returns_same_text(text: str) -> None:
    assert normalize_text(text, DEFAULT) == text
    assert strip_invisible(text) == text


def test_a_mark_parted_from_its_letter_by_an_invisible_character_composes_once() -> None:
    # NFKC ran before the zero-width space went: normalising the result again composed
    # "N" and the grave accent, so the normalisation was not idempotent.
    out = normalize_text("N\u200b\u0300", DEFAULT)
    assert out == "\u01f8" and normalize_text(out, DEFAULT) == out
