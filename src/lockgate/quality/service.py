"""The quality evaluator inside ``lockgate worker``: a side service in every worker
process, of which exactly one (the holder of the ``quality_evaluator`` role lease)
evaluates the anomaly rules every ``[quality] evaluate_every`` and sends the webhook
outbox. The others try to take the role at the same pace, so a killed holder is
replaced once its lease (``evaluator_lease_s``) has run out; a stopping holder gives the
role up at once. Database trouble is retried at the next tick; the webhooks are posted
by a task of their own, each delivery on its own, so a slow or failing webhook never
holds the evaluator or the worker, nor the deliveries of another webhook."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy.exc import DBAPIError

from lockgate.config import Settings
from lockgate.errors import StoreError
from lockgate.quality.alerts import Evaluator
from lockgate.quality.webhooks import Sender
from lockgate.store.store import Store

log = logging.getLogger("lockgate.quality")


class AlertService:
    """Runs :meth:`Evaluator.tick` in a thread of its own until the worker stops."""

    name = "quality"

    def __init__(self, store: Store, settings: Settings, *, send_poll_s: float = 1.0) -> None:
        self.store = store
        self.settings = settings
        self.every = settings.quality.evaluate_every
        self.send_poll_s = send_poll_s
        # a webhook secret missing from the environment stops the worker at start
        self.sender = Sender(store, settings.quality) if settings.quality.webhook else None
        self.evaluator: Evaluator | None = None
        self.ticks = 0

    async def run(self, stopping: asyncio.Event, worker_id: str) -> None:
        """Tick until ``stopping`` is set, then give the role up."""
        ev = self.evaluator = Evaluator(self.store, self.settings, worker_id=worker_id)
        loop = asyncio.get_running_loop()
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lockgate-quality")
        sending = asyncio.create_task(self._send(stopping, ev)) if self.sender else None
        try:
            while not stopping.is_set():
                try:
                    await loop.run_in_executor(pool, ev.tick)
                except (StoreError, DBAPIError) as exc:
                    log.warning("quality evaluator: step failed, retrying: %s", exc)
                self.ticks += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), timeout=self.every)
        finally:
            if sending is not None:
                sending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sending
            with contextlib.suppress(StoreError, DBAPIError):
                await loop.run_in_executor(pool, ev.release)
            pool.shutdown(wait=False)

    async def _send(self, stopping: asyncio.Event, ev: Evaluator) -> None:
        assert self.sender is not None
        # claims while this process holds the role, and goes on claiming while posts
        # are under way: a webhook that does not answer holds up only its own posts
        await self.sender.run(lambda: ev.holding, stopping, self.send_poll_s)

    async def busy(self) -> bool:
        """Never keeps a burst worker up: alerts are about traffic, not part of it."""
        return False


__all__ = ["AlertService"]
