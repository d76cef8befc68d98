"""Running a simulator: in the current event loop (:func:`start`) or as a process (:func:`serve`).

Kept apart from the protocol code in :mod:`.server` so that embedding (tests, the
``lockgate simulate`` command) and process supervision (signals, ready line, orphan
protection) do not mix with request handling.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lockgate.simulator.config import SimulatorConfig
from lockgate.simulator.http import LeanServer, serve_http
from lockgate.simulator.server import MAX_BODY, Simulator

log = logging.getLogger("lockgate.simulator")

READY_PREFIX = "lockgate simulator listening on "


@dataclass
class SimulatorHandle:
    """A simulator running in the current event loop; ``await close()`` when done."""

    simulator: Simulator
    host: str
    port: int
    _server: LeanServer = field(repr=False)
    shutdown_timeout: float = 5.0

    @property
    def base_url(self) -> str:
        """``http://host:port`` (admin endpoints live under it)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def url(self) -> str:
        """The OpenAI base URL (ends in ``/v1``)."""
        return f"{self.base_url}/v1"

    async def close(self) -> None:
        """Stop accepting, release hanging requests, wait briefly for in-flight ones."""
        self.simulator.stopping.set()
        await self._server.close(self.shutdown_timeout)

    async def __aenter__(self) -> SimulatorHandle:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def start(config: SimulatorConfig | Mapping[str, Any] | None = None,
                host: str = "127.0.0.1",
                port: int = 0, shutdown_timeout: float = 5.0,
                clock: Callable[[], float] = time.monotonic) -> SimulatorHandle:
    """Start a simulator in the running event loop (``config`` a ``SimulatorConfig`` or a
    mapping of its settings); port 0 picks a free port; ``clock``
    is the rate limiter's time (tests pass one they move by hand)."""
    sim = Simulator(config, clock)
    server = await serve_http(sim.dispatch, host, port, max_body=MAX_BODY)
    return SimulatorHandle(sim, host, server.port, server, shutdown_timeout)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a declared dependency on Unix
        return None
    return uvloop.new_event_loop


async def _watch_parent(parent_pid: int, stop: asyncio.Event) -> None:
    """Stop when the process that started us is gone (no orphaned simulators)."""
    while not stop.is_set():
        if os.getppid() != parent_pid:
            log.warning("parent process %d is gone; stopping", parent_pid)
            stop.set()
            return
        await asyncio.sleep(0.5)


async def _serve(config: SimulatorConfig, host: str, port: int,
                 on_ready: Callable[[str], None] | None, parent_pid: int | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    handle = await start(config, host, port)
    watcher = (asyncio.create_task(_watch_parent(parent_pid, stop))
               if parent_pid is not None else None)
    try:
        if on_ready is not None:
            on_ready(handle.base_url)
        await stop.wait()
    finally:
        if watcher is not None:
            watcher.cancel()
        await handle.close()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def print_ready(base_url: str) -> None:
    """Print the ready line that supervisors (and :mod:`.testing`) wait for."""
    print(f"{READY_PREFIX}{base_url}", flush=True)


def serve(config: SimulatorConfig | None = None, host: str = "127.0.0.1", port: int = 8400,
          on_ready: Callable[[str], None] | None = print_ready,
          parent_pid: int | None = None) -> None:
    """Run a simulator until SIGTERM/SIGINT (blocking); uses uvloop when importable."""
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(_serve(config or SimulatorConfig(), host, port, on_ready, parent_pid))
