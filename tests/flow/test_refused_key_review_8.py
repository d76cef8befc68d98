"""A key refused with a 403 (review 8): a 401 paused the endpoint and spent no attempt,
but a 403 whose body says the key itself is refused (OpenAI's ``invalid_api_key``
"Incorrect API key provided", Gemini's PERMISSION_DENIED "Your API key was reported as
leaked") spent an attempt per refused call, and the tasks ended DEAD within seconds. A
403 for one model, or a permission the key lacks for one resource, stays the task's
own. Real workers against a server of the test's own; assertions are counts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import web

from helpers import chat_server
from lockgate.errors import ErrorClass
from lockgate.flow.feedback import key_refused
from lockgate.providers.base import CallOutcome
from lockgate.providers.openai import classify_response
from lockgate.spec import parse_task
from lockgate.store import Store
from lockgate.worker import Worker

from .support import MODEL, rows, run_workers, settings, status_counts, tasks

OPENAI_403 = {"error": {"message": "Incorrect API key provided: sk-mo***ck. You can find "
                                   "your API key at https://platform.openai.com/account/"
                                   "api-keys.", "type": "invalid_request_error",
                        "param": None, "code": "invalid_api_key"}}
GEMINI_403 = [{"error": {"code": 403, "message": "Your API key was reported as leaked. "
                                                 "Please use another API key.",
                         "status": "PERMISSION_DENIED"}}]
#: 403s that refuse the key itself, in other words.
KEY_403 = {
    "openai invalid_api_key": OPENAI_403,
    "gemini leaked": GEMINI_403,
    "gemini API_KEY_INVALID": {"error": {
        "code": 403, "message": "API key not valid. Please pass a valid API key.",
        "status": "PERMISSION_DENIED", "details": [{
            "@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID",
            "domain": "googleapis.com"}]}},
    "revoked": {"error": {"message": "This API key has been revoked.",
                          "type": "permission_error"}},
    "expired": {"error": {"message": "Expired API key", "code": "forbidden"}},
    "disabled": {"error": {"message": "Your API key has been disabled by an administrator.",
                           "type": "forbidden"}},
}
#: 403s about one model, one resource or a region: the endpoint serves other calls.
NOT_KEY_403 = {
    "openai model access": {"error": {
        "message": "Project `proj_abc` does not have access to model `gpt-locked`",
        "type": "invalid_request_error", "param": None, "code": "model_not_found"}},
    "anthropic permission": {"type": "error", "error": {
        "type": "permission_error",
        "message": "Your API key does not have permission to use the specified resource."}},
    "openai region": {"error": {"code": "unsupported_country_region_territory",
                                "message": "Country, region, or territory not supported",
                                "param": None, "type": "request_forbidden"}},
    "gemini caller": {"error": {"code": 403, "message": "The caller does not have "
                                "permission", "status": "PERMISSION_DENIED"}},
    "model not enabled": {"error": {"message": "The model gpt-locked is not enabled for "
                                               "this API key, but others are valid",
                                    "type": "forbidden"}},
}


def outcome_of(body: Any) -> CallOutcome:
    raw = json.dumps(body).encode()
    return CallOutcome(None, classify_response(403, body, {}, raw), 5.0)


@pytest.mark.parametrize("body", KEY_403.values(), ids=KEY_403.keys())
def test_a_403_that_refuses_the_key_itself_is_a_refused_key(body: Any) -> None:
    out = outcome_of(body)
    assert out.error_class is ErrorClass.AUTH_ERROR
    assert key_refused(out)


@pytest.mark.parametrize("body", NOT_KEY_403.values(), ids=NOT_KEY_403.keys())
def test_a_403_for_one_model_or_a_permission_is_not_a_refused_key(body: Any) -> None:
    out = outcome_of(body)
    assert out.error_class is ErrorClass.AUTH_ERROR
    assert not key_refused(out)


#: How many calls the test's server refuses before it takes the key again.
REFUSED = 10


def answer(content: str = '{"label": "delivery"}') -> web.Response:
    return web.json_response({
        "model": MODEL, "usage": {"prompt_tokens": 40, "completion_tokens": 5},
        "choices": [{"message": {"role": "assistant", "content": content},
                     "finish_reason": "stop"}]})


@pytest.mark.parametrize("body", [OPENAI_403, GEMINI_403], ids=["openai", "gemini"])
def test_a_key_refused_with_a_403_spends_no_attempts_and_the_tasks_run_once_it_is_accepted(
        stores: Callable[[], Store], body: Any) -> None:
    """The server refuses the key (403, the body says so) for its first calls, then
    takes it. Each refused call spent an attempt (``max_retries = 0``: every task that
    met one ended DEAD); now the endpoint counts as down, the refused calls are given
    back without spending an attempt, and every task succeeds with its one attempt."""
    seen = {"refused": 0, "answered": 0}

    async def chat(_request: web.Request) -> web.Response:
        if seen["refused"] < REFUSED:
            seen["refused"] += 1
            return web.json_response(body, status=403)
        seen["answered"] += 1
        return answer()

    store = stores()
    store.submit([parse_task(t) for t in tasks(20, retry={"max_retries": 0,
                                                           "base_delay_ms": 50})],
                 batch_id="b")
    with chat_server(chat) as url:
        cfg = settings([{"name": "ep", "base_url": url}],
                       flow={"breaker_open_s": 0.2, "breaker_max_open_s": 0.5},
                       concurrency=8)
        asyncio.run(run_workers([Worker(stores(), cfg, burst=True)], timeout=120))
    assert seen["refused"] == REFUSED
    assert status_counts(store) == {"SUCCEEDED": 20}
    assert {r["attempts"] for r in rows(store, "SELECT attempts FROM task")} == {1}
    refused = rows(store, "SELECT outcome, error_class, COUNT(*) AS n FROM task_attempt "
                          "WHERE outcome <> 'succeeded' GROUP BY outcome, error_class")
    assert [(r["outcome"], r["error_class"], int(r["n"])) for r in refused] == \
        [("unreachable", "auth_error", REFUSED)]


@pytest.mark.parametrize("body", [NOT_KEY_403["openai model access"],
                                  NOT_KEY_403["anthropic permission"]],
                         ids=["model access", "permission"])
def test_a_403_for_one_model_still_fails_only_its_tasks(stores: Callable[[], Store],
                                                        body: Any) -> None:
    """A 403 for one model the key may not use: the tasks asking for that model spend
    their attempt and end; the endpoint is not counted as down, the others succeed."""
    async def chat(request: web.Request) -> web.Response:
        if (await request.json())["model"] == "gpt-locked":
            return web.json_response(body, status=403)
        return answer()

    store = stores()
    retry = {"max_retries": 0, "base_delay_ms": 50}
    specs = tasks(16, retry=retry) + tasks(4, "locked", retry=retry,
                                           model={"name": "gpt-locked"})
    store.submit([parse_task(t) for t in specs], batch_id="b")
    with chat_server(chat) as url:
        cfg = settings([{"name": "ep", "base_url": url}],
                       flow={"breaker_open_s": 0.2, "breaker_max_open_s": 0.5},
                       concurrency=8)
        asyncio.run(run_workers([Worker(stores(), cfg, burst=True)], timeout=120))
    ended = {r["task_id"]: (r["status"], int(r["attempts"]), r["error_class"])
             for r in rows(store, "SELECT task_id, status, attempts, error_class "
                                  "FROM task")}
    assert {k: v for k, v in ended.items() if v[0] != "SUCCEEDED"} == {
        f"locked-{i:05d}": ("DEAD", 1, "auth_error") for i in range(4)}
    assert len(ended) == 20
    assert not rows(store, "SELECT 1 FROM task_attempt WHERE outcome = 'unreachable'")
