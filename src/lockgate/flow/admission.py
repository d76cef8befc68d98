"""Passage for calls: route, then let a call go at once or queue it per endpoint until
pause, breaker, concurrency slot and budget allow (all in memory, no I/O).

A call passes by one function, :meth:`Admission.admit`, whether it finds the way free
(:meth:`Admission.acquire`) or is let go from the queue (:meth:`Admission.dispatch`).
The queue is FIFO per endpoint; when the endpoint becomes unusable and a fallback is
usable, its waiting calls are sent back to be routed again, except pinned calls (a
release-gate evaluation's: a candidate is judged on its own model's answers), which
never take a fallback and wait for their endpoint.

Before an answer has taught a task type's token estimate, at most :data:`COLD_CALLS`
of its calls go per endpoint; the others wait for that answer (:class:`ColdGate`), or
for a refusal for quota or the rate, which teaches nothing but holds them no longer.
So do the calls of an endpoint with no known limit before its first answer (whose
headers may name one).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cachetools import LRUCache

from lockgate.config import Endpoint
from lockgate.flow.breaker import BreakerState
from lockgate.flow.endpoint import EndpointState, Waiter
from lockgate.flow.estimate import TokenModel, TokenModels
from lockgate.flow.routing import Router
from lockgate.spec import TaskConfig
from lockgate.store.types import ClaimedTask

log = logging.getLogger("lockgate.flow")

#: Calls of a task type a worker sends before its first answer has taught the token
#: estimate (per endpoint). The untaught estimate is deliberately dear; reserving it
#: for every call in flight and refunding it later would hand a burst back to the
#: shared bucket (the provider's window still holds what those calls really cost).
COLD_CALLS = 4
#: Task types not taught yet that a worker keeps track of (an answer forgets a type at
#: once; these are types whose calls keep failing without one).
COLD_KEPT = 4096


@dataclass(slots=True)
class Cold:
    """The calls of one task type on one endpoint before any answer taught its token
    estimate: at most :data:`COLD_CALLS` in flight; the rest wait for ``wake``. Once a
    call is refused for quota or the rate (``refused``), none waits: a refusal carries
    no usage, and an endpoint that refuses every call would otherwise let
    :data:`COLD_CALLS` of them go per pause, a pause per attempt of the others."""

    key: tuple[str, str]
    in_flight: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    refused: bool = False


class ColdGate:
    """The :class:`Cold` records of the task types not taught yet, the
    :data:`COLD_KEPT` most recently used (calls waiting on an evicted record still hold
    it and are woken by it)."""

    def __init__(self, maxsize: int = COLD_KEPT) -> None:
        self._cold: LRUCache[tuple[str, str], Cold] = LRUCache(maxsize)

    def __len__(self) -> int:
        return len(self._cold)

    def get(self, key: tuple[str, str]) -> Cold:
        cold = self._cold.get(key)
        if cold is None:
            cold = self._cold[key] = Cold(key)
        return cold

    def done(self, cold: Cold | None, model: TokenModel | None, *,
             refused: bool = False) -> None:
        """A call of a cold task type ended: once an answer taught the estimate, every
        waiting call goes on (with a taught estimate); once one was ``refused`` (quota,
        rate), every waiting call goes on too (with the untaught one, as after an answer
        without usage); else the next one may try."""
        if cold is None:
            return
        cold.in_flight -= 1
        cold.refused = cold.refused or refused
        if model is not None and model.samples > 0 and self._cold.get(cold.key) is cold:
            del self._cold[cold.key]
        cold.wake.set()
        cold.wake = asyncio.Event()


@dataclass(slots=True)
class Ticket:
    """Passage for one call: where it goes and what it reserved."""

    state: EndpointState
    tokens: float
    probe: bool
    routed_from: str | None
    batch_id: str
    model: TokenModel | None
    input_chars: int
    cold: Cold | None = None
    #: Whether it was paid from the shared bucket's budget (False: sent while no limit
    #: was known; charged when it answers, if a limit was learned meanwhile).
    budgeted: bool = True
    #: Sent blind: no limit known and no call of this worker refused for the rate yet
    #: (a 429 then is the provider's first word on its limit, not the task's doing).
    blind: bool = False
    #: A probe of a run of refusals (:meth:`~lockgate.flow.endpoint.EndpointState.
    #: run_probe`): the other calls wait for its answer.
    run_probe: bool = False
    #: Refused (429 naming nothing) in a run of refusals of a provider that accepts
    #: nothing: at its limit, not the task's doing (set when the call is released).
    in_run: bool = False


#: Shortest wait for scheduled budget (calls that become usable within it go together).
PACE_TICK_S = 0.004


class Admission:
    """The per-endpoint queues of one worker (see the module docstring).

    ``wake`` runs the flow loop now (a lease); ``starved`` says whether the last lease
    got less than it asked (then an early lease would not help)."""

    def __init__(self, router: Router, models: TokenModels, *, wake: Callable[[], None],
                 starved: Callable[[], bool]) -> None:
        self.router = router
        self.models = models
        self.cold = ColdGate()
        self._wake = wake
        self._starved = starved
        #: Set once the first lease told this worker the shared pauses.
        self.ready = asyncio.Event()
        #: Calls waiting for passage (or for a cold task type's first answer).
        self.waiting = 0

    async def acquire(self, task: ClaimedTask, config: TaskConfig,
                      primary: Endpoint, *, pinned: bool = False) -> Ticket:
        """Wait until a call for ``task`` may go; reserve its budget and slot. A
        ``pinned`` call goes to ``primary`` only, never to a fallback."""
        input_chars = len(task.input_data)
        if not self.ready.is_set():  # a worker starting during a pause must honour it
            await self.ready.wait()
        while True:
            now = time.monotonic()
            st, routed_from = (self.router.state(primary), None) if pinned \
                else self.router.route(primary, now)
            model = self.models.get(st.ep, config, task.config_hash) if st.tok_limited \
                else None
            cold: Cold | None = None
            key: tuple[str, str] | None = None
            if model is not None and model.samples == 0:
                key = (st.name, task.config_hash)
            elif not st.limited and not st.heard:
                # No limit known and no answer yet: its headers may name one. Until
                # then a few calls only (else as many as the concurrency, 512 at once,
                # of which 462 met 429s and spent their attempts).
                key = (st.name, "")
            if key is not None:
                cold = self.cold.get(key)
                if cold.in_flight >= COLD_CALLS and not cold.refused:
                    self.waiting += 1
                    try:
                        await cold.wake.wait()
                    finally:
                        self.waiting -= 1
                    continue
            tokens = model.estimate(input_chars) if model is not None else 0.0
            if self._free(st, tokens, now):
                probe = self.admit(st, tokens, now)
                if cold is not None:
                    cold.in_flight += 1
                return Ticket(st, tokens, probe, routed_from, task.batch_id, model,
                              input_chars, cold, st.limited, st.blind, st.run_probe())
            w = self._enqueue(st, tokens, now, pinned)
            if cold is not None:
                cold.in_flight += 1  # held while it waits for budget, so others wait too
            try:
                go = await w.fut
            except asyncio.CancelledError:
                if w.fut.done() and not w.fut.cancelled() and w.fut.result():
                    if w.run_probe:
                        st.probe_done()
                    self.undo(st, tokens)
                self.cold.done(cold, None)
                raise
            if go:
                return Ticket(st, tokens, w.probe, routed_from, task.batch_id, model,
                              input_chars, cold, st.limited, st.blind, w.run_probe)
            self.cold.done(cold, None)
            # rerouted: the endpoint became unusable while the call waited; route again

    def _enqueue(self, st: EndpointState, tokens: float, now: float,
                 pinned: bool = False) -> Waiter:
        """Queue a call; dispatch what can go, and lease early if the bucket had room."""
        w = Waiter(asyncio.get_running_loop().create_future(), tokens, pinned=pinned)
        st.waiters.append(w)
        st.waiting_tokens += tokens
        self.waiting += 1
        self.dispatch(st)
        if st.waiters and st.limited and not st.has_budget(st.waiters[0].tokens) \
                and not st.paused(now) and not self._starved():
            self._wake()
        return w

    @staticmethod
    def admit(st: EndpointState, tokens: float, now: float) -> bool:
        """Let one call pass: the breaker counts it (a probe unless closed), it spends
        budget and takes a slot. Returns whether it is a probe."""
        probe = st.breaker.state is not BreakerState.CLOSED
        st.breaker.allow(now)
        st.spend(tokens, now)
        st.adaptive.note_in_flight(st.in_flight)
        return probe

    def _room(self, st: EndpointState, tokens: float, now: float) -> bool:
        if st.refused is not None and not st.paused(now):
            self._infer_pace(st, now)
        if st.probing():  # a run of refusals: the others wait for the probe's answer
            return False
        return st.in_flight < st.adaptive.slots and st.has_budget(tokens, now)

    def _infer_pace(self, st: EndpointState, now: float) -> None:
        answered = st.infer_pace(now)
        if answered is not None and st.pace is not None:
            if st.tok_limited:  # it named a token limit (learned or set), no request one
                log.info("endpoint %s refuses calls for the rate and names no request "
                         "limit (its token limit is known and kept): its calls are paced "
                         "at %.3g a second in this worker (%d accepted in the %g s before "
                         "a 429); set rpm for it to pace by its request limit instead",
                         st.name, st.pace.rate, answered, st.ep.limit_enforced_s)
                return
            log.info("endpoint %s refuses calls for the rate and names no limit: its "
                     "calls are paced at %.3g a second in this worker (%d accepted in "
                     "the %g s before a 429); set rpm for it to pace by the limit "
                     "instead", st.name, st.pace.rate, answered, st.ep.limit_enforced_s)

    def _free(self, st: EndpointState, tokens: float, now: float) -> bool:
        """Whether a call may pass at once (no call queued before it)."""
        return (not st.waiters and not st.paused(now) and self._room(st, tokens, now)
                and st.breaker.available(now))

    def undo(self, st: EndpointState, tokens: float, *, budgeted: bool = True) -> None:
        """A call that passed was never sent: its slot and budget are free again."""
        st.in_flight -= 1
        if st.limited and budgeted:
            st.ledger.refund(tokens)
        if st.pace is not None:
            st.pace.give_back()
        self.dispatch(st)

    def _drop(self, st: EndpointState, w: Waiter) -> None:
        st.waiting_tokens -= w.tokens
        self.waiting -= 1

    def dispatch(self, st: EndpointState) -> None:
        """Let waiting calls go while slot, budget, pause and breaker allow; send them
        back to routing when the endpoint became unusable and a fallback is usable."""
        if not st.waiters:
            return
        now = time.monotonic()
        if not self.router.usable(st, now) and self.router.fallback(st.ep, now) is not None:
            self._reroute(st)
            if not st.waiters:
                return
        if st.paused(now):
            self._timer(st, st.paused_until - now)
            return
        q = st.waiters
        while q:
            w = q[0]
            if w.fut.done():  # its task was cancelled
                self._drop(st, q.popleft())
                continue
            if st.probing():  # dispatched again when the probe is answered
                break
            if not self._room(st, w.tokens, now):
                if st.in_flight < st.adaptive.slots and st.has_budget(w.tokens):
                    # Budget held but scheduled: let the call go when it is usable
                    # (a few ms at a time, not one timer per call).
                    self._timer(st, max(PACE_TICK_S, st.usable_in(now)), wake=False)
                break
            if not st.breaker.available(now):
                self._timer(st, max(0.05, st.breaker.open_until - now))
                break
            self._drop(st, q.popleft())
            w.probe = self.admit(st, w.tokens, now)
            w.run_probe = st.run_probe()
            w.fut.set_result(True)

    def _reroute(self, st: EndpointState) -> None:
        """Send the waiting calls back to routing; pinned ones stay, in their order."""
        kept = [w for w in st.waiters if w.pinned and not w.fut.done()]
        for w in st.waiters:
            if not (w.pinned and not w.fut.done()):
                self._drop(st, w)
                if not w.fut.done():
                    w.fut.set_result(False)
        st.waiters.clear()
        st.waiters.extend(kept)

    def _timer(self, st: EndpointState, delay: float, *, wake: bool = True) -> None:
        """Dispatch again after ``delay``; with ``wake``, also ask for a grant then if
        calls still wait (after a pause; not while scheduled budget is being spent, which
        would ask the database every few ms)."""
        if st.timer is not None and not st.timer.cancelled():
            return

        def fire() -> None:
            st.timer = None
            self.dispatch(st)
            if wake and st.waiters and st.limited:
                self._wake()

        st.timer = asyncio.get_running_loop().call_later(max(0.0, delay), fire)

    def cancel_all(self) -> None:
        """The worker stops: every waiting call is cancelled."""
        for st in self.router.states.values():
            while st.waiters:
                w = st.waiters.popleft()
                self.waiting -= 1
                if not w.fut.done():
                    w.fut.cancel()
            st.waiting_tokens = 0.0
