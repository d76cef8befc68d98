"""How provider errors are classified, from real providers' bodies (no server, no
database): an exhausted balance or quota in each provider's words and statuses,
against the rate limits that must not be taken for one; a context length in each
server's words, against parameters out of range; an error object in a 2xx answer by
its code, type and message; a declared charset; a redirect."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lockgate.errors import ErrorClass
from lockgate.providers.base import ProviderError
from lockgate.providers.openai import (
    MAX_MODEL,
    MAX_REQUEST_ID,
    OpenAICompatible,
    _as_utf8,
    _error_in_body,
    _why_not_json,
    classify_response,
)

Q, R = ErrorClass.QUOTA_EXHAUSTED, ErrorClass.RATE_LIMITED

#: (provider, status, body, class): the out-of-money answers and the rate limits of
#: real providers, as they send them.
MONEY_AND_RATE: list[tuple[str, int, Any, ErrorClass]] = [
    ("openai quota", 429, {"error": {
        "message": "You exceeded your current quota, please check your plan and billing "
                   "details.", "type": "insufficient_quota", "code": "insufficient_quota"}},
     Q),
    ("openai rate", 429, {"error": {
        "message": "Rate limit reached for gpt-4o-mini in organization org-x on requests "
                   "per min (RPM): Limit 3, Used 3, Requested 1. Please try again in 20s. "
                   "You can increase your rate limit by adding a payment method to your "
                   "account at https://platform.openai.com/account/billing.",
        "type": "requests", "code": "rate_limit_exceeded"}}, R),
    ("openai rate, short", 429, {"error": {"message": "Rate limit reached for requests",
                                           "type": "requests",
                                           "code": "rate_limit_exceeded"}}, R),
    ("openai billing limit", 400, {"error": {
        "message": "Billing hard limit has been reached", "type": "invalid_request_error",
        "code": "billing_hard_limit_reached"}}, Q),
    ("azure rate", 429, {"error": {
        "code": "429", "message": "Requests to the ChatCompletions_Create Operation under "
        "Azure OpenAI API version 2024-02-01 have exceeded token rate limit of your current "
        "OpenAI S0 pricing tier. Please retry after 6 seconds."}}, R),
    ("azure quota", 429, {"error": {
        "code": "insufficient_quota", "message": "You exceeded your current quota."}}, Q),
    ("anthropic credit", 400, {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "Your credit balance is too low to access the Anthropic API. Please go "
                   "to Plans & Billing to upgrade or purchase credits."}}, Q),
    ("anthropic rate", 429, {"type": "error", "error": {
        "type": "rate_limit_error",
        "message": "Number of request tokens has exceeded your per-minute rate limit; "
                   "see the response headers for current usage."}}, R),
    ("dashscope arrearage", 400, {"error": {
        "code": "Arrearage", "param": None, "type": "Arrearage",
        "message": "Access denied, please make sure your account is in good standing."},
        "id": "r", "request_id": "r"}, Q),
    ("dashscope rate", 429, {"code": "Throttling.RateQuota",
                             "message": "Requests rate limit exceeded, please try again "
                                        "later."}, R),
    ("moonshot quota", 429, {"error": {
        "message": "Your account org-x <ak-x> is suspended, please check your plan and "
                   "billing details", "type": "exceeded_current_quota_error"}}, Q),
    ("moonshot rate", 429, {"error": {
        "message": "Your account org-x request reached organization max RPM: 3, please "
                   "try again after 1 seconds", "type": "rate_limit_reached_error"}}, R),
    ("deepseek balance", 402, {"error": {"message": "Insufficient Balance",
                                         "type": "unknown_error"}}, Q),
    ("zhipu balance", 429, {"error": {"code": "1113",
                                      "message": "余额不足或无可用资源包,请充值。"}}, Q),
    ("zhipu rate", 429, {"error": {"code": "1302",
                                   "message": "您当前使用该API的并发数过高，请降低并发"}}, R),
    ("openrouter credits", 402, {"error": {
        "code": 402, "message": "Insufficient credits. Add more using "
                                "https://openrouter.ai/settings/credits"}}, Q),
    ("gemini quota", 429, {"error": {
        "code": 429, "status": "RESOURCE_EXHAUSTED",
        "message": "You exceeded your current quota, please check your plan and billing "
                   "details."}}, Q),
    ("gemini rate", 429, {"error": {
        "code": 429, "status": "RESOURCE_EXHAUSTED",
        "message": "Resource has been exhausted (e.g. check quota)."}}, R),
    ("gemini per-minute", 429, {"error": {
        "code": 429, "status": "RESOURCE_EXHAUSTED",
        "message": "You exceeded your current quota, please check your plan and billing "
                   "details. For more information on this error, head to: "
                   "https://ai.google.dev/gemini-api/docs/rate-limits. Please retry in "
                   "43.5s."}}, R),
]


@pytest.mark.parametrize(("status", "body", "want"), [c[1:] for c in MONEY_AND_RATE],
                         ids=[c[0] for c in MONEY_AND_RATE])
def test_an_exhausted_balance_or_quota_is_told_from_a_rate_limit(
        status: int, body: Any, want: ErrorClass) -> None:
    assert classify_response(status, body, {}).error_class is want


@pytest.mark.parametrize(("status", "body", "want"), [c[1:] for c in MONEY_AND_RATE],
                         ids=[c[0] for c in MONEY_AND_RATE])
def test_the_same_bodies_in_a_200_are_classified_alike(
        status: int, body: Any, want: ErrorClass) -> None:
    if "error" not in body:
        body = {"error": body}
    found = _error_in_body(200, body, {}, b"")
    assert found is not None and found.error_class is want, found


RATE_PHRASES = ["Rate limit reached for requests", "rate limit exceeded",
                "Too Many Requests", "Requests are being throttled",
                "Limit 60 per minute", "Please try again in 20s", "retry after 3 seconds",
                "exceeded your TPM", "Throttling"]
RATE_CODES = ["rate_limit_exceeded", "requests", "tokens", "", "429", "Throttling.RateQuota",
              "Throttling.AllocationQuota", "rate_limit_error", "RESOURCE_EXHAUSTED"]


@given(before=st.text(max_size=60), phrase=st.sampled_from(RATE_PHRASES),
       after=st.text(max_size=60), code=st.sampled_from(RATE_CODES),
       etype=st.sampled_from(RATE_CODES), status=st.sampled_from([429, 200]))
def test_a_rate_limit_is_never_called_an_exhausted_quota(
        before: str, phrase: str, after: str, code: str, etype: str, status: int) -> None:
    """Whatever else its message says (a free account's 429 invites to add a payment
    method at .../billing), a rate limit passes by itself: it must not pause the
    endpoint for the quota's 30 s and send the batch to the fallback."""
    body = {"error": {"message": f"{before} {phrase} {after}", "code": code, "type": etype}}
    got = classify_response(status, body, {}) if status == 429 else \
        _error_in_body(status, body, {}, b"")
    assert got is not None and got.error_class is ErrorClass.RATE_LIMITED, got


CONTEXT = [
    ({"error": {"message": "This model's maximum context length is 8192 tokens. However, "
                           "your messages resulted in 9000 tokens.",
                "type": "invalid_request_error", "code": "context_length_exceeded"}}),
    ({"object": "error", "message": "This model's maximum context length is 4096 tokens. "
      "However, you requested 5000 tokens.", "type": "BadRequestError", "code": 400}),
    ({"type": "error", "error": {"type": "invalid_request_error",
                                 "message": "prompt is too long: 210000 tokens > 200000 "
                                            "maximum"}}),
    ({"error": {"code": 400, "message": "the request exceeds the available context size, "
                "try increasing it", "type": "exceed_context_size_error"}}),
    ({"error": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. "
               "Given: 4000 `inputs` tokens and 200 `max_new_tokens`",
      "error_type": "validation"}),
    ({"error": {"code": 400, "message": "The input token count (1200000) exceeds the "
                "maximum number of tokens allowed (1048576).", "status": "INVALID_ARGUMENT"}}),
    ({"error": {"message": "Maximum context length exceeded", "type": "invalid_request_error"}}),
    ({"object": "error", "message": "Prompt contains 40000 tokens and 0 draft tokens, too "
      "large for model with 32768 maximum context length", "code": 3051}),
    ({"error": {"message": "Range of input length should be [1, 30720]",
                "type": "invalid_request_error", "code": "invalid_parameter_error"}}),
]
NOT_CONTEXT = [
    ({"error": {"message": "max_tokens must be <= 4096", "type": "invalid_request_error"}}),
    ({"error": "Input validation error: `max_new_tokens` must be <= 2048. Given: 4000",
      "error_type": "validation"}),
    ({"error": {"message": "max_tokens is too large: 10000. This model supports at most "
                "4096 completion tokens, whereas you provided 10000.",
                "type": "invalid_request_error", "param": "max_tokens",
                "code": "invalid_value"}}),
    ({"error": {"message": "Invalid value for 'temperature': must be <= 2",
                "type": "invalid_request_error", "code": "invalid_value"}}),
    ({"error": {"message": "The model `x` does not exist", "code": "model_not_found"}}),
    ({"error": {"message": "Unrecognized request argument supplied: billing_address"}}),
]


@pytest.mark.parametrize("body", CONTEXT)
def test_a_context_length_is_recognised_in_any_server_s_words(body: Any) -> None:
    assert classify_response(400, body, {}).error_class is \
        ErrorClass.CONTEXT_LENGTH_EXCEEDED


@pytest.mark.parametrize("body", NOT_CONTEXT)
def test_a_parameter_out_of_range_is_not_a_context_length(body: Any) -> None:
    assert classify_response(400, body, {}).error_class is ErrorClass.INVALID_REQUEST


@pytest.mark.parametrize(("error", "want"), [
    ({"message": "The model `gpt-5x` does not exist", "type": "invalid_request_error",
      "code": "model_not_found"}, ErrorClass.INVALID_REQUEST),
    ({"message": "Invalid value for 'temperature': must be <= 2",
      "type": "invalid_request_error", "param": "temperature", "code": "invalid_value"},
     ErrorClass.INVALID_REQUEST),
    ({"message": "Incorrect API key provided", "type": "authentication_error",
      "code": "invalid_api_key"}, ErrorClass.AUTH_ERROR),
    ({"message": "The response was filtered due to the prompt triggering content "
                 "management policy", "type": None, "code": "content_filter"},
     ErrorClass.CONTENT_FILTERED),
    ({"message": "Rate limit reached", "code": "rate_limit_exceeded"}, R),
    ({"message": "Insufficient Balance", "code": "insufficient_balance"}, Q),
    ({"message": "nope", "code": 401}, ErrorClass.AUTH_ERROR),
    ({"message": "upstream overloaded", "code": 503}, ErrorClass.SERVER_ERROR),
    ({"message": "Internal error occurred", "type": "server_error"}, ErrorClass.SERVER_ERROR),
    ({"message": "something odd"}, ErrorClass.SERVER_ERROR),
])
def test_an_error_in_a_2xx_is_classified_as_its_status_would_have_been(
        error: Any, want: ErrorClass) -> None:
    found = _error_in_body(200, {"error": error}, {}, b"")
    assert found is not None and found.error_class is want, found
    assert found.http_status == 200 and error["message"] in found.message


def test_a_content_filter_is_a_filter_even_in_a_5xx() -> None:
    body = {"error": {"message": "filtered", "code": "content_filter"}}
    assert classify_response(500, body, {}).error_class is ErrorClass.CONTENT_FILTERED
    assert classify_response(500, {"error": {"message": "boom"}}, {}).error_class is \
        ErrorClass.SERVER_ERROR


@pytest.mark.parametrize(("charset", "text"), [("gbk", "快递"), ("iso-8859-1", "café"),
                                               ("utf-16", "快递"), ("GB2312", "快递")])
def test_a_body_in_its_declared_charset_is_read_as_utf_8(charset: str, text: str) -> None:
    raw = f'{{"note": "{text}"}}'.encode(charset)
    headers = {"content-type": f"application/json; charset={charset}"}
    assert _as_utf8(200, raw, headers).decode() == f'{{"note": "{text}"}}'


def test_an_unknown_or_missing_charset_leaves_the_body_as_it_came() -> None:
    raw = '{"note": "快递"}'.encode()
    assert _as_utf8(200, raw, {"content-type": "application/json; charset=nonesuch"}) == raw
    assert _as_utf8(200, raw, {"content-type": "application/json"}) == raw


def test_a_body_not_valid_in_its_charset_says_so() -> None:
    with pytest.raises(ProviderError) as caught:
        _as_utf8(200, b'{"note": "\x81"}', {"content-type": "application/json; charset=gbk"})
    assert caught.value.error_class is ErrorClass.SERVER_ERROR
    assert "not valid gbk, the charset its Content-Type declares" in caught.value.message
    # an error answer is classified by its status all the same
    assert _as_utf8(500, b"\x81", {"content-type": "text/plain; charset=gbk"}) == b"\x81"


def test_invalid_utf_8_is_not_called_cut_off() -> None:
    assert "not valid UTF-8 at byte 10" in _why_not_json('{"note": "快递"}'.encode("gbk"))
    assert _why_not_json('{"note": "快'.encode()[:-1]) == "cut off?"


def test_a_redirect_names_its_status_its_location_and_the_fix() -> None:
    prov = OpenAICompatible("hosted", "http://api.example.com/v1")
    err = prov._redirected(301, {"location": "https://api.example.com/v1/chat/completions"})
    assert err.error_class is ErrorClass.INVALID_REQUEST and err.http_status == 301
    assert err.message == (
        "HTTP 301: the endpoint redirects to https://api.example.com/v1/chat/completions; "
        "lockgate does not follow redirects: set endpoint 'hosted' base_url to the "
        "address it redirects to (typically https:// instead of http://)")


def test_limits_of_the_stored_columns() -> None:
    assert (MAX_REQUEST_ID, MAX_MODEL) == (128, 200)
