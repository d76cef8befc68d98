"""Searching a reply that is not strict JSON as a whole for its answer (steps 2-4 of
the ladder in :mod:`.output`): a leading reasoning block set aside, full-width syntax
turned to ASCII, code fences, then each region :mod:`.scan` finds, read as JSON, as a
Python literal or repaired. Each candidate is settled by :mod:`.settle`; the first
usable one is the answer.
"""

from __future__ import annotations

import itertools
import json
import re
from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar, overload

import orjson

from lockgate.runtime.conform import Fixes
from lockgate.runtime.extract import (
    bare_values,
    escape_apostrophes,
    fenced_spans,
    lenient_json,
    python_literal,
    repair,
    too_costly,
)
from lockgate.runtime.finish import EXTRACTED_FROM_CUT, ended_inside, first_open
from lockgate.runtime.scan import (
    ANY_START,
    NOT_READ,
    OBJECT_START,
    Region,
    ascii_syntax,
    escape_inner_quotes,
    last_regions,
    may_be_wide,
    plain_blanks,
    regions,
    strict_region,
    string_closes,
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
#: Regions tried in order; past them, the last :data:`_LAST_REGIONS` of the text
#: (however many come between: they are only scanned, in one linear pass; the time
#: per output stays bounded).
_REGIONS = 64
_LAST_REGIONS = 8
_T = TypeVar("_T")
#: One level of string escaping over quotes and backslashes.
_ESCAPED = re.compile(r'\\(["\\])')
#: What an object inside the answer follows: an array's start, a comma, a key (quoted,
#: or a bare name after ``{`` or a comma) and its colon; "Let me redo:" is no key.
_IN_VALUE = re.compile(r"""(?:[\[,]|["']\s*:|[{,]\s*[A-Za-z_$][\w$]*\s*:)\s*\Z""")


def search(text: str, plan: OutputPlan, fixes: Fixes) -> Parsed:
    """Steps 2-9 on a text that is not strict JSON as a whole."""
    found = _search(text, plan, fixes)
    if (found.truncated or not found.usable) and '\\"' in text \
            and "decoded:string" not in fixes.applied and len(text) <= MAX_SEARCH:
        # No answer as written, or one cut off: the answer may be a JSON string holding
        # it (encoded twice), whose escaped quotes the scan read as cut off.
        decoded = _encoded(text, plan, fixes)
        if decoded is not None and not decoded.truncated and (
                decoded.usable or not found.usable):
            # (a failure of the decoded answer explains better than a cut read of its
            # escaped quotes)
            return decoded
    return found


def _search(text: str, plan: OutputPlan, fixes: Fixes) -> Parsed:
    start_at = ANY_START if plan.expect == "array" else OBJECT_START
    if len(text) > MAX_SEARCH:
        if start_at.search(text) is None:
            return unusable(ParseStatus.NO_JSON_FOUND, plan,
                            "no JSON object or array in the output")
        return unusable(ParseStatus.INVALID_JSON, plan,
                        f"the output is not JSON as a whole and too long to search "
                        f"({len(text)} characters; the limit is {MAX_SEARCH})")
    blanks_plain = plain_blanks(text)
    if blanks_plain is not text:
        # Unicode spaces and format characters between tokens: JSON's own whitespace.
        text, fixes = blanks_plain, fixes.copy()
        fixes.repair("repaired:whitespace")
    if "stripped:think" not in fixes.applied and _OTHER_REASONING.search(text) is not None:
        text = _as_think_tags(text)
    if _REASONING_TAG.search(text) is not None and "stripped:think" not in fixes.applied:
        found = _without_reasoning(text, plan, fixes)
        if found is not None:
            return found
    if "stripped:think" not in fixes.applied:
        found = _after_reasoning_label(text, plan, fixes)
        if found is not None:
            return found
    found = _unescaped(text, plan, fixes)
    if found is not None:
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


#: ``&quot;`` standing where JSON syntax is: after an opening bracket, a colon or a
#: comma, or before a colon, a comma or a closing bracket.
_HTML_SYNTAX = re.compile(r"[{\[:,]\s*(?:&quot;|&#34;|&#x22;)|(?:&quot;|&#34;|&#x22;)\s*[:,}\]]",
                          re.I)
#: An HTML tag (its attributes may hold quotes: ``<code class="language-json">``).
_HTML_TAG = re.compile(r"</?[A-Za-z][\w-]*(?:\s+[\w:-]+(?:\s*=\s*(?:\"[^\"<>]*\"|'[^'<>]*'"
                       r"|[^\s\"'<>]+))?)*\s*/?>")
_HTML_CHARS = {"&quot;": '"', "&#34;": '"', "&#x22;": '"', "&amp;": "&", "&lt;": "<",
               "&gt;": ">", "&#39;": "'", "&#x27;": "'", "&apos;": "'"}
_HTML_ENTITY = re.compile("|".join(_HTML_CHARS), re.I)
#: A JSON string that holds an object or an array (the answer encoded twice), standing
#: on its own: first on its line (after a fence's line, or words without JSON syntax).
_ENCODED = re.compile(r'(?m)^[^\n"{}\[\],]*?("[ \t]*[{\[](?:[^"\\\n]|\\.)*")[ \t.]*$')


def _encoded(text: str, plan: OutputPlan, fixes: Fixes) -> Parsed | None:
    """The answer in a JSON string that holds it (``"{\\"a\\": 1}"`` in a fence or after
    some words), decoded; else why the first such string is not one (when its decoded
    text was not cut off); None when there is none."""
    failure: Parsed | None = None
    for m in _ENCODED.finditer(text):
        try:
            decoded = orjson.loads(m.group(1))
        except orjson.JSONDecodeError:
            continue
        if not isinstance(decoded, str):
            continue
        inner = fixes.copy()
        inner.repair("decoded:string")
        if m.group(1) != text.strip():
            inner.repair("extracted:chatter")
        found = search(decoded, plan, inner)
        if found.usable:
            return found
        if failure is None and not found.truncated:
            failure = found
    return failure


def _without_reasoning(text: str, plan: OutputPlan, fixes: Fixes) -> Parsed | None:
    """The answer after the reasoning is set aside (reasoning models put their scratch
    work first; it may hold drafts of the answer, which are never the answer); None to
    search the whole text."""
    aside = _set_aside_reasoning(text)
    if aside is None:
        return None
    rest, sure, cut = aside
    inner = fixes.copy()
    inner.repair("stripped:think")
    if not rest.strip():
        if not sure:
            return None
        return unusable(
            ParseStatus.NO_JSON_FOUND, plan,
            "the output holds only reasoning (<think>...), no answer after it: the reply "
            "was cut off while thinking (raise max_tokens) or ended with its reasoning",
            (*inner.labels(), "truncated"))
    found = search(rest, plan, inner)
    if not found.usable and cut and sure:
        # A block the output ends inside: whatever came before it, the reply was cut
        # off while thinking.
        return unusable(
            ParseStatus.NO_JSON_FOUND, plan,
            "the output ends inside its reasoning (<think>...) with no answer before it: "
            "the reply was cut off while thinking (raise max_tokens)",
            (*inner.labels(), "truncated"))
    # (an answer cut off after the reasoning is the answer, cut: the draft in the
    # reasoning is never read in its place)
    return found if found.usable or sure or ended_inside(found) else None


#: A line-start label (Markdown heading, bold or a quote mark around it allowed), then
#: a colon, or the end of the line for a heading or a bold label.
_LINE_LABEL = (r"(?m:^)[ \t]*(?:>[ \t]*)?(#{{1,6}}[ \t]*|[*_]{{1,3}})?[ \t]*(?:{words})"
               r"[ \t]*[*_]{{0,3}}[ \t]*(?:[:：][*_]{{0,3}}|(?(1)(?=[ \t]*\n)|(?!)))")
#: A section of reasoning labelled as such: "Reasoning:", "Thought:", "## Thinking",
#: "**Analysis:**", ``reasoning_content:``, and their words in other languages.
_REASONING_LABEL = re.compile(_LINE_LABEL.format(words=(
    r"(?:(?i:reasoning(?:_content)?|thoughts?|thinking|think|chain[ \t]of[ \t]thought|rationale"
    r"|scratch[ \t]?pad|analysis|reflection|deliberation"
    r"|überlegungen?|gedanken|begründung|raisonnement|réflexion|razonamiento|pensamiento"
    r"|ragionamento|raciocínio|pensamento|рассуждени[ея]|размышлени[ея]|мысли|rozumowanie"
    r"|düşünce|redenering|التفكير|الاستدلال)"
    r"|思考(?:过程|過程)?|推理(?:过程|過程)?|考え(?:方)?|推論|考察|생각|추론|사고[ \t]?과정)"
    r"(?:[ \t]+(?i:process|steps?|notes?))?")))
#: The label of the answer after such a section ("Answer:", "Output:", "## Final
#: answer", ``content:``), right before its value.
_ANSWER_LABEL = re.compile(_LINE_LABEL.format(words=(
    r"(?i:(?:final[ \t]+)?(?:answer|output|response|result|json)|content|final"
    r"|(?:endgültige[ \t]+)?(?:antwort|ausgabe)|réponse(?:[ \t]+finale)?|sortie"
    r"|respuesta(?:[ \t]+final)?|salida|risposta(?:[ \t]+finale)?|resposta(?:[ \t]+final)?"
    r"|saída|(?:окончательный[ \t]+)?ответ|вывод|результат|odpowiedź|wynik|cevap|çıktı"
    r"|antwoord|uitvoer|الإجابة|الجواب|الناتج)"
    r"|(?:最终)?(?:答案|回答|输出|結果|结果)|答え|出力|最終回答|답변|답|출력|결과"))
    + r"[\s*_]*(?:```[\w+.-]*\s*)?(?=[{\[｛［])")


def _after_reasoning_label(text: str, plan: OutputPlan, fixes: Fixes) -> Parsed | None:
    """The answer after a labelled reasoning section: a reply that opens with a section
    labelled as reasoning ("Reasoning: I think {...}", "## Thinking", 思考过程：) and
    then gives a value under an answer label ("Answer: {...}", "## Answer", 答案：) is
    read from that label on: a value in the reasoning is a draft, as in ``<think>``.
    None when the reply is not so made (a reasoning label after the first value, no
    answer label after it) or nothing usable follows the answer label."""
    first = ANY_START.search(text)
    if first is None:
        return None
    reasoning = _REASONING_LABEL.search(text, 0, first.start())
    if reasoning is None:
        return None
    answer = _outside_values(text, reasoning.end(), itertools.islice(
        _ANSWER_LABEL.finditer(text, reasoning.end()), _MAX_LABELS))
    if answer is None or ANY_START.search(text, reasoning.end(), answer.start()) is None:
        return None  # (no value in the reasoning: the search finds the answer's)
    inner = fixes.copy()
    inner.repair("stripped:think")
    found = search(text[answer.end():], plan, inner)
    if not found.usable:
        return None
    if _BARE_BODY.match(text, reasoning.end(), first.start()) is not None:
        # The section's body is a value right under its label ("## Analysis\n```json
        # {...}```"): it may be the answer itself, a later labelled value only a part
        # of it. The later value is the answer when it declares every declared field
        # the first one does.
        draft = search(text[first.start():answer.start()], plan, fixes.copy())
        if draft.usable and not _covers(found.value, draft.value, plan):
            return None
    return found


#: Answer labels looked at after a reasoning label.
_MAX_LABELS = 8
#: Nothing but space, Markdown and a fence's opening line between a label and its value.
_BARE_BODY = re.compile(r"[\s*_]*(?:```[\w+.-]*\s*)?\Z")


def _outside_values(text: str, begin: int,
                    labels: Iterable[re.Match[str]]) -> re.Match[str] | None:
    """The first of ``labels`` (in order) that stands outside every value opening after
    ``begin`` (bracket depth 0; brackets in a value's strings are skipped): an answer
    label is never a key of the value before (``answer: {...}`` inside a JSON5
    object). One pass over the text."""
    depth = 0
    quote = ""
    i = begin
    for label in labels:
        at = label.start()
        while i < at:
            c = text[i]
            if quote:
                if c == "\\":
                    i += 1
                elif c == quote or c == "\n":
                    quote = ""
            elif c in "{[":
                depth += 1
            elif c in "}]":
                depth = max(0, depth - 1)
            elif depth and c in "\"'":
                quote = c
            i += 1
        if depth == 0:
            return label
    return None


def _covers(value: Any, draft: Any, plan: OutputPlan) -> bool:
    """Whether ``value`` declares every declared field ``draft`` declares (anything but
    two objects: yes)."""
    if not isinstance(value, dict) or not isinstance(draft, dict):
        return True
    fields = set(plan.fields)
    return {k for k in draft if k in fields} <= set(value)


def _unescaped(text: str, plan: OutputPlan, fixes: Fixes) -> Parsed | None:
    """The answer in JSON whose quotes are all escaped (as HTML entities, or as the
    inside of a JSON string); None when there is none."""
    if "&" in text and "repaired:html" not in fixes.applied \
            and '"' not in (_HTML_TAG.sub("", text) if "<" in text else text) \
            and _outside_strings(_HTML_SYNTAX.finditer(text), text):
        # JSON written into HTML with its quotes as entities ({&quot;a&quot;: 1},
        # {&#34;a&#34;: 1}), none bare but in the attributes of its tags (<code
        # class="language-json">): read with the entities undone (not when they are
        # only inside the single-quoted strings of a Python literal: {'a': 'he typed
        # {&quot;x&quot;'}).
        inner = fixes.copy()
        inner.repair("repaired:html")
        found = search(_HTML_ENTITY.sub(lambda m: _HTML_CHARS[m.group().lower()], text),
                       plan, inner)
        if found.usable or found.status is ParseStatus.SCHEMA_VIOLATION:
            # (read, but not the answer: the text as written, all entities, holds no
            # better reading, and repairing it costs milliseconds a KB for nothing)
            return found
    if '\\"' in text and '"' not in text.replace('\\"', "") \
            and "unescaped" not in fixes.applied:
        # JSON written as the inside of a JSON string ({\"a\": 1}), its quotes escaped
        # and none bare: read with its escapes undone.
        inner = fixes.copy()
        inner.repair("unescaped")
        found = search(_string_body(text), plan, inner)
        if found.usable:
            return found
    return None


#: One JSON string escape (a backslash and the character it escapes, or ``\uXXXX``), a
#: surrogate pair's two ``\uXXXX`` as one (group 2 its low half).
_STRING_ESCAPE = re.compile(
    r'\\(["\\/bfnrt]|u[dD][89abAB][0-9a-fA-F]{2}(?:\\(u[dD][c-fC-F][0-9a-fA-F]{2}))?'
    r'|u[0-9a-fA-F]{4})')
_ESCAPE_CHARS = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n",
                 "r": "\r", "t": "\t"}


def _string_body(text: str) -> str:
    """``text`` read as the inside of a JSON string: its escapes decoded (``\\n`` a line
    break, ``\\"`` a quote, ``\\u00e9`` é), line breaks written as they are kept. Where
    it is not one as a whole (a backslash that escapes nothing), each valid escape is
    decoded and the rest kept as written."""
    try:
        body = json.loads(f'"{text}"', strict=False)
    except ValueError:
        pass
    else:
        if isinstance(body, str):
            return body
    return _STRING_ESCAPE.sub(_escaped_char, text)


def _escaped_char(m: re.Match[str]) -> str:
    """The character one :data:`_STRING_ESCAPE` match stands for: a surrogate pair's
    two escapes one character (``\\ud83d\\ude00`` 😀), a lone surrogate's escape kept
    as written."""
    escape, low = m.group(1), m.group(2)
    if escape in _ESCAPE_CHARS:
        return _ESCAPE_CHARS[escape]
    code = int(escape[1:5], 16)
    if low is not None:
        return chr(0x10000 + ((code - 0xD800) << 10) + int(low[1:], 16) - 0xDC00)
    return m.group() if 0xD800 <= code <= 0xDFFF else chr(code)


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
        tagged = _in_answer_tags(text, plan, fixes)
        if tagged is not None:
            return tagged
    picks: list[Pick] = []
    for start, end, block in _bounded(fenced_spans(text)):
        inner = fixes.copy()
        inner.repair("extracted:fence")
        if first_strict:
            return None if _cued(text, start, end) else \
                _first_strict(block, plan, inner, start_at)
        found = _search_regions(block, plan, inner, start_at)
        if found.usable and found.truncated and end < len(text.rstrip()):
            # The fence closed inside the value ("```" on a line of a string that holds
            # line breaks): the value is read from the text, across the fence's end.
            whole = _search_regions(text[text.index(block, start):], plan, inner, start_at)
            if whole.usable and not whole.truncated:
                found = whole
        if found.usable:
            picks.append((start, end, found))
            if not _more_wanted(text, picks):
                break
    if picks:
        if all(_not_the_answer(text, s, picks[i - 1][1] if i else 0)
               for i, (s, _e, _p) in enumerate(picks)):
            # Every fenced value is an example (or a draft...): a value outside the
            # fences may be the answer.
            outside = _region_picks(text, plan, fixes, start_at)[0]
            if any(not _not_the_answer(text, s, outside[i - 1][1] if i else 0)
                   for i, (s, _e, _p) in enumerate(outside)):
                return _answer(text, outside, plan, fixes)
        return _answer(text, picks, plan, fixes)
    if first_strict:
        return _first_strict(text, plan, fixes, start_at)
    return _search_regions(text, plan, fixes, start_at)


def _bounded(found: list[_T]) -> list[_T]:
    """The fences (or containers) tried, as for regions: the first :data:`_REGIONS`,
    then the last :data:`_LAST_REGIONS` (each may cost a repair: the time per output
    stays bounded however many a reply holds)."""
    if len(found) <= _REGIONS + _LAST_REGIONS:
        return found
    return found[:_REGIONS] + found[-_LAST_REGIONS:]


def _in_answer_tags(text: str, plan: OutputPlan, fixes: Fixes) -> Parsed | None:
    """The answer in an answer container: the first usable one, unless a later one is
    introduced as a correction ("Wait, correction: <answer>...</answer>")."""
    picks: list[Pick] = []
    for start, end, body in _bounded(list(_answer_containers(text))):
        inner = fixes.copy()
        inner.repair("extracted:answer")
        found = _search_text(body, plan, inner)
        if found.usable:
            picks.append((start, end, found))
            if not _more_wanted(text, picks):
                break
    return _answer(text, picks, plan, fixes) if picks else None


#: A usable candidate, and where it stands in the text searched.
Pick = tuple[int, int, Parsed]
#: How far before a value its introduction is looked for (characters), and how far
#: before it a correction may stand (after the value before it).
_INTRO = 160
_CORRECTION_REACH = 320
_MAX_PICKS = 8
#: What may stand between an introduction and its value: space, a fence's opening
#: line, an answer tag, Markdown emphasis, an opening quote.
_LEAD_OUT = re.compile(r"(?:\s|```[\w+.-]*|<[A-Za-z_|][\w|:-]*>|[*_>#`\"'“(])*\Z")
#: Where a sentence ends (its next one starts after the match).
_SENTENCE_END = re.compile(r"[.!?…](?=[\s\"')*_]|\Z)|[。！？\n]")
#: Where a clause starts: the start of the text, right after a value (a closing
#: bracket, tag or fence), or after a sentence's end, a line break, a comma, a colon or
#: a semicolon (space, Markdown and quotes skipped).
_CLAUSE = r"(?:^|(?<=[.!?…。！？\n,;:，；：、،}\]>`]))[\s*_#>\"'“(\-]*"
#: The same as a lookbehind of one character (a clause's end, or what may follow one):
#: the run of space, Markdown and quotes before the word is checked by
#: :func:`_clause_start` instead, so that a search never rescans a long run of blank
#: lines at each of its positions (quadratic); then the first letter of a phrase of
#: :data:`_CORRECTION` (a cheap test first).
_CLAUSE_AT = (r"(?:^|(?<=[.!?…。！？\n,;:，；：、،}\]>`\s*_#\"'“(\-]))"
              r"(?=[A-Za-z\u00c0-\u024f\u0400-\u04ff\u0600-\u06ff\u0900-\u097f\uac00-\ud7af"
              r"最更修改纠正实実结等不重訂待订我错搞弄写说看想判理标分再上之前刚以第間勘誤])")
_CLAUSE_ENDS = frozenset(".!?…。！？\n,;:，；：、،}]>`")
_CLAUSE_SKIPS = frozenset("*_#>\"'“(-")
#: Words in a qualifier that say the value is revised, final, filled in, a numbered
#: version or made for this input (:data:`_QUALIFIER`): a label so qualified
#: ("Draft (v2):", "Entwurf (überarbeitet):", "草稿（最终版）：") is none of an example
#: or a draft.
_DONE_QUALIFIER = (
    r"(?i:(?<![\w'’])(?:revis\w*|überarbeit\w*|corrig\w*|corregid\w*|correct\w*|corret\w*"
    r"|korrigiert\w*|gecorrigeerd\w*|исправлен\w*|poprawion\w*|düzeltil\w*|updated"
    r"|aktualisiert\w*|actualizad\w*|aggiornat\w*|fixed|final\w*|endgültig\w*"
    r"|definitiv\w*|definitie\w*|ostateczn\w*|окончательн\w*|финальн\w*|son hali|nihai"
    r"|filled(?: in)?|ausgefüllt\w*|rempli\w*|rellenad\w*|compilat\w*|preenchid\w*"
    r"|ingevuld\w*|заполненн\w*|wypełnion\w*|doldurul\w*|versi[oó]n\w*|versione"
    r"|versão|versie|wersj\w*|верси\w*|sürüm\w*|v\d+"
    r"|dein\w*|ihr\w*|your|yours|votre|vos|ton|ta|tes|su|sus|tu|tus|vostr\w*|tuo|tua"
    r"|seu|sua|jouw|uw|tw\w*j|wasz\w*|ваш\w*|тво\w*|sizin|senin|this input)(?![\w'’])"
    r"|最終|最终|최종|修正|訂正|修改|更正|改正|纠正|수정|정정|記入|填写|작성된|版|버전|今回|あなた|您的|你的|당신"
    r"|이번)")
_DONE_BRACKET = r"(?![^\n]*[(（][^()（）\n]*" + _DONE_QUALIFIER + r")"
#: A value introduced as an example of the format, a draft or a template: the
#: introduction (the sentence right before the value) is a label made of such words
#: ("Example:", "Sample output:", "Draft:", "Schema:", "Reference output:"), or it
#: ends with them ("..., e.g.", "The output format is", "for instance:").
_EXAMPLE_LABEL = re.compile(
    r"(?i)^" + _DONE_BRACKET + r"[\s*_#>\-]*(?:(?:here(?:'s| is| are)|below is|this is)\s+)?"
    r"(?:(?:an?|the|some|one|another|my)\s+)?"
    r"(?:examples?|samples?|illustrations?|templates?|placeholders?|drafts?|dummy|mock"
    r"|schemas?|references?"
    r"|for (?:example|instance)|e\.g\.|(?:expected |output |response |answer |json )*"
    r"format)\b(?:[\s,]+(?!(?:is|are|was|were|gives?|yields?|returns?|shows?)\b)"
    r"[\w().-]+){0,4}?[\s*_]*[:：,]?[\s*_]*\Z")
_EXAMPLE_END = re.compile(
    r"(?i)(?:\bfor (?:example|instance)|\be\.g\.|\bi\.e\.|\bsuch as|\bas an example"
    r"|\b(?:an?|another|one more|some|more)\s+examples?|\bsample (?:output|response|answer"
    r"|json|result)s?|\bdrafts?|\b(?:(?:output|response|answer|expected|json|required"
    r"|following|this|that) format|\b(?:expected|required|following|this|that) structure)"
    r"(?:\s+(?:is|would be|looks like|like|as follows|should be))?"
    r"|\b(?:should|must|would|will) look like(?:\s+(?:this|so|the following))?"
    r"|\bformat(?:ted)? (?:like|as))[\s*_]*[:：,]?[\s*_]*\Z"
    r"|^" + _DONE_BRACKET + r"[\s*_#>\-]*(?:例如|比如|譬如|示例|样例|范例|草稿|举例)"
    r"|(?:例如|比如|示例|样例|范例|格式为|格式如下|格式是|草稿)[\s*_]*[:：，,]?\s*\Z")
#: A value introduced as the input (the model echoing what it was given), not its
#: answer: "Input:", "Query:", "Given:", "User message:".
_INPUT_LABEL = re.compile(
    r"(?i)^[\s*_#>\-]*(?:the\s+|your\s+)?(?:input|query|question|prompt|request|given"
    r"|original|user(?: input| message| query)?|输入|问题|原文)(?:\s+(?:json|object|data|"
    r"record|text|message|was|is))?[\s*_]*[:：][\s*_]*\Z")
#: A value introduced by a condition, a counterfactual or a contrast: what the answer
#: would be otherwise, not what it is.
_HYPOTHETICAL = re.compile(
    r"(?i)\b(?:if|unless|suppose|supposing|assuming|had (?:it|they|this|that|he|she|the"
    r" \w+) been|were (?:it|they|this|that)|would(?:n't)?|would've|could(?: have)?"
    r"|might|otherwise|opposite|(?:in|by|for) contrast|contrast(?:ing)?|instead of"
    r"|for comparison|compared (?:to|with)|as opposed to|whereas|alternative(?:ly)?"
    r"|another possib\w*|hypothetical(?:ly)?)\b|如果|假如|假设|要是|若是|否则|相反|对比|反之|的话")
#: A correction, or the final answer: a phrase that starts a clause between the value
#: before and this one ("Actually,", "Wait, I misread.", "Let me fix that:",
#: "Updated answer:", "Final answer:", "On second thought", "更正：").
_CORRECTION = re.compile(
    _CLAUSE_AT + r"(?i:(?:(?:and|so|but|however|instead|rather|yet|ok(?:ay)?|hmm+|well|now"
    r"|then|here(?:'s| is| are)|this is|the|my|a|an)[,\s]+){0,4}"
    r"(?:actually|correction|wait|hold on|oops|sorry|no,? wait|not quite"
    r"|(?:that|this|it)(?:'s| is| was) (?:wrong|incorrect|not right)"
    r"|(?:revised|corrected|updated|fixed|amended)\b"
    r"|scratch that|ignore (?:that|this|the (?:above|previous|first|last)(?: one)?)"
    r"|my (?:mistake|bad|apologies|error)|let me (?:fix|correct|redo|re-do|revise|update"
    r"|try (?:that |this |it )?again|reconsider|re-?check|re-?evaluate|re-?examine)"
    r"|I (?:misread|misunderstood|mislabel\w*|made (?:a|an) (?:mistake|error)"
    r"|was wrong|got (?:it|that|this) wrong|need to (?:correct|fix|revise)|stand corrected)"
    r"|on (?:second|further) (?:thought|reflection)|(?:upon|after|on) (?:re-?checking"
    r"|re-?reading|reflection|review(?:ing)?|reconsider\w*|a closer look|closer inspection)"
    r"|(?:final|correct|new|actual|right|real)\s+(?:answer|output|result|version|json"
    r"|label|response|classification|object|list)|final(?:ly)?|in conclusion|to conclude"
    r"|so the (?:final )?answer|the answer is|my (?:final )?answer"
    # a conclusion: a connective, then the answer named ("Therefore the output is:",
    # "Hence the final output:", "Thus, my classification"), or the connective alone as
    # the label right before the value ("Thus:", "Hence:" - group ``label``)
    r"|(?:therefore|thus|hence|consequently|so|accordingly)[,\s]+(?:(?:the|my|our)[ \t]+)?"
    r"(?:final[ \t]+)?(?:answer|output|result|label|classification|response|verdict|json)"
    r"|I(?:'ll| will)? (?:pick|choose|select|go with))\b"
    r"|最终|更正|修正(?!前)|改正|纠正|正确(?:的)?(?:答案|输出|结果)|实际上|结论|等等|不对"
    # (after 我, "我重新检查了一下", told as finely as the group ``near``: :func:`_added`)
    r"|(?P<we>我们?)?重新"
    # words that take the value before back only where they introduce the later one
    # (:data:`_NEAR_TAIL`): "I misclassified it." and "I got it wrong", "let me check
    # again", "the above is wrong", "the correct output", "again" in Chinese (我搞错了,
    # 错了, 再确认一下, 上面的有误, 订正), Japanese (間違えました, 正しい出力), Korean
    # (잘못했습니다, 틀렸어요, 다시, 올바른 답변) and Arabic (الصحيح); not in "顾客说
    # 我搞错了尺码" or "間違いでしたら"
    r"|(?P<near>I[ \t]+(?:misclassifi|miscategori[sz])\w*"
    r"|(?:我们?)?(?:(?:搞|弄|写|说|看|想|判断|理解|标注?|分类)?错了|再次?(?:确认|检查|核对|核实))"
    r"|(?:上面|上述|之前|前面|刚才|以上|第一个)(?:的|那个|这个)?(?:答案|结果|输出|回答|判断"
    r"|json)?(?:有误|有错|错了|不对|是错的|不正确|有问题)|订正"
    r"|間違(?:え(?:まし)?た|いでした|って(?:い)?(?:まし)?た)(?!ら)|誤りでした(?!ら)"
    r"|勘違い(?:しました|でした)(?!ら)"
    r"|(?:제가[ \t]?)?(?:잘못(?:했|됐|되었|봤|읽었)|틀렸)(?:습니다|어요|네요)"
    r"|正しい(?:出力|回答|答え|結果|値|ラベル|分類|もの)(?:は)?|다시"
    r"|올바른[ \t]?(?:답변|답|결과|출력)|الصحيح|الصواب|الأصح)"
    # English beyond the above
    r"|(?i:(?:the[ \t]+)?(?:above|previous|first|earlier)(?:[ \t]+(?:one|output|answer"
    r"|result|json))?[ \t]+(?:(?:is|was)[ \t]+(?:wrong|incorrect|not right|not correct|mistaken"
    r"|erroneous|an? (?:error|mistake))|(?:had|has|contains|contained)[ \t]+(?:an?[ \t]+)?"
    r"(?:error|mistake|typo|bug)s?))"
    # a label only, right before a value (:data:`_LABEL_TAIL`, :func:`_correction`):
    # "Hmm, no", "Never mind, it should be", "Disregard the previous output. Correct"
    # (not "Never mind, I see ...: {"), and a correction or the final answer in de, fr,
    # es, it, pt, ru, nl, pl, tr, ar, ja, ko ("Korrektur: {", not "Korrektur: keine
    # nötig", "수정 전:")
    r"|(?P<label>(?i:hmm+,?[ \t]+no|fix|errat(?:um|a)|amendment|revision"
    r"|therefore|thus|hence|consequently"
    r"|never[ \t]?mind(?:[ \t]*[,.!:—–][ \t]*(?:(?:it|that|this|the[ \t]+(?:answer|output"
    r"|label|result))[ \t]+(?:should be|is|was)|here(?:'s|’s| is)[ \t]+the[ \t]+(?:right"
    r"|correct|corrected|new|final|actual)[ \t]+(?:one|answer|output|version|json|result)))?"
    r"|disregard[ \t]+(?:that|this|it|the[ \t]+(?:above|previous|first|last|earlier)"
    r"(?:[ \t]+(?:one|output|answer|result|json))?)(?:[ \t]*[.!:—–][ \t]*(?:the[ \t]+)?"
    r"(?:correct|corrected|right|new|final)(?:[ \t]+(?:answer|output|result|json|one))?"
    r"(?:[ \t]+is)?)?"
    r"|korrektur|berichtigung|korrigiert|eigentlich|tatsächlich"
    r"|(?:die[ \t]+)?(?:richtige|korrekte|korrigierte|endgültige|finale)[ \t]+"
    r"(?:antwort|ausgabe|version)"
    r"|rectification|en fait|en réalité"
    r"|(?:la[ \t]+)?(?:bonne|vraie)[ \t]+réponse"
    r"|(?:réponse|sortie)[ \t]+(?:finale|correcte|corrigée)"
    r"|corrección|en realidad|(?:respuesta|salida)[ \t]+(?:final|correcta|corregida)"
    r"|correzione|in realtà|risposta[ \t]+(?:finale|corretta)"
    r"|correção|na verdade|na realidade|(?:resposta|saída)[ \t]+(?:final|correta|corrigida)"
    r"|исправление|поправка|на самом деле|окончательн\w+[ \t]+ответ"
    r"|правильн\w+[ \t]+ответ|исправленн\w+[ \t]+(?:ответ|вывод|результат|версия|вариант)"
    r"|correctie|gecorrigeerd|eigenlijk"
    r"|(?:het[ \t]+)?(?:juiste|definitie[fv]e?|gecorrigeerde)[ \t]+antwoord"
    r"|poprawka|korekta|właściwie|w rzeczywistości"
    r"|(?:poprawna|ostateczna|poprawiona)[ \t]+odpowiedź"
    r"|düzeltme|aslında|doğrusu|(?:doğru|son|nihai|düzeltilmiş)[ \t]+cevap"
    r"|تصحيح|في الواقع|الإجابة الصحيحة|الإجابة النهائية|الإجابة المصححة"
    # "wait", "I was wrong" as the label
    r"|warte|wacht|czekaj|bekle|espera|aspetta|attends|attendez|подожди|погоди|انتظر"
    r"|ошибся|ошиблась|ich habe mich geirrt|je me suis trompée?|me equivoqu[ée]"
    r"|mi sono sbagliat[oa]|me enganei|pomyliłe[mś]|yanıldım|ik heb me vergist"
    r"|подождите|погодите|исправляю|corrijo|me corrijo|je corrige|ich korrigiere|correggo"
    r"|सुधार|संशोधन|सही[ \t]+(?:उत्तर|जवाब)|अंतिम[ \t]+(?:उत्तर|जवाब))(?![\w'’])"
    # Japanese, Korean: no word boundary after the word; only an ending that says the
    # value is done, corrected, a version or the result may follow before the colon
    # ("訂正します：", "訂正版：", "수정된 결과:", "수정본:", "정정합니다:"), never
    # "before", the target, a request, an example, a format or a list of changes
    # ("訂正前：", "訂正する前の出力：", "수정 전:", "수정할 원본:", "訂正対象：",
    # "정답 예시:", "最終出力例：", "수정 내용:"): the ending must reach the colon
    # (:data:`_LABEL_TAIL`)
    r"|訂正(?:(?:いた)?し(?:ます|ました)|した(?:もの|版|結果|回答|出力)?|版|後"
    r"|済み?|された(?:もの|版|結果|回答|出力)?|結果)?"
    r"|(?:正しくは|実際は)(?:次の(?:通り|とおり)(?:です)?|以下の(?:通り|とおり)(?:です)?)?"
    r"|実は|待って|最終(?:回答|結果|的な(?:回答|結果|出力)|出力|版)?"
    r"|(?:수정|정정)(?:[ \t]?(?:된|한)[ \t]?(?:결과|답변|답|출력|버전|값)|본|했습니다"
    r"|합니다|하겠습니다|[ \t]?후|[ \t]?버전)?"
    r"|사실은|정답은?|최종(?:[ \t]?(?:답변|결과|답|출력|버전|본))?))")
#: Words of a clause that names the answer, in Chinese, Japanese or Korean (a second
#: look, "检查了一下", "来", then "，正确的是", "应该是", "最终答案", "正しい出力は", "올바른
#: 답"): all that may stand between a correction and the colon before its value (not
#: "候选标签", "输入", "格式", "包装很好，另外").
_ANSWER_CLAUSE = (r"(?:检查|核对|确认|判断|分析|考虑|评估|阅读|看|整理|来过?)?了?"
                  r"(?:一下|一遍|一次)?了?[ \t]*(?:[，,、][ \t]*)?"
                  r"(?:正确|正しい|最终|新|올바른[ \t]?)?(?:的|の)?"
                  r"(?:答案|结果|输出|标签|分类|版本|回答|判断|说明|json|出力|答え|結果|値|ラベル"
                  r"|답변|답|결과|출력)?(?:应该|应当|应)?(?:是|为|如下|は|은|는)?")
#: A clause that introduces a value (up to its colon): not one that names the input, the
#: format, candidates or an example.
_INTRO_CLAUSE = (r"(?![^\n:：]*(?:输入|格式|候选|示例|例如|样例|例子|入力|形式|例：|입력|형식|예시"
                 r"|(?i:format|input|schema|example)))[^\n。！？.!?“”「」『』\"]{0,24}[:：]")
#: What must follow a correction word of :data:`_CORRECTION`'s group ``near``: the
#: value, after at most the answer named ("I misclassified it", 错了，正确的是：) or a
#: sentence's end and one short clause introducing it ("I misclassified it. Here's the
#: fix:", "間違えました。正しい出力：", "틀렸어요. 다시:").
_NEAR_TAIL = re.compile(
    r"(?i)(?:[ \t]+(?:it|that|this|them)\b)?" + _ANSWER_CLAUSE
    + r"[ \t]*(?:[:：.,!。！，、—–-]\s*(?:" + _INTRO_CLAUSE + r")?)?"
    r"[\s*_]*(?:```[\w+.-]*\s*|<[A-Za-z_|][\w|:-]*>\s*)?(?:[{\[｛［]|```)")
#: What must follow a label of :data:`_CORRECTION` (its group ``label``): a colon (or
#: a dash, a full stop) and the value, only space, Markdown, a fence's opening line or
#: an answer tag between (or the fence or the answer container the value stands in:
#: group ``tag``, the container's ``<``). What is transparent between an introduction
#: and its value is so for every introduction (:data:`_TO_BRACKET`, :data:`_NEAR_TAIL`).
_LABEL_TAIL = re.compile(r"[ \t]*[:：.,!—–-]?[\s*_]*(?:```[\w+.-]*\s*|<[A-Za-z_|][\w|:-]*>\s*)?"
                         r"[{\[｛［]|[ \t]*[:：.,!—–-]?\s*(?:```|(?P<tag><)(?=[A-Za-z_|]))")


#: A revision of the value before, in words broader than :data:`_CORRECTION`'s, in the
#: sentence that introduces the later value (:func:`_revised`): a revised version or
#: answer ("Here's the improved version:", "Adjusted output:", "Changing my answer
#: to:"), a revision label ("Refining:", "Better:", "Re-evaluated:"), another attempt
#: ("Second attempt:"), a second look ("Looking again, ...", "After checking the
#: signature:"), "Let me adjust that", or a verdict on the value before
#: (:data:`_VERDICT`). "Update:" or "Edit:" alone is none (a note about the reply), nor
#: "the updated version of the app" (a revised version ends its clause), nor
#: "Double-checking" or "Re-examining the other review" (checks, of anything).
_REVISED = r"(?:revis|refin|improv|adjust|modif|correct|fix|updat|amend|chang|tweak)"
#: A verdict on the value before ("that doesn't look right", "That's not right, ...",
#: "Let me adjust that."), ending its clause ("not quite right for sarcastic reviews
#: in general" is about something else).
_VERDICT_WORDS = (
    r"(?:(?:that|this|it)(?:'s|’s| is| was)(?:n't|n’t| not)[ \t]+(?:quite[ \t]+)?"
    r"(?:right|correct|accurate)"
    r"|(?:that|this|it)(?:'s|’s| is| was)[ \t]+(?:off|inaccurate|a mistake|mistaken)"
    r"|(?:that|this|it)[ \t]+(?:doesn't|doesn’t|does not|didn't|didn’t|did not)[ \t]+"
    r"(?:look|seem|sound)[ \t]+(?:quite[ \t]+)?(?:right|correct)"
    r"|let me (?:adjust|refine|improve|modify|change|amend|tweak|rethink)(?:[ \t]+(?:that"
    r"|this|it|(?:my|the)[ \t]+(?:answer|output|result|label|classification|json)))?)"
    r"(?=[\s*_]*(?:[.,!;:…—–]|\Z))")
_CONNECTIVES = (r"(?:(?:and|so|but|however|ok(?:ay)?|hmm+|well|now|then"
                r"|here(?:'s| is| are)|this is|the|my|a|an|I think|I believe)[,\s]+)*")
#: A verdict right after the value it judges, the value its subject ("{...} is wrong;
#: it should be {...}", "{...} was a mistake.").
_VERDICT_ON_VALUE = (
    r"(?:is|was|'s|’s)[ \t]+(?:(?:quite|clearly|definitely)[ \t]+)?(?:wrong|incorrect|not right"
    r"|not correct|mistaken|erroneous|a mistake|an error|off)(?=[\s*_]*(?:[.,!;:…—–]|\Z))")
_VERDICT = re.compile(_CLAUSE + r"(?i:" + _CONNECTIVES + _VERDICT_WORDS + r")")
_VERDICT_AFTER = re.compile(r"(?i:" + _VERDICT_ON_VALUE + r")")
_REVISION = re.compile(
    _CLAUSE + r"(?i:" + _CONNECTIVES +
    r"(?:(?:" + _REVISED + r"\w*[ \t]+(?:(?:my|the|this|that|json|final)[ \t]+){0,2}"
    r"(?:version|answer|output|result|json|response|label|classification|object|list"
    r"|values?|reading|attempt)s?(?=[\s*_]*(?:[:：.!(\-–—]|(?:to|is|below|follows|here)\b|\Z"
    r"|of[ \t]+(?:the|my|this)[ \t]+(?:answer|output|result|json|response|label"
    r"|classification|object)))"
    r"|(?:second|2nd|third|another|new|one more)[ \t]+(?:attempt|try|pass)"
    # a second look, in the sentence that introduces the later value ("Hmm, looking
    # again, the city is Berlin.", "After checking the signature:")
    r"|looking[ \t]+(?:again|more[ \t]+closely|closer)|after[ \t]+checking"
    r")\b|" + _VERDICT_WORDS +
    r"|(?:" + _REVISED + r"(?:ed|ied|ing|ying)|better|re-?(?:evaluat|assess|examin|consider"
    r"|check|think|analy[sz])\w*"
    # "Correct:" and its words in other languages, as the value's own label
    r"|correct|richtig|correcto|corretto|correto|correcte|правильно|juist|doğru|poprawnie"
    r"|صحيح|正しい|正确|올바른)[\s*_]*[:：]))")
#: The end of a sentence right before the value it introduces: a colon, a full stop.
_LEAD_END = r"[\s*_]*[.:：!]?[\s*_]*\Z"
#: A sentence that ends in a revision, right before the later value ("The label should
#: be negative instead:", "I think this is more accurate:", "this one is better:",
#: 修改后：, 调整后的结果：, 改为：); a comparison ("more accurate than the baseline") is
#: none.
_REVISION_END = re.compile(
    r"(?i)(?:\binstead|\b(?:this|that|it|here)(?:[ \t]+one)?(?:'s|’s| is| looks| seems)"
    r"(?:[ \t]+(?:a|much|even|far))?[ \t]+(?:better|more[ \t]+(?:accurate|correct"
    r"|appropriate|fitting|precise|suitable))\b|更准确|更合适|更恰当"
    r"|(?:修改|调整|更改|修订|订正|更新|优化)后?(?:的)?(?:结果|答案|输出|版本|标签|分类|判断)?"
    r"|改为|改成"
    # "it should be", "the label should read", "I'd change it to", "Here it is fixed:"
    r"|\b(?:it|that|this|the[ \t]+(?:answer|label|output|result|json|classification"
    r"|value|score|sentiment|category))[ \t]+should(?:[ \t]+(?:instead|actually|really"
    r"|rather))?[ \t]+(?:be|read|have[ \t]+been)"
    r"|\b(?:I'd|I’d|I'll|I’ll|I[ \t]+will|let[ \t]+me)[ \t]+(?:change|update|correct"
    r"|revise|amend|switch)[ \t]+(?:it|that|this|my[ \t]+answer|the[ \t]+(?:answer|label"
    r"|output|result|json))[ \t]+to"
    r"|(?:^|\b(?:here(?:'s|’s| is)[ \t]+(?:it|that|the[ \t]+(?:json|answer|output"
    r"|result))|(?:it|that)(?:'s|’s| is)|now))[ \t]*(?:fixed|corrected|revised|updated"
    r"|amended))" + _LEAD_END)
#: A sentence that ends in words naming the later value as the answer: "it should be",
#: "the correct one is", "take this one as final" in Chinese, at a clause's start, at
#: most the answer named before it (不对，应该是：, 答案应为：, not 第二条评论的结果应该是：),
#: 正确的是：, taking a demonstrative as final (以下面这个为准：, not 以实物为准：), and
#: "here's the fix:". Such words as often introduce another item's value or a case:
#: they count only for a value introduced as no other item (:func:`_corrected`).
_ANSWER_END = re.compile(
    r"(?i)(?:(?<![^\s，,。：:；;！!？?])(?:答案|标签|结果|输出|分类|它)?应(?:该|当)?(?:是|为)"
    r"|(?<!不)正确的?(?:是|为)"
    r"|(?:以|按)(?:此|这|这个|下|下面|下面这个|下面的|后者|后面的?|最后一个|本次|这次|新的)为准"
    r"|\bhere(?:'s|’s| is)[ \t]+the[ \t]+(?:fix|fixed[ \t]+(?:one|version|json|answer"
    r"|output|result)))" + _LEAD_END)
#: Words that name another item than the answer: another review or record, a
#: reference, a template, a sample, a baseline, an older model's output.
_ITEM_WORDS = (
    r"\b(?:second|2nd|third|other|another|next)[ \t]+(?:\w+[ \t]+)?"
    r"(?:reviews?|items?|examples?|cases?|inputs?|records?|entr(?:y|ies)|texts?|comments?"
    r"|customers?|messages?|tickets?|rows?|documents?|ones?)\b|\breferences?\b|\btemplates?\b"
    r"|\bsamples?\b|\bbaselines?\b|\b(?:old|older|previous|prior|earlier|original|raw)[ \t]+"
    r"(?:model|system|version|classifier|approach|prompt|output|result)"
    r"|另一|其他|参考|模板|样例|示例|基线")
#: A later value introduced as another item than the answer (:data:`_ITEM_WORDS`, or a
#: number: "#2").
_OTHER_ITEM = re.compile(r"(?i)#[ \t]*\d|" + _ITEM_WORDS)
#: The same, told more finely, for the correction words that count only where they
#: introduce the value (:func:`_another_item`): a number other than the first ("#2",
#: not "#1" nor "ticket #4521"), and another item or case in Chinese, Japanese, Korean.
_ANOTHER_ITEM = re.compile(
    r"(?i)(?<!ticket )(?<!order )(?<!订单)(?<!工单)#[ \t]*(?!0*1(?!\d))\d{1,2}(?!\d)|"
    + _ITEM_WORDS +
    # another review or item in Chinese, Japanese, Korean (第二条, 下一条, 评论2, 次のレビュー,
    # 다음 리뷰; not the first, 第一条, 评论1, nor the one before, 上一条, which a
    # correction names), or another case (对于差评, 换作差评, 反过来, 差评的情况下; not
    # 对于这条, 在这种情况下; 对于这类差评 is another case)
    r"|第[ \t]*(?![1１一][ \t]*(?:条|则|篇|项|个))[0-9０-９一二三四五六七八九十]+[ \t]*"
    r"(?:条|则|篇|项|个评论)"
    r"|(?:下|后|最后)一(?:条|则|篇|项)"
    r"|(?:评论|评价|レビュー|リビュー|리뷰|댓글)[ \t]*[#＃]?[ \t]*(?![1１](?![0-9０-９]))[0-9０-９]"
    r"|次の(?:レビュー|コメント|項目|件|文)|다음[ \t]?(?:리뷰|댓글|항목|후기|문장)"
    r"|对于(?!(?:这|此|本|该)一?(?:条|则|篇|项|个|段|次))|换作|换成|反过来|(?<!这种)(?<!这)(?<!此)(?<!该)(?<!此种)情况下")
#: A cheap look ahead for a revision after a value (:func:`_cued`): any of its words.
_REVISION_HINT = re.compile(
    r"(?i)(?=[rimacfutbolpdjsп修调更改优订正올ص应为])(?:richtig|juist|doğru|правильно|poprawnie"
    r"|صحيح|正しい|正确|올바른|revis|refin|improv|adjust|modif|correct|fix|updat|amend|chang|tweak|better"
    r"|more accurate|more appropriate|more fitting|more precise|more suitable|instead"
    r"|attempt|\btry\b|\bpass\b|re-?(?:evaluat|assess|examin|consider|check|think|analy)"
    r"|looking|after[ \t]+checking"
    r"|right|\boff\b|mistake|let me|更准确|更合适|更恰当|修改|调整|更改|修订|订正|更新|优化"
    r"|改为|改成|应该|应当|应为|应是|为准|should|I'd|I’d|I'll|I’ll|I[ \t]+will)")
#: What stands between a value and the first sentence after it: blanks, a fence's
#: closing line, Markdown, closing quotes or brackets, a sentence's end.
_AFTER_VALUE = re.compile(r"(?:\s|```|[*_>#`\"'”’)\]}.,;:])*")


#: A value labelled as rejected ("Wrong:", "Incorrect:", "Bad example:", "Invalid
#: output:") or introduced by a negation ("Not {...} but {...}", "the answer is not"):
#: what the answer is not.
_REJECTED = re.compile(
    r"(?i)^[\s*_#>\-]*(?:wrong|incorrect|bad|invalid|rejected|not this|don'?t|do not"
    r"|avoid|错误|不对|不正确)(?:[ \t]+[\w-]+){0,2}[\s*_]*[:：][\s*_]*\Z"
    r"|\b(?:not|never|rather than|isn't|wasn't|aren't)[\s*_]*\Z|不是\s*\Z")


#: A label that introduces a value as not the answer, in English beyond
#: :data:`_EXAMPLE_LABEL` and in the common languages (de, fr, es, it, pt, ru, nl, pl,
#: tr, ar, zh, ja, ko). Words that say so as the head of a label ending with a colon,
#: an article or "for" before, at most the word for the output after
#: ("Beispielausgabe:", "Exemple de sortie :", "An illustrative output:", "Par
#: exemple :"): an example, a sample, a template, a draft. Such a word elsewhere in a
#: label ("Here is the result for your example text:", "Response for the illustration
#: text:", "Typical result:") or before another word ("Örnek sonuç:", "Musterlösung:")
#: says nothing of the value.
_EXAMPLE_WORDS = (
    r"examples?|illustrative"
    r"|beispiel|beispielausgabe|beispielantwort|vorlage|muster|entwurf|schablone"
    r"|exemples?|gabarit|brouillon"
    r"|ejemplos?|plantilla|borrador"
    r"|esempio|esempi|bozza"
    r"|exemplos?|rascunho"
    r"|пример|примеры|например|шаблон|образец|черновик"
    r"|voorbeeld|voorbeelduitvoer|voorbeeldoutput|sjabloon"
    r"|przykład|szablon|wzór|szkic"
    r"|örnek|şablon|taslak"
    r"|bijvoorbeeld|örneğin|على سبيل المثال|المثال|مثال|قالب|مسودة")
#: What may stand before such a word (an article, "for"), and after it (the word for
#: the output: "Exemple de sortie", "Example JSON").
_EXAMPLE_BEFORE = (r"(?:(?:for|par|zum|zur|por|per|an?|the|un|une|una|uno|ein|eine|el|la"
                   r"|le|il|o|um|uma|een)[ \t]+)?")
_EXAMPLE_AFTER = (r"(?:(?:[ \t]+|-)(?:output|json|format|formato|ausgabe|çıktı|çıktısı"
                  r"|вывода|ответа)|[ \t]+(?:de|d'|di|du|of|van|dla|для)[ \t]*(?:sortie|salida"
                  r"|output|réponse|respuesta|risposta|resposta|saída|uscita|json|wyjścia"
                  r"|antwoord|answer|response|вывода|ответа))?")
#: A fixed phrase that introduces an example ("For reference, a typical output looks
#: like:").
_EXAMPLE_PHRASE = (r"(?:for reference,?[ \t]+)?(?:an?[ \t]+)?typical[ \t]+(?:output|result"
                   r"|answer|response)[ \t]+(?:looks|would look)[ \t]+like")
#: Words that say so only as the label's head (an article before, at most one word
#: after: "Before:", "The data:", "Entrée :", "JSON schema:", "Falsch:"): the input
#: echoed, the schema, what is wrong ("Normalized record:" is no echo). Words as
#: generic as "Data:", "Record:", "Text:", "Source:", "Structure:" or "Raw:" are no
#: such label: an answer is introduced by them as often ("Text analysis:").
_HEAD_WORDS = (
    r"before|provided|received|(?:json )?schema|baseline|default|prior|old"
    r"|eingabe|eingabedaten|entrée|entrada|вход|входные данные|ввод|исходные данные|invoer"
    r"|wejście|girdi|المدخلات|الإدخال|schéma|esquema|схема|schemat"
    r"|falsch|falsche|falscher|falsches|inkorrekt|faux|fausse|incorrect[oa]?|errad[oa]"
    r"|errat[oa]|sbagliat[oa]|неправильно|неверно|fout|błędnie|źle|yanlış|خطأ|خاطئ")
#: Words that make a label the output's ("Schema output:", "Provided answer:").
_OUTPUT_WORDS = (
    r"(?i:result|output|answer|response|classification|label|extract|pars|normali|clean"
    r"|process|correct|fix|updat|ergebnis|ausgabe|antwort|sortie|résultat|réponse|salida"
    r"|respuesta|resultado|risposta|resposta|ответ|выход|результат)")
#: A qualifier in brackets after a label's word ("Draft (wrong):", "下書き（誤り）：").
#: One that says the value is revised, final, filled in, a numbered version or made for
#: this input ("Entwurf (überarbeitet):", "Vorlage (ausgefüllt):", "Черновик (v2):",
#: "下書き（最終）：", "Beispiel (dein Text):", "例（今回の入力）：") makes the label none
#: of an example or a draft: the value is the answer (:data:`_DONE_QUALIFIER`).
_QUALIFIER = (r"(?:[ \t]*[(（](?![^()（）\n]*" + _DONE_QUALIFIER
              + r")[^()（）\n]{1,24}[)）])?")
_OTHER_LABEL = re.compile(
    r"(?i)^[\s*_#>\-]*(?:" + _EXAMPLE_BEFORE + r"(?:" + _EXAMPLE_WORDS + r")(?![\w'’])"
    + _EXAMPLE_AFTER + r"|" + _EXAMPLE_PHRASE + r")" + r"(?:[ \t]*(?:#|nr\.|no\.)?[ \t]*\d{1,2})?"
    + _QUALIFIER + r"[ \t]*[:：][\s*_]*\Z"
    r"|^[\s*_#>\-]*(?:(?:the|die|der|das|le|la|les|el|los|il|lo|o|a|de|het)[ \t]+)?"
    r"(?:" + _HEAD_WORDS + r")(?![\w'’-])[ \t]*[:：][\s*_]*\Z"
    r"|^[\s*_#>\-]*(?:texto|datos|dados|dati|données|texte|testo|tekst|текст)[ \t]+"
    r"(?:de|di|d'|da|do)[ \t]*(?:entrada|input|entrée|ingresso)[ \t]*[:：][\s*_]*\Z"
    r"|^[\s*_#>\-]*modèle(?:[ \t]+d[e'’][ \t]*(?:sortie|réponse))?[ \t]*[:：][\s*_]*\Z"
    r"|^[\s*_#>\-]*(?:eg|ex|e\.g|demo|(?:something[ \t]+)?like(?:[ \t]+this)?)"
    r"[\s*_]*[:：][\s*_]*\Z"
    # Chinese, Japanese, Korean: an example's word as the whole label, at most the
    # word for the output before or after it ("示例：", "输出示例：", "出力例：", not
    # "サンプル数：", "テンプレート名：", "下書き保存："; 例 only alone: not 病例, 比例); the
    # input's or a wrong value's word as the whole label ("入力：", "错误：", not
    # "入力確認：", "错误类型：", "입력 분석:")
    r"|^[\s*_#>\-]*(?:输出|輸出|出力|回答|答案|结果|結果|응답|출력|결과)?[ \t]?"
    r"(?:例|示例|样例|範例|范例|例子|例如|例えば|出力例|入力例|回答例|模板|样板|雛形"
    r"|テンプレート|サンプル|下書き|草稿|예시|예제|예를 들어|샘플|템플릿|초안)"
    r"(?:[ \t]?(?:输出|輸出|出力|回答|答案|结果|結果|응답|출력|결과))?" + _QUALIFIER
    + r"[\s*_]*[:：]?[\s*_]*\Z"
    r"|^[\s*_#>\-]*(?:入力|输入|입력|원본|原文|誤り|間違い|错误|틀린|잘못된?)"
    r"(?:[ \t]?(?:データ|数据|數據|데이터|内容|文本|テキスト|텍스트))?[\s*_]*[:：][\s*_]*\Z")
#: A negation in a label ("Not an example but the output:"): it is no such label.
_NEGATED = re.compile(r"(?i)(?<![\w'’])(?:not|no|kein\w*|nicht|pas|non|ni|не|nie|niet"
                      r"|değil)(?![\w'’])|不是|ではな|아닌")
#: A value introduced by a condition, a counterfactual or a contrast in another
#: language than English (:data:`_HYPOTHETICAL`), told by :func:`_other_condition`: a
#: conditional or contrasting word that starts the sentence together with a
#: counterfactual verb in it ("Wenn sie positiv wäre:", "Si c'était positif :", "Si
#: fuera positivo:", "Если бы ...", "Im Gegenteil wäre es"); a word that is
#: counterfactual by itself at its start ("Gdyby ...", "لو ..."); "もし ... なら",
#: "만약 ... 라면" right before the value; or "otherwise" as the whole label ("Sonst:",
#: "Andernfalls"). A conditional word alone ("Si riporta ...", "Falls es hilft, hier
#: das Ergebnis:", "Si vous voulez, voici"), a conditional mood alone ("Ich würde
#: sagen:", "La réponse serait :", "Я бы сказал") and a lone negation ("Spam? No")
#: are no such introduction: they introduce answers as often.
_CONDITION_START = re.compile(
    r"(?i)^[\s*_#>\-]*(?:wenn|falls|sofern|si|se|indien|als het|als de|als dit|если"
    r"|jeśli|jezeli|jeżeli|eğer|إذا|im gegenteil|au contraire|al contrario|ao contrário)"
    r"(?![\w'’-])")
_COUNTERFACTUAL = re.compile(
    r"(?i)(?<![\w-])(?:wäre|wären|würde|hätte|serait|seraient|aurait|était|étaient"
    r"|sería|fuera|fuese|habría|sarebbe|fosse|seria|бы|zou|zouden|byłoby|byłby"
    r"|olsaydı|olurdu)(?![\w'’-])")
_OTHER_CONDITION = re.compile(
    r"(?i)^[\s*_#>\-]*(?:gdyby|لو)(?![\w'’-])"
    r"|^[\s*_#>\-]*(?:もし[^\n]*(?:なら|ならば|だったら)|만약[^\n]*(?:라면|였다면))"
    r"[\s*_,、]*[:：]?[\s*_]*\Z"
    r"|^[\s*_#>\-]*(?:sonst|andernfalls|ansonsten|sinon|de lo contrario|si no|altrimenti"
    r"|caso contrário|senão|иначе|w przeciwnym razie|aksi halde|وإلا)[\s*_]*[:：,]?[\s*_]*\Z")


#: A first-person choice hedge ("Wenn ich mich festlegen müsste, wäre es:", "Si je
#: devais trancher", "Si tuviera que elegir", "Если бы пришлось выбирать", "لو كان علي
#: الاختيار", "もし一つ選ぶなら"): the model's answer, not a value under a condition.
_CHOICE_HEDGE = re.compile(
    r"(?i)(?<![\w'’-])(?:ich|je|j['’]|yo|io|eu|я|мне|ik|ja|ben|musste|müsste|devais|tuviera"
    r"|dovessi|tivesse|пришлось|moest|musiał\w*|zorunda)(?![\w'’-])"
    r"|festleg|entscheid|wählen|trancher|choisir|décider|elegir|escoger|decidir|sceglie"
    r"|decide|escolher|выбира|выбрать|выбор|решать|kiezen|wybra|wybiera|seç|الاختيار|أختار"
    r"|選ぶ|選べ|選択|决定|選|分類|分类|判断|判定|고르|선택|골라|분류")


def _other_condition(lead: str) -> bool:
    """Whether ``lead`` introduces a value as what it would be under a condition or in
    contrast, in another language than English (:data:`_OTHER_CONDITION`); a
    first-person choice hedge (:data:`_CHOICE_HEDGE`) is an answer."""
    return (_OTHER_CONDITION.search(lead) is not None or (
        _CONDITION_START.search(lead) is not None
        and _COUNTERFACTUAL.search(lead) is not None)) \
        and _CHOICE_HEDGE.search(lead) is None


#: An opening tag of an element that holds values that are not the answer (or struck
#: through: ``<del>``, ``<strike>``; not ``<s>``, a model's start token).
_NOT_ANSWER_TAG = re.compile(
    r"(?i)<(examples?|samples?|drafts?|input|inputs|schema|template|format|reference"
    r"|user_input|query|question|prompt|del|strike)(?:[ \t][^<>\n]*)?>")
#: The closing tag of such an element.
_NOT_ANSWER_CLOSE = re.compile(
    r"(?i)</(?:examples?|samples?|drafts?|input|inputs|schema|template|format|reference"
    r"|user_input|query|question|prompt|del|strike)\s*>")
#: How far before a value such a tag is looked for.
_TAG_REACH = 4096


def _in_not_answer_tag(text: str, start: int) -> bool:
    """Whether the value at ``start`` stands inside an element that holds values that
    are not the answer (``<example>...</example>``, ``<draft>``, ``<input>``,
    ``<schema>`` ..., :data:`_NOT_ANSWER_TAG`): the last such tag opened before it (at
    most :data:`_TAG_REACH` characters) is not closed before it, and is closed after
    it (within as far). A tag never closed is prose that names one (``the form's
    <input type="email">``, ``your <query>``): it encloses nothing."""
    floor = max(0, start - _TAG_REACH)
    if "<" not in text[floor:start]:
        return False
    last = None
    for last in _NOT_ANSWER_TAG.finditer(text, floor, start):  # noqa: B007 - the last
        pass
    if last is None:
        return False
    closing = re.compile(r"(?i)</" + re.escape(last.group(1)) + r"\s*>")
    return closing.search(text, last.end(), start) is None \
        and closing.search(text, start, start + _TAG_REACH) is not None


#: A value introduced as another thing than the answer, for context: "The previous
#: customer was" (not "The last step was": the last may be this one), "Compare with
#: last week:", a label qualified so in brackets ("Review 1 (given as context):", "Bob
#: (not this one):").
_CONTEXT_LEAD = re.compile(
    r"(?i)^[\s*_#>\-]*(?:the[ \t]+)?(?:previous|prior|earlier|old)[ \t]+\w+"
    r"(?:[ \t]+\w+)?[ \t]+(?:was|were)[ \t]*[:：]?[\s*_]*\Z"
    r"|^[\s*_#>\-]*compare[ \t]+(?:it[ \t]+)?(?:with|to)\b[^\n:：]{0,40}[:：][\s*_]*\Z"
    r"|^[\s*_#>\-]*[^\n:：()（）]{1,40}[(（][ \t]*(?:(?:(?:given|shown|provided|included"
    r"|only)[ \t]+)?(?:as|for)[ \t]+(?:context|reference|comparison)|not[ \t]+(?:this|the)"
    r"[ \t]+(?:one|answer))[ \t]*[)）][ \t]*[:：][\s*_]*\Z")
#: The end of a value struck through in Markdown (``~~{...}~~``).
_STRUCK_END = re.compile(r"[}\]][ \t]*~~")


def _struck(text: str, start: int) -> bool:
    """Whether the value at ``start``, right after ``~~``, is struck through: a closing
    bracket and ``~~`` follow it (within :data:`_TAG_REACH`) before the next ``~~``
    that opens anything else. A value struck through is one the model took back."""
    m = _STRUCK_END.search(text, start, start + _TAG_REACH)
    return m is not None and "~~" not in text[start:m.start()]


#: A Markdown table's separator row (``|---|:---:|``), and its header cells that say
#: its rows are examples ("| Example | JSON |", "| review | expected |").
_TABLE_RULE = re.compile(r"[ \t]*\|?[ \t]*:?-{3,}:?[ \t]*(?:\|[ \t]*:?-{3,}:?[ \t]*)*\|?[ \t]*\Z")
_TABLE_EXAMPLES = re.compile(r"(?i)(?<![\w'’])(?:examples?|expected|samples?)(?![\w'’])")
#: A line before a table that calls its rows examples ("Examples of the format:").
_TABLE_INTRO = re.compile(
    r"(?i)^[\s*_#>\-]*(?:(?:here[ \t]+are|some)[ \t]+)?(?:examples?|samples?)\b[^\n]{0,60}"
    r"[:：][\s*_]*\Z")


def _in_example_table(text: str, start: int) -> bool:
    """Whether the value at ``start`` stands in a row of a Markdown table of examples:
    its line is a table row (it opens with ``|``), and the table (the rows above it, at
    most :data:`_TAG_REACH` characters) has a separator row under a header that says
    its rows are examples, or the line before the table says so."""
    line = text.rfind("\n", 0, start) + 1
    if not text[line:start].lstrip(" \t").startswith("|"):
        return False
    rows = []  # the rows above the value's, nearest first
    at, floor = line, max(0, start - _TAG_REACH)
    while at > 0:
        if at <= floor:
            return False
        above = text.rfind("\n", 0, at - 1) + 1
        row = text[above:at - 1]
        if not row.lstrip(" \t").startswith("|"):
            break
        rows.append(row)
        at = above
    if len(rows) < 2 or _TABLE_RULE.match(rows[-2]) is None:
        return False
    return _TABLE_EXAMPLES.search(rows[-1]) is not None \
        or _TABLE_INTRO.search(_line_before(text, at)) is not None


def _line_before(text: str, at: int) -> str:
    """The last line with words before ``at`` (past blank lines), or nothing."""
    return text[:at].rstrip().rsplit("\n", 1)[-1]


def _lead(text: str, start: int, floor: int) -> str:
    """The sentence that introduces the value at ``start``: the text before it back to
    the last sentence end (at most :data:`_INTRO` characters, not before ``floor``),
    without the fence line, tag or Markdown between it and the value."""
    stretch = text[max(floor, start - _INTRO):start]
    tag = _NOT_ANSWER_CLOSE.match(stretch, stretch.rfind("</")) if "</" in stretch else None
    if tag is not None:
        # ("</draft>" ends the draft: it introduces nothing; any other closing tag
        # keeps what it closes, "<b>If it were negative:</b>")
        stretch = stretch[tag.end():]
    stretch = stretch[:_LEAD_OUT.search(stretch).start()]  # type: ignore[union-attr]
    ends = list(_SENTENCE_END.finditer(stretch, 0, max(0, len(stretch) - 1)))
    return stretch[ends[-1].end():] if ends else stretch


def _not_the_answer(text: str, start: int, floor: int) -> bool:
    """Whether the value at ``start`` is introduced as an example, a draft, a template,
    the input, as what the answer would be under a condition or in contrast, or as
    what it is not (labelled wrong, or negated), in English or another common language
    (:data:`_OTHER_LABEL`, :func:`_other_condition`), or stands in a tag that holds
    such values (``<example>``, :func:`_in_not_answer_tag`)."""
    if _in_not_answer_tag(text, start) or _in_example_table(text, start):
        return True
    lead = _lead(text, start, floor)
    return bool(lead) and (_EXAMPLE_LABEL.search(lead) is not None
                           or _CONTEXT_LEAD.search(lead) is not None
                           or (lead.endswith("~~") and _struck(text, start))
                           or _EXAMPLE_END.search(lead) is not None
                           or _INPUT_LABEL.search(lead) is not None
                           or _HYPOTHETICAL.search(lead) is not None
                           or _REJECTED.search(lead) is not None
                           or (_OTHER_LABEL.search(lead) is not None
                               and _NEGATED.search(lead) is None)
                           or _other_condition(lead))


def _clause_start(text: str, at: int) -> bool:
    """Whether a clause starts at ``at`` (:data:`_CLAUSE`): the start of the text, or
    after a clause's end, then only space, Markdown and quotes. Walks back over that
    run once (each run is behind one word: linear over a search)."""
    i = at - 1
    while i >= 0:
        c = text[i]
        if c in _CLAUSE_ENDS:
            return True
        if not (c.isspace() or c in _CLAUSE_SKIPS):
            return False
        i -= 1
    return True


def _corrections(text: str, begin: int, end: int) -> Iterator[re.Match[str]]:
    """The correction phrases that start a clause in ``text[begin:end]``, in order. A
    long stretch (the rest of the text after each value, :func:`_cued`) is served from
    the phrases of the whole text, found once per text."""
    if end - begin > _LONG_STRETCH:
        global _SITES
        sites = _SITES  # (one read: another thread may replace it)
        if sites[0] is not text:
            sites = _SITES = (text, [m.start() for m in _corrections(text, 0, -1)])
        starts = sites[1]
        for at in starts[bisect_left(starts, begin):bisect_left(starts, end)]:
            m = _CORRECTION.match(text, at, end)
            if m is not None and not (_added(m) and _quoted(text, at)):
                yield m
        return
    pos, stop = begin, len(text) if end < 0 else end
    while (m := _CORRECTION.search(text, pos, stop)) is not None:
        if not _clause_start(text, m.start()):
            pos = m.start() + 1  # (a clause may still start inside: "so, actually")
            continue
        pos = m.end()
        if end < 0 or not (_added(m) and _quoted(text, m.start())):
            yield m


def _added(m: re.Match[str]) -> bool:
    """Whether a correction phrase of :data:`_CORRECTION` is one that counts only where
    it plainly introduces the value (its groups ``near`` and ``we``): those words are
    as often the input's ("顾客说：“我搞错了尺码”") or about another item; the others
    are the model's correction wherever they start a clause."""
    return m.group("near") is not None or m.group("we") is not None


#: Opening quotation marks and their closing ones.
_QUOTE_PAIRS = (("“", "”"), ("「", "」"), ("『", "』"), ("«", "»"))
#: A straight double quote that may open or close a quotation: not an inch mark
#: right after a digit ('a 10" tablet').
_STRAIGHT_QUOTE = re.compile(r'(?<![0-9０-９])"')


def _quoted(text: str, at: int) -> bool:
    """Whether ``at`` stands inside a quotation on its line: between an opening mark
    and its closing one, both on the line (straight quotes paired left to right over
    the whole line): words quoted from the input ("顾客说：“我搞错了尺码”") are not the
    model's (told for :func:`_added` words only: a label quoted for emphasis, “更正”：,
    is). A mark left open, or a block quote's ``>``, quotes nothing for sure: the
    model's own correction is written so as often ("> Correction:")."""
    start = text.rfind("\n", 0, at) + 1
    end = text.find("\n", at)
    line = text[start:len(text) if end < 0 else end]
    at -= start
    marks = [m.start() for m in _STRAIGHT_QUOTE.finditer(line)]
    pairs = zip(marks[::2], marks[1::2], strict=False)  # (a last one left open: none)
    if any(opening < at < closing for opening, closing in pairs):
        return True
    for opening, closing in _QUOTE_PAIRS:
        begin = line.rfind(opening, 0, at)
        if begin >= 0 and line.rfind(closing, begin, at) < 0 and line.find(closing, at) >= 0:
            return True
    return False


#: Longer stretches are searched for corrections once per text (:func:`_corrections`).
_LONG_STRETCH = 4096
_SITES: tuple[str, list[int]] = ("", [])


def _correction(text: str, begin: int, end: int, *, added: bool = True) -> bool:
    """Whether a correction phrase starts a clause in ``text[begin:end]``, in a
    sentence that states no condition; the words of :func:`_added` only if ``added``.
    Linear: the pattern is tried only at words (:data:`_CLAUSE_AT`), each then checked
    by :func:`_clause_start`."""
    for m in _corrections(text, begin, end):
        if not added and _added(m):
            continue
        if m.group("label") is not None and not _label_tail(text, m.end(), end):
            continue  # a label that introduces no value ("Korrektur: keine nötig.")
        if m.group("near") is not None \
                and _NEAR_TAIL.match(text, m.end(), min(len(text), end + 3)) is None:
            continue  # prose ("说错了也没关系", "I misclassified nothing")
        reach = min(end, m.end() + _INTRO)
        cut = _SENTENCE_END.search(text, m.end(), reach)
        sentence_end = cut.start() if cut is not None else reach
        head = text[max(begin, m.start() - _INTRO):m.start()]
        ends = list(_SENTENCE_END.finditer(head))
        sentence = head[ends[-1].end():] if ends else head
        if _HYPOTHETICAL.search(sentence + text[m.start():sentence_end]) is None:
            return True
    return False


def _label_tail(text: str, at: int, end: int) -> bool:
    """Whether a label ending at ``at`` introduces the value at ``end`` (-1: any later
    value) (:data:`_LABEL_TAIL`): up to its bracket, or the fence it stands in - a
    fence right under the label that holds prose or code, the value further below
    ("Korrektur:\n```\nkeine nötig\n```\nEin Beispiel:\n{...}"), is none."""
    stop = min(len(text), end + 3) if end >= 0 else len(text)
    tail = _LABEL_TAIL.match(text, at, stop)
    if tail is None:
        return False
    if tail.group("tag") is not None:
        # (the container the value stands in; any later value: an answer container)
        return tail.end() == end + 1 if end >= 0 \
            else _ANSWER_TAG.match(text, tail.end() - 1) is not None
    return not tail.group().endswith("```") or tail.end() == end + 3


def _revised(text: str, after: int | None, start: int, floor: int, *,
             added: bool = True) -> bool:
    """Whether the value at ``start`` is introduced as a revision of the value before
    (ending at ``after``; None: none near), in a sentence that states no condition:
    the sentence that introduces it (not before ``floor``) holds a revision
    (:data:`_REVISION`, no other item named after it) or ends with one
    (:data:`_REVISION_END`; :data:`_ANSWER_END` only if ``added``); or the first
    sentence after the value before is a verdict on it (:data:`_VERDICT`) and nothing
    between introduces the later value as another item (:data:`_OTHER_ITEM`).
    Elsewhere such words are prose ("the product was improved in version two", "more
    accurate than the baseline")."""
    lead = _lead(text, start, floor)
    if lead and _HYPOTHETICAL.search(lead) is None:
        if (_REVISION_END.search(lead) is not None
                or (added and _ANSWER_END.search(lead) is not None)) \
                and _OTHER_ITEM.search(lead) is None:
            return True
        m = _REVISION.search(lead)
        if m is not None and _OTHER_ITEM.search(lead, m.end()) is None:
            return True
    if after is None:
        return False
    at = _AFTER_VALUE.match(text, after, start).end()  # type: ignore[union-attr]
    stop = min(start, at + _INTRO)
    cut = _SENTENCE_END.search(text, at, stop)
    sentence = text[at:cut.end() if cut is not None else stop]
    m = _VERDICT.search(sentence) or _VERDICT_AFTER.match(sentence)
    return m is not None and _HYPOTHETICAL.search(sentence) is None \
        and _OTHER_ITEM.search(text, at + m.end(), start) is None


def _corrected(text: str, picks: list[Pick], i: int, *, added: bool = True) -> bool:
    """Whether pick ``i`` is introduced as a correction or the final answer: a
    correction phrase between the value before and it, or a revision right after the
    value before or introducing it. The words that count only where they introduce
    the value (:func:`_added`, :data:`_ANSWER_END`; only if ``added``) never do when
    it is introduced as another item (:func:`_another_item`)."""
    start = picks[i][0]
    before = picks[i - 1][1] if i else 0
    begin = max(before, start - _CORRECTION_REACH)
    after = before if i and before >= begin else None
    if _correction(text, begin, start, added=False) \
            or _revised(text, after, start, begin, added=False):
        return True
    # (another item's value, "我搞错了，第二条评论：{...}", takes nothing back)
    return added and not _another_item(text, start, begin) and (
        _correction(text, begin, start) or _revised(text, after, start, begin))


def _another_item(text: str, start: int, floor: int) -> bool:
    """Whether the sentence that introduces the value at ``start`` names another item
    (:data:`_ANOTHER_ITEM`) after the last correction phrase in it, outside an aside in
    parentheses: "我搞错了，第二条评论：", "Next review:"; not "Disregard the previous
    output." (the item it names is the one taken back), "Correction (I confused this
    with another review):"."""
    lead = _lead(text, start, floor)
    at = text.rfind(lead, max(floor, start - _INTRO - len(lead)), start) if lead else -1
    if at < 0:
        return False
    found = deque(_corrections(text, at, at + len(lead)), maxlen=1)  # the last only
    last = found[0] if found else None
    label = _ASIDE.sub(" ", text[at if last is None else last.end():at + len(lead)])
    return _ANOTHER_ITEM.search(label) is not None


#: A closed parenthesis on one line: an aside, not the label that introduces a value.
_ASIDE = re.compile(r"\([^()\n]*\)|（[^（）\n]*）")


def _more_wanted(text: str, picks: list[Pick]) -> bool:
    """Whether to look past the usable values found so far: the first was introduced
    as not the answer, a draft or a numbered step's output, a correction follows the
    last, every one is a bracketed word or citation (:func:`_weak`), or every one is
    mentioned inside a sentence (:func:`_mention`). Otherwise the
    first usable value is the answer (a later one never replaces it)."""
    return len(picks) < _MAX_PICKS and (_cued(text, picks[0][0], picks[-1][1])
                                        or _DRAFT_LEAD.search(_lead(text, picks[0][0], 0))
                                        is not None
                                        or all(_weak(text, p) for p in picks)
                                        or all(_mention(text, p[0], p[1]) for p in picks)
                                        or all(_echo(p[2].value) for p in picks))


#: A placeholder a template holds where a value goes: an ellipsis, a range or a type
#: in angle brackets (``<0-1>``, ``<string>``), or words in angle brackets, braces,
#: square brackets, after a ``$`` or as "your ... here" (group 1 or 2: the words), which
#: name the field they stand in (:func:`_echo`).
_PLACEHOLDER = re.compile(
    r"(?i)\.{3,}|…|<-?\d+(?:\.\d+)?\s*[-–]\s*\d+(?:\.\d+)?>"
    r"|<(?:string|str|text|number|int|integer|float|bool|boolean)>"
    r"|(?:<|\{\{?\s*|\[|your\s+)([a-z_][\w .|/-]{0,40}?)(?:>|\s*\}\}?|\]|\s+here)"
    r"|\$\{?([a-z_]\w{0,40})\}?")


def _names(words: str, key: str) -> bool:
    """Whether a placeholder's words name the field ``key`` (``<name>``, ``{{city}}``,
    ``your customer name here`` for ``name``)."""
    def fold(t: str) -> str:
        return " ".join(re.split(r"[\W_]+", t.lower())).strip()
    return bool(key) and f" {fold(key)} " in f" {fold(words)} "


def _echo(value: Any) -> bool:
    """Whether a value is a template echoed before the answer: every leaf a string, and
    every string a placeholder (:data:`_PLACEHOLDER`) that is an ellipsis, a range or
    names its own field; at least one. ``{"template": "{first_name}"}`` or
    ``{"answer": "<unk>"}`` is a value (its placeholder names another thing)."""
    leaves = 0
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, key = stack.pop()
        if isinstance(item, dict):
            stack.extend((v, str(k)) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, key) for v in item)
        else:
            leaves += 1
            m = _PLACEHOLDER.fullmatch(item.strip()) if isinstance(item, str) else None
            words = m and (m.group(1) or m.group(2))
            if leaves > 64 or m is None or (words and not _names(words, key)):
                return False
    return leaves > 0


#: A citation: one or two short numbers in brackets (``[1]``, ``[2, 5]``).
_CITATION = re.compile(r"\[[ \t]*\d{1,4}[ \t]*(?:,[ \t]*\d{1,4}[ \t]*)?\]")
#: A bracketed label: one to three bare words (``[Note]``, ``[Final Answer]``).
_LABEL = re.compile(r"\[[ \t]*[^\W\d_][\w-]*(?:[ \t]+[^\W\d_][\w-]*){0,2}[ \t]*\]")
#: A word (prose).
_WORD = re.compile(r"[^\W\d_]")


def _weak(text: str, pick: Pick) -> bool:
    """Whether a list value is bracketed prose rather than a list the model wrote: a
    citation (``[1]``, ``[2, 5]``) inside a sentence (prose before and after it on its
    line) read as a list of strings, or a bracketed label at the start of a line that
    prose follows on that line (``[Note] The list:``). Such a value loses to a later
    list of strings written as strict JSON (:func:`_chosen`); a bracket group at the end
    of its line (``Tags: [python, django]``) is never weak."""
    start, end, parsed = pick
    if not isinstance(parsed.value, list) or text[start:start + 1] != "[" \
            or end - start > 64:
        return False
    body = text[start:end]
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    before = text[line_start:start]
    after = text[end:len(text) if line_end < 0 else line_end]
    if _WORD.search(after) is None:
        return False
    if _CITATION.fullmatch(body):
        return _WORD.search(before) is not None and bool(parsed.value) and all(
            isinstance(v, str) for v in parsed.value)
    return _LABEL.fullmatch(body) is not None and not before.strip()


def _strict_strings(text: str, pick: Pick) -> bool:
    """Whether a value is a list of strings written as strict JSON."""
    start, end, parsed = pick
    if not isinstance(parsed.value, list) or text[start:start + 1] != "[":
        return False
    try:
        value = orjson.loads(text[start:end])
    except orjson.JSONDecodeError:
        return False
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)


#: Prose right before a value on its line: a letter, then at most space, Markdown,
#: quotes, a backtick or an opening bracket ("suggests {", "is `{").
_PROSE_BEFORE = re.compile(r"[^\W\d_][ \t*_`\"'“‘(]*\Z")
#: Prose right after a value on its line, the sentence going on: at most closing
#: quotes, a backtick, Markdown or a hyphen, then a letter ("} at first glance",
#: "}-ish"; not "}, but ...", where the value ends a clause).
_PROSE_AFTER = re.compile(r"[ \t\"'”’`*_)]*-?[^\W\d_]")
#: What a value standing on its own may have before it on its line: nothing, or a
#: label that ends in a colon ("Answer:", "**Final:**", "- So:"), Markdown, quotes or a
#: tag between.
_ALONE_BEFORE = re.compile(r"[ \t>*_#`\"'“(-]*(?:[^\n{}\[\]]*[:：][ \t*_`\"'“(]*)?"
                           r"(?:<[A-Za-z_|][\w|:-]*>[ \t]*)?")
#: A tag (``</answer>``): no prose after a value.
_TAG = re.compile(r"</?[A-Za-z_|][\w|:-]*>")


def _line_around(text: str, start: int, end: int) -> tuple[int, int]:
    """Where the line (or lines) of the value ``text[start:end]`` start and end."""
    line_end = text.find("\n", end)
    return text.rfind("\n", 0, start) + 1, len(text) if line_end < 0 else line_end


def _mention(text: str, start: int, end: int) -> bool:
    """Whether the value ``text[start:end]`` is mentioned inside a sentence: prose right
    before it and right after it on its line (:data:`_PROSE_BEFORE`,
    :data:`_PROSE_AFTER`: "The review suggests {...} at first glance", "The tone is
    {...}-ish."). Such a value loses to a later one that stands on its own
    (:func:`_alone`, :func:`_chosen`), as a citation does (:func:`_weak`)."""
    begin, stop = _line_around(text, start, end)
    return _PROSE_BEFORE.search(text, max(begin, start - 8), start) is not None \
        and _PROSE_AFTER.match(text, end, min(stop, end + 8)) is not None


def _alone(text: str, start: int, end: int) -> bool:
    """Whether the value ``text[start:end]`` stands on its own: alone on its line, or
    after a label only ("Answer: {...}", "So:\n{...}"), with nothing but punctuation,
    Markdown or a tag after it on its line."""
    begin, stop = _line_around(text, start, end)
    if start - begin > _INTRO or stop - end > _INTRO:
        return False
    after = _TAG.sub("", text[end:stop])
    return _WORD.search(after) is None and not any(c.isdigit() for c in after) \
        and _ALONE_BEFORE.fullmatch(text, begin, start) is not None


def _cued(text: str, start: int, end: int) -> bool:
    """Whether the value at ``start`` is introduced as not the answer, or a correction
    follows ``end``, or a revision may (a verdict right after it, or revision words
    introducing a later bracket; whether it counts is judged once the later value is
    found, :func:`_corrected`)."""
    return _not_the_answer(text, start, 0) or _correction(text, end, len(text)) \
        or _revision_after(text, end)


def _revision_after(text: str, end: int) -> bool:
    """Whether the first sentence after ``end`` is a verdict on the value there, or a
    bracket after it is introduced as a revision. Linear: only the brackets right
    after a revision word (:data:`_REVISION_HINT`) are tried, each once."""
    at = _AFTER_VALUE.match(text, end).end()  # type: ignore[union-attr]
    cut = _SENTENCE_END.search(text, at, at + _INTRO)
    sentence = text[at:cut.end() if cut is not None else at + _INTRO]
    if _VERDICT.search(sentence) or _VERDICT_AFTER.match(sentence):
        return True
    pos = end
    while (hint := _REVISION_HINT.search(text, pos)) is not None:
        bracket = ANY_START.search(text, hint.end())
        if bracket is None:
            return False
        at = bracket.start()
        if at - hint.end() > _INTRO:
            pos = at - _INTRO  # (a word farther before it introduces nothing)
            continue
        if _revised(text, None, at, max(end, at - _CORRECTION_REACH)):
            return True
        pos = at + 1
    return False


#: An emoticon's eyes and nose right before a bracket (``Sorry :[``, ``Hmm, no :-[``):
#: that bracket opens no value.
_EMOTICON = re.compile(r"(?:^|(?<=\s))[:;=][-'^]?\Z")
#: What a value begun after an opening bracket starts with (space skipped): a quote, a
#: key or literal, a digit, a minus sign, a bracket. A bracket the output ends right
#: after ("Actually: [") began nothing that can be told from a stray one.
_VALUE_BEGINS = re.compile(r"\s*[\"'“{\[｛［\d\-A-Za-z_]")


def _answer(text: str, picks: list[Pick], plan: OutputPlan, fixes: Fixes) -> Parsed:
    """The answer among usable values (:func:`_chosen`), unless the output ends inside
    a value introduced as a correction or the final answer ("Actually, the correct
    output is {...cut", :func:`_cut_correction`): then the value it corrects is the one
    the model took back, and the output is refused (cut off), never delivered so, nor
    the part of the correction that finished; nor when a correction in words after
    the last value names another member of an enum field (:func:`_retracted_in_words`)."""
    if _cut_correction(text, picks, keep=plan.keep_truncated):
        return unusable(ParseStatus.INVALID_JSON, plan,
                        "the output was cut off inside the answer that corrects the "
                        "value before it", (*fixes.labels(), "truncated"))
    taken_back = _unusable_correction(text, picks, plan, fixes)
    if taken_back is not None:
        return taken_back
    chosen = _chosen(text, picks)
    taken_back = _retracted_in_words(text, picks, chosen, plan, fixes)
    if taken_back is not None:
        return taken_back
    refusal = _refused(text, picks)
    if refusal is not None:
        return unusable(ParseStatus.NO_JSON_FOUND, plan,
                        f"the output declines to answer ({refusal!r}) and its only "
                        f"values are introduced as examples of the format, not as its "
                        f"answer", fixes.labels())
    return chosen


#: The model declining to answer, at the start of a clause of its own: "I can't
#: classify this.", "I cannot determine ...", "I'm unable to ...", "I won't ...",
#: "Sorry, I can't ...", "Unable to determine ...".
_REFUSAL = re.compile(
    r"(?i)(?:^|(?<=[.!?…。！？\n,;:]))[\s*_>\"'“(]*(?:(?:sorry|i'?m sorry|i apologi[sz]e|"
    r"unfortunately)[,!. \t]+(?:but[ \t]+)?)?(?:"
    r"i[ \t]*(?:can(?:no|'|’)t|cannot|can[ \t]+not|won(?:'|’)t|will[ \t]+not"
    r"|must[ \t]+decline|(?:am|'m|’m)[ \t]+(?:unable|not[ \t]+able)"
    r"|(?:do[ \t]+not|don(?:'|’)t)[ \t]+have[ \t]+enough)"
    r"|unable[ \t]+to[ \t]+(?:determine|classify|answer|help|assist|comply|tell|decide"
    r"|provide|extract))(?![\w'’])")


def _refused(text: str, picks: list[Pick]) -> str | None:
    """The words with which the model declines to answer (:data:`_REFUSAL`, outside the
    values and outside a quotation on its line) when every value is introduced as not
    the answer (an example of the format, :func:`_not_the_answer`): then that value is
    no answer either; else None (a lone example with no refusal is delivered, as
    documented)."""
    if not all(_not_the_answer(text, s, picks[i - 1][1] if i else 0)
               for i, (s, _e, _p) in enumerate(picks)):
        return None
    at = 0
    for start, end, _ in [*picks, (len(text), len(text), picks[-1][2])]:
        for m in _REFUSAL.finditer(text, at, start):
            if not _quoted(text, m.end() - 1):
                return m.group().strip(" \t\n*_>\"'“(")
        at = end
    return None


#: How much of a value an error message quotes (characters).
_QUOTED_VALUE = 80


def _unusable_correction(text: str, picks: list[Pick], plan: OutputPlan,
                         fixes: Fixes) -> Parsed | None:
    """Why the output is unusable when a complete value after the usable ones is
    introduced as a correction or the final answer (:func:`_corrected`; not as an
    example, :func:`_not_the_answer`) and is itself unusable (a member outside the
    enum, a required field missing, a misspelled key): it supersedes every value
    before it, which the model took back, so none of those is delivered - as for a
    correction the output ends inside (:func:`_cut_correction`). The last such value
    explains; None when there is none, or when a usable value follows one (the
    choice among usable values stands)."""
    end = picks[-1][1]
    if not (_correction(text, end, len(text)) or _revision_after(text, end)):
        return None  # (the usual reply: nothing after the last value corrects it)
    start_at = ANY_START if plan.expect == "array" else OBJECT_START
    before: Pick = picks[-1]
    failure: tuple[Region, Parsed] | None = None
    for region in regions(text, start_at, _REGIONS, pos=end):
        if not region.closed:
            break
        parsed = next((finish(value, plan, _with(fixes, labels), repaired=repaired, cut=cut)
                       for value, labels, repaired, cut in _candidates(text, region, plan)),
                      None)
        if parsed is not None and parsed.usable:
            return None
        here: Pick = (region.start, region.end, before[2])
        if parsed is not None and not _not_the_answer(text, region.start, before[1]) \
                and _corrected(text, [before, here], 1):
            failure = (region, parsed)
        before = here
    if failure is None:
        return None
    region, parsed = failure
    written = text[region.start:region.end]
    if len(written) > _QUOTED_VALUE:
        written = written[:_QUOTED_VALUE - 3] + "..."
    status = parsed.status if parsed.status in (
        ParseStatus.SCHEMA_VIOLATION, ParseStatus.INVALID_JSON) \
        else ParseStatus.SCHEMA_VIOLATION
    return unusable(status, plan,
                    f"the value introduced as a correction of the answer before it, "
                    f"{written}, is not usable ({parsed.error or parsed.status.value}); "
                    f"the value it corrects was taken back, so neither is delivered "
                    f"(the task retries)", parsed.fixes)


#: A correction phrase of :data:`_CORRECTION` that concludes rather than takes back
#: ("Finally,", "In conclusion", "Therefore the output", "the answer is", "I choose"):
#: no retraction in words (:func:`_retracted_in_words`).
_CONCLUSION = re.compile(
    r"(?i)final|conclu|therefore|thus|hence|consequently|accordingly|answer is"
    r"|my (?:final )?answer|pick|choose|select|go with|结论|最终|最終|최종|정답")
#: How far after a correction phrase the member it names is looked for (characters):
#: the passage it starts (up to a blank line).
_RETRACTION_REACH = 240
#: How many correction phrases after the last value are looked at (each costs a pass
#: over its line: the time per output stays bounded).
_MAX_RETRACTIONS = 16
#: What may follow a member named as the answer, up to the end of its clause: closing
#: quotes or Markdown, one adverb ("negative instead", "negative overall"), then a
#: clause's end (not a question: "is it negative?" takes nothing back).
_MEMBER_END = re.compile(
    r"[\"'”’」』*_`]*(?:[ \t]+(?i:instead|overall|after all|then|rather|actually|really"
    r"|though|here|in the end))?[\"'”’」』*_`]*[ \t]*(?:[.,;:!…。，；：！)）—–\n]|\Z)")
#: A negation in the clause before a member ("not negative", "isn't negative", "rather
#: than negative", 不是负面): the member is what the answer is not.
_MEMBER_NEGATED = re.compile(
    r"(?i)(?<![\w'’])(?:not|never|no longer|rather than|instead of|nor)(?![\w'’])"
    r"|n['’]t(?![\w'’])|不是|并非|而非|不算")
#: Where a clause ends, before a member named in it.
_CLAUSE_END = re.compile(r"[.,;:!?…。，；：！？\n]|(?i:\bbut\b)")
#: Letters of scripts written without spaces between words: a member written in them
#: is found without a word boundary.
_UNSPACED = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")


def _enum_choices(node: Any, value: Any) -> list[tuple[str, str, list[str]]]:
    """The enum fields of a delivered object (and of the objects in it, a few levels
    deep): each field's name, its member in ``value`` and the other members that are
    words (strings with a letter), for :func:`_retracted_in_words`."""
    out: list[tuple[str, str, list[str]]] = []
    stack: list[tuple[Any, Any, int]] = [(node, value, 0)]
    while stack and len(out) < 16:
        here, item, depth = stack.pop()
        if here is None or depth > 4:
            continue
        if isinstance(item, list):
            stack.extend((here.items, v, depth + 1) for v in item[:8])
            continue
        if not isinstance(item, dict):
            continue
        for key, v in item.items():
            prop = here.props.get(key)
            if prop is None:
                continue
            if isinstance(v, str) and prop.enum is not None:
                others = [m for m in prop.enum if isinstance(m, str) and m.casefold()
                          != v.casefold() and _WORD.search(m) is not None]
                if others:
                    out.append((key, v, others))
            elif isinstance(v, (dict, list)):
                stack.append((prop, v, depth + 1))
    return out


def _member_pattern(members: Iterable[str]) -> re.Pattern[str]:
    """Members named as whole words, any case (longest first; no word boundary at an
    end written in a script without spaces, :data:`_UNSPACED`)."""
    parts = []
    for m in sorted(members, key=len, reverse=True):
        head = "" if _UNSPACED.match(m) else r"(?<![\w'’-])"
        tail = "" if _UNSPACED.match(m[-1]) else r"(?![\w'’-])"
        parts.append(head + re.escape(m) + tail)
    return re.compile("(?i:" + "|".join(parts) + ")")


def _named(text: str, pattern: re.Pattern[str], begin: int, end: int
           ) -> Iterator[re.Match[str]]:
    """The members of ``pattern`` named as the answer in ``text[begin:end]``: at the end
    of their clause (:data:`_MEMBER_END`), not negated in it (:data:`_MEMBER_NEGATED`),
    and outside a quotation unless the quotation is the member alone (the correct
    label is "negative")."""
    for m in pattern.finditer(text, begin, end):
        if _MEMBER_END.match(text, m.end(), end) is None:
            continue
        clause = deque(_CLAUSE_END.finditer(text, begin, m.start()), maxlen=1)
        if _MEMBER_NEGATED.search(text, clause[0].end() if clause else begin,
                                  m.start()) is not None:
            continue
        if _quoted(text, m.start()) and not (
                text[m.start() - 1:m.start()] in "\"'“‘「『«"
                and text[m.end():m.end() + 1] in "\"'”’」』»"):
            continue
        yield m


def _retracted_in_words(text: str, picks: list[Pick], chosen: Parsed, plan: OutputPlan,
                        fixes: Fixes) -> Parsed | None:
    """Why the output is unusable when, after its last value, a correction phrase of
    the model's own (:data:`_CORRECTION` at a clause's start; not one of the words that
    count only before a value, :func:`_added`; not quoted, not a conclusion,
    :data:`_CONCLUSION`; in a sentence that states no condition) is followed in the
    same passage by another member of an enum field of the delivered value, named as
    the answer in words (:func:`_named`: "Wait, I misread the review. It is actually
    negative.", 不对，应该是负面。, "Please ignore the above; the correct label is
    \"negative\"."): the model took the value back without writing the one it meant,
    so it is not delivered (the task retries). The member delivered named again after
    it ("..., so positive after all") keeps the value; None when nothing so follows,
    or a value follows (the rules for several values judge it)."""
    end = picks[-1][1]
    if not chosen.usable or end >= len(text) or not text[end:].strip():
        return None
    choices = _enum_choices(plan.root, chosen.value)
    if not choices:
        return None
    for m in itertools.islice(_corrections(text, end, len(text)), _MAX_RETRACTIONS):
        if _added(m) or _CONCLUSION.search(m.group()) or _quoted(text, m.start()):
            continue
        blank = re.compile(r"\n[ \t]*\n").search(text, m.end(), m.end() + _RETRACTION_REACH)
        stop = blank.start() if blank is not None else min(len(text), m.end()
                                                            + _RETRACTION_REACH)
        head = text[max(end, m.start() - _INTRO):m.start()]
        ends = list(_SENTENCE_END.finditer(head))
        sentence_start = m.start() - len(head) + (ends[-1].end() if ends else 0)
        for field, given, others in choices:
            for named in _named(text, _member_pattern(others), m.end(), stop):
                if _HYPOTHETICAL.search(text, sentence_start, named.end()) is not None:
                    continue
                if next(_named(text, _member_pattern([given]), named.end(), stop),
                        None) is not None:
                    continue  # (the delivered member named again: "..., so positive")
                if regions(text, ANY_START, 1, pos=end):
                    return None  # (a value follows, even cut: judged as several values)
                phrase = m.group().strip(" \t\n*_#>\"'“(-,")
                member = next((o for o in others
                               if o.casefold() == named.group().casefold()), named.group())
                return unusable(ParseStatus.SCHEMA_VIOLATION, plan,
                                f"the output takes its value back in prose after it "
                                f"({phrase!r} ... {named.group()!r}): the words name "
                                f"{member!r} for the field {field!r}, not the delivered "
                                f"{given!r}, and write no value for it, so the value is "
                                f"not delivered (the task retries; ask for the answer "
                                f"only)", fixes.labels())
    return None


def _with(fixes: Fixes, labels: tuple[str, ...]) -> Fixes:
    """A copy of ``fixes`` with ``labels`` applied."""
    inner = fixes.copy()
    for label in labels:
        inner.repair(label)
    return inner


def _cut_correction(text: str, picks: list[Pick], *, keep: bool) -> bool:
    """Whether the output ends inside a value that a correction phrase directly
    introduces after a usable one: the last usable value when it was read from a cut
    one (:func:`.finish.ended_inside`; unless ``keep``: the rule asks for cut values),
    else a bracket left open after it. A bracket that is an emoticon's mouth (``Sorry
    :[``, :data:`_EMOTICON`), or that the output ends right after, opens no value; a
    value introduced as an example or a format is no correction."""
    start, end, last = picks[-1]
    opened = False
    if len(picks) > 1 and ended_inside(last):
        if keep:
            return False
        at, before = start, picks[:-1]
    else:
        rest = text[end:]
        # (counted first: a bracket left open is rare, and first_open walks the rest)
        bracket = first_open(rest) if sum(map(rest.count, "{[｛［")) > sum(
            map(rest.count, "}]｝］")) else None
        if bracket is None:
            return False
        at, before, opened = end + bracket, picks, True
        if _EMOTICON.search(text, max(0, at - 3), at) is not None \
                or _VALUE_BEGINS.match(text, at + 1) is None:
            return False
    after = before[-1][1]
    cut = [*before, (at, len(text), last)]
    if opened and _introduces_cut(text, after, at, added=False) \
            and _corrected(text, cut, len(before), added=False):
        return True  # (a bracket left open after a correction label, "Correction: {")
    # (the other ways, told more finely: "不对，应该是：{", "我搞错了：{", a cut value read)
    return _introduces_cut(text, after, at) and not _not_the_answer(text, at, after) \
        and _corrected(text, cut, len(before))


#: What stands between a label's colon and the bracket of the value it introduces:
#: space, Markdown, a fence's opening line or an answer tag.
_TO_BRACKET = r"[\s*_]*(?:```[\w+.-]*\s*|<[A-Za-z_|][\w|:-]*>\s*)?[{\[｛［]"
#: What may stand between a correction phrase and the cut value it introduces: "is",
#: "should be", a colon, a fence's opening line or an answer tag ("the correct output is {",
#: "Correction: {", "Final answer:\n```json\n{").
_CUT_TAIL = re.compile(
    r"(?i)[ \t,]*(?:(?:that|this|it)[ \t]*[:：.,!—–-]?[ \t]*)?"
    r"(?:(?:here(?:'s|’s| is)|it(?:'s|’s| is))[ \t]+)?(?:(?:the|my|a)[ \t]+)?"
    r"(?:(?:correct|corrected|final|new|updated|revised|fixed|right|actual|real)[ \t]+)?"
    r"(?:(?:answer|output|result|version|json|label|response|classification|object|list"
    r"|one)[ \t]*)?(?:(?:is|was|would be|should be|will be)[ \t]*)?"
    r"[:：.,!—–-]?" + _TO_BRACKET)
#: The same in Chinese, Japanese or Korean: words that name the answer up to a colon
#: right before the value (:data:`_ANSWER_CLAUSE`: "不对，应该是：{", "最终答案：{",
#: "纠正一下：\n{"; not "最终说明：分数在[", "重新分类的候选标签：["), told more finely
#: (:func:`_cut_correction`).
_CUT_CLAUSE_TAIL = re.compile(
    r"(?i)[ \t]*(?:[，,、][ \t]*)?" + _ANSWER_CLAUSE + r"[ \t]*[:：]" + _TO_BRACKET)


def _introduces_cut(text: str, begin: int, at: int, *, added: bool = True) -> bool:
    """Whether a correction phrase in ``text[begin:at]`` directly introduces the value
    whose bracket opens at ``at`` ("Actually, the correct output is {", "Correction:
    {", "Final answer: {"); not "Final note: scores are in [", "Finally, ... [", "In
    conclusion, the field {", "Format: {", "The correct answer is above. Valid labels:
    [". Only if ``added``: the words of :func:`_added` (:data:`_NEAR_TAIL`), words
    that name the answer (:data:`_CUT_CLAUSE_TAIL`), or a sentence right before it
    that ends in a revision (:data:`_REVISION_END`, :data:`_ANSWER_END`: "修改后：{",
    "改为：{", "应该是：{") and names no other item.
    """
    for m in _corrections(text, max(begin, at - _INTRO), at):
        if not added and _added(m):
            continue
        tails = ((_NEAR_TAIL,) if m.group("near") is not None
                 else (_CUT_TAIL, _CUT_CLAUSE_TAIL) if added else (_CUT_TAIL,))
        for tail in tails:
            found = tail.match(text, m.end(), at + 1)
            if found is not None and found.end() == at + 1:
                return True
    if not added:
        return False
    lead = _lead(text, at, begin)
    return (_REVISION_END.search(lead) is not None or _ANSWER_END.search(lead) is not None) \
        and _OTHER_ITEM.search(lead) is None and _HYPOTHETICAL.search(lead) is None \
        and not _another_item(text, at, begin)


#: A label that calls its value a draft ("Draft 2:", "Entwurf (neu):", "下書き：") or a
#: numbered step's output ("Step 1 output:"): when every value is so introduced, the
#: last is the answer (:func:`_chosen`).
_DRAFT_LEAD = re.compile(
    r"(?i)^[\s*_#>\-]*(?:(?:the|my|a|an|first|second|third|next|another|new)[ \t]+)?"
    r"(?:drafts?|entwurf|brouillon|borrador|bozza|rascunho|черновик|szkic|taslak|مسودة"
    r"|下書き|草稿|초안)(?![\w'’])(?:[ \t]*(?:#|no\.|nr\.)?[ \t]*\d{1,2}|[ \t]+[ivx]{1,4}"
    r"|[ \t]*[(（]\d{1,2}[)）])?[ \t]*[:：][\s*_]*\Z"
    r"|^[\s*_#>\-]*step[ \t]*\d{1,2}[ \t]+(?:output|result)[ \t]*[:：][\s*_]*\Z")


def _chosen(text: str, picks: list[Pick]) -> Parsed:
    """The answer among usable values: the values introduced as not the answer
    (examples, drafts, the input, conditions) are left out (unless that leaves none),
    so are bracketed prose and citations (:func:`_weak`) when a later list of strings
    written as strict JSON remains, and values mentioned inside a sentence
    (:func:`_mention`) when a later one stands on its own (:func:`_alone`), then the
    last one introduced as a correction or the
    final answer, else the first. When every value is introduced as a draft, the last
    (:data:`_DRAFT_LEAD`)."""
    if len(picks) > 1 and all(
            _DRAFT_LEAD.search(_lead(text, s, picks[i - 1][1] if i else 0)) is not None
            for i, (s, _e, _p) in enumerate(picks)):
        return picks[-1][2]  # drafts only ("Draft 1: {...} Draft 2: {...}"): the last
    kept = [i for i in range(len(picks))
            if not _not_the_answer(text, picks[i][0], picks[i - 1][1] if i else 0)] \
        or list(range(len(picks)))
    if len(kept) > 1:
        # (a template echoed before the answer: never the answer when one follows)
        kept = [i for i in kept if not _echo(picks[i][2].value)] or kept
    if len(kept) > 1:
        kept = [i for n, i in enumerate(kept) if not (_weak(text, picks[i]) and any(
            _strict_strings(text, picks[j]) and not _weak(text, picks[j])
            for j in kept[n + 1:]))]
    if len(kept) > 1:
        # (a value mentioned inside a sentence, "suggests {...} at first glance", loses
        # to a later one that stands on its own)
        kept = [i for n, i in enumerate(kept) if not (
            _mention(text, picks[i][0], picks[i][1])
            and any(_alone(text, picks[j][0], picks[j][1]) for j in kept[n + 1:]))]
    chosen = kept[0]
    for i in kept[1:]:
        if _corrected(text, picks, i):
            chosen = i
    return picks[chosen][2]


def _first_strict(text: str, plan: OutputPlan, fixes: Fixes,
                  start_at: re.Pattern[str]) -> Parsed | None:
    found = regions(text, start_at, limit=1)
    if not found or found[0].value is NOT_READ or wide_bracket(text, found[0].start) \
            or _cued(text, found[0].start, found[0].end) \
            or _mention(text, found[0].start, found[0].end):
        return None
    for value, labels, repaired, _ in _candidates(text, found[0], plan):
        inner = fixes.copy()
        for label in labels:
            inner.repair(label)
        parsed = finish(value, plan, inner, repaired=repaired)
        return parsed if parsed.usable and not _weak(
            text, (found[0].start, found[0].end, parsed)) and not _echo(parsed.value) \
            else None
    return None


def _search_regions(text: str, plan: OutputPlan, fixes: Fixes,
                    start_at: re.Pattern[str]) -> Parsed:
    picks, failures, found = _region_picks(text, plan, fixes, start_at)
    if not found:
        return unusable(ParseStatus.NO_JSON_FOUND, plan,
                        "no JSON object or array in the output"
                        + ("" if text.strip() else " (it is empty)"))
    if picks:
        return _answer(text, picks, plan, fixes)
    if not failures:
        last = found[-1]
        end = None if last.closed else _closes(text, last.start)
        if not last.closed and end is None and '\\"' in text[last.start:]:
            escaped = _escaped_answer(text[last.start:], plan, fixes)
            if escaped is not None:
                return escaped
        if not last.closed and end is None:
            return unusable(ParseStatus.INVALID_JSON, plan,
                            "the output was cut off before any value in it finished",
                            (*fixes.labels(), "truncated"))
        why = ""
        if any(r.end - r.start <= MAX_REPAIR and too_costly(text[r.start:r.end])
               for r in found):
            why = (" (it has too many unquoted keys and values: too costly to repair; "
                   "ask for strict JSON)")
        elif end is not None:
            # Not cut off (its brackets and quotes close): say what is wrong instead.
            try:
                orjson.loads(text[last.start:end])
            except orjson.JSONDecodeError as exc:
                why = f" ({exc})"
        return unusable(ParseStatus.INVALID_JSON, plan,
                        f"the output holds JSON-like text that could not be read{why}",
                        fixes.labels())
    # The failure that recovered most of the expected fields explains best; the first
    # such one (max keeps the first of equals).
    return max(failures, key=lambda p: (p.completeness,
                                        p.status is ParseStatus.SCHEMA_VIOLATION))


def _escaped_answer(tail: str, plan: OutputPlan, fixes: Fixes) -> Parsed | None:
    """A region read as cut off whose quotes are escaped (``{\\"a\\": 1}`` after words
    that hold a bare quote): read with its escapes undone when its brackets then close;
    else why not (it was not cut off). None when it does not close either way."""
    plain = _ESCAPED.sub(lambda m: m.group(1), tail)
    end = _closes(plain, 0)
    if end is None:
        return None
    if "unescaped" not in fixes.applied:
        inner = fixes.copy()
        inner.repair("unescaped")
        inner.repair("extracted:chatter")
        found = search(plain[:end], plan, inner)
        if found.usable or not found.truncated:
            return found
    return unusable(ParseStatus.INVALID_JSON, plan,
                    "the output holds JSON-like text with escaped quotes (as inside a "
                    "JSON string) that could not be read", fixes.labels())


def _closes(text: str, start: int) -> int | None:
    """Where the bracket at ``start`` closes, counting brackets outside double-quoted
    strings (and nothing else about JSON); None when the text ends first: then it was
    cut off, else it is broken otherwise."""
    depth, i, n = 0, start, len(text)
    in_string = False
    while i < n:
        c = text[i]
        if in_string:
            if c == "\\":
                i += 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return None


def _region_picks(text: str, plan: OutputPlan, fixes: Fixes, start_at: re.Pattern[str]
                  ) -> tuple[list[Pick], list[Parsed], list[Region]]:
    """The usable values of the regions of ``text`` (as many as :func:`_more_wanted`
    asks for), the failures before them, and the regions."""
    found = _unquoted_regions(text, start_at)
    if len(found) == _REGIONS and found[-1].closed:
        # Many brace groups first (LaTeX's \frac{a}{b}, a list of examples): the answer
        # usually ends the reply, so the last few regions of the text are tried as well.
        found += last_regions(text, start_at, _LAST_REGIONS, pos=found[-1].end)
    failures: list[Parsed] = []
    picks: list[Pick] = []
    for region in found:
        before = len(picks)
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
        # (asked again only when a value was added: the answer is the same otherwise)
        if len(picks) > before and not _more_wanted(text, picks):
            break
    return picks, failures, found


def _unquoted_regions(text: str, start_at: re.Pattern[str]) -> list[Region]:
    """The first :data:`_REGIONS` regions of ``text``, none starting inside a quotation
    in prose that holds escaped quotes (``"{\\"label\\": ...}" is in the review``): JSON
    quoted as a string is cited, not written (read as written, its escaped quotes
    would run into the text after it; the answer encoded twice is decoded by
    :func:`_encoded`)."""
    quoted = [span for span in _string_spans(text) if span[2]
              and '\\"' in text[span[0]:span[1]]] if '\\"' in text else []
    out: list[Region] = []
    pos = 0
    while len(out) < _REGIONS:
        batch = regions(text, start_at, _REGIONS - len(out), pos=pos)
        for region in batch:
            inside = _containing(quoted, region.start)
            if inside is not None:
                pos = inside[1]  # scan again after the quotation
                break
            out.append(region)
        else:
            break
    return out


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
    # (labelled: complete objects, but parts of an answer the output ended inside,
    # which a provider's report of a cut must not deliver as if whole, :mod:`.finish`)
    inner = (c for s, e in region.inner
             for c in _read(text[s:e], ("extracted:chatter", EXTRACTED_FROM_CUT), None,
                            repair_it=False)
             # an object inside a cut list answer is no list answer of its own
             if plan.expect != "array" or not isinstance(c[0], dict))
    if text[region.start] == "[" and plan.expect != "array":
        # A bracket that never closes before the end: the complete objects in it first
        # (the first of them is the answer, as for an array of objects), then the cut
        # list itself, then the complete objects written after its last complete
        # element (:func:`_after_elements`). Its other complete values (``[]``,
        # ``[1]``, a number) come last: an element that is no object is never delivered
        # alone ahead of an object that follows it (``[[]{...}``, ``[[]'{...}``: the
        # bracket may be prose before the object).
        others: list[Candidate] = []
        for c in inner:
            if isinstance(c[0], dict):
                yield c
            else:
                others.append(c)
        yield from own
        yield from _after_elements(text, region)
        yield from others
    else:
        yield from own
        yield from inner


def _after_elements(text: str, region: Region) -> Iterator[Candidate]:
    """Complete objects, strict JSON, that stand in a cut list after its last complete
    element where the scan read no element: past a quote that never closes (``[['``,
    ``[[]'`` before an object: the brackets and the quote were prose), or in a list
    opened there that never closes either (``[[][{...}``, read the same way). An
    element the output ended inside that is no list stops the search. At most
    :data:`_MAX_RESTARTS` regions are read (the time per output stays bounded)."""
    budget = _MAX_RESTARTS
    while budget > 0:
        after = region.inner[-1][1] if region.inner else region.start + 1
        found = regions(text, OBJECT_START, budget, pos=after)
        budget -= max(len(found), 1)
        for r in found:
            if r.closed and isinstance(r.value, dict):
                yield r.value, ("extracted:chatter", EXTRACTED_FROM_CUT), False, None
        if not found or found[-1].closed or text[found[-1].start] != "[":
            return
        region = found[-1]
        for s, e in region.inner:  # a list left open inside: its complete objects
            value = strict_region(text, s)
            if value is not None and value.end == e and isinstance(value.value, dict):
                yield value.value, ("extracted:chatter", EXTRACTED_FROM_CUT), False, None


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
    # A quote inside a string that no JSON syntax follows is text (an inch mark: "The
    # 5" screen"): escaped first, as the scan reads it, when the text is then JSON
    # (json_repair would end the string there, or keep the closing quote in it).
    quoted = escape_inner_quotes(body) if '"' in body else None
    if quoted is not None:
        value = _json_value(quoted)
        if value is None and (bare := bare_values(quoted)) is not None:
            value = _json_value(bare)
        if value is not None:
            yield value, (*labels, "repaired:json"), True, cut
            return
    # A bare value read whole, never cut short (a dash as a minus sign, "1 234",
    # "3 or 4" kept whole so that no number field takes its first token).
    bare = bare_values(body)
    if bare is not None:
        value = _json_value(bare)
        if value is not None:
            yield value, (*labels, "repaired:json"), True, cut
            return
        body = bare
    # A quote inside a single-quoted string that no JSON syntax follows is an
    # apostrophe ('don't know', 'the users' choice'): escaped first, as neither Python
    # (which would join 'users' 'tis' into one string) nor json_repair (which keeps
    # "don't know'") reads it so.
    escaped = escape_apostrophes(body) if "'" in body else None
    literal = python_literal(body if escaped is None else escaped)
    if literal is not None:
        yield literal, (*labels, "repaired:python"), True, cut
        return
    if repair_it and len(body) <= MAX_REPAIR:
        value = repair(body)
        if value is not None:
            yield value, (*labels, "repaired:json"), True, cut


def _json_value(text: str) -> Any:
    """``text`` read as JSON, strictly or by :func:`lenient_json`, when it is an object
    or an array; else None."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return lenient_json(text)
    return value if isinstance(value, dict | list) else None


#: The tags that hold the answer itself (searched first, in order), opening or
#: closing: group 1 the slash, group 2 the name (or ``solution`` for DeepSeek's form).
_ANSWER_TAG = re.compile(r"(?i)<(/?)(answer|final_answer|final|output|result)>"
                         r"|<\|(begin|end)_of_(solution)\|>")
#: What the string scan stops at outside a string: a double quote, a bracket, or a
#: single quote where a Python literal's string opens (after an opening bracket, a
#: colon or a comma).
_STRING_SYNTAX = re.compile(r"""[{\[:,][ \t\r\n]*+'|["{}\[\]]""")
_DOUBLE_SYNTAX = re.compile(r'["{}\[\]]')
#: The rest of a single-quoted string up to a quote, on its line.
_SINGLE_REST = re.compile(r"(?:[^'\\\n]|\\.)*'")
#: The rest of a JSON string after its opening quote; outside brackets it must close
#: on its line (JSON strings hold no raw line break: an unmatched quote is prose).
_STRING_REST = re.compile(r'(?:[^"\\]|\\.)*"', re.S)
_LINE_STRING_REST = re.compile(r'(?:[^"\\\n]|\\.)*"')


def _string_spans(text: str) -> list[tuple[int, int, bool]]:
    """Where the JSON string literals of ``text`` stand (quotes included), in order,
    and whether each stands outside brackets (a quotation in prose): a tag inside one
    is content (a note quoting ``<answer>`` or ``</think>``), never structure. One pass
    (each quote's string is matched once), so it is linear."""
    spans: list[tuple[int, int, bool]] = []
    depth = pos = 0
    dead = -1  # no single-quoted string closes on the line before this
    opened = _first_openings(text)
    while (m := _STRING_SYNTAX.search(text, pos) if pos >= dead else (
            _DOUBLE_SYNTAX.search(text, pos, dead) or _STRING_SYNTAX.search(text, dead))
           ) is not None:
        at = m.start()
        c = text[at]
        if text[m.end() - 1] == "'":
            # A single-quoted string of a Python literal ({'a': 'x <think> y'}), inside
            # brackets; it ends at a quote that JSON syntax follows, on its line.
            if c in "{[":
                depth += 1
            quote = pos = m.end() - 1
            end = _single_quoted_end(text, quote) if depth else None
            if end is not None and opened and _closes_reasoning(text, quote, end, opened):
                end = None  # a quote in reasoning (`label: 'pos</think>{'a': 1}`)
            if end is not None:
                spans.append((quote, end, False))
                pos = end
            else:
                pos += 1
                if depth:
                    # (no later quote of the line closes one either: linear)
                    eol = text.find("\n", quote)
                    dead = len(text) if eol < 0 else eol
            continue
        if c == '"':
            rest = (_STRING_REST if depth else _LINE_STRING_REST).match(text, at + 1)
            ends = _line_closing_tag(text, at, rest.end(), opened) \
                if rest is not None and depth and opened else None
            if ends is not None:
                # A "string" over lines that a reasoning block's closing tag opening a
                # line ends: brackets and quotes of the reasoning (`<think>"{"a": "{"}`
                # then `</think>` on its line), never a JSON value holding that line
                depth, pos = 0, ends
            elif rest is not None:
                spans.append((at, rest.end(), not depth))
                pos = rest.end()
            elif depth:
                spans.append((at, len(text), False))  # cut off inside the string
                break
            else:
                # An unmatched quote in prose: no string starts on the rest of its line
                # (trying each later quote again would make the scan quadratic).
                eol = text.find("\n", at)
                pos = len(text) if eol < 0 else eol
            continue
        depth = depth + 1 if c in "{[" else max(0, depth - 1)
        pos = at + 1
    return spans


def _line_closing_tag(text: str, quote: int, end: int, opened: dict[str, int]) -> int | None:
    """The end of the first closing tag of a reasoning block opened before ``quote`` that
    opens a line inside ``text[quote:end]`` (a double-quoted span over lines); None if
    none."""
    if text.find("\n", quote, end) < 0:
        return None
    for m in _REASONING_TAG.finditer(text, quote, end):
        if not m.group(1) or opened.get(m.group(2).lower(), end) >= quote:
            continue
        line = text.rfind("\n", quote, m.start())
        if line >= 0 and not text[line + 1:m.start()].strip():
            return m.end()
    return None


def _first_openings(text: str) -> dict[str, int]:
    """Where each reasoning tag's name first opens in ``text`` (when any closes): -1 for
    a name that closes before it opens (a headless block, opened by the chat template
    before the reply)."""
    opened: dict[str, int] = {}
    if "</" in text:
        for m in _REASONING_TAG.finditer(text):
            opened.setdefault(m.group(2).lower(), -1 if m.group(1) else m.start())
    return opened


def _closes_reasoning(text: str, quote: int, end: int, opened: dict[str, int]) -> bool:
    """Whether the single-quoted string ``text[quote:end]`` holds the closing tag of a
    reasoning block opened before it (and not in it): then the quote is an apostrophe
    or a quotation in the reasoning, the tag its end (``<think>... label: 'positive
    </think>{'label': ...}``), never the content of a Python literal's string."""
    inside: set[str] = set()
    for m in _REASONING_TAG.finditer(text, quote, end):
        name = m.group(2).lower()
        if not m.group(1):
            inside.add(name)
        elif name not in inside and 0 <= opened.get(name, end) < quote:
            return True  # (not a headless block's: a tag in a one-line string is text)
    return False


def _single_quoted_end(text: str, quote: int) -> int | None:
    """The end of the single-quoted string opening at ``quote``: after the first quote
    on its line that JSON syntax follows (an apostrophe is text); None if none."""
    pos = quote + 1
    while (m := _SINGLE_REST.match(text, pos)) is not None:
        pos = m.end()
        if string_closes(text, pos):
            return pos
    return None


def _outside_strings(matches: Iterator[re.Match[str]], text: str
                     ) -> list[re.Match[str]]:
    """The ``matches`` (tags, syntax) that do not lie inside a string literal of
    ``text``: a JSON string, or a single-quoted string of a Python literal."""
    found = list(matches)
    if not found or ('"' not in text and "'" not in text):
        return found
    spans = _string_spans(text)
    return [m for m in found if _containing(spans, m.start()) is None]


def _containing(spans: list[tuple[int, int, bool]], at: int) -> tuple[int, int, bool] | None:
    """The span of ``spans`` (sorted, not overlapping) that holds ``at``, if any."""
    i = bisect_right(spans, at, key=lambda span: span[0]) - 1  # the last starting <= at
    return spans[i] if i >= 0 and at < spans[i][1] else None


def _answer_containers(text: str) -> Iterator[tuple[int, int, str]]:
    """The answer containers of ``text`` in order (start, end, body): each opening tag
    outside a string up to the first closing tag of its name outside a string, none
    nested in another. Tags are paired by a sorted index of closing tags rather than a
    regex ``<t>(.*?)</t>``, which rescans to the end for every unclosed tag."""
    tags = _outside_strings(_ANSWER_TAG.finditer(text), text)
    closes: dict[str, list[re.Match[str]]] = {}  # each name's closing tags, in order
    for m in tags:
        if _closing(m):
            closes.setdefault(_tag_name(m), []).append(m)
    after = 0
    for m in tags:
        if _closing(m) or m.start() < after:
            continue
        ends = closes.get(_tag_name(m), [])
        i = bisect_left(ends, m.end(), key=lambda close: close.start())
        if i < len(ends):
            after = ends[i].end()
            yield m.start(), after, text[m.end():ends[i].start()]


def _closing(tag: re.Match[str]) -> bool:
    return bool(tag.group(1)) or tag.group(3) == "end"


def _tag_name(tag: re.Match[str]) -> str:
    return (tag.group(2) or tag.group(4)).lower()


#: The tags reasoning models wrap their scratch work in.
_TAGS = r"think|thinking|thought|thoughts|reasoning|scratchpad|analysis|seed:think"
#: A reasoning tag: group 1 the slash of a closing one, group 2 the name.
_REASONING_TAG = re.compile(rf"(?i)<(/?)({_TAGS})>")
#: Reasoning marked otherwise than by a tag, each read as ``<think>...</think>``:
#: Kimi's ``◁think▷``, Magistral's ``[THINK]``, ``<|begin_of_thought|>``, the
#: analysis channel of gpt-oss's harmony format left unparsed (and its other tokens),
#: and Ollama's ``Thinking...`` / ``...done thinking.`` lines.
_OTHER_REASONING = re.compile(
    r"◁/?think▷|\[/?THINK\]|<\|(?:begin|end)_of_thought\|>|<\|channel\|>"
    r"|(?m:^[ \t]*(?:Thinking\.\.\.|\.\.\.done thinking\.)[ \t\r]*$)")
_HARMONY_ANALYSIS = re.compile(
    r"(?s)<\|channel\|>\s*(?:analysis|commentary)\b[^<]*<\|message\|>(.*?)"
    r"(?:<\|end\|>|(?=<\|start\|>)|\Z)")
_HARMONY_TOKENS = re.compile(
    r"<\|start\|>\s*assistant|<\|channel\|>\s*final\b[^<]*<\|message\|>|<\|(?:return|end|call)\|>")
#: A block in one of the bracketed forms: its opener begins a line; closed, or left
#: open to the end of the text (cut off while thinking, :func:`_think_block`). Each
#: form: its body, then its closer (empty when cut off).
_MARKED_BLOCK = re.compile(
    r"(?m)^[ \t]*(?:◁think▷(?s:(.*?))(◁/think▷|\Z)|\[THINK\](?s:(.*?))(\[/THINK\]|\Z)"
    r"|<\|begin_of_thought\|>(?s:(.*?))(<\|end_of_thought\|>|\Z))")
_OLLAMA = re.compile(r"(?m)^[ \t]*Thinking\.\.\.[ \t\r]*\n(?s:(.*?))"
                     r"^[ \t]*\.\.\.done thinking\.[ \t\r]*$")
#: Ollama's opener alone on the first line of the reply, with no closer after it.
_OLLAMA_OPEN = re.compile(r"\s*Thinking\.\.\.[ \t\r]*(?:\n|\Z)")
#: The end of a reply that ends with a value: a closing bracket, then at most a fence's
#: closing line, an answer tag's closing one, Markdown or a full stop.
_ENDS_WITH_VALUE = re.compile(r"[}\]｝］](?:\s|```|</[A-Za-z_|][\w|:-]*>|[*_.])*\Z")


def _as_think_tags(text: str) -> str:
    """``text`` with the reasoning markers of :data:`_OTHER_REASONING` as ``<think>``
    tags, and the harmony format's other tokens removed. A block whose closer never
    comes is an unclosed ``<think>`` (the output ends inside it: cut off while
    thinking) only when it opens the reply (:func:`_think_block`); Ollama's
    ``Thinking...`` alone on the reply's first line is one unless the reply ends with a
    value (Ollama writes ``...done thinking.`` unless cut off, and one cut off while
    thinking ends in its words, not in an answer: "Thinking...\n{...}" is answered)."""
    blocks = _outside_strings(_MARKED_BLOCK.finditer(text), text)
    if blocks:
        # (a block on a line of a string value is its content, kept as written)
        pieces, at = [], 0
        for m in blocks:
            pieces += [text[at:m.start()], _think_block(m)]
            at = m.end()
        text = "".join(pieces) + text[at:]
    if "<|channel|>" in text:
        text = _HARMONY_ANALYSIS.sub(lambda m: f"<think>{m.group(1)}</think>\n", text)
        text = _HARMONY_TOKENS.sub("\n", text)
    if "done thinking." in text:
        text = _OLLAMA.sub(lambda m: f"<think>{m.group(1)}</think>", text)
    opener = _OLLAMA_OPEN.match(text)
    if opener is not None and "done thinking." not in text \
            and _ENDS_WITH_VALUE.search(text, opener.end()) is None:
        text = "<think>" + text[opener.end():]
    return text


def _think_block(m: re.Match[str]) -> str:
    """A block of :data:`_MARKED_BLOCK` as ``<think>`` tags; one whose closer never came
    only when it opens the text, not indented as code (elsewhere the marker is quoted:
    in a code fence, on an indented code line or a string's line, "Note:\n[THINK]
    tokens were removed")."""
    body, closer = next((m.group(i), m.group(i + 1)) for i in (1, 3, 5)
                        if m.group(i) is not None)
    if closer:
        return f"<think>{body}</think>"
    if m.string[:m.start()].strip() or _CODE_OR_QUOTE.match(m.group()) is not None:
        return m.group()
    return f"<think>{body}"


def reasoning_aside(text: str, *, prose: bool = False) -> str:
    """``text`` as the ladder reads it once its reasoning is set aside (reasoning markers
    read as ``<think>`` tags, the blocks removed); ``text`` when it holds none.
    ``prose``: the text is the answer itself (``format: "text"``), which may name the
    tags: a headless block is one only where no reasoning tag opens before its closing
    tag and that tag ends its line ("Models end it with </think> and answer." is
    prose)."""
    converted = _as_think_tags(text) if _OTHER_REASONING.search(text) is not None else text
    aside = _set_aside_reasoning(converted, prose=prose, touching=converted is text)
    return converted if aside is None else aside[0]


def _set_aside_reasoning(text: str, *, prose: bool = False, touching: bool = True
                         ) -> tuple[str, bool, bool] | None:
    """The reply without its reasoning (``<think>...</think>`` blocks - or
    ``<thinking>``, ``<reasoning>`` -, one cut off at the end included, and a headless
    block: the part before a first closing tag that no opening tag opens, as when the
    chat template opened it in the prompt), and whether that is certain; None when
    there is no reasoning. Not certain: a headless block with JSON syntax in it, which
    might instead be an answer holding the text ``</think>`` (the caller then searches
    the whole output if the rest holds no answer). Third: whether the output ends inside
    a block (cut off while thinking). ``prose``: only the tags that are markup count
    (:func:`_markup_tags`; ``touching``: those that touch their content), and only the
    blocks that open the reply (after blanks or another block): a ``<reasoning>``
    element inside an XML answer is part of it."""
    tags = _outside_strings(_REASONING_TAG.finditer(text), text)
    if prose and tags:
        tags = _markup_tags(text, tags, touching=touching)
    if not tags:
        return None
    first_close = next((m for m in tags if m.group(1)), None)
    blocks = _think_blocks(text, tags)
    rest_at, sure = 0, True
    if first_close is not None and not any(s < first_close.start() for s, _, _ in blocks) \
            and not (prose and (any(not m.group(1) and m.start() < first_close.start()
                                    for m in tags)
                                or _LINE_END.match(text, first_close.end()) is None)):
        head = text[:first_close.start()]
        sure = "{" not in head and "[" not in head
        rest_at = first_close.end()
    if prose:
        blocks = _opening_blocks(text, blocks, rest_at)
    if rest_at == 0 and not blocks:
        return None
    pieces, at = [], rest_at
    for start, end, _ in blocks:
        pieces.append(text[at:start])
        at = end
    pieces.append(text[at:])
    # (a block left open is one the output ends inside: cut off while thinking)
    return "".join(pieces), sure, any(not closed for _, _, closed in blocks)


_LINE_END = re.compile(r"[ \t]*(?:\n|\r|\Z)")
#: A line that opens or closes a Markdown code fence.
_FENCE_LINE = re.compile(r"(?m)^[ \t]*(?:```|~~~)")
#: The start of an indented code line or a block quote's line.
_CODE_OR_QUOTE = re.compile(r"    |\t|[ \t]*>")


def _markup_tags(text: str, tags: list[re.Match[str]], *, touching: bool
                 ) -> list[re.Match[str]]:
    """The reasoning ``tags`` of a text answer that are markup rather than mentions of
    the tags: not inside a code fence, on an indented code line (four spaces or a tab)
    or on a block quote's line (``>``); ``touching``: an opening tag followed by its
    line's end or by a non-blank, a closing one preceded by its line's start or by a
    non-blank ("<think> tags mark the reasoning", "everything before </think>" are
    prose)."""
    fences = [m.start() for m in _FENCE_LINE.finditer(text)]
    kept = []
    line = seen = 0  # the start of the line of the tag before, and where it ended
    for m in tags:
        if bisect_right(fences, m.start()) % 2:
            continue  # inside a fence
        line = text.rfind("\n", seen, m.start()) + 1 or line
        seen = m.end()
        if _CODE_OR_QUOTE.match(text, line, m.start()) is not None:
            continue
        if touching:
            if m.group(1):
                if m.start() and text[m.start() - 1] in " \t":
                    continue
            elif text[m.end():m.end() + 1] in (" ", "\t"):
                continue
        kept.append(m)
    return kept


def _opening_blocks(text: str, blocks: list[tuple[int, int, bool]], at: int
                    ) -> list[tuple[int, int, bool]]:
    """The ``blocks`` that open the reply from ``at``: the first after nothing but
    blanks, each next right after the one before (blanks between)."""
    kept = []
    for block in blocks:
        if text[at:block[0]].strip():
            break
        kept.append(block)
        at = block[1]
    return kept


def _think_blocks(text: str, tags: list[re.Match[str]]) -> list[tuple[int, int, bool]]:
    """The reasoning blocks among ``tags`` (outside strings): an opening tag that opens
    a line or follows another tag, up to the first closing tag of its name, or to the
    end of the text (a block cut off); as (start, end, closed), none nested."""
    closes: dict[str, list[int]] = {}
    for m in tags:
        if m.group(1):
            closes.setdefault(m.group(2).lower(), []).append(m.start())
    blocks: list[tuple[int, int, bool]] = []
    after = 0
    for m in tags:
        if m.group(1) or m.start() < after:
            continue
        start = m.start()
        while start and text[start - 1] in " \t":
            start -= 1
        if start and text[start - 1] not in "\n>":
            continue  # inside a line of prose: a mention, not a block
        name = m.group(2).lower()
        ends = closes.get(name, [])
        i = bisect_left(ends, m.end())
        closed = i < len(ends)
        after = ends[i] + len(name) + 3 if closed else len(text)  # len("</" name ">")
        blocks.append((start, after, closed))
    return blocks
