"""Provider answers of the fourth review: a request is sent again only when it went out
on a reused keep-alive connection (never on a new one: the server may have run and
billed it); a connection that ends after the request was sent is a failed answer
(``server_error``, an attempt spent), not an endpoint down; the usage of a billed
answer that is an error here is recorded; UTF-8 JSON mislabelled ISO-8859-1 is read as
UTF-8; a long header line is taken by both clients; a body that stalls after its
status says so; a wrong base_url path, a TLS mistake and a proxy are named; two
classification nits."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import ssl
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from yarl import URL

import helpers
from helpers import call_model, chat_server
from lockgate import Lockgate
from lockgate.config import Endpoint
from lockgate.errors import ErrorClass
from lockgate.providers import reach
from lockgate.providers.base import Completion, ProviderError
from lockgate.providers.environment import proxy_for
from lockgate.providers.openai import _environment, classify_response
from lockgate.worker.loop import run_async

CLIENTS = ["aiohttp", "pyreqwest"]
USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
OK = {"id": "x", "model": "m-answered", "usage": USAGE,
      "choices": [{"index": 0, "finish_reason": "stop",
                   "message": {"role": "assistant", "content": '{"label": "yes"}'}}]}
OK_BYTES = json.dumps(OK).encode()


def _response(body: bytes = OK_BYTES, extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + extra
            + b"Content-Length: %d\r\n\r\n" % len(body)) + body


class RawServer(helpers.RawServer):
    """Answers ``POST /{mode}/chat/completions`` by its mode, counting requests:

    * ``hold``: every request is read, held a moment, then its connection closed
      without an answer (a server that took it and failed);
    * ``status-only``: a status line, then a close;
    * ``stale``: the first request on a connection is answered (keep-alive), a later
      one met by a close without an answer (an idle timer that fired as it came);
    * ``big-header``: a valid answer with a 9 KB ``Set-Cookie`` line;
    * ``stall``: a status, headers and part of the body, then nothing.
    """

    def __init__(self) -> None:
        super().__init__()
        self.requests: Counter[str] = Counter()

    async def _handle(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        n = 0
        self.writers.add(writer)
        try:
            while True:
                mode = await self.read_request(reader)
                n += 1
                self.requests[mode] += 1
                if mode == "hold" or (mode == "stale" and n > 1):
                    await asyncio.sleep(0.2 if mode == "hold" else 0)
                    writer.close()
                    return
                if mode == "status-only":
                    writer.write(b"HTTP/1.1 200 OK\r\n")
                    await writer.drain()
                    writer.close()
                    return
                if mode == "stall":
                    writer.write(_response()[:-len(OK_BYTES) + 10])
                    await writer.drain()
                    await reader.read()
                    return
                extra = b"Set-Cookie: session=" + b"a" * 9000 + b"\r\n" \
                    if mode == "big-header" else b""
                writer.write(_response(extra=extra))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


@pytest.fixture
def raw() -> Iterator[RawServer]:
    with helpers.raw_server(RawServer()) as srv:
        yield srv


_calls = helpers.calls_through


def _task(i: int, max_retries: int = 1) -> dict[str, Any]:
    return {"task_id": f"t-{i}", "prompt_template": "Say yes about {x}",
            "input_data": {"x": str(i)}, "model_config": {"name": "m"},
            "delivery_rule": {"format": "json", "required_keys": ["label"]},
            "retry_policy": {"max_retries": max_retries, "base_delay_ms": 10}}


# -- 1. a resend only on a reused keep-alive connection -------------------------------


@pytest.mark.parametrize("client", CLIENTS)
def test_a_request_dropped_on_a_new_connection_is_not_sent_again(
        raw: RawServer, client: str) -> None:
    # It was resent at once, unbilled and uncounted, although the server held it
    # (it had taken it: a second request may run and bill the model twice)
    (err,) = _calls(raw.url("hold"), client)
    assert isinstance(err, ProviderError), err
    assert raw.requests["hold"] == 1
    assert not err.resent


@pytest.mark.parametrize("client", CLIENTS)
def test_a_stale_reused_connection_is_sent_again_and_said_so(raw: RawServer,
                                                             client: str) -> None:
    # calls 1 and 3 open a pooled connection; 2 and 4 go on it when the server has let
    # it go, and are sent again once each, on a new connection: counted as resent
    got = _calls(raw.url("stale"), client, n=4)
    assert all(isinstance(g, Completion) for g in got), got
    assert raw.requests["stale"] == 6
    assert [g.resent for g in got if isinstance(g, Completion)] == [False, True] * 2


# -- 2. a connection that ends after the request was sent ------------------------------


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("mode", ["hold", "status-only"])
def test_a_connection_closed_after_the_request_is_a_failed_answer(
        raw: RawServer, client: str, mode: str) -> None:
    # It was connection_error ("endpoint down": no attempt spent, called again and
    # again for up to an hour), the message a raw Python repr on aiohttp
    (err,) = _calls(raw.url(mode), client)
    assert isinstance(err, ProviderError), err
    assert err.error_class is ErrorClass.SERVER_ERROR
    assert "closed after the request was sent" in err.message
    assert "RawResponseMessage" not in err.message and "<" not in err.message
    assert raw.requests[mode] == 1


@contextlib.contextmanager
def socket_closed_port() -> Iterator[int]:
    """A local port nothing listens on."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port: int = s.getsockname()[1]
    s.close()
    yield port


@pytest.mark.parametrize("client", CLIENTS)
def test_a_port_nothing_listens_on_is_still_a_connection_error(client: str) -> None:
    with socket_closed_port() as port:
        err = call_model(f"http://127.0.0.1:{port}/v1", "m", client)
    assert isinstance(err, ProviderError) and err.error_class is ErrorClass.CONNECTION_ERROR


@pytest.mark.parametrize("client", CLIENTS)
def test_a_server_that_drops_every_request_spends_attempts(
        raw: RawServer, client: str, tmp_path: Path) -> None:
    # repro drop-all: 22 requests, 0 attempts spent, each with a new Idempotency-Key,
    # for up to endpoint_down_max_s; now each call is an attempt (max_retries 1: 2)
    config = tmp_path / "lockgate.toml"
    config.write_text(f'[[endpoint]]\nname = "mock"\nbase_url = "{raw.url("hold")}"\n'
                      f'[worker]\nconcurrency = 1\nhttp_client = "{client}"\n'
                      '[flow]\nendpoint_down_max_s = 2\n')
    with Lockgate(f"sqlite:///{tmp_path / 'w.db'}", config=config) as lg:
        lg.submit([_task(0)], batch_id="b")
        run_async(lg.worker(burst=True, gate=False).run())
        task = lg.task("t-0")
    assert task.status == "DEAD" and task.attempts == 2
    assert task.error is not None and task.error.error_class == "server_error"
    assert [a.outcome for a in task.attempt_log] == ["retry", "dead"]
    assert raw.requests["hold"] == 2


# -- 3. the usage of a billed answer that is an error here ------------------------------


BILLED_ERRORS = {
    "tool_calls": {"choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "tool_calls": [{
            "id": "c1", "type": "function",
            "function": {"name": "classify", "arguments": "{}"}}]}}]},
    "refusal": {"choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": None, "refusal": "I can't help with that."}}]},
    "content_filter": {"choices": [{"index": 0, "finish_reason": "content_filter",
                                    "message": {"role": "assistant", "content": None}}]},
    "no_choices": {"choices": []},
}


def _billed(kind: str) -> dict[str, Any]:
    return {"id": "x", "object": "chat.completion", "model": "m-answered",
            "usage": USAGE, **BILLED_ERRORS[kind]}


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("kind", sorted(BILLED_ERRORS))
def test_a_billed_answer_that_is_an_error_carries_its_usage(client: str,
                                                            kind: str) -> None:
    async def handle(_request: web.Request) -> web.Response:
        return web.json_response(_billed(kind))

    with chat_server(handle) as url:
        err = call_model(url, "m", client)
    assert isinstance(err, ProviderError), err
    assert (err.prompt_tokens, err.completion_tokens, err.model) == (10, 5, "m-answered")


def test_a_billed_refusal_records_its_tokens_on_the_attempt(tmp_path: Path) -> None:
    # the attempt's input/output tokens were null: cost per task missed them
    async def handle(_request: web.Request) -> web.Response:
        return web.json_response(_billed("refusal"))

    with chat_server(handle) as url:
        config = tmp_path / "lockgate.toml"
        config.write_text(f'[[endpoint]]\nname = "mock"\nbase_url = "{url}"\n')
        with Lockgate(f"sqlite:///{tmp_path / 'w.db'}", config=config) as lg:
            lg.submit([_task(0, max_retries=0)], batch_id="b")
            run_async(lg.worker(burst=True, gate=False).run())
            task = lg.task("t-0")
    assert task.status == "FAILED"
    (attempt,) = task.attempt_log
    assert attempt.error is not None and attempt.error.error_class == "content_filtered"
    assert (attempt.input_tokens, attempt.output_tokens) == (10, 5)


# -- 4. UTF-8 JSON labelled ISO-8859-1 -------------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(("charset", "encoding"), [
    ("ISO-8859-1", "utf-8"),  # a gateway's default label on UTF-8 JSON
    ("iso-8859-1", "latin-1"),  # a body really in Latin-1 (not valid UTF-8)
    ("gbk", "gbk"),
])
def test_json_is_read_as_utf8_before_its_declared_charset(client: str, charset: str,
                                                          encoding: str) -> None:
    text = '{"label": "快递没到 café"}' if encoding != "latin-1" else '{"label": "café"}'
    body = {**OK, "choices": [{"index": 0, "finish_reason": "stop",
                               "message": {"role": "assistant", "content": text}}]}

    async def handle(_request: web.Request) -> web.Response:
        return web.Response(body=json.dumps(body, ensure_ascii=False).encode(encoding),
                            headers={"Content-Type": f"application/json;charset={charset}"})

    with chat_server(handle) as url:
        got = call_model(url, "m", client)
    assert isinstance(got, Completion), got
    assert got.content == text


# -- 5. a long header line ------------------------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
def test_a_9_kb_header_line_is_taken_by_both_clients(raw: RawServer, client: str) -> None:
    # aiohttp refused it as "not valid HTTP" (its 8190-byte line limit); pyreqwest took it
    (got,) = _calls(raw.url("big-header"), client)
    assert isinstance(got, Completion), got
    assert got.content == '{"label": "yes"}'


# -- 6. a body that stalls after its status ---------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
def test_a_body_that_stalls_after_its_status_keeps_the_status(raw: RawServer,
                                                              client: str) -> None:
    (err,) = _calls(raw.url("stall"), client, timeout_s=0.5)
    assert isinstance(err, ProviderError), err
    assert err.error_class is ErrorClass.TIMEOUT
    assert err.http_status == 200
    assert "HTTP 200" in err.message and "did not finish" in err.message


# -- 7. a wrong base_url path ---------------------------------------------------------


@pytest.fixture
def root_only() -> Iterator[str]:
    """A server with its API under /v1 only: any other path is aiohttp's 404 (or a
    405 for a path that takes GET only)."""
    with chat_server(_ok) as url:
        yield url.removesuffix("/v1")


async def _ok(_request: web.Request) -> web.Response:
    return web.json_response(OK)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_404_on_a_wrong_path_names_the_url_and_base_url(root_only: str,
                                                          client: str) -> None:
    err = call_model(root_only, "m", client)  # base_url without its /v1
    assert isinstance(err, ProviderError), err
    assert err.error_class is ErrorClass.INVALID_REQUEST and err.http_status == 404
    assert f"{root_only}/chat/completions" in err.message
    assert "base_url" in err.message and "/v1" in err.message


@pytest.mark.parametrize("client", CLIENTS)
def test_a_404_that_names_a_model_is_not_taken_for_a_wrong_path(client: str) -> None:
    async def handle(_request: web.Request) -> web.Response:
        return web.json_response({"error": {
            "message": "The model `gpt-5x` does not exist or you do not have access to it.",
            "type": "invalid_request_error", "code": "model_not_found"}}, status=404)

    with chat_server(handle) as url:
        err = call_model(url, "gpt-5x", client)
    assert isinstance(err, ProviderError), err
    assert "gpt-5x" in err.message and "base_url" not in err.message


# -- 8. TLS mistakes ------------------------------------------------------------------


@pytest.fixture
def tls_servers(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """A plain-HTTP port and a TLS port with a self-signed certificate."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    _self_signed(key, cert)
    state: dict[str, Any] = {}
    started = threading.Event()

    def serve() -> None:
        loop = asyncio.new_event_loop()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", _ok)
        runner = web.AppRunner(app)
        loop.run_until_complete(runner.setup())
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(cert, key)
        plain = web.TCPSite(runner, "127.0.0.1", 0)
        tls = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
        loop.run_until_complete(plain.start())
        loop.run_until_complete(tls.start())
        state["loop"] = loop
        state["ports"] = tuple(a[1] for a in runner.addresses)
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield state["ports"]
    finally:
        state["loop"].call_soon_threadsafe(state["loop"].stop)
        thread.join(10)


#: A self-signed certificate for localhost (valid until 2126) and its key.
SELF_SIGNED_KEY = """\
-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgdwQ+C8e+1XIWQhTu
7SpwUN2WHoxu5RaKAHyvpL+AYAqhRANCAATDUqVqMow6kOdr6ZoqBW+91Yt8UEGy
oAfAqncX+2j236j85vNVhcOEivaW4b3ie7nep2kJDa4zEmXlnSqjpXKi
-----END PRIVATE KEY-----
"""
SELF_SIGNED_CERT = """\
-----BEGIN CERTIFICATE-----
MIIBlTCCATugAwIBAgIUKzz3f0rUlR528DGPgRdwW25HSC4wCgYIKoZIzj0EAwIw
FDESMBAGA1UEAwwJbG9jYWxob3N0MCAXDTI2MTIwNzA1MzU0NFoYDzIxMjYxMTEz
MDUzNTQ0WjAUMRIwEAYDVQQDDAlsb2NhbGhvc3QwWTATBgcqhkjOPQIBBggqhkjO
PQMBBwNCAATDUqVqMow6kOdr6ZoqBW+91Yt8UEGyoAfAqncX+2j236j85vNVhcOE
ivaW4b3ie7nep2kJDa4zEmXlnSqjpXKio2kwZzAdBgNVHQ4EFgQU0+h63S/WWJHI
/+9x2xUc7tz4170wHwYDVR0jBBgwFoAU0+h63S/WWJHI/+9x2xUc7tz4170wDwYD
VR0TAQH/BAUwAwEB/zAUBgNVHREEDTALgglsb2NhbGhvc3QwCgYIKoZIzj0EAwID
SAAwRQIhAL95FUbo/Yr4XD1oXuAstUnGy6Z6nDTWZkht2W66szG2AiBwgRl3OYTb
aQwQkjk1+VjXEi7N/OgQvG1mVVyuQw5gsQ==
-----END CERTIFICATE-----
"""


def _self_signed(key: Path, cert: Path) -> None:
    key.write_text(SELF_SIGNED_KEY)
    cert.write_text(SELF_SIGNED_CERT)


def test_the_start_check_does_the_tls_handshake(tls_servers: tuple[int, int]) -> None:
    # It opened TCP only: https:// to a plain-HTTP port and a certificate not trusted
    # passed, then every task waited as "endpoint down" for up to an hour
    plain, tls = tls_servers
    found = {u.name: u.cause for u in reach.check([
        Endpoint(name="scheme", base_url=f"https://127.0.0.1:{plain}/v1"),
        Endpoint(name="cert", base_url=f"https://localhost:{tls}/v1"),
        Endpoint(name="fine", base_url=f"http://127.0.0.1:{plain}/v1")])}
    assert set(found) == {"scheme", "cert"}
    assert "use http://" in found["scheme"]
    assert "SSL_CERT_FILE" in found["cert"]


@pytest.mark.parametrize("client", CLIENTS)
def test_a_tls_error_during_work_names_its_fix(tls_servers: tuple[int, int],
                                               client: str) -> None:
    plain, tls = tls_servers
    err = call_model(f"https://127.0.0.1:{plain}/v1", "m", client)
    assert isinstance(err, ProviderError) and "use http://" in err.message, err
    err = call_model(f"https://localhost:{tls}/v1", "m", client)
    assert isinstance(err, ProviderError) and "SSL_CERT_FILE" in err.message, err


# -- 9. HTTP(S)_PROXY and NO_PROXY ------------------------------------------------------


@pytest.fixture
def proxy(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """An HTTP proxy (it serves the absolute-form requests sent to it) set in
    HTTP_PROXY; counts the hosts asked for."""
    asked: Counter[str] = Counter()

    async def handle(request: web.Request) -> web.Response:
        asked[request.url.host or ""] += 1
        return web.json_response(OK)

    with chat_server(handle) as url:
        for name in ("HTTP_PROXY", "http_proxy"):
            monkeypatch.setenv(name, url.removesuffix("/v1"))
        for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY",
                     "all_proxy"):
            monkeypatch.delenv(name, raising=False)
        yield asked


@pytest.mark.parametrize("client", CLIENTS)
def test_both_clients_send_through_the_proxy_of_the_environment(proxy: Counter[str],
                                                                client: str) -> None:
    # aiohttp ignored HTTP_PROXY (pyreqwest honoured it): a host only the proxy reaches
    # was a connection error
    got = call_model("http://upstream.invalid/v1", "m", client)
    assert isinstance(got, Completion), got
    assert proxy["upstream.invalid"] == 1


@pytest.mark.parametrize("client", CLIENTS)
def test_no_proxy_is_honoured_by_both_clients(proxy: Counter[str], client: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    with chat_server(_ok) as url:
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        got = call_model(url, "m", client)
    assert isinstance(got, Completion), got
    assert not proxy


@pytest.mark.parametrize("client", CLIENTS)
def test_a_proxy_written_without_a_scheme_is_an_http_proxy_for_both_clients(
        proxy: Counter[str], client: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # HTTP_PROXY=host:port (no http://): pyreqwest and the start check took it for an
    # HTTP proxy, aiohttp for a URL whose scheme is the host: every call failed,
    # "connection_error: InvalidURL: 127.0.0.1:PORT", after a start check that passed
    for name in ("HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(name, os.environ[name].removeprefix("http://"))
    got = call_model("http://upstream.invalid/v1", "m", client)
    assert isinstance(got, Completion), got
    assert proxy["upstream.invalid"] == 1
    assert reach.check([Endpoint(name="p", base_url="http://upstream.invalid/v1")]) == []


def test_the_client_reads_the_proxy_as_the_start_check_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # an https:// proxy was ignored by aiohttp (the calls went direct) while the start
    # check checked the proxy; a login in the proxy's URL goes to proxy_auth
    for name in ("NO_PROXY", "no_proxy", "HTTP_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "https://me:secret@proxy.corp:3128")
    env = _environment("https://api.example/v1", authorized=True)
    assert env.proxy == URL("https://proxy.corp:3128")
    assert env.proxy_auth is not None and env.proxy_auth.login == "me"
    assert proxy_for("https://api.example/v1") == "https://me:secret@proxy.corp:3128"
    monkeypatch.setenv("HTTPS_PROXY", "proxy.corp:3128")
    assert _environment("https://api.example/v1", authorized=True).proxy == URL(
        "http://proxy.corp:3128")
    monkeypatch.setenv("NO_PROXY", "api.example")
    assert _environment("https://api.example/v1", authorized=True).proxy is None
    assert proxy_for("https://api.example/v1") is None


def test_the_start_check_checks_the_proxy_not_the_host(proxy: Counter[str],
                                                       monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    # it connected directly: a host reachable only through the proxy was "unreachable"
    assert reach.check([Endpoint(name="p", base_url="http://upstream.invalid/v1")]) == []
    with socket_closed_port() as port:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{port}")
        monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{port}")
        (bad,) = reach.check([Endpoint(name="p", base_url="http://upstream.invalid/v1")])
    assert "proxy" in bad.cause and str(port) in bad.cause


# -- 10. classification ---------------------------------------------------------------


def test_longer_than_the_model_s_context_length_is_context_length_exceeded() -> None:
    err = classify_response(400, {"object": "error", "type": "BadRequestError", "message": (
        "The decoder prompt (length 9000) is longer than the model's context length "
        "(8192 tokens).")}, {})
    assert err.error_class is ErrorClass.CONTEXT_LENGTH_EXCEEDED


ZHIPU_1301 = {"error": {"code": "1301", "message": (
    "系统检测到输入或生成内容可能包含不安全或敏感内容，请您避免输入易产生敏感内容的提示语，"
    "感谢您的配合。")}}


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("status", [400, 200])
def test_zhipu_s_1301_is_content_filtered(client: str, status: int) -> None:
    async def handle(_request: web.Request) -> web.Response:
        return web.json_response(ZHIPU_1301, status=status)

    with chat_server(handle) as url:
        err = call_model(url, "glm-4", client)
    assert isinstance(err, ProviderError), err
    assert err.error_class is ErrorClass.CONTENT_FILTERED
