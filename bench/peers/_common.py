"""What every peer's driver shares: the workload, the retry policy, the simulator's
admin calls and the measurement. Standard library only: this module runs inside each
peer's own virtualenv (bench/peers/.venvs/<peer>), where lockgate is not installed.

A driver (``<peer>_peer.py``) implements :class:`Peer`; :func:`main` then runs one
measurement: start the peer's worker process(es), wait until they have done a warm-up
job and sit idle, zero the simulator's counters, time from the start of the submit to
the last result persisted, read every result back and check it, stop the workers, and
print one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
sys.path.insert(0, str(BENCH))
from workload import request_body  # noqa: E402  (stdlib only: shared with lockgate's runs)

#: The retry policy of every system: up to 3 retries, back-off 100 ms doubling, capped
#: at 2 s (lockgate: retry_policy {"max_retries": 3, "base_delay_ms": 100, "cap_ms": 2000}).
MAX_RETRIES = 3
BASE_DELAY_S = 0.1
CAP_S = 2.0
#: How often a driver looks for the last result (the resolution of the end time).
POLL_S = 0.02
TIMEOUT_S = 60.0  # one HTTP call


def backoff_s(retry: int) -> float:
    """The pause before retry number ``retry`` (1-based)."""
    return min(CAP_S, BASE_DELAY_S * 2 ** (retry - 1))


def task_id(i: int) -> str:
    return f"peer-{i:08d}"


def index_of(tid: str) -> int:
    return int(tid.rsplit("-", 1)[1])


class CallFailed(Exception):
    """An answer the task cannot use (HTTP error or content without a label): retried
    by the peer's own retry feature."""


def body_bytes(i: int) -> bytes:
    return json.dumps(request_body(i)).encode()


def headers(tid: str, attempt: int) -> dict[str, str]:
    """The request headers; ``Idempotency-Key: {task_id}:{attempt}`` lets the simulator
    count duplicate successes per task."""
    return {"Content-Type": "application/json", "Authorization": "Bearer peers",
            "Idempotency-Key": f"{tid}:{attempt}"}


def content_of(status: int, raw: bytes) -> str:
    """The answer's content when it is usable (a JSON object with a label), else raise."""
    if status != 200:
        raise CallFailed(f"HTTP {status}")
    try:
        content = json.loads(raw)["choices"][0]["message"]["content"]
        if "label" not in json.loads(content):
            raise CallFailed("no label")
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise CallFailed(f"unusable answer: {exc}") from exc
    return str(content)


# -- the simulator's admin endpoints -----------------------------------------------------

def sim_call(base_url: str, method: str, path: str) -> Any:
    req = urllib.request.Request(f"{base_url}{path}", method=method,
                                 data=b"{}" if method == "POST" else None,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


# -- the measurement -------------------------------------------------------------------

@dataclass
class Args:
    sim: str  # the simulator's base URL (no /v1)
    tasks: int
    concurrency: int
    expected: Path
    workdir: Path
    pg: str
    redis: str
    amqp: str
    timeout: float

    @property
    def chat_url(self) -> str:
        return f"{self.sim}/v1/chat/completions"


@dataclass
class Peer:
    """One system under test; subclasses fill the hooks."""

    args: Args
    name: str = ""
    settings: dict[str, Any] = field(default_factory=dict)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    async def setup(self) -> None:
        """Create the peer's database, tables, queues (empty)."""

    def worker_commands(self) -> list[list[str]]:
        """The worker process(es) to start, as a user would run them."""
        raise NotImplementedError

    async def submit(self, indexes: Sequence[int], ids: Sequence[str]) -> None:
        """Enqueue one job per index, the way the peer recommends for many jobs."""
        raise NotImplementedError

    async def finished(self, ids: Sequence[str]) -> int:
        """How many of ``ids`` have a result persisted (cheap: called every POLL_S)."""
        raise NotImplementedError

    async def results(self, ids: Sequence[str]) -> dict[str, str]:
        """The stored result (the answer's content) of each finished id."""
        raise NotImplementedError

    async def clear(self) -> None:
        """Remove the warm-up's traces so the measurement starts from an empty store."""

    async def teardown(self) -> None:
        """Drop what setup created."""

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(BENCH)]),
                "PEERS_SIM_URL": self.args.chat_url, "PEERS_PG": self.args.pg,
                "PEERS_REDIS": self.args.redis, "PEERS_AMQP": self.args.amqp,
                "PEERS_CONCURRENCY": str(self.args.concurrency)}

    # -- workers -------------------------------------------------------------------------

    def start_workers(self) -> None:
        for n, cmd in enumerate(self.worker_commands()):
            log = open(self.args.workdir / f"{self.name}-worker-{n}.log", "wb")  # noqa: SIM115
            self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                               env=self.env(), cwd=HERE,
                                               start_new_session=True))

    def stop_workers(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()

    def check_workers(self) -> None:
        for n, p in enumerate(self.procs):
            if p.poll() is not None:
                log = (self.args.workdir / f"{self.name}-worker-{n}.log").read_text(
                    errors="replace")
                raise SystemExit(f"{self.name} worker exited ({p.returncode}):\n{log[-3000:]}")

    async def wait_for(self, ids: Sequence[str], timeout: float) -> float:
        """Poll until every id has a result; the time when that was first seen."""
        deadline = time.perf_counter() + timeout
        n = len(ids)
        while True:
            now = time.perf_counter()
            if await self.finished(ids) >= n:
                return time.perf_counter()
            if now > deadline:
                return float("nan")
            self.check_workers()
            await asyncio.sleep(POLL_S)


def parse_args(argv: Sequence[str] | None = None) -> Args:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sim", required=True, help="simulator base URL (no /v1)")
    ap.add_argument("--tasks", type=int, default=10_000)
    ap.add_argument("--concurrency", type=int, default=512, help="calls in flight, in total")
    ap.add_argument("--expected", type=Path, required=True,
                    help="JSON list: the label the simulator gives task i")
    ap.add_argument("--workdir", type=Path, required=True, help="worker logs go here")
    ap.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test",
                    help="a PostgreSQL database to create the peer's database from")
    ap.add_argument("--redis", default="redis://127.0.0.1:6379/11")
    ap.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672//")
    ap.add_argument("--timeout", type=float, default=600.0,
                    help="give up waiting for the last result after this many seconds")
    a = ap.parse_args(argv)
    return Args(a.sim, a.tasks, a.concurrency, a.expected, a.workdir, a.pg, a.redis, a.amqp,
                a.timeout)


def verify(stored: dict[str, str], ids: Sequence[str], expected: Sequence[str]
           ) -> dict[str, int]:
    """Every task's stored result must hold the label the simulator gives it."""
    correct = wrong = 0
    for tid in ids:
        content = stored.get(tid)
        if content is None:
            continue
        try:
            ok = json.loads(content)["label"] == expected[index_of(tid)]
        except (ValueError, KeyError, TypeError):
            ok = False
        correct += ok
        wrong += not ok
    return {"stored": len([t for t in ids if t in stored]), "correct": correct,
            "wrong": wrong, "missing": len(ids) - correct - wrong}


async def measure(peer: Peer) -> dict[str, Any]:
    args = peer.args
    expected = json.loads(args.expected.read_text())
    await peer.setup()
    try:
        peer.start_workers()
        # Warm-up: one job through the whole path, so the workers are up, connected and
        # idle when the clock starts.
        warm = ["peer-warm-00000000"]
        await peer.submit([0], warm)
        if math.isnan(await peer.wait_for(warm, 120)):
            raise SystemExit(f"{peer.name}: the warm-up job did not finish within 120 s")
        await peer.clear()
        await asyncio.sleep(1.0)
        sim_call(args.sim, "POST", "/_sim/reset")
        ids = [task_id(i) for i in range(args.tasks)]
        t0 = time.perf_counter()
        await peer.submit(range(args.tasks), ids)
        submitted = time.perf_counter()
        ended = await peer.wait_for(ids, args.timeout)
        stats = sim_call(args.sim, "GET", "/_sim/stats")
        checks = verify(await peer.results(ids), ids, expected)
    finally:
        peer.stop_workers()
        await peer.teardown()
    timed_out = math.isnan(ended)
    elapsed = args.timeout if timed_out else ended - t0
    return {"system": peer.name, "tasks": args.tasks, "submit_s": submitted - t0,
            "elapsed_s": elapsed, "rate": args.tasks / elapsed, "timed_out": timed_out,
            **checks, "calls": stats["requests"], "by_status": stats["by_status"],
            "duplicates": stats["duplicate_successes"], "settings": peer.settings}


def main(peer_cls: type[Peer]) -> None:
    args = parse_args()
    peer = peer_cls(args)
    print(json.dumps(asyncio.run(measure(peer))), flush=True)
