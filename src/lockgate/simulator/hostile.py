"""Hostile answers: what a broken or adversarial model may send back, on request.

With ``hostile = true`` in the simulator's config, a request whose input text holds
``[hostile:KIND]`` is answered (HTTP 200, a well-formed chat completion) with the
content of that kind instead of the rule's answer, so a client's handling of it can be
tested end to end. Without the flag, or for an unknown kind, nothing changes.
"""

from __future__ import annotations

import re

_DIRECTIVE = re.compile(r"\[hostile:([a-z_]+)\]")
#: Written into the content where the HTTP body must carry a lone surrogate escape
#: (``\\ud800``), which no UTF-8 encoder writes (the server swaps it in the body bytes).
SURROGATE_MARK = "\x00lone-surrogate\x00"
SURROGATE_ESCAPED = b"\\u0000lone-surrogate\\u0000"

MIB = 1 << 20

KINDS: dict[str, str] = {
    "huge": "x" * (10 * MIB),  # 10 MiB of text, no JSON in it
    "huge_json": '{"label": "yes", "pad": "' + "a" * (10 * MIB) + '"}',
    "deep": "[" * 100_000 + "]" * 100_000,
    "wide": '{"label": "yes", ' + ", ".join(f'"k{i}": {i}' for i in range(100_000)) + "}",
    "bignum": '{"label": "no", "n": 1' + "0" * 5000 + "}",
    "nul": '{"label": "no\x00"}',
    "surrogate": '{"label": "y' + SURROGATE_MARK + 'es"}',
}


def hostile_content(text: str, content: str) -> str:
    """The hostile content the input ``text`` asks for, else ``content`` unchanged."""
    m = _DIRECTIVE.search(text)
    return KINDS.get(m.group(1), content) if m else content
