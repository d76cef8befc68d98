"""A circuit breaker per endpoint per worker: closed -> open -> half-open -> closed.

* **closed**: calls pass; it opens when, over the last ``window_s`` seconds, at least
  ``min_calls`` calls finished and the failure rate reached ``failure_rate``, or when
  ``consecutive`` calls in a row failed.
* **open**: no call passes (the endpoint's tasks go to its fallback, or wait) until
  ``open_s`` has passed; each re-opening doubles that time, up to ``max_open_s``.
* **half-open**: up to ``probes`` calls pass at a time; ``probes`` successes close the
  breaker, any failure opens it again.

Failures here are the endpoint's own (server errors, timeouts, refused connections);
429s are handled by pauses and bad answers are the prompt's business, so neither opens
the breaker. Time is passed in (seconds, any monotonic clock).
"""

from __future__ import annotations

from collections import deque
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Breaker:
    """The state machine; ``allow`` before a call, ``record`` after it."""

    __slots__ = ("_events", "_fails_in_window", "consecutive", "consecutive_failures",
                 "failure_rate", "max_open_s", "min_calls", "open_count", "open_s",
                 "open_until", "probe_successes", "probes", "probes_in_flight", "state",
                 "window_s")

    def __init__(self, *, failure_rate: float = 0.5, min_calls: int = 20,
                 consecutive: int = 10, window_s: float = 10.0, open_s: float = 5.0,
                 max_open_s: float = 60.0, probes: int = 3) -> None:
        self.failure_rate = failure_rate
        self.min_calls = min_calls
        self.consecutive = consecutive
        self.window_s = window_s
        self.open_s = open_s
        self.max_open_s = max_open_s
        self.probes = probes
        self.state = BreakerState.CLOSED
        self.open_until = 0.0
        self.open_count = 0
        self.consecutive_failures = 0
        self.probes_in_flight = 0
        self.probe_successes = 0
        self._events: deque[tuple[float, bool]] = deque()
        self._fails_in_window = 0

    def _expire(self, now: float) -> None:
        cutoff = now - self.window_s
        ev = self._events
        while ev and ev[0][0] < cutoff:
            _, failed = ev.popleft()
            if failed:
                self._fails_in_window -= 1

    def available(self, now: float) -> bool:
        """Whether a call could pass now (without reserving a probe)."""
        if self.state is BreakerState.OPEN:
            return now >= self.open_until
        if self.state is BreakerState.HALF_OPEN:
            return self.probes_in_flight < self.probes
        return True

    def allow(self, now: float) -> bool:
        """Reserve passage for one call; a half-open breaker counts it as a probe."""
        if self.state is BreakerState.OPEN:
            if now < self.open_until:
                return False
            self.state = BreakerState.HALF_OPEN
            self.probes_in_flight = 0
            self.probe_successes = 0
        if self.state is BreakerState.HALF_OPEN:
            if self.probes_in_flight >= self.probes:
                return False
            self.probes_in_flight += 1
        return True

    def unjudged(self, probe: bool) -> None:
        """A call ``allow`` let through ended without a verdict on the endpoint (it was
        never sent, or the provider throttled it): a probe's place is free again."""
        if probe and self.state is BreakerState.HALF_OPEN:
            self.probes_in_flight = max(0, self.probes_in_flight - 1)

    def record(self, now: float, *, failed: bool, probe: bool = False) -> None:
        """The outcome of a call ``allow`` let through (``probe``: it was let through
        half-open). Calls that started before the breaker opened are only counted."""
        if probe and self.state is BreakerState.HALF_OPEN:
            self.unjudged(probe)
            if failed:
                self._open(now)
                return
            self.probe_successes += 1
            if self.probe_successes >= self.probes:
                self._close()
            return
        self._events.append((now, failed))
        if failed:
            self._fails_in_window += 1
            self.consecutive_failures += 1
        else:
            self.consecutive_failures = 0
        self._expire(now)
        if self.state is not BreakerState.CLOSED:
            return
        n = len(self._events)
        if self.consecutive_failures >= self.consecutive or (
                n >= self.min_calls and self._fails_in_window / n >= self.failure_rate):
            self._open(now)

    def _open(self, now: float) -> None:
        self.open_count += 1
        wait = min(self.max_open_s, self.open_s * 2 ** max(0, self.open_count - 1))
        self.state = BreakerState.OPEN
        self.open_until = now + wait
        self.probes_in_flight = 0
        self.probe_successes = 0

    def _close(self) -> None:
        self.state = BreakerState.CLOSED
        self.open_count = 0
        self.consecutive_failures = 0
        self._events.clear()
        self._fails_in_window = 0
