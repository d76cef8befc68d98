"""Output parsing, repair and validation against the delivery rule.

The ladder, cheapest first; each step runs only when the previous ones did not give a
usable output:

1. **strict** - ``orjson.loads`` of the whole reply. A reply that is valid and already
   conforms returns here (the fast path: no further work).
2. **find** - reasoning (``<think>`` blocks and the other forms models write, a block
   cut off at the end, a headless one, a section labelled as reasoning before a
   labelled answer) is set aside and never searched; Unicode spaces and format
   characters between tokens are JSON's whitespace (:func:`.scan.plain_blanks`); an
   answer container (``<answer>``, ``<final>`` ...) is read first; full-width punctuation and
   curly quotes are turned to ASCII where they stand as JSON syntax, never inside
   values (:func:`.scan.ascii_syntax`); then the bodies of Markdown code fences, else
   every top-level object in the text, in the order written (:func:`.scan.regions`).
3. **repair** - a region that is not strict JSON is read strictly without its
   trailing commas and comments, else as a Python literal, else with ``json_repair``;
   a complete object that begins a line inside it (the model starting over) comes
   first.
4. **truncation** - a region the output ends inside (cut off at ``max_tokens``) is cut
   back to its last *finished* value and closed; a list or object field left open is
   dropped. A value counts only if the output finished it, so what was cut off takes
   its fallback (``truncated``; ``keep_truncated`` on the rule keeps cut values).
   A cut the provider reports is not delivered so unless ``keep_truncated`` asks for it
   (:mod:`.finish`, below).
5. **shape** - an array around the object gives its first element; wrappers are
   removed, any number deep (:func:`.unwrap.unwrap`).
6. **field names** - alias map, then close misspellings (:mod:`.conform`).
7. **types** - coercion to the declared schema (:mod:`.conform`).
8. **fallback** - missing (absent, null, or blank where required) fields take their
   value from ``delivery_rule.fallback_values``; so do fields whose value still
   breaks the schema. A declared fallback is the user's answer, whatever it is (``""``
   and ``null`` included): it is never judged against the schema.
9. **validate** - JSON Schema and/or the pydantic model of the rule; and at least one
   declared field must hold a non-blank value the model gave (an object made only of
   fallbacks is not an answer).


Candidates are tried in the order the model wrote them and the first usable one is
the answer: a later object never replaces an earlier usable one, and a region cut off
by the end of the output comes after every complete one. When none is usable the
status names why (for the candidate that recovered most expected fields):
``no_json_found`` (nothing JSON-like), ``invalid_json`` (JSON-like, but no declared
field could be recovered from it), ``schema_violation`` (JSON, but not the declared
shape). Otherwise the status names the strongest step that was needed: ``valid``
(none), ``repaired`` (2-6), ``coerced`` (7), ``filled_fallback`` (8).

``parse_output`` never raises on any text (lone surrogates, NUL bytes, 100,000-deep
nesting, 10 MB): only a broken delivery rule raises (``SpecError``). Texts over
:data:`MAX_SEARCH` characters are only read when they are strict JSON as a whole, and
``json_repair`` only sees regions up to :data:`MAX_REPAIR`, so the time per output is
bounded.

When the provider reports the answer cut off at ``max_tokens`` (``finish_reason``
"length"), :mod:`.finish` judges the outcome last: what was not complete before the cut
is ``truncated`` (unusable), never closed and delivered in part.

This module is the entry and step 1; :mod:`.search` holds steps 2-3 (and finds the
candidates of step 4), :mod:`.settle` steps 4-9 on each candidate value, and
:mod:`.unwrap` the declared-field check and step 5.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from lockgate.runtime.conform import Fixes
from lockgate.runtime.finish import cut_off, judge_finish
from lockgate.runtime.schema import OutputPlan, output_plan
from lockgate.runtime.search import MAX_REPAIR, MAX_SEARCH, reasoning_aside, search
from lockgate.runtime.settle import (
    USABLE,
    Parsed,
    ParseStatus,
    deliverable,
    fast_ok,
    finish,
    unusable,
)
from lockgate.spec import DeliveryRule

log = logging.getLogger("lockgate.runtime")


#: The error of an output that made the parser itself fail (a bug, logged).
INTERNAL = "internal error while parsing the output"


def parse_output(raw: str, rule: DeliveryRule, *, finish_reason: str | None = None) -> Parsed:
    """Parse a raw model output under a delivery rule (the ladder in the module doc).
    ``finish_reason`` is the provider's (``length``: cut off at ``max_tokens``, which
    :func:`.finish.judge_finish` applies; None or ``stop`` change nothing).

    Raises only ``SpecError`` for a delivery rule that cannot be used."""
    plan = output_plan(rule)
    try:
        parsed = _parse(raw, plan)
        # (a cut answer is judged on the part the ladder read: brackets left open in
        # reasoning set aside are not where the answer began)
        answer = (reasoning_aside(raw) if "stripped:think" in parsed.fixes
                  and cut_off(finish_reason) else raw)
        return judge_finish(parsed, plan, finish_reason, answer,
                            lambda text: _parse(text, plan))
    except Exception as exc:  # a parser bug must not cost the task its raw output
        log.exception("parse_output failed on a %d-character output", len(raw))
        failed = Parsed(ParseStatus.INVALID_JSON, None, completeness=0.0, conforms=False,
                        error=f"{INTERNAL}: {type(exc).__name__}", missing=plan.expected)
    # (unusable: judged without reading the output again)
    return judge_finish(failed, plan, finish_reason, raw, lambda text: failed)


def with_prefill(messages: Sequence[Mapping[str, Any]], content: str) -> str:
    """The answer to parse for a reply ``content`` to ``messages``: when the messages
    end with an assistant message of non-blank content (a prefill of the answer, such as
    ``{``), the provider's reply is its continuation, and the answer is the prefill
    followed by it; unless the reply already begins (after leading white space) with
    the prefill (a provider that ignores prefills answers whole). Otherwise
    ``content`` as it is."""
    if not messages:
        return content
    last = messages[-1]
    prefill = last.get("content")
    if last.get("role") != "assistant" or not isinstance(prefill, str) \
            or not prefill.strip():
        return content
    if content.lstrip().startswith(prefill.strip()):
        return content
    return prefill + content


#: A reply that goes on with an object's member: a key and its colon first.
_MEMBER_FIRST = re.compile(r'\s*"(?:[^"\\\n]|\\.){1,200}"\s*:')
#: A prefill that ends inside a member's string value (``{"name": "``): the reply is
#: the rest of it.
_VALUE_OPEN = re.compile(r'[{,]\s*"(?:[^"\\\n]|\\.){1,200}"\s*:\s*"\Z')


def parse_reply(messages: Sequence[Mapping[str, Any]], content: str, rule: DeliveryRule,
                *, finish_reason: str | None = None) -> Parsed:
    """The answer of a reply ``content`` to ``messages`` under ``rule``. After an
    assistant prefill (:func:`with_prefill`) a reply usable alone is a whole answer (a
    provider that ignores prefills, whatever its spacing or key order), and the prefill
    joined to it is tried when it is not; but a reply that goes on with an object's
    member (``"score": 0.2, ...}`` after ``{``), or follows a prefill that ends inside a
    string value (``Anna", ...}`` after ``{"name": "``), is the continuation whatever it
    holds: the joined text is tried first (alone, its first object may be a nested one
    or an aside: ``"referrer": {"name": "Bob"}}``)."""
    joined = content if rule.format == "text" else with_prefill(messages, content)
    prefill = joined[:len(joined) - len(content)]
    continues = joined is not content and (
        (_MEMBER_FIRST.match(content) is not None
         and prefill.rstrip().endswith(("{", ",")))
        or _VALUE_OPEN.search(prefill) is not None)
    first, then = (joined, content) if continues else (content, joined)
    parsed = parse_output(first, rule, finish_reason=finish_reason)
    if not parsed.usable and then is not first:
        other = parse_output(then, rule, finish_reason=finish_reason)
        if other.usable:
            return other
    return parsed


def _parse(raw: str, plan: OutputPlan) -> Parsed:
    fixes = Fixes()
    raw = _valid_unicode(raw, fixes)
    if plan.format == "text":
        return _text(raw, plan, fixes)
    try:
        value: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return search(raw, plan, fixes)
    if isinstance(value, str) and any(c in value for c in "{["):
        # JSON text inside a JSON string: the answer encoded twice, or chatter that
        # happens to be quoted. Where no shape is expected, a string stays a string
        # unless an object or array is found in it as it stands (not repaired).
        inner = Fixes()
        inner.repair("decoded:string")
        found = search(value, plan, inner)
        if found.usable and (plan.expect is not None or not any(
                f.startswith(("repaired:", "truncated")) for f in found.fixes)):
            return found
        if plan.expect is not None and found.status is ParseStatus.SCHEMA_VIOLATION \
                and not found.truncated:
            return found  # the encoded answer's own failure explains best
    if not fixes.applied and fast_ok(value, plan, raw):
        return deliverable(Parsed(ParseStatus.VALID, value))
    return finish(value, plan, fixes, repaired=False)


def _text(raw: str, plan: OutputPlan, fixes: Fixes) -> Parsed:
    """A text answer: the reply with its reasoning set aside as the JSON path sets it
    aside (``<think>`` blocks and the other forms, :func:`.search.reasoning_aside`; the
    answer after it without the blank lines around it), else as written. A reply with
    nothing but blanks (spaces, line breaks, zero-width and other format characters)
    once its reasoning is set aside holds no answer."""
    answer = reasoning_aside(raw, prose=True)
    if answer != raw:
        fixes.repair("stripped:think")
        answer = answer.strip()
    if not _BLANK_TEXT.sub("", answer):
        return unusable(ParseStatus.NO_JSON_FOUND, plan,
                        "the output holds no answer: it is empty or blank"
                        + (" once its reasoning (<think>...) is set aside"
                           if "stripped:think" in fixes.applied else ""),
                        fixes.labels())
    return Parsed(ParseStatus.REPAIRED if fixes.repaired else ParseStatus.VALID, answer,
                  fixes.labels())


#: What a text answer made only of is blank: white space and format characters.
_BLANK_TEXT = re.compile(r"[\s\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064"
                         r"\u2066-\u206f\ufeff]+")


def _valid_unicode(raw: str, fixes: Fixes) -> str:
    """``raw`` with lone surrogates (from ``surrogateescape`` decoding or a broken
    escape) replaced by U+FFFD and split surrogate pairs joined."""
    if raw.isascii():
        return raw
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        fixes.repair("replaced:surrogates")
        return raw.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return raw


__all__ = ["INTERNAL", "MAX_REPAIR", "MAX_SEARCH", "USABLE", "ParseStatus", "Parsed",
           "parse_output", "parse_reply", "with_prefill"]
