"""Fixtures of the engine tests: environment isolation and worker subprocesses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lockgate.simulator.testing import SimulatorProcess

from .support import WorkerPool


@pytest.fixture
def workers(db_url: str, simulator: SimulatorProcess, tmp_path: Path) -> Iterator[WorkerPool]:
    """Start ``lockgate worker`` subprocesses on the test's database and simulator."""
    log_dir = tmp_path / "workers"
    log_dir.mkdir()
    pool = WorkerPool(db_url, simulator.url, log_dir)
    try:
        yield pool
    finally:
        pool.close()
