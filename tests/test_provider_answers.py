"""Answers of OpenAI-compatible providers the simulator does not give, from a scripted
HTTP server: a body that cannot be decoded, an error object in a 200, a body that is
HTML, cut off or empty, content as a list of parts, a 201, 402 Payment Required,
vLLM's and other error shapes, and Retry-After as an HTTP date. Each is classified by
what the provider said, and its message names it."""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
import zlib
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from aiohttp import web

from helpers import call_model, chat_server
from lockgate.errors import ErrorClass
from lockgate.providers.base import Completion, ProviderError

CLIENTS = ["aiohttp", "pyreqwest"]
OK = {"id": "x", "model": "m-1", "choices": [{"index": 0, "finish_reason": "stop",
      "message": {"role": "assistant", "content": '{"label": "yes"}'}}],
      "usage": {"prompt_tokens": 5, "completion_tokens": 3}}


def _json(body: Any, status: int = 200, **headers: str) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status,
                        headers={"Content-Type": "application/json", **headers})


def _in(charset: str, note: str, *, encode_as: str | None = None) -> web.Response:
    """OK with a note in its content, in ``charset`` as its Content-Type declares."""
    body = {**OK, "choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": json.dumps({"label": "yes", "note": note},
                                                   ensure_ascii=False)}}]}
    return web.Response(body=json.dumps(body, ensure_ascii=False).encode(
        encode_as or charset), headers={"Content-Type": f"application/json; charset={charset}"})


def _choice_error() -> web.Response:
    # OpenRouter: the upstream provider failed, said in the choice
    return _json({**OK, "choices": [{"index": 0, "finish_reason": "error", "message": {
        "role": "assistant", "content": ""}, "error": {
            "code": 502, "message": "Upstream provider returned error"}}]})


def _tool_calls() -> web.Response:
    return _json({**OK, "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": None, "tool_calls": [{
            "id": "c-1", "type": "function",
            "function": {"name": "classify", "arguments": '{"label": "yes"}'}}]}}]})


def _raw_deflate() -> web.Response:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)  # no zlib header, as some servers do
    return web.Response(body=packer.compress(orjson.dumps(OK)) + packer.flush(), headers={
        "Content-Type": "application/json", "Content-Encoding": "deflate"})


#: name -> the response the server gives
ANSWERS: dict[str, Any] = {
    "ok": lambda: _json(OK),
    "created": lambda: _json(OK, status=201),
    "parts": lambda: _json({**OK, "choices": [{"index": 0, "finish_reason": "stop",
                            "message": {"role": "assistant", "content": [
                                {"type": "text", "text": '{"label": '},
                                {"type": "image_url", "image_url": {"url": "x"}},
                                {"type": "text", "text": '"yes"}'}]}}]}),
    "bad-gzip": lambda: web.Response(body=orjson.dumps(OK), headers={
        "Content-Type": "application/json", "Content-Encoding": "gzip"}),
    "good-gzip": lambda: web.Response(body=gzip.compress(orjson.dumps(OK)), headers={
        "Content-Type": "application/json", "Content-Encoding": "gzip"}),
    "error-200-rate": lambda: _json({"error": {
        "message": "Rate limit reached for requests", "type": "requests",
        "code": "rate_limit_exceeded"}}),
    "error-200-context": lambda: _json({"error": {
        "message": "This model's maximum context length is 8192 tokens",
        "code": "context_length_exceeded"}}),
    "error-200-other": lambda: _json({"error": {"message": "upstream overloaded",
                                                "code": 503}}),
    "html-200": lambda: web.Response(text="<html><body>Bad gateway</body></html>",
                                     content_type="text/html"),
    "cut-200": lambda: web.Response(body=orjson.dumps(OK)[:40],
                                    content_type="application/json"),
    "empty-200": lambda: web.Response(body=b"", content_type="application/json"),
    "no-choices": lambda: _json({**OK, "choices": []}),
    "refusal": lambda: _json({**OK, "choices": [{"index": 0, "finish_reason": "stop",
                              "message": {"role": "assistant", "content": None,
                                          "refusal": "I can't help with that."}}]}),
    # choices listed out of order; usage under Anthropic's names (gateways pass them on)
    "unordered": lambda: _json({**OK, "choices": [
        {"index": 1, "finish_reason": "stop", "message": {"role": "assistant",
                                                          "content": '{"label": "no"}'}},
        OK["choices"][0]], "usage": {"input_tokens": 7, "output_tokens": 2}}),
    "balance-402": lambda: _json({"error": {"message": "Insufficient Balance",
                                            "type": "unknown_error"}}, status=402),
    "vllm-400": lambda: _json({"object": "error", "message": "model 'x' does not exist",
                               "type": "NotFoundError", "code": 404}, status=400),
    "string-400": lambda: _json({"error": "bad temperature"}, status=400),
    "gbk": lambda: _in("gbk", "快递三天了还没到"),
    "latin-1": lambda: _in("iso-8859-1", "café"),
    "not-gbk": lambda: web.Response(body=b'{"choices": "\x81\x20"}', headers={
        "Content-Type": "application/json; charset=gbk"}),
    "gbk-undeclared": lambda: _in("utf-8", "快递", encode_as="gbk"),
    "error-200-model": lambda: _json({"error": {
        "message": "The model `gpt-5x` does not exist", "type": "invalid_request_error",
        "code": "model_not_found"}}),
    "error-200-auth": lambda: _json({"error": {
        "message": "Incorrect API key provided", "type": "authentication_error",
        "code": "invalid_api_key"}}),
    "error-200-filter": lambda: _json({"error": {
        "message": "The response was filtered", "type": None, "code": "content_filter"}}),
    "error-200-quota": lambda: _json({"error": {"message": "Insufficient Balance",
                                                "code": "insufficient_balance"}}),
    "arrearage-400": lambda: _json({"error": {
        "code": "Arrearage", "param": None, "type": "Arrearage",
        "message": "Access denied, please make sure your account is in good standing."}},
        status=400),
    "moonshot-429": lambda: _json({"error": {
        "message": "Your account org-x <ak-x> is suspended, please check your plan and "
                   "billing details", "type": "exceeded_current_quota_error"}}, status=429),
    "anthropic-context": lambda: _json({"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "prompt is too long: 210000 tokens > 200000 maximum"}}, status=400),
    "redirect": lambda: web.Response(status=301, headers={
        "Location": "https://elsewhere.example/v1/chat/completions"}),
    "choice-error": _choice_error,
    "tool-calls": _tool_calls,
    "raw-deflate": _raw_deflate,
    "long-ids": lambda: _json({**OK, "model": "m" * 300}, **{"x-request-id": "r" * 300}),
    "retry-date": lambda: _json({"error": {"message": "slow down"}}, status=429, **{
        "Retry-After": "Fri, 05 Dec 2026 10:00:06 GMT",
        "Date": "Fri, 05 Dec 2026 10:00:00 GMT"}),
}


@pytest.fixture(scope="module")
def provider_url() -> Iterator[str]:
    """A provider answering each request as its model names, on a thread's loop."""
    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        made: web.StreamResponse = ANSWERS[body["model"]]()
        return made

    with chat_server(handle) as url:
        yield url


def _error(url: str, model: str, client: str = "aiohttp") -> ProviderError:
    got = call_model(url, model, client)
    assert isinstance(got, ProviderError), got
    return got


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("model", ["ok", "created", "good-gzip"])
def test_a_completion_in_any_2xx_is_read(provider_url: str, model: str, client: str) -> None:
    got = call_model(provider_url, model, client)
    assert isinstance(got, Completion), got
    assert got.content == '{"label": "yes"}' and got.prompt_tokens == 5


@pytest.mark.parametrize("client", CLIENTS)
def test_the_first_choice_is_index_0_and_usage_is_read_under_either_name(
        provider_url: str, client: str) -> None:
    """The choice listed first was taken, whatever its ``index``; usage named
    ``input_tokens`` / ``output_tokens`` was read as none."""
    got = call_model(provider_url, "unordered", client)
    assert isinstance(got, Completion), got
    assert (got.content, got.prompt_tokens, got.completion_tokens) == (
        '{"label": "yes"}', 7, 2)


@pytest.mark.parametrize("client", CLIENTS)
def test_a_refusal_is_a_refusal_not_an_answer_without_json(provider_url: str,
                                                           client: str) -> None:
    err = _error(provider_url, "refusal", client)
    assert err.error_class is ErrorClass.CONTENT_FILTERED
    assert err.message == "the model refused: I can't help with that."


@pytest.mark.parametrize("client", CLIENTS)
def test_content_given_as_parts_is_their_text(provider_url: str, client: str) -> None:
    got = call_model(provider_url, "parts", client)
    assert isinstance(got, Completion), got
    assert got.content == '{"label": "yes"}'


@pytest.mark.parametrize("client", CLIENTS)
def test_a_body_that_cannot_be_decoded_is_a_failed_answer_not_an_unreachable_endpoint(
        provider_url: str, client: str) -> None:
    exc = _error(provider_url, "bad-gzip", client)
    assert exc.error_class is ErrorClass.SERVER_ERROR
    assert "could not be read" in exc.message and "Content-Encoding gzip" in exc.message
    assert exc.message.startswith("HTTP 200: ") and exc.http_status == 200


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(("model", "cls", "said"), [
    ("error-200-rate", ErrorClass.RATE_LIMITED, "Rate limit reached"),
    ("error-200-context", ErrorClass.CONTEXT_LENGTH_EXCEEDED, "maximum context length"),
    ("error-200-other", ErrorClass.SERVER_ERROR, "upstream overloaded"),
])
def test_an_error_in_a_200_is_classified_by_what_it_says(
        provider_url: str, client: str, model: str, cls: ErrorClass, said: str) -> None:
    exc = _error(provider_url, model, client)
    assert exc.error_class is cls, exc
    assert exc.http_status == 200 and said in exc.message, exc.message


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(("model", "said"), [
    ("html-200", "not JSON (text/html"), ("cut-200", "not valid JSON"),
    ("empty-200", "empty body"), ("no-choices", "without choices[0].message")])
def test_a_200_without_a_completion_says_what_came(provider_url: str, client: str,
                                                   model: str, said: str) -> None:
    exc = _error(provider_url, model, client)
    assert exc.error_class is ErrorClass.SERVER_ERROR
    assert said in exc.message, exc.message


@pytest.mark.parametrize("client", CLIENTS)
def test_payment_required_is_an_exhausted_quota(provider_url: str, client: str) -> None:
    exc = _error(provider_url, "balance-402", client)
    assert exc.error_class is ErrorClass.QUOTA_EXHAUSTED
    assert "Insufficient Balance" in exc.message


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(("model", "message"), [
    ("vllm-400", "HTTP 400: model 'x' does not exist"),
    ("string-400", "HTTP 400: bad temperature")])
def test_other_error_shapes_give_the_provider_s_message(
        provider_url: str, client: str, model: str, message: str) -> None:
    exc = _error(provider_url, model, client)
    assert exc.error_class is ErrorClass.INVALID_REQUEST
    assert exc.message == message


@pytest.mark.parametrize("client", CLIENTS)
def test_retry_after_as_a_date_pauses_until_then(provider_url: str, client: str) -> None:
    exc = _error(provider_url, "retry-date", client)
    assert exc.error_class is ErrorClass.RATE_LIMITED
    assert exc.retry_after_ms == 6000


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(("model", "note"), [("gbk", "快递三天了还没到"), ("latin-1", "café")])
def test_a_body_in_its_declared_charset_is_read(provider_url: str, client: str,
                                                model: str, note: str) -> None:
    # A complete answer in GBK with "charset=gbk" ended DEAD: "not valid JSON (cut off?)"
    got = call_model(provider_url, model, client)
    assert isinstance(got, Completion), got
    assert json.loads(got.content) == {"label": "yes", "note": note}
    assert got.body is not None and note in got.body


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(("model", "said"), [
    ("not-gbk", "not valid gbk, the charset its Content-Type declares"),
    ("gbk-undeclared", "not valid UTF-8 at byte")])
def test_a_body_not_in_its_charset_says_so_not_cut_off(
        provider_url: str, client: str, model: str, said: str) -> None:
    exc = _error(provider_url, model, client)
    assert exc.error_class is ErrorClass.SERVER_ERROR
    assert said in exc.message and "cut off" not in exc.message, exc.message


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(("model", "cls"), [
    ("error-200-model", ErrorClass.INVALID_REQUEST),
    ("error-200-auth", ErrorClass.AUTH_ERROR),
    ("error-200-filter", ErrorClass.CONTENT_FILTERED),
    ("error-200-quota", ErrorClass.QUOTA_EXHAUSTED),
    ("arrearage-400", ErrorClass.QUOTA_EXHAUSTED),
    ("moonshot-429", ErrorClass.QUOTA_EXHAUSTED),
    ("anthropic-context", ErrorClass.CONTEXT_LENGTH_EXCEEDED),
])
def test_an_error_is_classified_by_what_its_body_names(
        provider_url: str, client: str, model: str, cls: ErrorClass) -> None:
    # Each was server_error (in a 200), invalid_request (DashScope's Arrearage, a
    # context length in Anthropic's words) or rate_limited (Moonshot's quota)
    exc = _error(provider_url, model, client)
    assert exc.error_class is cls, exc


@pytest.mark.parametrize("client", CLIENTS)
def test_an_error_in_the_choice_is_classified_with_its_message(provider_url: str,
                                                               client: str) -> None:
    exc = _error(provider_url, "choice-error", client)
    assert exc.error_class is ErrorClass.SERVER_ERROR
    assert exc.message == "HTTP 200 with an error in choices[0]: Upstream provider " \
                          "returned error"


@pytest.mark.parametrize("client", CLIENTS)
def test_tool_calls_instead_of_text_say_so(provider_url: str, client: str) -> None:
    exc = _error(provider_url, "tool-calls", client)
    assert exc.error_class is ErrorClass.INVALID_OUTPUT
    assert exc.message == "the model answered with tool_calls, not text: classify"


@pytest.mark.parametrize("client", CLIENTS)
def test_a_redirect_is_not_followed_and_names_the_fix(provider_url: str,
                                                      client: str) -> None:
    # The POST came back as a GET to the new location, with no body
    exc = _error(provider_url, "redirect", client)
    assert exc.error_class is ErrorClass.INVALID_REQUEST and exc.http_status == 301
    assert "redirects to https://elsewhere.example/v1/chat/completions" in exc.message
    assert "base_url" in exc.message


@pytest.mark.parametrize("client", CLIENTS)
def test_deflate_without_its_zlib_header_is_read_by_both_clients(
        provider_url: str, client: str) -> None:
    got = call_model(provider_url, "raw-deflate", client)
    assert isinstance(got, Completion), got


@pytest.mark.parametrize("client", CLIENTS)
def test_a_long_request_id_and_model_are_cut_to_their_columns(
        provider_url: str, client: str) -> None:
    # PostgreSQL and MariaDB refuse more than 128 and 200 characters: the write-back
    # of the attempt failed
    got = call_model(provider_url, "long-ids", client)
    assert isinstance(got, Completion), got
    assert got.request_id == "r" * 128 and got.model == "m" * 200


#: Answers that are not valid HTTP, as the raw bytes a server sends.
NOT_HTTP = {
    "bad-status-line": b"HTTP/1.1 OK\r\nContent-Length: 2\r\n\r\n{}",
    "bad-content-length": b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n{}",
}


@pytest.fixture(scope="module")
def raw_url() -> Iterator[str]:
    """A server that answers each request with the raw bytes its path names."""
    state: dict[str, Any] = {}
    started = threading.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        await reader.readexactly(length)
        name = head.split(b" ")[1].decode().split("/")[1]
        writer.write(NOT_HTTP[name])
        await writer.drain()
        writer.close()

    def serve() -> None:
        loop = asyncio.new_event_loop()
        server = loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", 0))
        state["loop"], state["port"] = loop, server.sockets[0].getsockname()[1]
        started.set()
        loop.run_forever()
        server.close()
        loop.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield f"http://127.0.0.1:{state['port']}"
    finally:
        state["loop"].call_soon_threadsafe(state["loop"].stop)
        thread.join(10)


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("name", sorted(NOT_HTTP))
def test_an_answer_that_is_not_http_is_a_failed_answer_not_an_unreachable_endpoint(
        raw_url: str, client: str, name: str) -> None:
    # It was connection_error ("ClientResponseError: 400, message=Bad status line"):
    # no attempt spent, the tasks waited up to endpoint_down_max_s for an endpoint
    # that answered
    exc = _error(f"{raw_url}/{name}", "m", client)
    assert exc.error_class is ErrorClass.SERVER_ERROR, exc
    assert exc.message.startswith("the endpoint's answer was not valid HTTP: "), exc.message
    assert exc.http_status is None
