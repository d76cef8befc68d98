"""Provider answers of the fifth review: a moderation verdict (OpenRouter's 403, in a
200 body too) is ``content_filtered``, never a refused key; ``finish_reason: "error"``
without an error object is a failed answer; an event stream that begins with a byte
order mark keeps its first event; a base_url with a query string (Azure OpenAI) keeps
it; an answer only in ``reasoning_content`` says so; content parts are read by their
type; an HTML error page is named by its title; a JSON answer followed by more is
said so, its usage kept; a 422's message object and folded headers are read."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from helpers import app_server, call_model, chat_server
from lockgate import Lockgate
from lockgate.errors import ErrorClass
from lockgate.flow.feedback import down_error, endpoint_failure, key_refused
from lockgate.providers.base import CallOutcome, Completion, CompletionRequest, ProviderError
from lockgate.providers.headers import parse_retry_after_ms, rate_headers, read_signals
from lockgate.providers.openai import OpenAICompatible, classify_response
from lockgate.worker.loop import run_async

CLIENTS = ["aiohttp", "pyreqwest"]
ANS = '{"label": "yes"}'
USAGE = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}


def ok(content: Any = ANS, finish: str = "stop", **message: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": "served-model",
            "usage": dict(USAGE),
            "choices": [{"index": 0, "finish_reason": finish,
                         "message": {"role": "assistant", "content": content, **message}}]}


def _json(body: Any, status: int = 200, **headers: str) -> web.Response:
    return web.Response(body=json.dumps(body, ensure_ascii=False).encode(), status=status,
                        headers={"Content-Type": "application/json", **headers})


def _sse(chunks: list[dict[str, Any]], prefix: bytes = b"") -> web.Response:
    out = prefix + b"".join(b"data: " + json.dumps(c, ensure_ascii=False).encode()
                            + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    return web.Response(body=out, headers={"Content-Type": "text/event-stream"})


def _delta(delta: dict[str, Any], finish: str | None = None,
           usage: dict[str, Any] | None = None) -> dict[str, Any]:
    chunk: dict[str, Any] = {"id": "c", "model": "sm", "choices": [
        {"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        chunk["usage"] = usage
    return chunk


# -- the scenarios, chosen by the request's model -------------------------------------

MODERATION_200 = {"error": {"code": 403, "message": "Input flagged by moderation",
                            "metadata": {"reasons": ["violence"], "flagged_input": "x",
                                         "provider_name": "OpenAI",
                                         "model_slug": "openai/gpt-4o"}}}
MODERATION_403 = {"error": {"code": 403, "message": (
    'deepseek/deepseek-chat requires moderation on OpenAI. Your input was flagged for '
    '"violence". No credits were charged.'), "metadata": {"reasons": ["violence"]}}}
CF_HTML = """<!DOCTYPE html>
<!--[if lt IE 7]> <html class="no-js ie6 oldie" lang="en-US"> <![endif]-->
<!--[if gt IE 8]><!--> <html class="no-js" lang="en-US"> <!--<![endif]-->
<head>
<title>api.example.com | %d: %s</title>
<meta charset="UTF-8" />
<meta http-equiv="X-UA-Compatible" content="IE=Edge" />
<meta name="robots" content="noindex, nofollow" />
<meta name="viewport" content="width=device-width,initial-scale=1" />
<link rel="stylesheet" id="cf_styles-css" href="/cdn-cgi/styles/main.css" />
</head><body><div id="cf-wrapper"><h1><span>%s</span> <span>Error code %d</span></h1>
<p>The origin web server timed out responding to this request.</p></div></body></html>"""
NGINX_502 = ("<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center>"
             "<h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>"
             "\r\n</html>\r\n")


def _cloudflare(code: int, name: str) -> web.Response:
    return web.Response(text=CF_HTML % (code, name, name, code), status=code,
                        content_type="text/html", charset="UTF-8",
                        headers={"Server": "cloudflare", "CF-RAY": "8c1-LHR"})


def _finish_error_then_ok(n: int) -> web.Response:
    if n == 1:
        return _json(ok('{"label": "no"}', finish="error"))
    return _json(ok())


SCENARIOS: dict[str, Callable[[int], web.Response]] = {
    "ok": lambda n: _json(ok()),
    "mod-200": lambda n: _json(MODERATION_200),
    "mod-403": lambda n: _json(MODERATION_403, 403),
    "mod-200-words": lambda n: _json({"error": {
        "code": 403, "message": "Your prompt was flagged for self-harm"}}),
    "mod-400": lambda n: _json({"error": {
        "message": "Request blocked by moderation: hate", "type": "invalid_request_error"}},
        400),
    "forbidden-200": lambda n: _json({"error": {
        "code": 403, "message": "This model is not enabled for your plan"}}),
    "unauthorized-200": lambda n: _json({"error": {
        "code": 401, "message": "No auth credentials found"}}),
    "account-flagged-403": lambda n: _json({"error": {
        "code": 403, "message": "Your account has been flagged for suspicious activity"}},
        403),
    "finish-error": lambda n: _json(ok("The answer is", finish="error")),
    "finish-error-then-ok": _finish_error_then_ok,
    "sse-finish-error": lambda n: _sse([_delta({"content": "The answer is"}),
                                        _delta({}, "error", USAGE)]),
    "sse-bom": lambda n: _sse([_delta({"content": '{"label": '}), _delta({"content":
                               '"yes"}'}), _delta({}, "stop", USAGE)],
                              prefix=b"\xef\xbb\xbf"),
    "sse-bom-text": lambda n: _sse([_delta({"content": "The answer"}),
                                    _delta({"content": " is yes."}),
                                    _delta({}, "stop", USAGE)], prefix=b"\xef\xbb\xbf"),
    "sse-line-separator": lambda n: _sse([_delta({"content": "one\u2028two"}),
                                          _delta({"content": "\x85three"}),
                                          _delta({}, "stop", USAGE)]),
    "reasoning-only": lambda n: _json(ok(None, reasoning_content=(
        "Okay, the user wants a label. The answer is yes."))),
    "reasoning-only-length": lambda n: _json({**ok(None, finish="length",
                                                   reasoning_content="long " * 50),
                                              "usage": {**USAGE, "completion_tokens": 64,
                                                        "completion_tokens_details": {
                                                            "reasoning_tokens": 64}}}),
    "reasoning-field-only": lambda n: _json(ok("", reasoning="I think yes")),
    "reasoning-and-content": lambda n: _json(ok(ANS, reasoning_content="think")),
    "sse-reasoning-only": lambda n: _sse([_delta({"reasoning_content": "Let me think"}),
                                          _delta({"reasoning_content": " more"}),
                                          _delta({}, "stop", USAGE)]),
    "parts-reasoning-text": lambda n: _json(ok([
        {"type": "reasoning", "text": "I think the label is no"},
        {"type": "text", "text": ANS}])),
    "parts-untyped": lambda n: _json(ok([{"text": '{"label": '}, '"yes"}'])),
    "parts-output-text": lambda n: _json(ok([{"type": "output_text", "text": ANS}])),
    "part-alone": lambda n: _json(ok({"type": "text", "text": ANS})),
    "object-content": lambda n: _json(ok({"label": "yes"})),
    "parts-refusal": lambda n: _json(ok([{"type": "refusal",
                                          "refusal": "I can't help with that."}])),
    "sse-parts": lambda n: _sse([
        _delta({"content": [{"type": "thinking", "text": "hmm"},
                            {"type": "text", "text": '{"label": '}]}),
        _delta({"content": [{"type": "text", "text": '"yes"}'}]}),
        _delta({}, "stop", USAGE)]),
    "sse-parts-refusal": lambda n: _sse([
        _delta({"content": [{"type": "refusal", "refusal": "No."}]}),
        _delta({}, "stop", USAGE)]),
    "cf-524": lambda n: _cloudflare(524, "A timeout occurred"),
    "cf-520": lambda n: _cloudflare(520, "Web server is returning an unknown error"),
    "nginx-502": lambda n: web.Response(text=NGINX_502, status=502, content_type="text/html"),
    "html-200": lambda n: web.Response(
        text="<html><head><title>Sign in - Corporate Wi-Fi</title></head><body>"
        + "x" * 400 + "</body></html>", content_type="text/html"),
    "trailing-chunk": lambda n: web.Response(
        body=json.dumps(ok()).encode() + b"\n0\r\n\r\n",
        headers={"Content-Type": "application/json"}),
    "trailing-nul": lambda n: web.Response(
        body=json.dumps(ok()).encode() + b"\x00\x00\n",
        headers={"Content-Type": "application/json"}),
    "two-objects": lambda n: web.Response(
        body=json.dumps(ok()).encode() + b"\n" + json.dumps(ok('{"label": "no"}')).encode(),
        headers={"Content-Type": "application/json"}),
    "text-404": lambda n: web.Response(text="404: Not Found", status=404),
    "mistral-422": lambda n: _json({"object": "error", "message": {"detail": [
        {"type": "extra_forbidden", "loc": ["body", "logit_bias"],
         "msg": "Extra inputs are not permitted"}]}, "type": "invalid_request_message_error",
        "param": None, "code": None}, 422),
    "fastapi-422": lambda n: _json({"detail": [
        {"type": "missing", "loc": ["body", "messages"], "msg": "Field required"},
        {"type": "int_parsing", "loc": ["body", "max_tokens"],
         "msg": "Input should be a valid integer"}]}, 422),
    "retry-after-folded": lambda n: _json({"error": {"message": "Rate limit reached",
                                                     "type": "requests"}}, 429,
                                          **{"Retry-After": "2, 2"}),
}


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, Counter[str]]]:
    """The scenarios' endpoint (``.../v1``) and its hits by model."""
    hits: Counter[str] = Counter()

    async def handle(request: web.Request) -> web.Response:
        model = (await request.json())["model"]
        hits[model] += 1
        return SCENARIOS[model](hits[model])

    with chat_server(handle) as url:
        yield url, hits


def _call(server: tuple[str, Counter[str]], model: str,
          client: str) -> Completion | ProviderError:
    return call_model(server[0], model, client)


def _error(server: tuple[str, Counter[str]], model: str, client: str) -> ProviderError:
    got = _call(server, model, client)
    assert isinstance(got, ProviderError), got
    return got


def _answer(server: tuple[str, Counter[str]], model: str, client: str) -> Completion:
    got = _call(server, model, client)
    assert isinstance(got, Completion), got
    return got


def _task(task_id: str, model: str, max_retries: int = 2) -> dict[str, Any]:
    return {"task_id": task_id, "prompt_template": "Classify {x}. Reply JSON",
            "input_data": {"x": task_id}, "model_config": {"name": model},
            "delivery_rule": {"format": "json", "required_keys": ["label"]},
            "retry_policy": {"max_retries": max_retries, "base_delay_ms": 10,
                             "backoff_factor": 1.0, "jitter": 0}}


def _run(tmp_path: Path, base_url: str, tasks: list[dict[str, Any]], *,
         client: str = "aiohttp", extra: str = "") -> dict[str, Any]:
    """Run ``tasks`` to their end through a burst worker on SQLite; each task by id."""
    config = tmp_path / "lockgate.toml"
    config.write_text(f'[[endpoint]]\nname = "mock"\nbase_url = "{base_url}"\n{extra}'
                      f'[worker]\nconcurrency = 2\nhttp_client = "{client}"\n'
                      # a stuck endpoint ends the run (on the code before the fix)
                      '[flow]\nendpoint_down_max_s = 3\n')
    with Lockgate(f"sqlite:///{tmp_path / 'w.db'}", config=config) as lg:
        lg.submit(tasks, batch_id="b")
        run_async(lg.worker(burst=True, gate=False).run())
        return {t["task_id"]: lg.task(t["task_id"]) for t in tasks}


# -- 1. a moderation verdict is content_filtered, never a refused key ------------------


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(("model", "status"), [
    ("mod-200", 200), ("mod-403", 403), ("mod-200-words", 200), ("mod-400", 400)])
def test_a_moderation_verdict_is_content_filtered(server: tuple[str, Counter[str]],
                                                  client: str, model: str,
                                                  status: int) -> None:
    # OpenRouter's moderation (403, or code 403 in a 200) was auth_error: a refused key
    err = _error(server, model, client)
    assert err.error_class is ErrorClass.CONTENT_FILTERED, err
    assert err.http_status == status
    out = CallOutcome(None, err, 5.0)
    assert not key_refused(out) and not endpoint_failure(out) and not down_error(out)


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(("model", "refused"), [
    ("forbidden-200", False),  # as a 403 status: one model, not the key
    ("unauthorized-200", True),  # as a 401 status: the key
])
def test_an_auth_error_in_a_200_body_counts_by_the_status_its_code_names(
        server: tuple[str, Counter[str]], client: str, model: str, refused: bool) -> None:
    err = _error(server, model, client)
    assert err.error_class is ErrorClass.AUTH_ERROR
    assert err.http_status == 200 and err.inner_status == (401 if refused else 403)
    out = CallOutcome(None, err, 5.0)
    assert key_refused(out) is refused and endpoint_failure(out) is refused


@pytest.mark.parametrize("client", CLIENTS)
def test_an_account_flagged_is_not_a_moderation_verdict(server: tuple[str, Counter[str]],
                                                        client: str) -> None:
    err = _error(server, "account-flagged-403", client)
    assert err.error_class is ErrorClass.AUTH_ERROR


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("status", [200, 403])
def test_moderated_tasks_fail_at_once_and_healthy_ones_run(
        server: tuple[str, Counter[str]], tmp_path: Path, status: int, client: str) -> None:
    # repro: in a 200 the endpoint was marked failing/down, flagged tasks never ended
    # (attempts 'unreachable'), healthy ones waited behind the open breaker; as a 403:
    # auth_error, 3 billed attempts, DEAD
    model = "mod-200" if status == 200 else "mod-403"
    before = server[1][model]
    tasks = [_task(f"mod-{i}", model) for i in range(3)] + \
        [_task(f"ok-{i}", "ok") for i in range(3)]
    done = _run(tmp_path, server[0], tasks, client=client)
    for i in range(3):
        flagged = done[f"mod-{i}"]
        assert flagged.status == "FAILED" and flagged.attempts == 1, flagged
        assert flagged.error.error_class == "content_filtered"
        assert [a.outcome for a in flagged.attempt_log] == ["failed"]
        healthy = done[f"ok-{i}"]
        assert healthy.status == "SUCCEEDED" and healthy.attempts == 1
        assert [a.outcome for a in healthy.attempt_log] == ["succeeded"]
    assert server[1][model] - before == 3


# -- 2. finish_reason "error" without an error object ----------------------------------


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("model", ["finish-error", "sse-finish-error"])
def test_finish_reason_error_without_an_error_object_is_a_failed_answer(
        server: tuple[str, Counter[str]], client: str, model: str) -> None:
    # the partial "The answer is" was delivered SUCCEEDED
    err = _error(server, model, client)
    assert err.error_class is ErrorClass.SERVER_ERROR
    assert 'finish_reason "error"' in err.message
    assert (err.prompt_tokens, err.completion_tokens) == (11, 7)


def test_a_finish_reason_error_is_retried_end_to_end(server: tuple[str, Counter[str]],
                                                     tmp_path: Path) -> None:
    done = _run(tmp_path, server[0], [_task("t", "finish-error-then-ok", 1)])["t"]
    assert done.status == "SUCCEEDED" and done.result == {"label": "yes"}
    first, second = done.attempt_log
    assert (first.outcome, second.outcome) == ("retry", "succeeded")
    assert first.error.error_class == "server_error"
    assert (first.input_tokens, first.output_tokens) == (11, 7)


# -- 3. an event stream that begins with a byte order mark ------------------------------


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(("model", "content"), [
    ("sse-bom", ANS), ("sse-bom-text", "The answer is yes."),
    # lines end at CR/LF only: U+2028 and U+0085 inside a chunk's JSON are its text
    ("sse-line-separator", "one\u2028two\x85three")])
def test_an_event_stream_keeps_its_first_event(server: tuple[str, Counter[str]],
                                               client: str, model: str,
                                               content: str) -> None:
    got = _answer(server, model, client)
    assert got.content == content
    assert (got.prompt_tokens, got.completion_tokens) == (11, 7)


def test_a_stream_with_a_byte_order_mark_succeeds_end_to_end(
        server: tuple[str, Counter[str]], tmp_path: Path) -> None:
    done = _run(tmp_path, server[0], [_task("t", "sse-bom", 0)])["t"]
    assert done.status == "SUCCEEDED" and done.result == {"label": "yes"}


# -- 4. a base_url with a query string (Azure OpenAI) -----------------------------------


@pytest.fixture(scope="module")
def azure() -> Iterator[tuple[str, Counter[str]]]:
    """Azure OpenAI's deployment API: ``POST /openai/deployments/{name}/chat/completions``
    with ``?api-version=`` and an ``api-key`` header (else 404 / 401)."""
    hits: Counter[str] = Counter()

    async def handle(request: web.Request) -> web.Response:
        hits[f"{request.match_info['name']}?{request.query_string}"] += 1
        if "api-version" not in request.query:
            return _json({"error": {"code": "404", "message": "Resource not found"}}, 404)
        if request.headers.get("api-key") != "AZKEY":
            return _json({"error": {"code": "401", "message": "Access denied due to "
                                    "invalid subscription key"}}, 401)
        return _json(ok())

    def routes(app: web.Application) -> None:
        app.router.add_post("/openai/deployments/{name}/chat/completions", handle)

    with app_server(routes) as root:
        yield root, hits


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("slash", ["", "/"])
def test_a_base_url_with_a_query_string_keeps_it(azure: tuple[str, Counter[str]],
                                                 client: str, slash: str) -> None:
    # it was POSTed to ...?api-version=2024-10-21/chat/completions (a 404)
    url = f"{azure[0]}/openai/deployments/gpt4o{slash}?api-version=2024-10-21"
    before = azure[1]["gpt4o?api-version=2024-10-21"]

    async def main() -> Completion:
        prov = OpenAICompatible("az", url, headers={"api-key": "AZKEY"},
                                http_client=client)  # type: ignore[arg-type]
        try:
            return await prov.complete(CompletionRequest(
                messages=[{"role": "user", "content": "hi"}], model="gpt-4o",
                timeout_s=10, params={}))
        finally:
            await prov.close()

    got = asyncio.run(main())
    assert got.content == ANS
    assert azure[1]["gpt4o?api-version=2024-10-21"] == before + 1


@pytest.mark.parametrize("client", CLIENTS)
def test_a_404_on_an_azure_deployment_path_does_not_suggest_v1(
        azure: tuple[str, Counter[str]], client: str) -> None:
    err = call_model(f"{azure[0]}/openai/deployments/gpt4o", "m", client)  # no api-version
    assert isinstance(err, ProviderError) and err.http_status == 404
    assert "api-version" in err.message and "under /v1" not in err.message


def test_azure_openai_runs_end_to_end(azure: tuple[str, Counter[str]],
                                      tmp_path: Path) -> None:
    base = f"{azure[0]}/openai/deployments/gpt4o?api-version=2024-10-21"
    done = _run(tmp_path, base, [_task("t", "gpt-4o", 0)],
                extra='headers = {"api-key" = "AZKEY"}\n')["t"]
    assert done.status == "SUCCEEDED" and done.result == {"label": "yes"}


# -- 5. an answer only in reasoning_content ------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(("model", "field", "said"), [
    ("reasoning-only", "reasoning_content", "reasoning parser"),
    ("reasoning-only-length", "reasoning_content", "(64 reasoning tokens)"),
    ("reasoning-field-only", "reasoning", "reasoning parser"),
    ("sse-reasoning-only", "reasoning_content", "reasoning parser")])
def test_an_answer_only_in_reasoning_is_invalid_output_that_says_so(
        server: tuple[str, Counter[str]], client: str, model: str, field: str,
        said: str) -> None:
    # it was delivered as "" (text) or "no_json_found" (JSON)
    err = _error(server, model, client)
    assert err.error_class is ErrorClass.INVALID_OUTPUT
    assert f"only in {field}" in err.message and said in err.message
    assert "max_tokens" in err.message
    assert err.prompt_tokens == 11


@pytest.mark.parametrize("client", CLIENTS)
def test_content_beside_reasoning_is_the_answer(server: tuple[str, Counter[str]],
                                                client: str) -> None:
    assert _answer(server, "reasoning-and-content", client).content == ANS


def test_a_reasoning_only_answer_names_its_cause_end_to_end(
        server: tuple[str, Counter[str]], tmp_path: Path) -> None:
    done = _run(tmp_path, server[0], [_task("t", "reasoning-only", 1)])["t"]
    assert done.status == "DEAD" and done.attempts == 2
    assert done.error.error_class == "invalid_output"
    assert "only in reasoning_content" in done.error.message
    assert all((a.input_tokens, a.output_tokens) == (11, 7) for a in done.attempt_log)


# -- 6. content parts ------------------------------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(("model", "content"), [
    ("parts-reasoning-text", ANS),  # the reasoning part's text was joined in
    ("parts-untyped", ANS),
    ("parts-output-text", ANS),
    ("part-alone", ANS),  # was delivered as a Python repr
    ("object-content", '{"label":"yes"}'),  # JSON, never a Python repr
    ("sse-parts", ANS)])
def test_only_text_parts_make_the_answer(server: tuple[str, Counter[str]], client: str,
                                         model: str, content: str) -> None:
    assert _answer(server, model, client).content == content


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(("model", "said"), [("parts-refusal", "I can't help with that."),
                                             ("sse-parts-refusal", "No.")])
def test_a_refusal_part_is_a_refusal(server: tuple[str, Counter[str]], client: str,
                                     model: str, said: str) -> None:
    # it was an empty success
    err = _error(server, model, client)
    assert err.error_class is ErrorClass.CONTENT_FILTERED
    assert err.message == f"the model refused: {said}"
    assert (err.prompt_tokens, err.completion_tokens) == (11, 7)


def test_parts_end_to_end(server: tuple[str, Counter[str]], tmp_path: Path) -> None:
    done = _run(tmp_path, server[0], [_task("reasoning", "parts-reasoning-text", 0),
                                      _task("alone", "part-alone", 0),
                                      _task("refusal", "parts-refusal", 2)])
    for name in ("reasoning", "alone"):
        assert done[name].status == "SUCCEEDED" and done[name].result == {"label": "yes"}
    refused = done["refusal"]
    assert refused.status == "FAILED" and refused.attempts == 1
    assert refused.error.error_class == "content_filtered"
    assert (refused.attempt_log[0].input_tokens, refused.attempt_log[0].output_tokens) \
        == (11, 7)


# -- 7. an HTML error page -------------------------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(("model", "message"), [
    ("cf-524", 'HTTP 524 (text/html): "A timeout occurred"'),
    ("cf-520", 'HTTP 520 (text/html): "Web server is returning an unknown error"'),
    ("nginx-502", 'HTTP 502 (text/html): "Bad Gateway"')])
def test_an_html_error_page_is_named_by_its_title(server: tuple[str, Counter[str]],
                                                  client: str, model: str,
                                                  message: str) -> None:
    err = _error(server, model, client)
    assert err.error_class is ErrorClass.SERVER_ERROR
    assert err.message == message


@pytest.mark.parametrize("client", CLIENTS)
def test_an_html_page_in_a_200_is_named_by_its_title(server: tuple[str, Counter[str]],
                                                     client: str) -> None:
    err = _error(server, "html-200", client)
    assert err.error_class is ErrorClass.SERVER_ERROR
    assert '"Sign in - Corporate Wi-Fi"' in err.message and "xxxx" not in err.message


# -- 8. a JSON answer followed by more ------------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("model", ["trailing-chunk", "two-objects"])
def test_extra_data_after_the_json_is_said_and_its_usage_kept(
        server: tuple[str, Counter[str]], client: str, model: str) -> None:
    # "not valid JSON (cut off?)", no usage
    err = _error(server, model, client)
    assert err.error_class is ErrorClass.SERVER_ERROR
    at = len(json.dumps(ok()).encode()) + 1  # after the newline
    assert f"extra data after the JSON at byte {at}" in err.message
    assert (err.prompt_tokens, err.completion_tokens, err.model) == (11, 7, "served-model")


@pytest.mark.parametrize("client", CLIENTS)
def test_nuls_after_the_json_leave_it_whole(server: tuple[str, Counter[str]],
                                            client: str) -> None:
    assert _answer(server, "trailing-nul", client).content == ANS


@pytest.mark.parametrize("client", CLIENTS)
def test_a_text_error_that_begins_with_a_number_is_not_json(
        server: tuple[str, Counter[str]], client: str) -> None:
    err = _error(server, "text-404", client)
    assert "404: Not Found" in err.message


def test_extra_data_records_the_usage_end_to_end(server: tuple[str, Counter[str]],
                                                 tmp_path: Path) -> None:
    done = _run(tmp_path, server[0], [_task("t", "trailing-chunk", 1)])["t"]
    assert done.status == "DEAD" and done.attempts == 2
    assert "extra data after the JSON" in done.error.message
    assert all((a.input_tokens, a.output_tokens) == (11, 7) for a in done.attempt_log)


# -- 9. a 422's message object, folded headers ----------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(("model", "message"), [
    ("mistral-422", "HTTP 422: body.logit_bias: Extra inputs are not permitted"),
    ("fastapi-422", "HTTP 422: body.messages: Field required; body.max_tokens: Input "
                    "should be a valid integer")])
def test_a_validation_error_names_its_fields(server: tuple[str, Counter[str]],
                                             client: str, model: str,
                                             message: str) -> None:
    err = _error(server, model, client)
    assert err.error_class is ErrorClass.INVALID_REQUEST
    assert err.message == message


def test_a_message_object_is_json_not_a_python_repr() -> None:
    err = classify_response(400, {"error": {"message": {"reason": "bad", "n": None}}}, {})
    assert err.message == 'HTTP 400: {"reason":"bad","n":null}'


@pytest.mark.parametrize("client", CLIENTS)
def test_a_folded_retry_after_is_read(server: tuple[str, Counter[str]],
                                      client: str) -> None:
    err = _error(server, "retry-after-folded", client)
    assert err.error_class is ErrorClass.RATE_LIMITED and err.retry_after_ms == 2000


def test_folded_rate_headers_are_read() -> None:
    assert parse_retry_after_ms({"retry-after": "2, 2"}) == 2000
    assert parse_retry_after_ms({"retry-after-ms": "1500,1500"}) == 1500
    date = "Wed, 21 Oct 2015 07:28:05 GMT"
    assert parse_retry_after_ms({"retry-after": f"{date}, {date}",
                                 "date": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 5000
    kept = rate_headers({"x-ratelimit-remaining-requests": "0, 0",
                         "x-ratelimit-reset-requests": "1s, 1s",
                         "x-ratelimit-limit-requests": "60, 60"})
    assert kept == {"x-ratelimit-remaining-requests": "0",
                    "x-ratelimit-reset-requests": "1s",
                    "x-ratelimit-limit-requests": "60"}
    sig = read_signals(kept)
    assert (sig.limit_requests, sig.remaining_requests, sig.reset_requests_ms) \
        == (60, 0, 1000)
    unsuffixed = rate_headers({"x-ratelimit-limit": "10, 10", "x-ratelimit-remaining":
                               "0, 0", "x-ratelimit-reset": "2, 2"})
    assert read_signals(unsuffixed).pause_ms() == 200  # reset / limit
    anthropic = rate_headers({
        "date": "Wed, 21 Oct 2015 07:28:00 GMT",
        "anthropic-ratelimit-requests-remaining": "0, 0",
        "anthropic-ratelimit-requests-reset": "2015-10-21T07:28:03Z, 2015-10-21T07:28:03Z"})
    assert anthropic == {"x-ratelimit-remaining-requests": "0",
                         "x-ratelimit-reset-requests": "3000ms"}

