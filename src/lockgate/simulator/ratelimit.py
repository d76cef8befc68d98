"""Sliding-window request and token limits per API key, and the rate-limit headers sent.

A real sliding window (not a bucket) so that tests can predict exactly when a rejected
request becomes admissible: an admitted request occupies the window from its admission
time ``t`` until ``t + window_s``. Each key keeps two parallel lists (admission times and
the running total of tokens charged) plus a head index, so eviction is amortised O(1)
and finding the earliest admissible time after a rejection is a binary search rather
than a walk. Rejected requests are not recorded and consume nothing.

Providers publish limits per minute but may enforce them over shorter periods (60,000
requests per minute enforced as 1,000 in any second). With ``enforce`` shorter than
``window`` the limiter checks a second, shorter sliding window over the same admission
times, with the limits scaled to it (:func:`scaled_limit`); the headers still describe
the advertised window only, as a provider's do.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

_COMPACT_AT = 4096

HeaderStyle = Literal["openai", "gateway", "ietf", "anthropic", "none"]


def format_duration(seconds: float) -> str:
    """Format a wait the way OpenAI's ``x-ratelimit-reset-*`` headers do (``6m0s``, ``250ms``)."""
    if seconds <= 0:
        return "0s"
    if seconds < 1.0:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    # Whole milliseconds first: 59.9996 s is 1m0s, never "60s" or "0m60s".
    minutes, rest_ms = divmod(round(seconds * 1000), 60_000)
    secs = f"{rest_ms / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def scaled_limit(limit: int, enforce: float, window: float) -> int:
    """The share of ``limit`` (per ``window`` seconds) enforced in any ``enforce`` seconds:
    ``floor(limit * enforce / window)``, at least 1 (60,000 per 60 s -> 1,000 per 1 s)."""
    return max(1, math.floor(limit * enforce / window + 1e-9))


class _Window:
    """One key's admitted requests inside the current (longest) window."""

    __slots__ = ("cum", "evicted", "head", "total", "ts")

    def __init__(self) -> None:
        self.ts: list[float] = []
        self.cum: list[int] = []
        self.head = 0
        self.total = 0
        self.evicted = 0

    def expire(self, now: float, window: float) -> None:
        ts = self.ts
        h = self.head
        n = len(ts)
        cutoff = now - window
        while h < n and ts[h] <= cutoff:
            h += 1
        if h == self.head:
            return
        self.evicted = self.cum[h - 1]
        if h >= _COMPACT_AT and 2 * h >= n:
            del ts[:h]
            del self.cum[:h]
            h = 0
        self.head = h

    @property
    def requests(self) -> int:
        return len(self.ts) - self.head

    @property
    def tokens(self) -> int:
        return self.total - self.evicted

    def start(self, now: float, length: float) -> int:
        """Index of the first admission inside the last ``length`` seconds (at least the
        head: call :meth:`expire` with a window of ``length`` or more first)."""
        return bisect_right(self.ts, now - length, self.head)

    def tokens_from(self, i: int) -> int:
        """Tokens charged by the admissions from index ``i`` on."""
        return self.total - (self.cum[i - 1] if i > self.head else self.evicted)

    def wait(self, i: int, length: float, now: float, tokens: int, rpm: int | None,
             tpm: int | None) -> tuple[float, str, bool]:
        """(wait, limited_by, too_large) for a window of ``length`` whose admissions start
        at index ``i``; limited_by is "" when the request fits now."""
        wait = 0.0
        limited_by = ""
        ts = self.ts
        count = len(ts) - i
        if rpm is not None and count + 1 > rpm:
            # The oldest (count - rpm + 1) entries must leave the window.
            wait = ts[i + count - rpm] + length - now
            limited_by = "requests"
        if tpm is not None and self.tokens_from(i) + tokens > tpm:
            if tokens > tpm:
                return wait, "tokens", True
            # Tokens before the entry that leaves last must reach total + tokens - tpm:
            # the first entry whose running total gets there.
            j = bisect_left(self.cum, self.total + tokens - tpm, i)
            wait_t = ts[j] + length - now
            if wait_t >= wait:
                wait, limited_by = wait_t, "tokens"
        return wait, limited_by, False


@dataclass(slots=True)
class Decision:
    """The outcome of one admission check and the headers every response carries."""

    admitted: bool
    headers: dict[str, str]
    wait_s: float = 0.0
    limited_by: str = ""
    too_large: bool = False
    per_s: float = 0.0  # the length of the window that refused the request
    limit: int = 0  # the limit that refused it, in that window


class RateLimiter:
    """Per-key sliding windows; limits are passed per call so config changes apply at once.

    ``rpm``/``tpm`` are the limits per ``window`` seconds (what the headers advertise);
    ``enforce`` (seconds, at most ``window``) adds a shorter window in which the scaled
    limits apply too; ``style`` picks the headers (:meth:`headers`)."""

    def __init__(self) -> None:
        self._windows: dict[str, _Window] = {}

    def reset(self) -> None:
        """Forget every window (``POST /_sim/reset``)."""
        self._windows.clear()

    def admit(self, key: str, tokens: int, now: float, rpm: int | None, tpm: int | None,
              window: float, enforce: float | None = None,
              style: HeaderStyle = "openai") -> Decision:
        """Admit and record a request charging ``tokens``, or say how long until it would be."""
        win = self._windows.get(key)
        if win is None:
            win = self._windows[key] = _Window()
        win.expire(now, window)
        wait, limited_by, too_large = win.wait(win.head, window, now, tokens, rpm, tpm)
        per_s = window
        limit = (rpm if limited_by == "requests" else tpm) or 0
        if enforce is not None and enforce < window and not too_large:
            rpm_s = None if rpm is None else scaled_limit(rpm, enforce, window)
            tpm_s = None if tpm is None else scaled_limit(tpm, enforce, window)
            wait_s, by_s, large_s = win.wait(win.start(now, enforce), enforce, now, tokens,
                                             rpm_s, tpm_s)
            if by_s and (large_s or wait_s > wait or not limited_by):
                wait, limited_by, too_large, per_s = wait_s, by_s, large_s, enforce
                limit = (rpm_s if by_s == "requests" else tpm_s) or 0
        if limited_by:
            return Decision(False, self.headers(win, now, rpm, tpm, window, style),
                            max(wait, 0.0), limited_by, too_large, per_s, limit)
        win.ts.append(now)
        win.total += tokens
        win.cum.append(win.total)
        return Decision(True, self.headers(win, now, rpm, tpm, window, style))

    def peek(self, key: str, now: float, rpm: int | None, tpm: int | None,
             window: float, style: HeaderStyle = "openai") -> dict[str, str]:
        """The rate-limit headers for ``key`` without charging anything."""
        win = self._windows.get(key)
        if win is None:
            win = _Window()
        else:
            win.expire(now, window)
        return self.headers(win, now, rpm, tpm, window, style)

    @staticmethod
    def headers(win: _Window, now: float, rpm: int | None, tpm: int | None, window: float,
                style: HeaderStyle = "openai") -> dict[str, str]:
        """The rate-limit headers of the advertised window, in one of these styles:

        * ``openai``: ``x-ratelimit-limit-``, ``-remaining-`` and ``-reset-`` for
          ``requests`` and ``tokens`` (each configured limit);
        * ``gateway``: limit and remaining only, no reset (as LiteLLM's proxy sends them);
        * ``ietf``: the IETF fields, ``RateLimit: "requests";r=R;t=T`` (and ``"tokens"``)
          with ``RateLimit-Policy: "requests";q=LIMIT;w=WINDOW`` (whole seconds);
        * ``anthropic``: ``anthropic-ratelimit-{requests,tokens}-{limit,remaining}`` and
          ``-reset`` as an RFC 3339 time;
        * ``none``: nothing.
        """
        headers: dict[str, str] = {}
        if style == "none" or (rpm is None and tpm is None):
            return headers
        wait = win.ts[win.head] + window - now if win.requests else 0.0
        if style in ("ietf", "anthropic"):
            return _other_headers(style, win, wait, rpm, tpm, window)
        reset = ""
        if style == "openai":
            # Reset = time until the oldest admitted request leaves the window, i.e. when
            # the window next gains capacity; "0s" when nothing is in it.
            reset = format_duration(wait)
        if rpm is not None:
            headers["x-ratelimit-limit-requests"] = str(rpm)
            headers["x-ratelimit-remaining-requests"] = str(max(0, rpm - win.requests))
            if reset:
                headers["x-ratelimit-reset-requests"] = reset
        if tpm is not None:
            headers["x-ratelimit-limit-tokens"] = str(tpm)
            headers["x-ratelimit-remaining-tokens"] = str(max(0, tpm - win.tokens))
            if reset:
                headers["x-ratelimit-reset-tokens"] = reset
        return headers


def _other_headers(style: HeaderStyle, win: _Window, wait: float, rpm: int | None,
                   tpm: int | None, window: float) -> dict[str, str]:
    """The ``ietf`` and ``anthropic`` header styles (see :meth:`RateLimiter.headers`)."""
    limits = [(kind, limit, used) for kind, limit, used in (
        ("requests", rpm, win.requests), ("tokens", tpm, win.tokens)) if limit is not None]
    if style == "ietf":
        return {
            "ratelimit": ", ".join(f'"{kind}";r={max(0, limit - used)};t={math.ceil(wait)}'
                                   for kind, limit, used in limits),
            "ratelimit-policy": ", ".join(f'"{kind}";q={limit};w={math.ceil(window)}'
                                          for kind, limit, _used in limits)}
    at = datetime.fromtimestamp(time.time() + wait, UTC).isoformat().replace("+00:00", "Z")
    out: dict[str, str] = {}
    for kind, limit, used in limits:
        out[f"anthropic-ratelimit-{kind}-limit"] = str(limit)
        out[f"anthropic-ratelimit-{kind}-remaining"] = str(max(0, limit - used))
        out[f"anthropic-ratelimit-{kind}-reset"] = at
    return out
