"""One endpoint as one worker sees it: its calls in flight and waiting, the budget it
holds from the shared bucket, its pause, breaker, adaptive limit and health figures.

The parts of flow control share this state: admission lets calls pass, leasing fills
and empties the ledger, the feedback of finished calls feeds health, breaker, limit
and pause. Nothing here waits or does I/O.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Any

from lockgate.config import Endpoint, FlowSettings
from lockgate.flow.breaker import Breaker
from lockgate.flow.concurrency import Adaptive, make_policy


@dataclass(slots=True)
class Waiter:
    """A call waiting for passage; its future says whether it may go (False: route it
    again), and ``probe`` whether it went as a half-open breaker's probe."""

    fut: asyncio.Future[bool]
    tokens: float
    probe: bool = False


@dataclass(slots=True)
class Ledger:
    """Budget this worker holds from the shared bucket (``req``/``tok``, spent call by
    call), and what its next lease carries to the shared row: returns, the settlement of
    tokens, a pause, a cut of the rate, limits the provider reported."""

    req: float = 0.0  # granted, unspent (negative: spent beyond the grant)
    tok: float = 0.0
    #: To return: unspent budget, and reservations of calls the provider refused.
    give_req: float = 0.0
    give_tok: float = 0.0
    debt_tok: float = 0.0  # tokens used minus tokens reserved, since the last lease
    cut: bool = False  # a 429 for the rate: the shared rate goes down a step
    pause_ms: int = 0  # the longest pause learned since the last lease, and why
    pause_reason: str | None = None
    learned_rpm: float | None = None  # limits the provider's headers named
    learned_tpm: float | None = None
    #: The limits last reported to the row (the same header again is no news).
    sent_rpm: float | None = None
    sent_tpm: float | None = None

    def refund(self, tokens: float) -> None:
        """A call's reservation goes back to the shared bucket (it was never counted)."""
        self.give_req += 1.0
        self.give_tok += tokens

    def publish_pause(self, ms: int, reason: str) -> None:
        if ms > self.pause_ms:
            self.pause_ms = ms
            self.pause_reason = reason


@dataclass(slots=True)
class Health:
    """What this worker saw of the endpoint: counters, a recent dispatch rate, moving
    averages of latency and failures, and the last endpoint failure's message."""

    calls: int = 0
    failures: int = 0  # the endpoint's own failures and its refusals (429)
    throttled: int = 0  # refusals for the rate or the quota
    rerouted: int = 0  # calls it answered for another endpoint
    answers: int = 0
    dispatched: int = 0  # since the last tick of the flow loop
    rate: float = 0.0
    latency_ewma: float | None = None
    failure_ewma: float = 0.0
    last_error: str | None = None

    def tick(self, dt: float) -> None:
        """Fold the calls dispatched in the last ``dt`` seconds into the rate."""
        self.rate += 0.3 * (self.dispatched / dt - self.rate)
        self.dispatched = 0


class EndpointState:
    """One endpoint in one worker (see the module docstring)."""

    __slots__ = ("adaptive", "breaker", "ep", "factor", "health", "in_flight", "ledger",
                 "limited", "name", "pause_reason", "paused_until", "timer", "tok_limited",
                 "waiters", "waiting_tokens")

    def __init__(self, ep: Endpoint, fs: FlowSettings, now: float) -> None:
        self.ep = ep
        self.name = ep.name
        self.limited = ep.limited
        self.tok_limited = ep.tpm is not None
        self.waiters: deque[Waiter] = deque()
        self.waiting_tokens = 0.0
        self.in_flight = 0
        self.timer: asyncio.TimerHandle | None = None
        self.adaptive = Adaptive(make_policy(ep.concurrency_policy, ep.min_concurrency,
                                             ep.max_concurrency),
                                 initial=ep.initial_concurrency or ep.max_concurrency,
                                 min_limit=ep.min_concurrency, max_limit=ep.max_concurrency,
                                 interval_s=fs.adjust_interval_s, min_samples=fs.min_samples,
                                 norm_overhead=fs.latency_overhead_tokens, now=now)
        self.breaker = Breaker(failure_rate=fs.breaker_failure_rate,
                               min_calls=fs.breaker_min_calls,
                               consecutive=fs.breaker_consecutive,
                               window_s=fs.breaker_window_s, open_s=fs.breaker_open_s,
                               max_open_s=fs.breaker_max_open_s, probes=fs.breaker_probes)
        self.paused_until = 0.0
        self.pause_reason: str | None = None
        self.factor = 1.0  # share of the limits in force, from the shared row
        self.ledger = Ledger()
        self.health = Health()

    def paused(self, now: float) -> bool:
        return now < self.paused_until

    def has_budget(self, tokens: float) -> bool:
        """Whether the budget held covers one more call of ``tokens``."""
        if not self.limited:
            return True
        if self.ep.rpm is not None and self.ledger.req < 1.0 - 1e-9:
            return False
        return not (self.tok_limited and self.ledger.tok <= 0.0 and tokens > 0)

    def spend(self, tokens: float) -> None:
        """One call goes: it spends budget and takes a slot."""
        if self.limited:
            self.ledger.req -= 1.0
            self.ledger.tok -= tokens
        self.in_flight += 1
        self.health.dispatched += 1

    def detail(self, now: float) -> dict[str, Any]:
        """What the worker row and ``lockgate status`` show of this endpoint."""
        last = self.adaptive.last_stats
        h = self.health
        return {
            "limit": self.adaptive.slots, "policy": self.adaptive.policy.name,
            "in_flight": self.in_flight, "waiting": len(self.waiters),
            "latency_ms": round(h.latency_ewma, 1) if h.latency_ewma else None,
            "failure_rate": round(h.failure_ewma, 4),
            "window_latency_ms": round(last.mean_latency_ms, 1) if last else None,
            "window_failure_rate": round(last.failure_rate, 4) if last else None,
            "breaker": str(self.breaker.state),
            "paused_ms": max(0, int((self.paused_until - now) * 1000)),
            "pause_reason": self.pause_reason if self.paused(now) else None,
            "calls": h.calls, "failures": h.failures, "throttled": h.throttled,
            "rerouted": h.rerouted, "rate_per_s": round(h.rate, 1),
            "rate_factor": round(self.factor, 3),
        }

