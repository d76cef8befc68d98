"""Fixtures of the release-gate tests: environment isolation, an :class:`Env` on the
test's database, and worker subprocesses on it and the simulator."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lockgate.simulator.testing import SimulatorProcess
from lockgate.store import Store

from .support import Env, Workers


@pytest.fixture
def env(store: Store) -> Env:
    """Registry and gate APIs on the test's database."""
    return Env(store)


@pytest.fixture
def workers(db_url: str, simulator: SimulatorProcess, tmp_path: Path) -> Iterator[Workers]:
    """``lockgate worker`` subprocesses on the test's database and the simulator."""
    log_dir = tmp_path / "workers"
    log_dir.mkdir()
    pool = Workers(db_url, simulator.url, log_dir)
    try:
        yield pool
    finally:
        pool.close()
