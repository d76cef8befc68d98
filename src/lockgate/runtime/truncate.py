"""Fitting an input into a token budget by keeping its key sentences.

Cutting the tail of a long input loses whatever the author put last (often the
conclusion). Instead:

1. **Split** the text into sentences, for English and Chinese alike: a sentence ends
   at ``。！？!?…`` (with any closing quotes or brackets), at ``.`` followed by space
   or the end, or at a line break. Chinese needs no spaces. A sentence longer than the
   whole budget is split again at clause marks (``，,；;、：:``).
2. **Rank** them with TextRank: a graph whose edge weights are the word overlap of
   two sentences, normalised by their lengths (``|A∩B| / (log|A| + log|B|)``), scored
   by PageRank (damping 0.85). Words are lower-cased Latin words and digit runs, and
   for CJK text character bigrams, so Chinese needs no word segmenter.
3. **Select** sentences by score, greedily, while they fit; emit them **in their
   original order**; check the joined text against the budget and drop the weakest
   until it fits.
4. If not even one sentence fits, cut the best one at a character boundary that does
   not split a grapheme (combining marks, joiners, variation selectors stay attached).

Everything here is deterministic: ties go to the earlier sentence.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

#: A sentence ends at CJK end marks, at an ellipsis, and at ASCII ones before a space or
#: the end (so "get?id=42" and "v1.2" are no ends), and at a line break.
_SENTENCE_END = re.compile(
    r"(?:[。！？]+|…+|\.{3,}|[.!?]+(?=[\"'”’」』）)\]]*(?:\s|$)))"
    r"[\"'”’」』）)\]]*[ \t\u3000]*(?:\r?\n\s*)?"
    r"|\r?\n\s*")
#: A clause ends at CJK marks, and at ASCII ones before a space or the end (so "10:30"
#: and "1,000" stay whole).
_CLAUSE_END = re.compile(r"(?:[，；、：]+|[,;:]+(?=\s|$))[ \t\u3000]*")
_WORDS = re.compile(r"[a-z\u00c0-\u024f]{2,}|\d+|[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]+")
_CJK_RUN = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uac00-\ud7af]")
_STOPWORDS = frozenset({
    "the", "and", "for", "are", "but", "not", "you", "all", "any", "can", "her", "was", "one",
    "our", "out", "has", "have", "had", "his", "how", "its", "may", "new", "now", "old", "see",
    "two", "who", "did", "get", "let", "say", "she", "too", "use", "this", "that", "with",
    "from", "they", "will", "were", "been", "than", "then", "them", "what", "when", "which",
    "would", "there", "their", "about", "into", "more", "also", "some", "such", "only", "very",
    "just", "over", "these", "those", "is", "it", "of", "to", "in", "on", "at", "by", "an",
    "as", "be", "or", "if", "so", "we", "he", "do", "no", "up", "my", "me", "us"
})
_DAMPING = 0.85
_MAX_NEIGHBOURS = 24


@dataclass(frozen=True, slots=True)
class Condensed:
    """The result of fitting a text into a budget."""

    text: str
    kept: int
    total: int
    tokens: int
    unit: str = "sentences"

    @property
    def condensed(self) -> bool:
        return self.unit == "characters" or self.kept < self.total


def split_sentences(text: str, *, clauses: bool = False) -> list[str]:
    """Split into sentences (or clauses); the pieces concatenate back to ``text``."""
    pattern = _CLAUSE_END if clauses else _SENTENCE_END
    out: list[str] = []
    start = 0
    for m in pattern.finditer(text):
        end = m.end()
        if end > start and text[start:end].strip():
            out.append(text[start:end])
            start = end
    if start < len(text):
        if out and not text[start:].strip():
            out[-1] += text[start:]
        else:
            out.append(text[start:])
    return out


def _terms(sentence: str) -> set[str]:
    terms: set[str] = set()
    for w in _WORDS.findall(sentence.lower()):
        if _CJK_RUN.match(w):
            if len(w) == 1:
                terms.add(w)
            else:
                terms.update(w[i:i + 2] for i in range(len(w) - 1))
        elif w not in _STOPWORDS:
            terms.add(w)
    return terms


def _edges(terms: list[set[str]]) -> list[dict[int, float]]:
    """Weighted adjacency of the sentence graph, built through an inverted index."""
    n = len(terms)
    norms = [math.log(len(t) + 1.0) for t in terms]
    index: dict[str, list[int]] = {}
    for i, ts in enumerate(terms):
        for t in ts:
            index.setdefault(t, []).append(i)
    overlap: list[dict[int, int]] = [{} for _ in range(n)]
    # Terms shared by most sentences carry no signal and cost O(n^2): skip them.
    common = max(8, n // 2)
    for members in index.values():
        if len(members) < 2 or len(members) > common:
            continue
        for a_pos, a in enumerate(members):
            row = overlap[a]
            for b in members[a_pos + 1:]:
                row[b] = row.get(b, 0) + 1
    edges: list[dict[int, float]] = [{} for _ in range(n)]
    for a in range(n):
        for b, shared in overlap[a].items():
            denom = norms[a] + norms[b]
            if denom > 0:
                edges[a][b] = edges[b][a] = shared / denom
    # Keep each sentence's strongest links only: the ranking barely moves, and a long
    # input (hundreds of sentences) stays fast.
    for a in range(n):
        if len(edges[a]) > _MAX_NEIGHBOURS:
            strongest = sorted(edges[a].items(), key=lambda kv: (-kv[1], kv[0]))
            edges[a] = dict(strongest[:_MAX_NEIGHBOURS])
    for a in range(n):  # keep the graph symmetric
        for b, w in list(edges[a].items()):
            edges[b].setdefault(a, w)
    return edges


def textrank(sentences: list[str], iterations: int = 50, tol: float = 1e-4) -> list[float]:
    """TextRank centrality of each sentence (higher: more central)."""
    n = len(sentences)
    if n == 0:
        return []
    edges = _edges([_terms(s) for s in sentences])
    out_weight = [sum(e.values()) for e in edges]
    scores = [1.0] * n
    for _ in range(iterations):
        new = [1.0 - _DAMPING] * n
        for j in range(n):
            if out_weight[j] == 0:
                continue
            share = _DAMPING * scores[j] / out_weight[j]
            for i, w in edges[j].items():
                new[i] += share * w
        delta = max(abs(a - b) for a, b in zip(new, scores, strict=True))
        scores = new
        if delta < tol:
            break
    return scores


def _safe_cut(text: str, end: int) -> int:
    """Move ``end`` left until ``text[:end]`` does not split a grapheme cluster."""
    while 0 < end < len(text):
        nxt = text[end]
        prev = text[end - 1]
        if unicodedata.combining(nxt) or unicodedata.category(nxt) in ("Mn", "Mc", "Me") \
                or nxt in "\u200d\ufe0f\ufe0e\u20e3" or prev == "\u200d" \
                or "\U0001f3fb" <= nxt <= "\U0001f3ff" \
                or ("\U0001f1e6" <= prev <= "\U0001f1ff" and "\U0001f1e6" <= nxt <= "\U0001f1ff"):
            end -= 1
            continue
        break
    return end


def hard_cut(text: str, budget: int, count: Callable[[str], int]) -> str:
    """The longest prefix of ``text`` within ``budget`` tokens, cut at a safe boundary
    (the last space, when it is near)."""
    if budget <= 0:
        return ""
    if count(text) <= budget:
        return text
    lo, hi = 0, len(text)
    while lo < hi:  # largest prefix length that fits
        mid = (lo + hi + 1) // 2
        if count(text[:_safe_cut(text, mid)]) <= budget:
            lo = mid
        else:
            hi = mid - 1
    end = _safe_cut(text, lo)
    space = text.rfind(" ", 0, end)
    if space > 0 and end - space < 20 and space > end * 0.8:
        end = space
    return text[:end].rstrip()


def _join(pieces: list[str]) -> str:
    out = ""
    for piece in pieces:
        p = piece.strip()
        if not p:
            continue
        if out and not out.endswith("\n"):
            # Latin text needs a space between non-adjacent sentences; CJK does not.
            out += " " if (out[-1].isascii() or p[0].isascii()) else ""
        out += p + ("\n" if piece.rstrip(" \t\u3000").endswith("\n") else "")
    return out.rstrip()


def condense(text: str, budget: int, count: Callable[[str], int]) -> Condensed:
    """Keep the most central sentences of ``text``, in order, within ``budget`` tokens."""
    tokens = count(text)
    sentences = split_sentences(text)
    if tokens <= budget:
        return Condensed(text, len(sentences), len(sentences), tokens)
    pieces, unit = sentences, "sentences"
    costs = [count(s) for s in pieces]
    if budget > 0 and (len(pieces) == 1 or min(costs) > budget):
        # Not one whole sentence fits: work on clauses instead.
        pieces = [c for s in sentences for c in split_sentences(s, clauses=True)]
        unit = "clauses"
        costs = [count(s) for s in pieces]
    scores = textrank(pieces)
    order = sorted(range(len(pieces)), key=lambda i: (-scores[i], i))
    chosen: set[int] = set()
    used = 0
    for i in order:
        if used + costs[i] <= budget:
            chosen.add(i)
            used += costs[i]
    result = _join([pieces[i] for i in sorted(chosen)])
    # Token counts are not additive across joins: verify and shed the weakest.
    by_weakness = [i for i in reversed(order) if i in chosen]
    while chosen and count(result) > budget:
        chosen.discard(by_weakness.pop(0))
        result = _join([pieces[i] for i in sorted(chosen)])
    if not chosen:
        best = pieces[order[0]] if pieces else text
        result = hard_cut(best.strip(), budget, count)
        return Condensed(result, 0, len(pieces), count(result), "characters")
    return Condensed(result, len(chosen), len(pieces), count(result), unit)
