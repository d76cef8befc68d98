"""Fixtures of the flow-control tests: environment isolation (as in the engine tests)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from lockgate.store import Store


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
