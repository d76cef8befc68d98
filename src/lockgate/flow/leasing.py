"""Budget grants: what a worker asks of the shared buckets, the arithmetic applied to
their rows, and what it does with the answer (docs/flow.md, "Shared budgets").

Every ``lease_interval_s`` the flow loop asks, in one transaction, for the budget of
the calls waiting (plus, below the limit, one interval of its own rate); it returns
unspent budget and refunds, settles the tokens its calls really cost, and publishes
the pauses, rate cuts and limits its calls learned. The store locks the rows and hands
each to :func:`lease_step`, which applies :func:`lockgate.flow.bucket.lease`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from lockgate.config import FlowSettings
from lockgate.errors import StoreError, Streak
from lockgate.flow.bucket import Ask, Bucket, Grant, Limits, effective, lease
from lockgate.flow.endpoint import EndpointState
from lockgate.flow.estimate import TokenModels
from lockgate.store.flow import BucketRow, BucketState, BucketStep, BucketUpdate

log = logging.getLogger("lockgate.flow")

DbCall = Callable[..., Awaitable[Any]]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class LeaseRequest:
    """One bucket's part of a lease: what is asked, how the bucket is shaped, and what
    the provider said about its limits (``learned_*``: None = no news; 0 = forget)."""

    name: str
    ask: Ask
    headroom: float
    burst: float
    min_cap_ms: float = 0.0
    pause_reason: str | None = None
    #: The pause was named by the provider (Retry-After): it replaces a pause of the
    #: row inferred from headers (reason ``exhausted``), longer or shorter.
    pause_explicit: bool = False
    learned_rpm: float | None = None
    learned_tpm: float | None = None
    sliding: bool = True  # a provider's limit (see :class:`~lockgate.flow.bucket.Limits`)
    period_ms: float = 0.0  # the period it is enforced over (0: the window)


@dataclass(frozen=True, slots=True)
class LeaseResult:
    """What a bucket gave, the limits now in force and the pause still running."""

    name: str
    grant: Grant
    rpm: float | None
    tpm: float | None
    window_ms: int
    pause_reason: str | None
    factor: float = 1.0
    now: int = 0  # the database's time of the lease (ms): scheduled grants count from it


class BucketRows(Protocol):
    """The store's side of a lease (:meth:`lockgate.store.flow.FlowStore.update_buckets`)."""

    def update_buckets(self, names: Sequence[str],
                       step: BucketStep[T]) -> dict[str, tuple[T, bool]]: ...


def _learned(report: float | None, stored: float | None,
             configured: float | None) -> float | None:
    """The learned limit to keep: a report below the configured limit replaces it, a
    report at or above it (or 0) forgets it; no report keeps what is stored."""
    if report is None:
        return stored
    return report if report and (configured is None or report < configured) else None


def lease_step(row: BucketRow, req: LeaseRequest) -> tuple[BucketUpdate | None, LeaseResult]:
    """One locked row's lease: learned limits, refill, returns, pause, grant. The row
    is written back only if something changed."""
    s = row.state
    l_rpm = _learned(req.learned_rpm, s.learned_rpm, row.rpm)
    l_tpm = _learned(req.learned_tpm, s.learned_tpm, row.tpm)
    limits = Limits(effective(row.rpm, l_rpm), effective(row.tpm, l_tpm), row.window_ms,
                    req.headroom, req.burst, req.min_cap_ms, req.sliding, req.period_ms)
    before = Bucket(s.req_allowance, s.tok_allowance, s.refilled_at, s.paused_until,
                    s.rate_factor, s.cut_at)
    ask = req.ask
    if req.pause_explicit and ask.pause_ms > 0 and s.pause_reason == "exhausted":
        ask = replace(ask, replace_pause=True)
    # The database's now was read before the row lock was granted: a worker that
    # waited for it must not compute at a time before the last grant's (its schedule
    # would then start early and overlap the grants made in between).
    now = max(row.now, s.refilled_at)
    after, grant = lease(before, limits, now, ask)
    reason = s.pause_reason
    if ask.pause_ms > 0 and after.paused_until != before.paused_until:
        reason = req.pause_reason or "provider"
    result = LeaseResult(row.name, grant, limits.requests, limits.tokens, row.window_ms,
                         reason if grant.paused_ms else None, after.factor, now)
    changed = (after.paused_until != before.paused_until or after.cut_at != before.cut_at
               or grant.requests or grant.tokens or ask.give_requests or ask.give_tokens
               or ask.debt_tokens or ask.debt_requests or req.learned_rpm is not None
               or req.learned_tpm is not None)
    if not changed:
        return None, result
    state = BucketState(after.requests, after.tokens, after.refilled_at, after.paused_until,
                        reason, l_rpm, l_tpm, after.factor, after.cut_at)
    return BucketUpdate(state, grant.requests, grant.tokens), result


def lease_buckets(rows: BucketRows, requests: Sequence[LeaseRequest]
                  ) -> dict[str, LeaseResult]:
    """Lease from several buckets in one transaction (a bucket that does not exist
    gives no result). A write that lost its row's version grants nothing (the row
    lock makes that unreachable; never grant on a lost race)."""
    by_name = {r.name: r for r in requests}
    done = rows.update_buckets(list(by_name), lambda row: lease_step(row, by_name[row.name]))
    return {name: res if written else replace(res, grant=Grant(0, 0.0, res.grant.paused_ms))
            for name, (res, written) in done.items()}


#: The longest time between grants that grants ahead cover (two of them: 1 s).
MAX_GAP_S = 0.5


class Pacing(Protocol):
    """The window batches' pacing buckets (:class:`lockgate.flow.lanes.Lanes`)."""

    def pace_requests(self, interval: float) -> list[LeaseRequest]: ...

    def paced(self, res: LeaseResult) -> None: ...


class Budget:
    """The leasing side of one worker's flow control (see the module docstring)."""

    def __init__(self, states: dict[str, EndpointState], cfg: FlowSettings,
                 models: TokenModels, pacing: Pacing, rows: BucketRows, *, db: DbCall,
                 worker_id: str, dispatch: Callable[[EndpointState], None]) -> None:
        self.states = states
        self.cfg = cfg
        self.models = models  # for the mean reservation when no call waits
        self.pacing = pacing  # the window batches' buckets, leased along
        self.rows = rows
        self._db = db
        self.worker_id = worker_id
        self._dispatch = dispatch  # lets calls go that the new budget covers
        #: The last lease got less than it asked: an early lease would not help.
        self.starved = False
        self.stopping = False
        self.leases = 0
        self._leasing = Streak()  # failed leases in a row
        self.last_lease = 0.0  # when (monotonic)
        self._period = cfg.lease_interval_s  # the real time between leases, smoothed
        #: The real time between two grants arriving, smoothed (a loaded machine or a
        #: slow database makes it longer than ``lease_interval_s``), and the last one.
        self._gap = cfg.lease_interval_s
        self._applied = 0.0
        #: The database clock minus this process's monotonic clock (ms), at least:
        #: grants scheduled on the database's time are mapped with it, so that those of
        #: two workers do not overlap by their leases' different round trips.
        self._offset: float | None = None

    @property
    def horizon(self) -> float:
        """Seconds between two grants as this worker really gets them (at least
        ``lease_interval_s``, at most :data:`MAX_GAP_S`): it asks for, holds and is
        granted ahead two of them, so that no refill is lost while it waits for the
        next grant and its calls never wait for one."""
        return min(MAX_GAP_S, max(self.cfg.lease_interval_s, self._gap, self._period))

    def _request(self, name: str, ask: Ask, **kw: Any) -> LeaseRequest:
        return LeaseRequest(name, ask, self.cfg.headroom, self.cfg.burst,
                            max(self.cfg.min_cap_ms, 2000.0 * self.horizon), **kw)

    def _ask(self, st: EndpointState, interval: float) -> Ask:
        """What to ask of ``st``'s bucket: calls waiting, or (below the limit) one
        period of this worker's rate so that calls need not wait for a lease.
        Saturated, the waiting calls are more than that: the grant is spent at once
        and nothing is held."""
        led = st.ledger
        if led.tok < 0:  # spent beyond the grant: the bucket must learn it
            led.debt_tok -= led.tok
            led.tok = 0.0
        want_req = 0
        want_tok = largest = per = 0.0
        if st.limited and not self.stopping and (st.waiters or st.health.rate > 0):
            need = max(float(len(st.waiters)), st.health.rate * interval)
            if st.req_limited:
                want_req = max(0, math.ceil(need - led.req - 1e-9))
            if st.tok_limited:
                per = (st.waiting_tokens / len(st.waiters)) if st.waiters else 0.0
                if per <= 0:
                    per = self.models.mean_estimate(st.name)
                want_tok = max(0.0, max(st.waiting_tokens, need * per) - led.tok)
                largest = max((w.tokens for w in st.waiters), default=per)
        both = bool(want_req and want_tok)
        return Ask(requests=want_req, tokens=want_tok, largest=largest,
                   give_requests=led.give_req, give_tokens=led.give_tok,
                   debt_tokens=led.debt_tok, debt_requests=led.debt_req,
                   pause_ms=led.pause_ms, cut=led.cut,
                   per_call=per if both else 0.0,
                   held_requests=max(0.0, led.req) if both else 0.0,
                   held_tokens=max(0.0, led.tok) if both else 0.0)

    def requests(self, dt: float) -> list[LeaseRequest]:
        """Every bucket's part of the next lease (unlimited endpoints too: they still
        learn pauses other workers published)."""
        # Prefetch for the real period between leases (a loaded machine ticks slower).
        self._period += 0.3 * (dt - self._period)
        interval = max(self.cfg.lease_interval_s, self._period)
        reqs = [self._request(st.name, self._ask(st, 2 * self.horizon),
                              period_ms=st.ep.limit_enforced_s * 1000.0,
                              pause_reason=st.ledger.pause_reason,
                              pause_explicit=st.ledger.pause_explicit,
                              learned_rpm=st.ledger.learned_rpm,
                              learned_tpm=st.ledger.learned_tpm)
                for st in self.states.values()]
        if not self.stopping:
            reqs += self.pacing.pace_requests(interval)
        return reqs

    async def lease(self, dt: float) -> None:
        """One lease for every bucket this worker uses; what was to be published is
        kept for the next try when it fails."""
        sent = self.requests(dt)
        for st in self.states.values():  # taken into the request: clear before awaiting
            led = st.ledger
            led.give_req = led.give_tok = led.debt_tok = led.debt_req = 0.0
            led.pause_ms = 0
            led.pause_reason = None
            led.pause_explicit = False
            led.cut = 1.0
            if led.learned_rpm is not None:
                led.sent_rpm, led.learned_rpm = led.learned_rpm, None
            if led.learned_tpm is not None:
                led.sent_tpm, led.learned_tpm = led.learned_tpm, None
        self.last_lease = before = time.monotonic()
        try:
            results = await self._db(lease_buckets, self.rows, sent)
            self._leasing.ok()
        except Exception as exc:
            if isinstance(exc, StoreError):  # the database's condition, in one line
                log.log(self._leasing.failed(), "asking for budget grants failed (%d in a "
                        "row); will retry: %s", self._leasing.failures, exc)
            else:
                log.exception("asking for budget grants failed; will retry")
            for r in sent:
                kept = self.states.get(r.name)
                if kept is not None:
                    led = kept.ledger
                    led.give_req += r.ask.give_requests
                    led.give_tok += r.ask.give_tokens
                    led.debt_tok += r.ask.debt_tokens
                    led.debt_req += r.ask.debt_requests
                    led.publish_pause(r.ask.pause_ms, r.pause_reason or "provider",
                                      explicit=r.pause_explicit)
                    led.cut = min(led.cut, r.ask.cut)
            return
        self.leases += 1
        self._apply(results, {r.name: r for r in sent}, before)

    def _clock(self, results: dict[str, LeaseResult], before: float, after: float) -> float:
        """The monotonic time of the database's ``now`` in these results: its offset is
        the tightest seen (the lease read ``now`` between ``before`` and ``after``), or
        this lease's own when the clocks disagree with it (a clock stepped)."""
        db_now = max((r.now for r in results.values()), default=0)
        if not db_now:
            return after
        lo = db_now - after * 1000.0  # the offset is at least this ...
        hi = db_now - before * 1000.0  # ... and at most this
        off = self._offset
        if off is None or off > hi:
            off = lo
        self._offset = off = max(off, lo)
        return (db_now - off) / 1000.0

    def _apply(self, results: dict[str, LeaseResult], sent: dict[str, LeaseRequest],
               before: float) -> None:
        mono = time.monotonic()
        if self._applied:
            self._gap += 0.3 * (mono - self._applied - self._gap)
        self._applied = mono
        at = self._clock(results, before, mono)  # when the grants were computed
        starved = False
        for name, res in results.items():
            st = self.states.get(name)
            if st is None:
                self.pacing.paced(res)
                continue
            st.learned(res.rpm, res.tpm, mono)
            st.ledger.granted(res.grant, at)
            st.factor = res.factor
            st.limit_rate = res.rpm * res.factor * 1000.0 / res.window_ms \
                if res.rpm and res.window_ms > 0 else None
            if res.grant.paused_ms:
                until = mono + res.grant.paused_ms / 1000.0
                if until > st.paused_until + 0.001:
                    if st.paused_until <= mono:  # a new pause, not one this worker knew
                        log.info("worker %s: endpoint %s paused for %d ms (%s), learned "
                                 "from the shared row", self.worker_id, name,
                                 res.grant.paused_ms, res.pause_reason)
                        if st.limited:
                            st.ledger.give_up()
                    st.paused_until = until
                    st.pause_reason = res.pause_reason
                    if res.pause_reason == "quota":  # one call probes when it ends
                        st.quota_probe, st.probe_out = True, False
            ask = sent[name].ask
            if (ask.requests and res.grant.requests < ask.requests) or \
                    (ask.tokens and res.grant.tokens < ask.tokens - 1e-6):
                starved = True
            self._dispatch(st)
        self.starved = starved

    async def give_back(self) -> None:
        """The worker stops: return what it holds, settle what it owes."""
        reqs = []
        for st in self.states.values():
            led = st.ledger
            if st.limited and (led.req > 0 or led.tok > 0 or led.debt_tok or led.give_req
                               or led.debt_req):
                reqs.append(self._request(st.name, Ask(
                    give_requests=max(0.0, led.req) + led.give_req,
                    give_tokens=max(0.0, led.tok) + led.give_tok,
                    debt_tokens=led.debt_tok - min(0.0, led.tok),
                    debt_requests=led.debt_req),
                    period_ms=st.ep.limit_enforced_s * 1000.0))
                led.clear()
        if reqs:
            await self._db(lease_buckets, self.rows, reqs)
