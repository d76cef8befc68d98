"""Writing a worker's results back, so that no row can wedge the worker.

A batch of results normally lands in one transaction (:meth:`Store.finish`). When the
database does not answer, or answers with a passing condition (a lock, a full disk),
the batch waits and is written again later, whole. When the database answers but
refuses the batch, one of its rows holds a value the schema cannot store (a provider's
usage figure that is not an integer, a name longer than its column): the batch is
bisected until the refused rows stand alone and the rest has landed. A refused row is
written again with a bare trace (its task's result kept, the attempt row marked
``storage_error``); if the database refuses that too, the task fails with
``storage_error``; only if even that is refused is the row given up, and its task runs
again when its lease expires. A task given back without a trace (released before its
call, or by a worker that stops) is never failed so: it is given up. Nothing is retried
forever while other results wait.

A passing condition while the database answers (a statement cancelled by
``statement_timeout`` or ``KILL QUERY``, a database made read-only by a failover, a lock
wait that timed out, a connection dropped while a fresh one is taken: a server restarted,
a session killed) is not a refusal: the batch waits and is written again later, whole.
Only after :data:`ISOLATE_AFTER` such failures in a row is it bisected; a row that then
fails alone with a passing condition while the others land is put aside and written
again with the next batch, and once it has failed so :data:`ISOLATE_AFTER` times (a row
the server cannot write within its statement time, say) it is taken as refused. When
two rows fail alone and none has landed, the condition is the database's, not the rows':
the batch waits, whole.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from lockgate.errors import ErrorClass, StoreError
from lockgate.quality import QualityObserver
from lockgate.states import TaskStatus
from lockgate.store import Finish, FinishReport, Store
from lockgate.store.types import AttemptRow

log = logging.getLogger("lockgate.worker")

Claim = tuple[int, str]
DbCall = Callable[..., Awaitable[Any]]

#: Consecutive failures of the same rows with a passing condition, while the database
#: answers, after which the rows are isolated anyway: a row that makes the server drop
#: the connection (a packet over ``max_allowed_packet``) looks like a passing condition.
ISOLATE_AFTER = 3


def _passing(exc: BaseException) -> bool:
    """A condition that passes, a lost connection included: the server answers again
    (the write-back pinged it), and a session dropped by a restart or a kill says
    nothing about the rows. A row whose statement makes the server drop the connection
    (a packet over ``max_allowed_packet``) is put aside like any other, and taken as
    refused after :data:`ISOLATE_AFTER` such failures while others land."""
    return isinstance(exc, StoreError) and exc.transient


def _hand_back(f: Finish) -> bool:
    """Whether ``f`` gives its task back without a trace (released before its call, or
    by a worker that stops): failing it would end a task that was never judged."""
    return f.status == TaskStatus.PENDING and f.attempt is None


def _claim(f: Finish) -> Claim:
    return f.id, f.lease_token


def _bare_trace(f: Finish, message: str) -> AttemptRow | None:
    """The attempt row of ``f`` reduced to what lockgate itself produced, with the
    reason its full trace was not stored."""
    if f.attempt is None:
        return None
    a = f.attempt
    row: AttemptRow = {"error_class": str(ErrorClass.STORAGE_ERROR),
                       "error_message": message[:2000]}
    if "attempt" in a:
        row["attempt"] = a["attempt"]
    if "outcome" in a:
        row["outcome"] = a["outcome"]
    if "started_at" in a:
        row["started_at"] = a["started_at"]
    return row


def with_bare_trace(f: Finish, exc: BaseException) -> Finish | None:
    """``f`` with its trace reduced (the task's state and result unchanged), or None when
    it has no trace to reduce."""
    trace = _bare_trace(f, f"the database refused this attempt's trace, which was not "
                           f"stored: {exc}")
    if trace is None:
        return None
    # The task row's copy of the call (usage, model, body) goes with the trace.
    return replace(f, attempt=trace, model=None, input_tokens=None, output_tokens=None,
                   latency_ms=None, http_status=None, request_id=None, response=None)


def unstorable(f: Finish, exc: BaseException) -> Finish:
    """A write-back that fails the task of ``f`` with ``storage_error``."""
    message = f"the database refused this task's result: {exc}"[:2000]
    trace = _bare_trace(f, message)
    if trace is not None:
        trace["outcome"] = "failed"
    return Finish(id=f.id, lease_token=f.lease_token, status=TaskStatus.FAILED,
                  error_class=str(ErrorClass.STORAGE_ERROR), error_message=message,
                  attempt=trace)


@dataclass
class Landed:
    """What one :meth:`WriteBack.write` did with its rows."""

    #: Written and in effect (including one whose earlier write had committed unseen).
    applied: set[Claim] = field(default_factory=set)
    #: Written as discarded: the lease had been lost.
    discarded: set[Claim] = field(default_factory=set)
    #: The write-back that landed instead of a refused one.
    replaced: dict[Claim, Finish] = field(default_factory=dict)
    #: Refused in every form: the task runs again when its lease expires.
    dropped: set[Claim] = field(default_factory=set)
    #: Not written (the database does not answer): to be written again later.
    unwritten: list[Finish] = field(default_factory=list)
    #: How long to wait before writing ``unwritten`` again.
    retry_in_s: float = 0.0

    def add(self, report: FinishReport) -> None:
        self.applied |= report.applied_claims
        self.discarded |= report.discarded_claims

    def settled(self, claim: Claim) -> bool:
        return claim in self.applied or claim in self.discarded or claim in self.dropped

    def progressed(self) -> bool:
        """Whether any row was written."""
        return bool(self.applied or self.discarded or self.replaced)


class _Wait(Exception):
    """The database is unavailable (or in a passing condition): stop and retry later."""


class WriteBack:
    """Writes batches of results for one worker (see the module docstring)."""

    def __init__(self, store: Store, worker_id: str, *, db: DbCall,
                 observe: QualityObserver | None = None) -> None:
        self.store = store
        self.worker_id = worker_id
        self._db = db
        #: Handed the attempt rows of each write-back in its transaction (rollups), and
        #: told when it committed (spans).
        self._observe = observe
        self._backoff = 0.05
        self._strikes = 0
        self._isolating = False
        #: Rows that failed alone with a passing condition while others landed, and how
        #: many times in a row (see the module docstring).
        self._row_strikes: dict[Claim, int] = {}
        #: This write's rows put aside (failed alone with a passing condition).
        self._aside: list[Finish] = []
        self._aside_why: Exception = Exception()

    async def write(self, batch: Sequence[Finish], *,
                    hard_stop: asyncio.Event | None = None) -> Landed:
        """Write ``batch``; rows the database cannot take now come back in
        ``unwritten``. Never raises for a database error."""
        landed = Landed()
        self._isolating = self._strikes >= ISOLATE_AFTER
        self._aside = []
        try:
            await self._land(list(batch), landed)
            if self._aside and not landed.progressed():
                # nothing landed: the condition may well be the database's
                raise _Wait(str(self._aside_why)) from self._aside_why
        except _Wait as exc:
            landed.unwritten = [f for f in batch if not landed.settled(_claim(f))]
            landed.retry_in_s = self._backoff
            self._strikes += 1
            if hard_stop is None or not hard_stop.is_set():
                (log.warning if self._strikes <= 3 or self._strikes % 10 == 0 else log.debug)(
                    "write-back of %d result(s) failed (%d in a row); retrying in %.2fs: %s",
                    len(landed.unwritten), self._strikes, self._backoff, exc.__cause__)
            self._backoff = min(5.0, self._backoff * 2)
        else:
            claims = {_claim(f) for f in batch}
            self._row_strikes = {c: n for c, n in self._row_strikes.items()
                                 if c in claims and not landed.settled(c)}
            if self._aside:  # others landed: these rows themselves fail (for now)
                for f in self._aside:
                    self._row_strikes[_claim(f)] = self._row_strikes.get(_claim(f), 0) + 1
                landed.unwritten = list(self._aside)
                landed.retry_in_s = self._backoff
                log.warning("write-back of %d result(s) failed alone while the others "
                            "landed; retrying in %.2fs: %s", len(self._aside),
                            self._backoff, self._aside_why)
                self._backoff = min(5.0, self._backoff * 2)
            else:
                self._backoff = 0.05
                self._strikes = 0
        return landed

    async def _reachable(self) -> bool:
        try:
            await self._db(self.store.ping)
        except StoreError:
            return False
        return True

    async def _check(self, exc: Exception) -> None:
        """Raise :class:`_Wait` unless ``exc`` says the rows themselves were refused (or,
        while isolating, may be)."""
        passing = isinstance(exc, StoreError) and exc.transient
        if (passing and not self._isolating) or not await self._reachable():
            raise _Wait(str(exc)) from exc

    def _put_aside(self, f: Finish, exc: Exception, landed: Landed) -> bool:
        """Put ``f`` aside after it failed alone with a passing condition (False: it has
        failed so :data:`ISOLATE_AFTER` times while others landed, and is to be taken
        as refused). Raises :class:`_Wait` for a second such row when none has landed."""
        if self._aside and not landed.progressed():
            raise _Wait(str(exc)) from exc
        if self._row_strikes.get(_claim(f), 0) + 1 >= ISOLATE_AFTER:
            return False
        self._aside.append(f)
        self._aside_why = exc
        return True

    async def _land(self, rows: list[Finish], landed: Landed) -> None:
        try:
            report = await self._db(self.store.finish, rows, worker_id=self.worker_id,
                                  observe=self._observe)
        except Exception as exc:  # a database error, or a refused batch (StateConflict)
            await self._check(exc)
            if len(rows) > 1:
                mid = len(rows) // 2
                await self._land(rows[:mid], landed)
                await self._land(rows[mid:], landed)
                return
            if _passing(exc):
                if self._put_aside(rows[0], exc, landed):
                    return
                await self._refused(rows[0], exc, landed, forced=True)
                return
            await self._refused(rows[0], exc, landed)
            return
        self._committed()
        landed.add(report)

    def _committed(self) -> None:
        if self._observe is not None:
            self._observe.committed()

    async def _refused(self, f: Finish, exc: Exception, landed: Landed, *,
                       forced: bool = False) -> None:
        """Land a row the database refused in a form it takes, or give it up
        (``forced``: a row that failed alone too often with a passing condition, whose
        forms failing so are refused too)."""
        claim = _claim(f)
        why: Exception = exc
        failed = None if _hand_back(f) else unstorable(f, exc)
        for kind, form in (("with a bare trace", with_bare_trace(f, exc)),
                           ("as FAILED", failed)):
            if form is None:
                continue
            try:
                report = await self._db(self.store.finish, [form], worker_id=self.worker_id,
                                      observe=self._observe)
            except Exception as again:
                if isinstance(again, StoreError) and again.transient and not (
                        forced and _passing(again)):
                    raise _Wait(str(again)) from again
                await self._check(again)
                why = again
                continue
            self._committed()
            landed.add(report)
            landed.replaced[claim] = form
            log.error("the database refused the write-back of task pk %s (%s); wrote it "
                      "%s, error class storage_error", f.id, exc, kind)
            return
        landed.dropped.add(claim)
        log.error("the database refused every form of the write-back of task pk %s (%s); "
                  "it runs again when its lease expires", f.id, why)
