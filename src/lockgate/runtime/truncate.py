"""Fitting an input into a token budget by keeping its key sentences.

Cutting the tail of a long input loses whatever the author put last (often the
conclusion). Instead:

1. **Split** the text into sentences, for English and Chinese alike: a sentence ends
   at ``。！？!?…`` (with any closing quotes or brackets), at ``.`` followed by space
   or the end, or at a line break (with the blank lines after it; the next line's
   indentation starts the next piece). Chinese needs no spaces. A sentence longer than
   the whole budget is split again at clause marks (``，,；;、：:``).
2. **Rank** them with TextRank: a graph whose edge weights are the word overlap of
   two sentences, normalised by their lengths (``|A∩B| / (log|A| + log|B|)``), scored
   by PageRank (damping 0.85). Words are lower-cased Latin words and digit runs, and
   for CJK text character bigrams, so Chinese needs no word segmenter. The work is
   bounded so a 100 KB input condenses in tens of milliseconds: a term shared by many
   sentences of a long repetitive input links each to its next few holders only,
   PageRank gets fewer iterations on a large graph, and above 1,000 sentences one
   linear step (each sentence's weighted degree) replaces the graph.
3. **Select** sentences by score, greedily, while they fit; emit them **in their
   original order**, as written: adjacent kept pieces are joined unchanged (line
   breaks, blank lines and indentation kept); a kept piece that started a line starts
   a line. Check the joined text against the budget and drop the weakest until it fits.
4. If not even one sentence fits, cut the best one at a character boundary that does
   not split a grapheme (combining marks, joiners, variation selectors, emoji tag
   sequences, virama conjuncts and conjoining Hangul jamo stay together).

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
#: A line break takes the blank lines after it, never the next line's indentation: a
#: piece that starts a line starts with that line as written.
_LINE_BREAK = r"\r?\n(?:[ \t\f\v\u3000]*\r?\n)*"
_SENTENCE_END = re.compile(
    r"(?:[。！？]+|…+|\.{3,}|[.!?]+(?=[\"'”’」』）)\]]*(?:\s|$)))"
    r"[\"'”’」』）)\]]*[ \t\u3000]*(?:" + _LINE_BREAK + ")?"
    r"|" + _LINE_BREAK)
_LEADING_BLANK_LINES = re.compile(r"^(?:[ \t\f\v\u3000]*\r?\n)+")
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
#: Above this many sentence pairs sharing a term, the graph is built from windows.
_MAX_PAIRS = 60_000
_WINDOW = 2
#: Edge visits PageRank may spend; a long input gets fewer iterations (at least two,
#: which already rank by weighted degree and the neighbours' degree).
_MAX_EDGE_VISITS = 150_000
#: Above this many sentences, one linear step (weighted degree) replaces PageRank.
_MAX_GRAPH = 1000


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
    groups = [m for m in index.values() if 2 <= len(m) <= common]
    # Every pair sharing a term while that stays cheap (the usual input); on a long,
    # repetitive one (a CSV, a log), a term shared by many sentences links each of
    # them to its next few holders only, so the work grows linearly with the text.
    exhaustive = sum(len(m) * (len(m) - 1) // 2 for m in groups) <= _MAX_PAIRS
    for members in groups:
        window = len(members) if exhaustive or len(members) <= _MAX_NEIGHBOURS \
            else _WINDOW
        for a_pos, a in enumerate(members):
            row = overlap[a]
            for b in members[a_pos + 1:a_pos + 1 + window]:
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


def _degree_scores(terms: list[set[str]]) -> list[float]:
    """One linear step of TextRank for very long inputs: each sentence's weighted
    degree, counting each term it shares by how many other sentences have it (terms in
    most sentences skipped, as in the graph), with the partner's length taken as the
    mean."""
    n = len(terms)
    df: dict[str, int] = {}
    for ts in terms:
        for t in ts:
            df[t] = df.get(t, 0) + 1
    common = max(8, n // 2)
    norms = [math.log(len(t) + 1.0) for t in terms]
    mean = sum(norms) / n
    scores: list[float] = []
    for ts, norm in zip(terms, norms, strict=True):
        shared = sum(d - 1 for d in map(df.__getitem__, ts) if d <= common)
        scores.append((1.0 - _DAMPING) + _DAMPING * shared / (norm + mean or 1.0))
    return scores


def textrank(sentences: list[str], iterations: int = 50, tol: float = 1e-4) -> list[float]:
    """TextRank centrality of each sentence (higher: more central)."""
    n = len(sentences)
    if n == 0:
        return []
    terms = [_terms(s) for s in sentences]
    if n > _MAX_GRAPH:
        return _degree_scores(terms)
    edges = _edges(terms)
    out_weight = [sum(e.values()) for e in edges]
    visits = sum(len(e) for e in edges)
    if visits:
        iterations = min(iterations, max(2, _MAX_EDGE_VISITS // visits))
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


def _jamo(ch: str) -> str:
    """The Hangul syllable type of ``ch``: L, V, T, LV, LVT, or "" for none."""
    cp = ord(ch)
    if 0x1100 <= cp <= 0x115F or 0xA960 <= cp <= 0xA97C:
        return "L"
    if 0x1160 <= cp <= 0x11A7 or 0xD7B0 <= cp <= 0xD7C6:
        return "V"
    if 0x11A8 <= cp <= 0x11FF or 0xD7CB <= cp <= 0xD7FB:
        return "T"
    if 0xAC00 <= cp <= 0xD7A3:
        return "LV" if (cp - 0xAC00) % 28 == 0 else "LVT"
    return ""


def _joined(prev: str, nxt: str) -> bool:
    """Whether a cut between ``prev`` and ``nxt`` would split a grapheme cluster."""
    if unicodedata.combining(nxt) or unicodedata.category(nxt) in ("Mn", "Mc", "Me") \
            or nxt in "\u200d\ufe0f\ufe0e\u20e3" or prev == "\u200d" \
            or "\U0001f3fb" <= nxt <= "\U0001f3ff" \
            or ("\U0001f1e6" <= prev <= "\U0001f1ff" and "\U0001f1e6" <= nxt <= "\U0001f1ff"):
        return True
    if "\U000e0020" <= nxt <= "\U000e007f":  # emoji tag sequence (flags of GB nations)
        return True
    # A virama joins the next consonant into a conjunct ("क्ष").
    if unicodedata.combining(prev) == 9 and unicodedata.category(nxt) == "Lo":
        return True
    a, b = _jamo(prev), _jamo(nxt)
    if a and b:
        return (a == "L" and b in ("L", "V", "LV", "LVT")) \
            or (a in ("LV", "V") and b in ("V", "T")) or (a in ("LVT", "T") and b == "T")
    return False


def _safe_cut(text: str, end: int) -> int:
    """Move ``end`` left until ``text[:end]`` does not split a grapheme cluster."""
    while 0 < end < len(text) and _joined(text[end - 1], text[end]):
        end -= 1
    return end


def hard_cut(text: str, budget: int, count: Callable[[str], int]) -> str:
    """The longest prefix of ``text`` within ``budget`` tokens, cut at a safe boundary
    (the last space, when it is near)."""
    if budget <= 0:
        return ""
    # Gallop to a prefix that is over (counting a prefix costs its length), then
    # bisect between the last one that fit and it.
    lo, hi = 0, len(text)
    probe = max(64, 8 * budget)
    while probe < hi:
        if count(text[:_safe_cut(text, probe)]) > budget:
            hi = probe
            break
        lo = probe
        probe *= 2
    else:
        if count(text) <= budget:
            return text
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


_HSPACE = " \t\u3000"


def _join(pieces: list[str], chosen: list[int]) -> str:
    """The chosen pieces (indices in order), each as written: pieces adjacent in the
    input are concatenated unchanged, so indentation, line breaks and blank lines
    inside a kept run survive. Where pieces were dropped, a piece that started a line
    starts a line again (its indentation kept); one that started mid-line follows after
    a space (none between CJK characters)."""
    out: list[str] = []
    prev = -2
    for i in chosen:
        piece = pieces[i]
        if not piece.strip():
            continue
        if i != prev + 1:
            piece = _LEADING_BLANK_LINES.sub("", piece)
            starts_line = i == 0 or pieces[i - 1].endswith("\n")
            if not out:
                if not starts_line:
                    piece = piece.lstrip(_HSPACE)
            elif not out[-1].endswith("\n"):
                tail = out[-1].rstrip(_HSPACE)
                out[-1] = tail
                if starts_line:
                    piece = "\n" + piece
                else:
                    piece = piece.lstrip(_HSPACE)
                    # Latin text needs a space between non-adjacent sentences; CJK not.
                    if tail and piece and (tail[-1].isascii() or piece[0].isascii()):
                        piece = " " + piece
            elif not starts_line:
                piece = piece.lstrip(_HSPACE)
        out.append(piece)
        prev = i
    return "".join(out).rstrip()


def condense(text: str, budget: int, count: Callable[[str], int]) -> Condensed:
    """Keep the most central sentences of ``text``, in order, within ``budget`` tokens."""
    tokens = count(text)
    sentences = split_sentences(text)
    if tokens <= budget:
        return Condensed(text, len(sentences), len(sentences), tokens)
    pieces, unit = sentences, "sentences"
    costs = [tokens] if len(pieces) == 1 else [count(s) for s in pieces]
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
    result = _join(pieces, sorted(chosen))
    # Token counts are not additive across joins: verify and shed the weakest.
    by_weakness = [i for i in reversed(order) if i in chosen]
    while chosen and count(result) > budget:
        chosen.discard(by_weakness.pop(0))
        result = _join(pieces, sorted(chosen))
    if not chosen:
        best = pieces[order[0]] if pieces else text
        result = hard_cut(_LEADING_BLANK_LINES.sub("", best).rstrip(), budget, count)
        return Condensed(result, 0, len(pieces), count(result), "characters")
    return Condensed(result, len(chosen), len(pieces), count(result), unit)
