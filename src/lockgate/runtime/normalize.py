"""Input normalisation before rendering.

Three steps, each switched by the task's :class:`~lockgate.spec.InputRule`, in this
order:

1. **Compatibility folding** (``nfkc``): NFKC applied character by character, except
   to the characters whose compatibility form carries meaning, then NFC over the text.
   Folded: full-width and half-width forms (``，：！ＡＢＣ１２３`` -> ``,:!ABC123``,
   ``ｶﾞ`` -> ``ガ``, half-width Hangul composes into syllables, ``ﾡￂ`` -> ``가``),
   ligatures (``ﬁ`` -> ``fi``), Arabic presentation forms (what PDF extraction
   yields), math alphanumerics (``𝗕𝗶𝗴`` -> ``Big``), no-break and typographic spaces
   (a space), squared units (``㎏`` -> ``kg``), small and vertical punctuation. Kept
   as written: superscripts and subscripts (``mc²``, ``10⁻⁶``), circled characters
   (``①``), fractions (``½``), Korean compatibility jamo (``ㅋㅋ``, ``ㅠㅠ``), ``ℹ``
   (U+2139), spacing accents whose compatibility form is a space and a combining
   mark (``´ ¨ ¯ ¸``: NFKC would write ``don ́t``), and letters of a script's own
   alphabet typed as one character (Thai and Lao AM ``ทำ``, ``ກຳ``; ``ໜ``, ``ໝ``; the
   Kazakh high-hamza letters; Armenian ``և``).
2. **Emoji** (``emoji``): ``"tag"`` replaces each emoji by its English CLDR name
   between colons, exactly as :func:`emoji.demojize` does (``👍`` -> ``:thumbs_up:``);
   ``"remove"`` drops them; ``"keep"`` leaves them.
3. **Invisible characters** (``strip_invisible``): every format character (Unicode
   category Cf: U+200B, U+FEFF, bidi controls, soft hyphen, ...), control characters
   other than tab/newline/carriage return, variation selectors and Hangul fillers are
   removed. Characters that separate lines or pages become newlines, so the words on
   either side stay apart: U+2028/U+2029, form feed, vertical tab, NEL (U+0085) and the
   file/group/record separators (U+001C-U+001E). The zero-width non-joiner (U+200C)
   and joiner (U+200D) stay next to a letter or mark of a script whose spelling uses
   them (Arabic and Persian, Syriac, the Indic scripts and Sinhala, Tibetan, Myanmar,
   Khmer: ``می‌خواهم``, ``ශ්‍රී``), a run of them once; elsewhere they go, so
   ``che\\u200cap``, ``pass\\u200dword`` or ``退\\u200d款`` read as written without them.
   With ``emoji="keep"`` every zero-width joiner and the emoji variation selector
   stay, so kept emoji sequences are not broken.

Emoji are matched with the ``emoji`` package's data, but through a pre-check that
rejects the common case (no emoji at all) at C speed; ``emoji.demojize`` itself scans
in Python and costs milliseconds per kilobyte.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Mapping
from typing import Any

from lockgate.spec import InputRule

_ZWJ = "\u200d"
_ZWNJ = "\u200c"
_VS15 = "\ufe0e"  # text presentation
_VS16 = "\ufe0f"  # emoji presentation
_VARIATION = _VS15 + _VS16
_KEEP_CONTROLS = {"\t", "\n", "\r"}
_EXTRA_INVISIBLE = "\u034f\u115f\u1160\u3164\uffa0"
#: Line, page and record separators: they become newlines, never nothing.
_NEWLINE_LIKE = "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_ASCII_CONTROLS = bytes(b for b in [*range(0x00, 0x09), *range(0x0B, 0x0D),
                                    *range(0x0E, 0x20), 0x7F] if chr(b) not in _NEWLINE_LIKE)
_ASCII_NEWLINE_LIKE = bytes(ord(c) for c in _NEWLINE_LIKE if c.isascii())
_ASCII_TO_NEWLINE = bytes.maketrans(_ASCII_NEWLINE_LIKE, b"\n" * len(_ASCII_NEWLINE_LIKE))
_ASCII_SUSPECT = _ASCII_CONTROLS + _ASCII_NEWLINE_LIKE
_LINE_SEPARATORS = str.maketrans(dict.fromkeys(_NEWLINE_LIKE, "\n"))
_NEWLINE_LIKE_RE = re.compile(f"[{_NEWLINE_LIKE}]")
_ASTRAL = re.compile("[\U00010000-\U0010ffff]")

Ranges = list[tuple[int, int]]


def _merge(ranges: Ranges) -> Ranges:
    out: Ranges = []
    for a, b in sorted(ranges):
        if out and out[-1][1] >= a - 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _char_class(ranges: Ranges) -> str:
    """A regex character class, brackets included, for code point ranges."""
    body = "".join(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}"
                   for a, b in _merge(ranges))
    return f"[{body}]"


@functools.cache
def _invisible_ranges(keep_joiners: bool) -> tuple[tuple[int, int], ...]:
    points: Ranges = []
    for cp in [*range(0x0, 0x30000), *range(0xE0000, 0xE1000)]:
        ch = chr(cp)
        cat = unicodedata.category(ch)
        hide = cat == "Cf" or (cat == "Cc" and ch not in _KEEP_CONTROLS) \
            or 0xFE00 <= cp <= 0xFE0F or 0xE0100 <= cp <= 0xE01EF or ch in _EXTRA_INVISIBLE
        # Separators become newlines; joiners are judged by their neighbours.
        hide = hide and ch not in _NEWLINE_LIKE and ch not in (_ZWNJ, _ZWJ)
        # Kept emoji keep their joiners, presentation selector and tag characters
        # (the flags of England, Scotland and Wales are tag sequences).
        if hide and not (keep_joiners and (ch in (_ZWJ, _VS16) or 0xE0020 <= cp <= 0xE007F)):
            points.append((cp, cp))
    return tuple(_merge(points))


@functools.cache
def _invisible_re(keep_joiners: bool) -> re.Pattern[str]:
    return re.compile(_char_class(list(_invisible_ranges(keep_joiners))) + "+")


#: Scripts whose spelling uses the zero-width (non-)joiner: Arabic (with its
#: supplements and presentation forms), Syriac, the Indic scripts and Sinhala,
#: Tibetan, Myanmar and Khmer.
_JOINER_SCRIPTS = ((0x0600, 0x06FF), (0x0700, 0x074F), (0x0750, 0x077F), (0x08A0, 0x08FF),
                   (0x0900, 0x0DFF), (0x0F00, 0x0FFF), (0x1000, 0x109F), (0x1780, 0x17FF),
                   (0xFB50, 0xFDFF), (0xFE70, 0xFEFF))
_JOINER_RUN = re.compile(f"[{_ZWNJ}{_ZWJ}]+")
_ZWNJ_RUN = re.compile(f"{_ZWNJ}+")


def _joining_letter(ch: str) -> bool:
    """A letter or mark of a script that uses joiners."""
    cp = ord(ch)
    return any(a <= cp <= b for a, b in _JOINER_SCRIPTS) \
        and unicodedata.category(ch)[0] in "LM"


def _joiner(m: re.Match[str]) -> str:
    """A run of joiners where it shapes a script (next to a letter or mark of a
    script that uses them: Persian "می‌خواهم", Sinhala "ශ්‍රී"), each kind once;
    nothing elsewhere ("pass\\u200dword", "退\\u200d款")."""
    text, start, end = m.string, m.start(), m.end()
    if (start > 0 and _joining_letter(text[start - 1])) \
            or (end < len(text) and _joining_letter(text[end])):
        run = m.group()
        return run if len(run) == 1 else "".join(dict.fromkeys(run))
    return ""


def strip_invisible(text: str, *, keep_joiners: bool = False) -> str:
    """Remove invisible format/control characters (see the module docstring)."""
    if text.isascii():
        # Only C0 controls and DEL can hide in ASCII; bytes.translate finds them fast.
        raw = text.encode("ascii")
        if len(raw.translate(None, _ASCII_SUSPECT)) == len(raw):
            return text
        return raw.translate(_ASCII_TO_NEWLINE, _ASCII_CONTROLS).decode("ascii")
    text = _invisible_re(keep_joiners).sub("", text)
    if keep_joiners:  # kept emoji keep every ZWJ; a ZWNJ is judged as elsewhere
        if _ZWNJ in text:
            text = _ZWNJ_RUN.sub(_joiner, text)
    elif _ZWJ in text or _ZWNJ in text:
        text = _JOINER_RUN.sub(_joiner, text)
    if _NEWLINE_LIKE_RE.search(text) is not None:
        text = text.translate(_LINE_SEPARATORS)
    return text


def _cjk_block(cp: int) -> bool:
    return 0x2E80 <= cp <= 0xFFFF


def _emoji_first_ranges(firsts: list[str]) -> Ranges:
    """Coarse ranges covering every non-ASCII first character of an emoji.

    A class of a thousand single characters is slow to search; a few merged ranges (a
    superset) are fast. CJK blocks stay exact so Chinese text does not stop at every
    character."""
    ranges: Ranges = []
    for cp in sorted(ord(c) for c in firsts if not c.isascii()):
        if ranges and cp - ranges[-1][1] <= 256 and not _cjk_block(cp) \
                and not _cjk_block(ranges[-1][1]):
            ranges[-1] = (ranges[-1][0], cp)
        else:
            ranges.append((cp, cp))
    return ranges


@functools.cache
def _emoji_tables() -> tuple[re.Pattern[str], dict[str, tuple[str, ...]], dict[str, str]]:
    import emoji

    data: Mapping[str, Mapping[str, Any]] = emoji.EMOJI_DATA
    by_first: dict[str, list[str]] = {}
    names: dict[str, str] = {}
    for seq, info in data.items():
        by_first.setdefault(seq[0], []).append(seq)
        names[seq] = str(info["en"])
    ordered = {k: tuple(sorted(v, key=len, reverse=True)) for k, v in by_first.items()}
    # Keycaps ("1️⃣") start with an ASCII character; only the combining keycap marks them.
    cls = _char_class(_emoji_first_ranges(list(ordered)))
    # A variation selector left over (after a text character, or after an emoji that
    # was replaced) only asks how an emoji looks: it goes with the emoji.
    candidates = re.compile(f"[0-9#*]\ufe0f?\u20e3|[{_VS15}{_VS16}]|{cls}")
    return candidates, ordered, names


@functools.cache
def _suspects() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """Every emoji start and every invisible character, as one class for the Basic
    Multilingual Plane (a bitmap: fast to search) and one for the other planes
    (searched only when the text has such characters). One scan then tells that a
    text needs neither the emoji nor the invisible-character step: the common case."""
    ranges = [*_emoji_first_ranges(list(_emoji_tables()[1])),
              *_invisible_ranges(False), (0x20E3, 0x20E3),
              (ord(_ZWNJ), ord(_ZWJ)), *((ord(c), ord(c)) for c in _NEWLINE_LIKE)]
    bmp = [(a, min(b, 0xFFFF)) for a, b in ranges if a <= 0xFFFF]
    astral = [(max(a, 0x10000), b) for a, b in ranges if b > 0xFFFF]
    return re.compile(_char_class(bmp)), re.compile(_char_class(astral))


def _has_suspects(text: str) -> bool:
    bmp, astral = _suspects()
    if bmp.search(text) is not None:
        return True
    return _ASTRAL.search(text) is not None and astral.search(text) is not None


def replace_emoji(text: str, *, tag: bool = True) -> str:
    """Replace each emoji by ``:cldr_name:`` (``tag=True``) or by nothing; a variation
    selector (U+FE0E, U+FE0F) goes with it, as does one left on its own."""
    if text.isascii():
        return text
    candidates, by_first, names = _emoji_tables()
    m = candidates.search(text)
    if m is None:
        return text
    out: list[str] = []
    pos = 0
    while m is not None:
        start = m.start()
        seq = next((s for s in by_first.get(text[start], ()) if text.startswith(s, start)),
                   None)
        if seq is None:
            if text[start] in _VARIATION:
                out.append(text[pos:start])
                pos = start + 1
                m = candidates.search(text, pos)
                continue
            # a candidate first character that starts no known sequence
            m = candidates.search(text, start + 1)
            continue
        out.append(text[pos:start])
        out.append(names[seq] if tag else "")
        pos = start + len(seq)
        m = candidates.search(text, pos)
    out.append(text[pos:])
    return "".join(out)


#: Compatibility forms that keep their meaning only as written: superscripts and
#: subscripts (``mc²``, ``10⁻⁶``), circled (``①``) and fraction (``½``) forms.
_KEPT_TAGS = ("<super>", "<sub>", "<circle>", "<fraction>")
#: Hangul compatibility jamo (``ㅋㅋ``, ``ㅠㅠ``) and the information source sign.
_KEPT_RANGES = ((0x3131, 0x318E), (0x2139, 0x2139))
#: Letters and marks Unicode deprecates, whose compatibility form is the spelling to
#: use (Tibetan vocalic RR and LL, ``ŉ``): folded.
_DEPRECATED = frozenset({0x0149, 0x0F77, 0x0F79})
#: Where presentation forms of letters are (Alphabetic Presentation Forms, Arabic
#: Presentation Forms-A and -B): folded.
_PRESENTATION = ((0xFB00, 0xFDFF), (0xFE70, 0xFEFF))
#: Where compatibility decompositions are: the Basic Multilingual Plane and blocks of
#: the Supplementary Multilingual Plane (modifier letters, math alphanumerics, Arabic
#: math letters, enclosed and squared forms, segmented digits).
_FOLD_BLOCKS = ((0x0000, 0xFFFF), (0x10780, 0x107BF), (0x1D400, 0x1D7FF),
                (0x1EE00, 0x1EEFF), (0x1F100, 0x1F2FF), (0x1FBF0, 0x1FBFF))


def _kept(cp: int) -> bool:
    """Whether NFKC would change the meaning of this character: see :func:`fold_width`."""
    if any(a <= cp <= b for a, b in _KEPT_RANGES):
        return True
    ch = chr(cp)
    decomposition = unicodedata.decomposition(ch)
    if decomposition.startswith(_KEPT_TAGS):
        return True
    # Spacing accents ("´" is <compat> 0020 0301): NFKC makes a space and a loose mark.
    points = [p for p in decomposition.split() if not p.startswith("<")]
    if len(points) > 1 and points[0] == "0020":
        return True
    return _spelled_letter(ch, decomposition, len(points))


def _spelled_letter(ch: str, decomposition: str, length: int) -> bool:
    """Whether ``ch`` is a letter or mark of a script's own alphabet that its writers
    type as one character, though Unicode gives it a plain ``<compat>`` decomposition
    into several: Thai and Lao AM (``ทำ``, ``ກຳ``), Lao HO NO and HO MO (``ໜ``, ``ໝ``),
    the Kazakh high-hamza letters (``ٵ ٶ ٷ ٸ``), Armenian ``և``. Their NFKC form is
    another spelling (``ํา`` renders apart, and costs more tokens). Folded still:
    presentation forms (``ﬁ``, ``ﬓ``), Latin digraphs and ligatures (``ǆ``, ``ĳ``,
    ``ŀ``: the letters they join are the usual spelling), deprecated characters, and
    compatibility forms of one character (symbol variants such as ``ϐ``, ``µ``,
    ``ℵ``)."""
    if length < 2 or not decomposition.startswith("<compat>") \
            or unicodedata.category(ch)[0] not in "LM":
        return False
    cp = ord(ch)
    if cp in _DEPRECATED or any(a <= cp <= b for a, b in _PRESENTATION):
        return False
    return not unicodedata.name(ch, "").startswith("LATIN ")


@functools.cache
def _fold_table() -> dict[int, str]:
    """Every character NFKC changes beyond NFC, mapped to its NFKC form, except the
    kept ones (built once: a few tens of milliseconds)."""
    table: dict[int, str] = {}
    for cp in (cp for a, b in _FOLD_BLOCKS for cp in range(a, b + 1)):
        ch = chr(cp)
        if not unicodedata.decomposition(ch) or unicodedata.is_normalized("NFKC", ch):
            continue
        folded = unicodedata.normalize("NFKC", ch)
        if folded != unicodedata.normalize("NFC", ch) and not _kept(cp):
            table[cp] = folded
    return table


@functools.cache
def _fold_re() -> tuple[re.Pattern[str], re.Pattern[str]]:
    """The folded characters of the Basic Multilingual Plane (a class of them only is
    compiled to a bitmap: fast to search), and of the other planes."""
    points = list(_fold_table())
    # Outside the BMP a class of many ranges is tested range by range: the blocks
    # (a superset, a few ranges) are found, then looked up.
    return (re.compile(_char_class([(cp, cp) for cp in points if cp <= 0xFFFF])),
            re.compile(_char_class([(a, b) for a, b in _FOLD_BLOCKS if a > 0xFFFF])))


def fold_width(text: str) -> str:
    """NFKC, except for the characters whose compatibility form carries meaning, then
    NFC.

    Folded, as NFKC does: full-width and half-width forms (``，：！ＡＢＣ１２３``,
    ``ｶﾞ``), ligatures (``ﬁ``), Arabic presentation forms, math alphanumerics
    (``𝗕𝗶𝗴``), no-break and typographic spaces, squared units (``㎏``), small and
    vertical punctuation, half-width Hangul (which then composes into syllables).
    Kept as written: superscripts and subscripts, circled characters, fractions,
    Hangul compatibility jamo, U+2139, spacing accents (``´``) and letters spelled as
    one character (Thai and Lao AM ``ทำ ກຳ``, ``ໜ ໝ``, ``ٵ``, ``և``: see
    :func:`_spelled_letter`)."""
    if text.isascii() or unicodedata.is_normalized("NFKC", text):
        return text  # the common case, in C
    bmp, astral = _fold_re()
    found = set(bmp.findall(text))
    if _ASTRAL.search(text) is not None:
        found.update(astral.findall(text))
    if found:
        # str.replace per distinct character runs in C (str.translate with a dict
        # looks every character up in Python and costs more even with many kinds).
        table = _fold_table()
        for ch in found:
            folded = table.get(ord(ch))
            if folded is not None:
                text = text.replace(ch, folded)
    if not unicodedata.is_normalized("NFC", text):
        text = unicodedata.normalize("NFC", text)
    return text


def normalize_text(text: str, rule: InputRule) -> str:
    """Normalise one string under an input rule (width folding, emoji, invisible
    characters)."""
    if rule.nfkc:
        text = fold_width(text)
    if rule.emoji == "keep" and not rule.strip_invisible:
        return text
    if text.isascii():
        return strip_invisible(text) if rule.strip_invisible else text
    if not _has_suspects(text):
        return text
    before = text
    if rule.emoji != "keep":
        text = replace_emoji(text, tag=rule.emoji == "tag")
    if rule.strip_invisible:
        text = strip_invisible(text, keep_joiners=rule.emoji == "keep")
    if rule.nfkc and text != before:
        # What stood between a letter and its combining mark is gone ("N\u200b\u0300"):
        # they compose now, so normalising the result again changes nothing.
        text = fold_width(text)
    return text


def normalize_value(value: Any, rule: InputRule) -> Any:
    """Normalise every string inside a JSON-like value (mapping keys are left alone)."""
    if isinstance(value, str):
        return normalize_text(value, rule)
    if isinstance(value, Mapping):
        return {k: normalize_value(v, rule) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [normalize_value(v, rule) for v in value]
    return value
