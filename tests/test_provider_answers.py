"""Answers of OpenAI-compatible providers the simulator does not give, from a scripted
HTTP server: a body that cannot be decoded, an error object in a 200, a body that is
HTML, cut off or empty, content as a list of parts, a 201, 402 Payment Required,
vLLM's and other error shapes, and Retry-After as an HTTP date. Each is classified by
what the provider said, and its message names it."""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from aiohttp import web

from helpers import chat_server
from lockgate.errors import ErrorClass
from lockgate.providers.base import Completion, CompletionRequest, ProviderError
from lockgate.providers.openai import OpenAICompatible

CLIENTS = ["aiohttp", "pyreqwest"]
OK = {"id": "x", "model": "m-1", "choices": [{"index": 0, "finish_reason": "stop",
      "message": {"role": "assistant", "content": '{"label": "yes"}'}}],
      "usage": {"prompt_tokens": 5, "completion_tokens": 3}}


def _json(body: Any, status: int = 200, **headers: str) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status,
                        headers={"Content-Type": "application/json", **headers})


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


def _call(url: str, model: str, client: str = "aiohttp") -> Completion | ProviderError:
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


def _error(url: str, model: str, client: str = "aiohttp") -> ProviderError:
    got = _call(url, model, client)
    assert isinstance(got, ProviderError), got
    return got


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("model", ["ok", "created", "good-gzip"])
def test_a_completion_in_any_2xx_is_read(provider_url: str, model: str, client: str) -> None:
    got = _call(provider_url, model, client)
    assert isinstance(got, Completion), got
    assert got.content == '{"label": "yes"}' and got.prompt_tokens == 5


@pytest.mark.parametrize("client", CLIENTS)
def test_the_first_choice_is_index_0_and_usage_is_read_under_either_name(
        provider_url: str, client: str) -> None:
    """The choice listed first was taken, whatever its ``index``; usage named
    ``input_tokens`` / ``output_tokens`` was read as none."""
    got = _call(provider_url, "unordered", client)
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
    got = _call(provider_url, "parts", client)
    assert isinstance(got, Completion), got
    assert got.content == '{"label": "yes"}'


@pytest.mark.parametrize("client", CLIENTS)
def test_a_body_that_cannot_be_decoded_is_a_failed_answer_not_an_unreachable_endpoint(
        provider_url: str, client: str) -> None:
    exc = _error(provider_url, "bad-gzip", client)
    assert exc.error_class is ErrorClass.SERVER_ERROR
    assert "could not be read" in exc.message and "gzip" in exc.message
    if client == "aiohttp":  # pyreqwest reads the body before it gives the status
        assert exc.http_status == 200


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
