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
   for CJK text character bigrams, so Chinese needs no word segmenter. A text that
   occurs more than once (a repeated footer, signature or line) is ranked and kept at
   its first occurrence only. While the sentence pairs sharing a term are few (60,000)
   the graph is built pair by pair, each sentence keeping its 24 strongest links; on
   a longer input PageRank runs on the whole graph without forming the pairs (the
   lengths normalised by their geometric mean, which factors), so the work grows
   linearly with the text and a 200 KB input condenses in about 100 ms.
3. **Select** sentences by score, greedily, while they fit, the first sentence (the
   title, most often) first when it costs at most half the budget; emit them **in their
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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from operator import mul, sub, truediv

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
#: Sentence pairs sharing a term up to which the graph is built pair by pair (each
#: sentence keeping its strongest links); beyond, PageRank runs on the factored
#: graph (see :func:`_factored_pagerank`), linear in the text.
_MAX_PAIRS = 60_000
#: Edge visits PageRank may spend on the pair graph, and term visits on the factored
#: one; a long input gets fewer iterations (at least _MIN_ITERATIONS, which already
#: rank as the converged scores do, near enough).
_MAX_EDGE_VISITS = 400_000
_MAX_TERM_VISITS = 300_000
_MIN_ITERATIONS = 4
#: The first sentence (the title, most often) is kept first when it costs at most
#: this share of the budget.
_LEAD_SHARE = 0.5


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


def _index(terms: list[set[str]]) -> list[list[int]]:
    """The holders of each term shared by some sentences but not by most (those carry
    no signal), each list in order."""
    index: dict[str, list[int]] = {}
    for i, ts in enumerate(terms):
        for t in ts:
            index.setdefault(t, []).append(i)
    common = max(8, len(terms) // 2)
    return [m for m in index.values() if 2 <= len(m) <= common]


def _edges(terms: list[set[str]], groups: list[list[int]]) -> list[dict[int, float]]:
    """Weighted adjacency of the sentence graph, each sentence's overlaps counted at C
    speed (a Counter over the holders of its terms)."""
    n = len(terms)
    norms = [math.log(len(t) + 1.0) for t in terms]
    of: list[list[list[int]]] = [[] for _ in range(n)]
    for members in groups:
        for i in members:
            of[i].append(members)
    edges: list[dict[int, float]] = []
    for a, lists in enumerate(of):
        if not lists:
            edges.append({})
            continue
        row: Counter[int] = Counter()
        for members in lists:
            row.update(members)
        row.pop(a, None)
        keys = list(row)
        # overlap / (log|A| + log|B|), in C
        values = list(map(truediv, row.values(), map(norms[a].__add__,
                                                      map(norms.__getitem__, keys))))
        if len(keys) > _MAX_NEIGHBOURS:
            # Keep each sentence's strongest links only: the ranking barely moves.
            floor = sorted(values)[-_MAX_NEIGHBOURS]
            edges.append({b: w for b, w in zip(keys, values, strict=True) if w >= floor})
        else:
            edges.append(dict(zip(keys, values, strict=True)))
    for a in range(n):  # keep the graph symmetric
        for b, w in list(edges[a].items()):
            edges[b].setdefault(a, w)
    return edges


def _pagerank(edges: list[dict[int, float]], iterations: int, tol: float) -> list[float]:
    n = len(edges)
    out_weight = [sum(e.values()) for e in edges]
    sources = [list(e) for e in edges]
    weights = [list(e.values()) for e in edges]
    visits = sum(map(len, sources))
    if not visits:
        return [1.0 - _DAMPING] * n
    iterations = min(iterations, max(_MIN_ITERATIONS, _MAX_EDGE_VISITS // visits))
    base = 1.0 - _DAMPING
    scores = [1.0] * n
    for _ in range(iterations):
        # each sentence pulls its neighbours' scores over their out-weight, in C
        give = [_DAMPING * x / w if w else 0.0 for x, w in zip(scores, out_weight, strict=True)]
        get = give.__getitem__
        new = [base + sum(map(mul, map(get, src), ws))
               for src, ws in zip(sources, weights, strict=True)]
        delta = max(map(abs, map(sub, new, scores)))
        scores = new
        if delta < tol:
            break
    return scores


def _factored_pagerank(terms: list[set[str]], groups: list[list[int]], iterations: int,
                       tol: float) -> list[float]:
    """PageRank over every pair of sentences sharing terms, without forming the pairs.

    The weight of two sentences is their overlap over the geometric mean of their
    log-lengths (the exact graph divides by the arithmetic mean, which is not
    separable, and differs by a few per cent), so the graph is ``U A Aᵀ U`` (``A``
    sentence-by-term, ``U`` the per-sentence scale) less its diagonal, and one
    iteration is two passes over the term lists: linear in the text."""
    n = len(terms)
    scale = [1.0 / math.sqrt(math.log(len(t) + 1.0)) if t else 0.0 for t in terms]
    of: list[list[int]] = [[] for _ in range(n)]
    for g, members in enumerate(groups):
        for i in members:
            of[i].append(g)
    sizes = [len(o) for o in of]

    def product(vector: list[float]) -> list[float]:
        """``(U A Aᵀ U - diag) · vector``."""
        scaled = list(map(mul, scale, vector))
        per_term = [sum(map(scaled.__getitem__, members)) for members in groups]
        get = per_term.__getitem__
        return [u * (sum(map(get, o)) - k * x)
                for u, o, k, x in zip(scale, of, sizes, scaled, strict=True)]

    out_weight = product([1.0] * n)
    visits = 2 * sum(map(len, of)) or 1
    iterations = min(iterations, max(_MIN_ITERATIONS, _MAX_TERM_VISITS // visits))
    base = 1.0 - _DAMPING
    scores = [1.0] * n
    for _ in range(iterations):
        give = [_DAMPING * x / w if w > 1e-12 else 0.0
                for x, w in zip(scores, out_weight, strict=True)]
        new = [base + x for x in product(give)]
        delta = max(map(abs, map(sub, new, scores)))
        scores = new
        if delta < tol:
            break
    return scores


def textrank(sentences: list[str], iterations: int = 50, tol: float = 1e-4) -> list[float]:
    """TextRank centrality of each sentence (higher: more central)."""
    if not sentences:
        return []
    terms = [_terms(s) for s in sentences]
    groups = _index(terms)
    if sum(len(m) * (len(m) - 1) // 2 for m in groups) <= _MAX_PAIRS:
        return _pagerank(_edges(terms, groups), iterations, tol)
    return _factored_pagerank(terms, groups, iterations, tol)


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


#: Regional indicators: a flag is a pair of them (``🇫🇷``).
_REGIONAL = "".join(map(chr, range(0x1F1E6, 0x1F200)))
#: Letters that attach to what precedes them as a spacing mark does: Thai and Lao AM.
_SPACING_LETTERS = "\u0e33\u0eb3"


def _joined(prev: str, nxt: str) -> bool:
    """Whether a cut between ``prev`` and ``nxt`` would split a grapheme cluster (a
    cut between two regional indicators is judged by :func:`_safe_cut`, which sees
    the whole run)."""
    if unicodedata.combining(nxt) or unicodedata.category(nxt) in ("Mn", "Mc", "Me") \
            or nxt in "\u200d\ufe0f\ufe0e\u20e3" or prev == "\u200d" \
            or "\U0001f3fb" <= nxt <= "\U0001f3ff" or nxt in _SPACING_LETTERS:
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
    """Move ``end`` left until ``text[:end]`` does not split a grapheme cluster.

    Inside a run of regional indicators the flags are the pairs from the run's start:
    a cut after an even number of them is safe, after an odd number it moves back one
    (the run is measured once, by ``rstrip`` in C, not walked character by character)."""
    while 0 < end < len(text):
        prev, nxt = text[end - 1], text[end]
        if "\U0001f1e6" <= prev <= "\U0001f1ff" and "\U0001f1e6" <= nxt <= "\U0001f1ff":
            run = end - len(text[:end].rstrip(_REGIONAL))
            if run > 1 or run % 2 == 0:
                return end - run % 2
            end -= 1  # before the run's first indicator: judge what precedes it
            continue
        if not _joined(prev, nxt):
            break
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


def _ranked(pieces: list[str], costs: list[int], budget: int) -> list[int]:
    """The pieces to keep, best first: each text once (a repeated line, footer or
    signature only at its first occurrence), by TextRank, with the first piece (the
    title or opening sentence) first when it costs at most ``_LEAD_SHARE`` of the
    budget."""
    first: dict[str, int] = {}
    for i, piece in enumerate(pieces):
        key = " ".join(piece.split())
        if key:
            first.setdefault(key, i)
    unique = sorted(first.values())
    scores = textrank([pieces[i] for i in unique])
    order = [unique[k] for k in sorted(range(len(unique)), key=lambda k: (-scores[k], k))]
    if unique and costs[unique[0]] <= budget * _LEAD_SHARE:
        order.remove(unique[0])
        order.insert(0, unique[0])
    return order


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
    order = _ranked(pieces, costs, budget)
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
        best = pieces[order[0]] if order else text
        result = hard_cut(_LEADING_BLANK_LINES.sub("", best).rstrip(), budget, count)
        return Condensed(result, 0, len(pieces), count(result), "characters")
    return Condensed(result, len(chosen), len(pieces), count(result), unit)
