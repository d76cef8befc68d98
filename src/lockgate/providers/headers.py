"""What a provider's response says about its limits: ``retry-after-ms`` / ``retry-after``
and the ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` headers.

Providers send these inconsistently: durations as ``6m0s``, ``1.5s``, ``250ms`` or bare
seconds, ``-1`` for "unknown", ``0`` with a reset of ``0s``, or nothing at all. Every
parser here returns None for anything it cannot read with confidence, so a nonsense
header never pauses an endpoint or changes a limit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

#: Longest pause any header may impose (a day): a longer reset is treated as junk, a
#: longer Retry-After is shortened to it.
MAX_PAUSE_MS = 24 * 3600 * 1000

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?"
                       r"(?:(\d+(?:\.\d+)?)s)?(?:(\d+(?:\.\d+)?)ms)?$")


def parse_duration_ms(raw: str | None) -> int | None:
    """A reset duration in ms: ``6m0s``, ``1h2m3.5s``, ``1.5s``, ``250ms``, or bare
    seconds (``"2"``, ``"0.5"``). Negative, empty or unreadable values give None."""
    if raw is None:
        return None
    s = raw.strip().lower()
    if not s:
        return None
    try:
        value = float(s)  # bare seconds
    except ValueError:
        m = _DURATION.match(s)
        if m is None or not any(m.groups()):
            return None
        h, mi, sec, ms = (float(g) if g else 0.0 for g in m.groups())
        total = ((h * 60 + mi) * 60 + sec) * 1000 + ms
    else:
        if value != value or value < 0:  # NaN or negative
            return None
        total = value * 1000
    if total > MAX_PAUSE_MS:
        return None
    return int(total + 0.999)  # round up: waiting 1 ms too long is harmless


def parse_count(raw: str | None) -> int | None:
    """A non-negative integer header (limit or remaining); ``-1`` and junk give None."""
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    if value != value or value < 0 or value > 1e15:
        return None
    return int(value)


def parse_retry_after_ms(headers: Mapping[str, str]) -> int | None:
    """``retry-after-ms`` (ms), else ``retry-after``: seconds, or an HTTP date (counted
    from the response's own ``Date``, so a clock apart from the server's does not
    matter; from this machine's clock without one). A pause longer than a day is
    shortened to a day (then the endpoint is asked again); an unreadable, negative or
    zero value gives None."""
    for name, scale in (("retry-after-ms", 1.0), ("retry-after", 1000.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            value = float(raw) * scale
        except ValueError:
            value = _date_ms(raw, headers.get("date")) if scale == 1000.0 else float("nan")
        if 0 < value < float("inf"):  # NaN, inf and -inf are no pause
            return int(min(value, MAX_PAUSE_MS) + 0.999)  # never before the time named
    return None


def _date_ms(raw: str, now_raw: str | None) -> float:
    """Milliseconds until the HTTP date ``raw`` (NaN if it is not one)."""
    try:
        when = parsedate_to_datetime(raw)
        now = parsedate_to_datetime(now_raw) if now_raw else None
    except (TypeError, ValueError, IndexError):
        return float("nan")
    if now is None:
        now = datetime.now(UTC)
    if when.tzinfo is None or now.tzinfo is None:  # "-0000": UTC, as RFC 9110 says
        when, now = when.replace(tzinfo=UTC), now.replace(tzinfo=UTC)
    return (when - now).total_seconds() * 1000


@dataclass(frozen=True, slots=True)
class Signals:
    """The limit information of one response; every field may be None (not sent or junk)."""

    retry_after_ms: int | None = None
    limit_requests: int | None = None
    remaining_requests: int | None = None
    reset_requests_ms: int | None = None
    limit_tokens: int | None = None
    remaining_tokens: int | None = None
    reset_tokens_ms: int | None = None

    def pause_ms(self) -> int | None:
        """How long the endpoint should rest, by the provider's own word, or None.

        ``retry-after`` wins. Otherwise a remaining count of zero with a positive reset
        means "nothing left until then"; a zero remaining with reset ``0s`` (or no
        reset) is contradictory and ignored.
        """
        if self.retry_after_ms:
            return self.retry_after_ms
        waits = [r for rem, r in ((self.remaining_requests, self.reset_requests_ms),
                                  (self.remaining_tokens, self.reset_tokens_ms))
                 if rem == 0 and r]
        return max(waits) if waits else None

    @property
    def empty(self) -> bool:
        return self == _EMPTY


_EMPTY = Signals()


def read_signals(headers: Mapping[str, str] | None,
                 retry_after_ms: int | None = None) -> Signals:
    """Parse the headers (keys lower-case, as the provider client keeps them).

    ``retry_after_ms`` is what the client already parsed from a 429, used when the
    headers themselves are not at hand.
    """
    if not headers:
        return Signals(retry_after_ms=retry_after_ms) if retry_after_ms else _EMPTY
    ra = parse_retry_after_ms(headers)
    if ra is None:
        ra = retry_after_ms if retry_after_ms and retry_after_ms > 0 else None

    def limit(name: str) -> int | None:
        v = parse_count(headers.get(name))
        return v if v else None  # a limit of 0 is nonsense

    return Signals(
        retry_after_ms=ra,
        limit_requests=limit("x-ratelimit-limit-requests"),
        remaining_requests=parse_count(headers.get("x-ratelimit-remaining-requests")),
        reset_requests_ms=parse_duration_ms(headers.get("x-ratelimit-reset-requests")),
        limit_tokens=limit("x-ratelimit-limit-tokens"),
        remaining_tokens=parse_count(headers.get("x-ratelimit-remaining-tokens")),
        reset_tokens_ms=parse_duration_ms(headers.get("x-ratelimit-reset-tokens")),
    )
