"""The asyncio worker: claim in batches, call models with thousands of calls in flight,
write results back through a write-behind buffer, renew leases, heartbeat.

Database calls run on a small thread pool (one connection each), so the event loop
only ever waits on HTTP. A crash loses at most the unflushed results, whose leases
then expire and the tasks run again (at-least-once; the re-runs are counted).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Awaitable
from typing import Any

from lockgate.errors import ErrorClass, StoreError
from lockgate.states import TaskStatus
from lockgate.store import Finish
from lockgate.worker import collector
from lockgate.worker.calls import Calls
from lockgate.worker.core import CACHE_SIZE, SideService, WorkerCore, WorkerStats
from lockgate.worker.upkeep import Upkeep

#: How often an idle worker on a database that does not announce new tasks (MySQL,
#: SQLite) looks at the newest task id between its polls (one index read each): every
#: 100 ms at first, then a tenth of the time it has been idle, at most every 500 ms
#: (a worker idle for hours spends about 1 ms of CPU a second on it).
ARRIVAL_LOOK_S = 0.1
ARRIVAL_LOOK_MAX_S = 0.5

#: After a stop at once (a second signal), how long the worker still waits for the
#: database to take its results and released tasks before it gives up on them (they
#: run again when their leases expire).
HARD_STOP_DB_S = 3.0
#: How long a stop at once gives its idle database threads to end before it reports
#: the database as not answering.
DB_THREADS_END_S = 0.5
HARD_STOP_ROUNDS = 3
#: After a stop's grace, how long the worker still waits for a database that does not
#: take what it holds, at most: a lease (past it the tasks are another worker's to take,
#: and a result written later is most likely discarded), and never more than this; then
#: it stops as at a second signal.
STOP_DB_WAIT_MAX_S = 30.0
#: How long past the grace a stopping worker waits before it says that it waits for the
#: database (one that answers takes milliseconds to take what the worker holds).
STOP_DB_QUIET_S = 1.0

log = logging.getLogger("lockgate.worker")


class Worker(Calls, Upkeep):
    """One worker process's engine. ``await run()`` until stopped (or drained in burst).

    Its state and helpers are :class:`~lockgate.worker.core.WorkerCore`'s; the calls
    are :class:`~lockgate.worker.calls.Calls`', the write-back and leases
    :class:`~lockgate.worker.upkeep.Upkeep`'s; here: starting, stopping, signals and
    the claim loop."""

    def request_stop(self, *, hard: bool = False) -> None:
        """Stop claiming; in-flight calls get ``shutdown_grace_s`` (none if ``hard``)."""
        if self._stopping.is_set() and not hard:
            hard = True  # a second signal means: now
        self._hard_stop = self._hard_stop or hard
        if self._hard_stop:
            self._hard.set()
        self._stopping.set()
        self.flow.wake()
        self._slot_free.set()
        self._flush_wake.set()

    # -- main ---------------------------------------------------------------------

    async def run(self) -> WorkerStats:
        """Work until stopped by signal/``request_stop`` (or, in burst mode, until no
        task is PENDING anywhere). Returns the counters. While it runs, the garbage
        collector's young-generation threshold is raised (``gc_threshold``; see
        :mod:`lockgate.worker.collector`)."""
        with collector.raised_threshold(collector.young_threshold(
                self.ws.concurrency, self.ws.gc_threshold)):
            return await self._run()

    async def _run(self) -> WorkerStats:
        for ep in self.settings.endpoints():
            self._provider(ep)  # fail fast on a missing API key
        asked = self._wall()
        db_now = await self._db_retry(
            "registering the worker", self.store.register_worker, self.id,
            hostname=socket.gethostname(), pid=os.getpid(), concurrency=self.ws.concurrency)
        self._set_clock(db_now, asked, self._wall())
        self._install_signals()
        loop = asyncio.get_running_loop()

        def arrived() -> None:  # on the listening thread
            with contextlib.suppress(RuntimeError):  # the loop closed as the worker stopped
                loop.call_soon_threadsafe(self._arrived.set)
        listener = self._listener = self.store.listen_for_tasks(arrived)
        side = [asyncio.create_task(self._flush_loop(), name="lockgate-flush"),
                asyncio.create_task(self._lease_loop(), name="lockgate-lease"),
                asyncio.create_task(self.flow.run(self._stopping), name="lockgate-flow")]
        side += [asyncio.create_task(s.run(self._stopping, self.id), name=f"lockgate-{s.name}")
                 for s in self._services]
        claim = asyncio.create_task(self._claim_loop(), name="lockgate-claim")
        failed = False
        try:
            await self._work(claim, side)
        except BaseException:
            failed = True
            raise
        finally:
            abandoned = self._hard.is_set()  # before the stop below sets it anyway
            self.request_stop(hard=True)
            await self._end([claim, *side, *self._running.values()], abandoned)
            # (settled ones are let go: what is still held was not written back)
            self.stats.unwritten = len(self._held)
            if failed:
                await self._give_back()
            for p in self._providers.values():
                with contextlib.suppress(Exception):
                    await p.close()
            with contextlib.suppress(Exception):
                beat = self._db(self.store.heartbeat, self.id, status="stopped",
                                **self._counters())
                await (asyncio.wait_for(beat, self._hard_left()) if abandoned else beat)
            self._remove_signals()
            if listener is not None:
                listener.stop(timeout_s=0)  # it lets go of its connection within 250 ms
            self._db_threads.shutdown(wait=not abandoned, cancel_futures=abandoned)
            # (a render still running is the one of a call let go: not waited for)
            self._render_threads.shutdown(wait=False, cancel_futures=True)
            if abandoned and await self._db_waiting():
                self.stats.stuck_db = 1
                log.error("stopping now without waiting for the database: it does not "
                          "answer; unwritten results run again when their leases expire")
        return self.stats

    async def _work(self, claim: asyncio.Task[None], side: list[asyncio.Task[Any]]) -> None:
        """Claim until stopped (or drained), then finish: the calls in flight within
        the grace, every result written back. A stop at once (a second signal) waits on
        nothing that needs the database: a hung server (connections open, no answers)
        would hold it for ever."""
        hard = asyncio.ensure_future(self._hard.wait())
        try:
            done, _ = await asyncio.wait([claim, *side, hard],
                                         return_when=asyncio.FIRST_COMPLETED)
        finally:
            hard.cancel()
        for t in done:
            if t is not claim and t is not hard and not self._stopping.is_set():
                t.result()  # a side loop died: raise its error (stops the worker)
                raise RuntimeError(f"{t.get_name()} stopped unexpectedly")
        # A stop that was asked for ends within the grace and a bounded wait for the
        # database (a burst that drained the queue holds nothing more to write).
        watch = (asyncio.ensure_future(self._stop_watch()) if self._stopping.is_set()
                 else None)
        try:
            if not await self._unless_hard(claim):
                return
            self._stopping.set()  # burst drained, or a stop was requested
            self.flow.wake()
            # What it holds is written back before the worker exits, the database
            # waited for until the watch gives up on it (as a second stop request does).
            if await self._unless_hard(self._drain()) and await self._unless_hard(side[0]):
                await self._unless_hard(asyncio.wait_for(
                    asyncio.gather(*side), timeout=self.ws.shutdown_grace_s + 60))
        finally:
            if watch is not None:
                watch.cancel()

    async def _stop_watch(self) -> None:
        """After a stop request: the calls in flight get the grace, then the database
        gets :meth:`_stop_db_wait_s` to take the results and released tasks still held
        (a warning says so); then the stop goes on as at a second signal: their tasks
        run again when their leases expire (a late write-back is fenced off)."""
        await self._sleep_hard(self.ws.shutdown_grace_s + STOP_DB_QUIET_S)
        if self._hard.is_set():
            return
        wait_s = self._stop_db_wait_s()
        log.warning("stopping: %d task(s) still to write back or release wait for the "
                    "database, which does not take them; waiting at most %gs more, then "
                    "they are left to run again when their leases expire (send the "
                    "signal again to stop now)", len(self._held), wait_s)
        await self._sleep_hard(wait_s)
        self.request_stop(hard=True)

    def _stop_db_wait_s(self) -> float:
        """How long a stopping worker waits for a database that does not answer, once
        the grace and :data:`STOP_DB_QUIET_S` are over: a lease (at most
        :data:`STOP_DB_WAIT_MAX_S`) from the grace's end."""
        return max(0.0, min(self.ws.lease_s, STOP_DB_WAIT_MAX_S) - STOP_DB_QUIET_S)

    async def _end(self, tasks: list[asyncio.Task[Any]], abandoned: bool) -> None:
        """Cancel the loops and calls and wait for them to end; after a stop at once,
        not for long."""
        for t in tasks:
            t.cancel()
        # The loops also end on the hard stop: on Python 3.11 ``asyncio.wait_for`` can
        # swallow a cancellation that arrives as its wait ends.
        ended = asyncio.gather(*tasks, return_exceptions=True)
        if not abandoned:
            with contextlib.suppress(Exception):
                await ended
            return
        # A cancellation ends one wait: a loop whose ``finally`` then waits on the hung
        # database is cancelled again (a few rounds, then left to itself).
        for _ in range(HARD_STOP_ROUNDS):
            await asyncio.wait({ended}, timeout=max(0.5, self._hard_left()))
            if ended.done():
                return
            for t in tasks:
                t.cancel()

    async def _unless_hard(self, aw: Awaitable[Any]) -> bool:
        """Await ``aw`` (its error raised); after a stop at once, only until
        :data:`HARD_STOP_DB_S` past it (a database that answers takes milliseconds to
        take the results and the released tasks; a hung one would hold the stop for
        ever). False if it was given up (and cancelled)."""
        task = asyncio.ensure_future(aw)
        if not self._hard.is_set():
            hard = asyncio.ensure_future(self._hard.wait())
            try:
                await asyncio.wait({task, hard}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                hard.cancel()
        if not task.done():
            await asyncio.wait({task}, timeout=self._hard_left())
        if not task.done():
            task.cancel()
            return False
        task.result()
        return True

    def _hard_left(self) -> float:
        """Seconds left of :data:`HARD_STOP_DB_S` since the stop at once (it starts
        counting at the first call)."""
        if self._hard_by is None:
            self._hard_by = time.monotonic() + HARD_STOP_DB_S
        return max(0.0, self._hard_by - time.monotonic())

    async def _db_waiting(self) -> bool:
        """Whether one of this worker's database threads is still in a call that does
        not return, after a moment for those just told to end (they were idle or
        finishing a call of milliseconds: looked at at once, they were still alive, and
        a healthy database was reported as not answering)."""
        until = time.monotonic() + max(DB_THREADS_END_S, self._hard_left())
        while True:
            alive = [t for t in threading.enumerate()
                     if t.name.startswith(self._db_prefix) and t.is_alive()]
            if not alive or time.monotonic() >= until:
                return bool(alive)
            await asyncio.sleep(0.01)

    async def _give_back(self) -> None:
        """After a loop died: write back what is buffered and release every other lease
        held here (no attempt spent), in one try, so that other workers take the tasks
        now rather than when the leases expire."""
        buffered = {(f.id, f.lease_token) for f in self._buffer}
        batch = self._buffer + [
            Finish(id=t.id, lease_token=t.lease_token, status=TaskStatus.PENDING,
                   error_class=str(ErrorClass.RELEASED_AT_SHUTDOWN),
                   error_message="released: the worker stopped on an internal error",
                   # a call already sent keeps its attempt: a lost lease (Calls._execute)
                   release_attempt=claim not in self._sent)
            for claim, t in self._held.items() if claim not in buffered]
        self._buffer = []
        if not batch:
            return
        with contextlib.suppress(Exception):
            landed = await self._writeback.write(batch, hard_stop=self._hard)
            log.error("the worker stopped on an internal error; %d task(s) written back or "
                      "released, %d left to their leases", len(batch) - len(landed.unwritten),
                      len(landed.unwritten))

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, self._signalled, sig)
        # Those that came before (from here on the loop takes them): acted on now;
        # whoever noted them has passed them on already.
        early, self.early_signals = self.early_signals, []
        for signum in early:
            self._signalled(signum, pass_on=False)

    def _signalled(self, sig: int, *, pass_on: bool = True) -> None:
        if not self._stopping.is_set():
            log.warning("stopping: no new tasks; finishing %d call(s) in flight within "
                        "%gs (send the signal again, e.g. Ctrl-C, to stop now)",
                        len(self._running), self.ws.shutdown_grace_s)
        elif not self._hard_stop:
            log.warning("stopping now: %d call(s) in flight are given back unfinished",
                        len(self._running))
        self.request_stop()
        if pass_on and self.on_signal is not None:
            self.on_signal(sig)

    def _remove_signals(self) -> None:
        with contextlib.suppress(Exception):
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    # -- claiming -----------------------------------------------------------------

    async def _claim_loop(self) -> None:
        try:
            await self._claim_until_stopped()
        finally:
            self._claim_finished.set()
            self._flush_wake.set()

    async def _claim_until_stopped(self) -> None:
        idle = 0.01
        failures = 0
        while not self._stopping.is_set():
            # Back-pressure: results that wait for their write-back still hold a lease;
            # if flushing stalls (database down), stop claiming once a flush's worth
            # of them has piled up beyond the calls in flight and the tasks kept ready.
            places = self.ws.concurrency + self._prefetch
            room = self.flow.claim_room(min(
                places - len(self._running) - len(self._ready),
                places + self.ws.flush_rows - len(self._held)))
            threshold = self.flow.claim_threshold(
                max(1, min(self.ws.claim_batch, self.ws.concurrency) // 4))
            if room < threshold:
                # Wake when enough calls have ended to make a claim worth it (not at
                # every one of them), or when a flush or the flow controller may have
                # changed the room.
                self._ended = 0
                self._wake_after = threshold - room
                self._slot_free.clear()
                await self._slot_free.wait()
                continue
            probing = self._unroutable_streak > 0
            if probing and not self._sent:
                # Since its last call this worker only handed tasks back uncalled (their
                # endpoint is not in its config), and no call is under way: until its
                # next call it claims one task at a time, each after twice the longest
                # idle poll, so that an idle worker that has the endpoint looks at least
                # once in between and wins the race for them (claiming as usual, this
                # one would win every race and take them away in batches).
                await self._sleep(2 * self.ws.poll_max_s)
                if self._stopping.is_set():
                    break
            # Word of tasks that arrives from here on wakes the idle sleep below.
            self._arrived.clear()
            asked = time.monotonic()
            try:
                rows = await self.flow.claim(
                    1 if probing else min(room, self.ws.claim_batch),
                    lease_ms=self._lease_ms, worker_id=self.id)
                failures = 0
            except StoreError as exc:  # the database is down or refuses: wait for it
                failures += 1
                (log.warning if failures <= 3 or failures % 10 == 0 else log.debug)(
                    "claim failed (%d in a row); retrying: %s", failures, exc)
                await self._sleep(min(5.0, 0.1 * 2 ** failures))
                continue
            except Exception:
                failures += 1
                log.exception("claim failed (%d in a row); retrying", failures)
                await self._sleep(min(5.0, 0.1 * 2 ** failures))
                continue
            if rows:
                idle = 0.01
                self._idle_since = time.monotonic()  # (the streak to come starts here)
                self.stats.claims += 1
                await self._start(rows, asked)
                continue
            if await self._queue_drained():
                return
            self._held_empty.clear()
            if self.burst and self._held:
                # The queue looks empty but calls still run: look again as soon as the
                # last of them is written back, not after a poll interval.
                await self._idle(idle, self._held_empty, self._arrived)
            else:
                await self._idle(idle, self._arrived)
            idle = min(self.ws.poll_max_s, idle * 2)

    async def _idle(self, seconds: float, *wake: asyncio.Event) -> None:
        """An idle claim loop's sleep. Where submits announce their tasks (PostgreSQL)
        the word wakes it (``_arrived``); elsewhere it looks at the newest task id every
        :data:`ARRIVAL_LOOK_S` and wakes when it grew (a new task may be claimable)."""
        if self.store.dialect.announces_tasks or seconds <= ARRIVAL_LOOK_S:
            await self._sleep(seconds, *wake)
            return
        now = time.monotonic()
        end = now + seconds
        every = min(ARRIVAL_LOOK_MAX_S, max(ARRIVAL_LOOK_S, (now - self._idle_since) / 10))
        while True:
            try:
                newest = await self._db(self.store.newest_task_id)
            except StoreError:
                newest = self._newest  # the claim loop's own retries say what is wrong
            if newest > self._newest:
                self._newest = newest
                return
            left = end - time.monotonic()
            if left <= 0 or self._stopping.is_set() or any(e.is_set() for e in wake):
                return
            await self._sleep(min(every, left), *wake)

    async def _queue_drained(self) -> bool:
        """Burst mode ends when nothing is held here and nothing is PENDING anywhere (in
        its pool, for a worker that serves one: the others' tasks are not its work)."""
        if not self.burst or self._held:
            return False
        pending, _next, _now = await self._db_retry("reading the queue", self.store.queue_state,
                                                    self.ws.pool)
        if pending or self._held:
            return False
        for s in self._services:
            if await s.busy():
                return False
        return True

    async def _sleep(self, seconds: float, *wake: asyncio.Event) -> None:
        """Sleep until ``seconds`` pass, the worker stops or one of ``wake`` is set."""
        if not wake:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=seconds)
            return
        waits = [asyncio.ensure_future(e.wait()) for e in (self._stopping, *wake)]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()


__all__ = ["CACHE_SIZE", "SideService", "Worker", "WorkerCore", "WorkerStats"]
