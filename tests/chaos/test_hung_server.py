"""A database server that hangs (its connections stay open, nothing answers: a frozen
or stuck server, a proxy that stopped forwarding) while a worker runs: a second SIGTERM
stops the worker at once, as documented. It waited for the server for as long as the
server hung: the claim, the write-back and the loops' last words to the database were
each awaited without end, and the interpreter's exit then joined the threads still
blocked in them. Nothing is lost: the tasks it held run again once their leases expire.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from engine.support import WorkerPool, rows, status_counts, tasks, wait_for
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store

pytestmark = pytest.mark.chaos

N = 1500


@pytest.fixture(scope="module", params=("postgresql", "mariadb"))
def backend(request: pytest.FixtureRequest) -> str:
    """Server databases only: SQLite has no server to hang."""
    return str(request.param)


class HangingProxy:
    """A TCP proxy to the database that can stop forwarding while keeping every
    connection open (``hang``): to the client, the server hangs."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.hang = threading.Event()
        self.closed = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
                server = socket.create_connection(self.target)
            except OSError:
                return
            self.sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                while self.hang.is_set() and not self.closed.is_set():
                    time.sleep(0.05)  # held, never forwarded while hanging
                dst.sendall(data)

    def close(self) -> None:
        self.closed.set()
        for s in self.sockets:
            with contextlib.suppress(OSError):
                s.close()


@pytest.fixture
def proxy(db_url: str) -> Iterator[HangingProxy]:
    url = make_url(db_url)
    p = HangingProxy(url.host or "127.0.0.1", int(url.port or 0))
    try:
        yield p
    finally:
        p.close()


def test_a_second_sigterm_stops_a_worker_while_the_database_hangs(
        store: Store, db_url: str, simulator: SimulatorProcess, proxy: HangingProxy,
        tmp_path: Path) -> None:
    simulator.configure(latency={"kind": "fixed", "mean_ms": 50})
    store.submit([parse_task(t) for t in tasks(N)], batch_id="hang")
    through = make_url(db_url).set(port=proxy.port).render_as_string(hide_password=False)
    pool = WorkerPool(through, simulator.url, tmp_path)
    try:
        w = pool.start(burst=False, concurrency=16, lease=5, grace=2, log_level="INFO")
        wait_for(lambda: status_counts(store).get("SUCCEEDED", 0) >= 50,
                 "the worker to finish some tasks", timeout=60)
        proxy.hang.set()
        time.sleep(1.0)  # its next claim, write-back and lease renewal now hang
        w.signal(signal.SIGTERM)
        time.sleep(1.0)
        w.signal(signal.SIGTERM)
        # It had waited as long as the server hung (here: for ever).
        assert w.wait(30) == 0
        assert "without waiting for the database" in w.log(), w.log()[-3000:]
    finally:
        proxy.hang.clear()
        pool.close()

    # Nothing lost: once the leases expire a worker finishes every task, each once.
    direct = WorkerPool(db_url, simulator.url, tmp_path / "after")
    (tmp_path / "after").mkdir()
    try:
        assert direct.start(burst=True, concurrency=32, lease=5).wait(120) == 0
    finally:
        direct.close()
    assert status_counts(store) == {"SUCCEEDED": N}
    won = Counter(r["task_id"] for r in rows(
        store, "SELECT t.task_id FROM task_attempt a JOIN task t ON t.id = a.task_pk "
               "WHERE a.outcome = 'succeeded'"))
    assert len(won) == N and set(won.values()) == {1}
