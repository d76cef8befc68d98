"""A worker whose own loop dies (a bug, not a database error) while it holds leases: it
stops with the error, at once, and gives its leases back instead of renewing them for
ever (the claims no other worker could take)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from engine.support import status_counts, tasks
from helpers import rows
from lockgate.config import Settings, WorkerSettings
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store
from lockgate.worker import Worker

pytestmark = pytest.mark.chaos


class BrokenAfterClaim(Store):
    """A store whose config read fails with an error that is not a database error (what
    a bug between the claim and the calls looks like)."""

    def configs(self, hashes: Any) -> dict[str, dict[str, Any]]:
        raise RuntimeError("injected: a bug between claim and call")


def test_a_worker_whose_loop_dies_stops_and_gives_its_leases_back(
        db_url: str, simulator: SimulatorProcess) -> None:
    broken = BrokenAfterClaim(db_url)
    try:
        broken.submit([parse_task(t) for t in tasks(20)], batch_id="b")
        worker = Worker(broken, Settings(worker=WorkerSettings(concurrency=4, lease_s=30)),
                        burst=True)

        async def main() -> None:
            await asyncio.wait_for(worker.run(), timeout=20)

        started = time.monotonic()
        with pytest.raises(RuntimeError, match="injected"):
            asyncio.run(main())
        assert time.monotonic() - started < 10, "the worker hung after its loop died"
        held = rows(broken, "SELECT task_id, attempts, visible_at, leased_by FROM task "
                            "WHERE leased_by IS NOT NULL OR visible_at > :now",
                    now=broken.db_now())
        assert held == [], "leases of a dead loop were kept (renewed, or left to expire)"
        assert status_counts(broken) == {"PENDING": 20}
        assert rows(broken, "SELECT MAX(attempts) AS n FROM task") == [{"n": 0}], \
            "giving a lease back spends no attempt"
        # Another worker takes every task at once.
        plain = Store(db_url)
        try:
            asyncio.run(asyncio.wait_for(Worker(plain, Settings(), burst=True).run(), 60))
            assert status_counts(plain) == {"SUCCEEDED": 20}
        finally:
            plain.close()
    finally:
        broken.close()
