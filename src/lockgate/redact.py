"""Hiding secrets in what lockgate prints or stores.

A database URL or an endpoint's ``base_url`` may carry credentials (a password, a token
in the query string). Messages show them redacted, and nothing written to the database
keeps them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from urllib.parse import quote

#: What stands in for a removed secret.
MASK = "***"


def _split(url: str) -> tuple[str, str | None, bool, str, str]:
    """(``scheme://`` or "", user or None, whether a password follows the user,
    host and path, query string without its ``?``).

    The user information runs to the *last* ``@`` (a password may hold ``/`` or ``@``
    unescaped, as SQLAlchemy's URLs allow), so whatever could be a secret is inside it.
    """
    head, sep, rest = url.partition("://")
    if not sep:
        head, rest = "", url
    else:
        head += sep
    user: str | None = None
    has_password = False
    at = rest.rfind("@")
    if at >= 0:
        name, colon, _password = rest[:at].partition(":")
        if colon or "/" not in name:  # else the "@" is in the path: no user information
            user, has_password, rest = name, bool(colon), rest[at + 1:]
    rest, _q, query = rest.partition("?")
    return head, user, has_password, rest, query


def redact_url(url: str) -> str:
    """``url`` with its password and query string replaced by ``***``; never raises.

    ``postgresql://app:secret@db/lockgate`` -> ``postgresql://app:***@db/lockgate``,
    also without a scheme (``app:secret@db/lockgate`` -> ``app:***@db/lockgate``)."""
    head, user, has_password, rest, query = _split(url)
    auth = "" if user is None else (f"{user}:{MASK}@" if has_password else f"{user}@")
    return f"{head}{auth}{rest}{'?' + MASK if query else ''}"


def without_credentials(url: str) -> str:
    """``url`` without user, password and query string (for storing it)."""
    head, _user, _has_password, rest, _query = _split(url)
    return f"{head}{rest}"


#: The shortest secret :class:`Secrets` masks: a shorter value (a header's ``1``, a
#: user ``bob``) would mask words of the text it is sought in.
MIN_SECRET = 6


class Secrets:
    """Known secret values (an API key, a password, a token), masked with ``***`` in a
    text or a body where they appear: as given, as a JSON string writes them
    (``\\/`` for ``/``...) and percent-encoded. Values shorter than :data:`MIN_SECRET`
    are left out. ``shown``: whole strings to replace first by what may be shown of
    them (a URL by its :func:`redact_url`)."""

    __slots__ = ("_bytes", "_shown", "_text")

    def __init__(self, values: Iterable[str | None],
                 shown: Mapping[str, str] | None = None) -> None:
        forms: set[str] = set()
        for value in values:
            if value is None or len(value.strip()) < MIN_SECRET:
                continue
            escaped = json.dumps(value, ensure_ascii=False)[1:-1]
            forms.update((value, escaped, escaped.replace("/", "\\/"),
                          quote(value, safe="")))
        self._shown = {k: v for k, v in (shown or {}).items() if k and k != v}
        ordered = sorted(forms, key=len, reverse=True)  # a longer form before its part
        self._text = re.compile("|".join(map(re.escape, ordered))) if ordered else None
        self._bytes = re.compile(b"|".join(re.escape(f.encode()) for f in ordered)) \
            if ordered else None

    def __bool__(self) -> bool:
        return self._text is not None or bool(self._shown)

    def text(self, text: str) -> str:
        """``text`` with the secrets masked."""
        for whole, shown in self._shown.items():
            text = text.replace(whole, shown)
        return self._text.sub(MASK, text) if self._text is not None else text

    def data(self, raw: bytes) -> bytes:
        """``raw`` (UTF-8 or another ASCII-compatible encoding) with the secrets
        masked; ``raw`` itself when it holds none."""
        if self._bytes is None or not self._bytes.search(raw):
            return raw
        return self._bytes.sub(MASK.encode(), raw)
