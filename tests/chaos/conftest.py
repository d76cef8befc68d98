"""Fixtures of the chaos and fuzz suite: its size (``--chaos=short``, the default and part
of ``make test``; ``--chaos=long`` for ``make chaos``), worker subprocesses, and private
database servers that a test may stop, kill and restart."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from engine.conftest import workers  # noqa: F401 (the engine tests' worker subprocesses)

from .servers import PrivateServer, private_server


@dataclass(frozen=True)
class Scale:
    """How big each scenario is."""

    name: str
    #: kill -9: tasks, kills and workers of a run.
    kill_tasks: int
    kills: int
    #: Database restart: tasks of a run, and the outages (seconds down) it goes through.
    restart_tasks: int
    outages: tuple[float, ...]
    #: Partition: at least this long cut off (and always past the lease).
    cut_s: float
    #: Fuzz: hypothesis examples per property.
    fuzz_cases: int


SHORT = Scale("short", kill_tasks=1000, kills=3, restart_tasks=1000, outages=(1.0,),
              cut_s=0.0, fuzz_cases=100)
LONG = Scale("long", kill_tasks=20_000, kills=20, restart_tasks=10_000, outages=(1.0, 30.0),
             cut_s=60.0, fuzz_cases=2500)


@pytest.fixture(scope="session")
def scale(request: pytest.FixtureRequest) -> Scale:
    """The size of the chaos scenarios of this run."""
    return LONG if request.config.getoption("--chaos") == "long" else SHORT




@pytest.fixture(scope="module", params=("postgresql", "mariadb"))
def private(request: pytest.FixtureRequest) -> Iterator[PrivateServer]:
    """A private server of this module (never the shared 5432/3306 ones)."""
    server = private_server(str(request.param))
    try:
        yield server
    finally:
        server.close()
