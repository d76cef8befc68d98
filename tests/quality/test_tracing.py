"""OpenTelemetry GenAI spans: the span tree and attributes of written attempts (in-memory
exporter), and a real worker exporting over OTLP/HTTP to a receiver started here,
decoded with the official protobuf package: content only when enabled, no secret ever."""

from __future__ import annotations

import gzip
import logging
import os
import signal
import subprocess
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
from helpers import clean_env
from lockgate.config import Endpoint
from lockgate.quality.tracing import BatchSettings, CallSpan, Tracing, _OtlpWriter, enabled
from lockgate.quality.writer import QualityObserver, RollupWriter
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.states import TaskStatus
from lockgate.store import Finish, Store

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
    runs = [s for s in spans if s.name == "lockgate.task t0"]
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
        gen_ai.GEN_AI_OPERATION_NAME: "chat", gen_ai.GEN_AI_PROVIDER_NAME: "sim",
        gen_ai.GEN_AI_REQUEST_MODEL: "m", gen_ai.GEN_AI_RESPONSE_MODEL: "m-2024",
        gen_ai.GEN_AI_USAGE_INPUT_TOKENS: 12, gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS: 5,
        gen_ai.GEN_AI_RESPONSE_FINISH_REASONS: ("stop",), gen_ai.GEN_AI_RESPONSE_ID: "req-9",
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
                                              "content": '{"label": "yes"}'}]}]).decode()
    assert second == expected
    run_attrs = dict(runs[1].attributes or {})
    assert run_attrs["lockgate.batch.id"] == "b" and run_attrs["lockgate.attempt"] == 2
    assert run_attrs["lockgate.outcome"] == "succeeded"
    text = repr([dict(s.attributes or {}) for s in spans])
    assert "user:pw" not in text and "pw@" not in text  # the URL's credentials


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
    runs = {s.span_id: s for s in spans if s.name.startswith("lockgate.task ")}
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


def _calls(n: int) -> list[CallSpan]:
    """Attempts of every shape: a success, a retry without a call, a dead task's failed
    call answered by a fallback."""
    out = []
    for i in range(n):
        row: dict[str, Any] = {"attempt": i % 3 + 1, "started_at": 1_700_000_000_000 + i,
                               "endpoint": "sim", "model": "m"}
        if i % 3 == 0:
            row.update(latency_ms=12.5, prompt_sha256="h", input_tokens=40 + i,
                       output_tokens=0, request_id=f"req-{i}", parse_status="valid",
                       completeness=1.0, raw_output='{"label": "é"}',
                       prompt_snapshot='[{"role":"user","content":"Say ü"}]')
            out.append(CallSpan(f"t{i}", "b", "p@1", row, "m-2024", BODY, "succeeded"))
        elif i % 3 == 1:
            row.update(error_class="rate_limited")
            out.append(CallSpan(f"t{i}", "b", "p@1", row, None, None, "retry"))
        else:
            row.update(latency_ms=3.0, prompt_sha256="h", error_class="server_error",
                       routed_from="primary", completeness=1)
            out.append(CallSpan(f"t{i}", "b", "inline:0123456789ab", row, None, "{",
                                "dead"))
    return out


@pytest.mark.parametrize("capture", [False, True], ids=["no-content", "content"])
def test_the_direct_otlp_encoding_is_the_sdks(capture: bool) -> None:
    """The request written from the attempts decodes to what the SDK's encoder makes of
    the same spans as SDK objects: ids, parents, times, kinds, statuses, attributes."""
    resource = Resource.create({"service.name": "labeller", "deployment.environment": "t"})
    tracing = Tracing(InMemorySpanExporter(), capture_content=capture, resource=resource,
                      endpoint={"sim": Endpoint(name="sim", base_url="http://h:81/v1",
                                                api_key_env="K")}.get)
    built = tracing.build(_calls(30))
    assert len(built) == 30
    ours = ExportTraceServiceRequest.FromString(
        _OtlpWriter(lambda _b: True, resource).request(built))
    theirs = encode_spans(tracing.readable(built))
    assert ours == theirs
    spans = [s for rs in ours.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert len(spans) == 50  # 30 runs, 20 calls (the retries made none)
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
