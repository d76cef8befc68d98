"""Run a simulator in a subprocess for tests and benchmarks.

A subprocess (not a thread) so the simulator has its own event loop and CPU, and so
tests exercise the same command users run. The helper waits for the ready line rather
than sleeping, talks to the admin endpoints with the standard library (usable from sync
and async tests alike), and always stops the process: on exit, on garbage collection,
and — through ``--exit-with-parent`` — even if the test runner itself is killed.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import orjson

from lockgate.simulator.config import SimulatorConfig
from lockgate.simulator.runner import READY_PREFIX


class SimulatorError(RuntimeError):
    """The simulator subprocess did not start, or an admin call failed."""


def _terminate(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _drain(stream: IO[bytes]) -> None:
    # Keep reading so the child can never block on a full stdout pipe.
    for _line in iter(stream.readline, b""):
        pass


class SimulatorProcess:
    """Context manager: ``with SimulatorProcess({"rpm": 10}) as sim: ... sim.url ...``."""

    def __init__(self, config: SimulatorConfig | Mapping[str, Any] | None = None, *,
                 host: str = "127.0.0.1", startup_timeout: float = 20.0,
                 extra_args: tuple[str, ...] = ()) -> None:
        if isinstance(config, SimulatorConfig):
            self._config_json = config.to_json().decode()
        else:
            self._config_json = SimulatorConfig.model_validate(dict(config or {})) \
                .to_json().decode()
        self.host = host
        self.startup_timeout = startup_timeout
        self.extra_args = extra_args
        self.proc: subprocess.Popen[bytes] | None = None
        self.base_url = ""
        self._finalizer: weakref.finalize | None = None
        self._drainer: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> SimulatorProcess:
        """Start the subprocess and wait until it listens."""
        if self.proc is not None:
            raise SimulatorError("simulator already started")
        src = str(Path(__file__).resolve().parents[2])  # the folder holding lockgate/
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
        cmd = [sys.executable, "-m", "lockgate.simulator", "--host", self.host, "--port", "0",
               "--config-json", self._config_json, "--exit-with-parent", *self.extra_args]
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                env=env)
        self.proc = proc
        self._finalizer = weakref.finalize(self, _terminate, proc)
        assert proc.stdout is not None
        try:
            line = self._read_ready(proc, proc.stdout)
        except BaseException:
            self.stop()
            raise
        self.base_url = line[len(READY_PREFIX):].strip()
        self._drainer = threading.Thread(target=_drain, args=(proc.stdout,), daemon=True,
                                         name="simulator-stdout")
        self._drainer.start()
        return self

    def _read_ready(self, proc: subprocess.Popen[bytes], stdout: IO[bytes]) -> str:
        deadline = time.monotonic() + self.startup_timeout
        with selectors.DefaultSelector() as sel:
            sel.register(stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SimulatorError(
                        f"simulator did not report ready within {self.startup_timeout}s")
                if sel.select(left):
                    raw = stdout.readline()
                    if not raw:
                        raise SimulatorError(
                            f"simulator exited with code {proc.wait()} before it was ready "
                            "(see its stderr above)")
                    line = raw.decode(errors="replace")
                    if line.startswith(READY_PREFIX):
                        return line

    def stop(self) -> None:
        """Stop the subprocess (SIGTERM, then SIGKILL after 10 s); idempotent."""
        if self._finalizer is not None:
            self._finalizer()
        if self._drainer is not None:
            self._drainer.join(timeout=5)  # EOF follows the child's exit
            self._drainer = None
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> SimulatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ access

    @property
    def url(self) -> str:
        """OpenAI base URL, ending in ``/v1``."""
        return f"{self.base_url}/v1"

    @property
    def port(self) -> int:
        """The port the simulator listens on."""
        return int(self.base_url.rsplit(":", 1)[1])

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        if not self.base_url:
            raise SimulatorError("simulator is not running")
        data = orjson.dumps(body) if body is not None else None
        req = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return orjson.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise SimulatorError(f"{method} {path} failed: {exc.code} "
                                 f"{exc.read().decode(errors='replace')}") from exc

    def stats(self, detail: bool = False) -> dict[str, Any]:
        """``GET /_sim/stats`` (``detail`` adds per-task success counts)."""
        result: dict[str, Any] = self._call("GET", "/_sim/stats?detail=1" if detail
                                            else "/_sim/stats")
        return result

    def configure(self, **patch: Any) -> dict[str, Any]:
        """Change the running config (partial); returns the full new config."""
        result: dict[str, Any] = self._call("POST", "/_sim/config", patch)
        return result

    def reset(self) -> None:
        """Clear stats and rate-limit windows."""
        self._call("POST", "/_sim/reset", {})

    def health(self) -> dict[str, Any]:
        """``GET /_sim/health``."""
        result: dict[str, Any] = self._call("GET", "/_sim/health")
        return result
