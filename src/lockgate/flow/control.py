"""The flow controller of one worker: the policies of :mod:`lockgate.flow` put to work.

Per call the worker asks :meth:`FlowControl.acquire` for passage and hands the result
to :meth:`FlowControl.release`; both are in-memory (a few microseconds): route to the
endpoint (or its fallback), check pause, breaker and concurrency slot, spend budget
already leased. Everything that touches the database runs in one background loop,
:meth:`FlowControl.run`, a few times per second: lease budget for the calls waiting
(and return or settle the rest), publish and learn pauses, discover the batches to
claim from and pace windows, adjust concurrency limits, report to the worker row.

Calls that cannot go yet wait in a FIFO queue per endpoint; the worker claims only
about ``backlog_s`` worth of tasks beyond what is in flight (:meth:`claim_room`), so
tasks do not pile up behind a limit while other workers could run them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from lockgate.config import Endpoint, FlowSettings, Settings
from lockgate.errors import ErrorClass
from lockgate.flow.breaker import Breaker, BreakerState
from lockgate.flow.bucket import Ask
from lockgate.flow.concurrency import Adaptive, make_policy
from lockgate.flow.estimate import TokenModel, charged_tokens
from lockgate.flow.headers import read_signals
from lockgate.flow.priority import Demand, FairShare, urgency, weight
from lockgate.providers.base import Completion, CompletionRequest, Provider, ProviderError
from lockgate.spec import TaskConfig
from lockgate.store import ClaimedTask, Store
from lockgate.store.flow import BucketSpec, FlowStore, Lane, LeaseRequest, window_bucket

log = logging.getLogger("lockgate.flow")

DbCall = Callable[..., Awaitable[Any]]
#: Calls the provider once for an endpoint: ``(endpoint, provider) -> AttemptResult``.
CallFn = Callable[[Endpoint, Provider], Awaitable[Any]]

_ENDPOINT_FAILURES = frozenset({ErrorClass.SERVER_ERROR, ErrorClass.TIMEOUT,
                                ErrorClass.CONNECTION_ERROR})
_THROTTLED = frozenset({ErrorClass.RATE_LIMITED, ErrorClass.QUOTA_EXHAUSTED})
_NEVER_SENT = frozenset({ErrorClass.RENDER_ERROR})
_PACER_BURST = 0.25  # a window's pacing bucket holds 250 ms of its pace
#: Calls of a task type a worker sends before its first answer has taught the token
#: estimate (per endpoint). The untaught estimate is deliberately dear; reserving it
#: for every call in flight and refunding it later would hand a burst back to the
#: shared bucket (the provider's window still holds what those calls really cost).
COLD_CALLS = 4


class _Reroute(Exception):
    """Raised by :class:`_Recorder` instead of sending: a long pause began after the
    call got passage and a fallback can take it (never leaves :meth:`FlowControl.call`)."""


class _Recorder:
    """Wraps a provider for one call: keeps the error's rate-limit headers (which the
    attempt result does not carry), and never sends during a pause that began between
    the passage and the send (another call's 429 arrived while this one was being
    rendered): it waits the pause out, or, when the pause is long and a fallback is
    usable, hands the call back to be routed again."""

    __slots__ = ("error", "fallback_ready", "hold_max", "inner", "name", "rerouted", "state")

    def __init__(self, inner: Provider, state: _Endpoint, hold_max: float,
                 fallback_ready: Callable[[_Endpoint, float], bool]) -> None:
        self.inner = inner
        self.name = inner.name
        self.state = state
        self.hold_max = hold_max
        self.fallback_ready = fallback_ready
        self.error: ProviderError | None = None
        self.rerouted = False

    async def complete(self, request: CompletionRequest) -> Completion:
        st = self.state
        while True:
            now = time.monotonic()
            left = st.paused_until - now
            if left <= 0:
                break
            if ((left > self.hold_max or st.pause_reason == "quota")
                    and self.fallback_ready(st, now)):
                self.rerouted = True
                raise _Reroute
            await asyncio.sleep(min(left, 0.5))  # re-check: a fallback may come back
        try:
            return await self.inner.complete(request)
        except ProviderError as exc:
            self.error = exc
            raise

    async def close(self) -> None:  # pragma: no cover - never closed through the wrapper
        await self.inner.close()


@dataclass(slots=True)
class _Waiter:
    fut: asyncio.Future[bool]
    tokens: float


@dataclass(slots=True)
class Ticket:
    """Passage for one call: where it goes and what it reserved."""

    state: _Endpoint
    tokens: float
    probe: bool
    routed_from: str | None
    batch_id: str
    model: TokenModel | None
    input_chars: int
    cold: _Cold | None = None


@dataclass(slots=True)
class _Cold:
    """The calls of one task type on one endpoint before any answer taught its token
    estimate: at most :data:`COLD_CALLS` in flight; the rest wait for ``wake``."""

    key: tuple[str, str]
    in_flight: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class _Endpoint:
    """One endpoint as this worker sees it."""

    def __init__(self, ep: Endpoint, fs: FlowSettings, now: float) -> None:
        self.ep = ep
        self.name = ep.name
        self.limited = ep.limited
        self.tok_limited = ep.tpm is not None
        self.req = 0.0
        self.tok = 0.0
        self.waiters: deque[_Waiter] = deque()
        self.waiting_tokens = 0.0
        self.in_flight = 0
        initial = ep.initial_concurrency or ep.max_concurrency
        self.adaptive = Adaptive(make_policy(ep.concurrency_policy, ep.min_concurrency,
                                             ep.max_concurrency),
                                 initial=initial, min_limit=ep.min_concurrency,
                                 max_limit=ep.max_concurrency,
                                 interval_s=fs.adjust_interval_s, min_samples=fs.min_samples,
                                 norm_overhead=fs.latency_overhead_tokens, now=now)
        self.breaker = Breaker(failure_rate=fs.breaker_failure_rate,
                               min_calls=fs.breaker_min_calls,
                               consecutive=fs.breaker_consecutive,
                               window_s=fs.breaker_window_s, open_s=fs.breaker_open_s,
                               max_open_s=fs.breaker_max_open_s, probes=fs.breaker_probes)
        self.paused_until = 0.0
        self.pause_reason: str | None = None
        # to publish with the next lease
        self.publish_pause_ms = 0
        self.publish_reason: str | None = None
        self.debt_tok = 0.0
        self.give_req = 0.0
        self.give_tok = 0.0
        self.cut = False
        self.factor = 1.0
        self.learned_rpm: float | None = None
        self.learned_tpm: float | None = None
        self._sent_rpm: float | None = None
        self._sent_tpm: float | None = None
        # what the shared row says
        self.rpm: float | None = ep.rpm
        self.tpm: float | None = ep.tpm
        # rates and health, for backlog sizing and reports
        self.dispatched = 0
        self.rate = 0.0
        self.latency_ewma: float | None = None
        self.failure_ewma = 0.0
        self.calls = 0
        self.failures = 0
        self.throttled = 0
        self.rerouted = 0
        self.answers = 0
        self.timer: asyncio.TimerHandle | None = None

    def paused(self, now: float) -> bool:
        return now < self.paused_until

    def has_budget(self, tokens: float) -> bool:
        if not self.limited:
            return True
        if self.ep.rpm is not None and self.req < 1.0 - 1e-9:
            return False
        return not (self.tok_limited and self.tok <= 0.0 and tokens > 0)

    def spend(self, tokens: float) -> None:
        if self.limited:
            self.req -= 1.0
            self.tok -= tokens
        self.in_flight += 1
        self.dispatched += 1

    def detail(self, now: float) -> dict[str, Any]:
        last = self.adaptive.last_stats
        return {
            "limit": self.adaptive.slots, "policy": self.adaptive.policy.name,
            "in_flight": self.in_flight, "waiting": len(self.waiters),
            "latency_ms": round(self.latency_ewma, 1) if self.latency_ewma else None,
            "failure_rate": round(self.failure_ewma, 4),
            "window_latency_ms": round(last.mean_latency_ms, 1) if last else None,
            "window_failure_rate": round(last.failure_rate, 4) if last else None,
            "breaker": str(self.breaker.state),
            "paused_ms": max(0, int((self.paused_until - now) * 1000)),
            "pause_reason": self.pause_reason if self.paused(now) else None,
            "calls": self.calls, "failures": self.failures, "throttled": self.throttled,
            "rerouted": self.rerouted, "rate_per_s": round(self.rate, 1),
            "rate_factor": round(self.factor, 3),
        }


@dataclass(slots=True)
class _LaneState:
    lane: Lane
    weight: float = 1.0
    pace_budget: float = 0.0
    pace_rate: float | None = None  # tasks/s from the shared row; inf = only endpoint limits
    wanted: bool = False


@dataclass(slots=True)
class FlowStats:
    """Counters for tests and reports."""

    leases: int = 0
    lane_claims: int = 0
    legacy_claims: int = 0
    pauses_published: int = 0
    extra: dict[str, int] = field(default_factory=dict)


class FlowControl:
    """Flow control for one worker (see the module docstring)."""

    def __init__(self, store: Store, settings: Settings, worker_id: str, *, db: DbCall,
                 provider: Callable[[Endpoint], Provider],
                 flow_store: FlowStore | None = None) -> None:
        self.store = store
        self.fs_store = flow_store or FlowStore(store)
        self.settings = settings
        self.cfg: FlowSettings = settings.flow
        self.pool = settings.worker.pool
        self.worker_id = worker_id
        self._db = db
        self._provider = provider
        self._states: dict[str, _Endpoint] = {}
        self._models: dict[tuple[str, str], TokenModel] = {}
        self._cold: dict[tuple[str, str], _Cold] = {}
        self._lanes: dict[tuple[str, str], _LaneState] = {}
        self._lane_tokens: dict[str, float] = {}
        self._failure_rates: dict[str, float] = {}
        self._fair = FairShare()
        self._wake = asyncio.Event()
        self._ready = asyncio.Event()  # set after the first lease: shared pauses are known
        self._last_lease = 0.0
        self._starved = False
        self._stopping = False
        self.waiting = 0
        self.stats = FlowStats()
        self._min_cap_ms = self.cfg.min_cap_ms
        self._period = self.cfg.lease_interval_s

    # -- per-call path (in memory) ------------------------------------------------------

    def _state(self, ep: Endpoint) -> _Endpoint:
        st = self._states.get(ep.name)
        if st is None:
            st = self._states[ep.name] = _Endpoint(ep, self.cfg, time.monotonic())
        return st

    def _usable(self, st: _Endpoint, now: float) -> bool:
        """Not out of quota, not paused for long, and the breaker lets calls through."""
        left = st.paused_until - now
        if left > 0 and (st.pause_reason == "quota" or left > self.cfg.fallback_after_s):
            return False
        return st.breaker.available(now)

    def _route(self, primary: Endpoint, now: float) -> tuple[_Endpoint, str | None]:
        """The endpoint to use now: the primary, else the first usable fallback; if none
        is usable, the primary (the call waits for it)."""
        st = self._state(primary)
        if self._usable(st, now):
            return st, None
        ep = primary
        for _ in range(8):
            if ep.fallback is None:
                break
            nxt = self.settings.endpoint_named(ep.fallback)
            if nxt is None:
                break
            fst = self._state(nxt)
            if self._usable(fst, now):
                return fst, primary.name
            ep = nxt
        return st, None

    def _model(self, st: _Endpoint, config: TaskConfig, config_hash: str) -> TokenModel:
        key = (st.name, config_hash)
        m = self._models.get(key)
        if m is None:
            tpl = config.prompt_template
            chars = len(tpl) if isinstance(tpl, str) else sum(len(x.content) for x in tpl)
            m = self._models[key] = TokenModel(chars, config.model.max_tokens,
                                               st.ep.tpm_counts_max_tokens)
        return m

    async def acquire(self, task: ClaimedTask, config: TaskConfig,
                      primary: Endpoint) -> Ticket:
        """Wait until a call for ``task`` may go; reserve its budget and slot."""
        input_chars = len(task.input_data)
        if not self._ready.is_set():  # a worker starting during a pause must honour it
            await self._ready.wait()
        while True:
            now = time.monotonic()
            st, routed_from = self._route(primary, now)
            model = self._model(st, config, task.config_hash) if st.tok_limited else None
            cold: _Cold | None = None
            if model is not None and model.samples == 0:
                key = (st.name, task.config_hash)
                cold = self._cold.get(key)
                if cold is None:
                    cold = self._cold[key] = _Cold(key)
                if cold.in_flight >= COLD_CALLS:
                    self.waiting += 1
                    try:
                        await cold.wake.wait()
                    finally:
                        self.waiting -= 1
                    continue
            tokens = model.estimate(input_chars) if model is not None else 0.0
            if not st.waiters and self._can_go(st, tokens, now):
                probe = self._pass(st, tokens, now)
                return Ticket(st, tokens, probe, routed_from, task.batch_id, model,
                              input_chars, self._cold_pass(cold))
            loop = asyncio.get_running_loop()
            w = _Waiter(loop.create_future(), tokens)
            st.waiters.append(w)
            st.waiting_tokens += tokens
            self.waiting += 1
            self._need(st, now)
            if cold is not None:
                cold.in_flight += 1  # held while it waits for budget, so others wait too
            try:
                go = await w.fut
            except asyncio.CancelledError:
                if w.fut.done() and not w.fut.cancelled() and w.fut.result():
                    self._undo(st, tokens)
                self._cold_done(cold, None)
                raise
            if go:
                probe = st.breaker.state is BreakerState.HALF_OPEN
                return Ticket(st, tokens, probe, routed_from, task.batch_id, model,
                              input_chars, cold)
            self._cold_done(cold, None)
            # rerouted: the endpoint became unusable while we waited; route again

    @staticmethod
    def _cold_pass(cold: _Cold | None) -> _Cold | None:
        if cold is not None:
            cold.in_flight += 1
        return cold

    def _cold_done(self, cold: _Cold | None, model: TokenModel | None) -> None:
        """A call of a cold task type ended: once an answer taught the estimate, every
        waiting call goes on (with a taught estimate); else the next one may try."""
        if cold is None:
            return
        cold.in_flight -= 1
        if model is not None and model.samples > 0:
            self._cold.pop(cold.key, None)
        cold.wake.set()
        cold.wake = asyncio.Event()

    def _can_go(self, st: _Endpoint, tokens: float, now: float) -> bool:
        return (not st.paused(now) and st.in_flight < st.adaptive.slots
                and st.has_budget(tokens) and st.breaker.available(now))

    def _pass(self, st: _Endpoint, tokens: float, now: float) -> bool:
        probe = st.breaker.state is not BreakerState.CLOSED
        st.breaker.allow(now)
        st.spend(tokens)
        st.adaptive.note_in_flight(st.in_flight)
        return probe

    def _undo(self, st: _Endpoint, tokens: float) -> None:
        st.in_flight -= 1
        if st.limited:
            st.give_req += 1.0
            st.give_tok += tokens
        self._dispatch(st)

    def _need(self, st: _Endpoint, now: float) -> None:
        """A call waits: dispatch what can go, and lease early if the bucket had room."""
        self._dispatch(st)
        if st.waiters and st.limited and not st.has_budget(st.waiters[0].tokens) \
                and not st.paused(now) and not self._starved:
            self._wake.set()

    def _fallback_usable(self, st: _Endpoint, now: float) -> bool:
        ep = st.ep
        for _ in range(8):
            if ep.fallback is None:
                return False
            nxt = self.settings.endpoint_named(ep.fallback)
            if nxt is None:
                return False
            if self._usable(self._state(nxt), now):
                return True
            ep = nxt
        return False

    def _dispatch(self, st: _Endpoint) -> None:
        """Let waiting calls go while slot, budget, pause and breaker allow."""
        if not st.waiters:
            return
        now = time.monotonic()
        if not self._usable(st, now) and self._fallback_usable(st, now):
            self._reroute(st)
            return
        if st.paused(now):
            self._timer(st, st.paused_until - now)
            return
        q = st.waiters
        while q:
            w = q[0]
            if w.fut.done():  # its task was cancelled
                q.popleft()
                st.waiting_tokens -= w.tokens
                self.waiting -= 1
                continue
            if st.in_flight >= st.adaptive.slots or not st.has_budget(w.tokens):
                break
            if not st.breaker.available(now):
                self._timer(st, max(0.05, st.breaker.open_until - now))
                break
            q.popleft()
            st.waiting_tokens -= w.tokens
            self.waiting -= 1
            st.breaker.allow(now)
            st.spend(w.tokens)
            st.adaptive.note_in_flight(st.in_flight)
            w.fut.set_result(True)

    def _reroute(self, st: _Endpoint) -> None:
        """The endpoint is unusable: send its waiting calls back to routing."""
        while st.waiters:
            w = st.waiters.popleft()
            st.waiting_tokens -= w.tokens
            self.waiting -= 1
            if not w.fut.done():
                w.fut.set_result(False)

    def _timer(self, st: _Endpoint, delay: float) -> None:
        if st.timer is not None and not st.timer.cancelled():
            return
        loop = asyncio.get_running_loop()

        def fire() -> None:
            st.timer = None
            self._dispatch(st)
            if st.waiters and st.limited:
                self._wake.set()

        st.timer = loop.call_later(max(0.0, delay), fire)

    def release(self, ticket: Ticket, res: Any, error: ProviderError | None) -> None:
        """Account for a finished call: settle tokens, learn limits and pauses, feed the
        concurrency policy and the breaker, and let the next call go."""
        st = ticket.state
        st.in_flight -= 1
        now = time.monotonic()
        ec: ErrorClass | None = res.error_class
        throttled = ec in _THROTTLED
        failed = ec in _ENDPOINT_FAILURES
        dropped = throttled or ec is ErrorClass.TIMEOUT
        completion: Completion | None = res.completion
        st.calls += 1
        if failed or throttled:
            st.failures += 1
        if throttled:
            st.throttled += 1
        if ticket.routed_from:
            st.rerouted += 1
        out_tokens = completion.completion_tokens if completion is not None else None
        st.adaptive.record(0.0 if throttled else res.latency_ms, ok=not failed,
                           dropped=dropped, output_tokens=out_tokens,
                           in_flight=st.in_flight + 1)
        if not throttled:
            lat = res.latency_ms
            st.latency_ewma = lat if st.latency_ewma is None else \
                st.latency_ewma + 0.05 * (lat - st.latency_ewma)
        st.failure_ewma += 0.02 * ((1.0 if (failed or throttled) else 0.0) - st.failure_ewma)
        if not throttled and ec not in _NEVER_SENT:
            st.breaker.record(now, failed=failed, probe=ticket.probe)
        else:
            st.breaker.unjudged(ticket.probe)
        self._settle(ticket, res, completion, throttled or ec in _NEVER_SENT)
        self._cold_done(ticket.cold, ticket.model)
        self._learn(st, ec, completion, error, res.retry_after_ms, now)
        self._dispatch(st)

    def _settle(self, t: Ticket, res: Any, completion: Completion | None,
                refund: bool) -> None:
        st = t.state
        if refund:  # the provider did not count it: give the reservation back
            if st.limited:
                st.give_req += 1.0
                st.give_tok += t.tokens
            return
        if completion is None:
            return  # usage unknown: the reservation stands
        m = t.model
        if m is not None:
            m.learn(t.input_chars, completion.prompt_tokens, completion.completion_tokens)
        charged = charged_tokens(completion.prompt_tokens, completion.completion_tokens,
                                 m.max_tokens if m else None,
                                 st.ep.tpm_counts_max_tokens)
        if charged is None:
            return
        if st.tok_limited:
            st.debt_tok += charged - t.tokens
        old = self._lane_tokens.get(t.batch_id)
        self._lane_tokens[t.batch_id] = float(charged) if old is None else \
            old + 0.05 * (charged - old)

    def _learn(self, st: _Endpoint, ec: ErrorClass | None, completion: Completion | None,
               error: ProviderError | None, retry_after_ms: int | None, now: float) -> None:
        headers = completion.rate_limit if completion is not None else \
            (error.rate_limit if error is not None else None)
        if ec is None:
            # A success: read the headers fully only when something is exhausted, and
            # every 32nd answer to learn the limits (parsing costs more than the rest
            # of the accounting together).
            st.answers += 1
            if not headers or (headers.get("x-ratelimit-remaining-requests") != "0"
                               and headers.get("x-ratelimit-remaining-tokens") != "0"
                               and st.answers % 32):
                return
        sig = read_signals(headers, retry_after_ms)
        if sig.limit_requests is not None and sig.limit_requests != st._sent_rpm:
            st.learned_rpm = float(sig.limit_requests)
        if sig.limit_tokens is not None and sig.limit_tokens != st._sent_tpm:
            st.learned_tpm = float(sig.limit_tokens)
        if ec is ErrorClass.QUOTA_EXHAUSTED:
            self._pause(st, int(self.cfg.quota_pause_s * 1000), "quota", now)
        elif ec is ErrorClass.RATE_LIMITED:
            st.cut = st.limited  # over the limit: every worker's rate goes down a step
            self._pause(st, sig.pause_ms() or int(self.cfg.default_pause_s * 1000),
                        "rate_limited", now)
        else:
            ms = sig.pause_ms()
            if ms:
                self._pause(st, ms, "exhausted", now)

    def _pause(self, st: _Endpoint, ms: int, reason: str, now: float) -> None:
        until = now + ms / 1000.0
        if until > st.paused_until:
            if st.paused_until <= now:
                log.info("worker %s: endpoint %s paused for %d ms (%s)", self.worker_id,
                         st.name, ms, reason)
            st.paused_until = until
            st.pause_reason = reason
        if ms > st.publish_pause_ms:
            st.publish_pause_ms = ms
            st.publish_reason = reason
        self._wake.set()  # publish at once: other workers learn it on their next lease

    def reroutes(self, primary: Endpoint, res: Any) -> bool:
        """Whether a refused call (quota, rate limit) will find a fallback now, so its
        task should be retried at once and without spending an attempt."""
        if res.error_class not in _THROTTLED or primary.fallback is None:
            return False
        _st, routed_from = self._route(primary, time.monotonic())
        return routed_from is not None

    async def call(self, task: ClaimedTask, config: TaskConfig, primary: Endpoint,
                   fn: CallFn) -> tuple[Any, str | None]:
        """Acquire, call ``fn`` on the chosen endpoint, release; returns the attempt
        result and the primary's name when a fallback answered."""
        while True:
            ticket = await self.acquire(task, config, primary)
            st = ticket.state
            rec = _Recorder(self._provider(st.ep), st, self.cfg.fallback_after_s,
                            self._fallback_usable)
            res: Any = None
            try:
                res = await fn(st.ep, rec)
            except _Reroute:
                pass
            finally:
                if rec.rerouted:  # never sent: the budget goes back, the call is routed anew
                    self._cold_done(ticket.cold, None)
                    st.breaker.unjudged(ticket.probe)
                    self._undo(st, ticket.tokens)
                elif res is None:  # cancelled or crashed mid-call: budget counts as spent
                    st.in_flight -= 1
                    self._cold_done(ticket.cold, None)
                    self._dispatch(st)
                else:
                    self.release(ticket, res, rec.error)
            if not rec.rerouted:
                return res, ticket.routed_from

    # -- claims ----------------------------------------------------------------------

    def _backlog_target(self) -> float:
        rate = sum(st.rate for st in self._states.values())
        return max(float(self.cfg.min_backlog), rate * self.cfg.backlog_s)

    def claim_room(self, free: int) -> int:
        """How many tasks to claim now, given ``free`` places in the worker: only about
        ``backlog_s`` of calls may wait for budget or a slot."""
        if self.waiting <= 0:
            return free
        return max(0, min(free, int(self._backlog_target()) - self.waiting))

    def claim_threshold(self, usual: int) -> int:
        """Smallest claim worth a round trip."""
        if self.waiting <= 0:
            return usual
        return max(1, min(usual, int(self._backlog_target()) // 4))

    def _fair_needed(self) -> bool:
        if self.pool is not None:
            return True
        if not self.cfg.fair_share:
            return False
        lanes = list(self._lanes.values())
        return len(lanes) > 1 or any(ls.lane.window is not None for ls in lanes)

    async def claim(self, room: int, *, lease_ms: int, worker_id: str) -> list[ClaimedTask]:
        """Claim up to ``room`` tasks: shared fairly among batches (by weight, in tokens)
        and within window paces; a plain claim when there is one batch to serve."""
        if room <= 0:
            return []
        if not self._fair_needed():
            self.stats.legacy_claims += 1
            rows: list[ClaimedTask] = await self._db(self.store.claim, room,
                                                     lease_ms=lease_ms, worker_id=worker_id)
            return rows
        demands = []
        for key, ls in self._lanes.items():
            cap = None
            if ls.lane.window is not None:
                ls.wanted = True
                if ls.pace_rate is None:
                    cap = 0  # pace not known yet (next lease)
                elif not math.isinf(ls.pace_rate):
                    cap = int(ls.pace_budget + 1e-9)
            demands.append(Demand(key, ls.weight, self._lane_tokens.get(key[1], 500.0), cap))
        plan = self._fair.plan(room, demands)
        if not plan:
            return []
        token = secrets.token_hex(16)
        got = await self._db(self.fs_store.claim_lanes, plan, lease_ms=lease_ms, token=token,
                             worker_id=worker_id)
        self.stats.lane_claims += 1
        counts: dict[Hashable, int] = {k: len(v) for k, v in got.items()}
        self._fair.settle(demands, dict(plan), counts)
        out: list[ClaimedTask] = []
        for key, claimed in got.items():
            ls2 = self._lanes.get(key)
            if ls2 is not None and ls2.lane.window is not None:
                ls2.pace_budget -= len(claimed)
            out.extend(claimed)
        return out

    # -- the background loop -------------------------------------------------------------

    def _bucket_specs(self) -> list[BucketSpec]:
        return [BucketSpec(ep.name, "endpoint", ep.rpm, ep.tpm,
                           int(ep.limit_window_s * 1000)) for ep in self.settings.endpoints()]

    async def run(self, stopping: asyncio.Event) -> None:
        """Lease, learn, discover, adjust and report until the worker stops."""
        for ep in self.settings.endpoints():
            self._state(ep)
        await self._db(self.fs_store.ensure, self._bucket_specs())
        next_lanes = next_fail = next_report = 0.0
        last_tick = time.monotonic()
        try:
            await self._lease(last_tick, self.cfg.lease_interval_s)
            self._ready.set()
            while True:
                if stopping.is_set() and not self._stopping:
                    self._stopping = True
                    self._cancel_waiters()
                if self._stopping and not any(st.in_flight for st in self._states.values()):
                    break  # ``finally`` gives the unused budget back
                if self._stopping:
                    # Nothing new to lease for (the waiters were cancelled): look every
                    # 20 ms for the last call to come back, and lease only to publish
                    # what a call still in flight taught (a pause).
                    timeout = 0.02
                else:
                    busy = any(st.limited and (st.waiters or st.rate > 1.0)
                               for st in self._states.values()) or any(
                        ls.wanted and ls.lane.window is not None
                        for ls in self._lanes.values())
                    timeout = self.cfg.lease_interval_s if busy else \
                        max(self.cfg.lease_interval_s, 0.5)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                if self._stopping and not self._wake.is_set():
                    continue
                self._wake.clear()
                now = time.monotonic()
                if now - self._last_lease < self.cfg.lease_interval_s / 4:
                    await asyncio.sleep(self.cfg.lease_interval_s / 4)
                    now = time.monotonic()
                dt = max(1e-3, now - last_tick)
                last_tick = now
                for st in self._states.values():
                    st.rate += 0.3 * (st.dispatched / dt - st.rate)
                    st.dispatched = 0
                await self._lease(now, dt)
                for st in self._states.values():
                    if st.adaptive.maybe_adjust(now):
                        self._dispatch(st)
                if now >= next_fail and self.cfg.fair_share:
                    next_fail = now + 15.0
                    await self._refresh_failures()
                if now >= next_lanes:
                    next_lanes = now + self.cfg.lanes_refresh_s
                    await self._refresh_lanes()
                if now >= next_report:
                    next_report = now + self.cfg.report_s
                    await self._report()
        finally:
            self._ready.set()
            with contextlib.suppress(Exception):
                await self._give_back()
            with contextlib.suppress(Exception):
                await self._report()

    def wake(self) -> None:
        """Run the background loop now (the worker calls this when it starts stopping,
        so that the loop notices without waiting out its period)."""
        self._wake.set()

    def _cancel_waiters(self) -> None:
        for st in self._states.values():
            while st.waiters:
                w = st.waiters.popleft()
                self.waiting -= 1
                if not w.fut.done():
                    w.fut.cancel()
            st.waiting_tokens = 0.0

    def _asks(self, dt: float) -> list[LeaseRequest]:
        reqs: list[LeaseRequest] = []
        # Prefetch for the real period between leases (a loaded machine ticks slower).
        self._period += 0.3 * (dt - self._period)
        interval = max(self.cfg.lease_interval_s, self._period)
        for st in self._states.values():
            want_req = 0
            want_tok = 0.0
            largest = 0.0
            per = 0.0
            if st.tok < 0:  # spent beyond the grant: the bucket must learn it
                st.debt_tok -= st.tok
                st.tok = 0.0
            if st.limited and not self._stopping and (st.waiters or st.rate > 0):
                # Calls waiting, or (below the limit) one period of this worker's rate so
                # that calls need not wait for a lease. Saturated, the waiting calls are
                # more than that: the grant is spent at once and nothing is held.
                need = max(float(len(st.waiters)), st.rate * interval)
                if st.ep.rpm is not None:
                    want_req = max(0, math.ceil(need - st.req - 1e-9))
                if st.tok_limited:
                    per = (st.waiting_tokens / len(st.waiters)) if st.waiters else 0.0
                    if per <= 0:
                        per = self._mean_estimate(st)
                    want_tok = max(0.0, max(st.waiting_tokens, need * per) - st.tok)
                    largest = max((w.tokens for w in st.waiters), default=per)
            learned_rpm = st.learned_rpm
            learned_tpm = st.learned_tpm
            ask = Ask(requests=want_req, tokens=want_tok, largest=largest,
                      give_requests=st.give_req, give_tokens=st.give_tok,
                      debt_tokens=st.debt_tok, pause_ms=st.publish_pause_ms, cut=st.cut,
                      per_call=per if want_req and want_tok else 0.0,
                      held_requests=max(0.0, st.req) if want_req and want_tok else 0.0,
                      held_tokens=max(0.0, st.tok) if want_req and want_tok else 0.0)
            if ask == Ask() and learned_rpm is None and learned_tpm is None:
                continue
            reqs.append(LeaseRequest(st.name, ask, self.cfg.headroom, self.cfg.burst,
                                     self._min_cap_ms, st.publish_reason, learned_rpm,
                                     learned_tpm))
        for key, ls in self._lanes.items():
            if ls.lane.window is None or not ls.wanted or self._stopping:
                continue
            rate = ls.pace_rate or 0.0
            want = 0
            if rate > 0 and not math.isinf(rate):
                want = max(0, math.ceil(max(1.0, rate * interval * 2) - ls.pace_budget))
            reqs.append(LeaseRequest(window_bucket(key[1]), Ask(requests=want), 0.0,
                                     _PACER_BURST, self._min_cap_ms, sliding=False))
        return reqs

    def _mean_estimate(self, st: _Endpoint) -> float:
        ms = [m.estimate(0) for (name, _h), m in self._models.items() if name == st.name]
        return sum(ms) / len(ms) if ms else 500.0

    async def _lease(self, now: float, dt: float) -> None:
        reqs = self._asks(dt)
        by_name = {r.name: r for r in reqs}
        # Unlimited endpoints still learn pauses other workers published.
        for st in self._states.values():
            if st.name not in by_name:
                by_name[st.name] = LeaseRequest(st.name, Ask(), self.cfg.headroom,
                                                self.cfg.burst, self._min_cap_ms)
        sent = list(by_name.values())
        for st in self._states.values():  # taken into the request: clear before awaiting
            st.give_req = st.give_tok = st.debt_tok = 0.0
            st.publish_pause_ms = 0
            st.publish_reason = None
            st.cut = False
            if st.learned_rpm is not None:
                st._sent_rpm, st.learned_rpm = st.learned_rpm, None
            if st.learned_tpm is not None:
                st._sent_tpm, st.learned_tpm = st.learned_tpm, None
        self._last_lease = time.monotonic()
        try:
            results = await self._db(self.fs_store.lease, sent)
        except Exception:
            log.exception("budget lease failed; will retry")
            for r in sent:  # keep what was to be published for the next try
                st2 = self._states.get(r.name)
                if st2 is not None:
                    st2.give_req += r.ask.give_requests
                    st2.give_tok += r.ask.give_tokens
                    st2.debt_tok += r.ask.debt_tokens
                    st2.publish_pause_ms = max(st2.publish_pause_ms, r.ask.pause_ms)
                    st2.cut = st2.cut or r.ask.cut
            return
        self.stats.leases += 1
        self._apply(results, by_name)

    def _apply(self, results: dict[str, Any], by_name: dict[str, LeaseRequest]) -> None:
        mono = time.monotonic()
        starved = False
        for name, res in results.items():
            st = self._states.get(name)
            if st is None:
                if name.startswith("window:"):
                    for ls in self._lanes.values():
                        if window_bucket(ls.lane.batch_id) == name:
                            ls.pace_budget += res.grant.requests
                            ls.pace_rate = math.inf if res.rpm is None else res.rpm
                continue
            st.req += res.grant.requests
            st.tok += res.grant.tokens
            st.rpm, st.tpm, st.factor = res.rpm, res.tpm, res.factor
            if res.grant.paused_ms:
                until = mono + res.grant.paused_ms / 1000.0
                if until > st.paused_until + 0.001:
                    if st.paused_until <= mono:  # a new pause, not one this worker knew
                        log.info("worker %s: endpoint %s paused for %d ms (%s), learned "
                                 "from the shared row", self.worker_id, name,
                                 res.grant.paused_ms, res.pause_reason)
                    st.paused_until = until
                    st.pause_reason = res.pause_reason
            ask = by_name[name].ask
            if (ask.requests and res.grant.requests < ask.requests) or \
                    (ask.tokens and res.grant.tokens < ask.tokens - 1e-6):
                starved = True
            self._dispatch(st)
        self._starved = starved

    async def _give_back(self) -> None:
        reqs = []
        for st in self._states.values():
            if st.limited and (st.req > 0 or st.tok > 0 or st.debt_tok or st.give_req):
                reqs.append(LeaseRequest(st.name, Ask(
                    give_requests=max(0.0, st.req) + st.give_req,
                    give_tokens=max(0.0, st.tok) + st.give_tok,
                    debt_tokens=st.debt_tok - min(0.0, st.tok)), self.cfg.headroom,
                    self.cfg.burst, self._min_cap_ms))
                st.req = st.tok = st.debt_tok = st.give_req = st.give_tok = 0.0
        if reqs:
            await self._db(self.fs_store.lease, reqs)

    async def _refresh_failures(self) -> None:
        try:
            self._failure_rates = await self._db(
                self.fs_store.failure_rates, since_ms=int(self.cfg.failure_window_s * 1000))
        except Exception:
            log.exception("failure-rate query failed; keeping the last figures")

    async def _refresh_lanes(self) -> None:
        try:
            lanes, now_ms = await self._db(self.fs_store.lanes, self.pool)
        except Exception:
            log.exception("lane discovery failed; keeping the last list")
            return
        fresh: dict[tuple[str, str], _LaneState] = {}
        for lane in lanes:
            key = (lane.pool, lane.batch_id)
            ls = self._lanes.get(key) or _LaneState(lane)
            ls.lane = lane
            u = urgency(lane.deadline_at, now_ms,
                        horizon_ms=int(self.cfg.urgency_horizon_s * 1000),
                        max_urgency=self.cfg.max_urgency)
            ls.weight = weight(lane.base_weight, u, self._failure_rates.get(lane.batch_id, 0.0))
            fresh[key] = ls
            if lane.window is not None and lane.window.start_ms <= now_ms + 5000:
                try:
                    await self._db(self.fs_store.pace, lane,
                                   every_ms=int(self.cfg.pace_every_s * 1000))
                except Exception:
                    log.exception("pacing window %s failed", lane.batch_id)
                ls.wanted = True
        self._lanes = fresh
        self._fair.forget(set(fresh))

    def detail(self) -> dict[str, Any]:
        """Per-endpoint state for the worker row and status."""
        now = time.monotonic()
        return {name: st.detail(now) for name, st in self._states.items()}

    async def _report(self) -> None:
        states = [st for st in self._states.values() if st.calls or st.in_flight]
        limit = sum(st.adaptive.slots for st in states) if states else \
            sum(st.adaptive.slots for st in self._states.values())
        n = sum(st.calls for st in states)
        lat = [(st.latency_ewma, st.calls) for st in states if st.latency_ewma is not None]
        latency = sum(x * c for x, c in lat) / max(1, sum(c for _, c in lat)) if lat else None
        failure = sum(st.failure_ewma * st.calls for st in states) / n if n else None
        try:
            await self._db(self.fs_store.report, self.worker_id, pool=self.pool,
                           concurrency_limit=int(limit), latency_ms=latency,
                           failure_rate=failure, detail=self.detail())
        except Exception:
            log.exception("flow report failed; will retry")
