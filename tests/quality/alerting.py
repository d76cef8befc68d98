"""What the alert tests share: attempts written through the real write-back and rollup
writer (so rollups and ``task_attempt`` rows are the ones a worker makes), settings of
a fast evaluator, and a local webhook receiver."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import itertools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson

from lockgate.config import QualitySettings, Settings, Webhook
from lockgate.quality.writer import RollupWriter
from lockgate.spec import parse_task
from lockgate.states import TaskStatus
from lockgate.store import Finish, Store

HOUR = 3_600_000
PROMPT = "p@1"
SCHEMA = {"type": "object", "properties": {"label": {"type": "string",
                                                      "enum": ["yes", "no"]}}}
_ids = itertools.count()


def settings(**quality: Any) -> Settings:
    """Settings of an evaluator that ticks fast (tests call ``tick`` themselves)."""
    base: dict[str, Any] = {"evaluate_every": 1.0, "evaluator_lease_s": 30.0}
    base.update(quality)
    return Settings(quality=QualitySettings(**base))


def feed(store: Store, n: int, *, ago_ms: int, completeness: float = 1.0,
         label: str = "yes", latency: float = 100.0, parse_status: str = "valid",
         prompt_snapshot: str = "Label this: {x}", raw_output: str | None = None,
         error_message: str | None = None, batch: str = "b",
         template: str | None = None, version: str = PROMPT) -> None:
    """Write ``n`` tasks' single attempts (started ``ago_ms`` before the database clock)
    through :meth:`Store.finish` with the rollup writer in its transaction. Tasks run
    ``version`` of the registry (``p@1``), or the inline ``template``."""
    first = next(_ids) * 100_000
    store.submit([parse_task({
        "task_id": f"t{first + i}", "prompt_template": template or f"@registry:{version}",
        "input_data": {"x": first + i}, "delivery_rule": {"schema": SCHEMA},
        "model_config": {"name": "m"},
        "retry_policy": {}}) for i in range(n)], batch_id=batch)
    writer = RollupWriter(store, shard="w")
    now = store.db_now()
    claimed = store.claim(n, lease_ms=60_000, worker_id="w")
    assert len(claimed) == n
    rows = []
    for t in claimed:
        result = orjson.dumps({"label": label}).decode()
        rows.append(Finish(id=t.id, lease_token=t.lease_token, status=TaskStatus.SUCCEEDED,
                           result=result, attempt={
                               "attempt": 1, "outcome": "succeeded", "latency_ms": latency,
                               "started_at": now - ago_ms, "endpoint": "e", "model": "m",
                               "prompt_sha256": "h",
                               "prompt_version": None if template else version,
                               "input_tokens": 50, "output_tokens": 5,
                               "parse_status": parse_status, "completeness": completeness,
                               "prompt_snapshot": prompt_snapshot.replace("{x}", str(t.id)),
                               "raw_output": raw_output or result,
                               "error_message": error_message}))
    store.finish(rows, worker_id="w", observe=writer.record)


def collapse(store: Store, bad: int = 150, **kw: Any) -> None:
    """A baseline of healthy calls 30 h ago and ``bad`` half-complete calls a minute ago:
    completeness collapse fires on ``p@1`` / ``m``."""
    feed(store, 150, ago_ms=30 * HOUR)
    feed(store, bad, ago_ms=60_000, completeness=0.5, **kw)


# -- a webhook receiver ----------------------------------------------------------------------

@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    signed: bool


@dataclass
class Receiver:
    """A local HTTP server: answers the statuses of ``script`` in turn, then 200; with
    ``hang`` it holds the first request that long before answering; with ``block`` it
    holds every request until that event is set (a webhook that does not answer); with
    ``endless`` it answers 200 with a body that never ends."""

    secret: bytes
    script: list[int] = field(default_factory=list)
    hang: float = 0.0
    block: threading.Event | None = None
    endless: bool = False
    got: list[Received] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def start(self) -> Receiver:
        rec = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                want = "sha256=" + hmac.new(rec.secret, body, hashlib.sha256).hexdigest()
                sig = self.headers.get("X-Lockgate-Signature", "")
                rec.got.append(Received(dict(self.headers), body,
                                        hmac.compare_digest(want, sig)))
                if rec.hang and len(rec.got) == 1:
                    time.sleep(rec.hang)
                if rec.block is not None:
                    rec.block.wait(120)
                status = rec.script.pop(0) if rec.script else 200
                if rec.endless:  # no length: the body ends when the connection does
                    self.send_response(status)
                    self.end_headers()
                    with contextlib.suppress(OSError):
                        for _ in range(600):
                            self.wfile.write(b"x" * 65536)
                            time.sleep(0.01)
                    return
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.block is not None:
            self.block.set()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def webhook(self, **kw: Any) -> Webhook:
        return Webhook(**{"name": "ops", "url": self.url, "secret": self.secret.decode(),
                          "backoff_s": 0.05, "timeout_s": 5.0, **kw})


def ids(got: Sequence[Received]) -> list[str]:
    return [r.headers["X-Lockgate-Delivery"] for r in got]
