"""What a provider's response says about its limits: ``retry-after-ms`` / ``retry-after``
and the ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` headers (OpenAI's, and
most gateways'); :func:`rate_headers` reads the other forms into those: the IETF
``RateLimit`` / ``RateLimit-Policy`` fields and the older ``RateLimit-Limit``,
``-Remaining``, ``-Reset`` triple, Anthropic's ``anthropic-ratelimit-*``, and the
unsuffixed ``x-ratelimit-{limit,remaining,reset}`` (Together's, OpenRouter's).

Providers send these inconsistently: durations as ``6m0s``, ``1.5s``, ``250ms`` or bare
seconds, ``-1`` for "unknown", ``0`` with a reset of ``0s``, or nothing at all. Every
parser here returns None for anything it cannot read with confidence, so a nonsense
header never pauses an endpoint or changes a limit.
"""

from __future__ import annotations

import contextlib
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

#: Longest pause any header may impose (a day): a longer reset or Retry-After is junk
#: (``retry-after: 9999999999`` must not stop every worker for a day).
MAX_PAUSE_MS = 24 * 3600 * 1000

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?"
                       r"(?:(\d+(?:\.\d+)?)s)?(?:(\d+(?:\.\d+)?)ms)?$")


#: An HTTP date's day name and its comma (``Wed, 21 Oct 2015 07:28:00 GMT``).
_DAY_NAME = re.compile(r"\s*(?:mon|tue|wed|thu|fri|sat|sun)[a-z]*\s*,", re.I)


def first_value(raw: str) -> str:
    """The first of the values a proxy folded into one header (``Retry-After: 2, 2``,
    ``x-ratelimit-remaining-requests: 99, 99``: a header sent twice, joined with
    commas as RFC 9110 allows for lists): the value before the first comma, the comma
    of an HTTP date's day name aside (``Wed, 21 Oct 2015 07:28:00 GMT, Wed, ...``)."""
    if "," not in raw:
        return raw
    day = _DAY_NAME.match(raw)
    at = day.end() if day else 0
    return raw[:at] + raw[at:].split(",", 1)[0]


def parse_duration_ms(raw: str | None) -> int | None:
    """A reset duration in ms: ``6m0s``, ``1h2m3.5s``, ``1.5s``, ``250ms``, or bare
    seconds (``"2"``, ``"0.5"``); of folded values (``1s, 1s``) the first. Negative,
    empty or unreadable values give None."""
    if raw is None:
        return None
    s = first_value(raw).strip().lower()
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
    """A non-negative integer header (limit or remaining; of folded values, ``99, 99``,
    the first); ``-1`` and junk give None."""
    if raw is None:
        return None
    try:
        value = float(first_value(raw).strip())
    except ValueError:
        return None
    if value != value or value < 0 or value > 1e15:
        return None
    return int(value)


def parse_retry_after_ms(headers: Mapping[str, str]) -> int | None:
    """``retry-after-ms`` (ms), else ``retry-after``: seconds, or an HTTP date (counted
    from the response's own ``Date``, so a clock apart from the server's does not
    matter; from this machine's clock without one). Of values a proxy folded into one
    (``2, 2``), the first. An unreadable, negative or zero value gives None, and so does
    one beyond a day (:data:`MAX_PAUSE_MS`)."""
    for name, scale in (("retry-after-ms", 1.0), ("retry-after", 1000.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        raw = first_value(raw)
        try:
            value = float(raw) * scale
        except ValueError:
            value = _date_ms(raw, headers.get("date")) if scale == 1000.0 else float("nan")
        if 0 < value <= MAX_PAUSE_MS:  # NaN, inf and junk beyond a day are no pause
            return int(value + 0.999)  # never before the time named
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


#: The names :func:`read_signals` reads; :func:`rate_headers` writes the others as these.
RATE_HEADERS = ("x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
                "x-ratelimit-reset-requests", "x-ratelimit-limit-tokens",
                "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens")


def rate_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The limit headers of a response (keys lower-case) as ``x-ratelimit-*`` headers.

    Those themselves are kept as sent (of values a proxy folded, ``0, 0``, the first).
    Without them:

    * the IETF fields: ``RateLimit: limit=100, remaining=5, reset=30`` (drafts 6-7) or
      ``RateLimit: "day";r=5;t=30`` with ``RateLimit-Policy: "day";q=100;w=60``
      (draft 8 on; of several policies the one with the fewest remaining, a policy
      whose name says ``token`` counting tokens), and the older ``RateLimit-Limit``
      (``100`` or ``100, 100;w=60``) / ``-Remaining`` / ``-Reset`` (seconds).
      Otherwise they count requests. A limit is taken only with its window (a
      policy's ``w``): a per-minute figure is ``q * 60 / w``; without one, only
      remaining and reset are;
    * Anthropic's ``anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}``,
      per minute, the reset an RFC 3339 time (counted from the response's ``Date``).

    Values it cannot read are left out, never guessed.

    Without a ``-requests`` form, the unsuffixed ``x-ratelimit-limit``, ``-remaining``
    and ``-reset`` (Together's, OpenRouter's, many gateways') are read as the requests
    ones, beside a ``-tokens`` form if one is sent (Together sends its tokens so): the
    limit per minute, as the suffixed one is read; the reset as a duration (seconds,
    or ``6m0s``), or as a time when it is one (above 10^9: epoch seconds; above 10^12:
    epoch milliseconds), counted from the response's ``Date`` (else this machine's
    clock); a time past or beyond a day is left out."""
    out = {k: first_value(headers[k]).strip() for k in RATE_HEADERS if k in headers}
    if not any(k.endswith("-requests") for k in out):
        _unsuffixed(headers, out)
    if out:
        return out
    if "ratelimit" in headers or "ratelimit-remaining" in headers:
        _ietf(headers, out)
    elif "anthropic-ratelimit-requests-remaining" in headers \
            or "anthropic-ratelimit-tokens-remaining" in headers:
        for kind in ("requests", "tokens"):
            for part in ("limit", "remaining"):
                v = headers.get(f"anthropic-ratelimit-{kind}-{part}")
                if v is not None:
                    out[f"x-ratelimit-{part}-{kind}"] = first_value(v).strip()
            ms = _until_ms(headers.get(f"anthropic-ratelimit-{kind}-reset"),
                           headers.get("date"))
            if ms is not None:
                out[f"x-ratelimit-reset-{kind}"] = f"{ms}ms"
    return out


def _unsuffixed(headers: Mapping[str, str], out: dict[str, str]) -> None:
    """``x-ratelimit-{limit,remaining,reset}`` as the requests ones (see
    :func:`rate_headers`)."""
    for part in ("limit", "remaining"):
        v = headers.get(f"x-ratelimit-{part}")
        if v is not None and parse_count(v) is not None:
            out[f"x-ratelimit-{part}-requests"] = first_value(v).strip()
    ms = parse_reset_ms(headers.get("x-ratelimit-reset"), headers.get("date"))
    if ms is not None:
        out["x-ratelimit-reset-requests"] = f"{ms}ms"


#: A bare reset above this is a time, not a duration (10^9 s is 2001-09-09 as epoch
#: seconds, 31 years as a duration), and above :data:`_EPOCH_MS` a time in ms.
_EPOCH_S = 1e9
_EPOCH_MS = 1e12


def parse_reset_ms(raw: str | None, now_raw: str | None = None) -> int | None:
    """A bare reset in ms: a duration (:func:`parse_duration_ms`), or an epoch time in
    seconds or milliseconds when it is clearly one (above 10^9, 10^12), counted from
    the HTTP ``Date`` ``now_raw`` (else this machine's clock). A time already past, or
    more than a day ahead, and junk give None."""
    if raw is None:
        return None
    raw = first_value(raw)
    try:
        value = float(raw.strip())
    except ValueError:
        return parse_duration_ms(raw)
    if not math.isfinite(value) or value < _EPOCH_S:
        return parse_duration_ms(raw)
    when_ms = value if value >= _EPOCH_MS else value * 1000.0
    now_ms = time.time() * 1000.0
    if now_raw:
        with contextlib.suppress(TypeError, ValueError, IndexError):
            now_ms = parsedate_to_datetime(now_raw).timestamp() * 1000.0
    ms = when_ms - now_ms
    return int(ms + 0.999) if 0 < ms <= MAX_PAUSE_MS else None


def _params(item: str) -> tuple[str, dict[str, str]]:
    """``"name";k=v;k=v`` (or ``k=v, k=v``) -> (name, {k: v}), quotes dropped."""
    name, params = "", {}
    for i, part in enumerate(re.split(r"[;,]", item)):
        key, eq, value = part.strip().partition("=")
        if eq:
            params[key.strip().lower()] = value.strip().strip('"')
        elif i == 0:
            name = key.strip().strip('"')
    return name, params


def _ietf(headers: Mapping[str, str], out: dict[str, str]) -> None:
    field = headers.get("ratelimit")
    windows: dict[str, tuple[str | None, str | None]] = {}  # policy -> (quota, window s)
    for item in (headers.get("ratelimit-policy") or "").split(","):
        name, p = _params(item)
        q = p.get("q") or (name if parse_count(name) is not None else None)
        windows.setdefault(name, (q, p.get("w")))
    first_window = next(iter(windows.values()), (None, None))[1]
    if field is None:  # the older triple; its limit may name its window ("10, 10;w=1")
        limit = headers.get("ratelimit-limit")
        if limit is not None and "w=" in limit:
            quota, _sep, policy = limit.partition(",")
            first_window = _params(policy)[1].get("w") or first_window
            limit = quota
        _put(out, "requests", limit, first_window,
             headers.get("ratelimit-remaining"), headers.get("ratelimit-reset"))
    elif "remaining=" in field.lower() or "limit=" in field.lower():  # drafts 6-7
        _name, p = _params(field)
        _put(out, "requests", p.get("limit"), first_window, p.get("remaining"),
             p.get("reset"))
    else:  # draft 8: a list of policies, each "name";r=...;t=...
        fewest: dict[str, tuple[int, str, dict[str, str]]] = {}
        for item in field.split(","):
            name, p = _params(item)
            r = parse_count(p.get("r"))
            kind = "tokens" if "token" in name.lower() else "requests"
            if r is not None and (kind not in fewest or r < fewest[kind][0]):
                fewest[kind] = (r, name, p)
        for kind, (_r, name, p) in fewest.items():
            limit, window = windows.get(name, (None, None))
            _put(out, kind, limit, window, p.get("r"), p.get("t"))


def _put(out: dict[str, str], kind: str, limit: str | None, window: str | None,
         remaining: str | None, reset: str | None) -> None:
    """One kind's IETF figures as ``x-ratelimit-*-{kind}`` (a limit only with its
    window, per minute)."""
    if remaining is not None and parse_count(remaining) is not None:
        out[f"x-ratelimit-remaining-{kind}"] = first_value(remaining).strip()
    reset_ms = parse_duration_ms(reset)
    if reset_ms is not None:
        out[f"x-ratelimit-reset-{kind}"] = f"{reset_ms}ms"
    quota, window_ms = parse_count(limit), parse_duration_ms(window)
    if quota and window_ms:
        out[f"x-ratelimit-limit-{kind}"] = str(int(quota * 60_000 / window_ms))


def _until_ms(raw: str | None, now_raw: str | None) -> int | None:
    """Milliseconds until the RFC 3339 time ``raw`` (from the HTTP ``Date``, else this
    machine's clock), within a day; None if it is not one."""
    if not raw:
        return None
    try:
        when = datetime.fromisoformat(first_value(raw).strip().replace("Z", "+00:00"))
        now = parsedate_to_datetime(now_raw) if now_raw else datetime.now(UTC)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None or now.tzinfo is None:
        when, now = when.replace(tzinfo=UTC), now.replace(tzinfo=UTC)
    ms = (when - now).total_seconds() * 1000
    return int(ms + 0.999) if 0 <= ms <= MAX_PAUSE_MS else None


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

    @property
    def explicit(self) -> bool:
        """Whether the provider named the pause itself (``retry-after(-ms)``)."""
        return bool(self.retry_after_ms)

    def pause_ms(self, call_tokens: float | None = None) -> int | None:
        """How long the endpoint should rest, by the provider's own word, or None.

        ``retry-after`` wins. Otherwise a remaining count of zero with a positive reset
        means "nothing left for now"; a zero remaining with reset ``0s`` (or no reset)
        is contradictory and ignored. A reset is the time until the limit is back to
        its *initial state* (OpenAI's words: the bucket full again; 12 ms with 4,999 of
        5,000 left), not until the next call may go: with the limit known, the pause is
        the time one call frees, ``reset / limit`` (``reset * call_tokens / limit`` for
        tokens, with the call's tokens known), never more than the reset; without it,
        the reset (:meth:`reset_ms`).
        """
        if self.retry_after_ms:
            return self.retry_after_ms
        waits = []
        for rem, reset, limit, need in (
                (self.remaining_requests, self.reset_requests_ms, self.limit_requests, 1.0),
                (self.remaining_tokens, self.reset_tokens_ms, self.limit_tokens,
                 call_tokens)):
            if rem == 0 and reset:
                if limit and need is not None and need > 0:
                    waits.append(max(1, min(reset, math.ceil(reset * need / limit))))
                else:
                    waits.append(reset)
        return max(waits) if waits else None

    def reset_ms(self) -> int | None:
        """The longest reset of a limit with nothing remaining (a zero remaining with a
        positive reset), or None: the time until it is full again."""
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
