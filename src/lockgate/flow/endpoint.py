"""One endpoint as one worker sees it: its calls in flight and waiting, the budget it
holds from the shared bucket, its pause, breaker, adaptive limit and health figures.

The parts of flow control share this state: admission lets calls pass, leasing fills
and empties the ledger, the feedback of finished calls feeds health, breaker, limit
and pause. Nothing here waits or does I/O.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from lockgate.config import Endpoint, FlowSettings
from lockgate.flow.breaker import Breaker, BreakerState
from lockgate.flow.bucket import Grant, usable
from lockgate.flow.concurrency import Adaptive, make_policy

#: Send times kept while no limit is known.
RECENT_KEPT = 16_384

#: An inferred pace (:class:`Pace`): the share of the calls the provider answered in
#: the last enforcement period it starts at, its cut on a later 429 (at most once per
#: period, for a 429 of a call sent after the last cut), its rise per period in which
#: calls waited for it without a 429 (x2 back up to the rate that last held a period
#: without 429s, then 2 %), its least rate (calls per second), and the burst it allows
#: (seconds of its rate).
PACE_START = 0.9
PACE_CUT = 0.85
PACE_REGAIN = 2.0
PACE_RISE = 0.02
PACE_MIN_RATE = 0.2
PACE_BURST_S = 0.1
#: The fewest answered calls a pace is inferred from (none say nothing of the
#: provider's limit: the pause alone holds the calls back, and the calls after it are
#: the next sample).
PACE_MIN_ANSWERED = 1
#: 429s for the rate under this share of the answers of the last enforcement period are
#: sporadic (a provider refusing now and then, not a limit reached): the refused call
#: retries after its own Retry-After, the endpoint is neither paused nor slowed. At 1%
#: of random 429s every refusal paused the endpoint and cut its pace: a worker doing
#: 200 calls a second settled at about 12.
SPORADIC_SHARE = 0.05
#: A run of 429s naming nothing (no header, no Retry-After) from a provider that accepts
#: nothing (a window's limit reached): each pause of the run doubles the one before, up
#: to the endpoint's ``limit_window_s`` and at most this (seconds); after each, this many
#: calls probe the endpoint, the others wait for an answer.
RUN_MAX_PAUSE_S = 60.0
RUN_PROBES = 1


@dataclass(slots=True)
class Pace:
    """A request rate (calls per second) one worker keeps to on an endpoint that
    refuses calls for the rate (429) without naming a limit (no header, none
    configured): without it, every pause ends with all the calls waiting sent at once,
    and the next 429s spend the tasks' retries. Started from the calls the provider
    answered in the last enforcement period, cut on each later 429, raised while calls
    wait for it and no 429 comes (so several workers settle on shares of the provider's
    limit, and a limit raised later is found). A limit configured or named by the
    provider replaces it (the shared bucket paces from then on).

    A cut needs evidence about the pace in force: a 429 of a call sent after the last
    cut, a period after it; and, once cut, calls the provider accepted in the last
    period (a provider refusing everything, overloaded, says nothing of the rate: its
    429s pause the endpoint, they do not cut the pace to its floor second after
    second). ``held`` is the rate that last went a period without a 429 (lowered by a
    cut the provider's acceptances show to be a limit): the pace climbs back to it
    doubling each period, then by :data:`PACE_RISE`."""

    rate: float
    period: float
    allowance: float = 0.0  # calls that may go now (starts empty: no burst)
    at: float = 0.0  # when the allowance was last refilled (monotonic)
    cut_at: float = 0.0  # the last cut (or the start)
    rose_at: float = 0.0  # the last rise
    held: float = 0.0  # the rate that last held a period without a 429

    @classmethod
    def inferred(cls, answered: int, period: float, now: float, *,
                 cold: bool = False) -> Pace:
        """A pace from the calls ``answered`` in the period up to a 429. From a
        ``cold`` period (the first calls were sent inside it: it says little of the
        limit, only that the provider took that many) the pace doubles each period
        without a 429 until one comes, not by 2 %."""
        rate = max(PACE_MIN_RATE, PACE_START * answered / period)
        return cls(rate, period, 0.0, now, now, now, math.inf if cold else rate)

    def _cap(self) -> float:
        """The most calls that may go at once."""
        return max(1.0, self.rate * PACE_BURST_S)

    def _refill(self, now: float) -> None:
        if now > self.at:
            self.allowance = min(self._cap(), self.allowance + (now - self.at) * self.rate)
            self.at = now

    def ready(self, now: float) -> bool:
        self._refill(now)
        return self.allowance >= 1.0 - 1e-9

    def take(self, now: float) -> None:
        self._refill(now)
        self.allowance -= 1.0

    def give_back(self) -> None:
        """A call that passed was never sent."""
        self.allowance = min(self._cap(), self.allowance + 1.0)

    def wait(self, now: float) -> float:
        """Seconds until one more call may go."""
        self._refill(now)
        return max(0.0, (1.0 - self.allowance) / self.rate)

    def hold(self, until: float) -> None:
        """A pause until ``until`` (longer than any before, or replacing one only
        inferred): nothing accrues meanwhile, so that the calls
        waiting do not go at once when it ends (each pause of a storm of 429s would
        end with a burst of 0.1 s of the rate)."""
        self.allowance = min(self.allowance, 0.0)
        self.at = until

    def cut(self, now: float, sent: float | None = None, *, accepted: bool = True) -> bool:
        """A 429 for the rate of a call sent at ``sent`` (None: now), when the provider
        ``accepted`` calls in the last period or not: slow down (once per period, for
        the calls of one burst, and only for a call sent after the last cut; once only,
        until the next rise, while it accepts nothing). False when not cut."""
        if now - self.cut_at < self.period or (sent is not None and sent < self.cut_at):
            return False
        if not accepted and self.cut_at > self.rose_at:
            return False  # refusing everything: not this pace's doing
        self._refill(now)
        self.rate = max(PACE_MIN_RATE, self.rate * PACE_CUT)
        if accepted:  # a limit below the rate: do not climb back past it quickly
            self.held = min(self.held, self.rate)
        self.allowance = min(self.allowance, 0.0)
        self.cut_at = now
        return True

    def rise(self, now: float) -> None:
        """An answer while calls wait for the pace: a period without a cut or a rise
        raises it, doubling back up to the rate that last held, then by 2 %."""
        if now - max(self.cut_at, self.rose_at) >= self.period:
            self._refill(now)
            self.held = max(self.held, self.rate)  # it held a period (inf: a cold start)
            if self.rate < self.held:
                self.rate = min(self.held, self.rate * PACE_REGAIN)
            else:
                self.rate *= 1.0 + PACE_RISE
            self.rose_at = now


@dataclass(slots=True)
class Waiter:
    """A call waiting for passage; its future says whether it may go (False: route it
    again), and ``probe`` whether it went as a half-open breaker's probe. A ``pinned``
    call never takes a fallback: it waits for its own endpoint."""

    fut: asyncio.Future[bool]
    tokens: float
    probe: bool = False
    pinned: bool = False
    #: Whether it went as a probe of a run of refusals (:meth:`EndpointState.run_probe`).
    run_probe: bool = False


@dataclass(slots=True)
class Ledger:
    """Budget this worker holds from the shared bucket (``req``/``tok``, spent call by
    call), and what its next lease carries to the shared row: returns, the settlement of
    tokens, a pause, a cut of the rate, limits the provider reported."""

    req: float = 0.0  # granted, unspent (negative: spent beyond the grant)
    tok: float = 0.0
    #: Grants not usable yet in full (granted ahead, see :class:`~lockgate.flow.bucket.
    #: Grant`): ``[monotonic time of the lease, granted, from, rate per ms]``.
    sched_req: list[list[float]] = field(default_factory=list)
    sched_tok: list[list[float]] = field(default_factory=list)
    #: To return: unspent budget, and reservations of calls the provider refused.
    give_req: float = 0.0
    give_tok: float = 0.0
    debt_tok: float = 0.0  # tokens used minus tokens reserved, since the last lease
    debt_req: float = 0.0  # calls sent before the limit was learned
    #: A 429 for the rate: the shared rate goes down to this share of itself (1.0: no
    #: cut; see :data:`~lockgate.flow.bucket.CUT`).
    cut: float = 1.0
    pause_ms: int = 0  # the longest pause learned since the last lease, and why
    pause_reason: str | None = None
    #: Whether the provider named it (Retry-After): it then replaces a pause of the
    #: shared row that was only inferred from its headers (reason ``exhausted``).
    pause_explicit: bool = False
    learned_rpm: float | None = None  # limits the provider's headers named
    learned_tpm: float | None = None
    #: The limits last reported to the row (the same header again is no news).
    sent_rpm: float | None = None
    sent_tpm: float | None = None

    def granted(self, g: Grant, now: float) -> None:
        """Add a lease's grant; what is granted ahead is scheduled."""
        self.req += g.requests
        self.tok += g.tokens
        if g.requests and g.req_rate > 0 and g.req_from < g.requests:
            self.sched_req.append([now, float(g.requests), g.req_from, g.req_rate])
        if g.tokens and g.tok_rate > 0 and g.tok_from < g.tokens:
            self.sched_tok.append([now, g.tokens, g.tok_from, g.tok_rate])

    def give_up(self) -> None:
        """A pause began: the budget held goes back to the bucket (the provider's time
        it was scheduled for passes unused; spent after the pause it would be a
        burst)."""
        if self.req > 0:
            self.give_req += self.req
            self.req = 0.0
        if self.tok > 0:
            self.give_tok += self.tok
            self.tok = 0.0
        self.sched_req.clear()
        self.sched_tok.clear()

    def clear(self) -> None:
        """Everything held is given back."""
        self.req = self.tok = self.debt_tok = self.give_req = self.give_tok = 0.0
        self.debt_req = 0.0
        self.sched_req.clear()
        self.sched_tok.clear()

    def refund(self, tokens: float) -> None:
        """A call's reservation goes back to the shared bucket (it was never counted)."""
        self.give_req += 1.0
        self.give_tok += tokens

    def publish_pause(self, ms: int, reason: str, *, explicit: bool = False,
                      replace: bool = False) -> None:
        """Carry a pause to the next lease: the longest, or this one when it
        ``replace``-s one only inferred from headers."""
        if ms > self.pause_ms or replace:
            self.pause_ms = ms
            self.pause_reason = reason
            self.pause_explicit = explicit


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
    #: When the endpoint last answered (any HTTP answer: it is reachable), and when
    #: its current run of failures began (None: its last call did not fail).
    last_answer: float | None = None
    failing_since: float | None = None

    def tick(self, dt: float) -> None:
        """Fold the calls dispatched in the last ``dt`` seconds into the rate."""
        self.rate += 0.3 * (self.dispatched / dt - self.rate)
        self.dispatched = 0


class EndpointState:
    """One endpoint in one worker (see the module docstring)."""

    __slots__ = ("accepted_at", "adaptive", "answered", "breaker", "ep", "factor",
                 "first_sent", "health", "heard", "in_flight", "ledger", "limit_rate",
                 "limited", "name", "pace", "pause_inferred", "pause_reason", "paused_until",
                 "period_answers", "period_refusals", "probe_out", "quota_probe", "recent",
                 "refused", "refused_recent", "refusing", "req_limited", "run", "run_from",
                 "run_probes", "run_started", "short_reset", "short_until", "timer",
                 "tok_limited", "waiters", "waiting_tokens")

    def __init__(self, ep: Endpoint, fs: FlowSettings, now: float) -> None:
        self.ep = ep
        self.name = ep.name
        self.limited = ep.limited
        self.req_limited = ep.rpm is not None
        self.tok_limited = ep.tpm is not None
        #: Send times while no limit is known (charged to the bucket once one is).
        self.recent: deque[float] = deque(maxlen=RECENT_KEPT)
        #: Send times of those the provider refused for the rate (not in its window:
        #: not charged).
        self.refused_recent: deque[float] = deque(maxlen=RECENT_KEPT)
        #: When the provider answered (and refused for the rate) in the last
        #: enforcement period: whether its 429s are sporadic (:meth:`sporadic`).
        self.period_answers: deque[float] = deque()
        self.period_refusals: deque[float] = deque()
        #: When the calls the provider answered were sent, while no request limit is
        #: known and no pace is kept: what it accepted before its first 429.
        self.answered: deque[float] = deque(maxlen=RECENT_KEPT)
        #: When the first call it refused for the rate was sent (no limit known, no
        #: pace yet): a pace is inferred when the pause ends, once the calls accepted
        #: beside it (slower to answer than a 429) have answered.
        self.refused: float | None = None
        #: Whether it has refused a call of this worker for the rate (429) yet: the
        #: calls sent before, while no limit was known, were sent blind
        #: (:attr:`~lockgate.flow.admission.Ticket.blind`).
        self.refusing = False
        #: The pace kept after 429s on an endpoint that names no limit (None: none).
        self.pace: Pace | None = None
        #: When this worker sent its first call to it while no limit was known.
        self.first_sent: float | None = None
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
        #: A quota pause began: when it ends, one call probes the endpoint, the others
        #: wait for its answer (``probe_out``: that call is out).
        self.quota_probe = False
        self.probe_out = False
        #: Whether the pause in force was only inferred (from headers, or the default
        #: of a 429 that named none): a Retry-After replaces it, longer or shorter.
        self.pause_inferred = False
        #: When the last pause of ``reset / limit`` (the time one call frees, for a
        #: limit with nothing remaining) ends, and when the reset it was inferred from
        #: falls: a 429 naming no Retry-After for a call sent in between says the limit
        #: is a fixed window: its pause is then the reset that 429 names.
        self.short_until = 0.0
        self.short_reset = 0.0
        #: A run of 429s naming nothing while the provider accepts nothing: its pauses
        #: so far (0: no run), when it began, when its last pause ends (a call sent from
        #: then on probes; its 429 doubles the pause), and its probes in flight.
        self.run = 0
        self.accepted_at: float | None = None  # when it last accepted a call
        self.run_started = 0.0
        self.run_from = 0.0
        self.run_probes = 0
        self.factor = 1.0  # share of the limits in force, from the shared row
        #: Calls per second its known request limit allows (configured, or from the
        #: shared row at each lease, times the factor); None: no request limit known.
        self.limit_rate: float | None = ep.rpm / ep.limit_window_s if ep.rpm else None
        #: Whether the provider answered a call of this worker yet (its headers read):
        #: until then an endpoint with no known limit gets a few calls only
        #: (:class:`~lockgate.flow.admission.Admission`).
        self.heard = False
        self.ledger = Ledger()
        self.health = Health()

    def paused(self, now: float) -> bool:
        return now < self.paused_until

    def probing(self) -> bool:
        """Whether calls wait for the probes of a run of refusals (:data:`RUN_PROBES`
        out, none answered yet)."""
        return self.run > 0 and self.run_probes >= RUN_PROBES

    def run_probe(self) -> bool:
        """A call passed: whether it is a probe of a run of refusals (counted until it
        ends)."""
        if self.run <= 0:
            return False
        self.run_probes += 1
        return True

    def probe_done(self) -> None:
        """A probe of a run of refusals was answered, or never sent."""
        self.run_probes = max(0, self.run_probes - 1)

    def run_pause_ms(self, base_ms: float, sent: float, now: float) -> int:
        """The pause of a 429 naming nothing (of a call sent at ``sent``) from a provider
        that accepts nothing: ``base_ms`` for the first of a run, doubled for each 429
        of a call sent after the run's last pause ended, up to ``limit_window_s`` (at
        most :data:`RUN_MAX_PAUSE_S`)."""
        if self.run == 0:
            self.run, self.run_started = 1, now
        elif sent >= self.run_from - 1e-3:
            self.run += 1
        top = max(base_ms, 1000.0 * min(self.ep.limit_window_s, RUN_MAX_PAUSE_S))
        return int(min(top, base_ms * 2.0 ** min(self.run - 1, 30)))

    def run_ended(self, sent: float, now: float) -> None:
        """The provider accepted a call sent at ``sent``: a run of refusals it was sent
        in (or after) is over."""
        self.accepted_at = now
        if self.run and sent >= self.run_started - 1e-3:
            self.run = 0

    def at_limit(self, now: float) -> bool:
        """Whether a 429 naming nothing says the provider is at a limit: it accepted a
        call within two of its windows (``limit_window_s``). One that accepted nothing
        for longer (or ever) refuses everything: no run, its 429s spend attempts."""
        if self.accepted_at is None or now - self.accepted_at >= 2 * self.ep.limit_window_s:
            self.run = 0
            return False
        return True

    def note_answer(self, now: float, *, refused: bool) -> None:
        """The provider answered a call (with a 429 for the rate when ``refused``)."""
        self.period_answers.append(now)
        if refused:
            self.period_refusals.append(now)
        self._forget(now)

    @property
    def blind(self) -> bool:
        """Whether a call sent now goes blind: no limit known, and no call of this
        worker refused for the rate yet (:attr:`~lockgate.flow.admission.Ticket.blind`)."""
        return not self.limited and not self.refusing

    def sporadic(self, now: float) -> bool:
        """Whether the 429s for the rate of the last enforcement period are under
        :data:`SPORADIC_SHARE` of its answers (a first 429 alone is not: it is all of
        them)."""
        self._forget(now)
        return len(self.period_refusals) < SPORADIC_SHARE * len(self.period_answers)

    def accepted(self, now: float) -> bool:
        """Whether the provider took calls in the last enforcement period."""
        self._forget(now)
        return len(self.period_answers) > len(self.period_refusals)

    def _forget(self, now: float) -> None:
        since = now - self.ep.limit_enforced_s
        for d in (self.period_answers, self.period_refusals):
            while d and d[0] <= since:
                d.popleft()

    def infer_pace(self, now: float) -> int | None:
        """After the pause of a first 429 for the rate: pace the calls at what the
        provider accepted in the enforcement period up to that call's sending. Returns
        the calls counted when a pace was started (None: not enough to go on)."""
        refused, self.refused = self.refused, None
        if refused is None or self.pace is not None or self.req_limited:
            return None
        period = self.ep.limit_enforced_s
        answered = sum(1 for t in self.answered if refused - period < t <= refused + 1e-3)
        self.answered.clear()
        if answered < PACE_MIN_ANSWERED:
            return None
        # The worker's first calls went inside the period: it shows what the provider
        # took of a start, not its limit (a provider allowing 8 calls in flight took
        # 16 in the first second; paced at 14 a second and rising 2 % a period, it ran
        # at a tenth of what it takes for minutes).
        cold = self.first_sent is None or self.first_sent > refused - period
        self.pace = Pace.inferred(answered, period, now, cold=cold)
        return answered

    def learned(self, rpm: float | None, tpm: float | None, now: float) -> None:
        """The shared row names limits (configured, or learned from the provider's
        headers): an endpoint without a configured limit becomes limited, and the calls
        it sent in the last enforcement period are charged to the bucket."""
        if rpm is not None and not self.req_limited:
            self.req_limited = True
            self.pace = None  # the shared bucket paces from now on
            self.refused = None
            self.answered.clear()
            since = now - self.ep.limit_enforced_s
            sent = sum(1 for t in self.recent if t > since)
            refused = sum(1 for t in self.refused_recent if t > since)
            # Calls still in flight are charged when they are answered (not if refused:
            # charged now, the 429s of a start-up burst were a debt of seconds).
            self.ledger.debt_req += max(0, sent - refused - self.in_flight)
        if tpm is not None and not self.tok_limited:
            self.tok_limited = True
        if (self.req_limited or self.tok_limited) and not self.limited:
            self.limited = True
            self.recent.clear()
            self.refused_recent.clear()

    def has_budget(self, tokens: float, now: float | None = None) -> bool:
        """Whether the budget held covers one more call of ``tokens`` (at ``now``: the
        budget usable then; without, all that is held, scheduled or not)."""
        if self.pace is not None and now is not None and not self.pace.ready(now):
            return False
        if not self.limited:
            return True
        led = self.ledger
        req = led.req
        tok = led.tok
        if now is not None:
            if led.sched_req:
                req -= _pending(led.sched_req, now)
            if led.sched_tok:
                tok -= _pending(led.sched_tok, now)
        if self.req_limited and req < 1.0 - 1e-9:
            return False
        return not (self.tok_limited and tok <= 0.0 and tokens > 0)

    def usable_in(self, now: float) -> float:
        """Seconds until scheduled budget frees one more call (0: none scheduled)."""
        led = self.ledger
        pace = self.pace.wait(now) if self.pace is not None else 0.0
        return max(_next_ms(led.sched_req, now) / 1000.0,
                   _next_ms(led.sched_tok, now) / 1000.0, pace)

    def spend(self, tokens: float, now: float = 0.0) -> None:
        """One call goes: it spends budget and takes a slot."""
        if self.limited:
            self.ledger.req -= 1.0
            self.ledger.tok -= tokens
        else:
            self.recent.append(now)
            if self.first_sent is None:
                self.first_sent = now
        if self.pace is not None:
            self.pace.take(now)
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
            "failing_s": None if h.failing_since is None else
            round(now - h.failing_since, 1),
            "last_error": h.last_error if h.failing_since is not None else None,
            "retry_in_s": round(max(0.0, self.breaker.open_until - now), 1)
            if self.breaker.state is BreakerState.OPEN else None,
            "rate_factor": round(self.factor, 3),
            "pace_per_s": round(self.pace.rate, 2) if self.pace is not None else None,
        }



def _pending(sched: list[list[float]], now: float) -> float:
    """What the scheduled grants do not allow spending yet at ``now`` (monotonic);
    grants usable in full are dropped."""
    out = 0.0
    done = 0
    for t0, granted, start, rate in sched:
        left = granted - usable(granted, start, rate, (now - t0) * 1000.0)
        if left > 1e-9:
            out += left
        else:
            done += 1
    if done:
        sched[:] = [e for e in sched
                    if e[1] - usable(e[1], e[2], e[3], (now - e[0]) * 1000.0) > 1e-9]
    return out


def _next_ms(sched: list[list[float]], now: float) -> float:
    """Ms until the first scheduled grant frees one more unit."""
    if not sched:
        return 0.0
    t0, _granted, start, rate = sched[0]
    at = start + rate * (now - t0) * 1000.0
    return max(0.0, (math.floor(max(at, 0.0)) + 1.0 - at) / rate)
