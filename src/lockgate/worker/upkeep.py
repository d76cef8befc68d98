"""A worker's upkeep: the write-behind loop that lands results in batches, the
accounting of what landed, the drain at shutdown, and the loop that renews the
leases of held tasks and beats the heartbeat."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence

from lockgate.errors import ErrorClass, StoreError, Streak
from lockgate.states import TaskStatus
from lockgate.store import Finish
from lockgate.worker.core import WorkerCore
from lockgate.worker.writeback import Landed

log = logging.getLogger("lockgate.worker")



class Upkeep(WorkerCore):
    """Writing results back and keeping leases."""

    # -- write-behind ---------------------------------------------------------------

    async def _flush_loop(self) -> None:
        while True:
            if not self._buffer:
                if (self._hard.is_set() and not self._running) or (
                        self._stopping.is_set() and not self._running and not self._ready
                        and self._claim_finished.is_set()):
                    return
                # Nothing to write: sleep until a row arrives or the worker stops (no
                # timed wake-ups while idle).
                self._flush_wake.clear()
                await self._flush_wake.wait()
                continue
            if len(self._buffer) < self.ws.flush_rows and self._running \
                    and not self._stopping.is_set():
                # Let a batch gather while calls are in flight, until a full batch, the
                # last call's end or a stop (each sets the wake-up): a long flush period
                # must not hold a burst run's last results, or a stop, for its length.
                self._flush_wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._flush_wake.wait(), self.ws.flush_interval_s)
            batch = self._buffer[:self.ws.flush_rows]
            del self._buffer[:len(batch)]
            landed = await self._writeback.write(batch, hard_stop=self._hard)
            self._account(landed, batch)
            if landed.unwritten:
                if self._hard.is_set():
                    log.error("stopping now with %d result(s) not written back (the database "
                              "does not answer); their tasks run again when their leases "
                              "expire", len(landed.unwritten) + len(self._buffer))
                    return
                self._buffer[:0] = landed.unwritten
                await self._sleep_hard(landed.retry_in_s)

    def _account(self, landed: Landed, batch: Sequence[Finish]) -> None:
        """Count what a write-back did and let go of the tasks it settled."""
        settled = 0
        for f in batch:
            claim = (f.id, f.lease_token)
            if not landed.settled(claim):
                continue  # not written: back in the buffer
            settled += 1
            self._held.pop(claim, None)
            if claim in landed.dropped:
                continue
            if claim in landed.discarded:
                self.stats.discarded += 1
                continue
            status = landed.replaced.get(claim, f).status
            if status == TaskStatus.SUCCEEDED:
                self.stats.succeeded += 1
            elif status == TaskStatus.PENDING:
                if not f.release_attempt:
                    self.stats.retried += 1
            elif status == TaskStatus.DEAD:
                self.stats.dead += 1
            elif status == TaskStatus.REVIEW:
                self.stats.review += 1
            else:
                self.stats.failed += 1
        if not settled:
            return
        self.stats.flushes += 1
        if not self._held:
            self._held_empty.set()
        self._slot_free.set()  # flushed results no longer count against claiming
        if self._on_progress:
            self._on_progress(self.stats)

    async def _drain(self) -> None:
        """After claiming stopped: give back the tasks kept ready (never called, so no
        attempt is spent), and let in-flight calls finish within the grace period."""
        while self._ready:
            r, _entry = self._ready.popleft()
            self._ready_at.pop((r.id, r.lease_token), None)
            self._taken_over.discard((r.id, r.lease_token))
            self._buffer.append(Finish(
                id=r.id, lease_token=r.lease_token, status=TaskStatus.PENDING,
                error_class=str(ErrorClass.RELEASED_AT_SHUTDOWN),
                error_message="released: worker shut down before calling",
                release_attempt=True))
            self.stats.released += 1
        self._flush_wake.set()
        if self._running and not self._hard_stop:
            # Wait for the calls, the grace period or a second stop request (hard).
            calls = asyncio.ensure_future(asyncio.wait(list(self._running.values())))
            hard = asyncio.ensure_future(self._hard.wait())
            await asyncio.wait({calls, hard}, timeout=self.ws.shutdown_grace_s,
                               return_when=asyncio.FIRST_COMPLETED)
            for f in (calls, hard):
                f.cancel()  # cancels the waiting only, not the calls
            if self._running:
                log.warning("releasing %d in-flight task(s) unfinished at shutdown",
                            len(self._running))
        for t in list(self._running.values()):
            t.cancel()
        while self._running:
            await asyncio.sleep(0.01)
        self._flush_wake.set()

    # -- leases and heartbeat -------------------------------------------------------

    def _counters(self) -> dict[str, int]:
        s = self.stats
        return {"in_flight": len(self._running), "claimed": s.claimed,
                "succeeded": s.succeeded, "failed": s.failed + s.dead, "retried": s.retried,
                "discarded": s.discarded, "conflicts": s.discarded}

    def _say_late_renewal(self, late: float, took: float) -> None:
        """Say that a renewal came later than a lease, and what held it: the database
        (a LOCK TABLE, a long transaction, a slow server) or this worker's event loop
        (work between two awaits: no timer, lease renewal or answer is taken
        meanwhile). Said since the leases it held may have run out."""
        db = self._renew_db_s
        if db >= (late + took) / 2:
            log.warning("renewing the leases took %.1f s, longer than a lease (%gs): "
                        "the database was locked or slow. Tasks whose lease ran out "
                        "meanwhile may be taken by another worker; this worker's late "
                        "results for them are refused", took, self.ws.lease_s)
            return
        log.warning("renewing the leases came %.1f s late, longer than a lease (%gs): "
                    "this worker's event loop was busy (the database took %.1f s of it; "
                    "%d call(s) in flight). Work between two awaits holds up every "
                    "lease: code sharing the worker's event loop, or parsing, checking "
                    "or rendering very large answers or prompts. Tasks whose lease ran "
                    "out meanwhile may be taken by another worker; this worker's late "
                    "results for them are refused", late + took, self.ws.lease_s, db,
                    len(self._running))

    async def _lease_loop(self) -> None:
        renew_every = self.ws.lease_s / 3
        last_beat = time.monotonic()
        renewals = Streak()
        while True:
            pause = min(renew_every, self.ws.heartbeat_s)
            slept = time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=pause)
            # How much later than asked the loop woke this one (a loop held by work
            # between two awaits wakes no timer).
            late = max(0.0, time.monotonic() - slept - pause)
            if self._hard.is_set() or (self._stopping.is_set() and not self._held):
                return
            if self._stopping.is_set():
                await asyncio.sleep(min(renew_every, 0.5))
            try:
                # A task kept ready whose lease another worker holds now (this one was
                # frozen past it) is let go uncalled (``Calls._lapsed``).
                began = time.monotonic()
                await self._renew(self._held.values())
                took = time.monotonic() - began
                if late + took > self.ws.lease_s and self._held:
                    self._say_late_renewal(late, took)
                if time.monotonic() - last_beat >= self.ws.heartbeat_s:
                    last_beat = time.monotonic()
                    asked = self._wall()
                    db_now = await self._db(
                        self.store.heartbeat, self.id,
                        status="stopping" if self._stopping.is_set() else "running",
                        **self._counters())
                    self._set_clock(db_now, asked, self._wall())
                renewals.ok()
            except StoreError as exc:
                log.log(renewals.failed(), "lease renewal / heartbeat failed (%d in a row); "
                        "will retry: %s", renewals.failures, exc)
            except Exception:
                log.exception("lease renewal / heartbeat failed; will retry")
