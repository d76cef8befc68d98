"""Sliding-window request and token limits per API key, with OpenAI's rate-limit headers.

A real sliding window (not a bucket) so that tests can predict exactly when a rejected
request becomes admissible: an admitted request occupies the window from its admission
time ``t`` until ``t + window_s``. Each key keeps two parallel lists (admission times and
the running total of tokens charged) plus a head index, so eviction is amortised O(1)
and finding the earliest admissible time after a rejection is a binary search rather
than a walk. Rejected requests are not recorded and consume nothing.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass

_COMPACT_AT = 4096


def format_duration(seconds: float) -> str:
    """Format a wait the way OpenAI's ``x-ratelimit-reset-*`` headers do (``6m0s``, ``250ms``)."""
    if seconds <= 0:
        return "0s"
    if seconds < 1.0:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60.0)
    secs = f"{rest:.3f}".rstrip("0").rstrip(".")
    return f"{int(minutes)}m{secs}s" if minutes else f"{secs}s"


class _Window:
    """One key's admitted requests inside the current window."""

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


@dataclass(slots=True)
class Decision:
    """The outcome of one admission check and the headers every response carries."""

    admitted: bool
    headers: dict[str, str]
    wait_s: float = 0.0
    limited_by: str = ""
    too_large: bool = False


class RateLimiter:
    """Per-key sliding windows; limits are passed per call so config changes apply at once."""

    def __init__(self) -> None:
        self._windows: dict[str, _Window] = {}

    def reset(self) -> None:
        """Forget every window (``POST /_sim/reset``)."""
        self._windows.clear()

    def admit(self, key: str, tokens: int, now: float, rpm: int | None, tpm: int | None,
              window: float) -> Decision:
        """Admit and record a request charging ``tokens``, or say how long until it would be."""
        win = self._windows.get(key)
        if win is None:
            win = self._windows[key] = _Window()
        win.expire(now, window)
        wait = 0.0
        limited_by = ""
        too_large = False
        if rpm is not None and win.requests + 1 > rpm:
            # The oldest (requests - rpm + 1) entries must leave the window.
            wait = win.ts[win.head + win.requests - rpm] + window - now
            limited_by = "requests"
        if tpm is not None and win.tokens + tokens > tpm:
            if tokens > tpm:
                too_large = True
                limited_by = "tokens"
            else:
                # Evicted tokens must reach total + tokens - tpm: first entry whose
                # running total gets there.
                i = bisect_left(win.cum, win.total + tokens - tpm, win.head)
                wait_t = win.ts[i] + window - now
                if wait_t >= wait:
                    wait, limited_by = wait_t, "tokens"
        if limited_by:
            return Decision(False, self._headers(win, now, rpm, tpm, window), max(wait, 0.0),
                            limited_by, too_large)
        win.ts.append(now)
        win.total += tokens
        win.cum.append(win.total)
        return Decision(True, self._headers(win, now, rpm, tpm, window))

    def peek(self, key: str, now: float, rpm: int | None, tpm: int | None,
             window: float) -> dict[str, str]:
        """The rate-limit headers for ``key`` without charging anything."""
        win = self._windows.get(key)
        if win is None:
            win = _Window()
        else:
            win.expire(now, window)
        return self._headers(win, now, rpm, tpm, window)

    @staticmethod
    def _headers(win: _Window, now: float, rpm: int | None, tpm: int | None,
                 window: float) -> dict[str, str]:
        headers: dict[str, str] = {}
        if rpm is None and tpm is None:
            return headers
        # Reset = time until the oldest admitted request leaves the window, i.e. when
        # the window next gains capacity; "0s" when nothing is in it.
        reset = win.ts[win.head] + window - now if win.requests else 0.0
        if rpm is not None:
            headers["x-ratelimit-limit-requests"] = str(rpm)
            headers["x-ratelimit-remaining-requests"] = str(max(0, rpm - win.requests))
            headers["x-ratelimit-reset-requests"] = format_duration(reset)
        if tpm is not None:
            headers["x-ratelimit-limit-tokens"] = str(tpm)
            headers["x-ratelimit-remaining-tokens"] = str(max(0, tpm - win.tokens))
            headers["x-ratelimit-reset-tokens"] = format_duration(reset)
        return headers
