"""CPU per traced attempt of the span pipeline, in process (no database, no network):
lockgate's (the exporter thread builds the attempts' spans and writes the OTLP request
directly) against the OpenTelemetry SDK's (spans started and ended through a tracer,
then the SDK's OTLP encoder), on the same attempts. Median of --repeat timings of
--attempts attempts, in µs per attempt (a run span and a call span each).

    python bench/tracing_encode.py --attempts 2560 --repeat 9
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import orjson
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, set_span_in_context

from lockgate.quality.tracing import (
    _ROOT,
    BatchSettings,
    CallSpan,
    Tracing,
    _OtlpWriter,
    _sdk_attributes,
)

BODY = orjson.dumps({"id": "r1", "model": "sim-small", "choices": [
    {"index": 0, "finish_reason": "stop",
     "message": {"role": "assistant", "content": '{"label": "yes"}'}}]}).decode()


def _calls(n: int) -> list[CallSpan]:
    """Attempts as the 0 ms benchmark writes them: one successful call per task."""
    return [CallSpan(f"q-{i:08d}", "batch-1", "inline:0123456789ab", {
        "attempt": 1, "started_at": 1_700_000_000_000 + i, "latency_ms": 1.5,
        "endpoint": "default", "model": "sim-small", "prompt_sha256": "h",
        "input_tokens": 60 + i % 7, "output_tokens": 7, "request_id": f"chatcmpl-{i}",
        "parse_status": "valid", "completeness": 1.0, "outcome": "succeeded"},
        "sim-small", BODY, "succeeded") for i in range(n)]


class _Keep(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Any) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def _median_us(fn: Callable[[], Any], n: int, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times) * 1e6 / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attempts", type=int, default=2560)
    ap.add_argument("--repeat", type=int, default=9)
    args = ap.parse_args()
    n = args.attempts
    calls = _calls(n)
    resource = Resource.create({"service.name": "lockgate"})
    tracing = Tracing(_Keep(), resource=resource, batch=BatchSettings())
    writer = _OtlpWriter(lambda _b: True, resource)
    size = tracing.batch.max_export_batch_size // 2

    def ours() -> None:
        for k in range(0, n, size):
            writer.request(tracing.build(calls[k:k + size]))

    built = tracing.build(calls)
    sdk_keep = _Keep()
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(sdk_keep))
    tracer = provider.get_tracer("lockgate")

    def sdk_spans() -> None:  # what the worker's loop did per attempt before
        sdk_keep.spans.clear()
        for (_t, _r, _c, start, end, sent, name, run_attrs, _e, call_name, call_attrs,
             _ce) in built:
            run = tracer.start_span(name, context=_ROOT, kind=SpanKind.INTERNAL,
                                    start_time=start)
            run.set_attributes(_sdk_attributes(run_attrs))
            call = tracer.start_span(call_name, context=set_span_in_context(run),
                                     kind=SpanKind.CLIENT, start_time=sent,
                                     attributes=_sdk_attributes(call_attrs))
            call.end(end_time=end)
            run.end(end_time=end)

    sdk_spans()
    spans = list(sdk_keep.spans)

    def sdk_encode() -> None:
        for k in range(0, len(spans), 2 * size):
            encode_spans(spans[k:k + 2 * size]).SerializePartialToString()

    figures = {name: _median_us(fn, n, args.repeat) for name, fn in (
        ("lockgate: build + write the OTLP request", ours),
        ("SDK: spans through a tracer", sdk_spans),
        ("SDK: OTLP encoder", sdk_encode))}
    for name, us in figures.items():
        print(f"{name}: {us:.1f} µs per attempt")
    sdk = figures["SDK: spans through a tracer"] + figures["SDK: OTLP encoder"]
    print(f"SDK total {sdk:.1f} µs; lockgate / SDK = "
          f"{figures['lockgate: build + write the OTLP request'] / sdk:.3f} "
          f"(load {os.getloadavg()[0]:.1f})")
    tracing.shutdown()


if __name__ == "__main__":
    main()
