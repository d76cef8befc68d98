"""Input side of the runtime, after review: condensing keeps lines as written, page and
line separators, width folding, joiners, surrogates, the input delimiters, budgets of
JSON-escaped values, grapheme-safe cuts and special numbers."""

from __future__ import annotations

import json
import math
import unicodedata
from decimal import Decimal
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from lockgate.runtime import render
from lockgate.runtime.normalize import normalize_text
from lockgate.runtime.tokens import default_estimator
from lockgate.runtime.truncate import condense, hard_cut, split_sentences
from lockgate.spec import InputRule, TaskConfig

EX = default_estimator()
DEFAULT = InputRule()
WIDTH_ONLY = InputRule(strip_invisible=False, emoji="keep")


def cfg(template: Any, model: dict[str, Any] | None = None,
        rule: dict[str, Any] | None = None) -> TaskConfig:
    return TaskConfig.model_validate({
        "prompt_template": template, "model_config": {"name": "m", **(model or {})},
        "delivery_rule": rule or {}, "retry_policy": {}})


def sent(r: Any) -> int:
    return sum(EX.count(m["content"]) for m in r.messages) + 3 * len(r.messages) + 3


def _is_subsequence(lines: list[str], of: list[str]) -> bool:
    cursor = 0
    for line in lines:
        try:
            cursor = of.index(line, cursor) + 1
        except ValueError:
            return False
    return True


# 1. condensing keeps indentation and line structure ------------------------------------

YAML = "server:\n  host: a\n  port: 80\n  tls:\n    enabled: true\ndatabase:\n  url: x\n"


def test_condensed_yaml_keeps_its_indentation() -> None:
    result = condense(YAML * 3, 30, EX.count)
    assert result.condensed
    lines = result.text.split("\n")
    assert all(line in YAML.split("\n") for line in lines)
    assert "  port: 80" in lines or "    enabled: true" in lines or "  url: x" in lines


def test_condensed_code_keeps_blank_lines_inside_a_kept_run() -> None:
    code = "def f(x):\n    y = x + 1\n\n    return y\n"
    result = condense(code + "\n".join(f"# filler comment number {i}" for i in range(40)),
                      40, EX.count)
    assert result.text.startswith(code.rstrip()) or "    return y" in result.text


_LINE = st.builds(
    lambda indent, words: indent + " ".join(words),
    st.sampled_from(["", "  ", "    ", "\t", "      "]),
    st.lists(st.sampled_from(["key:", "value", "- item", "port: 80", "host", "x = 1",
                              "return", "def", "f(x)", "列表", "数据"]),
             min_size=1, max_size=5))


@given(lines=st.lists(st.one_of(_LINE, st.just("")), min_size=1, max_size=60),
       budget=st.integers(min_value=1, max_value=200))
@settings(max_examples=150, deadline=None)
@example(lines=YAML.split("\n") * 3, budget=30)
def test_every_kept_line_is_an_input_line_verbatim_in_order(lines: list[str],
                                                             budget: int) -> None:
    text = "\n".join(lines)
    result = condense(text, budget, EX.count)
    if result.unit != "sentences" or not result.text:
        return  # clauses or a hard cut: pieces of lines
    out = result.text.split("\n")
    assert _is_subsequence(out, lines), (out, lines)


# 2. page, line and record separators become newlines -----------------------------------

SEPARATORS = ["\x0c", "\x0b", "\x85", "\x1c", "\x1d", "\x1e", "\u2028", "\u2029"]


def test_form_feed_between_pages_keeps_words_apart() -> None:
    assert normalize_text("end of page one\x0cStart of page two", DEFAULT) == \
        "end of page one\nStart of page two"
    assert normalize_text("Hello\x0bWorld", DEFAULT) == "Hello\nWorld"
    assert normalize_text("café\x0cnaïve\x85x\x1cy\x1dz\x1ew", DEFAULT) == \
        "café\nnaïve\nx\ny\nz\nw"


@given(words=st.lists(st.text(alphabet="abcé中ж", min_size=1, max_size=6), min_size=2,
                      max_size=8),
       seps=st.lists(st.sampled_from(SEPARATORS), min_size=7, max_size=7))
@settings(max_examples=100, deadline=None)
def test_separators_never_merge_words(words: list[str], seps: list[str]) -> None:
    text = words[0] + "".join(s + w for s, w in zip(seps, words[1:], strict=False))
    assert normalize_text(text, DEFAULT) == "\n".join(words)


# 3. compatibility folding: NFKC except where the compatibility form carries meaning -----

_KEPT_TAGS = ("<super>", "<sub>", "<circle>", "<fraction>")
#: Letters typed as one character, though <compat> spells them as several (review 13):
#: Armenian ech-yiwn, the Kazakh high-hamza letters, Thai/Lao AM, Lao HO NO and HO MO.
_SPELLED = {0x0587, 0x0675, 0x0676, 0x0677, 0x0678, 0x0E33, 0x0EB3, 0x0EDC, 0x0EDD}


def _kept(ch: str) -> bool:
    decomposition = unicodedata.decomposition(ch)
    points = [p for p in decomposition.split() if not p.startswith("<")]
    return decomposition.startswith(_KEPT_TAGS) or 0x3131 <= ord(ch) <= 0x318E \
        or ch == "\u2139" or (len(points) > 1 and points[0] == "0020") or ord(ch) in _SPELLED


def test_width_folding_keeps_meaning() -> None:
    for text in ["mc²", "10⁻⁶", "H₂O", "ㅋㅋㅋ 진짜 웃기다 ㅠㅠ", "① ② ③", "ℹ", "½ ¾",
                 "don´t", "¨ ¯ ¸"]:
        assert normalize_text(text, WIDTH_ONLY) == text
    assert normalize_text("，：！１２３ＡＢＣ", DEFAULT) == ",:!123ABC"
    assert normalize_text("ｶﾞｷﾞ\u3000ﾊﾝｸﾞﾙ", DEFAULT) == "ガギ ハングル"
    assert normalize_text("e\u0301", DEFAULT) == "\u00e9"  # NFC still composes


def test_compatibility_forms_fold_as_nfkc_does() -> None:
    cases = {
        "ﬁle ﬂow eﬃcient": "file flow efficient",  # ligatures
        "ﻣﺮﺣﺒﺎ": "مرحبا",  # Arabic presentation forms, as PDF extraction yields them
        "𝗕𝗶𝗴 𝑥": "Big x",  # math alphanumerics
        "Mr.\u00a0Smith\u202fand\u2002co": "Mr. Smith and co",  # no-break, en spaces
        "5㎏ 3㎞": "5kg 3km",  # squared units
        "﹐﹒︐": ",.,",  # small and vertical punctuation
        "ﾡￂ": "가",  # half-width Hangul composes into a syllable
        "🄐 🄰 🈐": "(A) A 手",  # enclosed and squared forms of the SMP
    }
    for text, folded in cases.items():
        assert normalize_text(text, WIDTH_ONLY) == folded, text


def test_every_compatibility_character_folds_or_stays() -> None:
    for cp in range(0x110000):
        ch = chr(cp)
        if 0xD800 <= cp <= 0xDFFF or not unicodedata.decomposition(ch).startswith("<"):
            continue
        out = normalize_text(ch, WIDTH_ONLY)
        if _kept(ch):
            assert out == ch, hex(cp)
        else:
            assert out == unicodedata.normalize("NFKC", ch), hex(cp)


@given(st.text(alphabet=st.characters(min_codepoint=0x80, max_codepoint=0x1F2FF,
                                      blacklist_categories=("Cs",))))
@settings(max_examples=150, deadline=None)
def test_folding_is_nfkc_per_character_then_nfc(text: str) -> None:
    expected = "".join(c if _kept(c) else unicodedata.normalize("NFKC", c) for c in text)
    assert normalize_text(text, WIDTH_ONLY) == unicodedata.normalize("NFC", expected)


# 4. zero-width (non-)joiners only in scripts that need them ------------------------------

def test_zwnj_and_script_zwj_are_kept() -> None:
    persian = "می\u200cخواهم"
    assert normalize_text(persian, DEFAULT) == persian
    assert normalize_text("ශ්\u200dරී", DEFAULT) == "ශ්\u200dරී"
    assert normalize_text("ന്\u200d", DEFAULT) == "ന്\u200d"
    assert normalize_text("ക്ഷ\u200cത", DEFAULT) == "ക്ഷ\u200cത"
    assert normalize_text("क्\u200dष", DEFAULT) == "क्\u200dष"  # Devanagari half form
    assert normalize_text("ܐ\u200cܒ", DEFAULT) == "ܐ\u200cܒ"  # Syriac
    assert normalize_text("ក\u200cខ", DEFAULT) == "ក\u200cខ"  # Khmer
    # a stray joiner next to spaces or punctuation still goes
    assert normalize_text("a \u200d b\u200d.", DEFAULT) == "a  b."


def test_joiners_in_latin_and_cjk_text_are_removed() -> None:
    assert normalize_text("che\u200cap vi\u200cag\u200cra", DEFAULT) == "cheap viagra"
    assert normalize_text("pass\u200dword", DEFAULT) == "password"
    assert normalize_text("退\u200d款 退\u200c款", DEFAULT) == "退款 退款"
    assert normalize_text("Straße\u200c\u200dgut", DEFAULT) == "Straßegut"
    # kept emoji keep their joiners; a ZWNJ in Latin text still goes
    keep = InputRule(emoji="keep")
    assert normalize_text("👨\u200d👩\u200d👧", keep) == "👨\u200d👩\u200d👧"
    assert normalize_text("che\u200cap", keep) == "cheap"


@given(st.lists(st.sampled_from(["م", "ی", "خ", "ا", "ه", " ", "\u200c", "\u200b"]),
                max_size=30))
@settings(max_examples=100, deadline=None)
def test_zwnj_next_to_a_persian_letter_is_kept(chars: list[str]) -> None:
    text = "".join(chars)
    out = normalize_text(text, DEFAULT)
    assert "\u200b" not in out
    # what is left once the zero-width spaces are gone: a ZWNJ run stays (once) where
    # a letter is on either side, and goes between spaces
    import re
    plain = text.replace("\u200b", "")
    expected = re.sub("\u200c+", lambda m: "\u200c" if (
        m.start() > 0 and plain[m.start() - 1] != " ") or (
        m.end() < len(plain) and plain[m.end()] != " ") else "", plain)
    assert out == expected


@given(st.lists(st.sampled_from(["a", "b", "Z", "é", "退", "款", "1", " ", ".",
                                 "\u200c", "\u200d"]), max_size=30))
@settings(max_examples=150, deadline=None)
def test_no_joiner_survives_in_latin_or_cjk_text(chars: list[str]) -> None:
    out = normalize_text("".join(chars), DEFAULT)
    assert "\u200c" not in out and "\u200d" not in out


# 5. surrogate pairs from JSON decoders ---------------------------------------------------

KEEP = {"normalize": {"emoji": "keep"}}


def _as_surrogates(text: str) -> str:
    """``text`` as a JSON decoder that keeps UTF-16 code units leaves it."""
    units = text.encode("utf-16-le")
    return "".join(chr(int.from_bytes(units[i:i + 2], "little"))
                   for i in range(0, len(units), 2))


def test_a_surrogate_pair_is_one_character() -> None:
    r = render(cfg("{x}", rule=KEEP), {"x": "ok \ud83d\ude00"})
    assert r.messages[0]["content"] == "ok \U0001f600"
    r = render(cfg("{x}"), {"x": "ok \ud83d\ude00"})
    assert r.messages[0]["content"] == "ok :grinning_face:"
    r = render(cfg("{x}", rule=KEEP), {"x": "lone \ud83d and \ude00"})
    assert r.messages[0]["content"] == "lone ? and ?"


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
@settings(max_examples=100, deadline=None)
def test_surrogate_pairs_render_as_the_text(text: str) -> None:
    rule = {"normalize": {"emoji": "keep", "nfkc": False, "strip_invisible": False}}
    r = render(cfg("[{x}]", rule=rule), {"x": "-" + _as_surrogates(text)})
    assert r.messages[0]["content"] == f"[-{text}]"


# 6. the input delimiters in any case and spacing -----------------------------------------

DELIMITED = "Read:\n<input>\n{x}\n</input>"


def test_delimiter_variants_cannot_close_the_input() -> None:
    for tag in ["</INPUT>", "</input >", "< /input>", "</ Input>", "<input>"]:
        content = render(cfg(DELIMITED), {"x": f"a {tag} b"}).messages[0]["content"]
        assert tag not in content.replace("<input>\na", "").replace("b\n</input>", "")
        assert content.lower().count("input>") == 2  # the template's own two


def test_code_generics_are_not_taken_for_the_delimiter() -> None:
    code = ("impl From<Input> for Output {}\nconst p: Promise<Input> = load();\n"
            "List<INPUT> xs; Map<input, int> m;")
    content = render(cfg(DELIMITED), {"x": code}).messages[0]["content"]
    assert code in content
    assert "\u2039" not in content


@given(st.lists(st.sampled_from(["<", "/", "input", "INPUT", "Input", ">", " ", "x", "\n"]),
                max_size=30))
@settings(max_examples=150, deadline=None)
@example(["<", "/", "INPUT", ">"])
@example(["<", "/", "input", " ", ">"])
@example(["<", " ", "/", "input", ">"])
def test_no_value_closes_the_input(parts: list[str]) -> None:
    import re
    value = "v" + "".join(parts)
    content = render(cfg(DELIMITED), {"x": value}).messages[0]["content"]
    closers = re.findall(r"<\s*/\s*input\s*>", content, re.IGNORECASE)
    assert closers == ["</input>"]


# 8. placeholders inside JSON strings stay within the budget ------------------------------

def test_json_escaped_value_is_condensed_to_the_budget() -> None:
    x = 'He said "hi" at C:\\temp\\a.txt\n' * 20
    r = render(cfg('{{"text": "{x}"}}', model={"max_input_tokens": 270}), {"x": x})
    assert sent(r) <= 270 or "over_budget" in r.alerts
    assert sent(r) <= 270
    assert r.input_tokens == sent(r)


_PIECES = ['"', "\\", "\n", "\\n", 'say "hi". ', "C:\\temp\\x ", "😀 ", "中文。", "é ",
           "word ", "Sentence here. ", "\t", "{", "}", 'He said "hi" at C:\\temp\\a.txt\n']


@given(pieces=st.lists(st.sampled_from(_PIECES), min_size=1, max_size=150),
       budget=st.integers(min_value=16, max_value=400),
       template=st.sampled_from(['{{"text": "{x}"}}', '{x} and "{x}"', 'T: "{x}"',
                                 '{x}']))
@settings(max_examples=150, deadline=None)
@example(pieces=['He said "hi" at C:\\temp\\a.txt\n'] * 20, budget=270,
         template='{{"text": "{x}"}}')
@example(pieces=["é ", "é ", '"', '"', "\\n", 'say "hi". ', 'say "hi". ', 'say "hi". ',
                 'He said "hi" at C:\\temp\\a.txt\n', "é ", "\\n", '"'], budget=81,
         template='T: "{x}"')
def test_rendered_prompt_is_within_budget_or_flagged(pieces: list[str], budget: int,
                                                     template: str) -> None:
    r = render(cfg(template, model={"max_input_tokens": budget}), {"x": "".join(pieces)})
    assert sent(r) <= budget or "over_budget" in r.alerts


# 9. hard cuts never split a grapheme cluster ---------------------------------------------

SCOTLAND = "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f"
CLUSTERS = [SCOTLAND, "क्ष", "क्", "स्त्र", "\u1100\u1161\u11a8", "\u1100\u1161",
            "\uac00\u11a8", "a", " ", "한", "e\u0301"]


def test_hard_cut_keeps_tag_sequences_conjuncts_and_jamo_whole() -> None:
    for text in [SCOTLAND * 10, "क्ष" * 30, "\u1100\u1161\u11a8" * 30]:
        for budget in range(1, 60, 3):
            cut = hard_cut(text, budget, EX.count)
            unit = {SCOTLAND * 10: SCOTLAND, "क्ष" * 30: "क्ष"}.get(text, "\u1100\u1161\u11a8")
            assert len(cut) % len(unit) == 0, (budget, cut)


@given(st.lists(st.sampled_from(CLUSTERS), min_size=1, max_size=40),
       st.integers(min_value=1, max_value=80))
@settings(max_examples=150, deadline=None)
def test_hard_cut_ends_at_a_cluster_boundary(clusters: list[str], budget: int) -> None:
    text = "".join(clusters)
    cut = hard_cut(text, budget, EX.count)
    boundaries = {0}
    pos = 0
    for c in clusters:
        pos += len(c)
        boundaries.add(pos)
    # a trailing space may be stripped; otherwise the cut ends where a cluster ends
    assert text.startswith(cut)
    assert len(cut) in boundaries or len(cut.rstrip()) in boundaries \
        or text[len(cut):].startswith(" ")


# 10. special numbers --------------------------------------------------------------------

def test_nan_infinity_and_decimals_render_as_written() -> None:
    r = render(cfg("{x} {y} {z}"), {"x": [float("nan"), float("inf"), -math.inf],
                                     "y": Decimal("1.10"), "z": {"p": Decimal("2.50")}})
    assert r.messages[0]["content"] == '[NaN,Infinity,-Infinity] 1.10 {"p":2.50}'
    assert render(cfg("{x}"), {"x": {"a": [1, 2.5, "s"]}}).messages[0]["content"] == \
        json.dumps({"a": [1, 2.5, "s"]}, separators=(",", ":"))


def test_plain_structured_values_skip_the_special_walk(monkeypatch: Any) -> None:
    import importlib
    module = importlib.import_module("lockgate.runtime.render")
    walked: list[Any] = []
    real = module._special
    monkeypatch.setattr(module, "_special", lambda v: walked.append(v) or real(v))
    rows = [{"id": i, "name": f"item {i}", "price": i + 0.5, "tags": ["a", "b"], "ok": True}
            for i in range(50)]
    content = render(cfg("Data: {rows}"), {"rows": rows}).messages[0]["content"]
    assert content == "Data: " + json.dumps(rows, separators=(",", ":"))
    assert walked == []  # orjson alone: no Python walk over the rows
    # a null may stand for NaN: then the value is checked, and written as it is
    mixed = [{"a": None}, {"b": float("nan")}, {"c": Decimal("1.10")}]
    content = render(cfg("{x}"), {"x": mixed}).messages[0]["content"]
    assert content == '[{"a":null},{"b":NaN},{"c":1.10}]'
    assert render(cfg("{x}"), {"x": [None, 1]}).messages[0]["content"] == "[null,1]"
    assert render(cfg("{x}"), {"x": {"d": [Decimal("2.50")]}}).messages[0]["content"] \
        == '{"d":[2.50]}'


def test_split_sentences_still_lossless_with_indentation() -> None:
    assert "".join(split_sentences(YAML)) == YAML
    assert split_sentences("a:\n  b\n\n  c\n") == ["a:\n", "  b\n\n", "  c\n"]
