"""A template that ends with an assistant message prefills the answer: a provider that
honours prefills (Claude-like) returns only the continuation, which the worker's
execution path parses joined to the prefill; the raw output kept in the trace is the
provider's own text."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from lockgate.config import Endpoint
from lockgate.providers.base import Completion, CompletionRequest
from lockgate.spec import TaskConfig, load_config, parse_task
from lockgate.worker.execute import AttemptResult, attempt_trace, run_attempt

SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["label", "score"],
    "properties": {"label": {"enum": ["positive", "negative", "neutral"]},
                   "score": {"type": "number"}}}


class Continuing:
    """A provider that answers every call with ``content`` and records the request."""

    name = "continuing"

    def __init__(self, content: str) -> None:
        self.content = content
        self.requests: list[CompletionRequest] = []

    async def complete(self, request: CompletionRequest) -> Completion:
        self.requests.append(request)
        return Completion(self.content, 200, request.model, prompt_tokens=5,
                          completion_tokens=8, finish_reason="stop")

    async def close(self) -> None:
        return None


def _config(prefill: str | None) -> TaskConfig:
    template: list[dict[str, str]] = [{"role": "user", "content": "Classify: {text}"}]
    if prefill is not None:
        template.append({"role": "assistant", "content": prefill})
    return load_config(parse_task({
        "task_id": "t", "prompt_template": template,
        "input_data": {"text": "The box arrived broken."},
        "model_config": {"name": "m"}, "delivery_rule": {"schema": SCHEMA},
        "retry_policy": {"max_retries": 0}}).config_document())


def _attempt(config: TaskConfig, provider: Continuing) -> AttemptResult:
    return asyncio.run(run_attempt(config, {"text": "The box arrived broken."},
                                   Endpoint(name="e", base_url="http://h/v1"), provider,
                                   idempotency_key=None, params={}))


@pytest.mark.parametrize(("prefill", "content"), [
    ("{{", '"label": "negative", "score": 0.2}'),
    ('{{"label": "', 'negative", "score": 0.2}'),
    ("{{", ' \n"label": "negative",\n"score": 0.2\n}'),
])
def test_a_continuation_after_a_prefill_is_delivered(prefill: str, content: str) -> None:
    provider = Continuing(content)
    res = _attempt(_config(prefill), provider)
    assert provider.requests[0].messages[-1]["role"] == "assistant"
    assert res.error_class is None, res.error
    assert res.parsed is not None and res.parsed.value == {"label": "negative", "score": 0.2}
    row = attempt_trace(1, 0, res, "ok")
    assert row["raw_output"] == content  # the provider's own text, not the joined one


@pytest.mark.parametrize("content", [
    '{"label": "negative", "score": 0.2}',
    '{ "label": "negative", "score": 0.2 }',
    '{\n  "score": 0.2,\n  "label": "negative"\n}',
    'Sure! {"label": "negative", "score": 0.2}',
])
@pytest.mark.parametrize("prefill", ["{{", '{{"label": "', None])
def test_a_whole_answer_is_delivered_with_or_without_a_prefill(prefill: str | None,
                                                                content: str) -> None:
    # a provider that ignores prefills answers whole, with its own spacing and order
    res = _attempt(_config(prefill), Continuing(content))
    assert res.error_class is None, res.error
    assert res.parsed is not None and res.parsed.value == {"label": "negative", "score": 0.2}
    assert attempt_trace(1, 0, res, "ok")["raw_output"] == content


@pytest.mark.parametrize(("prefill", "content"), [
    ("{{", '"score": 0.2, "label": "negative"}\n\nIf it were positive: '
           '{"label": "positive", "score": 0.9}'),
    ("{{", '"label": "negative", "score": 0.2, "source": {"label": "positive", "score": 0.9}}'),
    ('{{"label": "', 'negative", "score": 0.2, "aside": {"label": "positive", "score": 0.9}}'),
])
def test_a_continuation_holding_another_object_is_read_whole(prefill: str,
                                                              content: str) -> None:
    # Alone, the reply's one object is a nested one or an aside: it had been delivered
    res = _attempt(_config(prefill), Continuing(content))
    assert res.error_class is None, res.error
    assert res.parsed is not None
    assert (res.parsed.value["label"], res.parsed.value["score"]) == ("negative", 0.2)
