"""A recording HTTP proxy for the benchmarks: forwards chat completions to the simulator
and notes, on this process's clock, when each request arrived, when its answer left,
its status and the Retry-After it named. Runs on its own event loop in a thread."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import aiohttp
from aiohttp import web


class RecordingProxy:
    """``with RecordingProxy(upstream_base_url) as p: ... p.url ... p.log``."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.log: list[dict[str, Any]] = []
        self.url = ""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, daemon=True, name="proxy")

    def _main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

        async def handle(request: web.Request) -> web.Response:
            entry: dict[str, Any] = {"t": time.monotonic(),
                                     "key": request.headers.get("Idempotency-Key")}
            self.log.append(entry)
            body = await request.read()
            headers = {k: v for k, v in request.headers.items()
                       if k.lower() in ("content-type", "authorization", "idempotency-key")}
            async with session.post(f"{self.upstream}{request.path}", data=body,
                                    headers=headers) as resp:
                data = await resp.read()
                out_headers = {k: v for k, v in resp.headers.items()
                               if k.lower().startswith(("x-ratelimit", "retry-after"))}
                entry.update(done=time.monotonic(), status=resp.status,
                             retry_after_ms=int(resp.headers.get("retry-after-ms", 0)) or None)
                return web.Response(status=resp.status, body=data,
                                    content_type="application/json", headers=out_headers)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/v1"
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()
        await session.close()

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)
