"""Input side of the runtime, review 13: the condensation note never enters an
assistant message, hard cuts inside runs of flags, Thai/Lao AM and the other letters
whose compatibility form is another spelling, a lone quote earlier on a prose line, and
surrogate pairs nested in structured values."""

from __future__ import annotations

import json
import unicodedata
from typing import Any

import regex
from hypothesis import example, given, settings
from hypothesis import strategies as st

from lockgate.runtime import parse_reply, render
from lockgate.runtime.normalize import normalize_text
from lockgate.runtime.template import compile_template
from lockgate.runtime.tokens import default_estimator
from lockgate.runtime.truncate import hard_cut
from lockgate.spec import InputRule, TaskConfig

EX = default_estimator()
DEFAULT = InputRule()
WIDTH_ONLY = InputRule(strip_invisible=False, emoji="keep")
LONG = "The parcel arrived late. The box was damaged. Support did not answer. " \
    "I want a refund. " * 40
NOTE = "[Note: the input (t) was condensed"


def cfg(template: Any, model: dict[str, Any] | None = None,
        rule: dict[str, Any] | None = None) -> TaskConfig:
    return TaskConfig.model_validate({
        "prompt_template": template, "model_config": {"name": "m", **(model or {})},
        "delivery_rule": rule or {}, "retry_policy": {}})


def _graphemes(text: str) -> set[int]:
    """The offsets where a grapheme cluster ends (and 0)."""
    ends, pos = {0}, 0
    for g in regex.findall(r"\X", text):
        pos += len(g)
        ends.add(pos)
    return ends


# A. the condensation note is never written into an assistant message ----------------

def test_note_goes_to_the_system_message_not_the_prefill() -> None:
    tpl = [{"role": "system", "content": "Classify this complaint: {t}"},
           {"role": "assistant", "content": '{{"label": "'}]
    rule = {"format": "json", "schema": {"type": "object", "required": ["label"],
                                         "properties": {"label": {"type": "string"}}}}
    config = cfg(tpl, model={"max_input_tokens": 120}, rule=rule)
    r = render(config, {"t": LONG})
    assert r.condensed
    assert r.messages[-1] == {"role": "assistant", "content": '{"label": "'}
    assert NOTE in r.messages[0]["content"]
    # What a provider honouring the prefill answers is delivered without the note.
    reply = parse_reply(r.messages, 'refund"}', config.delivery_rule)
    assert reply.value == {"label": "refund"}


_ROLES = st.sampled_from(["system", "developer", "user", "assistant"])


@given(roles=st.lists(_ROLES, min_size=1, max_size=5), at=st.integers(0, 4))
@example(roles=["system", "assistant"], at=0)
@example(roles=["user", "assistant", "system", "assistant"], at=2)
@settings(max_examples=60, deadline=None)
def test_note_is_on_the_last_user_else_last_non_assistant_message(roles: list[str],
                                                                  at: int) -> None:
    holders = [i for i, role in enumerate(roles) if role != "assistant"]
    if not holders:
        roles = ["system", *roles]
        holders = [0]
    where = holders[at % len(holders)]
    tpl = [{"role": role, "content": f"Message {i}: {{t}}" if i == where
            else ('{{"label": "' if role == "assistant" else f"Message {i}.")}
           for i, role in enumerate(roles)]
    r = render(cfg(tpl, model={"max_input_tokens": 160}), {"t": LONG})
    assert r.condensed
    users = [i for i, role in enumerate(roles) if role == "user"]
    expected = users[-1] if users else holders[-1]
    for i, message in enumerate(r.messages):
        assert (NOTE in message["content"]) == (i == expected), (roles, i)
        if message["role"] == "assistant":
            assert message["content"] == '{"label": "'


# B. a hard cut inside a run of flags keeps whole flags ---------------------------------

FLAGS = "🇫🇷🇩🇪🇯🇵🇺🇸🇧🇷🇮🇳"


def test_hard_cut_in_a_run_of_flags_keeps_the_flags_that_fit() -> None:
    flags = FLAGS * 20
    cut = hard_cut(flags, 100, EX.count)
    assert cut and flags.startswith(cut) and len(cut) % 2 == 0
    assert EX.count(cut) <= 100
    cut = hard_cut("Teams: " + flags, 100, EX.count)
    assert cut.startswith("Teams: 🇫🇷") and (len(cut) - len("Teams: ")) % 2 == 0


def test_hard_cut_in_a_long_run_of_indicators_keeps_pairs() -> None:
    cut = hard_cut("🇫🇷" * 160_000, 500, EX.count)
    assert len(cut) >= 100 and len(cut) % 2 == 0 and EX.count(cut) <= 500


@given(prefix=st.text(alphabet="ab \u200d\u0301", max_size=4),
       pairs=st.lists(st.sampled_from(["🇫🇷", "🇩🇪", "🇯🇵", "🇺🇸"]), min_size=1, max_size=30),
       odd=st.booleans(), budget=st.integers(1, 60))
@settings(max_examples=150, deadline=None)
def test_hard_cut_never_splits_a_flag(prefix: str, pairs: list[str], odd: bool,
                                      budget: int) -> None:
    text = prefix + "".join(pairs) + ("🇮" if odd else "") + " end"
    cut = hard_cut(text, budget, EX.count)
    assert text.startswith(cut) and EX.count(cut) <= budget
    assert len(cut) in _graphemes(text)
    if budget >= 20:  # room for a flag or more: the run is not dropped whole
        assert "🇫" in cut or "🇩" in cut or "🇯" in cut or "🇺" in cut or \
            EX.count(prefix + pairs[0]) > budget


def test_hard_cut_keeps_thai_and_lao_am_with_its_consonant() -> None:
    text = "ทำงานกำลังทำความสะอาดน้ำดำคำนำ" * 20 + "ກຳລັງ" * 20
    bounds = _graphemes(text)
    for budget in range(5, 120, 3):
        assert len(hard_cut(text, budget, EX.count)) in bounds, budget


# C. letters whose compatibility form is another spelling are kept ----------------------

#: Letters typed as one character, whose NFKC form spells them otherwise.
SPELLED = {0x0587, 0x0675, 0x0676, 0x0677, 0x0678, 0x0E33, 0x0EB3, 0x0EDC, 0x0EDD}


def test_thai_and_lao_am_survive_default_normalisation() -> None:
    for text in ["ทำงาน น้ำ คำ", "ກຳລັງ", "ໜ້າ ໝາ", "ٵ ٶ ٷ ٸ", "Երևան"]:
        assert normalize_text(text, DEFAULT) == text
        r = render(cfg("{t}"), {"t": text})
        assert r.messages[0]["content"] == text


def test_every_letter_with_a_plain_compat_form_is_judged_by_the_rule() -> None:
    """Each letter or mark with a plain ``<compat>`` decomposition is folded, except
    the ones of a script's own alphabet that are spelled as one character."""
    kept, folded = set(), set()
    for cp in range(0x110000):
        ch = chr(cp)
        d = unicodedata.decomposition(ch)
        if unicodedata.category(ch)[0] not in "LM" or not d.startswith("<compat>"):
            continue
        out = normalize_text(ch, WIDTH_ONLY)
        if out == ch:
            kept.add(cp)
        else:
            assert out == unicodedata.normalize("NFKC", ch), hex(cp)
            folded.add(cp)
    # Korean compatibility jamo and the spacing ypogegrammeni were kept before.
    assert kept - set(range(0x3131, 0x318F)) - {0x037A} == SPELLED
    # Latin digraphs, presentation forms, deprecated marks and symbol variants fold.
    for cp in (0x0133, 0x01C6, 0x0140, 0x0149, 0xFB01, 0xFB13, 0xFB4F, 0x0F77, 0x0F79,
               0x03D0, 0x00B5, 0x2135):
        assert cp in folded, hex(cp)


@given(st.text(alphabet=st.sampled_from([chr(cp) for cp in sorted(SPELLED)]
                                        + list("ทงานກລັງ ab\u0e48\u0ec9")), max_size=20))
@settings(max_examples=80, deadline=None)
def test_spelled_letters_pass_through_any_text(text: str) -> None:
    assert normalize_text(text, WIDTH_ONLY) == unicodedata.normalize("NFC", text)


# D. a lone quote earlier on a prose line does not make the value JSON-escaped ---------

VALUE = 'Great phone.\nThe 6.1" screen is "bright".'


def test_inch_mark_before_a_prose_placeholder_leaves_the_value_as_written() -> None:
    for tpl in ['Phone with 6" screen. Review: {t}', 'He said " then: {t} and left',
                'Note the " mark.\nReview: {t}']:
        content = render(cfg(tpl), {"t": VALUE}).messages[0]["content"]
        assert VALUE in content, tpl
    content = render(cfg('Translate to French: "{t}"'), {"t": VALUE}).messages[0]["content"]
    assert content == "Translate to French: " + json.dumps(VALUE)


def test_json_string_placeholders_need_a_closing_quote_on_their_line() -> None:
    cases = {
        'Example: {{"text": "{text}", "n": {n}}}': [("text", True), ("n", False)],
        '"{a}{b}"': [("a", True), ("b", True)],
        '"{a} and {b}" then {c}': [("a", True), ("b", True), ("c", False)],
        '6" wide: {a}\n"{b}"': [("a", False), ("b", True)],
        '"{a}\n{b}"': [("a", False), ("b", False)],
        'say "{a} \\" {b}': [("a", False), ("b", False)],
    }
    for tpl, expected in cases.items():
        t = compile_template(tpl).texts[0]
        assert list(zip(t.names, t.in_json_string, strict=True)) == expected, tpl


@given(before=st.text(alphabet='ab "\\', max_size=12), value=st.text(max_size=30))
@settings(max_examples=150, deadline=None)
def test_a_prose_placeholder_ending_its_line_is_never_escaped(before: str,
                                                             value: str) -> None:
    """Nothing after the placeholder on its line: no closing quote, so never inside a
    string, whatever quotes precede it."""
    tpl = before.replace("{", "{{").replace("}", "}}") + "{t}"
    assert compile_template(tpl).texts[0].in_json_string == (False,)


# E. surrogate pairs nested in a structured value are normalised as at the top level --

def test_nested_surrogate_pairs_are_tagged_like_top_level_ones() -> None:
    pair = "\ud83d\ude00"
    top = render(cfg("{x}"), {"x": pair + " top"}).messages[0]["content"]
    assert top == ":grinning_face: top"
    nested = render(cfg("{x}"), {"x": [pair + " nested", "\ud800",
                                       {"k": [pair]}]}).messages[0]["content"]
    assert json.loads(nested) == [":grinning_face: nested", "?",
                                  {"k": [":grinning_face:"]}]
    kept = render(cfg("{x}", rule={"normalize": {"emoji": "keep"}}),
                  {"x": {"k": pair}}).messages[0]["content"]
    assert json.loads(kept) == {"k": "😀"}
