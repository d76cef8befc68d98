"""The CPU an idle worker spends: one worker (not burst) on an empty SQLite database,
in this process, its CPU time measured over ``--seconds`` after a 2 s start.

    python bench/worker_idle.py --seconds 10

An idle worker should cost next to nothing: it polls the queue at most every
``poll_max_s``, renews leases and beats its heartbeat; nothing else is due.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import tempfile
from pathlib import Path

from lockgate.config import Settings, WorkerSettings
from lockgate.store import Store
from lockgate.worker import Worker


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def measure(worker: Worker, seconds: float) -> float:
    task = asyncio.create_task(worker.run())
    await asyncio.sleep(2.0)
    c0 = cpu_s()
    await asyncio.sleep(seconds)
    used = cpu_s() - c0
    worker.request_stop(hard=True)
    await task
    return used / seconds * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(f"sqlite:///{Path(tmp) / 'idle.db'}")
        store.migrate()
        os.environ.setdefault("LOCKGATE_BASE_URL", "http://127.0.0.1:9/v1")  # never called
        ms = asyncio.run(measure(Worker(store, Settings(worker=WorkerSettings())),
                                 a.seconds))
        store.close()
    print(f"idle worker: {ms:.1f} ms of CPU per second ({a.seconds:g} s, load "
          f"{os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
