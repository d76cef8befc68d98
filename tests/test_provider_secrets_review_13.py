"""An endpoint's secrets stay out of its errors (review 13). A provider error that
repeated a secret was stored and printed as it came: OpenAI's 401 "Incorrect API key
provided: sk-...", a 400 that echoes the request's headers and query string, a proxy's
407 page that repeats the request. The key, the query's values, the Basic credential of
``base_url`` went into the task's error, its attempts, the body kept for exports and the
worker's warning at every retry; pyreqwest's connection errors named the URL with its
query string. A proxy that refused its login (407 to an https CONNECT) was ``server_error``
on aiohttp ("the endpoint's answer was not valid HTTP"): every attempt was spent."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
from collections.abc import Iterator

import pytest
from aiohttp import web

from helpers import RawServer, app_server, chat_server, raw_server
from lockgate.errors import ErrorClass
from lockgate.providers.base import Completion, CompletionRequest, ProviderError
from lockgate.providers.openai import OpenAICompatible

CLIENTS = ["aiohttp", "pyreqwest"]
KEY = "sk-SECRETKEY123abcXYZ"
QUERY = "QUERYKEY777"
PROXY_PASSWORD = "PROXYPASS"
BASIC = base64.b64encode(b"alice:BASICPASS").decode()


def _call(url: str, client: str, *, api_key: str | None = KEY,
          api_key_header: str | None = None,
          headers: dict[str, str] | None = None) -> Completion | ProviderError:
    async def main() -> Completion | ProviderError:
        prov = OpenAICompatible("ep", url, api_key=api_key, api_key_header=api_key_header,
                                headers=headers, http_client=client)  # type: ignore[arg-type]
        try:
            return await prov.complete(CompletionRequest(
                messages=[{"role": "user", "content": "hi"}], model="m", timeout_s=10,
                params={}, idempotency_key="k-1"))
        except ProviderError as exc:
            return exc
        finally:
            await prov.close()
    return asyncio.run(main())


def _told(err: ProviderError) -> str:
    """All an error tells (what is stored, exported and logged)."""
    return " ".join([str(err), repr(err.args), err.message, err.body or "",
                     err.request_id or "", err.model or ""])


async def _echo(request: web.Request) -> web.Response:
    """OpenAI's 401 for a wrong key (it repeats the key), or a 400 that echoes the
    request's headers and query string (``/echo/...``)."""
    auth = request.headers.get("Authorization", "")
    key = auth.removeprefix("Bearer ") or request.headers.get("api-key", "")
    mode = request.match_info["mode"]
    if mode == "k401":
        return web.json_response({"error": {
            "message": f"Incorrect API key provided: {key}. You can find your API key at "
                       "https://platform.openai.com/account/api-keys.",
            "type": "invalid_request_error", "code": "invalid_api_key"}}, status=401)
    if mode == "in200":  # an error object inside a 200 (gateways)
        return web.json_response({"error": {"message": f"key {key} is blocked",
                                            "code": 401}})
    if mode == "text":  # a text body, the key past the 290th character
        return web.Response(text="x" * 290 + f" {auth} end", status=502)
    return web.json_response({"error": {
        "message": f"bad request; headers were {json.dumps(dict(request.headers))} "
                   f"query={request.query_string}", "type": "invalid_request_error"}},
        status=400)


@pytest.fixture
def echo() -> Iterator[str]:
    """The root URL of :func:`_echo` (``ROOT/MODE/v1``)."""
    def routes(app: web.Application) -> None:
        app.router.add_post("/{mode}/v1/chat/completions", _echo)

    with app_server(routes) as root:
        yield root


@pytest.mark.parametrize("client", CLIENTS)
def test_a_key_the_error_repeats_is_masked(echo: str, client: str) -> None:
    # "auth_error: HTTP 401: Incorrect API key provided: sk-SECRETKEY123abcXYZ" in the
    # task's error, its attempts, the kept body and the worker's warning
    err = _call(f"{echo}/k401/v1", client)
    assert isinstance(err, ProviderError) and err.error_class is ErrorClass.AUTH_ERROR
    assert KEY not in _told(err), _told(err)
    assert "Incorrect API key provided: ***." in err.message
    assert err.body is not None and json.loads(err.body)["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("client", CLIENTS)
def test_echoed_headers_query_and_basic_credentials_are_masked(echo: str,
                                                               client: str) -> None:
    err = _call(f"{echo}/e400/v1?api-version=2024-10-21&api-key={QUERY}", client,
                headers={"X-Org-Token": "org-TOKEN-42", "X-Short": "ab"})
    assert isinstance(err, ProviderError), err
    told = _told(err)
    for secret in (KEY, QUERY, "org-TOKEN-42"):
        assert secret not in told, (secret, told)
    # the query's api-version, and a value too short to be a secret, are left
    assert "api-version=2024-10-21" in err.message and '"ab"' in err.message
    assert err.body is not None and json.loads(err.body)  # still JSON
    # the user and password of base_url, sent as Basic
    err = _call(f"http://alice:BASICPASS@{echo.removeprefix('http://')}/e400/v1", client,
                api_key=None)
    assert isinstance(err, ProviderError), err
    assert BASIC not in _told(err) and "BASICPASS" not in _told(err), _told(err)
    assert '"Basic ***"' in err.message


@pytest.mark.parametrize("client", CLIENTS)
def test_a_key_in_a_key_header_is_masked_before_the_body_is_cut(echo: str,
                                                                client: str) -> None:
    # a text body is cut at 300 characters for the message: a key masked after the cut
    # left its first characters
    err = _call(f"{echo}/text/v1", client)
    assert isinstance(err, ProviderError) and err.error_class is ErrorClass.SERVER_ERROR
    assert KEY[:8] not in _told(err), _told(err)
    err = _call(f"{echo}/k401/v1", client, api_key_header="api-key")
    assert isinstance(err, ProviderError) and KEY not in _told(err), _told(err)


@pytest.mark.parametrize("client", CLIENTS)
def test_an_error_inside_a_2xx_answer_is_masked(echo: str, client: str) -> None:
    err = _call(f"{echo}/in200/v1", client)
    assert isinstance(err, ProviderError) and err.error_class is ErrorClass.AUTH_ERROR
    assert KEY not in _told(err) and "key *** is blocked" in err.message, _told(err)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_connection_error_does_not_name_the_query_string(client: str) -> None:
    # pyreqwest: "error sending request for url (http://...?api-key=QUERYKEY777)"
    with socket.socket() as s:  # a port that was free a moment ago
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    err = _call(f"http://127.0.0.1:{port}/v1?api-key={QUERY}", client)
    assert isinstance(err, ProviderError)
    assert err.error_class is ErrorClass.CONNECTION_ERROR
    assert QUERY not in _told(err), _told(err)


def test_a_success_is_read_as_it_came() -> None:
    async def answer(request: web.Request) -> web.Response:
        return web.json_response({
            "id": "c-1", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": '{"k": "x"}'}}]})

    with chat_server(answer) as url:
        got = _call(url, "aiohttp")
    assert isinstance(got, Completion) and got.content == '{"k": "x"}', got


class _Proxy407(RawServer):
    """A proxy that answers every request with 407, its page repeating the request
    (with its Proxy-Authorization)."""

    async def _handle(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        body = b"proxy says no; you sent: " + head.replace(b"\r\n", b" | ")
        writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                     b"Proxy-Authenticate: Basic realm=x\r\nContent-Type: text/plain\r\n"
                     b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        await writer.drain()
        writer.close()


@pytest.fixture
def proxy407(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """HTTP_PROXY and HTTPS_PROXY set to :class:`_Proxy407`, with a login."""
    with raw_server(_Proxy407()) as srv:
        for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.delenv(name, raising=False)
        for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
            monkeypatch.setenv(name, f"http://puser:{PROXY_PASSWORD}@127.0.0.1:{srv.port}")
        yield


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("scheme", ["https", "http"])
def test_a_proxy_that_refuses_its_login_is_an_unreachable_endpoint(
        proxy407: None, client: str, scheme: str) -> None:
    # aiohttp, https: "server_error: the endpoint's answer was not valid HTTP: Proxy
    # Authentication Required" (every attempt spent); http: invalid_request, the page
    # repeating the key
    err = _call(f"{scheme}://api.example.test/v1", client)
    assert isinstance(err, ProviderError), err
    assert err.error_class is ErrorClass.CONNECTION_ERROR, err
    name = "HTTPS_PROXY" if scheme == "https" else "HTTP_PROXY"
    assert f"the proxy of {name}" in err.message and "407" in err.message, err.message
    assert "check the proxy login" in err.message
    told = _told(err)
    for secret in (KEY, PROXY_PASSWORD, base64.b64encode(b"puser:PROXYPASS").decode()):
        assert secret not in told, (secret, told)
