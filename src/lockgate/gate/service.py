"""The release gate inside ``lockgate worker``: a side service that runs the role steps.

Every worker process runs one; they coordinate only through rows, so any number of
them may run (or none, with ``--no-gate``). The loop polls quickly while there is gate
work and backs off to ``idle_max_s`` when there is none; database trouble is retried
with back-off, and any other exception stops the worker loudly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy.exc import DBAPIError

from lockgate.errors import StoreError, Streak
from lockgate.gate.roles import PAGE, GateRoles
from lockgate.store import Store
from lockgate.store.gate import GateStore

log = logging.getLogger("lockgate.gate")


class GateService:
    """Runs :meth:`GateRoles.tick` in a thread of its own until the worker stops."""

    name = "gate"

    def __init__(self, store: Store, *, lease_s: float = 30.0, poll_s: float = 0.2,
                 idle_max_s: float = 2.0, page: int = PAGE,
                 pool_of: Callable[[dict[str, Any]], str] | None = None) -> None:
        self.store = store
        self.pool_of = pool_of
        self.lease_ms = int(lease_s * 1000)
        self.poll_s = poll_s
        self.idle_max_s = idle_max_s
        self.page = page
        self.ticks = 0

    async def run(self, stopping: asyncio.Event, worker_id: str) -> None:
        """Tick until ``stopping`` is set; a step in flight stops at its next page."""
        roles = GateRoles(self.store, worker_id=worker_id, lease_ms=self.lease_ms,
                          page=self.page, should_stop=stopping.is_set,
                          pool_of=self.pool_of)
        loop = asyncio.get_running_loop()
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lockgate-gate")
        delay = self.poll_s
        steps = Streak()
        try:
            while not stopping.is_set():
                try:
                    did = await loop.run_in_executor(pool, roles.tick)
                    steps.ok()
                except (StoreError, DBAPIError) as exc:
                    log.log(steps.failed(), "release gate step failed (%d in a row), "
                            "retrying: %s", steps.failures, exc)
                    did = False
                    delay = min(5.0, 0.1 * 2 ** steps.failures)
                except Exception:
                    # A defect of a step must not stop the worker's own tasks with it.
                    steps.failed()
                    log.exception("release gate step failed (%d in a row), retrying",
                                  steps.failures)
                    did = False
                    delay = min(30.0, 0.1 * 2 ** steps.failures)
                self.ticks += 1
                delay = self.poll_s if did else min(self.idle_max_s, max(delay, self.poll_s)
                                                    * 1.5)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), timeout=delay)
        finally:
            pool.shutdown(wait=False)

    async def busy(self) -> bool:
        """Whether any candidate is still PENDING or EVALUATING (keeps burst workers up)."""
        return bool(await asyncio.to_thread(GateStore(self.store).active_updates))
