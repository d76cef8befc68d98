"""Context-length wordings the classifier missed (review 8): Anthropic's current 400 and
vLLM V1's were ``invalid_request`` (the task FAILED with a class that says "the request
is wrong" where it is "the prompt is too long for this model"); parameter errors that
speak of limits stay ``invalid_request``."""

from __future__ import annotations

from typing import Any

import pytest

from lockgate.errors import ErrorClass
from lockgate.providers.openai import classify_response

CONTEXT = {
    "anthropic, input + max_tokens": {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "input length and `max_tokens` exceed context limit: 198000 + 8192 > "
                   "200000, decrease input length or `max_tokens` and try again"}},
    "vllm v1, maximum model length": {
        "object": "error", "type": "BadRequestError", "code": 400,
        "message": "The decoder prompt (length 5000) is longer than the maximum model "
                   "length of 4096. Make sure that `max_model_len` is no smaller than the "
                   "number of text tokens."},
    "vllm, too long to fit into the model": {
        "object": "error", "type": "BadRequestError", "code": 400,
        "message": "The prompt (length 5000) is too long to fit into the model (context "
                   "length 4096). Make sure that `max_model_len` is no smaller than the "
                   "number of text tokens plus multimodal tokens."},
    "openai-style, exceeds the context window": {"error": {
        "type": "invalid_request_error",
        "message": "Your input exceeds the context window of this model. Please adjust "
                   "your input and try again."}},
    "exceeds context limit, singular": {"error": {
        "message": "prompt exceeds context limit (32768 tokens)"}},
    "too long to fit in the context": {"error": {
        "message": "The input is too long to fit in the context of this model"}},
    "bedrock": {"message": "Input is too long for requested model."},
}

NOT_CONTEXT = {
    "openai max_tokens too large": {"error": {
        "message": "max_tokens is too large: 100000. This model supports at most 4096 "
                   "completion tokens, whereas you provided 100000.",
        "type": "invalid_request_error", "param": "max_tokens", "code": "invalid_value"}},
    "anthropic max_tokens over the model's output": {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "max_tokens: 100000 > 64000, which is the maximum allowed number of "
                   "output tokens for claude-sonnet-4-20250514"}},
    "array too long": {"error": {
        "message": "Invalid 'messages': array too long. Expected an array with maximum "
                   "length 2048, but got an array with length 3000 instead.",
        "type": "invalid_request_error", "code": "array_above_max_length"}},
    "tool name too long": {"error": {
        "message": "Invalid 'tools[0].function.name': string too long. Expected a string "
                   "with maximum length 64, but got a string with length 80 instead.",
        "type": "invalid_request_error", "code": "string_above_max_length"}},
    "vllm max_tokens": {"object": "error", "type": "BadRequestError", "code": 400,
                        "message": "max_tokens must be at least 1, got 0."},
    "limit not of a context": {"error": {
        "message": "The number of images exceeds the limit of 20 per request"}},
}


@pytest.mark.parametrize("body", CONTEXT.values(), ids=CONTEXT.keys())
def test_a_context_length_is_recognised_in_these_words_too(body: Any) -> None:
    assert classify_response(400, body, {}).error_class is \
        ErrorClass.CONTEXT_LENGTH_EXCEEDED


@pytest.mark.parametrize("body", NOT_CONTEXT.values(), ids=NOT_CONTEXT.keys())
def test_a_parameter_or_another_limit_is_still_an_invalid_request(body: Any) -> None:
    assert classify_response(400, body, {}).error_class is ErrorClass.INVALID_REQUEST
