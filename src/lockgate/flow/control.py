"""The flow controller of one worker: the policies of :mod:`lockgate.flow` put to work.

Per call the worker hands :meth:`FlowControl.call` a function that calls the provider
once; around it, all in memory: passage (routing to the endpoint or its fallback,
pause, breaker, concurrency slot, budget already leased: :mod:`~lockgate.flow.admission`)
and the accounting of the outcome (:mod:`~lockgate.flow.feedback`). Everything that
touches the database runs in one background loop, :meth:`FlowControl.run`, a few
times per second: lease budget for the calls waiting and return or settle the rest
(:mod:`~lockgate.flow.leasing`), publish and learn pauses, discover the batches to claim
from and pace windows (:mod:`~lockgate.flow.lanes`), adjust concurrency limits, report
to the worker row.

Calls that cannot go yet wait in a FIFO queue per endpoint; the worker claims only
about ``backlog_s`` worth of tasks beyond what is in flight (:meth:`claim_room`), so
tasks do not pile up behind a limit while other workers could run them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from lockgate.config import Endpoint, FlowSettings, Settings
from lockgate.errors import ErrorClass, StoreError, Streak
from lockgate.flow.admission import Admission, Ticket
from lockgate.flow.breaker import BreakerState
from lockgate.flow.endpoint import EndpointState
from lockgate.flow.estimate import TokenModels
from lockgate.flow.feedback import THROTTLED, Feedback, down_error
from lockgate.flow.lanes import LaneRows, Lanes
from lockgate.flow.leasing import BucketRows, Budget, DbCall
from lockgate.flow.routing import Router
from lockgate.providers.base import (
    CallOutcome,
    Completion,
    CompletionRequest,
    Provider,
    ProviderError,
)
from lockgate.spec import RESERVED_ID_PREFIX, TaskConfig
from lockgate.store.flow import BucketSpec
from lockgate.store.types import ClaimedTask

log = logging.getLogger("lockgate.flow")

T = TypeVar("T")

#: Shortest wait of a task whose call met an endpoint that is down.
DOWN_RETRY_S = 1.0
#: How often a call waiting for the probe after a quota pause looks again.
QUOTA_PROBE_WAIT_S = 0.05


class FlowRows(BucketRows, LaneRows, Protocol):
    """What flow control needs of the database: :class:`lockgate.store.flow.FlowStore`
    (and the in-memory fake of the tests)."""

    def ensure(self, specs: Iterable[BucketSpec]) -> None: ...

    def report(self, worker_id: str, *, pool: str | None, concurrency_limit: int,
               latency_ms: float | None, failure_rate: float | None,
               detail: Mapping[str, Any]) -> None: ...


@dataclass(frozen=True, slots=True)
class Passage:
    """How flow control handled one call, for the task's next state: the primary's
    name when a fallback answered (``routed_from``), and, when the task should be
    retried without spending an attempt, why (``unspent``) and after how long."""

    routed_from: str | None = None
    unspent: str | None = None
    delay_ms: int = 0


class _Reroute(Exception):
    """Raised by :class:`_Recorder` instead of sending: a long pause began after the
    call got passage and a fallback can take it (never leaves :meth:`FlowControl.call`)."""


class _Recorder:
    """Wraps a provider for one call: keeps what the call came to (which the worker's
    result does not carry whole: the error's rate-limit headers), and never sends
    during a pause that began between the passage and the send (another call's 429
    arrived while this one was being rendered): it waits the pause out, or, when the
    pause is long and a fallback is usable, hands the call back to be routed again."""

    __slots__ = ("fallback_ready", "hold_max", "inner", "name", "outcome", "probing",
                 "rerouted", "sent", "state")

    def __init__(self, inner: Provider, state: EndpointState, hold_max: float,
                 fallback_ready: Callable[[Endpoint, float], bool]) -> None:
        self.inner = inner
        self.name = inner.name
        self.state = state
        self.hold_max = hold_max
        self.fallback_ready = fallback_ready
        self.outcome: CallOutcome | None = None
        self.sent = False
        self.rerouted = False
        self.probing = False

    async def complete(self, request: CompletionRequest) -> Completion:
        st = self.state
        while True:
            now = time.monotonic()
            left = st.paused_until - now
            if left <= 0:
                if not st.quota_probe or not self.fallback_ready(st.ep, now):
                    # (no fallback takes the others: each call is its task's attempt,
                    # and a quota out for good must end its tasks, not hold them)
                    break
                # A quota pause ended: one call probes the endpoint, the others wait
                # for its answer (all of them sent at once met the exhausted quota),
                # then go to the fallback if it is out still.
                if not st.probe_out:
                    st.probe_out = self.probing = True
                    break
                await asyncio.sleep(QUOTA_PROBE_WAIT_S)
                continue
            if ((left > self.hold_max or st.pause_reason == "quota")
                    and self.fallback_ready(st.ep, now)):
                self.rerouted = True
                raise _Reroute
            await asyncio.sleep(min(left, 0.5))  # re-check: a fallback may come back
        self.sent = True
        t0 = time.perf_counter()
        try:
            completion = await self.inner.complete(request)
        except ProviderError as exc:
            self.outcome = CallOutcome(None, exc, (time.perf_counter() - t0) * 1000)
            if self.probing and exc.error_class is not ErrorClass.QUOTA_EXHAUSTED:
                st.quota_probe = st.probe_out = False
            raise  # (out of quota still: the new pause ends the probe)
        except BaseException:
            if self.probing:
                st.probe_out = False  # it said nothing: the next call probes
            raise
        self.outcome = CallOutcome(completion, None, (time.perf_counter() - t0) * 1000)
        if self.probing:
            st.quota_probe = st.probe_out = False
        return completion

    async def close(self) -> None:  # pragma: no cover - never closed through the wrapper
        await self.inner.close()


def pinned(task: ClaimedTask) -> bool:
    """Whether ``task``'s calls must go to its own endpoint: a release-gate evaluation
    judges a candidate (and the live version it is compared with) on the answers of the
    model it names, so its calls wait for that endpoint instead of taking a fallback."""
    return task.batch_id.startswith(RESERVED_ID_PREFIX)


def _never(_ep: Endpoint, _now: float) -> bool:
    return False


class FlowControl:
    """Flow control for one worker (see the module docstring)."""

    def __init__(self, rows: FlowRows, settings: Settings, worker_id: str, *, db: DbCall,
                 provider: Callable[[Endpoint], Provider]) -> None:
        self.rows = rows
        self.settings = settings
        self.cfg: FlowSettings = settings.flow
        self.worker_id = worker_id
        self._reports = Streak()  # failed reports in a row
        self._db = db
        self._provider = provider
        self._wake = asyncio.Event()
        self._stopping = False
        self.router = Router(settings)
        #: Every endpoint's state in this worker, by name.
        self.states = self.router.states
        models = TokenModels()
        self.lanes = Lanes(self.cfg, settings.worker.pool, rows, db=db)
        self.budget = Budget(self.states, self.cfg, models, self.lanes, rows, db=db,
                             worker_id=worker_id, dispatch=self._dispatch)
        self.admission = Admission(self.router, models, wake=self._wake.set,
                                   starved=lambda: self.budget.starved)
        self.feedback = Feedback(self.cfg, self.admission, worker_id,
                                 learn_tokens=self.lanes.learn_tokens, wake=self._wake.set)

    def _fallback_ready(self, ep: Endpoint, now: float) -> bool:
        return self.router.fallback(ep, now) is not None

    def _dispatch(self, st: EndpointState) -> None:
        self.admission.dispatch(st)

    @property
    def waiting(self) -> int:
        """Calls waiting for passage."""
        return self.admission.waiting

    # -- per-call path (in memory) ------------------------------------------------------

    async def acquire(self, task: ClaimedTask, config: TaskConfig,
                      primary: Endpoint) -> Ticket:
        """Wait until a call for ``task`` may go; reserve its budget and slot."""
        return await self.admission.acquire(task, config, primary)

    def release(self, ticket: Ticket, outcome: CallOutcome | None) -> None:
        """Account for a finished call (None: it was never sent)."""
        if outcome is None:
            self.feedback.unsent(ticket)
        else:
            self.feedback.release(ticket, outcome)

    def reroutes(self, refused: Endpoint, error_class: ErrorClass | None) -> bool:
        """Whether a call ``refused`` (quota, rate limit) by that endpoint (the task's
        own or the fallback that took it) will find a fallback of the refusing endpoint
        now, so its task should be retried at once and without spending an attempt. A
        fallback with no usable fallback of its own that refuses spends the attempt (it
        would otherwise be retried for ever, an attempt never spent)."""
        if error_class not in THROTTLED or refused.fallback is None:
            return False
        _st, routed_from = self.router.route(refused, time.monotonic())
        return routed_from is not None

    async def call(self, task: ClaimedTask, config: TaskConfig, primary: Endpoint,
                   fn: Callable[[Endpoint, Provider], Awaitable[T]]) -> tuple[T, Passage]:
        """Acquire, call ``fn`` on the chosen endpoint (it calls the provider it is given
        at most once), release; returns what ``fn`` returned and the :class:`Passage`.
        A release-gate evaluation's call never takes a fallback (:func:`pinned`)."""
        pin = pinned(task)
        while True:
            ticket = await self.admission.acquire(task, config, primary, pinned=pin)
            st = ticket.state
            rec = _Recorder(self._provider(st.ep), st, self.cfg.fallback_after_s,
                            _never if pin else self._fallback_ready)
            try:
                res = await fn(st.ep, rec)
            except _Reroute:  # never sent: the budget goes back, the call is routed anew
                self.feedback.unsent(ticket)
                continue
            except BaseException:
                if rec.outcome is not None:
                    self.feedback.release(ticket, rec.outcome)
                elif rec.sent:  # cancelled or crashed mid-call: the budget counts as spent
                    self.feedback.abandoned(ticket)
                else:
                    self.feedback.unsent(ticket)
                raise
            self.release(ticket, rec.outcome)
            ec = rec.outcome.error_class if rec.outcome is not None else None
            # Refused before any work: the fallback takes it.
            if not pin and self.reroutes(st.ep, ec):
                return res, Passage(ticket.routed_from, "rerouted")
            if ec is ErrorClass.RATE_LIMITED and (ticket.blind or ticket.in_run):
                # Sent before the endpoint named a limit or refused anything: its
                # first refusals say how much it takes (a concurrency limit refuses
                # most of a cold start's calls at once), they are no fault of the
                # task's. Likewise a 429 naming nothing in a run of them while the
                # provider accepts nothing (a window's limit reached). Retried after
                # the pause without spending an attempt.
                wait = max(0.0, st.paused_until - time.monotonic())
                named = rec.outcome.retry_after_ms if rec.outcome is not None else None
                return res, Passage(ticket.routed_from, "first_429",
                                    max(int(1000 * wait), named or 0))
            if down_error(rec.outcome):
                now = time.monotonic()
                if self.feedback.down(st, now):  # not the task's fault
                    fb = self.router.fallback(primary, now) \
                        if primary.fallback is not None and not pin else None
                    if fb is not None and fb is not st:  # a fallback answers: go there
                        return res, Passage(ticket.routed_from, "rerouted")
                    wait = st.breaker.open_until - now \
                        if st.breaker.state is BreakerState.OPEN else 0.0
                    return res, Passage(ticket.routed_from, "unreachable",
                                        int(1000 * max(DOWN_RETRY_S, wait)))
            return res, Passage(ticket.routed_from)

    # -- claims ----------------------------------------------------------------------

    def _ahead(self) -> float:
        """Seconds of calls a claim keeps waiting: ``backlog_s``, and at least the two
        grant gaps the budget is asked for ahead (a loaded machine)."""
        return max(self.cfg.backlog_s, 2 * self.budget.horizon)

    def _backlog_target(self) -> float:
        rate = sum(st.health.rate for st in self.states.values())
        return max(float(self.cfg.min_backlog), rate * self._ahead())

    def _limit_rate(self) -> float | None:
        """Calls per second the known request limits of this worker's endpoints allow
        together (configured, or learned from the shared row; times its rate factor);
        None when one of them has no known request limit (it may take any number)."""
        if not self.states:
            return None
        total = 0.0
        for st in self.states.values():
            if st.limit_rate is None:
                return None
            total += st.limit_rate
        return total

    def _first_room(self) -> int | None:
        """While no call waits: the most tasks a claim may take when every endpoint has
        a known request limit, ``backlog_s`` of that limit (at least the usual backlog):
        the calls of such a claim wait for budget, as the backlog's would. None: no cap
        (nothing known holds the calls back)."""
        rate = self._limit_rate()
        if rate is None:
            return None
        return max(int(self._backlog_target()), int(rate * self._ahead()))

    def claim_room(self, free: int) -> int:
        """How many tasks to claim now, given ``free`` places in the worker: only about
        ``backlog_s`` of calls may wait for budget or a slot (and, before any waits, the
        backlog of the endpoints' known limits: :meth:`_first_room`)."""
        if self.waiting <= 0:
            cap = self._first_room()
            return free if cap is None else max(0, min(free, cap))
        return max(0, min(free, int(self._backlog_target()) - self.waiting))

    def claim_threshold(self, usual: int) -> int:
        """Smallest claim worth a round trip."""
        if self.waiting <= 0:
            cap = self._first_room()
            return usual if cap is None else max(1, min(usual, cap // 4))
        return max(1, min(usual, int(self._backlog_target()) // 4))

    async def claim(self, room: int, *, lease_ms: int, worker_id: str) -> list[ClaimedTask]:
        """Claim up to ``room`` tasks (:meth:`lockgate.flow.lanes.Lanes.claim`), never
        before the flow loop's first lease and lane discovery (:meth:`run`): a window
        batch already open is paced, and batches share by weight, from the first claim
        (a plain claim knows neither)."""
        if not self.admission.ready.is_set():
            await self.admission.ready.wait()
        return await self.lanes.claim(room, lease_ms=lease_ms, worker_id=worker_id)

    # -- the background loop -------------------------------------------------------------

    def _bucket_specs(self) -> list[BucketSpec]:
        return [BucketSpec(ep.name, "endpoint", ep.rpm, ep.tpm,
                           int(ep.limit_window_s * 1000)) for ep in self.settings.endpoints()]

    def _period(self) -> float:
        """How long the loop may sleep: a lease interval while calls wait for budget or
        a window for its pace, else 0.5 s (to learn pauses); 20 ms while stopping."""
        if self._stopping:
            # Nothing new to lease for (the waiters were cancelled): look every 20 ms
            # for the last call to come back, and lease only to publish what a call
            # still in flight taught (a pause).
            return 0.02
        busy = any(st.limited and (st.waiters or st.health.rate > 1.0)
                   for st in self.states.values()) or self.lanes.windows_busy()
        return self.cfg.lease_interval_s if busy else max(self.cfg.lease_interval_s, 0.5)

    async def run(self, stopping: asyncio.Event) -> None:
        """Lease, learn, discover, adjust and report until the worker stops."""
        for ep in self.settings.endpoints():
            self.router.state(ep)
        await self._ensure_rows(stopping)
        next_lanes = next_fail = next_report = 0.0
        last_tick = time.monotonic()
        try:
            await self.budget.lease(self.cfg.lease_interval_s)
            # The lanes before the first claim: a window batch already submitted is paced
            # from the start (a plain claim knows no windows).
            await self.lanes.refresh()
            next_lanes = time.monotonic() + self.cfg.lanes_refresh_s
            self.admission.ready.set()
            while True:
                if stopping.is_set() and not self._stopping:
                    self._stopping = self.budget.stopping = True
                    self.admission.cancel_all()
                if self._stopping and not any(st.in_flight for st in self.states.values()):
                    break  # ``finally`` gives the unused budget back
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._period())
                if self._stopping and not self._wake.is_set():
                    continue
                self._wake.clear()
                now = time.monotonic()
                if now - self.budget.last_lease < self.cfg.lease_interval_s / 4:
                    await asyncio.sleep(self.cfg.lease_interval_s / 4)
                    now = time.monotonic()
                dt = max(1e-3, now - last_tick)
                last_tick = now
                for st in self.states.values():
                    st.health.tick(dt)
                await self.budget.lease(dt)
                for st in self.states.values():
                    if st.adaptive.maybe_adjust(now):
                        self._dispatch(st)
                if now >= next_fail and self.cfg.fair_share:
                    next_fail = now + 15.0
                    await self.lanes.refresh_failures()
                if now >= next_lanes:
                    next_lanes = now + self.cfg.lanes_refresh_s
                    await self.lanes.refresh()
                if now >= next_report:
                    next_report = now + self.cfg.report_s
                    await self._report()
        finally:
            self.admission.ready.set()
            with contextlib.suppress(Exception):
                await self.budget.give_back()
            with contextlib.suppress(Exception):
                await self._report()

    async def _ensure_rows(self, stopping: asyncio.Event) -> None:
        """Create the shared bucket rows, waiting for the database if it is down (a
        worker never exits on a database error)."""
        failures = 0
        while True:
            try:
                await self._db(self.rows.ensure, self._bucket_specs())
                return
            except StoreError as exc:
                failures += 1
                if stopping.is_set():
                    return
                log.warning("creating flow-control rows failed (%d in a row), retrying: %s",
                            failures, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), min(5.0, 0.05 * 2 ** failures))

    def wake(self) -> None:
        """Run the background loop now (the worker calls this when it starts stopping,
        so that the loop notices without waiting out its period)."""
        self._wake.set()

    def detail(self) -> dict[str, Any]:
        """Per-endpoint state for the worker row and status."""
        now = time.monotonic()
        return {name: st.detail(now) for name, st in self.states.items()}

    async def _report(self) -> None:
        states = [st for st in self.states.values() if st.health.calls or st.in_flight]
        limit = sum(st.adaptive.slots for st in (states or self.states.values()))
        n = sum(st.health.calls for st in states)
        lat = [(st.health.latency_ewma, st.health.calls) for st in states
               if st.health.latency_ewma is not None]
        latency = sum(x * c for x, c in lat) / max(1, sum(c for _, c in lat)) if lat else None
        failure = sum(st.health.failure_ewma * st.health.calls for st in states) / n \
            if n else None
        try:
            await self._db(self.rows.report, self.worker_id, pool=self.lanes.pool,
                           concurrency_limit=int(limit), latency_ms=latency,
                           failure_rate=failure, detail=self.detail())
            self._reports.ok()
        except StoreError as exc:  # the database's condition, said in one line
            log.log(self._reports.failed(), "flow report failed (%d in a row); will "
                    "retry: %s", self._reports.failures, exc)
        except Exception:
            log.exception("flow report failed; will retry")
