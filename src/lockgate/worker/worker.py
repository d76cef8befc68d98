"""The asyncio worker: claim in batches, call models with thousands of calls in flight,
write results back through a write-behind buffer, renew leases, heartbeat.

Database calls run on a small thread pool (one connection each), so the event loop
only ever waits on HTTP. A crash loses at most the unflushed results, whose leases
then expire and the tasks run again (at-least-once; the re-runs are counted).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import os
import random
import secrets
import signal
import socket
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import orjson
from cachetools import LRUCache

from lockgate import runtime
from lockgate.config import Endpoint, Settings, WorkerSettings
from lockgate.errors import ConfigError, ErrorClass, LockgateError, StoreError
from lockgate.flow.control import FlowControl
from lockgate.providers.base import Provider
from lockgate.providers.openai import OpenAICompatible
from lockgate.quality import quality_observer
from lockgate.registry.resolver import Entry, Fixed, PromptResolver, load
from lockgate.spec import TaskConfig
from lockgate.states import TaskStatus
from lockgate.store import ClaimedTask, Finish, Store
from lockgate.store.flow import FlowStore
from lockgate.worker import collector
from lockgate.worker.execute import (
    AttemptResult,
    Decision,
    attempt_trace,
    decide,
    idempotency_key,
    provider_params,
    run_attempt,
)
from lockgate.worker.writeback import Landed, WriteBack

log = logging.getLogger("lockgate.worker")
T = TypeVar("T")

#: Configs, routes and sampling parameters kept per process. Each can be rebuilt from
#: the database, so the bound only caps memory: in the OpenAI batch format every task
#: has a config of its own.
CACHE_SIZE = 4096


@dataclass
class WorkerStats:
    """Counters a worker keeps and reports in its heartbeat row."""

    claimed: int = 0
    succeeded: int = 0
    failed: int = 0
    dead: int = 0
    retried: int = 0
    discarded: int = 0
    released: int = 0
    claims: int = 0
    flushes: int = 0

    @property
    def finished(self) -> int:
        return self.succeeded + self.failed + self.dead


def _uncalled(t: ClaimedTask, started: int, status: TaskStatus, error_class: ErrorClass,
              message: str, detail: str) -> Finish:
    """A terminal write-back for a task that ends before any call is made; ``detail`` is
    the attempt row's message, ``message`` the task's."""
    return Finish(id=t.id, lease_token=t.lease_token, status=status,
                  error_class=str(error_class), error_message=message,
                  attempt={"attempt": t.attempt, "outcome": str(status).lower(),
                           "started_at": started, "error_message": detail,
                           "error_class": str(error_class)})


class SideService(Protocol):
    """Something a worker runs beside its loops and stops with it (e.g. the release
    gate's roles). ``run`` returns soon after ``stopping`` is set; an exception from it
    stops the worker. In burst mode the worker keeps going while a service is ``busy``."""

    name: str

    async def run(self, stopping: asyncio.Event, worker_id: str) -> None: ...

    async def busy(self) -> bool: ...


class Worker:
    """One worker process's engine. ``await run()`` until stopped (or drained in burst)."""

    def __init__(self, store: Store, settings: Settings | None = None, *,
                 burst: bool = False, worker_id: str | None = None,
                 providers: dict[str, Provider] | None = None,
                 on_progress: Callable[[WorkerStats], None] | None = None,
                 services: Sequence[SideService] = (),
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.settings = settings or Settings()
        self.ws: WorkerSettings = self.settings.worker
        self.burst = burst
        self.id = worker_id or f"{socket.gethostname()[:40]}-{os.getpid()}-{secrets.token_hex(3)}"
        self.stats = WorkerStats()
        self._providers: dict[str, Provider] = dict(providers or {})
        self._on_progress = on_progress
        self._configs: LRUCache[str, Entry] = LRUCache(CACHE_SIZE)
        self._routes: LRUCache[str, tuple[Endpoint, Provider, dict[str, Any]]] = \
            LRUCache(CACHE_SIZE)
        self._fb_params: LRUCache[tuple[str, str], dict[str, Any]] = LRUCache(CACHE_SIZE)
        self._prompts = PromptResolver(store, refresh_s=self.settings.gate.refresh_s)
        self._services = list(services)
        #: Keyed by claim (task pk, lease token): a task whose lease ran out here may be
        #: re-claimed by this same worker while its first call still runs.
        self._held: dict[tuple[int, str], ClaimedTask] = {}
        self._running: dict[tuple[int, str], asyncio.Task[None]] = {}
        #: Claimed, held and not started yet: each starts the moment a call ends, so
        #: the calls in flight stay at ``concurrency`` while the next claim is made.
        self._ready: collections.deque[tuple[ClaimedTask, Entry]] = collections.deque()
        self._prefetch = self.ws.prefetch if self.ws.prefetch is not None else min(
            self.ws.claim_batch, self.ws.concurrency // 4)
        self._buffer: list[Finish] = []
        self._flush_wake = asyncio.Event()
        self._slot_free = asyncio.Event()
        self._ended = 0  # calls ended since the claim loop went to sleep
        self._wake_after = 1  # ... and how many it waits for
        #: Set when the last held task's result is written back (burst mode's end).
        self._held_empty = asyncio.Event()
        self._stopping = asyncio.Event()
        self._claim_finished = asyncio.Event()
        self._hard = asyncio.Event()
        self._hard_stop = False
        self._rng = random.Random(secrets.randbits(64))
        self._db_threads = ThreadPoolExecutor(max_workers=3, thread_name_prefix="lockgate-db")
        #: Called with each SIGTERM/SIGINT this worker receives while it runs, after it
        #: has acted on it (a supervisor that is also a worker forwards it on).
        self.on_signal: Callable[[int], None] | None = None
        self._lease_ms = int(self.ws.lease_s * 1000)
        #: The database clock minus this machine's, in ms (measured at registration and
        #: at every heartbeat): attempt times are stored on the database clock, which
        #: retention and failure rates compare them with.
        self._clock_offset_ms = 0
        self._wall = wall_clock
        self._writeback = WriteBack(store, self.id, db=self._db, observe=quality_observer(
            store, self.settings, self.id))
        #: Rate limits, pauses, adaptive concurrency, breakers, fair share (docs/flow.md).
        self.flow = FlowControl(FlowStore(store), self.settings, self.id, db=self._db,
                                provider=self._provider)

    # -- helpers ------------------------------------------------------------------

    async def _db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._db_threads, lambda: fn(*args, **kwargs))

    async def _db_retry(self, what: str, fn: Callable[..., T], *args: Any,
                        **kwargs: Any) -> T:
        """``fn`` on a database thread, tried again with back-off for as long as the
        database fails (unreachable, restarting, locked), until a hard stop. A worker
        never exits on a database error: it waits for the database."""
        failures = 0
        while True:
            try:
                return await self._db(fn, *args, **kwargs)
            except StoreError as exc:
                failures += 1
                if self._hard.is_set():
                    raise
                delay = min(5.0, 0.05 * 2 ** failures)
                (log.warning if failures <= 3 or failures % 10 == 0 else log.debug)(
                    "%s failed (%d in a row), retrying in %.1fs: %s", what, failures,
                    delay, exc)
                await self._sleep_hard(delay)

    async def _sleep_hard(self, seconds: float) -> None:
        """Sleep ``seconds`` or until a hard stop."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._hard.wait(), timeout=seconds)

    def _now_ms(self) -> int:
        """Now on the database clock, in ms (this machine's clock plus the offset)."""
        return int(self._wall() * 1000) + self._clock_offset_ms

    def _set_clock(self, db_now_ms: int, asked_at: float, answered_at: float) -> None:
        self._clock_offset_ms = db_now_ms - int((asked_at + answered_at) * 500)

    def _provider(self, ep: Endpoint) -> Provider:
        p = self._providers.get(ep.name)
        if p is None:
            p = OpenAICompatible(ep.name, ep.base_url, api_key=ep.api_key(),
                                 max_connections=min(ep.max_concurrency, self.ws.concurrency),
                                 send_idempotency_key=ep.send_idempotency_key,
                                 headers=ep.headers, http_client=self.ws.http_client)
            self._providers[ep.name] = p
        return p

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
        side = [asyncio.create_task(self._flush_loop(), name="lockgate-flush"),
                asyncio.create_task(self._lease_loop(), name="lockgate-lease"),
                asyncio.create_task(self.flow.run(self._stopping), name="lockgate-flow")]
        side += [asyncio.create_task(s.run(self._stopping, self.id), name=f"lockgate-{s.name}")
                 for s in self._services]
        claim = asyncio.create_task(self._claim_loop(), name="lockgate-claim")
        failed = False
        try:
            done, _ = await asyncio.wait([claim, *side], return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                if t is not claim and not self._stopping.is_set():
                    t.result()  # a side loop died: raise its error (stops the worker)
                    raise RuntimeError(f"{t.get_name()} stopped unexpectedly")
            await claim
            self._stopping.set()  # burst drained, or a stop was requested
            self.flow.wake()
            await self._drain()
            # Every result is written back before the worker exits, however long the
            # database takes to come back (a second stop request gives up on them).
            await side[0]
            await asyncio.wait_for(asyncio.gather(*side), timeout=self.ws.shutdown_grace_s + 60)
        except BaseException:
            failed = True
            raise
        finally:
            self.request_stop(hard=True)
            calls = list(self._running.values())
            for t in [claim, *side, *calls]:
                t.cancel()
            # The loops also end on the hard stop: on Python 3.11 ``asyncio.wait_for``
            # can swallow a cancellation that arrives as its wait ends.
            with contextlib.suppress(Exception):
                await asyncio.gather(claim, *side, *calls, return_exceptions=True)
            if failed:
                await self._give_back()
            for p in self._providers.values():
                with contextlib.suppress(Exception):
                    await p.close()
            with contextlib.suppress(Exception):
                await self._db(self.store.heartbeat, self.id, status="stopped",
                               **self._counters())
            self._remove_signals()
            self._db_threads.shutdown(wait=True)
        return self.stats

    async def _give_back(self) -> None:
        """After a loop died: write back what is buffered and release every other lease
        held here (no attempt spent), in one try, so that other workers take the tasks
        now rather than when the leases expire."""
        buffered = {(f.id, f.lease_token) for f in self._buffer}
        batch = self._buffer + [
            Finish(id=t.id, lease_token=t.lease_token, status=TaskStatus.PENDING,
                   error_class=str(ErrorClass.RELEASED_AT_SHUTDOWN),
                   error_message="released: the worker stopped on an internal error",
                   release_attempt=True)
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

    def _signalled(self, sig: int) -> None:
        if not self._stopping.is_set():
            log.warning("stopping: no new tasks; finishing %d call(s) in flight within "
                        "%gs (send the signal again, e.g. Ctrl-C, to stop now)",
                        len(self._running), self.ws.shutdown_grace_s)
        elif not self._hard_stop:
            log.warning("stopping now: %d call(s) in flight are given back unfinished",
                        len(self._running))
        self.request_stop()
        if self.on_signal is not None:
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
            try:
                rows = await self.flow.claim(min(room, self.ws.claim_batch),
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
                self.stats.claims += 1
                await self._start(rows)
                continue
            if await self._queue_drained():
                return
            self._held_empty.clear()
            if self.burst and self._held:
                # The queue looks empty but calls still run: look again as soon as the
                # last of them is written back, not after a poll interval.
                await self._sleep(idle, self._held_empty)
            else:
                await self._sleep(idle)
            idle = min(self.ws.poll_max_s, idle * 2)

    async def _queue_drained(self) -> bool:
        """Burst mode ends when nothing is held here and nothing is PENDING anywhere."""
        if not self.burst or self._held:
            return False
        pending, _next, _now = await self._db_retry("reading the queue", self.store.queue_state)
        if pending or self._held:
            return False
        for s in self._services:
            if await s.busy():
                return False
        return True

    async def _sleep(self, seconds: float, wake: asyncio.Event | None = None) -> None:
        """Sleep until ``seconds`` pass, the worker stops or ``wake`` is set."""
        if wake is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=seconds)
            return
        waits = [asyncio.ensure_future(e.wait()) for e in (self._stopping, wake)]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def _start(self, rows: list[ClaimedTask]) -> None:
        self.stats.claimed += len(rows)
        for r in rows:  # held (and renewed) from now on, whatever happens next
            self._held[r.id, r.lease_token] = r
        entries = {h: e for h in {r.config_hash for r in rows}
                   if (e := self._configs.get(h)) is not None}
        missing = {r.config_hash for r in rows} - entries.keys()
        if missing:
            docs = await self._db_retry("reading task configs", self.store.configs, missing)
            for h, doc in docs.items():
                entries[h] = self._configs[h] = load(h, doc)
        for r in rows:
            entry = entries[r.config_hash]
            if len(self._running) < self.ws.concurrency:
                self._launch(r, entry)
            else:
                self._ready.append((r, entry))

    def _launch(self, t: ClaimedTask, entry: Entry) -> None:
        self._running[t.id, t.lease_token] = asyncio.create_task(self._execute(t, entry))

    async def _execute(self, t: ClaimedTask, entry: Entry) -> None:
        started = self._now_ms()
        try:
            finish = await self._attempt(t, entry, started)
        except asyncio.CancelledError:
            # Shutdown ran out of grace: give the task back without spending an attempt.
            finish = Finish(id=t.id, lease_token=t.lease_token, status=TaskStatus.PENDING,
                            error_class=str(ErrorClass.RELEASED_AT_SHUTDOWN),
                            error_message="released: worker shut down mid-call",
                            release_attempt=True,
                            attempt={"attempt": t.attempt, "outcome": "released",
                                     "started_at": started,
                                     "error_class": str(ErrorClass.RELEASED_AT_SHUTDOWN)})
            self.stats.released += 1
        except Exception as exc:  # a bug must not lose the task: retry it later
            log.exception("internal error executing task %s", t.task_id)
            finish = Finish(id=t.id, lease_token=t.lease_token, status=TaskStatus.PENDING,
                            error_class=str(ErrorClass.INTERNAL_ERROR),
                            error_message=f"{type(exc).__name__}: {exc}"[:2000],
                            delay_ms=5000,
                            attempt={"attempt": t.attempt, "outcome": "retry",
                                     "started_at": started,
                                     "error_class": str(ErrorClass.INTERNAL_ERROR)})
        self._buffer.append(finish)
        self._running.pop((t.id, t.lease_token), None)
        if self._ready and not self._stopping.is_set():
            self._launch(*self._ready.popleft())
        self._ended += 1
        if self._ended >= self._wake_after:
            self._slot_free.set()
        if len(self._buffer) == 1 or len(self._buffer) >= self.ws.flush_rows:
            self._flush_wake.set()  # the first row to write (the loop sleeps till then)

    async def _attempt(self, t: ClaimedTask, entry: Entry, started: int) -> Finish:
        if isinstance(entry, Fixed):  # no coroutine for the common case
            config, prompt_version = entry.config, entry.version
        else:
            try:
                config, prompt_version = await self._prompts.resolve(
                    entry, functools.partial(self._db_retry, "reading the prompt registry"))
            except LockgateError as exc:  # a registry reference that names nothing
                return _uncalled(t, started, TaskStatus.FAILED, ErrorClass.INVALID_REQUEST,
                                 f"prompt registry: {exc}", str(exc))
        model_path = config.delivery_rule.pydantic_model
        if model_path and not runtime.model_allowed(model_path,
                                                    self.settings.runtime.model_modules):
            msg = (f"delivery_rule.pydantic_model {model_path!r} is not in a module listed "
                   "under [runtime] model_modules; this worker does not import it")
            return _uncalled(t, started, TaskStatus.FAILED, ErrorClass.INVALID_REQUEST, msg,
                             msg)
        policy = config.retry_policy
        if t.attempt > policy.max_retries + 1:
            # Earlier claims were lost (crashed workers) and spent the attempt budget.
            msg = f"attempt {t.attempt} exceeds max_retries+1 after lost leases"
            return _uncalled(t, started, TaskStatus.DEAD, ErrorClass.LEASE_EXPIRED, msg, msg)
        route_key = t.config_hash if prompt_version is None else \
            f"{t.config_hash}@{prompt_version}"
        route = self._routes.get(route_key)
        if route is None:
            try:
                endpoint = self.settings.route(config.model)
                route = (endpoint, self._provider(endpoint),
                         provider_params(config, endpoint, self.id))
            except ConfigError as exc:  # not retryable: the operator must fix the config
                return _uncalled(t, started, TaskStatus.FAILED, ErrorClass.INVALID_REQUEST,
                                 f"configuration: {exc}", str(exc))
            self._routes[route_key] = route
        endpoint, _provider, params = route
        input_data = orjson.loads(t.input_data)
        key = idempotency_key(t.task_id, t.lease_token, t.attempt)

        def call(ep: Endpoint, provider: Provider) -> Coroutine[Any, Any, AttemptResult]:
            # The flow controller picks the endpoint (the primary, or its fallback; its
            # own copy of the settings, so compared by name). A plain function: the
            # coroutine it returns is awaited directly, one frame fewer to resume at
            # every step of the HTTP call.
            return run_attempt(config, input_data, ep, provider,
                               idempotency_key=key,
                               params=params if ep.name == endpoint.name else
                               self._fallback_params(route_key, config, ep))

        res, passage = await self.flow.call(t, config, endpoint, call)
        d = decide(config, t.attempt, res, self._rng)
        unspent = passage.unspent is not None
        if unspent:  # not the task's fault (e.g. refused before any work, a fallback
            # takes it at once): retried without spending an attempt
            d = Decision(TaskStatus.PENDING, None, passage.delay_ms, str(passage.unspent))
        parsed = res.parsed
        c = res.completion
        trace = attempt_trace(t.attempt, started, res, d.outcome,
                              store_snapshot=self.ws.store_snapshots,
                              prompt_version=prompt_version)
        trace["routed_from"] = passage.routed_from
        return Finish(
            id=t.id, lease_token=t.lease_token, status=d.status, result=d.result,
            parse_status=str(parsed.status) if parsed else None,
            error_class=str(res.error_class) if res.error_class else None,
            error_message=(res.error_message or "")[:2000] or None,
            delay_ms=d.delay_ms, release_attempt=unspent, attempt=trace,
            model=c.model if c else res.model, input_tokens=c.prompt_tokens if c else None,
            output_tokens=c.completion_tokens if c else None,
            latency_ms=round(res.latency_ms, 3), http_status=res.http_status,
            request_id=res.request_id, response=res.response_body)

    def _fallback_params(self, route_key: str, config: TaskConfig,
                         ep: Endpoint) -> dict[str, Any]:
        key = (route_key, ep.name)
        params = self._fb_params.get(key)
        if params is None:
            params = self._fb_params[key] = provider_params(config, ep, self.id)
        return params

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
            if len(self._buffer) < self.ws.flush_rows and not self._stopping.is_set():
                await asyncio.sleep(self.ws.flush_interval_s)  # let a batch gather
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

    async def _lease_loop(self) -> None:
        renew_every = self.ws.lease_s / 3
        last_beat = time.monotonic()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=min(
                    renew_every, self.ws.heartbeat_s))
            if self._hard.is_set() or (self._stopping.is_set() and not self._held):
                return
            if self._stopping.is_set():
                await asyncio.sleep(min(renew_every, 0.5))
            held: dict[str, list[int]] = {}
            for t in self._held.values():
                held.setdefault(t.lease_token, []).append(t.id)
            try:
                if held:
                    await self._db(self.store.renew, held, lease_ms=self._lease_ms)
                if time.monotonic() - last_beat >= self.ws.heartbeat_s:
                    last_beat = time.monotonic()
                    asked = self._wall()
                    db_now = await self._db(
                        self.store.heartbeat, self.id,
                        status="stopping" if self._stopping.is_set() else "running",
                        **self._counters())
                    self._set_clock(db_now, asked, self._wall())
            except StoreError as exc:
                log.warning("lease renewal / heartbeat failed; will retry: %s", exc)
            except Exception:
                log.exception("lease renewal / heartbeat failed; will retry")
