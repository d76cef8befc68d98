"""Searching a reply that is not strict JSON as a whole for its answer (steps 2-4 of
the ladder in :mod:`.output`): a leading reasoning block set aside, full-width syntax
turned to ASCII, code fences, then each region :mod:`.scan` finds, read as JSON, as a
Python literal or repaired. Each candidate is settled by :mod:`.settle`; the first
usable one is the answer.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, overload

import orjson

from lockgate.runtime.conform import Fixes
from lockgate.runtime.extract import fenced_spans, lenient_json, python_literal, repair
from lockgate.runtime.scan import (
    ANY_START,
    NOT_READ,
    OBJECT_START,
    Region,
    ascii_syntax,
    may_be_wide,
    regions,
    strict_region,
    wide_bracket,
)
from lockgate.runtime.schema import OutputPlan
from lockgate.runtime.settle import Parsed, ParseStatus, finish, unusable

#: Longest text searched for JSON in chatter (characters); longer ones must be strict
#: JSON as a whole.
MAX_SEARCH = 512 << 10
#: Longest region handed to ``json_repair`` (pure Python, 1-3 ms per KB).
MAX_REPAIR = 128 << 10
#: An object at the start of a line (after text without JSON syntax, if any).
_LINE_START = re.compile(r"\n[^\n\"'{}\[\],]*\{")
_MAX_RESTARTS = 16
#: Regions tried in order; past them, the last :data:`_LAST_REGIONS` of at most
#: :data:`_MORE_REGIONS` more (the time per output stays bounded).
_REGIONS = 64
_MORE_REGIONS = 1024
_LAST_REGIONS = 8
#: One level of string escaping over quotes and backslashes.
_ESCAPED = re.compile(r'\\(["\\])')
#: What an object inside the answer follows: an array's start, a comma, a key (quoted,
#: or a bare name after ``{`` or a comma) and its colon; "Let me redo:" is no key.
_IN_VALUE = re.compile(r"""(?:[\[,]|["']\s*:|[{,]\s*[A-Za-z_$][\w$]*\s*:)\s*\Z""")


def search(text: str, plan: OutputPlan, fixes: Fixes) -> Parsed:
    """Steps 2-9 on a text that is not strict JSON as a whole."""
    start_at = ANY_START if plan.expect == "array" else OBJECT_START
    if len(text) > MAX_SEARCH:
        if start_at.search(text) is None:
            return unusable(ParseStatus.NO_JSON_FOUND, plan,
                            "no JSON object or array in the output")
        return unusable(ParseStatus.INVALID_JSON, plan,
                        f"the output is not JSON as a whole and too long to search "
                        f"({len(text)} characters; the limit is {MAX_SEARCH})")
    if "stripped:think" not in fixes.applied and _OTHER_REASONING.search(text) is not None:
        text = _as_think_tags(text)
    if _REASONING_TAG.search(text) is not None and "stripped:think" not in fixes.applied:
        # Reasoning models put their scratch work first; it may hold drafts of the
        # answer, which are never the answer.
        aside = _set_aside_reasoning(text)
        if aside is not None:
            rest, sure = aside
            inner = fixes.copy()
            inner.repair("stripped:think")
            if not rest.strip():
                if sure:
                    return unusable(
                        ParseStatus.NO_JSON_FOUND, plan,
                        "the output holds only reasoning (<think>...), no answer after "
                        "it: the reply was cut off while thinking (raise max_tokens) "
                        "or ended with its reasoning", (*inner.labels(), "truncated"))
            else:
                found = search(rest, plan, inner)
                if found.usable or sure:
                    return found
    if '\\"' in text and '"' not in text.replace('\\"', "") \
            and "unescaped" not in fixes.applied:
        # JSON written as the inside of a JSON string ({\"a\": 1}), its quotes escaped
        # and none bare: read with its escapes undone.
        inner = fixes.copy()
        inner.repair("unescaped")
        found = search(_ESCAPED.sub(lambda m: m.group(1), text), plan, inner)
        if found.usable:
            return found
    if may_be_wide(text):
        # The usual reply, strict JSON after some chatter, needs no conversion; the
        # conversion could only matter where a full-width bracket came before it.
        first = _search_text(text, plan, fixes, first_strict=True)
        if first is not None:
            return first
    converted = ascii_syntax(text)
    if converted is not text:
        inner = fixes.copy()
        inner.repair("repaired:punctuation")
        found = _search_text(converted, plan, inner)
        if found.usable:
            return found
        plain = _search_text(text, plan, fixes)
        return plain if plain.usable or plain.completeness > found.completeness else found
    return _search_text(text, plan, fixes)


@overload
def _search_text(text: str, plan: OutputPlan, fixes: Fixes) -> Parsed: ...


@overload
def _search_text(text: str, plan: OutputPlan, fixes: Fixes,
                 first_strict: bool) -> Parsed | None: ...


def _search_text(text: str, plan: OutputPlan, fixes: Fixes,
                 first_strict: bool = False) -> Parsed | None:
    """An answer container, then fences, then the whole text. ``first_strict``: only a
    usable first object that is strict JSON and that no full-width bracket precedes,
    else None."""
    start_at = ANY_START if plan.expect == "array" else OBJECT_START
    if not first_strict and "extracted:answer" not in fixes.applied:
        for m in _ANSWER_TAG.finditer(text):
            inner = fixes.copy()
            inner.repair("extracted:answer")
            found = _search_text(m.group(2) if m.group(1) else m.group(4), plan, inner)
            if found.usable:
                return found
    picks: list[Pick] = []
    for start, end, block in fenced_spans(text):
        inner = fixes.copy()
        inner.repair("extracted:fence")
        if first_strict:
            return None if _cued(text, start, end) else \
                _first_strict(block, plan, inner, start_at)
        found = _search_regions(block, plan, inner, start_at)
        if found.usable:
            picks.append((start, end, found))
            if not _more_wanted(text, picks):
                break
    if picks:
        return _chosen(text, picks)
    if first_strict:
        return _first_strict(text, plan, fixes, start_at)
    return _search_regions(text, plan, fixes, start_at)


#: A usable candidate, and where it stands in the text searched.
Pick = tuple[int, int, Parsed]
#: Words that introduce a value as not the answer (an example of the format, a draft),
#: and words that introduce a later one as the answer (a correction, the final one).
_NOT_THE_ANSWER = re.compile(
    r"(?i)\b(?:examples?|e\.g\.|for instance|such as|draft|template|sample|placeholder"
    r"|(?:output|response|answer|expected) format(?: is| would be| looks like)?"
    r"|formatted like)\b|例如|示例|样例|格式为|草稿")
_THE_ANSWER = re.compile(
    r"(?i)\b(?:final(?:ly)?|correct(?:ed|ion)|actually|revised|on second thought"
    r"|in conclusion|my answer|the answer is|the correct (?:answer|output|result|label|json)"
    r"|I (?:pick|choose|select|go with))\b|最终|更正|修正|正确(?:的)?(?:答案|输出|结果)|实际上"
    r"|结论")
#: How far before a value its introduction is looked for (characters).
_INTRO = 160
_MAX_PICKS = 8


def _intro(text: str, picks: list[Pick], i: int) -> tuple[int, int]:
    """The stretch of text that introduces pick ``i``: after the pick before it, at
    most :data:`_INTRO` characters."""
    start = picks[i][0]
    return max(picks[i - 1][1] if i else 0, start - _INTRO), start


def _more_wanted(text: str, picks: list[Pick]) -> bool:
    """Whether to look past the usable values found so far: the first was introduced
    as an example or a draft, or words after the last introduce another as the answer.
    Otherwise the first usable value is the answer (a later one never replaces it)."""
    return len(picks) < _MAX_PICKS and _cued(text, picks[0][0], picks[-1][1])


def _cued(text: str, start: int, end: int) -> bool:
    """Whether words before ``start`` introduce what follows as an example or a draft,
    or words after ``end`` introduce another value as the answer."""
    return _NOT_THE_ANSWER.search(text, max(0, start - _INTRO), start) is not None \
        or _THE_ANSWER.search(text, end) is not None


def _chosen(text: str, picks: list[Pick]) -> Parsed:
    """The answer among usable values: the values introduced as examples or drafts are
    left out (unless that leaves none), then the last one introduced as a correction or
    the final answer, else the first."""
    kept = [i for i in range(len(picks))
            if _NOT_THE_ANSWER.search(text, *_intro(text, picks, i)) is None] \
        or list(range(len(picks)))
    chosen = kept[0]
    for i in kept[1:]:
        if _THE_ANSWER.search(text, *_intro(text, picks, i)) is not None:
            chosen = i
    return picks[chosen][2]


def _first_strict(text: str, plan: OutputPlan, fixes: Fixes,
                  start_at: re.Pattern[str]) -> Parsed | None:
    found = regions(text, start_at, limit=1)
    if not found or found[0].value is NOT_READ or wide_bracket(text, found[0].start) \
            or _cued(text, found[0].start, found[0].end):
        return None
    for value, labels, repaired, _ in _candidates(text, found[0], plan):
        inner = fixes.copy()
        for label in labels:
            inner.repair(label)
        parsed = finish(value, plan, inner, repaired=repaired)
        return parsed if parsed.usable else None
    return None


def _search_regions(text: str, plan: OutputPlan, fixes: Fixes,
                    start_at: re.Pattern[str]) -> Parsed:
    found = regions(text, start_at, _REGIONS)
    if len(found) == _REGIONS and found[-1].closed:
        # Many brace groups first (LaTeX's \frac{a}{b}, a list of examples): the answer
        # usually ends the reply, so the last few regions are tried as well.
        found += regions(text, start_at, _MORE_REGIONS, pos=found[-1].end)[-_LAST_REGIONS:]
    if not found:
        return unusable(ParseStatus.NO_JSON_FOUND, plan, "no JSON object or array in the output")
    failures: list[Parsed] = []
    picks: list[Pick] = []
    for region in found:
        for value, labels, repaired, cut in _candidates(text, region, plan):
            inner = fixes.copy()
            for label in labels:
                inner.repair(label)
            parsed = finish(value, plan, inner, repaired=repaired, cut=cut)
            if parsed.usable:
                picks.append((region.start, region.end if region.closed else len(text),
                              parsed))
                break
            failures.append(parsed)
        if picks and not _more_wanted(text, picks):
            break
    if picks:
        return _chosen(text, picks)
    if not failures:
        if not found[-1].closed:
            return unusable(ParseStatus.INVALID_JSON, plan,
                            "the output was cut off before any value in it finished",
                            (*fixes.labels(), "truncated"))
        return unusable(ParseStatus.INVALID_JSON, plan,
                        "the output holds JSON-like text that could not be read",
                        fixes.labels())
    # The failure that recovered most of the expected fields explains best; the first
    # such one (max keeps the first of equals).
    return max(failures, key=lambda p: (p.completeness,
                                        p.status is ParseStatus.SCHEMA_VIOLATION))


#: (value, fix labels, needed repair?, the cut region it was read from - or None)
Candidate = tuple[Any, tuple[str, ...], bool, Region | None]


def _candidates(text: str, region: Region, plan: OutputPlan) -> Iterator[Candidate]:
    """The values a region may hold, best first."""
    whole = region.start == len(text) - len(text.lstrip()) and (
        not region.closed or region.end == len(text.rstrip()))
    where = () if whole else ("extracted:chatter",)
    if region.closed:
        if region.value is not NOT_READ:
            yield region.value, where, False, None
            return
        body = text[region.start:region.end]
        yield from _restarts(text, region)
        yield from _read(body, where, None, strict=False)
        return
    own: Iterator[Candidate] = iter(())
    if plan.keep_truncated:
        own = _read(text[region.start:] + region.tail, (*where, "truncated"), None)
    elif region.safe_end > region.start + 1:  # some value finished before the cut
        own = _read(region.trimmed(text), (*where, "truncated"), region)
    inner = (c for s, e in region.inner
             for c in _read(text[s:e], ("extracted:chatter",), None, repair_it=False))
    if text[region.start] == "[" and plan.expect != "array":
        # A bracket that never closes before the end: the complete objects in it first
        # (the first of them is the answer, as for an array of objects).
        yield from inner
        yield from own
    else:
        yield from own
        yield from inner


def _restarts(text: str, region: Region) -> Iterator[Candidate]:
    """Complete objects that begin a line inside a region that is not JSON as written:
    the model started over after an answer it did not finish (``{"a": "cut`` then a
    new line and a whole object). They come before a repair of the region, which would
    mix the two."""
    for tried, m in enumerate(_LINE_START.finditer(text, region.start + 1, region.end)):
        if tried >= _MAX_RESTARTS:
            return
        if _IN_VALUE.search(text, max(region.start, m.start() - 256), m.start()):
            continue  # an element or a member's value of the region, not a restart
        inner = strict_region(text, m.end() - 1)
        if inner is not None and inner.end <= region.end:
            yield inner.value, ("extracted:chatter",), False, None


def _read(body: str, labels: tuple[str, ...], cut: Region | None, *, strict: bool = True,
          repair_it: bool = True) -> Iterator[Candidate]:
    """The value of one region's text: strict JSON, a Python literal, or repaired."""
    cut_off = "truncated" in labels
    if strict:
        try:
            yield orjson.loads(body), labels, cut_off, cut
            return
        except orjson.JSONDecodeError:
            pass
    lenient = lenient_json(body)
    if lenient is not None:
        yield lenient, (*labels, "repaired:json"), True, cut
        return
    literal = python_literal(body)
    if literal is not None:
        yield literal, (*labels, "repaired:python"), True, cut
        return
    if repair_it and len(body) <= MAX_REPAIR:
        value = repair(body)
        if value is not None:
            yield value, (*labels, "repaired:json"), True, cut


#: The tags that hold the answer itself (searched first, in order).
_ANSWER_TAG = re.compile(r"(?is)<(answer|final_answer|final|output|result)>(.*?)</\1>"
                         r"|<\|begin_of_solution\|>()(.*?)<\|end_of_solution\|>")
#: The tags reasoning models wrap their scratch work in.
_TAGS = r"think|thinking|thought|thoughts|reasoning|scratchpad|analysis|seed:think"
_REASONING_TAG = re.compile(rf"(?i)</?(?:{_TAGS})>")
_CLOSE_TAG = re.compile(rf"(?i)</(?:{_TAGS})>")
#: A reasoning block that opens a line (or follows another): closed, or cut off at the
#: end of the output.
_THINK_BLOCK = re.compile(
    rf"(?im)(?:^|(?<=>))[ \t]*<({_TAGS})>(?s:.*?)(?:</\1>|\Z)")
#: Reasoning marked otherwise than by a tag, each read as ``<think>...</think>``:
#: Kimi's ``◁think▷``, Magistral's ``[THINK]``, ``<|begin_of_thought|>``, the
#: analysis channel of gpt-oss's harmony format left unparsed (and its other tokens),
#: and Ollama's ``Thinking...`` / ``...done thinking.`` lines.
_OTHER_REASONING = re.compile(
    r"◁/?think▷|\[/?THINK\]|<\|(?:begin|end)_of_thought\|>|<\|channel\|>"
    r"|(?m:^[ \t]*(?:Thinking\.\.\.|\.\.\.done thinking\.)[ \t]*$)")
_HARMONY_ANALYSIS = re.compile(
    r"(?s)<\|channel\|>\s*(?:analysis|commentary)\b[^<]*<\|message\|>(.*?)"
    r"(?:<\|end\|>|(?=<\|start\|>)|\Z)")
_HARMONY_TOKENS = re.compile(
    r"<\|start\|>\s*assistant|<\|channel\|>\s*final\b[^<]*<\|message\|>|<\|(?:return|end|call)\|>")
#: A block in one of the bracketed forms: its opener begins a line, and it is closed.
_MARKED_BLOCK = re.compile(
    r"(?m)^[ \t]*(?:◁think▷(?s:(.*?))◁/think▷|\[THINK\](?s:(.*?))\[/THINK\]"
    r"|<\|begin_of_thought\|>(?s:(.*?))<\|end_of_thought\|>)")
_OLLAMA = re.compile(r"(?m)^[ \t]*Thinking\.\.\.[ \t]*\n(?s:(.*?))"
                     r"^[ \t]*\.\.\.done thinking\.[ \t]*$")


def _as_think_tags(text: str) -> str:
    """``text`` with the reasoning markers of :data:`_OTHER_REASONING` as ``<think>``
    tags, and the harmony format's other tokens removed."""
    text = _MARKED_BLOCK.sub(
        lambda m: f"<think>{next(g for g in m.groups() if g is not None)}</think>", text)
    if "<|channel|>" in text:
        text = _HARMONY_ANALYSIS.sub(lambda m: f"<think>{m.group(1)}</think>\n", text)
        text = _HARMONY_TOKENS.sub("\n", text)
    if "done thinking." in text:
        text = _OLLAMA.sub(lambda m: f"<think>{m.group(1)}</think>", text)
    return text


def _set_aside_reasoning(text: str) -> tuple[str, bool] | None:
    """The reply without its reasoning (``<think>...</think>`` blocks - or
    ``<thinking>``, ``<reasoning>`` -, one cut off at the end included, and a headless
    block: the part before a first closing tag that no opening tag opens, as when the
    chat template opened it in the prompt), and whether that is certain; None when
    there is no reasoning. Not certain: a headless block with JSON syntax in it, which
    might instead be an answer holding the text ``</think>`` (the caller then searches
    the whole output if the rest holds no answer)."""
    rest, sure = text, True
    close = _CLOSE_TAG.search(text)
    end = -1 if close is None else close.start()
    if close is not None and _THINK_BLOCK.search(text, 0, close.end()) is None:
        head = text[:end]
        sure = "{" not in head and "[" not in head
        rest = text[close.end():]
    rest, blocks = _THINK_BLOCK.subn("", rest)
    if not blocks and close is None:
        return None
    return rest, sure
