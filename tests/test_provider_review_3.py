"""Provider answers of the third review: a stale keep-alive connection (closed or reset
by the server before it answered) is sent again once on a new connection instead of
spending an attempt; 409 and 425 are retried; an answer sent as Server-Sent Events to
a request that asked for no stream is read as the completion it carries; Gemini's
refused key (a 400, its error wrapped in a list) is ``auth_error`` with Gemini's
message; a body cut by a reset names its status on pyreqwest as on aiohttp."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

import helpers
from helpers import call_model, chat_server
from lockgate import Lockgate
from lockgate.errors import ErrorClass
from lockgate.providers.base import Completion, ProviderError
from lockgate.providers.openai import classify_response
from lockgate.worker.loop import run_async

CLIENTS = ["aiohttp", "pyreqwest"]
OK = {"id": "x", "model": "m-1", "choices": [{"index": 0, "finish_reason": "stop",
      "message": {"role": "assistant", "content": '{"label": "yes"}'}}],
      "usage": {"prompt_tokens": 5, "completion_tokens": 3}}
OK_BYTES = json.dumps(OK).encode()


def _response(body: bytes = OK_BYTES) -> bytes:
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)) + body


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP reset rather than a FIN."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class RawServer(helpers.RawServer):
    """Answers ``POST /{mode}/chat/completions`` by its mode, counting the requests
    and connections of each mode:

    * ``stale``: the first request on a connection is answered (keep-alive, no
      ``Connection: close``), a later one is met by a close without an answer (a
      server whose idle timer fired as the request came);
    * ``stale-reset``: the same with a TCP reset;
    * ``never``: every request is met by a close without an answer;
    * ``cut``: a status line, headers and part of the body, then a reset;
    * ``head-cut``: part of a status line, then a close;
    * ``silent``: no answer at all;
    * ``sse``: a completion as Server-Sent Events, without a Content-Type.
    """

    def __init__(self) -> None:
        super().__init__()
        self.requests: Counter[str] = Counter()
        self.connections: Counter[str] = Counter()

    async def _handle(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        n = 0
        self.writers.add(writer)
        try:
            while True:
                mode = await self.read_request(reader)
                n += 1
                self.requests[mode] += 1
                if n == 1:
                    self.connections[mode] += 1
                if mode == "never" or (mode == "stale" and n > 1):
                    writer.close()
                    return
                if mode == "stale-reset" and n > 1:
                    _reset(writer)
                    return
                if mode == "cut":
                    writer.write(_response()[:-len(OK_BYTES) + 20])
                    await writer.drain()
                    await asyncio.sleep(0.05)
                    _reset(writer)
                    return
                if mode == "head-cut":
                    writer.write(b"HTTP/1.1 200")
                    await writer.drain()
                    writer.close()
                    return
                if mode == "silent":
                    await reader.read()
                    return
                if mode == "sse":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n"
                                 % len(STREAM) + STREAM)
                    await writer.drain()
                    continue
                writer.write(_response())
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


@pytest.fixture
def raw() -> Iterator[RawServer]:
    with helpers.raw_server(RawServer()) as srv:
        yield srv


_calls = helpers.calls_through


# -- 1. a stale keep-alive connection ------------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("mode", ["stale", "stale-reset"])
def test_a_stale_keep_alive_connection_is_sent_again_on_a_new_one(
        raw: RawServer, client: str, mode: str) -> None:
    # Each reuse of a pooled connection was connection_error: an attempt spent and a
    # failure for the breaker although the server never saw the request
    got = _calls(raw.url(mode), client, n=4)
    assert all(isinstance(g, Completion) for g in got), got
    # calls 1 and 3 on a new pooled connection; 2 and 4 on it when stale, then once
    # more on a new connection (closed after it)
    assert raw.requests[mode] == 6
    assert raw.connections[mode] == 4


@pytest.mark.parametrize("client", CLIENTS)
def test_a_close_before_an_answer_on_a_new_connection_is_a_failed_answer(
        raw: RawServer, client: str) -> None:
    # (review 4: only a request sent on a reused keep-alive connection is sent again;
    # on a new one the server took it and failed to answer: server_error, not sent
    # again, see tests/test_provider_review_4.py)
    (err,) = _calls(raw.url("never"), client)
    assert isinstance(err, ProviderError), err
    assert err.error_class is ErrorClass.SERVER_ERROR and err.http_status is None
    assert raw.requests["never"] == 1


@pytest.mark.parametrize("client", CLIENTS)
def test_an_answer_cut_after_its_status_line_is_not_sent_again(raw: RawServer,
                                                                client: str) -> None:
    # the server may have run the model: another request could be billed twice
    (err,) = _calls(raw.url("cut"), client)
    assert isinstance(err, ProviderError), err
    assert raw.requests["cut"] == 1


def test_an_answer_cut_in_its_status_line_is_not_sent_again_on_aiohttp(
        raw: RawServer) -> None:
    # aiohttp tells a close with part of a response come (hyper does not: pyreqwest
    # sends such a request again, as after a close with nothing come)
    (err,) = _calls(raw.url("head-cut"), "aiohttp")
    # (review 4: server_error, an attempt spent, not connection_error)
    assert isinstance(err, ProviderError) and err.error_class is ErrorClass.SERVER_ERROR
    assert raw.requests["head-cut"] == 1


@pytest.mark.parametrize("client", CLIENTS)
def test_a_timeout_is_not_sent_again(raw: RawServer, client: str) -> None:
    (err,) = _calls(raw.url("silent"), client, timeout_s=0.3)
    assert isinstance(err, ProviderError) and err.error_class is ErrorClass.TIMEOUT
    assert raw.requests["silent"] == 1


@pytest.mark.parametrize("client", CLIENTS)
def test_stale_connections_spend_no_attempt_of_a_worker(raw: RawServer, client: str,
                                                        tmp_path: Path) -> None:
    # p01: with max_retries 1, tasks whose calls met two stale connections ended DEAD
    config = tmp_path / "lockgate.toml"
    config.write_text(f'[[endpoint]]\nname = "mock"\nbase_url = "{raw.url("stale")}"\n'
                      f'[worker]\nconcurrency = 1\nhttp_client = "{client}"\n')
    with Lockgate(f"sqlite:///{tmp_path / 'w.db'}", config=config) as lg:
        lg.submit([{"task_id": f"t-{i}", "prompt_template": "Say yes about {x}",
                    "input_data": {"x": str(i)}, "model_config": {"name": "m"},
                    "delivery_rule": {"format": "json", "required_keys": ["label"]},
                    "retry_policy": {"max_retries": 1, "base_delay_ms": 10}}
                   for i in range(6)], batch_id="b")
        stats = run_async(lg.worker(burst=True, gate=False).run())
        assert stats.succeeded == 6
        assert lg.status().batches["b"] == {"SUCCEEDED": 6}
        assert [lg.task(f"t-{i}").attempts for i in range(6)] == [1] * 6
    assert raw.requests["stale"] >= 6


# -- 2. 409 and 425 -------------------------------------------------------------------


@pytest.mark.parametrize("status", [409, 425])
@pytest.mark.parametrize("body", [
    {"error": {"message": "Conflict: another request is in progress", "type": "conflict"}},
    "",
])
def test_409_and_425_are_retried(status: int, body: Any) -> None:
    # They were invalid_request: the task FAILED at once although a retry succeeds
    err = classify_response(status, body, {})
    assert err.error_class is ErrorClass.SERVER_ERROR and err.http_status == status


@pytest.mark.parametrize("client", CLIENTS)
def test_409_over_http_is_retried(client: str) -> None:
    async def handle(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "busy", "type": "conflict"}},
                                 status=409)

    with chat_server(handle) as url:
        (err,) = _calls(url, client)
    assert isinstance(err, ProviderError) and err.error_class is ErrorClass.SERVER_ERROR
    assert err.message == "HTTP 409: busy"


# -- 3. an answer sent as Server-Sent Events -------------------------------------------


def _chunk(delta: dict[str, Any], finish: str | None = None, **more: Any) -> bytes:
    """One ``data:`` event of a streamed completion (``more``: fields of its choice)."""
    body = {"id": "c1", "object": "chat.completion.chunk", "model": "m-1",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, **more}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


USAGE = b'data: {"id":"c1","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}\n\n'
STREAM = (_chunk({"role": "assistant", "content": ""}) + b": keep-alive\n\n"
          + _chunk({"content": '{"label": '}) + _chunk({"content": '"yes"}'})
          + _chunk({}, "stop") + USAGE + b"data: [DONE]\n\n")
STREAMS: dict[str, tuple[int, bytes, str]] = {
    "sse": (200, STREAM, "text/event-stream; charset=utf-8"),
    "sse-crlf": (200, STREAM.replace(b"\n", b"\r\n"), "text/event-stream"),
    "sse-untyped": (200, STREAM, "application/json"),
    "sse-text": (200, STREAM, "text/plain"),
    "sse-rate": (200, _chunk({"content": "par"}) + b'data: {"error": {"message": '
                 b'"Rate limit reached", "type": "rate_limit_exceeded"}}\n\n',
                 "text/event-stream"),
    "sse-event-error": (200, b'event: error\ndata: {"type": "invalid_request_error", '
                        b'"message": "bad model"}\n\n', "text/event-stream"),
    "sse-choice-error": (200, _chunk({"content": ""}, "error", error={
        "code": 502, "message": "upstream down"}) + b"data: [DONE]\n\n", "text/event-stream"),
    "sse-cut": (200, _chunk({"role": "assistant", "content": "half an ans"}),
                "text/event-stream"),
    "sse-empty": (200, b"data: [DONE]\n\n", "text/event-stream"),
    "sse-400": (400, b'data: {"error": {"message": "max_tokens is too large", '
                b'"type": "invalid_request_error"}}\n\n', "text/event-stream"),
    "sse-surrogate": (200, b'data: {"id": "c1", "choices": [{"index": 0, "delta": '
                      b'{"content": "\\ud800ok"}, "finish_reason": "stop"}]}\n\n',
                      "text/event-stream"),
    "sse-big": (200, b"".join(_chunk({"content": "x" * 10_000}) for _ in range(110))
                + _chunk({}, "length"), "text/event-stream"),
    "sse-filtered": (200, _chunk({"content": ""}, "content_filter") + b"data: [DONE]\n\n",
                     "text/event-stream"),
}


@pytest.fixture(scope="module")
def sse_url() -> Iterator[str]:
    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        assert "stream" not in body
        status, payload, kind = STREAMS[body["model"]]
        return web.Response(status=status, body=payload, headers={"Content-Type": kind})

    with chat_server(handle) as url:
        yield url


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("model", ["sse", "sse-crlf", "sse-untyped", "sse-text", None])
def test_an_answer_sent_as_events_is_the_completion_it_carries(
        sse_url: str, raw: RawServer, client: str, model: str | None) -> None:
    # It was "HTTP 200 with a body that is not JSON": billed calls retried until DEAD.
    # (None: from a server that sends no Content-Type at all.)
    got = call_model(sse_url, model, client) if model else \
        call_model(raw.url("sse"), "m", client)
    assert isinstance(got, Completion), got
    assert (got.content, got.finish_reason, got.model, got.prompt_tokens,
            got.completion_tokens, got.http_status) == (
        '{"label": "yes"}', "stop", "m-1", 5, 3, 200)
    assert got.body is not None
    kept = json.loads(got.body)
    assert kept["object"] == "chat.completion" and kept["id"] == "c1"
    assert kept["choices"][0]["message"] == {"role": "assistant",
                                             "content": '{"label": "yes"}'}


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(("model", "want", "says"), [
    ("sse-rate", ErrorClass.RATE_LIMITED, "HTTP 200 with an error in the event stream: "
     "Rate limit reached"),
    ("sse-event-error", ErrorClass.INVALID_REQUEST, "HTTP 200 with an error in the "
     "event stream: bad model"),
    ("sse-choice-error", ErrorClass.SERVER_ERROR, "HTTP 200 with an error in choices[0]: "
     "upstream down"),
    ("sse-cut", ErrorClass.SERVER_ERROR, "HTTP 200 with an event stream that ended "
     "before its answer did"),
    ("sse-empty", ErrorClass.SERVER_ERROR, "HTTP 200 with an event stream without a "
     "completion"),
    ("sse-400", ErrorClass.INVALID_REQUEST, "HTTP 400: max_tokens is too large"),
    ("sse-filtered", ErrorClass.CONTENT_FILTERED, "the provider filtered the answer"),
])
def test_an_error_in_an_event_stream_is_classified_as_in_a_body(
        sse_url: str, client: str, model: str, want: ErrorClass, says: str) -> None:
    got = call_model(sse_url, model, client)
    assert isinstance(got, ProviderError), got
    assert got.error_class is want, got
    assert got.message.startswith(says), got.message


@pytest.mark.parametrize("client", CLIENTS)
def test_an_event_stream_is_kept_as_a_json_body_is(sse_url: str, client: str) -> None:
    # a lone surrogate escape is read leniently, as in a JSON body, and not kept
    got = call_model(sse_url, "sse-surrogate", client)
    assert isinstance(got, Completion) and got.content == "\ud800ok" and got.body is None
    # beyond MAX_BODY the completion is read, the body not kept
    big = call_model(sse_url, "sse-big", client)
    assert isinstance(big, Completion), big
    assert len(big.content) == 1_100_000 and big.finish_reason == "length"
    assert big.body is None


# -- 4. Gemini's refused key ---------------------------------------------------------

GEMINI_BAD_KEY = {"error": {
    "code": 400, "message": "API key not valid. Please pass a valid API key.",
    "status": "INVALID_ARGUMENT",
    "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                 "reason": "API_KEY_INVALID", "domain": "googleapis.com"}]}}


@pytest.mark.parametrize("body", [[GEMINI_BAD_KEY], GEMINI_BAD_KEY], ids=["list", "dict"])
def test_gemini_s_refused_key_is_an_auth_error_with_its_message(body: Any) -> None:
    # It was invalid_request (every task FAILED), its message the repr of the list
    err = classify_response(400, body, {})
    assert err.error_class is ErrorClass.AUTH_ERROR
    assert err.message == "HTTP 400: API key not valid. Please pass a valid API key."


@pytest.mark.parametrize(("body", "want"), [
    ({"error": {"code": 400, "message": "x", "status": "INVALID_ARGUMENT",
                "details": [{"reason": "API_KEY_INVALID"}]}}, ErrorClass.AUTH_ERROR),
    ({"error": {"code": 400, "message": "API key expired. Please renew the API key.",
                "status": "INVALID_ARGUMENT"}}, ErrorClass.AUTH_ERROR),
    ({"error": {"code": 400, "message": "Method doesn't allow unregistered callers. "
                "Please use API Key", "status": "PERMISSION_DENIED"}},
     ErrorClass.AUTH_ERROR),
    ({"error": {"code": 400, "message": "Invalid value at 'temperature'",
                "status": "INVALID_ARGUMENT"}}, ErrorClass.INVALID_REQUEST),
    ([{"error": {"code": 400, "message": "* GenerateContentRequest.contents: "
                 "contents is not specified", "status": "INVALID_ARGUMENT"}}],
     ErrorClass.INVALID_REQUEST),
    ({"error": {"code": 500, "message": "API key not valid", "status": "INTERNAL"}},
     ErrorClass.SERVER_ERROR),
])
def test_only_a_key_refused_in_a_400_is_an_auth_error(body: Any, want: ErrorClass) -> None:
    status = body["error"]["code"] if isinstance(body, dict) else 400
    err = classify_response(status, body, {})
    assert err.error_class is want, err


@pytest.mark.parametrize("client", CLIENTS)
def test_gemini_s_refused_key_over_http(client: str) -> None:
    async def handle(request: web.Request) -> web.Response:
        return web.json_response([GEMINI_BAD_KEY], status=400)

    with chat_server(handle) as url:
        (err,) = _calls(url, client)
    assert isinstance(err, ProviderError) and err.error_class is ErrorClass.AUTH_ERROR
    assert err.message == "HTTP 400: API key not valid. Please pass a valid API key."
    assert err.http_status == 400


# -- 5. a body cut by a reset ------------------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
def test_a_body_cut_by_a_reset_is_a_failed_answer_naming_its_status(
        raw: RawServer, client: str) -> None:
    # On pyreqwest it was connection_error without a status (no attempt spent while
    # the endpoint counted as down), on aiohttp server_error "HTTP 200: ..."
    (err,) = _calls(raw.url("cut"), client)
    assert isinstance(err, ProviderError), err
    assert err.error_class is ErrorClass.SERVER_ERROR, err
    assert err.http_status == 200
    assert err.message.startswith("HTTP 200: the body could not be read ("), err.message
