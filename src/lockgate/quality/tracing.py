"""OpenTelemetry traces of every call, with the GenAI semantic conventions.

Off unless the standard environment asks for it: ``OTEL_TRACES_EXPORTER`` (``otlp`` or
``console``) or an OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), and not ``OTEL_SDK_DISABLED=true``. The
exporter speaks OTLP/HTTP (protobuf) and reads its own ``OTEL_EXPORTER_OTLP_*``
settings; spans leave through the SDK's batch processor (``OTEL_BSP_*``), so a slow or
absent collector never holds a worker up; ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` name the service (``lockgate`` by default);
``OTEL_TRACES_SAMPLER=traceidratio`` with ``OTEL_TRACES_SAMPLER_ARG`` keeps a share of the
tasks (decided per task: its trace id is derived from the task id), for volumes where a
span per call costs too much CPU.

Spans are made when a write-back has committed, from the attempt rows it wrote, with the
attempt's own times (database clock): a span ``lockgate.task {task_id}`` per run of a
task (one claim: render, call, parse), and under it the call, ``chat {model}``, of kind
CLIENT with the ``gen_ai.*`` attributes. Every run of a task is in the task's own trace
(its id is derived from the task id), so retries on other workers line up in one trace.
Prompt and answer texts are added only when
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` is true; no API key or header is
ever an attribute, and ``server.address`` is the endpoint's host alone.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context

from lockgate.config import Endpoint

CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
#: An empty context: the run span is a root whatever span the caller is in.
_ROOT = Context()
#: Longest text a span keeps of a prompt or an answer (characters).
MAX_CONTENT = 16_384


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def enabled(env: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for traces (see the module docstring)."""
    env = os.environ if env is None else env
    if _true(env.get("OTEL_SDK_DISABLED")):
        return False
    exporter = (env.get("OTEL_TRACES_EXPORTER") or "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def _exporter(env: Mapping[str, str]) -> SpanExporter:
    if (env.get("OTEL_TRACES_EXPORTER") or "").strip().lower() == "console":
        return ConsoleSpanExporter()
    # Imported only when traces are on: the exporter brings an HTTP client and protobuf
    # code that every other use of lockgate would load for nothing.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter()


@dataclass(frozen=True, slots=True)
class CallSpan:
    """What the spans of one written attempt say (gathered in the write-back's
    transaction, emitted after it commits)."""

    task_id: str
    batch_id: str
    prompt: str
    attempt: Mapping[str, Any]
    response_model: str | None
    response_body: str | None
    outcome: str


class Tracing:
    """Emits the spans of written attempts through one tracer provider."""

    def __init__(self, processor: SpanProcessor, *,
                 endpoint: Callable[[str], Endpoint | None] = lambda _n: None,
                 capture_content: bool = False,
                 resource: Resource | None = None) -> None:
        self._ids = _TaskIds()
        self.provider = TracerProvider(id_generator=self._ids, resource=resource or
                                       Resource.create({"service.name": os.environ.get(
                                           "OTEL_SERVICE_NAME") or "lockgate"}))
        self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("lockgate")
        self.capture_content = capture_content
        self._endpoint = endpoint
        self._servers: dict[str, tuple[str | None, int | None]] = {}

    @classmethod
    def from_env(cls, endpoint: Callable[[str], Endpoint | None],
                 env: Mapping[str, str] | None = None) -> Tracing | None:
        """The tracing the environment configures, or None when it asks for none."""
        env = os.environ if env is None else env
        if not enabled(env):
            return None
        return cls(BatchSpanProcessor(_exporter(env)), endpoint=endpoint,
                   capture_content=_true(env.get(CAPTURE_CONTENT)))

    def emit(self, calls: Sequence[CallSpan]) -> None:
        """The run span and call span of each written attempt."""
        for c in calls:
            self._emit(c)

    def _emit(self, c: CallSpan) -> None:
        a = c.attempt
        start = int(a.get("started_at") or 0) * 1_000_000
        latency = a.get("latency_ms")
        end = start + int((latency or 0.0) * 1_000_000)
        self._ids.trace_id = int.from_bytes(
            hashlib.sha256(c.task_id.encode()).digest()[:16], "big") or 1
        try:  # a root span: the trace is the task's
            run = self.tracer.start_span(f"lockgate.task {c.task_id}", context=_ROOT,
                                         kind=SpanKind.INTERNAL, start_time=start)
        finally:
            self._ids.trace_id = 0
        if not run.is_recording():  # sampled out (OTEL_TRACES_SAMPLER): nothing to build
            return
        run.set_attributes(self._lockgate(c))
        error = a.get("error_class")
        if c.outcome in ("failed", "dead") and error:
            run.set_status(Status(StatusCode.ERROR, error))
        if a.get("prompt_sha256") is not None and latency is not None:
            model = a.get("model") or ""
            call = self.tracer.start_span(f"chat {model}".strip(),
                                          context=set_span_in_context(run),
                                          kind=SpanKind.CLIENT, start_time=start,
                                          attributes=self._gen_ai(c))
            if error:
                call.set_status(Status(StatusCode.ERROR, error))
            call.end(end_time=end)
        run.end(end_time=end)

    @staticmethod
    def _lockgate(c: CallSpan) -> dict[str, Any]:
        a = c.attempt
        attrs: dict[str, Any] = {
            "lockgate.task.id": c.task_id, "lockgate.batch.id": c.batch_id,
            "lockgate.prompt.version": c.prompt, "lockgate.attempt": a.get("attempt") or 0,
            "lockgate.outcome": c.outcome}
        for key, name in (("parse_status", "lockgate.parse_status"),
                          ("completeness", "lockgate.completeness"),
                          ("error_class", "lockgate.error_class"),
                          ("routed_from", "lockgate.routed_from")):
            if a.get(key) is not None:
                attrs[name] = a[key]
        return attrs

    def _gen_ai(self, c: CallSpan) -> dict[str, Any]:
        a = c.attempt
        endpoint = a.get("endpoint") or ""
        host, port = self._server(endpoint)
        attrs: dict[str, Any] = {
            gen_ai.GEN_AI_OPERATION_NAME: "chat",
            gen_ai.GEN_AI_PROVIDER_NAME: endpoint or "openai",
            gen_ai.GEN_AI_REQUEST_MODEL: a.get("model") or "",
            "lockgate.task.id": c.task_id, "lockgate.prompt.version": c.prompt}
        if c.response_model:
            attrs[gen_ai.GEN_AI_RESPONSE_MODEL] = c.response_model
        for key, name in (("input_tokens", gen_ai.GEN_AI_USAGE_INPUT_TOKENS),
                          ("output_tokens", gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS),
                          ("request_id", gen_ai.GEN_AI_RESPONSE_ID),
                          ("parse_status", "lockgate.parse_status"),
                          ("completeness", "lockgate.completeness")):
            if a.get(key) is not None:
                attrs[name] = a[key]
        reasons = _finish_reasons(c.response_body)
        if reasons:
            attrs[gen_ai.GEN_AI_RESPONSE_FINISH_REASONS] = reasons
        if host:
            attrs["server.address"] = host
        if port:
            attrs["server.port"] = port
        if a.get("error_class"):
            attrs["error.type"] = a["error_class"]
        if self.capture_content:
            if a.get("prompt_snapshot"):
                attrs[gen_ai.GEN_AI_INPUT_MESSAGES] = _messages(a["prompt_snapshot"])
            if a.get("raw_output") is not None:
                attrs[gen_ai.GEN_AI_OUTPUT_MESSAGES] = orjson.dumps([{
                    "role": "assistant", "parts": [{"type": "text", "content":
                                                    a["raw_output"][:MAX_CONTENT]}]}]).decode()
        return attrs

    def _server(self, endpoint: str) -> tuple[str | None, int | None]:
        found = self._servers.get(endpoint)
        if found is None:
            ep = self._endpoint(endpoint) if endpoint else None
            if ep is None:
                found = (None, None)
            else:
                url = urlsplit(ep.base_url)
                found = (url.hostname, url.port)  # never the user or password
            self._servers[endpoint] = found
        return found

    def shutdown(self) -> None:
        """Export what is queued and stop."""
        self.provider.shutdown()


class _TaskIds(IdGenerator):
    """Random span ids; the trace id of a root span is the one set for the task whose
    span is being started (spans are made one at a time, on one thread)."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self.trace_id = 0

    def generate_span_id(self) -> int:
        return self._random.generate_span_id()

    def generate_trace_id(self) -> int:
        return self.trace_id or self._random.generate_trace_id()


def _finish_reasons(body: str | None) -> list[str]:
    if not body:
        return []
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return []
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if not isinstance(choices, list):
        return []
    return [str(c["finish_reason"]) for c in choices
            if isinstance(c, dict) and c.get("finish_reason")]


def _messages(snapshot: str) -> str:
    """The rendered messages in the convention's form (role and text parts)."""
    try:
        messages = orjson.loads(snapshot)
    except orjson.JSONDecodeError:
        messages = [{"role": "user", "content": snapshot}]
    out = [{"role": m.get("role", "user"), "parts": [
        {"type": "text", "content": str(m.get("content", ""))[:MAX_CONTENT]}]}
        for m in messages if isinstance(m, dict)]
    return orjson.dumps(out).decode()
