"""The one execution path: render -> call -> parse, then the retry decision.

Production tasks and release-gate samples both go through :func:`run_attempt`;
:func:`decide` turns its result into the task's next state under the retry policy.
Nothing here touches the database.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import orjson

from lockgate import runtime
from lockgate.config import Endpoint
from lockgate.errors import ErrorClass, LockgateError
from lockgate.providers.base import Completion, CompletionRequest, Provider, ProviderError
from lockgate.spec import TaskConfig
from lockgate.states import TaskStatus
from lockgate.store.types import AttemptRow


@dataclass(slots=True)
class AttemptResult:
    """Everything one call produced, for the decision and the trace."""

    rendered: runtime.Rendered | None
    completion: Completion | None
    parsed: runtime.Parsed | None
    error_class: ErrorClass | None
    error_message: str | None
    retry_after_ms: int | None
    latency_ms: float
    http_status: int | None
    endpoint: str
    model: str
    #: The provider's request id and response body as returned (when it answered).
    request_id: str | None = None
    response_body: str | None = None
    #: When the request was sent, on the clock of ``run_attempt``'s ``now_ms`` (None:
    #: not asked for, or nothing sent): after any wait for the endpoint's rate limit,
    #: so that the trace's call span starts there and not with the attempt.
    sent_at: int | None = None
    #: The usage and model of an answer the provider billed that is an error here (a
    #: refusal, a filtered answer, tool calls: :class:`ProviderError`), recorded as a
    #: completion's are; a completion's own are read from it.
    input_tokens: int | None = None
    output_tokens: int | None = None
    answered_model: str | None = None

    @property
    def prompt_tokens(self) -> int | None:
        """The input tokens the provider counted for this call, if it said."""
        c = self.completion
        return c.prompt_tokens if c is not None else self.input_tokens

    @property
    def completion_tokens(self) -> int | None:
        """The output tokens the provider counted for this call, if it said."""
        c = self.completion
        return c.completion_tokens if c is not None else self.output_tokens

    @property
    def ok(self) -> bool:
        return self.error_class is None


@dataclass(slots=True)
class Decision:
    """The task's next state after an attempt."""

    status: TaskStatus
    result: str | None
    delay_ms: int
    outcome: str  # succeeded | retry | failed | dead


#: Inputs of up to this many characters are rendered on the event loop whatever their
#: budget: rendering them costs under a millisecond or so, where a hop to a thread
#: (20-50 µs) would add to every short prompt's cost.
RENDER_ON_LOOP_CHARS = 16 * 1024

#: Inputs of up to this many characters are rendered on the event loop when their
#: model config sets no ``max_input_tokens`` (nothing to count or condense:
#: normalising and joining cost some 25 ms per MB).
RENDER_ON_LOOP_UNBUDGETED_CHARS = 256 * 1024


def renders_slowly(config: TaskConfig, input_chars: int) -> bool:
    """Whether rendering an input of ``input_chars`` characters may take long enough to
    stall the event loop: condensing to a token budget costs about a second per MB of
    input (and a store accepts inputs of several MB). While the loop is held, a worker
    renews no lease and reads no answer: a claim of a few such tasks held it past their
    leases, and other workers called them again. A prompt of at most as many bytes as
    its budget has tokens cannot be over it (nothing is counted or condensed)."""
    if input_chars <= RENDER_ON_LOOP_CHARS:
        return False
    budget = config.model.max_input_tokens
    if budget is None:
        return input_chars > RENDER_ON_LOOP_UNBUDGETED_CHARS
    return input_chars > budget


def input_chars(input_data: Mapping[str, Any]) -> int:
    """The characters of an input's text values (what rendering normalises, counts and
    condenses), without encoding the input: for callers without its JSON text."""
    return sum(len(v) for v in input_data.values() if isinstance(v, str))


async def render_prompt(config: TaskConfig, input_data: Mapping[str, Any], *,
                        size: int | None = None,
                        threads: Executor | None = None) -> runtime.Rendered:
    """:func:`runtime.render`, on a thread of ``threads`` (None: the event loop's
    default executor) when the input is large enough to be slow to render
    (:func:`renders_slowly`), else at once. ``size`` is the input's length in
    characters where the caller has it (its JSON text), else its text values are
    measured."""
    chars = input_chars(input_data) if size is None else size
    if not renders_slowly(config, chars):
        return runtime.render(config, input_data)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(threads, runtime.render, config, input_data)


async def run_attempt(config: TaskConfig, input_data: dict[str, Any], endpoint: Endpoint,
                      provider: Provider, *, idempotency_key: str | None,
                      params: dict[str, Any],
                      now_ms: Callable[[], int] | None = None,
                      input_size: int | None = None,
                      render_threads: Executor | None = None) -> AttemptResult:
    """Render the prompt, call the model once, parse and validate the answer.
    ``now_ms`` (the worker's database clock) stamps the moment the request is sent
    (``sent_at``; the attempt's ``started_at`` is when the worker began the task,
    waits for flow control included). The endpoint's ``timeout`` (seconds), where set,
    wins over the task's ``model_config.timeout_ms``. A large input is rendered on a
    thread of ``render_threads`` (:func:`render_prompt`; ``input_size``: the length of
    the input's JSON text, where the caller has it), so that the event loop goes on
    renewing leases and reading answers meanwhile."""
    model = endpoint.model or config.model.name
    t0 = time.perf_counter()
    try:
        rendered = await render_prompt(config, input_data, size=input_size,
                                       threads=render_threads)
    except LockgateError as exc:
        return AttemptResult(None, None, None, ErrorClass.RENDER_ERROR, str(exc), None, 0.0,
                             None, endpoint.name, model)
    timeout_s = endpoint.timeout_s or config.model.timeout_ms / 1000.0
    request = CompletionRequest(messages=rendered.messages, model=model, params=params,
                                timeout_s=timeout_s, idempotency_key=idempotency_key)
    sent = now_ms() if now_ms is not None else None
    try:
        completion = await provider.complete(request)
    except ProviderError as exc:
        return AttemptResult(rendered, None, None, exc.error_class, exc.message,
                             exc.retry_after_ms, (time.perf_counter() - t0) * 1000,
                             exc.http_status, endpoint.name, model, exc.request_id, exc.body,
                             sent, exc.prompt_tokens, exc.completion_tokens, exc.model)
    latency = (time.perf_counter() - t0) * 1000
    try:
        # The provider's finish_reason goes with the text: an answer it cut off at
        # max_tokens may look finished (prose) or be closed by the repair (JSON).
        # After an assistant prefill ("{") the reply may be its continuation: the
        # answer is then the two joined (the raw output kept is the provider's own).
        parsed = runtime.parse_reply(rendered.messages, completion.content,
                                     config.delivery_rule,
                                     finish_reason=completion.finish_reason)
    except LockgateError as exc:  # the delivery rule itself is broken: not retryable
        return AttemptResult(rendered, completion, None, ErrorClass.INVALID_REQUEST,
                             f"delivery_rule: {exc}", None, latency, completion.http_status,
                             endpoint.name, model, completion.request_id, completion.body,
                             sent)
    if not parsed.usable:
        return AttemptResult(rendered, completion, parsed, ErrorClass.INVALID_OUTPUT,
                             f"{parsed.status}: {parsed.error or 'unusable output'}", None,
                             latency, completion.http_status, endpoint.name, model,
                             completion.request_id, completion.body, sent)
    return AttemptResult(rendered, completion, parsed, None, None, None, latency,
                         completion.http_status, endpoint.name, model, completion.request_id,
                         completion.body, sent)


def decide(config: TaskConfig, attempt: int, res: AttemptResult,
           rng: random.Random | None = None) -> Decision:
    """Apply the delivery rule and retry policy to one attempt's result.

    ``attempt`` is 1-based: attempt ``max_retries + 1`` is the last one allowed.
    """
    if res.ok:
        assert res.parsed is not None
        return Decision(TaskStatus.SUCCEEDED, _dump(res.parsed.value), 0, "succeeded")
    policy = config.retry_policy
    rule = config.delivery_rule
    err = res.error_class
    assert err is not None
    retryable = policy.retryable(err) and not (
        err is ErrorClass.INVALID_OUTPUT and rule.on_invalid == "fail")
    if retryable and attempt <= policy.max_retries:
        delay = policy.delay_ms(attempt, rng)
        if res.retry_after_ms is not None:
            delay = max(delay, res.retry_after_ms)
        return Decision(TaskStatus.PENDING, None, delay, "retry")
    status = TaskStatus.DEAD if retryable else TaskStatus.FAILED
    result = None
    if rule.on_invalid == "fallback" and rule.fallback_values:
        result = _dump(rule.fallback_values)  # delivered, but the task still says why
        status = TaskStatus.FAILED
    return Decision(status, result, 0, "dead" if status is TaskStatus.DEAD else "failed")


def idempotency_key(task_id: str, lease_token: str, attempt: int) -> str:
    """The ``Idempotency-Key`` of one call: ``{task_id}:{token[:16]}:{attempt}``.

    The lease token is drawn afresh for every claim, so the key never repeats, not
    after ``tasks retry`` (which resets the attempt count) nor when a task id is used
    again after ``cleanup``: a provider that honours the key can never replay the
    answer of an earlier claim. 64 random bits of the token are plenty against chance
    collisions; the task id and attempt keep the key readable."""
    return f"{task_id}:{lease_token[:16]}:{attempt}"


#: The longest answer a trace keeps whole; beyond it the rest is cut with a marker (a
#: provider that answers megabytes would otherwise outgrow a database packet).
MAX_RAW_OUTPUT = 1 << 20


def kept(text: str, limit: int = MAX_RAW_OUTPUT) -> str:
    """``text`` as a trace keeps it: whole up to ``limit`` characters, else its first
    ``limit`` and a marker saying how much was cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[lockgate: {len(text) - limit:,} more characters not kept]"


def _dump(value: Any) -> str:
    return orjson.dumps(value).decode()


def provider_params(config: TaskConfig, endpoint: Endpoint, worker_seed: str) -> dict[str, Any]:
    """Sampling parameters from model_config (never code), per worker; ``top_k`` only
    where the endpoint accepts it."""
    params = runtime.sampling_params(config.model, worker_seed)
    if not endpoint.supports_top_k:
        params.pop("top_k", None)
    return params


def trace_fixes(rendered: runtime.Rendered | None, parsed: runtime.Parsed | None
                ) -> str | None:
    """The attempt row's ``fixes``: what rendering did to the input (its alerts,
    ``input_default:<name>``, ``input_fallback:<name>``, ``empty_input:<name>``,
    ``over_budget``, and notes, ``condensed:<name>:<kept>/<total> <unit>``), then what
    parsing did to the answer, comma-separated; None for neither."""
    if rendered is None or not (rendered.alerts or rendered.notes):
        return ",".join(parsed.fixes) if parsed and parsed.fixes else None
    return ",".join((*rendered.alerts, *rendered.notes, *(parsed.fixes if parsed else ())))


def attempt_trace(attempt: int, started_ms: int, res: AttemptResult, outcome: str,
                  *, store_snapshot: bool = True,
                  prompt_version: str | None = None) -> AttemptRow:
    """The task_attempt row for one call; ``prompt_version`` names the
    registry version the call ran (``name@N``), if any."""
    r, c, p = res.rendered, res.completion, res.parsed
    row: AttemptRow = {
        "attempt": attempt,
        "outcome": outcome,
        "started_at": started_ms,
        "latency_ms": round(res.latency_ms, 3),
        "endpoint": res.endpoint,
        "model": res.model,
        "prompt_sha256": r.sha256 if r else None,
        "prompt_snapshot": r.snapshot if (r and store_snapshot) else None,
        "token_estimator": r.estimator if r else None,
        "estimated_tokens": r.input_tokens if r else None,
        "input_tokens": res.prompt_tokens,
        "output_tokens": res.completion_tokens,
        "http_status": res.http_status,
        "raw_output": kept(c.content) if c else None,
        "parse_status": str(p.status) if p else None,
        "fixes": trace_fixes(r, p),
        "completeness": p.completeness if p else None,
        "error_class": str(res.error_class) if res.error_class else None,
        "error_message": (res.error_message or "")[:2000] or None,
        "prompt_version": prompt_version,
        "request_id": res.request_id,
    }
    return row
