"""Field-name matching: style-insensitive keys and close misspellings.

Used by the repair ladder (a model wrote ``"sentimnet"`` or ``"Sentiment"`` for
``"sentiment"``) and by template checks (did you mean ``text``?).

A name is first *folded*: NFKC, case-folded, with ``_``, ``-``, spaces and dots
removed, so ``userName``, ``user_name``, ``User-Name`` and ``ｕｓｅｒ＿ｎａｍｅ`` are one
name. Two folded names are then *close* when their optimal-string-alignment distance
(insertions, deletions, substitutions, adjacent transpositions) is within a budget
set by the declared name's length: none below 4 characters (3 for CJK, where one
character carries a word), 1 up to 7, 2 from 8. A match must be unique: when two candidates are
equally close, nothing is renamed.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Sequence

_SEPARATORS = re.compile(r"[\s_\-.]+")


@functools.lru_cache(maxsize=8192)
def fold(name: str) -> str:
    """The style-insensitive form of a field name."""
    return _SEPARATORS.sub("", unicodedata.normalize("NFKC", name).casefold())


def _is_cjk(text: str) -> bool:
    return any("\u3040" <= c <= "\u9fff" or "\uac00" <= c <= "\ud7af" for c in text)


def max_distance(folded: str) -> int:
    """How many edits a name of this (folded) form may be away from its match."""
    n = len(folded)
    if _is_cjk(folded):
        return 1 if n >= 3 else 0
    if n >= 8:
        return 2
    return 1 if n >= 4 else 0


def distance(a: str, b: str, limit: int) -> int:
    """Optimal-string-alignment distance, or ``limit + 1`` once it exceeds ``limit``."""
    if a == b:
        return 0
    la, lb = len(a), len(b)
    if abs(la - lb) > limit:
        return limit + 1
    prev2: list[int] = []
    prev = list(range(lb + 1))
    for i in range(1, la + 1):
        cur = [i] + [0] * lb
        best = cur[0]
        ca = a[i - 1]
        for j in range(1, lb + 1):
            cost = 0 if ca == b[j - 1] else 1
            v = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == b[j - 1]:
                v = min(v, prev2[j - 2] + 1)
            cur[j] = v
            best = min(best, v)
        if best > limit:
            return limit + 1
        prev2, prev = prev, cur
    return prev[lb]


def closest(name: str, candidates: Sequence[str]) -> str | None:
    """The unique candidate closest to ``name`` within the length budget, if any."""
    target = fold(name)
    exact = [c for c in candidates if fold(c) == target]
    if exact:
        return exact[0] if len(exact) == 1 else None
    if len(target) < 2:
        return None
    best: str | None = None
    best_d = 3
    tie = False
    for c in candidates:
        folded = fold(c)
        limit = max_distance(folded)
        d = distance(target, folded, limit)
        if d > limit:
            continue
        if d < best_d:
            best, best_d, tie = c, d, False
        elif d == best_d:
            tie = True
    return None if tie else best
