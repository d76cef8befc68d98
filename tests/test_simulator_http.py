"""The simulator's lean HTTP/1.1 server, byte for byte over real sockets: keep-alive,
pipelining, HTTP/1.0, chunked bodies, ``Expect: 100-continue``, malformed input, size
limits, handler failures, dropped connections, and the aiohttp flavour of the same
handlers."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from lockgate.simulator import Simulator, SimulatorConfig, build_app, start
from lockgate.simulator.http import DROP, Reply, Request, serve_http

CHAT = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hello"}]})


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """One HTTP response (Content-Length framed, as the server always sends)."""
    status_line = await asyncio.wait_for(reader.readline(), 5)
    assert status_line.startswith(b"HTTP/1.1 "), status_line
    headers: dict[str, str] = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers["content-length"]))
    return int(status_line.split()[1]), headers, body


async def _with_server(test: Callable[[str, int], Awaitable[None]],
                       config: SimulatorConfig | None = None) -> None:
    handle = await start(config, port=0)
    try:
        await test(handle.host, handle.port)
    finally:
        await handle.close()


def _post(path: str, body: bytes, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


def test_keep_alive_serves_many_requests_on_one_connection() -> None:
    async def test(host: str, port: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        for _ in range(3):
            writer.write(_post("/v1/chat/completions", CHAT))
            status, headers, body = await _read_response(reader)
            assert status == 200
            assert headers["content-type"] == "application/json"
            assert "date" in headers and "connection" not in headers
            assert orjson.loads(body)["choices"][0]["message"]["role"] == "assistant"
        writer.close()

    run(_with_server(test))


def test_pipelined_requests_are_answered_in_order() -> None:
    async def test(host: str, port: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        # The first request is slow (latency 50 ms), the second instant: order must hold.
        writer.write(_post("/v1/chat/completions", CHAT)
                     + b"GET /_sim/health HTTP/1.1\r\nHost: x\r\n\r\n"
                     + b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n")
        first = await _read_response(reader)
        second = await _read_response(reader)
        third = await _read_response(reader)
        assert first[0] == 200 and b"chat.completion" in first[2]
        assert second[0] == 200 and orjson.loads(second[2])["ok"] is True
        assert third[0] == 404 and orjson.loads(third[2])["error"]["code"] == "unknown_url"
        writer.close()

    run(_with_server(test, SimulatorConfig.model_validate({"latency": 50})))


def test_head_gets_headers_without_a_body() -> None:
    async def test(host: str, port: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        # The 404's length is announced but no body follows: the next answer parses.
        writer.write(b"HEAD /_sim/health HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"GET /_sim/health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"HTTP/1.1 404")
        head = b""
        while not head.endswith(b"\r\n\r\n"):
            head += await reader.readline()
        assert b"Content-Length: " in head
        status, _, body = await _read_response(reader)
        assert status == 200 and orjson.loads(body)["ok"] is True
        writer.close()

    run(_with_server(test))


def test_http10_gets_connection_close() -> None:
    async def test(host: str, port: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET /_sim/health HTTP/1.0\r\n\r\n")
        status, headers, _ = await _read_response(reader)
        assert status == 200 and headers["connection"] == "close"
        assert await asyncio.wait_for(reader.read(), 5) == b""  # the server closed it
        writer.close()

    run(_with_server(test))


def test_chunked_body_and_expect_continue() -> None:
    async def test(host: str, port: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        half = len(CHAT) // 2
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Transfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n")
        assert await asyncio.wait_for(reader.readline(), 5) == b"HTTP/1.1 100 Continue\r\n"
        assert await reader.readline() == b"\r\n"
        for part in (CHAT[:half], CHAT[half:]):
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
        writer.write(b"0\r\n\r\n")
        status, _, body = await _read_response(reader)
        assert status == 200 and orjson.loads(body)["usage"]["prompt_tokens"] > 0
        writer.close()

    run(_with_server(test))


def test_malformed_request_gets_400_and_close() -> None:
    async def test(host: str, port: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"THIS IS NOT HTTP\r\n\r\n")
        status, headers, body = await _read_response(reader)
        assert status == 400 and headers["connection"] == "close"
        assert "Malformed HTTP request" in orjson.loads(body)["error"]["message"]
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()

    run(_with_server(test))


async def _lean(handler: Callable[[Request], Awaitable[Reply]], max_body: int = 1 << 20,
                ) -> tuple[Any, str, int]:
    server = await serve_http(handler, "127.0.0.1", 0, max_body=max_body)
    return server, "127.0.0.1", server.port


def test_body_over_the_limit_gets_413() -> None:
    async def echo(request: Request) -> Reply:
        return Reply(200, await request.read())

    async def main() -> None:
        server, host, port = await _lean(echo, max_body=100)
        try:
            # Announced too large: refused before the body is read.
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(_post("/", b"x" * 101))
            assert (await _read_response(reader))[0] == 413
            writer.close()
            # Chunked and too large: refused when the body passes the limit.
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                         + b"40\r\n" + b"y" * 64 + b"\r\n" + b"40\r\n" + b"y" * 64 + b"\r\n")
            assert (await _read_response(reader))[0] == 413
            writer.close()
            # At the limit: echoed.
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(_post("/", b"z" * 100))
            status, _, body = await _read_response(reader)
            assert status == 200 and body == b"z" * 100
            writer.close()
        finally:
            await server.close(1.0)

    run(main())


def test_handler_failure_is_a_500_and_the_connection_survives() -> None:
    async def flaky(request: Request) -> Reply:
        if request.path == "/boom":
            raise RuntimeError("boom")
        return Reply(200, b'{"q":"%s"}' % request.query.get("a", "").encode(),
                     {"x-extra": "1"})

    async def main() -> None:
        server, host, port = await _lean(flaky)
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n")
            status, _, body = await _read_response(reader)
            assert status == 500 and "see its log" in orjson.loads(body)["error"]["message"]
            writer.write(b"GET /ok?a=b%20c HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, body = await _read_response(reader)
            assert status == 200 and headers["x-extra"] == "1"
            assert orjson.loads(body) == {"q": "b c"}
            writer.close()
        finally:
            await server.close(1.0)

    run(main())


def test_drop_closes_the_connection_without_an_answer() -> None:
    async def drop(request: Request) -> Reply:
        return DROP

    async def main() -> None:
        server, host, port = await _lean(drop)
        try:
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert await asyncio.wait_for(reader.read(), 5) == b""
            writer.close()
        finally:
            await server.close(1.0)

    run(main())


def test_header_names_are_case_insensitive() -> None:
    seen: dict[str, Any] = {}

    async def look(request: Request) -> Reply:
        seen["key"] = request.headers.get("Idempotency-Key")
        seen["auth"] = request.headers["AUTHORIZATION"]
        seen["has"] = "x-Custom" in request.headers
        return Reply(200, b"{}")

    async def main() -> None:
        server, host, port = await _lean(look)
        try:
            with socket.create_connection((host, port), timeout=5) as sock:
                await asyncio.get_running_loop().sock_sendall(
                    sock, b"GET / HTTP/1.1\r\nidempotency-key: k1\r\nAuthorization: Bearer t"
                    b"\r\nX-CUSTOM: 1\r\n\r\n")
                await asyncio.sleep(0.2)
        finally:
            await server.close(1.0)

    run(main())
    assert seen == {"key": "k1", "auth": "Bearer t", "has": True}


def test_close_waits_for_running_handlers() -> None:
    finished: list[bool] = []

    async def slow(request: Request) -> Reply:
        await asyncio.sleep(0.2)
        finished.append(True)
        return Reply(200, b"{}")

    async def main() -> None:
        server, host, port = await _lean(slow)
        _reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(0.05)
        await server.close(5.0)
        assert finished == [True]
        writer.close()

    run(main())


def test_build_app_serves_the_same_handlers_on_aiohttp() -> None:
    async def main() -> None:
        sim = Simulator(SimulatorConfig.model_validate({"rpm": 10}))
        runner = web.AppRunner(build_app(sim))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession() as session:
                async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                                        data=CHAT) as resp:
                    assert resp.status == 200
                    assert resp.headers["x-ratelimit-limit-requests"] == "10"
                    assert (await resp.json())["object"] == "chat.completion"
                async with session.get(f"http://127.0.0.1:{port}/elsewhere") as resp:
                    assert resp.status == 404
                    assert (await resp.json())["error"]["code"] == "unknown_url"
                sim.configure({"rate_timeout": 1.0, "hang_s": 0.1})
                async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                                        data=CHAT) as resp:
                    raise AssertionError(f"a hang was answered: {resp.status}")
        except aiohttp.ServerDisconnectedError:
            pass
        finally:
            await runner.cleanup()

    run(main())


def test_error_bodies_are_valid_json_whatever_the_message() -> None:
    from lockgate.simulator.http import _error

    reply = _error(400, 'bad "quote" and \\ backslash\nnewline')
    assert orjson.loads(reply.body)["error"]["message"] == \
        'bad "quote" and \\ backslash\nnewline'


def test_short_window_enforcement_with_a_clock_moved_by_hand() -> None:
    """60,000 requests per 60 s enforced as 1,000 in any second, byte for byte over HTTP:
    the exact headers of each style, on a simulator whose rate-limit clock the test
    moves."""
    now = [100.0]

    async def main() -> None:
        config = SimulatorConfig.model_validate({"rpm": 60_000, "enforce_s": 1})
        handle = await start(config, port=0, clock=lambda: now[0])
        url = f"{handle.url}/chat/completions"
        try:
            async with aiohttp.ClientSession() as session:
                async def chat() -> tuple[int, dict[str, str]]:
                    async with session.post(url, data=CHAT) as resp:
                        await resp.read()
                        return resp.status, {k.lower(): v for k, v in resp.headers.items()
                                             if k.lower().startswith(("x-ratelimit", "retry"))}

                for i in range(1000):
                    now[0] = 100.0 + i / 2048
                    assert (await chat())[0] == 200
                now[0] = 100.5
                assert await chat() == (429, {
                    "x-ratelimit-limit-requests": "60000",
                    "x-ratelimit-remaining-requests": "59000",
                    "x-ratelimit-reset-requests": "59.5s",
                    "retry-after-ms": "500", "retry-after": "1"})
                handle.simulator.configure({"header_style": "gateway",
                                            "retry_hint": "seconds"})
                assert await chat() == (429, {
                    "x-ratelimit-limit-requests": "60000",
                    "x-ratelimit-remaining-requests": "59000", "retry-after": "1"})
                handle.simulator.configure({"retry_hint": "none"})
                assert await chat() == (429, {
                    "x-ratelimit-limit-requests": "60000",
                    "x-ratelimit-remaining-requests": "59000"})
                now[0] = 101.0  # the first admission has left the second
                assert await chat() == (200, {
                    "x-ratelimit-limit-requests": "60000",
                    "x-ratelimit-remaining-requests": "58999"})
                handle.simulator.configure({"header_style": "none", "retry_hint": "both"})
                assert await chat() == (429, {})
                now[0] = 160.0  # a later second, with the minute far from full
                assert await chat() == (200, {})
                stats = handle.simulator.stats
                assert stats.limited_by == {"requests": 4}
                assert stats.by_status == {"200": 1002, "429": 4}
        finally:
            await handle.close()

    run(main())
