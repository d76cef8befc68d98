"""OpenTelemetry GenAI spans: the span tree and attributes of written attempts (in-memory
exporter), and a real worker exporting over OTLP/HTTP to a receiver started here,
decoded with the official protobuf package: content only when enabled, no secret ever."""

from __future__ import annotations

import asyncio
import gzip
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.trace import SpanKind, StatusCode

from engine.support import lockgate_cmd, tasks, write_jsonl
from helpers import clean_env, wait_for
from lockgate.config import Endpoint
from lockgate.errors import ErrorClass
from lockgate.providers.base import Completion, CompletionRequest, ProviderError
from lockgate.quality.tracing import (
    MAX_CONTENT,
    BatchSettings,
    CallSpan,
    Tracing,
    _OtlpWriter,
    enabled,
    frame,
)
from lockgate.quality.writer import QualityObserver, RollupWriter
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import load_config, parse_task
from lockgate.states import TaskStatus
from lockgate.store import Finish, Store
from lockgate.worker.execute import run_attempt

SECRET_KEY = "sk-very-secret-4f9a"
SECRET_HEADER = "hdr-secret-77c1"
BODY = orjson.dumps({"id": "r1", "model": "m-2024", "choices": [
    {"index": 0, "finish_reason": "stop", "message": {"role": "assistant",
                                                      "content": '{"label": "yes"}'}}]}
                    ).decode()


def _written(store: Store, observer: QualityObserver) -> None:
    """Task t0 answered after one retry; its first attempt timed out."""
    store.submit([parse_task({"task_id": "t0", "prompt_template": "Say {x}",
                              "input_data": {"x": 1}, "model_config": {"name": "m"},
                              "delivery_rule": {}, "retry_policy": {}})], batch_id="b")
    base = store.db_now()
    for attempt, ok in ((1, False), (2, True)):
        [t] = store.claim(1, lease_ms=60_000, worker_id="w")
        row: dict[str, Any] = {
            "attempt": attempt, "started_at": base + attempt * 1000, "latency_ms": 250.0,
            "endpoint": "sim", "model": "m", "prompt_sha256": "h",
            "prompt_snapshot": '[{"role":"user","content":"Say 1"}]'}
        if ok:
            row.update(outcome="succeeded", input_tokens=12, output_tokens=5,
                       raw_output='{"label": "yes"}', parse_status="valid",
                       completeness=1.0, request_id="req-9")
            f = Finish(id=t.id, lease_token=t.lease_token, status=TaskStatus.SUCCEEDED,
                       result='{"label": "yes"}', attempt=row,  # type: ignore[arg-type]
                       model="m-2024", response=BODY)
        else:
            row.update(outcome="retry", error_class="timeout")
            f = Finish(id=t.id, lease_token=t.lease_token, status=TaskStatus.PENDING,
                       attempt=row)  # type: ignore[arg-type]
        store.finish([f], worker_id="w", observe=observer)
        observer.committed()
    assert observer.tracing is not None and observer.tracing.flush(30)


def _observer(store: Store, exporter: InMemorySpanExporter, *,
              capture: bool) -> QualityObserver:
    ep = Endpoint(name="sim", base_url="http://user:pw@llm.example:8443/v1",
                  api_key_env="SIM_KEY")
    tracing = Tracing(SimpleSpanProcessor(exporter), endpoint={"sim": ep}.get,
                      capture_content=capture)
    return QualityObserver(RollupWriter(store, shard="w"), tracing=tracing)


@pytest.mark.parametrize("capture", [False, True], ids=["no-content", "content"])
def test_each_attempt_is_a_run_span_with_a_genai_call_span(
        store: Store, capture: bool) -> None:
    exporter = InMemorySpanExporter()
    _written(store, _observer(store, exporter, capture=capture))
    spans: list[ReadableSpan] = list(exporter.get_finished_spans())
    runs = [s for s in spans if s.name == "lockgate.task"]
    calls = [s for s in spans if s.name == "chat m"]
    assert len(runs) == len(calls) == 2 == len(spans) // 2
    assert len({s.context.trace_id for s in spans}) == 1  # the task's one trace
    for run, call in zip(runs, calls, strict=True):
        assert run.parent is None
        assert call.parent is not None and call.parent.span_id == run.context.span_id
        assert call.kind is SpanKind.CLIENT
        assert call.end_time - call.start_time == 250_000_000
    first, second = (dict(c.attributes or {}) for c in calls)
    assert first[gen_ai.GEN_AI_OPERATION_NAME] == "chat"
    assert first["error.type"] == "timeout"
    assert calls[0].status.status_code is StatusCode.ERROR
    expected = {
        gen_ai.GEN_AI_OPERATION_NAME: "chat", gen_ai.GEN_AI_PROVIDER_NAME: "openai",
        "lockgate.endpoint": "sim",
        gen_ai.GEN_AI_REQUEST_MODEL: "m", gen_ai.GEN_AI_RESPONSE_MODEL: "m-2024",
        gen_ai.GEN_AI_USAGE_INPUT_TOKENS: 12, gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS: 5,
        gen_ai.GEN_AI_RESPONSE_FINISH_REASONS: ("stop",), gen_ai.GEN_AI_RESPONSE_ID: "r1",
        "lockgate.request_id": "req-9",
        "server.address": "llm.example", "server.port": 8443,
        "lockgate.task.id": "t0", "lockgate.prompt.version": second[
            "lockgate.prompt.version"], "lockgate.parse_status": "valid",
        "lockgate.completeness": 1.0}
    assert str(second["lockgate.prompt.version"]).startswith("inline:")
    if capture:
        expected[gen_ai.GEN_AI_INPUT_MESSAGES] = orjson.dumps(
            [{"role": "user", "parts": [{"type": "text", "content": "Say 1"}]}]).decode()
        expected[gen_ai.GEN_AI_OUTPUT_MESSAGES] = orjson.dumps(
            [{"role": "assistant", "parts": [{"type": "text",
                                              "content": '{"label": "yes"}'}],
              "finish_reason": "stop"}]).decode()
    assert second == expected
    run_attrs = dict(runs[1].attributes or {})
    assert run_attrs["lockgate.batch.id"] == "b" and run_attrs["lockgate.attempt"] == 2
    assert run_attrs["lockgate.outcome"] == "succeeded"
    text = repr([dict(s.attributes or {}) for s in spans])
    assert "user:pw" not in text and "pw@" not in text  # the URL's credentials


@pytest.mark.parametrize(("base_url", "provider", "expected"), [
    ("https://myco.openai.azure.com/openai/v1", None, "azure.ai.openai"),
    ("https://api.anthropic.com/v1", None, "anthropic"),
    ("https://generativelanguage.googleapis.com/v1beta/openai", None, "gcp.gemini"),
    ("https://bedrock-runtime.us-east-1.amazonaws.com/openai/v1", None, "aws.bedrock"),
    ("https://gw.elb.amazonaws.com/v1", None, "openai"),  # not every AWS host is Bedrock
    ("https://API.Mistral.AI./v1", None, "mistral_ai"),
    ("https://notmistral.ai/v1", None, "openai"),  # a domain, not a suffix of letters
    ("http://127.0.0.1:4000/v1", None, "openai"),  # a gateway: the API it speaks
    ("http://127.0.0.1:4000/v1", "anthropic", "anthropic"),  # configured: as said
], ids=["azure", "anthropic", "gemini", "bedrock", "aws-other", "mistral", "lookalike",
        "gateway", "configured"])
def test_the_provider_name_is_the_conventions_name_of_the_endpoints_service(
        store: Store, base_url: str, provider: str | None, expected: str) -> None:
    # The endpoint's own configured name (a label such as "primary") was sent as
    # gen_ai.provider.name, which backends read as the service's well-known name.
    exporter = InMemorySpanExporter()
    ep = Endpoint(name="sim", base_url=base_url, api_key_env="SIM_KEY", provider=provider)
    tracing = Tracing(SimpleSpanProcessor(exporter), endpoint={"sim": ep}.get,
                      capture_content=False)
    _written(store, QualityObserver(RollupWriter(store, shard="w"), tracing=tracing))
    calls = [dict(s.attributes or {}) for s in exporter.get_finished_spans()
             if s.name == "chat m"]
    assert [(c[gen_ai.GEN_AI_PROVIDER_NAME], c["lockgate.endpoint"]) for c in calls] == \
        [(expected, "sim")] * 2


def test_traces_are_off_unless_the_environment_asks() -> None:
    assert not enabled({})
    assert enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert enabled({"OTEL_TRACES_EXPORTER": "otlp"})
    assert not enabled({"OTEL_TRACES_EXPORTER": "none",
                        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"})
    assert not enabled({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"})


# -- a real worker, a real OTLP/HTTP receiver -------------------------------------------


class _Receiver(BaseHTTPRequestHandler):
    received: list[tuple[str, bytes]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.received.append((self.path, body))
        out = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
    received: list[tuple[str, bytes]] = []
    handler = type("Handler", (_Receiver,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


def _attrs(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        v = kv.value
        kind = v.WhichOneof("value")
        out[kv.key] = [x.string_value for x in v.array_value.values] \
            if kind == "array_value" else getattr(v, kind)
    return out


@pytest.mark.parametrize("capture", ["false", "true"])
def test_a_worker_exports_its_calls_over_otlp_http(
        simulator: SimulatorProcess, receiver: tuple[str, list[tuple[str, bytes]]],
        tmp_path: Path, capture: str) -> None:
    url, received = receiver
    n = 12
    config = tmp_path / "lockgate.toml"
    config.write_text(f'default_endpoint = "sim"\n[[endpoint]]\nname = "sim"\n'
                      f'base_url = "{simulator.url}"\napi_key_env = "SIM_API_KEY"\n'
                      f'headers = {{ "X-Secret" = "{SECRET_HEADER}" }}\n')
    path = write_jsonl(tmp_path / "t.jsonl", tasks(n))
    env = clean_env(SIM_API_KEY=SECRET_KEY, OTEL_SERVICE_NAME="labeller",
                    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"{url}/v1/traces",
                    OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=capture)
    done = subprocess.run(lockgate_cmd("run", str(path), "--db",
                                       f"sqlite:///{tmp_path / 'db.sqlite'}",
                                       "--config", str(config)),
                          env=env, capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode()
    assert received and {p for p, _b in received} == {"/v1/traces"}
    spans = []
    for _path, body in received:
        request = ExportTraceServiceRequest.FromString(body)
        for rs in request.resource_spans:
            service = {kv.key: kv.value.string_value for kv in rs.resource.attributes}
            assert service["service.name"] == "labeller"
            for ss in rs.scope_spans:
                spans.extend(ss.spans)
    runs = {s.span_id: s for s in spans if s.name == "lockgate.task"}
    calls = [s for s in spans if s.name == "chat sim-small"]
    assert len(runs) == len(calls) == n == simulator.stats()["requests"]
    for c in calls:
        run = runs[c.parent_span_id]
        assert run.trace_id == c.trace_id and not run.parent_span_id
        a = _attrs(c)
        assert a[gen_ai.GEN_AI_OPERATION_NAME] == "chat"
        assert a[gen_ai.GEN_AI_REQUEST_MODEL] == "sim-small"
        assert a[gen_ai.GEN_AI_RESPONSE_MODEL] == "sim-small"
        assert a[gen_ai.GEN_AI_USAGE_INPUT_TOKENS] > 0
        assert a[gen_ai.GEN_AI_RESPONSE_FINISH_REASONS] == ["stop"]
        assert a["server.address"] == "127.0.0.1"
        assert (a[gen_ai.GEN_AI_PROVIDER_NAME], a["lockgate.endpoint"]) == ("openai", "sim")
        assert a["lockgate.task.id"] == _attrs(run)["lockgate.task.id"]
        assert (gen_ai.GEN_AI_INPUT_MESSAGES in a) is (capture == "true")
        assert (gen_ai.GEN_AI_OUTPUT_MESSAGES in a) is (capture == "true")
    everything = b"".join(body for _p, body in received)
    assert SECRET_KEY.encode() not in everything
    assert SECRET_HEADER.encode() not in everything


def test_a_sampler_from_the_environment_keeps_whole_tasks_or_none(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0")
    exporter = InMemorySpanExporter()
    _written(store, _observer(store, exporter, capture=False))
    assert exporter.get_finished_spans() == ()


# -- spans built in bulk on the exporter thread -----------------------------------------


def _calls(n: int, *, sent: bool = False) -> list[CallSpan]:
    """Attempts of every shape: a success, a retry without a call, a dead task's failed
    call answered by a fallback. ``sent``: the calls say when their request was sent (a
    few seconds into the attempt, after a wait for the rate limit)."""
    out = []
    for i in range(n):
        row: dict[str, Any] = {"attempt": i % 3 + 1, "started_at": 1_700_000_000_000 + i,
                               "endpoint": "sim", "model": "m"}
        if i % 3 == 0:
            row.update(latency_ms=12.5, prompt_sha256="h", input_tokens=40 + i,
                       output_tokens=0, request_id=f"req-{i}", parse_status="valid",
                       completeness=1.0, raw_output='{"label": "é"}',
                       prompt_snapshot='[{"role":"user","content":"Say ü"}]')
            out.append(CallSpan(f"t{i}", "b", "p@1", row, "m-2024", BODY, "succeeded",
                                row["started_at"] + 6000 + i if sent else None))
        elif i % 3 == 1:
            row.update(error_class="rate_limited")
            out.append(CallSpan(f"t{i}", "b", "p@1", row, None, None, "retry"))
        else:
            row.update(latency_ms=3.0, prompt_sha256="h", error_class="server_error",
                       routed_from="primary", completeness=1)
            out.append(CallSpan(f"t{i}", "b", "inline:0123456789ab", row, None, "{",
                                "dead", row["started_at"] + 40 if sent else None))
    return out


@pytest.mark.parametrize("capture", [False, True], ids=["no-content", "content"])
def test_the_direct_otlp_encoding_is_the_sdks(capture: bool) -> None:
    """The request written from the attempts decodes to what the SDK's encoder makes of
    the same spans as SDK objects: ids, parents, times, kinds, statuses, attributes."""
    resource = Resource.create({"service.name": "labeller", "deployment.environment": "t"})
    tracing = Tracing(InMemorySpanExporter(), capture_content=capture, resource=resource,
                      endpoint={"sim": Endpoint(name="sim", base_url="http://h:81/v1",
                                                api_key_env="K")}.get)
    built = tracing.build(_calls(30) + _calls(30, sent=True))
    assert len(built) == 60
    ours = ExportTraceServiceRequest.FromString(
        _OtlpWriter(lambda _b: True, resource).request(built))
    theirs = encode_spans(tracing.readable(built))
    assert ours == theirs
    spans = [s for rs in ours.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert len(spans) == 100  # 60 runs, 40 calls (the retries made none)
    later = [s for s in spans if s.parent_span_id and s.start_time_unix_nano > min(
        r.start_time_unix_nano for r in spans if r.trace_id == s.trace_id)]
    assert len(later) == 20  # the calls sent after a wait start when they were sent
    tracing.shutdown()


def test_spans_built_in_bulk_keep_each_tasks_tree() -> None:
    exporter = InMemorySpanExporter()
    tracing = Tracing(exporter, batch=BatchSettings(max_export_batch_size=8))
    tracing.emit(_calls(30))
    assert tracing.flush(30)
    spans = exporter.get_finished_spans()
    assert tracing.exported == len(spans) == 50 and tracing.dropped == 0
    runs = {s.context.span_id: s for s in spans if s.parent is None}
    calls = [s for s in spans if s.parent is not None]
    assert len(runs) == 30 and len(calls) == 20
    for c in calls:
        run = runs[c.parent.span_id]
        assert run.context.trace_id == c.context.trace_id
        assert run.attributes["lockgate.task.id"] == c.attributes["lockgate.task.id"]
        assert (c.start_time, c.end_time) == (run.start_time, run.end_time)
    assert len({s.context.trace_id for s in runs.values()}) == 30  # one trace per task
    assert len({s.context.span_id for s in spans}) == 50
    assert {s.name for s in runs.values()} == {"lockgate.task"}  # one name, not one per task
    tracing.shutdown()


class _Stuck(SpanExporter):
    """A collector that does not answer until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Any) -> SpanExportResult:
        self.release.wait(30)
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def test_a_stuck_collector_costs_dropped_spans_counted_and_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    stuck = _Stuck()
    tracing = Tracing(stuck, batch=BatchSettings(max_queue_size=8, max_export_batch_size=2,
                                                 schedule_delay_ms=10))
    calls = _calls(3)[:1] * 40  # 40 attempts, two spans each
    with caplog.at_level(logging.WARNING, logger="lockgate.quality"):
        for i in range(0, 40, 4):
            tracing.emit(calls[i:i + 4])  # returns at once: never waits on the export
    assert tracing.dropped > 0
    assert any("dropped" in r.getMessage() and "OTEL_BSP_MAX_QUEUE_SIZE" in r.getMessage()
               for r in caplog.records)
    stuck.release.set()
    assert tracing.flush(30)
    assert len(stuck.spans) == tracing.exported
    assert tracing.exported + tracing.dropped == 80
    tracing.shutdown()


# -- the exporter process ---------------------------------------------------------------


def _decoded(received: list[tuple[str, bytes]]) -> list[Any]:
    return [s for _p, body in received
            for rs in ExportTraceServiceRequest.FromString(body).resource_spans
            for ss in rs.scope_spans for s in ss.spans]


def _otlp_env(monkeypatch: pytest.MonkeyPatch, url: str, **more: str) -> None:
    """The environment asks for OTLP/HTTP to ``url`` (the exporter reads it there)."""
    monkeypatch.delenv("LOCKGATE_OTEL_EXPORT_PROCESS", raising=False)
    for name, value in {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"{url}/v1/traces",
                        "OTEL_SERVICE_NAME": "labeller", **more}.items():
        monkeypatch.setenv(name, value)


def test_an_exporter_process_posts_the_spans(
        receiver: tuple[str, list[tuple[str, bytes]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    url, received = receiver
    _otlp_env(monkeypatch, url)
    ep = Endpoint(name="sim", base_url="http://h:81/v1", api_key_env="K")
    tracing = Tracing.from_env({"sim": ep}.get)
    assert tracing is not None and tracing._child is not None
    assert tracing._otlp is None  # no exporter of its own while the process posts
    tracing.emit(_calls(30))
    assert tracing.flush(30)
    child = tracing._child._proc
    assert child is not None and child.poll() is None  # a live process of its own
    spans = _decoded(received)
    assert tracing.exported == len(spans) == 50 and tracing.failed == tracing.dropped == 0
    runs = {s.span_id: s for s in spans if not s.parent_span_id}
    calls = [s for s in spans if s.parent_span_id]
    assert len(runs) == 30 and len(calls) == 20
    for c in calls:
        run = runs[c.parent_span_id]
        assert run.trace_id == c.trace_id
        assert _attrs(c)["lockgate.task.id"] == _attrs(run)["lockgate.task.id"]
        assert _attrs(c)["server.address"] == "h"  # resolved here, sent along
    tracing.shutdown()
    assert child.poll() == 0  # it ended with its input


def test_a_dead_exporter_process_hands_the_export_back(
        receiver: tuple[str, list[tuple[str, bytes]]],
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    url, received = receiver
    _otlp_env(monkeypatch, url)
    tracing = Tracing.from_env(lambda _n: None)
    assert tracing is not None and tracing._child is not None
    tracing.emit(_calls(4))
    assert tracing.flush(30)
    child = tracing._child._proc
    assert child is not None
    child.kill()
    child.wait()
    with caplog.at_level(logging.WARNING, logger="lockgate.quality"):
        tracing.emit(_calls(30))
        assert tracing.flush(30)
    assert tracing._child is None and tracing._otlp is not None  # its own, built now
    assert "exporter process is unusable" in caplog.text
    assert tracing.exported == len(_decoded(received)) == 7 + 50
    tracing.shutdown()


def test_the_export_stays_in_the_worker_when_asked(
        receiver: tuple[str, list[tuple[str, bytes]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    url, received = receiver
    _otlp_env(monkeypatch, url, LOCKGATE_OTEL_EXPORT_PROCESS="0")
    tracing = Tracing.from_env(lambda _n: None)
    assert tracing is not None and tracing._child is None
    tracing.emit(_calls(30))
    assert tracing.flush(30)
    assert tracing.exported == len(_decoded(received)) == 50
    tracing.shutdown()


def test_a_forked_worker_starts_its_own_exporter_process(
        receiver: tuple[str, list[tuple[str, bytes]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker processes forked after the tracing was set up each talk to an exporter
    process of their own, never into their parent's pipes."""
    url, received = receiver
    _otlp_env(monkeypatch, url)
    tracing = Tracing.from_env(lambda _n: None)
    assert tracing is not None and tracing._child is not None
    parents = tracing._child._proc
    assert parents is not None
    pid = os.fork()
    if pid == 0:  # the forked copy: exports 30 attempts through a process of its own
        code = 1
        try:
            tracing.emit(_calls(30))
            ok = tracing.flush(30)
            own = tracing._child._proc if tracing._child else None
            code = 0 if ok and own is not None and own.pid != parents.pid \
                and tracing.exported == 50 else 2
            tracing.shutdown()
        finally:
            os._exit(code)
    _pid, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    tracing.emit(_calls(4))
    assert tracing.flush(30)
    assert tracing.exported == 7 and tracing._child._proc is parents
    assert len(_decoded(received)) == 50 + 7
    tracing.shutdown()
    assert parents.poll() == 0


def test_the_exporter_process_outlives_a_stop_signal_until_its_input_ends(
        receiver: tuple[str, list[tuple[str, bytes]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C or a SIGTERM to the worker's whole group leaves the exporter process to
    export what the stopping worker still hands over."""
    url, received = receiver
    _otlp_env(monkeypatch, url)
    tracing = Tracing.from_env(lambda _n: None)
    assert tracing is not None and tracing._child is not None
    tracing.emit(_calls(4))
    assert tracing.flush(30)  # it runs, and has set up its signal handling
    child = tracing._child._proc
    assert child is not None and os.getsid(child.pid) == child.pid  # its own session
    for sig in (signal.SIGINT, signal.SIGTERM):
        os.kill(child.pid, sig)
    tracing.emit(_calls(30))
    assert tracing.flush(30)
    assert tracing._child is not None and child.poll() is None
    assert tracing.exported == len(_decoded(received)) == 7 + 50
    tracing.shutdown()
    assert child.poll() == 0


# -- what the spans say ------------------------------------------------------------------


def _spans_of(calls: list[CallSpan], **kw: Any) -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    tracing = Tracing(SimpleSpanProcessor(exporter), **kw)
    tracing.emit(calls)
    assert tracing.flush(30)
    tracing.shutdown()
    return list(exporter.get_finished_spans())


def _attempt(**row: Any) -> dict[str, Any]:
    return {"attempt": 1, "started_at": 1_700_000_000_000, "latency_ms": 250.0,
            "endpoint": "sim", "model": "m", "prompt_sha256": "h", **row}


def test_a_call_that_waited_for_its_rate_limit_starts_when_it_was_sent() -> None:
    """The run span covers the attempt from its start, the wait for the endpoint's rate
    limit included, to the call's end; the call span only the call itself."""
    started = 1_700_000_000_000
    run, call = _spans_of([CallSpan("t0", "b", "p@1", _attempt(started_at=started),
                                    "m", None, "succeeded", started + 6000)])
    assert call.parent is not None and call.parent.span_id == run.context.span_id
    assert (run.start_time, run.end_time) == (started * 1_000_000,
                                              (started + 6250) * 1_000_000)
    assert (call.start_time, call.end_time) == ((started + 6000) * 1_000_000,
                                                (started + 6250) * 1_000_000)


def test_run_attempt_stamps_the_moment_its_request_is_sent() -> None:
    """``run_attempt`` is entered once flow control has admitted the call; the stamp is
    taken on the clock it is given, after rendering, as the request goes out."""
    ticks = iter(range(100, 200))
    seen: list[int] = []

    class Clocked:
        name = "clocked"

        async def complete(self, request: CompletionRequest) -> Completion:
            seen.append(next(ticks))  # the provider is called after the stamp
            return Completion('{"label": "yes"}', 200, "m")

    class Refusing(Clocked):
        async def complete(self, request: CompletionRequest) -> Completion:
            raise ProviderError(ErrorClass.SERVER_ERROR, "boom", http_status=500)

    config = load_config(parse_task({
        "task_id": "t", "prompt_template": "Say {x}", "input_data": {"x": 1},
        "model_config": {"name": "m"}, "delivery_rule": {}, "retry_policy": {}}
    ).config_document())
    ep = Endpoint(name="e", base_url="http://h/v1")

    def now() -> int:
        return next(ticks)

    res = asyncio.run(run_attempt(config, {"x": 1}, ep, Clocked(), idempotency_key=None,
                                  params={}, now_ms=now))
    assert res.ok and res.sent_at == 100 and seen == [101]
    failed = asyncio.run(run_attempt(config, {"x": 1}, ep, Refusing(), idempotency_key=None,
                                     params={}, now_ms=now))
    assert not failed.ok and failed.sent_at == 102  # sent, refused: still when it went
    unsent = asyncio.run(run_attempt(config, {}, ep, Clocked(), idempotency_key=None,
                                     params={}, now_ms=now))
    assert unsent.error_class is ErrorClass.RENDER_ERROR and unsent.sent_at is None
    plain = asyncio.run(run_attempt(config, {"x": 1}, ep, Clocked(), idempotency_key=None,
                                    params={}))
    assert plain.ok and plain.sent_at is None  # no clock given: not known


FAILED_BODY = '{"error": {"message": "overloaded", "type": "server_error"}, "id": "e-1"}'


def _answer_and_failure() -> list[CallSpan]:
    ok = _attempt(request_id="req-1", raw_output='{"label": "yes"}', input_tokens=3,
                  output_tokens=2)
    failed = _attempt(request_id="req-2", error_class="server_error")
    # the write-back names the requested model when no completion came back
    return [CallSpan("t0", "b", "p@1", ok, "m-2024", BODY, "succeeded"),
            CallSpan("t1", "b", "p@1", failed, "m", FAILED_BODY, "dead")]


def _check_response_attributes(answered: dict[str, Any], failed: dict[str, Any]) -> None:
    assert answered[gen_ai.GEN_AI_RESPONSE_ID] == "r1"  # the completion's own id
    assert answered["lockgate.request_id"] == "req-1"  # the x-request-id header
    assert answered[gen_ai.GEN_AI_RESPONSE_MODEL] == "m-2024"
    assert gen_ai.GEN_AI_RESPONSE_MODEL not in failed  # nothing answered
    assert gen_ai.GEN_AI_RESPONSE_ID not in failed
    assert failed["lockgate.request_id"] == "req-2" and failed["error.type"] == "server_error"


def test_the_response_id_and_model_are_the_completions() -> None:
    spans = _spans_of(_answer_and_failure())
    answered, failed = (dict(s.attributes or {}) for s in spans if s.kind is SpanKind.CLIENT)
    _check_response_attributes(answered, failed)


def test_the_exporter_process_knows_which_calls_were_answered(
        receiver: tuple[str, list[tuple[str, bytes]]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without content capture the answers' texts stay in the worker: the exporter
    process is still told which calls came back with a completion."""
    url, received = receiver
    _otlp_env(monkeypatch, url)
    tracing = Tracing.from_env(lambda _n: None)
    assert tracing is not None and tracing._child is not None
    tracing.emit(_answer_and_failure())
    assert tracing.flush(30)
    tracing.shutdown()
    calls = {_attrs(s)["lockgate.task.id"]: _attrs(s) for s in _decoded(received)
             if s.parent_span_id}
    _check_response_attributes(calls["t0"], calls["t1"])


@pytest.mark.parametrize(("url", "port"), [
    ("https://api.openai.com/v1", 443), ("http://10.0.0.5/v1", 80),
    ("http://[::1]:8000/v1", 8000)])
def test_server_port_is_the_schemes_when_the_url_names_none(url: str, port: int) -> None:
    ep = Endpoint(name="sim", base_url=url, api_key_env="K")
    [call] = [s for s in _spans_of([CallSpan("t0", "b", "p@1", _attempt(), "m", None,
                                             "succeeded")], endpoint={"sim": ep}.get)
              if s.kind is SpanKind.CLIENT]
    assert (call.attributes or {})["server.port"] == port


def test_the_service_is_named_by_the_environment_else_lockgate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def service() -> str:
        tracing = Tracing(InMemorySpanExporter())
        tracing.shutdown()
        return str(tracing.resource.attributes["service.name"])

    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    assert service() == "lockgate"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES",
                       "service.name=billing,deployment.environment.name=prod")
    assert service() == "billing"
    tracing = Tracing(InMemorySpanExporter())
    assert tracing.resource.attributes["deployment.environment.name"] == "prod"
    tracing.shutdown()
    monkeypatch.setenv("OTEL_SERVICE_NAME", "labeller")  # it wins, as the spec says
    assert service() == "labeller"


def test_the_same_task_id_in_another_row_is_another_trace() -> None:
    """A task's attempts share its trace; the same task id in another task row (another
    database, or submitted again after a cleanup) does not."""
    def call(pk: int, attempt: int) -> CallSpan:
        return CallSpan("order-1", "b", "p@1", _attempt(task_pk=pk, attempt=attempt),
                        "m", None, "retry")

    spans = _spans_of([call(1, 1), call(1, 2), call(7, 1)])
    traces = [s.context.trace_id for s in spans if s.parent is None]
    assert traces[0] == traces[1] != traces[2]


def test_captured_messages_hold_in_their_cap_as_valid_json() -> None:
    """Each message attribute is at most 16 KiB of JSON (UTF-8 bytes): the longest texts
    are cut and say so; the answer carries its finish reason."""
    cjk = "退款" * 10_000  # 20,000 characters, 60,000 bytes
    snapshot = orjson.dumps([{"role": "system", "content": "Note. " * 3600},
                             {"role": "user", "content": cjk}]).decode()
    many = orjson.dumps([{"role": "user", "content": f"m{i}"} for i in range(3000)]).decode()
    small = '[{"role":"user","content":"Say 1"}]'
    calls = [CallSpan(f"t{i}", "b", "p@1", _attempt(prompt_snapshot=snap,
                                                     raw_output=out), "m", BODY,
                      "succeeded")
             for i, (snap, out) in enumerate([(snapshot, cjk + "\n" + "x" * 40_000),
                                              (many, "ok"), (small, "ok")])]
    spans = [s for s in _spans_of(calls, capture_content=True) if s.kind is SpanKind.CLIENT]
    big, crowded, whole = (dict(s.attributes or {}) for s in spans)
    for attrs in (big, crowded, whole):
        for key in (gen_ai.GEN_AI_INPUT_MESSAGES, gen_ai.GEN_AI_OUTPUT_MESSAGES):
            assert len(str(attrs[key]).encode()) <= MAX_CONTENT == 16_384
            orjson.loads(str(attrs[key]))  # valid JSON
    system, user = orjson.loads(str(big[gen_ai.GEN_AI_INPUT_MESSAGES]))
    assert system["role"] == "system" and user["role"] == "user"
    text = user["parts"][0]["content"]
    assert text.startswith("退款退款") and text.endswith("more characters not kept]")
    [answer] = orjson.loads(str(big[gen_ai.GEN_AI_OUTPUT_MESSAGES]))
    assert answer["finish_reason"] == "stop"
    assert answer["parts"][0]["content"].endswith("more characters not kept]")
    kept = orjson.loads(str(crowded[gen_ai.GEN_AI_INPUT_MESSAGES]))
    assert kept[-1]["parts"][-1]["content"] == "m2999"  # the newest messages stay
    assert "earlier message(s) not kept" in kept[0]["parts"][0]["content"]
    assert orjson.loads(str(whole[gen_ai.GEN_AI_INPUT_MESSAGES])) == [
        {"role": "user", "parts": [{"type": "text", "content": "Say 1"}]}]


# -- the environment, checked ------------------------------------------------------------

TOKEN = "otlp-token-8d2f"


class _HeaderReceiver(_Receiver):
    headers_seen: list[dict[str, str]]

    def do_POST(self) -> None:
        self.headers_seen.append({k.lower(): v for k, v in self.headers.items()})
        super().do_POST()


def test_a_malformed_otlp_header_is_named_and_its_value_never_shown(
        simulator: SimulatorProcess, tmp_path: Path) -> None:
    received: list[tuple[str, bytes]] = []
    seen: list[dict[str, str]] = []
    handler = type("Handler", (_HeaderReceiver,), {"received": received,
                                                    "headers_seen": seen})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        config = tmp_path / "lockgate.toml"
        config.write_text(f'default_endpoint = "sim"\n[[endpoint]]\nname = "sim"\n'
                          f'base_url = "{simulator.url}"\napi_key_env = "SIM_API_KEY"\n')
        path = write_jsonl(tmp_path / "t.jsonl", tasks(3))
        env = clean_env(SIM_API_KEY=SECRET_KEY, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=(
            f"http://127.0.0.1:{server.server_address[1]}/v1/traces"),
            OTEL_EXPORTER_OTLP_HEADERS=f"Authorization: Bearer {TOKEN}, x-tenant=acme")
        done = subprocess.run(lockgate_cmd("run", str(path), "--db",
                                           f"sqlite:///{tmp_path / 'db.sqlite'}",
                                           "--config", str(config)),
                              env=env, capture_output=True, timeout=120, check=False)
    finally:
        server.shutdown()
        server.server_close()
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert TOKEN not in err and TOKEN not in done.stdout.decode()
    assert "OTEL_EXPORTER_OTLP_HEADERS: 'Authorization' is not name=value" in err
    assert received and seen  # the spans still go, with the well-formed header
    assert all(h.get("x-tenant") == "acme" and "authorization" not in h for h in seen)


def test_the_sdks_own_header_warning_is_redacted_in_the_worker(
        receiver: tuple[str, list[tuple[str, bytes]]], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    """An exporter built in the worker reads the headers variable itself (the SDK's
    parser warns about a malformed entry): the entry is named there too, never shown."""
    url, received = receiver
    _otlp_env(monkeypatch, url, LOCKGATE_OTEL_EXPORT_PROCESS="0",
              OTEL_EXPORTER_OTLP_HEADERS=f"Authorization:Bearer {TOKEN}")
    with caplog.at_level(logging.WARNING):
        tracing = Tracing.from_env(lambda _n: None)
        assert tracing is not None
        tracing.emit(_calls(3))
        assert tracing.flush(30)
        tracing.shutdown()
    assert tracing.exported == 5 and len(_decoded(received)) == 5
    out = caplog.text + "".join(capfd.readouterr())
    assert TOKEN not in out
    assert "'Authorization' is not name=value" in caplog.text


def test_an_unsupported_protocol_or_exporter_is_named_once_at_start(
        receiver: tuple[str, list[tuple[str, bytes]]], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    url, received = receiver
    _otlp_env(monkeypatch, url, OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
              OTEL_TRACES_EXPORTER="zipkin")
    with caplog.at_level(logging.WARNING, logger="lockgate.quality"):
        tracing = Tracing.from_env(lambda _n: None)
        assert tracing is not None and tracing._child is not None
        tracing.emit(_calls(3))
        assert tracing.flush(30)
        tracing.shutdown()
    warned = [r.getMessage() for r in caplog.records]
    [protocol] = [m for m in warned if "OTEL_EXPORTER_OTLP_PROTOCOL=grpc" in m]
    assert "http/protobuf" in protocol
    [exporter] = [m for m in warned if "OTEL_TRACES_EXPORTER=zipkin" in m]
    assert "otlp, console, none" in exporter
    assert len(_decoded(received)) == 5  # what it does: OTLP/HTTP protobuf
    # The exporter process, started on the same environment, does not repeat them (its
    # stderr is the worker's). Run on its own: this process's stderr may carry the
    # warnings above through handlers other tests installed.
    child = subprocess.run([sys.executable, "-m", "lockgate.quality.otel_child"],
                           env=dict(os.environ), input=b"", capture_output=True,
                           timeout=60, check=False)
    assert child.returncode == 0, child.stderr.decode()
    said = child.stderr.decode()
    assert "grpc" not in said and "zipkin" not in said, said


# -- no exporter, a hung collector, a worker gone ----------------------------------------


def test_traces_go_off_once_when_no_exporter_can_be_built(
        receiver: tuple[str, list[tuple[str, bytes]]], monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """The exporter process cannot build its exporter, nor can the worker: said once,
    the later attempts are not queued, and the total not exported is logged at exit."""
    url, received = receiver
    _otlp_env(monkeypatch, url,
              OTEL_PYTHON_EXPORTER_OTLP_HTTP_TRACES_CREDENTIAL_PROVIDER="no-such-provider")
    with caplog.at_level(logging.WARNING, logger="lockgate.quality"):
        tracing = Tracing.from_env(lambda _n: None)
        assert tracing is not None
        tracing.emit(_calls(4))
        assert tracing.flush(30)
        assert tracing.off is not None and "no-such-provider" in tracing.off
        for _ in range(3):
            tracing.emit(_calls(10))
            assert not tracing._queue  # nothing queued for nobody
        assert tracing.flush(30)
        tracing.shutdown()
    off = [r for r in caplog.records if "traces are off" in r.getMessage()]
    assert len(off) == 1 and off[0].levelno == logging.ERROR
    assert tracing.lost == 2 * (4 + 30) and tracing.exported == 0 and not received
    assert "68 span(s) not exported in all: traces were off" in caplog.text


class _Silent:
    """A collector that accepts connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _addr = self.sock.accept()
            except OSError:
                return
            self.connections.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self.connections:
            c.close()


def test_a_hung_collector_is_given_up_at_the_shutdowns_one_deadline(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The stop waits for one OTEL_BSP_EXPORT_TIMEOUT in all: then the exporter process
    is killed, the export in flight is not taken up again by the worker, and the spans
    not exported are counted and logged."""
    collector = _Silent()
    try:
        _otlp_env(monkeypatch, collector.url, OTEL_BSP_EXPORT_TIMEOUT="1000",
                  OTEL_EXPORTER_OTLP_TIMEOUT="120")
        tracing = Tracing.from_env(lambda _n: None)
        assert tracing is not None and tracing._child is not None
        tracing.emit(_calls(4))
        tracing.flush(0.01)  # the batch goes to the exporter process, which posts it
        wait_for(lambda: collector.connections, "the post to the collector", timeout=60)
        child = tracing._child._proc
        thread = tracing._thread
        assert child is not None and thread is not None
        with caplog.at_level(logging.WARNING, logger="lockgate.quality"):
            stopping = threading.Thread(target=tracing.shutdown)
            stopping.start()
            stopping.join(60)  # a test timeout, far beyond the 1 s asked for
            assert not stopping.is_alive()
            thread.join(30)
        assert not thread.is_alive()
        assert child.poll() is not None  # killed, not left to post for 120 s
        assert len(collector.connections) == 1  # the worker did not post it again
        assert tracing.lost == 8 and tracing.exported == 0
        assert "8 span(s) not exported" in caplog.text
        assert "exporter process is unusable" not in caplog.text
    finally:
        collector.close()


def test_the_exporter_process_ends_quietly_when_the_worker_is_gone(
        receiver: tuple[str, list[tuple[str, bytes]]]) -> None:
    """A worker that dies with a batch in flight leaves the process a closed pipe to
    answer on: it ends without a traceback in the worker's log."""
    url, received = receiver
    env = clean_env(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"{url}/v1/traces")
    proc = subprocess.Popen([sys.executable, "-m", "lockgate.quality.otel_child"], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdout.close()  # the worker is gone: nobody reads the answer
    proc.stdin.write(frame(_calls(3), {}, False))
    proc.stdin.close()
    assert proc.wait(60) is not None and proc.stderr is not None
    err = proc.stderr.read()
    proc.stderr.close()
    assert len(_decoded(received)) == 5  # it posted the batch
    assert b"Traceback" not in err and b"BrokenPipe" not in err, err.decode()


def test_a_workers_call_span_starts_when_its_request_was_sent(
        simulator: SimulatorProcess, receiver: tuple[str, list[tuple[str, bytes]]],
        tmp_path: Path) -> None:
    """Calls that waited for their endpoint's rate limit: each call span starts when
    its request went out, inside its run span, which starts with the attempt (the
    wait included); both end with the call."""
    url, received = receiver
    n = 6
    config = tmp_path / "lockgate.toml"
    config.write_text(f'default_endpoint = "sim"\n[[endpoint]]\nname = "sim"\n'
                      f'base_url = "{simulator.url}"\nrpm = 2\nlimit_window_s = 1\n')
    path = write_jsonl(tmp_path / "t.jsonl", tasks(n))
    env = clean_env(OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=f"{url}/v1/traces")
    done = subprocess.run(lockgate_cmd("run", str(path), "--db",
                                       f"sqlite:///{tmp_path / 'db.sqlite'}",
                                       "--config", str(config)),
                          env=env, capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode()
    spans = [s for _p, body in received
             for rs in ExportTraceServiceRequest.FromString(body).resource_spans
             for ss in rs.scope_spans for s in ss.spans]
    runs = {s.span_id: s for s in spans if s.name == "lockgate.task"}
    calls = [s for s in spans if s.name == "chat sim-small"]
    assert len(calls) == n
    waited = 0
    for c in calls:
        run = runs[c.parent_span_id]
        assert run.start_time_unix_nano <= c.start_time_unix_nano <= c.end_time_unix_nano
        assert c.end_time_unix_nano == run.end_time_unix_nano
        waited += c.start_time_unix_nano - run.start_time_unix_nano > 500_000_000
    assert waited >= n // 2, "most calls waited their turn, outside their call span"
