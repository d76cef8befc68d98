"""Deterministic answers derived from the request, with prompt-dependent accuracy.

Same messages in, same content out, byte for byte: every choice the "model" makes is a
hash of the input (blake2b, never Python's salted ``hash``), so runs are reproducible
across processes and machines. Labels come from the prompt's own rules (see
:mod:`lockgate.simulator.prompt`); fields without a matching rule get a hash-chosen
guess among their allowed values, so fewer or worse rules mean lower accuracy.

Per request the work is: find ``<input>…</input>`` in the last user message, look the
rest of the prompt up in a cache of parsed instructions, test rule keywords as
substrings of the folded input, and serialise with orjson.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

from lockgate.simulator.prompt import (
    BOOL,
    ENUM,
    INT,
    LIST,
    NULL,
    NUMBER,
    TEXT,
    FieldSpec,
    PromptSpec,
    parse_instructions,
)

INPUT_OPEN = "<input>"
INPUT_CLOSE = "</input>"
DEFAULT_EXCERPT_CHARS = 40
PLAIN_EXCERPT_CHARS = 80
#: Token estimate charged for the ``<input>``/``</input>`` delimiters.
INPUT_TOKENS = 4

_SENTENCE_END = re.compile(r"[。！？!?；;\n]|\.(?:\s|$)")


def estimate_tokens(text: str) -> int:
    """Rough token count: one per non-ASCII (CJK) character, one per four ASCII characters.

    Computed from the UTF-8 length so it costs one C-level encode, not a Python loop.
    """
    n = len(text)
    if not n:
        return 0
    wide = (len(text.encode()) - n) // 2
    return wide + (n - wide + 3) // 4


def message_text(message: Mapping[str, Any]) -> str:
    """A chat message's text (string content, or the text parts of a parts list)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content
                       if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def split_prompt(messages: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """(instruction text, input text) of a request.

    The input lies between the last ``<input>`` and ``</input>`` of the last user
    message; without delimiters the whole last user message is the input and only the
    other messages are instructions (so rule text is never matched against itself).
    """
    last_user = len(messages) - 1
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            last_user = i
            break
    parts: list[str] = []
    text = ""
    for i, message in enumerate(messages):
        content = message.get("content")
        if type(content) is not str:
            content = message_text(message)
        if i != last_user:
            parts.append(content)
            continue
        end = content.rfind(INPUT_CLOSE)
        start = content.rfind(INPUT_OPEN, 0, end) if end >= 0 else -1
        if start >= 0:
            text = content[start + len(INPUT_OPEN):end].strip()
            parts.append(content[:start])
            parts.append(content[end + len(INPUT_CLOSE):])
        else:
            text = content.strip()
    return "\n".join(parts), text


def _digest(text: str, field: str, salt: str) -> int:
    data = f"{salt}\x1f{field}\x1f{text}".encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def excerpt(text: str, limit: int | None = None) -> str:
    """The input's first sentence, cut to ``limit`` characters (a stand-in summary)."""
    m = _SENTENCE_END.search(text)
    first = text[:m.start()] if m and m.start() > 0 else text
    return " ".join(first.split())[:limit or DEFAULT_EXCERPT_CHARS]


def guess(field: FieldSpec, text: str) -> Any:
    """What the simulated model answers for a field no rule decided."""
    if field.kind == TEXT:
        return excerpt(text, field.max_chars)
    if field.kind in (LIST, NULL):
        return [] if field.kind == LIST else None
    h = _digest(text, field.name, "guess")
    if field.kind == ENUM:
        return field.choices[h % len(field.choices)]
    if field.kind == INT:
        return field.lo + h % (field.hi - field.lo + 1)
    if field.kind == BOOL:
        return bool(h & 1)
    if field.kind == NUMBER:
        return (h % 101) / 100
    return None


def perturb(field: FieldSpec, value: Any, text: str) -> Any:
    """Another allowed value than ``value`` (for ``accuracy_noise``), hash-chosen."""
    h = _digest(text, field.name, "other")
    if field.kind == BOOL and isinstance(value, bool):
        return not value
    if field.kind == ENUM:
        others: list[Any] = [c for c in field.choices if c != value]
    elif field.kind == INT:
        others = [v for v in range(field.lo, field.hi + 1) if v != value]
    else:
        return value
    return others[h % len(others)] if others else value


def label(spec: PromptSpec, text: str, noise: float) -> dict[str, Any]:
    """The field values the simulated model gives for ``text`` under ``spec``."""
    folded = text.lower()
    decided: dict[str, Any] = {}
    todo = spec.rule_fields
    for rule in spec.rules:
        if rule.single is not None and rule.single in decided:
            continue
        if rule.forms:
            # Substring tests (memchr-fast) beat a regex alternation of CJK literals.
            for form in rule.forms:
                if form in folded:
                    break
            else:
                continue
        for name, value in rule.assignments:
            if name not in decided:
                decided[name] = value
        if len(decided) == todo:
            break
    out: dict[str, Any] = {}
    for field in spec.fields:
        if field.name not in decided:
            out[field.name] = guess(field, text)
            continue
        value = decided[field.name]
        if (noise and field.kind in (ENUM, INT, BOOL)
                and _digest(text, field.name, "noise") % 1_000_000 < noise * 1_000_000):
            value = perturb(field, value, text)
        out[field.name] = value
    return out


@dataclass(frozen=True, slots=True)
class Answer:
    """The content the simulated model produces for one request, and its token counts."""

    content: str
    is_json: bool
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class Template:
    """A parsed instruction text and its token estimate (cached: only inputs vary)."""

    spec: PromptSpec
    tokens: int


def _template(instructions: str) -> Template:
    return Template(parse_instructions(instructions), estimate_tokens(instructions))


class Responder:
    """Produces answers; owns the cache of parsed instruction texts."""

    def __init__(self, cache_size: int = 512) -> None:
        self._template: Callable[[str], Template] = lru_cache(maxsize=cache_size)(_template)

    def prepare(self, messages: Sequence[Mapping[str, Any]]) -> tuple[PromptSpec, str, int]:
        """(parsed instructions, input text, prompt tokens) of a request.

        Prompt tokens are the cached estimate of the instructions plus the input's,
        ``INPUT_TOKENS`` for the delimiters and 4 per message + 3, so the whole prompt
        is never re-measured per request.
        """
        instructions, text = split_prompt(messages)
        tpl = self._template(instructions)
        tokens = tpl.tokens + estimate_tokens(text) + INPUT_TOKENS + 4 * len(messages) + 3
        return tpl.spec, text, tokens

    def answer(self, messages: Sequence[Mapping[str, Any]], noise: float = 0.0,
               json_mode: bool = False) -> Answer:
        """Answer a chat request deterministically."""
        spec, text, prompt_tokens = self.prepare(messages)
        return respond(spec, text, prompt_tokens, noise, json_mode)


def respond(spec: PromptSpec, text: str, prompt_tokens: int, noise: float = 0.0,
            json_mode: bool = False) -> Answer:
    """The answer to a prepared request (see :meth:`Responder.prepare`)."""
    if spec.wants_json:
        content = orjson.dumps(label(spec, text, noise)).decode()
        return Answer(content, True, prompt_tokens, estimate_tokens(content))
    if json_mode:
        content = orjson.dumps({"answer": excerpt(text, PLAIN_EXCERPT_CHARS)}).decode()
        return Answer(content, True, prompt_tokens, estimate_tokens(content))
    ref = _digest(text, "", "plain") & 0xFFFFFFFF
    content = f"Simulated reply {ref:08x}: {excerpt(text, PLAIN_EXCERPT_CHARS)}"
    return Answer(content, False, prompt_tokens, estimate_tokens(content))


def chatty(content: str, is_json: bool) -> str:
    """The same answer wrapped in prose, JSON inside a fenced block (as chat models do)."""
    body = f"```json\n{content}\n```" if is_json else content
    return (f"Sure! Here is the result you asked for:\n\n{body}\n\n"
            "Let me know if you need anything else.")


def truncate(content: str) -> str:
    """The answer cut mid-way (for JSON, always mid-object, so it never parses)."""
    return content[: max(1, len(content) // 2)]


def cut_to_tokens(content: str, tokens: int, max_tokens: int) -> str:
    """Content shortened in proportion so it fits ``max_tokens`` (finish_reason "length")."""
    return content[: max(1, len(content) * max_tokens // max(tokens, 1))]
