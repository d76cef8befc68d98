"""Hiding secrets in what lockgate prints or stores.

A database URL or an endpoint's ``base_url`` may carry credentials (a password, a token
in the query string). Messages show them redacted, and nothing written to the database
keeps them.
"""

from __future__ import annotations

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
