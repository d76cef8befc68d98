"""A worker's state and the helpers every part of it uses: database calls on the
worker's own threads (retried while the database is away), the database clock,
providers by endpoint. :class:`Worker` is this state with its parts mixed in: the
calls (:mod:`lockgate.worker.calls`) and the write-behind and lease upkeep
(:mod:`lockgate.worker.upkeep`)."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import random
import secrets
import socket
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from cachetools import LRUCache

from lockgate.config import Endpoint, Settings, WorkerSettings
from lockgate.errors import StoreError, Streak
from lockgate.flow.control import FlowControl
from lockgate.providers.base import Provider
from lockgate.providers.openai import OpenAICompatible
from lockgate.quality import quality_observer
from lockgate.quality.circuit import CircuitRouter
from lockgate.registry.resolver import Entry, PromptResolver
from lockgate.store import ClaimedTask, Finish, Store
from lockgate.store.arrivals import ArrivalListener
from lockgate.store.failures import is_permanent
from lockgate.store.flow import FlowStore
from lockgate.worker.writeback import WriteBack

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
    #: Tasks held for review by an open completeness circuit (not finished).
    review: int = 0
    #: Tasks kept ready whose lease ran out unrenewed (a frozen worker): let go uncalled.
    lapsed: int = 0
    #: Admitted calls sent back to resolve again: their prompt's version was replaced
    #: (a rollback, an activation) while they waited for admission.
    version_moves: int = 0
    #: Tasks handed back uncalled, their attempt not spent: their endpoint is not in
    #: this worker's config (a rolling config change; another worker takes them).
    unroutable: int = 0
    claims: int = 0
    flushes: int = 0
    #: Stopped at once (a second signal) while database calls did not answer (a hung
    #: server): the threads still waiting on them would hold the process at its exit,
    #: so a command-line process ends without them (:func:`exit_if_stuck`). Summed
    #: over processes: how many stopped so.
    stuck_db: int = 0
    #: Results and released tasks still held when the worker stopped: their write-back
    #: did not land (the database did not answer); the tasks run again when their
    #: leases expire.
    unwritten: int = 0

    @property
    def finished(self) -> int:
        return self.succeeded + self.failed + self.dead


def exit_if_stuck(stats: WorkerStats, code: int = 0) -> None:
    """End this process now (``code``) if its worker stopped at once while database
    calls did not answer: their threads would hold it at its exit for as long as the
    server hangs. For command-line processes only (a program of its own that runs a
    worker decides for itself)."""
    if not stats.stuck_db:
        return
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


class SideService(Protocol):
    """Something a worker runs beside its loops and stops with it (e.g. the release
    gate's roles). ``run`` returns soon after ``stopping`` is set; an exception from it
    stops the worker. In burst mode the worker keeps going while a service is ``busy``."""

    name: str

    async def run(self, stopping: asyncio.Event, worker_id: str) -> None: ...

    async def busy(self) -> bool: ...


class WorkerCore:
    """One worker process's state (see :class:`lockgate.worker.Worker`)."""


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
        #: The completeness circuits' states, read every few seconds (docs/quality.md).
        self._circuits = CircuitRouter(store, self.settings.quality)
        #: Circuits' fallback versions found missing, and when (monotonic seconds).
        self._missing_fallbacks: dict[str, float] = {}
        #: (circuit prompt, fallback version) pairs whose version could not render a
        #: task of the path: warned once each.
        self._unrenderable_warned: set[tuple[str, str]] = set()
        self._services = list(services)
        #: Keyed by claim (task pk, lease token): a task whose lease ran out here may be
        #: re-claimed by this same worker while its first call still runs.
        self._held: dict[tuple[int, str], ClaimedTask] = {}
        self._running: dict[tuple[int, str], asyncio.Task[None]] = {}
        #: The claims running whose request went to the provider (or is going now): one
        #: given back at shutdown keeps its attempt (a lost lease, not a free retry).
        self._sent: set[tuple[int, str]] = set()
        #: Per endpoint missing from this worker's config: when it was last warned of
        #: (monotonic seconds) and the tasks handed back since.
        self._unroutable_warned: dict[str, tuple[float, int]] = {}
        #: Per endpoint: when this worker looked (monotonic seconds) and whether a worker
        #: with it in its config was alive lately (:meth:`Calls._endpoint_seen`).
        self._endpoints_seen: dict[str, tuple[float, bool]] = {}
        #: Tasks handed back for an endpoint this worker lacks since its last call: its
        #: claim loop then claims one task at a time, slowly (``Worker``).
        self._unroutable_streak = 0
        #: Claimed, held and not started yet: each starts the moment a call ends, so
        #: the calls in flight stay at ``concurrency`` while the next claim is made.
        self._ready: collections.deque[tuple[ClaimedTask, Entry]] = collections.deque()
        #: When the lease of each task not yet started was last known good: when its
        #: claim was sent, or the last renewal that renewed it began (monotonic
        #: seconds); a task whose lease ran out since is not called
        #: (:meth:`Calls._lapsed`).
        self._ready_at: dict[tuple[int, str], float] = {}
        #: Seconds the last lease renewal spent on the database (``_renew``).
        self._renew_db_s = 0.0
        #: Tasks kept ready that a renewal found held by another worker now.
        self._taken_over: set[tuple[int, str]] = set()
        self._prefetch = self.ws.prefetch if self.ws.prefetch is not None else min(
            self.ws.claim_batch, self.ws.concurrency // 4)
        self._buffer: list[Finish] = []
        self._flush_wake = asyncio.Event()
        self._slot_free = asyncio.Event()
        self._ended = 0  # calls ended since the claim loop went to sleep
        self._wake_after = 1  # ... and how many it waits for
        #: Set when the last held task's result is written back (burst mode's end).
        self._held_empty = asyncio.Event()
        #: Set when a submit announced tasks (PostgreSQL): an idle claim loop wakes.
        self._arrived = asyncio.Event()
        self._listener: ArrivalListener | None = None
        #: The newest task id an idle look saw (databases without announcements), and
        #: when the claim loop last got tasks (its idle streak began after it).
        self._newest = 0
        self._idle_since = time.monotonic()
        self._stopping = asyncio.Event()
        self._claim_finished = asyncio.Event()
        self._hard = asyncio.Event()
        self._hard_stop = False
        #: When a stop at once gives up waiting on the database (monotonic; None: no
        #: such stop yet).
        self._hard_by: float | None = None
        self._rng = random.Random(secrets.randbits(64))
        #: Named for this worker: a stop at once looks at its own threads only.
        self._db_prefix = f"lockgate-db-{secrets.token_hex(4)}"
        self._db_threads = ThreadPoolExecutor(max_workers=3,
                                              thread_name_prefix=self._db_prefix)
        #: Renders a large input off the event loop (condensing takes about a second
        #: per MB; ``execute.renders_slowly``): one thread, started at the first such
        #: input, so that a worker of small prompts never starts it.
        self._render_threads = ThreadPoolExecutor(max_workers=1,
                                                  thread_name_prefix="lockgate-render")
        #: Called with each SIGTERM/SIGINT this worker receives while it runs, after it
        #: has acted on it (a supervisor that is also a worker forwards it on).
        self.on_signal: Callable[[int], None] | None = None
        #: Signals received before its event loop could take them (noted by a
        #: supervisor's handler): acted on as it starts, not passed to ``on_signal``.
        self.early_signals: list[int] = []
        self._lease_ms = int(self.ws.lease_s * 1000)
        #: The database clock minus this machine's, in ms (measured at registration and
        #: at every heartbeat): attempt times are stored on the database clock, which
        #: retention and failure rates compare them with.
        self._clock_offset_ms = 0
        self._wall = wall_clock
        self._writeback = WriteBack(store, self.id, db=self._db, observe=quality_observer(
            store, self.settings, self.id, known=self._held.get))
        #: Rate limits, pauses, adaptive concurrency, breakers, fair share (docs/flow.md).
        self.flow = FlowControl(FlowStore(store), self.settings, self.id, db=self._db,
                                provider=self._provider)

    # -- helpers ------------------------------------------------------------------

    async def _db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._db_threads, lambda: fn(*args, **kwargs))

    async def _renew(self, tasks: Iterable[ClaimedTask], *, retry: str | None = None
                     ) -> None:
        """Renew the leases of ``tasks`` (one try; with ``retry`` naming the work, tried
        again for as long as the database fails). Of those not started yet, the ones
        held no more (another worker took them over) are marked so, and
        :meth:`Calls._lapsed` lets them go uncalled; the others' leases run from this
        renewal's sending (only those it renewed: a task claimed meanwhile keeps its
        claim's time)."""
        held: dict[str, list[int]] = {}
        for t in tasks:
            held.setdefault(t.lease_token, []).append(t.id)
        if not held:
            return
        began = time.monotonic()
        lease_ms = self._lease_ms
        ended: list[float] = []

        def renew(held: dict[str, list[int]], *, lease_ms: int) -> set[tuple[int, str]]:
            try:
                return self.store.renew_leases(held, lease_ms=lease_ms)
            finally:
                ended.append(time.monotonic())

        try:
            lost = await (self._db_retry(retry, renew, held, lease_ms=lease_ms) if retry
                          else self._db(renew, held, lease_ms=lease_ms))
        finally:
            # What the database took (its threads' queue included), apart from the
            # event loop's delay in taking the answer: the lease loop's warning says
            # which of the two held the renewal.
            self._renew_db_s = (ended[-1] if ended else time.monotonic()) - began
        ready = self._ready_at
        self._taken_over.update(c for c in lost if c in ready)
        for token, ids in held.items():
            for i in ids:
                if (i, token) in ready and (i, token) not in lost:
                    ready[i, token] = began

    async def _db_retry(self, what: str, fn: Callable[..., T], *args: Any,
                        **kwargs: Any) -> T:
        """``fn`` on a database thread, tried again with back-off for as long as the
        database fails (unreachable, restarting, locked), until a hard stop. A worker
        does not exit on a database error that passes: it waits for the database. An
        error no retry can help (a constraint, a statement the database refuses on
        principle: :func:`~lockgate.store.failures.is_permanent`) is raised at once,
        saying what failed."""
        streak = Streak()
        while True:
            try:
                return await self._db(fn, *args, **kwargs)
            except StoreError as exc:
                if is_permanent(exc):
                    raise StoreError(f"{what} failed, and trying again cannot help: "
                                     f"{exc}") from exc
                level = streak.failed()
                if self._hard.is_set():
                    raise
                delay = min(5.0, 0.05 * 2 ** streak.failures)
                log.log(level, "%s failed (%d in a row), retrying in %.1fs: %s", what,
                        streak.failures, delay, exc)
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
                                 api_key_header=ep.api_key_header,
                                 max_connections=min(ep.max_concurrency, self.ws.concurrency),
                                 send_idempotency_key=ep.send_idempotency_key,
                                 headers=ep.headers, http_client=self.ws.http_client)
            self._providers[ep.name] = p
        return p
