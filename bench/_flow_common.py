"""Shared pieces of the flow-control benchmarks: databases, workloads, worker processes,
and a sampler of the simulator's counters."""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import text

from _databases import fresh_url
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store

DB_NAME = "lockgate_flow_bench"
PY = sys.executable

SYSTEM = ("Label the text. Reply with JSON only, like {{\"label\": \"yes\"}}.\n"
          "label: one of yes, no\n"
          "- if the text mentions refund|broken then label = yes\n"
          "- otherwise label = no")
FILLER = ("The customer wrote a long message about the order, the courier, the weather "
          "and many other things that do not matter for the label. ")


def text_for(i: int, long: bool) -> str:
    head = f"order {i}: the parcel arrived {'broken' if i % 3 == 0 else 'on time'}. "
    return head + FILLER * 12 if long else head


def task_line(i: int, batch: str, *, long: bool = False, model: str = "sim-bench",
              max_retries: int = 8) -> dict[str, Any]:
    """A task; ``long`` inputs cost about ten times the tokens of short ones. No
    ``max_tokens``: the simulator then charges the real answer, as the reservation
    expects (prompt + expected output, settled against usage)."""
    return {
        "task_id": f"{batch}-{i:08d}",
        "prompt_template": [{"role": "system", "content": SYSTEM},
                            {"role": "user", "content": "<input>\n{text}\n</input>"}],
        "input_data": {"text": text_for(i, long)},
        "model_config": {"name": model, "timeout_ms": 60_000},
        "delivery_rule": {"format": "json", "required_keys": ["label"]},
        "retry_policy": {"max_retries": max_retries, "base_delay_ms": 200, "cap_ms": 5000},
    }


def machine() -> dict[str, Any]:
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    return {"cpus": os.cpu_count(), "python": platform.python_version(),
            "load_avg_at_start": [round(x, 2) for x in load]}


@contextlib.contextmanager
def run_dir(keep: Path | None, label: str) -> Iterator[Path]:
    """The directory of one run: ``keep/label`` (kept) or a temporary one."""
    if keep is not None:
        path = keep / label
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


def fresh_db(backend: str, tmp: Path, name: str = DB_NAME) -> str:
    """An empty, migrated database for one measurement (server databases: ``name``)."""
    if backend not in ("sqlite", "postgresql", "mariadb"):
        raise SystemExit(f"unknown backend {backend}")
    url = fresh_url(backend, tmp, f"{name}_{time.monotonic_ns()}" if backend == "sqlite"
                    else name)
    if url is None:
        raise SystemExit(f"{backend}: the server does not answer")
    s = Store(url)
    s.migrate()
    s.close()
    return url


def submit(url: str, lines: Sequence[dict[str, Any]], batch: str,
           fields: dict[str, Any] | None = None, pool: str = "default") -> None:
    s = Store(url)
    s.submit((parse_task(t) for t in lines), batch_id=batch, batch_fields=fields,
             pool_of=lambda _t: pool)
    s.close()


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return repr(v)


def write_config(path: Path, endpoints: Sequence[dict[str, Any]],
                 flow: dict[str, Any] | None = None,
                 worker: dict[str, Any] | None = None) -> Path:
    """A lockgate.toml with these endpoints and [flow]/[worker] settings."""
    out = []
    for ep in endpoints:
        out.append("[[endpoint]]")
        out += [f"{k} = {toml_value(v)}" for k, v in ep.items()]
        out.append("")
    for section, values in (("flow", flow), ("worker", worker)):
        if values:
            out.append(f"[{section}]")
            out += [f"{k} = {toml_value(v)}" for k, v in values.items()]
            out.append("")
    path.write_text("\n".join(out))
    return path


@dataclass
class Workers:
    """``lockgate worker`` processes, started together."""

    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self, n: int, url: str, config: Path, *, burst: bool = True,
              concurrency: int = 256, extra: Sequence[str] = (),
              log_dir: Path | None = None) -> None:
        args = [PY, "-m", "lockgate.cli", "worker", "--db", url, "--config", str(config),
                "--concurrency", str(concurrency), "--no-gate", *extra]
        if burst:
            args.append("--burst")
        for i in range(n):
            log = open(log_dir / f"worker-{len(self.procs)}.log", "wb") if log_dir else \
                subprocess.DEVNULL  # noqa: SIM115
            self.procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                               env={**os.environ}))
            del i

    def wait(self, timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
        return codes

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        self.wait(30)


class Sampler(threading.Thread):
    """Polls the simulator's counters every ``period`` s (time, requests, outcomes,
    tokens) until stopped."""

    def __init__(self, sim: SimulatorProcess, period: float = 0.5,
                 db_url: str | None = None) -> None:
        super().__init__(daemon=True)
        self.sim = sim
        self.db_url = db_url
        self.grants: list[tuple[float, int]] = []  # (t, requests granted so far)
        # (t, tokens granted so far, token allowance, learned TPM, rate factor)
        self.buckets: list[tuple[float, float, float, float | None, float]] = []
        self.period = period
        self.samples: list[tuple[float, dict[str, Any]]] = []
        self._halt = threading.Event()
        self.t0 = time.monotonic()
        self.max_call_s = 0.0  # a slow answer means the simulator itself was starved

    def run(self) -> None:
        store = Store(self.db_url, pool_size=1) if self.db_url else None
        try:
            self._run(store)
        finally:
            if store is not None:
                store.close()

    def _run(self, store: Store | None) -> None:
        q = text("SELECT COALESCE(SUM(granted_requests), 0), COALESCE(SUM(granted_tokens), 0), "
                 "COALESCE(SUM(tok_allowance), 0), MIN(learned_tpm), MIN(rate_factor) "
                 "FROM rate_limit WHERE kind = 'endpoint'")
        while not self._halt.is_set():
            if store is not None:
                with contextlib.suppress(Exception), store.engine.connect() as c:
                    row = c.execute(q).one()
                    now = time.monotonic() - self.t0
                    self.grants.append((now, int(row[0])))
                    self.buckets.append((now, float(row[1]), float(row[2]),
                                         None if row[3] is None else float(row[3]),
                                         float(row[4] or 1.0)))
            t = time.monotonic()
            with contextlib.suppress(Exception):  # the simulator may be busy: skip one
                self.samples.append((t - self.t0, self.sim.stats()))
            self.max_call_s = max(self.max_call_s, time.monotonic() - t)
            self._halt.wait(self.period)

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


def spread(values: Sequence[float]) -> str:
    """``mean (min-max)`` of repeated runs."""
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.3g}"
    return f"{statistics.mean(values):.3g} ({min(values):.3g}-{max(values):.3g})"
