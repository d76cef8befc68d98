"""Answers the provider reports as cut off at ``max_tokens`` (``finish_reason`` "length").

The text alone often does not show a cut: prose cut mid-sentence reads as an answer,
and the ladder's truncation step (:mod:`.output`, step 4) closes a JSON answer the
output ended inside and delivers what finished. When the provider says it stopped the
answer at its token limit, that is known, not guessed, so :func:`judge_finish` applies
the report to the parsed output:

* a text answer is never complete: ``truncated`` (unusable);
* a JSON answer whose brackets all closed before the cut (the cut fell in what came
  after it) is delivered as parsed; one the output ended inside, or read from inside a
  bracket the output left open, or no JSON at all (the cut came before it began) is
  ``truncated``, unless the rule asks for cut values (``keep_truncated``);
* a complete JSON answer that is unusable for its own reasons keeps its status.

Every output judged here carries the fix ``finish_reason:<reason>``, so the trace shows
the provider's report next to the status.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

from lockgate.runtime.schema import OutputPlan
from lockgate.runtime.settle import Parsed, ParseStatus

#: The finish reasons that mean the answer hit its token limit: OpenAI's ``length``,
#: and ``max_tokens`` as Anthropic-compatible layers and some gateways say (compared
#: without case: Gemini's own API writes ``MAX_TOKENS``).
CUT_OFF_REASONS = frozenset({"length", "max_tokens"})

#: The fix a candidate read from inside a value the output ended inside carries
#: (:func:`lockgate.runtime.search._candidates`): complete itself, but part of an
#: answer that was not.
EXTRACTED_FROM_CUT = "extracted:truncated"


def cut_off(finish_reason: str | None) -> bool:
    """Whether ``finish_reason`` says the provider stopped the answer at ``max_tokens``."""
    return finish_reason is not None and finish_reason.strip().lower() in CUT_OFF_REASONS


def judge_finish(parsed: Parsed, plan: OutputPlan, finish_reason: str | None, raw: str,
                 reread: Callable[[str], Parsed]) -> Parsed:
    """``parsed`` (read from ``raw``) as the provider's ``finish_reason`` leaves it (the
    module doc). ``reread`` parses another text under the same rule."""
    if finish_reason is None or not cut_off(finish_reason):
        return parsed
    reason = finish_reason.strip().lower()
    label = f"finish_reason:{reason}"
    if plan.format == "text":
        return _truncated(parsed, reason, label, "the answer was cut off", completeness=0.0)
    if parsed.usable and plan.keep_truncated:
        return _on_record(parsed, label)  # cut values asked for
    if ended_inside(parsed):
        return _truncated(parsed, reason, label, "the JSON answer was cut off",
                          completeness=parsed.completeness)
    if parsed.status is ParseStatus.NO_JSON_FOUND:
        return _truncated(parsed, reason, label, "the answer was cut off",
                          completeness=parsed.completeness, where=" before any JSON began")
    if not _before_open(parsed, raw, reread):
        return _truncated(parsed, reason, label, "the JSON answer was cut off",
                          completeness=parsed.completeness)
    return _on_record(parsed, label)  # complete before the cut: as parsed


def _on_record(parsed: Parsed, label: str) -> Parsed:
    """``parsed`` with the provider's report among its fixes (its status unchanged)."""
    return replace(parsed, fixes=(*parsed.fixes, label))


def ended_inside(parsed: Parsed) -> bool:
    """Whether the output ended inside the JSON ``parsed`` was read from: cut back and
    closed by the ladder (``truncated``, ``truncated:<field>``), or a complete value
    taken from inside a cut one (:data:`EXTRACTED_FROM_CUT`)."""
    return any(f == "truncated" or f.startswith("truncated:") or f == EXTRACTED_FROM_CUT
               for f in parsed.fixes)


def _before_open(parsed: Parsed, raw: str, reread: Callable[[str], Parsed]) -> bool:
    """Whether ``parsed`` comes from the part of ``raw`` before the first bracket the
    output left open: a usable value read from there too, or the same failure read
    from there (its status and error). The ladder marks only the regions it reads as cut: an object
    inside a list of other things (``[1, {"label": "yes"}, 3``) is read as a region of
    its own, complete, though the output ended inside the list around it."""
    at = first_open(raw)
    if at is None:
        return True
    before = reread(raw[:at])
    if parsed.usable:
        return before.usable and before.value == parsed.value
    return before.status is parsed.status and before.error == parsed.error


def first_open(text: str) -> int | None:
    """Where the first bracket that never closes and opens JSON stands in ``text`` (None:
    none). Full-width brackets (``｛ ｝ ［ ］``) count as the ladder reads them. Quotes
    count only inside brackets that open JSON (prose has apostrophes and inch marks, in
    brackets too: ``[1 6" ...``; JSON strings stand inside JSON brackets): a double
    quote, and a single quote where a Python-style string may begin (after an opening
    bracket, a colon or a comma); there a backslash outside a
    string escapes the next character (JSON written with its quotes escaped,
    ``{\\"a\\": 1}``), and ``//`` and ``/* */`` comments are skipped. A bracket left open
    in prose (``see [1 below``, ``:-[``) is not where JSON began: only one followed by
    what may open JSON content counts (:func:`_opens_json`)."""
    opened: list[tuple[int, bool]] = []  # each open bracket: where, whether JSON opens
    quote = ""
    last = "{"  # the last character outside strings and blanks, inside brackets
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
                last = c
        elif c in _OPENS:
            opened.append((i, _opens_json(text, i)))
            last = "{"
        elif c in _CLOSES:
            if opened:
                opened.pop()
            last = "}"
        elif not opened or not opened[-1][1] or c.isspace():
            pass  # prose (a bracket in it too: ``[1 6" ...`` holds an inch mark)
        elif c == "\\":
            i += 1
        elif c == '"' or (c == "'" and last in "{:,"):
            quote = c
        elif c == "/" and text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        elif c == "/" and text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
            continue
        else:
            last = "," if c in ",，" else ":" if c in ":：" else c
        i += 1
    return next((at for at, json in opened if json), None)


_OPENS = frozenset("{[｛［")
_CLOSES = frozenset("}]｝］")
#: What may follow an opening bracket that begins an array: a value (a string, a
#: bracket, a number followed by a separator, a literal), its closing bracket, a comment,
#: or the end or the start of a number or literal the output ends in (cut right there).
_ARRAY_CONTENT = re.compile(
    r"""\s*+(?:\Z|["'“‘＂{\[｛［\]］]|\\"|//|/\*
    |-?\d[\d.eE+\-]*+\s*+(?:[,，\]］}｝]|\Z)
    |(?:true|false|null|True|False|None)\b|-\Z|[tfnTFN][a-z]*+\Z)""", re.X)
#: What may follow an opening brace that begins an object: a key (quoted, or bare and
#: followed by a colon and what may start a value), its closing brace, a comment, or
#: the end.
_OBJECT_CONTENT = re.compile(
    r"""\s*+(?:\Z|["'“‘＂}｝]|\\"|//|/\*
    |[A-Za-z_][\w\-]*+\s*+(?:\Z|[:：]\s*+(?:\Z|["'“‘{\[｛［\d]|-\d|[A-Za-z_])))""", re.X)


def _opens_json(text: str, at: int) -> bool:
    """Whether what follows the bracket at ``at`` may be JSON content (the end of the text
    too: a bracket the output was cut right after)."""
    while True:
        content = _OBJECT_CONTENT if text[at] in "{｛" else _ARRAY_CONTENT
        m = content.match(text, at + 1)
        if m is None:
            return False
        inner = m.end() - 1
        if text[at] in "{｛" or inner <= at or text[inner] not in "{[｛［":
            return True
        at = inner  # [[1 in prose (":-[ [1"): the inner bracket decides


def cut_off_error(reason: str, what: str = "the answer was cut off", where: str = "") -> str:
    """The message of a cut-off answer: the cause (``what`` at max_tokens, ``where`` in
    the answer, the provider's word) and the fix."""
    return (f'{what} at max_tokens{where} (finish_reason "{reason}"): raise '
            "model_config.max_tokens or ask for a shorter answer")


def _truncated(parsed: Parsed, reason: str, label: str, what: str, *,
               completeness: float, where: str = "") -> Parsed:
    fixes = parsed.fixes if "truncated" in parsed.fixes else (*parsed.fixes, "truncated")
    return Parsed(ParseStatus.TRUNCATED, None, (*fixes, label), completeness=completeness,
                  conforms=False, error=cut_off_error(reason, what, where), missing=parsed.missing)
