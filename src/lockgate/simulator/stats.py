"""Request accounting: what the simulator saw, so tests can prove no loss and count duplicates.

lockgate's workers send ``Idempotency-Key: {task_id}:{claim}:{attempt}`` (``claim``
the first 16 hex digits of the lease token, new at every claim); other clients may send
``{task_id}:{attempt}``. Two numbers answer different questions:

* ``duplicate_keys``: keys that arrived more than once (a client re-sent the very same
  attempt, e.g. an HTTP-level retry);
* ``duplicate_successes``: per task (the key without its claim and attempt), the number
  of well-formed successful answers beyond the first, summed over tasks. This is the
  count of duplicate LLM calls that a queue's at-least-once delivery caused.

Both are maintained incrementally so a snapshot is O(number of keys) only with
``detail``; the totals are O(1).
"""

from __future__ import annotations

import re
import time
from collections import Counter, deque
from typing import Any

NO_KEY = "no_key"


def mask_key(key: str) -> str:
    """Show an API key in stats without echoing a long secret in full."""
    if not key:
        return "(none)"
    if len(key) <= 16:
        return key
    return f"{key[:4]}...{key[-4:]}"


_CLAIM_KEY = re.compile(r"(.*):[0-9a-f]{16}:\d+")


def task_of(idempotency_key: str) -> str:
    """The task part of ``{task_id}:{claim}:{attempt}`` or ``{task_id}:{attempt}`` (the
    whole key when it has no colon)."""
    m = _CLAIM_KEY.fullmatch(idempotency_key)
    if m is not None:
        return m.group(1)
    head, sep, _tail = idempotency_key.rpartition(":")
    return head if sep else idempotency_key


class Stats:
    """Counters for one simulator; cleared by ``POST /_sim/reset``."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Start counting from zero."""
        self.started = time.time()
        self._mono = time.monotonic()
        #: When the first and the last request arrived (monotonic): the span a client's
        #: throughput is measured over, to the request (a sampler is off by its period).
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.requests = 0
        self.in_flight = 0
        self.hanging = 0
        self.by_status: Counter[str] = Counter()
        self.by_outcome: Counter[str] = Counter()
        self.by_key: Counter[str] = Counter()
        self.by_model: Counter[str] = Counter()
        self.key_counts: dict[str, int] = {}
        self.no_key = 0
        self.duplicate_keys = 0
        self.task_successes: dict[str, int] = {}
        self.duplicate_successes = 0
        self.successes = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        #: Answers each degradation switch changed (drop_fields, drift, slow, broken_json).
        self.degraded: Counter[str] = Counter()
        self.limited_by: Counter[str] = Counter()  # 429s of the limiter: requests/tokens
        #: Arrival times (monotonic) in the last second, and the most seen in one: how
        #: evenly a client paces, whether or not a limit is set.
        self._arrivals: deque[float] = deque()
        self.peak_1s = 0

    def begin(self, api_key: str, model: str, idempotency_key: str | None) -> None:
        """Count an incoming chat-completion request."""
        self.requests += 1
        now = time.monotonic()
        if self.first_at is None:
            self.first_at = now
        self.last_at = now
        arrivals = self._arrivals
        arrivals.append(now)
        while arrivals[0] <= now - 1.0:
            arrivals.popleft()
        if len(arrivals) > self.peak_1s:
            self.peak_1s = len(arrivals)
        self.by_key[api_key] += 1
        self.by_model[model] += 1
        if idempotency_key is None:
            self.no_key += 1
            return
        seen = self.key_counts.get(idempotency_key, 0) + 1
        self.key_counts[idempotency_key] = seen
        if seen == 2:
            self.duplicate_keys += 1

    def finish(self, status: int, outcome: str) -> None:
        """Count a response by HTTP status and by what the simulator did."""
        self.by_status[str(status)] += 1
        self.by_outcome[outcome] += 1

    def tokens(self, prompt_tokens: int, completion_tokens: int) -> None:
        """Add the usage of a 2xx answer."""
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens

    def success(self, idempotency_key: str | None) -> None:
        """Count a 2xx answer whose content a client can use (one more call for its task)."""
        self.successes += 1
        if idempotency_key is None:
            return
        task = task_of(idempotency_key)
        n = self.task_successes.get(task, 0) + 1
        self.task_successes[task] = n
        if n > 1:
            self.duplicate_successes += 1

    def snapshot(self, detail: bool = False) -> dict[str, Any]:
        """The JSON document served by ``GET /_sim/stats``."""
        by_key: Counter[str] = Counter()
        for key, n in self.by_key.items():
            by_key[mask_key(key)] += n
        doc: dict[str, Any] = {
            "uptime_s": round(time.time() - self.started, 3),
            "requests": self.requests,
            "peak_requests_1s": self.peak_1s,
            "first_request_s": None if self.first_at is None else
            round(self.first_at - self._mono, 6),
            "last_request_s": None if self.last_at is None else
            round(self.last_at - self._mono, 6),
            "in_flight": self.in_flight,
            "hanging": self.hanging,
            "by_status": dict(self.by_status),
            "by_outcome": dict(self.by_outcome),
            "limited_by": dict(self.limited_by),
            "degraded": dict(self.degraded),
            "by_key": dict(by_key),
            "by_model": dict(self.by_model),
            "idempotency_keys": len(self.key_counts),
            "no_key": self.no_key,
            "duplicate_keys": self.duplicate_keys,
            "successes": self.successes,
            "tasks_succeeded": len(self.task_successes),
            "duplicate_successes": self.duplicate_successes,
            "tokens": {
                "prompt": self.prompt_tokens,
                "completion": self.completion_tokens,
                "total": self.prompt_tokens + self.completion_tokens,
            },
        }
        if detail:
            doc["task_successes"] = dict(self.task_successes)
            doc["duplicate_key_counts"] = {k: n for k, n in self.key_counts.items() if n > 1}
        return doc
