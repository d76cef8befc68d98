"""A circuit breaker per endpoint per worker: closed -> open -> half-open -> closed.

* **closed**: calls pass; it opens when, over the last ``window_s`` seconds, at least
  ``min_calls`` calls finished and the failure rate reached ``failure_rate``, or when
  ``consecutive`` calls in a row failed. Both count the calls still in flight (let
  through while closed, not answered yet) as calls that may succeed: results arrive in
  the order they finish, not the order they were sent, and an error answered at once
  (a 529, a 503) comes back before the slow successes sent with it. Judged on finished
  calls alone, 30% of instant errors made the first results mostly failures and opened
  the breaker (throughput fell a hundredfold); a run of failures opens it only when it
  is at least ``failure_rate`` of itself and the calls in flight.
* **open**: no call passes (the endpoint's tasks go to its fallback, or wait) until
  ``open_s`` has passed; each re-opening doubles that time, up to ``max_open_s``.
* **half-open**: up to ``probes`` calls pass at a time, judged by their share of
  failures: it opens again once ``failure_rate`` of ``probes`` (at least one) failed,
  and closes once so many succeeded that the rest can no longer reach it (one failure
  in three does not re-open it: 30% of errors re-opened it two times in three).

Failures here are the endpoint's own (server errors, timeouts, refused connections);
429s are handled by pauses and bad answers are the prompt's business, so neither opens
the breaker. Time is passed in (seconds, any monotonic clock).
"""

from __future__ import annotations

import math
from collections import deque
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Breaker:
    """The state machine; ``allow`` before a call, ``record`` after it."""

    __slots__ = ("_events", "_fails_in_window", "consecutive", "consecutive_failures",
                 "failure_rate", "in_flight", "max_open_s", "min_calls", "open_count",
                 "open_s", "open_until", "probe_failures", "probe_successes", "probes",
                 "probes_in_flight", "state", "window_s")

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
        self.probe_failures = 0
        #: Calls let through while closed that have not ended yet.
        self.in_flight = 0
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
            self.probe_failures = 0
        if self.state is BreakerState.HALF_OPEN:
            if self.probes_in_flight >= self.probes:
                return False
            self.probes_in_flight += 1
            return True
        self.in_flight += 1
        return True

    def unjudged(self, probe: bool) -> None:
        """A call ``allow`` let through ended without a verdict on the endpoint (it was
        never sent, or the provider throttled it): a probe's place is free again, a
        call let through while closed is no longer in flight."""
        if not probe:
            self.in_flight = max(0, self.in_flight - 1)
        elif self.state is BreakerState.HALF_OPEN:
            self.probes_in_flight = max(0, self.probes_in_flight - 1)

    @property
    def _probes_to_open(self) -> int:
        """Failed probes that open a half-open breaker again: ``failure_rate`` of
        ``probes``, at least one."""
        return max(1, math.ceil(self.failure_rate * self.probes - 1e-9))

    def _failing(self, failures: int, calls: int) -> bool:
        """Whether ``failures`` of ``calls`` finished reach the failure rate, the calls
        still in flight counted as calls that may succeed."""
        return failures >= self.failure_rate * (calls + self.in_flight)

    def record(self, now: float, *, failed: bool, probe: bool = False) -> None:
        """The outcome of a call ``allow`` let through (``probe``: it was let through
        half-open). Calls that started before the breaker opened are only counted."""
        if probe and self.state is BreakerState.HALF_OPEN:
            self.unjudged(probe)
            need = self._probes_to_open
            if failed:
                self.probe_failures += 1
                if self.probe_failures >= need:
                    self._open(now)
                return
            self.probe_successes += 1
            if self.probe_successes > self.probes - need:
                self._close()
            return
        if not probe:
            self.in_flight = max(0, self.in_flight - 1)
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
        run = self.consecutive_failures
        if (run >= self.consecutive and self._failing(run, run)) or (
                n >= self.min_calls and self._failing(self._fails_in_window, n)):
            self._open(now)

    def _open(self, now: float) -> None:
        self.open_count += 1
        wait = min(self.max_open_s, self.open_s * 2 ** max(0, self.open_count - 1))
        self.state = BreakerState.OPEN
        self.open_until = now + wait
        self.probes_in_flight = 0
        self.probe_successes = 0
        self.probe_failures = 0

    def _close(self) -> None:
        self.state = BreakerState.CLOSED
        self.open_count = 0
        self.consecutive_failures = 0
        self._events.clear()
        self._fails_in_window = 0
