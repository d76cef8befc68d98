"""Fixtures of the flow-control tests: environment isolation (as in the engine tests)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lockgate.store import Store


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No LOCKGATE_* setting from the caller's shell, and no ./lockgate.toml, leaks in."""
    for name in list(os.environ):
        if name.startswith("LOCKGATE_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def stores(db_url: str) -> Iterator[Callable[[], Store]]:
    """Opens extra :class:`Store` objects on the test's database (one per worker, as
    separate processes would have) and closes every one of them afterwards."""
    opened: list[Store] = []

    def make() -> Store:
        s = Store(db_url, pool_size=2)
        opened.append(s)
        return s

    try:
        yield make
    finally:
        for s in opened:
            s.close()
