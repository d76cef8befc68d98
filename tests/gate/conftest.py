"""Fixtures of the release-gate tests: environment isolation, an :class:`Env` on the
test's database, and worker subprocesses on it and the simulator."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from lockgate.simulator.testing import SimulatorProcess
from lockgate.store import Store

from .support import Env, Workers


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No LOCKGATE_* setting from the caller's shell, and no ./lockgate.toml, leaks in."""
    for name in list(os.environ):
        if name.startswith("LOCKGATE_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


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
