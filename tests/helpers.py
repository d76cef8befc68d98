"""Helpers shared by the test packages (``from helpers import rows, wait_for``): read-only
SQL, polling, a clean environment for subprocesses, and a chat-completions endpoint of
the test's own."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest
from aiohttp import web
from sqlalchemy import text

from lockgate.config import load_settings
from lockgate.errors import ConfigError
from lockgate.providers.base import Completion, CompletionRequest, ProviderError
from lockgate.providers.openai import OpenAICompatible
from lockgate.store import Store

RawServerT = TypeVar("RawServerT", bound="RawServer")


def rows(store: Store, sql: str, **params: Any) -> list[dict[str, Any]]:
    """Rows of a read-only query as dicts."""
    with store.engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text(sql), params)]


def scalar(store: Store, sql: str, **params: Any) -> Any:
    """The single value of a read-only query."""
    with store.engine.connect() as conn:
        return conn.execute(text(sql), params).scalar()


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 30.0,
             interval: float = 0.02) -> Any:
    """Poll until ``predicate()`` is truthy and return its value; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for: {what}")
        time.sleep(interval)


#: Server ports of the databases when the URL names none.
_DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306, "mariadb": 3306}


def _server_sessions(store: Store) -> set[int]:
    """Client ports of the TCP sessions the database server has open right now."""
    if store.engine.url.get_backend_name() == "postgresql":
        return {r["port"] for r in rows(store, "SELECT client_port AS port FROM "
                                               "pg_stat_activity WHERE client_port IS NOT NULL")}
    ports = (str(r["host"] or "").rpartition(":")[2]
             for r in rows(store, "SELECT HOST AS host FROM information_schema.PROCESSLIST"))
    return {int(p) for p in ports if p.isdigit()}


def kill_settled(popen: subprocess.Popen[bytes], store: Store) -> None:
    """SIGKILL a process that talks to ``store``'s database and return only once the
    server has closed every session the process had.

    A client killed right after sending COMMIT still has that transaction committed:
    the server reads what is left in the socket after the process is gone. A read taken
    between the kill and the server closing the session can miss those writes. So the
    process is frozen (SIGSTOP) while its sessions are listed, then killed, and the
    server is polled until none of them remains. SQLite has no server: a killed
    process's uncommitted transaction is gone with it, so only the kill is needed.
    """
    url = store.engine.url
    backend = url.get_backend_name()
    ports: set[int] = set()
    if backend != "sqlite":
        db_port = url.port or _DEFAULT_PORTS[backend]
        popen.send_signal(signal.SIGSTOP)
        ports = {c.laddr.port for c in psutil.Process(popen.pid).net_connections("tcp")
                 if c.raddr and c.raddr.port == db_port}
    popen.send_signal(signal.SIGKILL)
    assert popen.wait(10) == -signal.SIGKILL
    if ports:
        wait_for(lambda: not ports & _server_sessions(store),
                 f"the database to close the sessions of killed process {popen.pid}",
                 timeout=30)


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any LOCKGATE_* setting, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKGATE_")}
    env.update(extra)
    return env


#: An OpenAI Batch API output line, from OpenAI's documentation of the batch output file:
#: ``response`` or ``error`` is null; a response carries the HTTP status, the request id
#: and the body of the endpoint's response.
OPENAI_BATCH_LINE = {
    "type": "object",
    "required": ["id", "custom_id", "response", "error"],
    "additionalProperties": False,
    "properties": {
        "id": {"type": "string", "pattern": "^batch_req_[A-Za-z0-9]+$"},
        "custom_id": {"type": "string"},
        "response": {"oneOf": [
            {"type": "null"},
            {"type": "object", "required": ["status_code", "request_id", "body"],
             "additionalProperties": False,
             "properties": {"status_code": {"type": "integer"},
                            "request_id": {"type": ["string", "null"]},
                            "body": {"type": "object"}}}]},
        "error": {"oneOf": [
            {"type": "null"},
            {"type": "object", "required": ["code", "message"],
             "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}]},
    },
}


def check_openai_batch_line(line: dict[str, Any]) -> None:
    """The line matches OpenAI's batch output format; a 200's body is a chat completion as
    the official ``openai`` package reads it."""
    import jsonschema
    from openai.types.chat import ChatCompletion

    jsonschema.validate(line, OPENAI_BATCH_LINE)
    assert (line["response"] is None) != (line["error"] is None), line
    resp = line["response"]
    if resp is not None and resp["status_code"] == 200:
        ChatCompletion.model_validate(resp["body"])


@contextlib.contextmanager
def chat_server(handle: Callable[[web.Request], Awaitable[web.StreamResponse]], *,
                keepalive_s: float = 75.0) -> Iterator[str]:
    """An OpenAI-compatible endpoint answering ``POST /v1/chat/completions`` with
    ``handle``, on a thread's event loop; yields its base URL (``.../v1``)."""
    def routes(app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", handle)

    with app_server(routes, keepalive_s=keepalive_s) as root:
        yield f"{root}/v1"


@contextlib.contextmanager
def app_server(routes: Callable[[web.Application], None], *,
               keepalive_s: float = 75.0) -> Iterator[str]:
    """An aiohttp application whose routes ``routes`` adds, served on a thread's event
    loop; yields its root URL (``http://127.0.0.1:PORT``), for paths other than
    :func:`chat_server`'s ``/v1`` (an Azure OpenAI deployment's). ``keepalive_s``: how
    long an idle keep-alive connection is kept (aiohttp's default, 75 s)."""
    state: dict[str, Any] = {}
    started = threading.Event()

    def serve() -> None:
        loop = asyncio.new_event_loop()
        app = web.Application()
        routes(app)
        runner = web.AppRunner(app, keepalive_timeout=keepalive_s)
        loop.run_until_complete(runner.setup())
        site = web.TCPSite(runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        state["loop"], state["port"] = loop, runner.addresses[0][1]
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(10), "the test's server did not start"
    try:
        yield f"http://127.0.0.1:{state['port']}"
    finally:
        state["loop"].call_soon_threadsafe(state["loop"].stop)
        thread.join(10)


def call_model(url: str, model: str, client: str = "aiohttp") -> Completion | ProviderError:
    """One chat completion through lockgate's provider to ``url``: the ``Completion``,
    or the ``ProviderError`` it raised."""
    async def main() -> Completion | ProviderError:
        prov = OpenAICompatible("p", url, http_client=client)  # type: ignore[arg-type]
        try:
            return await prov.complete(CompletionRequest(
                messages=[{"role": "user", "content": "hi"}], model=model, timeout_s=10,
                params={}, idempotency_key=None))
        except ProviderError as exc:
            return exc
        finally:
            await prov.close()
    return asyncio.run(main())


def calls_through(url: str, client: str = "aiohttp", n: int = 1, *, model: str = "m",
                  timeout_s: float = 10, messages: list[dict[str, Any]] | None = None,
                  params: dict[str, Any] | None = None, key: str = "k",
                  pause_s: float = 0.02) -> list[Completion | ProviderError]:
    """``n`` chat completions in a row through one lockgate provider to ``url`` (so that
    its connections are reused), ``pause_s`` apart: each ``Completion``, or the
    ``ProviderError`` raised. The i-th call's idempotency key is ``{key}-{i}``."""
    async def main() -> list[Completion | ProviderError]:
        prov = OpenAICompatible("p", url, http_client=client)  # type: ignore[arg-type]
        out: list[Completion | ProviderError] = []
        try:
            for i in range(n):
                try:
                    out.append(await prov.complete(CompletionRequest(
                        messages=messages or [{"role": "user", "content": "hi"}],
                        model=model, timeout_s=timeout_s, params=dict(params or {}),
                        idempotency_key=f"{key}-{i}")))
                except ProviderError as exc:
                    out.append(exc)
                await asyncio.sleep(pause_s)  # the server's close reaches nobody before
        finally:
            await prov.close()
        return out
    return asyncio.run(main())


class RawServer:
    """A raw-socket server on a thread's event loop, for what an HTTP server library
    will not send (a close before any answer, a cut status line, a stall): a subclass
    answers each connection in ``_handle``, registering its writer in ``writers``.
    Run it with :func:`raw_server`; ``url(mode)`` is a base URL whose path names the
    mode."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self.writers: set[asyncio.StreamWriter] = set()

    async def _handle(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    @staticmethod
    async def read_request(reader: asyncio.StreamReader) -> str:
        """Read one request, head and body; the mode its path names (``/MODE/...``)."""
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        await reader.readexactly(length)
        return head.split(b" ")[1].decode().split("/")[1]

    def serve(self, started: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        started.set()
        self.loop.run_forever()
        server.close()
        for writer in self.writers:
            writer.transport.abort()
        tasks = asyncio.all_tasks(self.loop)
        for task in tasks:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self.loop.run_until_complete(server.wait_closed())
        self.loop.close()

    def url(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.port}/{mode}"


@contextlib.contextmanager
def raw_server(srv: RawServerT) -> Iterator[RawServerT]:
    """``srv`` serving on a thread until the block ends."""
    started = threading.Event()
    thread = threading.Thread(target=srv.serve, args=(started,), daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield srv
    finally:
        srv.loop.call_soon_threadsafe(srv.loop.stop)
        thread.join(10)


def config_refused(tmp_path: Path, toml: str) -> str:
    """The message of the ``ConfigError`` a config file of ``toml`` is refused with."""
    cfg = tmp_path / "lockgate.toml"
    cfg.write_text(toml)
    with pytest.raises(ConfigError) as err:
        load_settings(cfg)
    return str(err.value)
