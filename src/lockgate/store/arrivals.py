"""Word of new tasks, so that idle workers claim them at once rather than at their next
poll (an idle worker polls with back-off, up to ``poll_max_s``, 1 s by default).

On PostgreSQL every submitted chunk sends ``NOTIFY lockgate_tasks`` in its transaction
(delivered when it commits) and each worker process listens on a connection of its own
(:class:`ArrivalListener`, a thread). MySQL/MariaDB and SQLite have no such channel:
their workers poll. The word is only a wake-up: a worker that misses one (its listening
connection was down) still finds the tasks at its next poll.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from lockgate.store.engine import create
from lockgate.store.failures import cause

log = logging.getLogger("lockgate.worker")

CHANNEL = "lockgate_tasks"
#: How often the listening thread looks at its stop flag while no word comes (a
#: stopping worker waits up to this long for the thread).
_TICK_S = 0.25
#: Back-off between attempts to listen again after the connection failed.
_RETRY_S = (0.5, 1.0, 2.0, 5.0)


class ArrivalListener:
    """A thread that calls ``arrived()`` each time a submit commits tasks (PostgreSQL).
    ``arrived`` runs on the thread: it must only hand the news over (e.g. with
    ``loop.call_soon_threadsafe``)."""

    def __init__(self, url: str, arrived: Callable[[], object]) -> None:
        self._url = url
        self._arrived = arrived
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Notifications received.
        self.received = 0
        #: Times the listening connection was made (1 + reconnections).
        self.connections = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="lockgate-arrivals",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        engine = create(self._url, pool_size=1)
        failures = 0
        try:
            while not self._stop.is_set():
                try:
                    self._listen(engine)
                    failures = 0
                except Exception as exc:  # the database is down or the link broke
                    failures += 1
                    # (the driver's first line: libpq's lost-connection message goes on
                    # for three)
                    (log.warning if failures == 1 else log.debug)(
                        "listening for new tasks failed (%s); idle polls find them "
                        "meanwhile", cause(exc))
                    engine.dispose()
                    self._stop.wait(_RETRY_S[min(failures, len(_RETRY_S)) - 1])
        finally:
            engine.dispose()

    def _listen(self, engine: Any) -> None:
        with engine.connect() as conn:
            try:
                self._heed(conn.connection.driver_connection)
            except Exception:
                # A broken link: the connection is thrown away, not handed back to the
                # pool, whose reset of a dead connection logs a traceback of its own.
                conn.invalidate()
                raise

    def _heed(self, raw: Any) -> None:
        raw.autocommit = True
        raw.execute(f"LISTEN {CHANNEL}")
        self.connections += 1
        # Tasks may have come while the connection was down: wake once for them.
        self._arrived()
        while not self._stop.is_set():
            for _ in raw.notifies(timeout=_TICK_S):
                self.received += 1
                self._arrived()
                if self._stop.is_set():
                    break
