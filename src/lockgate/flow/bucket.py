"""The shared budget of an endpoint as a token bucket, and the arithmetic of leasing it.

One bucket row per endpoint lives in the database (``rate_limit``); every worker on
every machine leases small chunks from it. This module is the arithmetic only: the
store reads the row and the database clock, calls :func:`lease`, and writes the result
back under the row's version.

Providers publish a limit ``L`` per window ``W`` (a minute) but may enforce it over a
shorter period ``P`` (OpenAI: 60,000 per minute may be enforced as 1,000 in any second),
so a provider's limit is paced at ``P``: its share per period is ``L_P = L * P / W``.
A bucket that refills at rate ``r`` and holds at most ``cap`` releases at most
``cap + r * T`` in any period ``T``. The cap is a small share of ``L_P`` (``burst``),
and the rate is what remains of ``L_P * (1 - headroom)`` once the cap is set aside, so
the budget released inside any period of ``P`` or more stays below
``L_P * (1 - headroom)`` per ``P``. A lease may grant ahead of the allowance by up to
``ahead_ms`` of refill (the allowance goes negative): those grants are *scheduled*,
they become usable when the allowance would have reached them, and the worker
spends them no earlier (:class:`Grant` says when). So a worker that leases every
100 ms always holds the next 100 ms of budget, none of it is lost between leases, and
nothing bunches at lease time. The headroom is left for what the bucket cannot see:
calls sent late and bunched by a starved process, refunds of estimates that were too
dear. Allowance may go negative for tokens too: a request larger than the cap (or a
settlement that charges more than was reserved) is paid back by later refills, so the
long-run rate holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class Limits:
    """Effective capacity of a bucket: ``requests``/``tokens`` per ``window_ms``.

    None means unlimited in that dimension.
    """

    requests: float | None
    tokens: float | None
    window_ms: int = 60_000
    headroom: float = 0.02
    burst: float = 0.01
    min_cap_ms: float = 0.0
    #: The limit is a provider's, counted in a sliding window: it is paced at
    #: ``period_ms`` with the cap set aside inside it, and grants run ahead of the
    #: allowance by ``min_cap_ms`` (scheduled). False for a pace (a window batch's
    #: target rate), which is met on average and has no window to overrun.
    sliding: bool = True
    #: The shortest period the provider may enforce the limit over, scaled (0: the
    #: window). A limit of few units per window is paced over a longer period
    #: (:data:`MIN_UNITS` per period at least).
    period_ms: float = 0.0

    @property
    def limited(self) -> bool:
        return self.requests is not None or self.tokens is not None

    def period(self, limit: float) -> float:
        """The period (ms) a provider's ``limit`` is paced at: ``period_ms``, but long
        enough to hold :data:`MIN_UNITS` of the limit, and at most the window."""
        w = float(self.window_ms)
        if not self.sliding or self.period_ms <= 0:
            return w
        return min(w, max(self.period_ms, w * MIN_UNITS / max(limit, 1e-9)))

    def rate(self, limit: float | None) -> float:
        """Refill per ms for a limit (0 for unlimited): what is left of the period's
        share ``L_P * (1 - headroom)`` once the cap is set aside, so ``cap + rate * P``
        never exceeds it and the headroom stays free for what the bucket cannot see."""
        if limit is None:
            return 0.0
        budget = limit * (1.0 - self.headroom)
        if not self.sliding:
            return budget / self.window_ms
        p = self.period(limit)
        share = budget * p / self.window_ms
        r = (share - max(1.0, limit * p / self.window_ms * self.burst)) / p
        # A limit of about one call per period leaves nothing after the cap: pace at
        # half the budget then (the bound cannot hold below one whole request).
        return max(r, share / p / 2)

    def cap(self, limit: float | None) -> float:
        """Most a bucket can hold (idle, it fills up to this; a burst of it may go at
        once). A provider's limit: a small share of its period (``burst``), at least
        one request. A pace: that share of its window, at least ``min_cap_ms`` of
        refill (so refills between two leases are not lost)."""
        if limit is None:
            return math.inf
        if self.sliding:
            return max(1.0, limit * self.period(limit) / self.window_ms * self.burst)
        return max(1.0, limit * self.burst, self.rate(limit) * self.min_cap_ms)

    def ahead(self, limit: float | None) -> float:
        """How far below zero a grant may take the allowance: ``min_cap_ms`` of refill
        for a provider's limit (granted ahead, scheduled), nothing for a pace."""
        if limit is None or not self.sliding:
            return 0.0
        return self.rate(limit) * self.min_cap_ms

    @property
    def recover_per_ms(self) -> float:
        """How fast a rate cut by 429s climbs back: :data:`RECOVER` of the limit per
        period the limit is paced at, that period taken between 1 s and 10 s."""
        limit = self.requests if self.requests is not None else self.tokens
        p = 10_000.0 if limit is None else min(10_000.0, max(1000.0, self.period(limit)))
        return RECOVER / p

    def per_second(self) -> tuple[float | None, float | None]:
        """The refill rate as (requests/s, tokens/s), the most a lease can sustain."""
        return (None if self.requests is None else self.rate(self.requests) * 1000,
                None if self.tokens is None else self.rate(self.tokens) * 1000)


#: A provider's limit is paced over a period that holds at least this many units of it
#: (a limit of 600 per minute is paced over 10 s, not 1 s: 1% of 10 is no burst).
MIN_UNITS = 100.0


def effective(configured: float | None, learned: float | None) -> float | None:
    """The limit to enforce: the configured one, lowered by what the provider reported."""
    if configured is None:
        return learned
    if learned is None:
        return configured
    return min(configured, learned)


@dataclass(frozen=True, slots=True)
class Bucket:
    """The row's state: allowances, the database time they were computed at, the pause."""

    requests: float
    tokens: float
    refilled_at: int
    paused_until: int = 0
    factor: float = 1.0   # share of the limits in force (lowered by the provider's 429s)
    cut_at: int = 0

    def refilled(self, limits: Limits, now: int) -> Bucket:
        """The state at ``now``: allowances grown by the elapsed time, up to the cap."""
        elapsed = max(0, now - self.refilled_at)
        req = self.requests
        tok = self.tokens
        if limits.requests is not None:
            req = min(limits.cap(limits.requests), req + elapsed * limits.rate(limits.requests))
        if limits.tokens is not None:
            tok = min(limits.cap(limits.tokens), tok + elapsed * limits.rate(limits.tokens))
        return replace(self, requests=req, tokens=tok, refilled_at=max(now, self.refilled_at))


@dataclass(frozen=True, slots=True)
class Ask:
    """What one worker asks of one bucket in one lease. With ``per_call`` and the
    budget it holds, tokens are granted only for calls that have a request to go
    with (see :func:`lease`)."""

    #: The budget it wants, each on its own: the calls waiting, their estimated tokens.
    requests: int = 0
    tokens: float = 0.0
    #: The biggest single call among them, which may be granted on a positive token
    #: allowance even when it exceeds it.
    largest: float = 0.0
    give_requests: float = 0.0  # unspent budget it returns
    give_tokens: float = 0.0
    #: The settlement since its last lease: real usage minus estimates (negative: a
    #: refund).
    debt_tokens: float = 0.0
    #: Calls sent before the limit was known (learned from the provider's headers),
    #: charged to the request allowance once it is.
    debt_requests: float = 0.0
    pause_ms: int = 0  # a pause it learned from the provider
    #: It replaces the bucket's pause (a Retry-After for one inferred from headers),
    #: shorter or longer; else the longer of the two holds.
    replace_pause: bool = False
    #: A 429 for the rate: every worker's rate goes down to this share of itself
    #: (:data:`CUT`, or :data:`SPORADIC_CUT` for a sporadic one; 1.0: no cut).
    cut: float = 1.0
    per_call: float = 0.0  # its estimate of one waiting call's tokens
    #: The budget it holds unspent.
    held_requests: float = 0.0
    held_tokens: float = 0.0


#: A 429 for exceeding the limit lowers the rate of every worker by 10% (at most once
#: per ``CUT_GAP_MS``, however many calls the burst hit), down to half; a sporadic 429
#: while calls wait for the bucket (a few calls bunched up on the way, the rate is
#: about right) by 5%, so the throughput it costs while climbing back is a quarter
#: (half the depth, half the time); it climbs back
#: by 2% of the limit per period the limit is paced at (at least 1 s, at most 10 s:
#: per 10 s for a per-minute limit, per second for one enforced per second) without
#: 429s. The provider's verdict corrects what the bucket cannot see: limits counted
#: differently, delays that bunch calls up on the way.
CUT = 0.9
SPORADIC_CUT = 0.95
MIN_FACTOR = 0.5
RECOVER = 0.02
RECOVER_PER_MS = RECOVER / 10_000  # the slowest recovery
CUT_GAP_MS = 2000


@dataclass(frozen=True, slots=True)
class Grant:
    """What a lease gave: budget, and the pause still in force (ms from now)."""

    requests: int
    tokens: float
    paused_ms: int
    #: When the grant becomes usable: the allowance it was taken from (``*_from``)
    #: and the refill per ms (``*_rate``; 0: all of it at once). The worker may spend
    #: ``clamp(from + rate * t, 0, granted)`` of it ``t`` ms after the lease
    #: (:func:`usable`).
    req_from: float = math.inf
    req_rate: float = 0.0
    tok_from: float = math.inf
    tok_rate: float = 0.0


def usable(granted: float, start: float, rate: float, t_ms: float) -> float:
    """How much of a grant may be spent ``t_ms`` after the lease (see :class:`Grant`)."""
    if rate <= 0 or start >= granted:
        return granted
    return min(granted, max(0.0, start + rate * t_ms))


def lease(bucket: Bucket, limits: Limits, now: int, ask: Ask) -> tuple[Bucket, Grant]:
    """Refill to ``now``, book returns, settlements and pauses, then grant what fits.

    Requests are granted whole, at most the request allowance; tokens at most the token
    allowance, except that a positive allowance always covers the largest single call
    asked for (the allowance goes negative and later refills pay it back), so a call
    larger than the bucket's cap is never starved and the overdraft is one call at most.
    Nothing is granted during a pause.
    """
    factor = min(1.0, bucket.factor + max(0, now - bucket.refilled_at) * limits.recover_per_ms)
    cut_at = bucket.cut_at
    if ask.cut < 1.0 and now - cut_at >= CUT_GAP_MS:
        factor = max(MIN_FACTOR, factor * ask.cut)
        cut_at = now
    limits = scaled(limits, factor)
    b = replace(bucket.refilled(limits, now), factor=factor, cut_at=cut_at)
    req, tok = b.requests, b.tokens
    if limits.requests is not None:
        req = owed(min(limits.cap(limits.requests), req + max(0.0, ask.give_requests))
                   - max(0.0, ask.debt_requests), limits.requests)
    if limits.tokens is not None:
        # Returns and refunds refill only up to the cap (else they would make a burst);
        # charges are always taken, the allowance may go negative.
        back = max(0.0, ask.give_tokens) + max(0.0, -ask.debt_tokens)
        tok = owed(min(limits.cap(limits.tokens), tok + back)
                   - max(0.0, ask.debt_tokens), limits.tokens)
    paused_until = b.paused_until
    if ask.pause_ms > 0:
        paused_until = now + ask.pause_ms if ask.replace_pause and paused_until > now \
            else max(paused_until, now + ask.pause_ms)
    n = 0
    tokens = 0.0
    req_from, tok_from = req, tok
    if now >= paused_until:
        if ask.requests > 0:
            n = ask.requests if limits.requests is None else \
                min(ask.requests,
                    max(0, math.floor(req + limits.ahead(limits.requests) + 1e-9)))
        if ask.tokens > 0:
            want = ask.tokens
            if (limits.requests is not None and n < ask.requests and ask.per_call > 0):
                # Requests bind: grant tokens only for the calls that can go now. Else
                # every worker would hold the tokens of all its waiting calls, and when
                # the inputs grow (tokens start to bind) they would all be spent at once,
                # on top of the bucket: a burst over the token limit.
                want = min(want, max(0.0, (ask.held_requests + n) * ask.per_call
                                     - ask.held_tokens))
            if limits.tokens is None:
                tokens = want
            else:
                avail = tok + limits.ahead(limits.tokens)
                if avail > 0 and want > 0:
                    tokens = min(want, max(avail, min(ask.largest, want)))
        if limits.requests is not None:
            req -= n
        if limits.tokens is not None:
            tok -= tokens
    out = replace(b, requests=req, tokens=tok, paused_until=paused_until)
    return out, Grant(n, tokens, max(0, paused_until - now),
                      req_from if limits.requests is not None else math.inf,
                      limits.rate(limits.requests) if limits.sliding else 0.0,
                      tok_from if limits.tokens is not None else math.inf,
                      limits.rate(limits.tokens) if limits.sliding else 0.0)


def owed(allowance: float, limit: float) -> float:
    """An allowance after charges, owing at most one window of the limit: a provider
    refuses a request larger than its limit per window, so a debt beyond that is a
    usage figure that cannot be true (one answer claiming 500M tokens stalled a 100k
    per minute endpoint for days)."""
    return max(allowance, -limit)


def scaled(limits: Limits, factor: float) -> Limits:
    """The limits at ``factor`` of their capacity."""
    if factor >= 1.0:
        return limits
    return replace(limits,
                   requests=None if limits.requests is None else limits.requests * factor,
                   tokens=None if limits.tokens is None else limits.tokens * factor)


def initial(limits: Limits, now: int) -> Bucket:
    """A new bucket: full (its small cap), so starting workers cannot burst past it."""
    return Bucket(requests=0.0 if limits.requests is None else limits.cap(limits.requests),
                  tokens=0.0 if limits.tokens is None else limits.cap(limits.tokens),
                  refilled_at=now)
