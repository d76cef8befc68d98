"""OpenTelemetry traces of every call, with the GenAI semantic conventions.

Off unless the standard environment asks for it: ``OTEL_TRACES_EXPORTER`` (``otlp`` or
``console``) or an OTLP endpoint (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), and not ``OTEL_SDK_DISABLED=true``. The
exporter speaks OTLP/HTTP (protobuf) and reads its own ``OTEL_EXPORTER_OTLP_*``
settings: another exporter or protocol asked for is named in a warning at start, and a
malformed entry of ``OTEL_EXPORTER_OTLP_HEADERS`` is named (never its value: it is
usually a credential) and left out. ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` name the service (``lockgate`` when neither does);
``OTEL_TRACES_SAMPLER=traceidratio`` with ``OTEL_TRACES_SAMPLER_ARG`` keeps a share of
the tasks (decided per task: its trace id is derived from the task's row).

Spans are made when a write-back has committed, from the attempt rows it wrote, with the
attempt's own times (database clock): a span ``lockgate.task`` per run of a task (one
claim: render, call, parse; from the attempt's start to the end of its call, a wait for
the endpoint's rate limit included), and under it the call, ``chat {model}``, of kind
CLIENT with the ``gen_ai.*`` attributes, from the moment the request was sent (when the
worker says when that was: :attr:`CallSpan.sent_at`) to its answer. Every run of a task
is in the task's own trace (its id is derived from the task id, its batch and its row's
primary key), so retries on other workers line up in one trace, and the same task id
in another database, or submitted again after a cleanup, is another trace. Prompt and
answer texts are added only when ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``
is true (at most :data:`MAX_CONTENT` bytes each); no API key or header is ever an
attribute, and ``server.address`` is the endpoint's host alone.

Cost. The worker's event loop only appends the written attempts to a bounded queue
(``OTEL_BSP_MAX_QUEUE_SIZE`` spans, two per attempt); one exporter thread per
:class:`Tracing` takes them in batches (``OTEL_BSP_MAX_EXPORT_BATCH_SIZE`` spans, at the
latest every ``OTEL_BSP_SCHEDULE_DELAY`` ms), samples, assigns the span ids and builds
the batch in one go: for the OTLP/HTTP exporter the protobuf request is written directly
from the attempts (no SDK span object, no per-span attribute validation or copy; the
resource and instrumentation scope are encoded once), for any other exporter or span
processor (the console, an in-memory exporter) the SDK's :class:`ReadableSpan` objects
are built. A full queue drops the attempt's spans (counted in :attr:`Tracing.dropped`
and logged), so a slow or absent collector never holds a worker up; at exit the queue is
exported within ``OTEL_BSP_EXPORT_TIMEOUT``, one deadline for the whole shutdown.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import random
import re
import struct
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, ParentBased, Sampler
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

if TYPE_CHECKING:  # the exporter process imports this module: no settings there
    from lockgate.config import Endpoint

log = logging.getLogger("lockgate.quality")

CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
#: ``0`` keeps the OTLP export in the worker's own exporter thread (default: a process).
EXPORT_PROCESS = "LOCKGATE_OTEL_EXPORT_PROCESS"
#: An empty context: the run span is a root whatever span the caller is in.
_ROOT = Context()
#: Largest value of ``gen_ai.input.messages`` or ``gen_ai.output.messages``, in bytes of
#: its JSON (the longest texts are cut to fit, and say so).
MAX_CONTENT = 16_384
#: The name of every run span (the task id is an attribute: a span name stays one of a
#: few, as OpenTelemetry asks of span names).
RUN_SPAN = "lockgate.task"
#: The instrumentation scope of every span.
SCOPE = InstrumentationScope("lockgate")
#: Seconds between two warnings about dropped spans.
_DROP_LOG_EVERY = 10.0
#: Seconds the shutdown waits, after killing an exporter process that outlived its
#: deadline, for the exporter thread to see it gone (the end of its output, at once).
_AFTER_KILL_S = 1.0
#: The values of ``OTEL_TRACES_EXPORTER`` lockgate knows, and the one OTLP protocol.
_EXPORTERS = ("otlp", "console", "none")
_PROTOCOL = "http/protobuf"
#: ``server.port`` of an endpoint URL that names none.
_DEFAULT_PORTS = {"https": 443, "http": 80}
#: An endpoint's ``server.address``, ``server.port`` and ``gen_ai.provider.name``.
Server = tuple[str | None, int | None, str]
_OPENAI = gen_ai.GenAiProviderNameValues.OPENAI.value
#: Hosts (and their subdomains) of the services the GenAI conventions name, with the
#: name; the first that matches wins.
_PROVIDER_HOSTS = tuple((suffix, v.value) for suffix, v in (
    ("openai.azure.com", gen_ai.GenAiProviderNameValues.AZURE_AI_OPENAI),
    ("services.ai.azure.com", gen_ai.GenAiProviderNameValues.AZURE_AI_INFERENCE),
    ("models.ai.azure.com", gen_ai.GenAiProviderNameValues.AZURE_AI_INFERENCE),
    ("inference.ai.azure.com", gen_ai.GenAiProviderNameValues.AZURE_AI_INFERENCE),
    ("api.openai.com", gen_ai.GenAiProviderNameValues.OPENAI),
    ("anthropic.com", gen_ai.GenAiProviderNameValues.ANTHROPIC),
    ("generativelanguage.googleapis.com", gen_ai.GenAiProviderNameValues.GCP_GEMINI),
    ("aiplatform.googleapis.com", gen_ai.GenAiProviderNameValues.GCP_VERTEX_AI),
    ("cohere.com", gen_ai.GenAiProviderNameValues.COHERE),
    ("cohere.ai", gen_ai.GenAiProviderNameValues.COHERE),
    ("ml.cloud.ibm.com", gen_ai.GenAiProviderNameValues.IBM_WATSONX_AI),
    ("perplexity.ai", gen_ai.GenAiProviderNameValues.PERPLEXITY),
    ("x.ai", gen_ai.GenAiProviderNameValues.X_AI),
    ("deepseek.com", gen_ai.GenAiProviderNameValues.DEEPSEEK),
    ("groq.com", gen_ai.GenAiProviderNameValues.GROQ),
    ("mistral.ai", gen_ai.GenAiProviderNameValues.MISTRAL_AI)))
#: The key of an attempt handed to the exporter process saying whether a completion
#: came back (its text, ``raw_output``, goes along only when content is captured).
_ANSWERED = "answered"


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


def _console(env: Mapping[str, str]) -> bool:
    return (env.get("OTEL_TRACES_EXPORTER") or "").strip().lower() == "console"


class _NoSink(SpanExporter):
    """The sink of a tracing whose exporter process posts the spans (never used)."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        pass


def _exporter(env: Mapping[str, str]) -> SpanExporter:
    if _console(env):
        return ConsoleSpanExporter()
    # The SDK's exporter parses OTEL_EXPORTER_OTLP_HEADERS itself (from os.environ) and
    # would print a malformed entry whole: a credential, more often than not.
    _redact_sdk_header_warnings()
    # Imported only when traces are on: the exporter brings an HTTP client and protobuf
    # code that every other use of lockgate would load for nothing.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter()


def _resource() -> Resource:
    """The SDK's resource from the environment: ``OTEL_RESOURCE_ATTRIBUTES`` and
    ``OTEL_SERVICE_NAME`` (which wins, as the specification has it), the service named
    ``lockgate`` when neither names it."""
    if OTELResourceDetector().detect().attributes.get(SERVICE_NAME):
        return Resource.create()
    return Resource.create({SERVICE_NAME: "lockgate"})


# -- the environment, checked -----------------------------------------------------------

#: The variables holding the exporter's headers (the second wins where both are set).
_HEADER_VARS = ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS")
# What the SDK's exporter accepts as one header of those variables (its "liberal" parse,
# opentelemetry.util.re): a token, "=", a value without '"', ',', ';' or '\'.
_HEADER_NAME = r"[\x21\x23-\x27\x2a\x2b\x2d\x2e\x30-\x39\x41-\x5a\x5e-\x7a\x7c\x7e]+"
_HEADER = re.compile(
    rf"{_HEADER_NAME}[ \t]*=[ \t]*[\x20\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*")
#: The name of an entry, malformed or not: before its "=" or ":" (never its value).
_ENTRY_NAME = re.compile(rf"[ \t]*({_HEADER_NAME})[ \t]*[:=]")
_ENTRIES = re.compile(r"[ \t]*,[ \t]*")


def _entry_name(entry: str, n: int | None = None) -> str:
    """How a header entry is named in a message: its name, quoted, never its value (an
    entry without a name before ``=`` or ``:`` is named by its place)."""
    m = _ENTRY_NAME.match(entry)
    if m:
        return repr(m.group(1))
    return "an entry without a name" if n is None else f"entry {n} (no name)"


def _headers(value: str) -> tuple[str, list[str]]:
    """A headers variable's ``value`` without its malformed entries, and their names."""
    kept: list[str] = []
    bad: list[str] = []
    for n, entry in enumerate(_ENTRIES.split(value), 1):
        entry = entry.strip()
        if not entry:
            continue
        if _HEADER.fullmatch(entry):
            kept.append(entry)
        else:
            bad.append(_entry_name(entry, n))
    return ",".join(kept), bad


class _RedactHeaderEntries(logging.Filter):
    """On the logger of the SDK's header parser: its warning about a malformed entry of
    ``OTEL_EXPORTER_OTLP_HEADERS`` prints the entry whole, the value of an
    ``Authorization`` header with it. The entry is replaced by its name."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(f"{_entry_name(a)}=***" if isinstance(a, str) else a
                                for a in record.args)
        return True


def _redact_sdk_header_warnings() -> None:
    sdk = logging.getLogger("opentelemetry.util.re")
    if not any(isinstance(f, _RedactHeaderEntries) for f in sdk.filters):
        sdk.addFilter(_RedactHeaderEntries())


def _checked(env: Mapping[str, str], *, warn: bool) -> dict[str, str]:
    """The environment the exporter is built from: ``env`` without the malformed entries
    of its headers variables. With ``warn``, what lockgate does not do of what ``env``
    asks is logged (once, at start: the exporter process is given the checked copy)."""
    out = dict(env)
    exporters = env.get("OTEL_TRACES_EXPORTER") or ""
    unknown = [v for v in (x.strip().lower() for x in exporters.split(","))
               if v and v not in _EXPORTERS]
    if unknown and warn:
        log.warning("OpenTelemetry: OTEL_TRACES_EXPORTER=%s: lockgate has no %s exporter "
                    "(it has %s); its spans go out over OTLP/HTTP", exporters.strip(),
                    ", ".join(unknown), ", ".join(_EXPORTERS))
    if not _console(env) and warn:
        # the traces' own variable wins over the general one, as for the SDK
        for name in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
            protocol = (env.get(name) or "").strip()
            if protocol:
                if protocol.lower() != _PROTOCOL:
                    log.warning("OpenTelemetry: %s=%s is not supported: lockgate exports "
                                "over OTLP/HTTP with protobuf only (%s), to the "
                                "collector's OTLP/HTTP port (4318 by default, not gRPC's "
                                "4317)", name, protocol, _PROTOCOL)
                break
    for name in _HEADER_VARS:
        value = env.get(name)
        if not value:
            continue
        kept, bad = _headers(value)
        if bad:
            out[name] = kept
            if warn:
                log.warning("OpenTelemetry: %s: %s %s not name=value (values not shown); "
                            "left out", name, ", ".join(bad),
                            "is" if len(bad) == 1 else "are")
    return out


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = (env.get(name) or "").strip()
    try:
        value = int(raw) if raw else default
    except ValueError:
        log.warning("%s=%r is not a whole number; using %d", name, raw, default)
        return default
    return value if value > 0 else default


@dataclass(frozen=True, slots=True)
class BatchSettings:
    """The batch processor's sizes, in spans (``OTEL_BSP_*``, the SDK's defaults)."""

    max_queue_size: int = 2048
    max_export_batch_size: int = 512
    schedule_delay_ms: int = 5000
    export_timeout_ms: int = 30_000

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> BatchSettings:
        env = os.environ if env is None else env
        d = cls()
        queue = _env_int(env, "OTEL_BSP_MAX_QUEUE_SIZE", d.max_queue_size)
        return cls(queue, min(queue, _env_int(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
                                              d.max_export_batch_size)),
                   _env_int(env, "OTEL_BSP_SCHEDULE_DELAY", d.schedule_delay_ms),
                   _env_int(env, "OTEL_BSP_EXPORT_TIMEOUT", d.export_timeout_ms))


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
    #: When the call's request was sent (ms, database clock): after the wait for the
    #: endpoint's rate limit, which the run span covers and the call span does not.
    #: None: not known (the call span starts with the attempt). Not a column of the
    #: attempt row: it travels beside it.
    sent_at: int | None = None


#: A span's attributes: those whose values differ from attempt to attempt (the task id
#: first, the response id, the token counts, the messages), then those whose values
#: repeat (the model, the prompt version, the outcome...), kept once per distinct set of
#: values with their OTLP encoding.
Attrs = tuple[list[tuple[str, Any]], tuple[tuple[str, Any], ...], bytes]
#: One attempt's spans, built: trace id, run span id, call span id (0: no call span),
#: the run's start and end, the call's start (it ends with the run; ns), run name, run
#: attributes, run error (or None), call name, call attributes, call error (or None).
Built = tuple[int, int, int, int, int, int, str, Attrs, str | None, str, Attrs,
              str | None]
_NO_ATTRS: Attrs = ([], (), b"")


class Tracing:
    """Emits the spans of written attempts: the caller's thread queues them, an exporter
    thread builds and exports them in batches.

    ``sink`` is an OTLP/HTTP exporter (its requests are encoded directly), another
    exporter (handed SDK spans a batch at a time) or a span processor (handed each SDK
    span, ended, as a tracer would)."""

    def __init__(self, sink: SpanProcessor | SpanExporter, *,
                 endpoint: Callable[[str], Endpoint | None] = lambda _n: None,
                 capture_content: bool = False,
                 resource: Resource | None = None,
                 sampler: Sampler | None = None,
                 batch: BatchSettings | None = None) -> None:
        self.sink = sink
        self.resource = resource or _resource()
        # The SDK's sampler from the environment (OTEL_TRACES_SAMPLER, ..._ARG).
        self.sampler = sampler or TracerProvider(shutdown_on_exit=False).sampler
        #: Every root span is kept (the default sampler): no decision to ask for.
        self._keep_all = self.sampler.get_description() == _KEEP_ALL
        self.capture_content = capture_content
        self.batch = batch or BatchSettings.from_env()
        self._endpoint = endpoint
        self._servers: dict[str, Server] = {}
        #: Repeating attribute sets of run and call spans, with their encoding.
        self._run_same: dict[Any, tuple[tuple[tuple[str, Any], ...], bytes]] = {}
        self._call_same: dict[Any, tuple[tuple[tuple[str, Any], ...], bytes]] = {}
        # Queued attempts; each counts two spans against the queue size.
        self._queue: deque[CallSpan] = deque()
        self._max_queued = max(1, self.batch.max_queue_size // 2)
        self._batch_size = max(1, self.batch.max_export_batch_size // 2)
        self._cond = threading.Condition()
        self._flushes: list[threading.Event] = []
        self._stopping = False
        #: The shutdown's deadline passed with an export in flight: it is given up, and
        #: the thread exports nothing more (nor falls back to an exporter of its own).
        self._abandoned = False
        #: Attempts of the batch the thread is exporting (their fate not yet counted).
        self._in_flight = 0
        self._thread: threading.Thread | None = None
        self._thread_pid = 0
        self._exporting = False
        self._lock = threading.Lock()  # the thread's start
        #: Spans dropped: the queue was full (a slow or absent collector).
        self.dropped = 0
        #: Spans whose export failed (the exporter logged why).
        self.failed = 0
        #: Spans exported.
        self.exported = 0
        #: Spans never exported otherwise: traces went off (no exporter could be built),
        #: or the shutdown's deadline passed before they were.
        self.lost = 0
        #: Why traces went off for good (None: they are on).
        self.off: str | None = None
        self._dropped_logged = 0
        self._drop_logged_at = 0.0
        self._otlp = _OtlpWriter.for_exporter(sink, self.resource) \
            if isinstance(sink, SpanExporter) else None
        #: The exporter process building and posting the OTLP requests (None: this
        #: process's exporter thread does).
        self._child: ExportProcess | None = None
        #: The environment to build this process's exporter from if that process fails.
        self._fallback_env: dict[str, str] | None = None
        self._random = random.Random()
        atexit.register(self.shutdown)

    @classmethod
    def from_env(cls, endpoint: Callable[[str], Endpoint | None],
                 env: Mapping[str, str] | None = None, *,
                 quiet: bool = False) -> Tracing | None:
        """The tracing the environment configures, or None when it asks for none (or
        its exporter cannot be built: logged). ``quiet`` is for the exporter process:
        the worker has said what it makes of the environment, and an exporter that
        cannot be built raises (the worker then says why)."""
        env = os.environ if env is None else env
        if not enabled(env):
            return None
        checked = _checked(env, warn=not quiet)
        batch = BatchSettings.from_env(env)
        capture = _true(env.get(CAPTURE_CONTENT))
        if _console(env) or (env.get(EXPORT_PROCESS) or "").strip().lower() in (
                "0", "false", "no", "off"):
            try:
                sink = _exporter(checked)
            except Exception as exc:  # the SDK's or a plugin's error: traces only
                if quiet:
                    raise
                log.error("OpenTelemetry: traces are off: the exporter cannot be built "
                          "(%s: %s)", type(exc).__name__, exc)
                return None
            return cls(sink, endpoint=endpoint, capture_content=capture, batch=batch)
        # OTLP through an exporter process: this process builds no exporter of its own
        # (its HTTP client and protobuf code cost the worker's start a few hundred ms of
        # CPU) unless the process fails and the export comes back here.
        tracing = cls(_NoSink(), endpoint=endpoint, capture_content=capture, batch=batch)
        tracing._fallback_env = checked
        tracing._child = ExportProcess(checked, timeout_s=batch.export_timeout_ms / 1000)
        tracing._child.start()  # it loads while the worker starts
        return tracing

    def _export_here(self) -> bool:
        """The exporter process is gone: build this process's own exporter. False when
        it cannot be built: traces are off from now on (logged once)."""
        self._child = None
        env, self._fallback_env = self._fallback_env, None
        if env is not None:
            try:
                sink = _exporter(env)
            except Exception as exc:  # the SDK's or a plugin's error: traces only
                self._go_off(f"the exporter process is gone and this process cannot "
                             f"build an exporter ({type(exc).__name__}: {exc})")
                return False
            self.sink = sink
            self._otlp = _OtlpWriter.for_exporter(sink, self.resource)
        return True

    def _go_off(self, why: str) -> None:
        """No exporter is left: say so once, and queue no more spans (they are counted
        in :attr:`lost`, and the total is logged at exit)."""
        self.off = why
        log.error("OpenTelemetry: traces are off: %s; the spans of later attempts are "
                  "not exported (counted, the total is logged at exit)", why)

    # -- the caller's side (the worker's event loop) ---------------------------------

    def emit(self, calls: Sequence[CallSpan]) -> None:
        """Queue the spans of written attempts (a full queue drops them)."""
        if not calls or self._stopping:
            return
        if self.off is not None:
            self.lost += 2 * len(calls)
            return
        queue = self._queue
        room = self._max_queued - len(queue)
        if room < len(calls):
            self._drop(calls[max(room, 0):])
            calls = calls[:max(room, 0)]
        queue.extend(calls)
        if self._thread is None or self._thread_pid != os.getpid():
            self._start()
        if len(queue) >= self._batch_size and not self._exporting:
            with self._cond:
                self._cond.notify()

    def _drop(self, calls: Sequence[CallSpan]) -> None:
        self.dropped += 2 * len(calls)
        now = time.monotonic()
        if now - self._drop_logged_at >= _DROP_LOG_EVERY:
            self._drop_logged_at = now
            log.warning("OpenTelemetry: %d span(s) dropped so far: the export queue "
                        "(OTEL_BSP_MAX_QUEUE_SIZE=%d spans) is full, the collector is "
                        "slower than the worker or unreachable", self.dropped,
                        self.batch.max_queue_size)
            self._dropped_logged = self.dropped

    def flush(self, timeout_s: float | None = None) -> bool:
        """Export what is queued now; False when ``timeout_s`` (default the export
        timeout) ran out first."""
        if self._thread is None or not self._thread.is_alive():
            if not self._queue:
                return True
            self._start()
        done = threading.Event()
        with self._cond:
            self._flushes.append(done)
            self._cond.notify()
        return done.wait(self.batch.export_timeout_ms / 1000 if timeout_s is None
                         else timeout_s)

    def shutdown(self) -> None:
        """Export what is queued and stop, the whole within the export timeout
        (``OTEL_BSP_EXPORT_TIMEOUT``): once it has passed, the export in flight is
        given up (the exporter process killed) and the spans not exported are counted
        in :attr:`lost` and logged."""
        if self._stopping:
            return
        budget = self.batch.export_timeout_ms / 1000
        deadline = time.monotonic() + budget
        done = self.flush(budget)
        with self._cond:
            self._stopping = True
            self._abandoned = not done
            self._cond.notify()
        child, thread = self._child, self._thread
        if not done and child is not None:
            child.kill()  # the thread waiting for its answer sees the end of its output
        if thread is not None and thread.is_alive():
            thread.join(max(0.0, deadline - time.monotonic()) if done
                        else _AFTER_KILL_S if child is not None else 0.0)
        if child is not None:
            child.close(max(0.0, deadline - time.monotonic()))
        with self._cond:
            left = 2 * (len(self._queue) + self._in_flight)
            self._queue.clear()
            self._in_flight = 0
        self.lost += left
        if not done and left:
            log.warning("OpenTelemetry: the export did not finish within "
                        "OTEL_BSP_EXPORT_TIMEOUT (%d ms): %d span(s) not exported%s",
                        self.batch.export_timeout_ms, left,
                        " (the exporter process was stopped)" if child is not None
                        else "")
        if self.off is not None and self.lost:
            log.warning("OpenTelemetry: %d span(s) not exported in all: traces were off "
                        "(%s)", self.lost, self.off)
        if self.dropped > self._dropped_logged:
            log.warning("OpenTelemetry: %d span(s) dropped in all (export queue full)",
                        self.dropped)
        self.sink.shutdown()
        atexit.unregister(self.shutdown)

    # -- the exporter thread ---------------------------------------------------------

    def _start(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive() \
                    and self._thread_pid == os.getpid():
                return
            self._thread_pid = os.getpid()
            self._random.seed()  # a forked copy must not repeat its parent's span ids
            self._thread = threading.Thread(target=self._run, name="lockgate-otel",
                                            daemon=True)
            self._thread.start()

    def _run(self) -> None:
        delay = self.batch.schedule_delay_ms / 1000
        while True:
            with self._cond:
                if (len(self._queue) < self._batch_size and not self._flushes
                        and not self._stopping):
                    self._cond.wait(delay)
                flushes, self._flushes = self._flushes, []
                stopping = self._stopping
            self._exporting = True
            try:
                self._export_queued()
            except Exception:  # never let the thread die: the next batch may pass
                log.exception("OpenTelemetry: building or exporting spans failed")
                with self._cond:
                    self._in_flight = 0
            finally:
                self._exporting = False
            for done in flushes:
                done.set()
            if stopping:
                return

    def _export_queued(self) -> None:
        queue = self._queue
        size = self._batch_size
        while True:
            with self._cond:
                if self.off is not None:  # nothing can export them
                    self.lost += 2 * len(queue)
                    queue.clear()
                if not queue or self._abandoned:
                    return
                batch = [queue.popleft() for _ in range(min(size, len(queue)))]
                self._in_flight = len(batch)
            if not self._export_batch(batch):
                return  # abandoned: the shutdown counts the batch
            with self._cond:
                self._in_flight = 0

    def _export_batch(self, batch: list[CallSpan]) -> bool:
        """Export one batch and count its spans; False when the shutdown gave it up."""
        if self._child is not None:
            done = self._child.export(batch, self._servers_of(batch), self.capture_content)
            if done is not None:
                self.exported += done[0]
                self.failed += done[1]
                return True
            if self._abandoned:
                return False  # the process was stopped at the deadline: no fallback
            if not self._export_here():  # it failed to start or died: this thread
                self.lost += 2 * len(batch)  # exports, if it can build an exporter
                return True
        built = self.build(batch)
        if built:
            self._export(built)
        return True

    def _servers_of(self, batch: Sequence[CallSpan]) -> dict[str, Server]:
        names = {c.attempt.get("endpoint") or "" for c in batch}
        return {n: self._server(n) for n in names if n}

    def _export(self, built: list[Built]) -> None:
        spans = sum(2 if b[2] else 1 for b in built)
        if self._otlp is not None:
            ok = self._otlp.export(built)
        elif isinstance(self.sink, SpanExporter):
            ok = self.sink.export(self.readable(built)) is SpanExportResult.SUCCESS
        else:
            for span in self.readable(built):
                self.sink.on_end(span)
            ok = True
        if ok:
            self.exported += spans
        else:
            self.failed += spans

    # -- building --------------------------------------------------------------------

    def build(self, calls: Iterable[CallSpan]) -> list[Built]:
        """The ids, times and attributes of the sampled attempts' spans."""
        out: list[Built] = []
        bits = self._random.getrandbits
        sample = None if self._keep_all else self.sampler.should_sample
        lockgate_attrs = self._lockgate
        gen_ai_attrs = self._gen_ai
        for c in calls:
            a = c.attempt
            trace_id = trace_id_of(c)
            if sample is not None and not sample(
                    _ROOT, trace_id, RUN_SPAN, SpanKind.INTERNAL).decision.is_sampled():
                continue  # sampled out (OTEL_TRACES_SAMPLER): the whole task is
            start = int(a.get("started_at") or 0) * 1_000_000
            latency = a.get("latency_ms")
            # The call starts when its request was sent (after any wait for the rate
            # limit), never before the attempt; the run ends with the call.
            sent = start if c.sent_at is None else max(start, int(c.sent_at) * 1_000_000)
            end = sent + int((latency or 0.0) * 1_000_000)
            error = a.get("error_class") or None
            run_error = error if c.outcome in ("failed", "dead") else None
            if a.get("prompt_sha256") is not None and latency is not None:
                call_id = bits(64) or 1
                call_name = f"chat {a.get('model') or ''}".strip()
                call_attrs = gen_ai_attrs(c)
            else:
                call_id, call_name, call_attrs = 0, "", _NO_ATTRS
            out.append((trace_id, bits(64) or 1, call_id, start, end, sent, RUN_SPAN,
                        lockgate_attrs(c), run_error, call_name, call_attrs, error))
        return out

    def readable(self, built: Iterable[Built]) -> list[ReadableSpan]:
        """SDK spans of built attempts (run span, then its call span)."""
        spans: list[ReadableSpan] = []
        flags = TraceFlags(TraceFlags.SAMPLED)
        resource = self.resource
        for (trace_id, run_id, call_id, start, end, sent, name, run_attrs, run_error,
             call_name, call_attrs, error) in built:
            run = SpanContext(trace_id, run_id, is_remote=False, trace_flags=flags)
            spans.append(ReadableSpan(
                name, context=run, parent=None, resource=resource,
                attributes=_sdk_attributes(run_attrs), kind=SpanKind.INTERNAL,
                status=_status(run_error), start_time=start, end_time=end,
                instrumentation_scope=SCOPE))
            if call_id:
                spans.append(ReadableSpan(
                    call_name, context=SpanContext(trace_id, call_id, is_remote=False,
                                                   trace_flags=flags),
                    parent=run, resource=resource, attributes=_sdk_attributes(call_attrs),
                    kind=SpanKind.CLIENT, status=_status(error), start_time=sent,
                    end_time=end, instrumentation_scope=SCOPE))
        return spans

    def _lockgate(self, c: CallSpan) -> Attrs:
        get = c.attempt.get
        key = (c.batch_id, c.prompt, get("attempt"), c.outcome, get("parse_status"),
               get("completeness"), get("error_class"), get("routed_from"))
        same = self._run_same.get(key)
        if same is None:
            pairs: list[tuple[str, Any]] = [
                ("lockgate.batch.id", c.batch_id), ("lockgate.prompt.version", c.prompt),
                ("lockgate.attempt", int(get("attempt") or 0)),
                ("lockgate.outcome", c.outcome)]
            for k, name, kind in _RUN_OPTIONAL:
                value = get(k)
                if value is not None:
                    pairs.append((name, kind(value)))
            same = _cache(self._run_same, key, tuple(pairs))
        return [("lockgate.task.id", c.task_id)], same[0], same[1]

    def _gen_ai(self, c: CallSpan) -> Attrs:
        get = c.attempt.get
        endpoint = get("endpoint") or ""
        response_model, response_id, reasons = _response(c)
        unique: list[tuple[str, Any]] = [("lockgate.task.id", c.task_id)]
        if response_id is not None:
            unique.append((gen_ai.GEN_AI_RESPONSE_ID, response_id))
        if get("request_id") is not None:  # the provider's x-request-id header
            unique.append(("lockgate.request_id", str(get("request_id"))))
        for k, name in _TOKENS:  # they differ from call to call: not in the cached set
            value = get(k)
            if value is not None:
                unique.append((name, int(value)))
        key = (endpoint, get("model"), c.prompt, response_model, get("parse_status"),
               get("completeness"), get("error_class"), *reasons)
        same = self._call_same.get(key)
        if same is None:
            host, port, provider = self._server(endpoint)
            pairs: list[tuple[str, Any]] = [
                (gen_ai.GEN_AI_OPERATION_NAME, "chat"),
                (gen_ai.GEN_AI_PROVIDER_NAME, provider),
                (gen_ai.GEN_AI_REQUEST_MODEL, get("model") or ""),
                ("lockgate.prompt.version", c.prompt)]
            if endpoint:
                pairs.append(("lockgate.endpoint", endpoint))
            if response_model:
                pairs.append((gen_ai.GEN_AI_RESPONSE_MODEL, response_model))
            for k, name, kind in _CALL_OPTIONAL:
                value = get(k)
                if value is not None:
                    pairs.append((name, kind(value)))
            if reasons:
                pairs.append((gen_ai.GEN_AI_RESPONSE_FINISH_REASONS, tuple(reasons)))
            if host:
                pairs.append(("server.address", host))
            if port:
                pairs.append(("server.port", port))
            if get("error_class"):
                pairs.append(("error.type", str(get("error_class"))))
            same = _cache(self._call_same, key, tuple(pairs))
        if self.capture_content:
            unique.extend(_captured(c.attempt, reasons))
        return unique, same[0], same[1]

    def _server(self, endpoint: str) -> Server:
        found = self._servers.get(endpoint)
        if found is None:
            ep = self._endpoint(endpoint) if endpoint else None
            if ep is None:
                found = (None, None, _OPENAI)
            else:
                url = urlsplit(ep.base_url)
                # never the user or password; the scheme's port when the URL names none
                found = (url.hostname, url.port or _DEFAULT_PORTS.get(url.scheme.lower()),
                         ep.provider or provider_of(url.hostname))
            self._servers[endpoint] = found
        return found


def provider_of(host: str | None) -> str:
    """``gen_ai.provider.name`` of an endpoint whose configuration names none: the
    convention's well-known value of the service its host belongs to, else ``openai``,
    the API every endpoint speaks (as OpenAI's own instrumentation names any server)."""
    host = (host or "").lower().rstrip(".")
    if host.startswith("bedrock") and host.endswith(".amazonaws.com"):  # not any of AWS
        return gen_ai.GenAiProviderNameValues.AWS_BEDROCK.value
    for suffix, name in _PROVIDER_HOSTS:
        if host == suffix or host.endswith("." + suffix):
            return name
    return _OPENAI


def trace_id_of(c: CallSpan) -> int:
    """The trace id of an attempt's task: derived from the task id, its batch and its
    row's primary key (``task_pk``, which the store adds to every attempt row it
    writes), so every attempt of the task is in it, and the same task id in another
    database or submitted again after a cleanup (another row) is not. An attempt that
    names no row (built by hand) has the task id and batch alone."""
    pk = c.attempt.get("task_pk")
    key = f"{c.task_id}\x00{c.batch_id}\x00{'' if pk is None else pk}"
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:16], "big") or 1


def _response(c: CallSpan) -> tuple[str | None, str | None, list[str]]:
    """The response's model and id (the ``id`` of its body, the completion's own), and
    its finish reasons. The model and id only when a completion came back: a failed
    call's model is the one asked for, and its body (if any) an error's."""
    body = _body(c.response_body)
    reasons = _finish_reasons(body)
    if not _answered(c.attempt):
        return None, None, reasons
    rid = body.get("id") if body is not None else None
    return c.response_model or None, rid if isinstance(rid, str) and rid else None, reasons


def _captured(attempt: Mapping[str, Any], reasons: Sequence[str]) -> list[tuple[str, Any]]:
    """The prompt's and the answer's texts as the convention's message attributes."""
    out: list[tuple[str, Any]] = []
    if attempt.get("prompt_snapshot"):
        out.append((gen_ai.GEN_AI_INPUT_MESSAGES,
                    _input_messages(attempt["prompt_snapshot"])))
    if attempt.get("raw_output") is not None:
        out.append((gen_ai.GEN_AI_OUTPUT_MESSAGES,
                    _output_messages(attempt["raw_output"], reasons)))
    return out


def _answered(attempt: Mapping[str, Any]) -> bool:
    """Whether a completion came back (a call that failed has no answer's text)."""
    said = attempt.get(_ANSWERED)
    return attempt.get("raw_output") is not None if said is None else bool(said)


# Optional attributes: the attempt row's key, the attribute, the type it is given (one
# type per attribute, so that equal values encode alike).
_RUN_OPTIONAL: tuple[tuple[str, str, Callable[[Any], Any]], ...] = (
    ("parse_status", "lockgate.parse_status", str),
    ("completeness", "lockgate.completeness", float),
    ("error_class", "lockgate.error_class", str),
    ("routed_from", "lockgate.routed_from", str))
_CALL_OPTIONAL: tuple[tuple[str, str, Callable[[Any], Any]], ...] = (
    ("parse_status", "lockgate.parse_status", str),
    ("completeness", "lockgate.completeness", float))
_TOKENS = (("input_tokens", gen_ai.GEN_AI_USAGE_INPUT_TOKENS),
           ("output_tokens", gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS))


def _cache(cache: dict[Any, tuple[tuple[tuple[str, Any], ...], bytes]], key: Any,
           pairs: tuple[tuple[str, Any], ...]) -> tuple[tuple[tuple[str, Any], ...], bytes]:
    """Keep a set of repeating attributes with its encoding, under ``key``."""
    if len(cache) >= _MAX_CACHED:
        cache.clear()
    found = cache[key] = (pairs, b"".join(_attribute(k, v) for k, v in pairs))
    return found

_UNSET = Status(StatusCode.UNSET)
_KEEP_ALL = ParentBased(ALWAYS_ON).get_description()


def _status(error: str | None) -> Status:
    return _UNSET if error is None else Status(StatusCode.ERROR, error)


def _sdk_attributes(attrs: Attrs) -> dict[str, Any]:
    """The attributes as an SDK span holds them."""
    unique, same, _encoded = attrs
    out = dict(unique)
    out.update(same)
    return out


# -- the exporter process -------------------------------------------------------------

#: The attempt row's keys the spans read (the texts only when content is captured).
_SPAN_KEYS = ("attempt", "started_at", "latency_ms", "endpoint", "model", "prompt_sha256",
              "input_tokens", "output_tokens", "parse_status", "completeness",
              "error_class", "routed_from", "request_id", "task_pk")
_CONTENT_KEYS = ("prompt_snapshot", "raw_output")
_FRAME = struct.Struct(">I")
_COUNTS = struct.Struct(">QQ")


def frame(calls: Sequence[CallSpan], servers: Mapping[str, Server],
          capture_content: bool) -> bytes:
    """One batch as the exporter process reads it: its length, then the JSON of the
    endpoints' servers and the attempts (the keys their spans read)."""
    keys = _SPAN_KEYS + _CONTENT_KEYS if capture_content else _SPAN_KEYS
    payload = orjson.dumps([servers, [
        (c.task_id, c.batch_id, c.prompt,
         {**{k: c.attempt.get(k) for k in keys}, _ANSWERED: _answered(c.attempt)},
         c.response_model, c.response_body, c.outcome, c.sent_at) for c in calls]])
    return _FRAME.pack(len(payload)) + payload


class ExportProcess:
    """A child process (``python -m lockgate.quality.otel_child``) that builds, encodes
    and posts the OTLP requests, so that the spans' CPU is not spent under the worker's
    interpreter lock: the exporter thread hands it each batch of attempts (length-prefixed
    JSON on its stdin) and waits for the counts of spans exported and failed (on its
    stdout), as it would wait for the collector. Started at the first batch; a process
    that cannot start or dies hands the export back to the thread (logged)."""

    def __init__(self, env: Mapping[str, str], *, timeout_s: float) -> None:
        self._env = dict(env)
        self._timeout_s = timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._pid = os.getpid()
        self._broken = False
        #: Being closed or killed by the shutdown: an export cut short is not a failure
        #: to report (nor one to fall back from).
        self._closing = False

    def _forked(self) -> None:
        """In a forked copy of the process that started the child: let go of the
        parent's pipes (its child is not ours to talk to) and start afresh."""
        proc, self._proc = self._proc, None
        self._pid = os.getpid()
        self._broken = False
        self._closing = False
        if proc is not None:
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()

    def export(self, calls: Sequence[CallSpan],
               servers: Mapping[str, Server],
               capture_content: bool) -> tuple[int, int] | None:
        """Spans exported and failed for ``calls``; None when the process is unusable
        (the caller exports them itself) or was stopped by the shutdown."""
        if self._pid != os.getpid():
            self._forked()
        if self._broken or self._closing:
            return None
        try:
            data = frame(calls, servers, capture_content)
            proc = self._proc or self._spawn()
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(data)
            proc.stdin.flush()
            reply = proc.stdout.read(_COUNTS.size)
            if len(reply) != _COUNTS.size:
                raise OSError(f"the exporter process ended (exit status {proc.poll()})")
        except (OSError, ValueError, TypeError, orjson.JSONEncodeError) as exc:
            if self._closing:  # killed at the shutdown's deadline: said there
                return None
            log.warning("OpenTelemetry: the exporter process is unusable (%s); this "
                        "process exports its spans itself from now on", exc)
            self._broken = True
            self.close()
            return None
        exported, failed = _COUNTS.unpack(reply)
        return exported, failed

    def start(self) -> None:
        """Start the process now rather than at the first batch."""
        if self._proc is None and not self._broken:
            try:
                self._spawn()
            except OSError as exc:
                log.warning("OpenTelemetry: no exporter process (%s); the worker's "
                            "exporter thread exports its spans", exc)
                self._broken = True

    def _spawn(self) -> subprocess.Popen[bytes]:
        # Its own session: a Ctrl-C at the terminal reaches the worker, which stops
        # gracefully and still has spans to hand over; the process ends at the end of
        # its input (when the worker closes it or dies), never on a signal meant for
        # the worker.
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "lockgate.quality.otel_child"], env=self._env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True,
            start_new_session=True)
        return self._proc

    def kill(self) -> None:
        """Stop the process now, whatever it is doing (the shutdown's deadline passed):
        the thread waiting for its answer gets the end of its output."""
        self._closing = True
        proc = self._proc
        if proc is not None and self._pid == os.getpid():
            with contextlib.suppress(OSError):  # already gone
                proc.kill()

    def close(self, timeout_s: float | None = None) -> None:
        """Let the process finish (end of its input) within ``timeout_s`` (default the
        export timeout), else kill it; and reap it."""
        if self._pid != os.getpid():
            self._forked()
        self._closing = True
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.poll() is None and proc.stdin is not None:
                proc.stdin.close()
            proc.wait(self._timeout_s if timeout_s is None else timeout_s)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):  # a pipe to a process killed mid-write
                    pipe.close()


def serve(tracing: Tracing, read: Callable[[int], bytes], write: Callable[[bytes], Any]
          ) -> None:
    """The exporter process's loop (see :class:`ExportProcess`): ``tracing`` builds and
    exports each batch read, the counts are written back; returns at the end of input."""
    while True:
        head = read(_FRAME.size)
        if len(head) < _FRAME.size:
            return
        servers, rows = orjson.loads(read(_FRAME.unpack(head)[0]))
        tracing._servers.update({k: (v[0], v[1], v[2]) for k, v in servers.items()})
        exported, failed = tracing.exported, tracing.failed
        built = tracing.build([CallSpan(*row) for row in rows])
        if built:
            tracing._export(built)
        write(_COUNTS.pack(tracing.exported - exported, tracing.failed - failed))


# -- OTLP/HTTP requests written directly ---------------------------------------------


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


#: The varints of 0 .. 2**14 - 1 (one byte below 128, two above).
_VARINTS = [bytes((i,)) for i in range(128)] + [
    bytes(((i & 0x7F) | 0x80, i >> 7)) for i in range(128, 1 << 14)]


def _len(n: int) -> bytes:
    return _VARINTS[n] if n < 16384 else _varint(n)


_pack_q = struct.Struct("<Q").pack
_pack_d = struct.Struct("<d").pack
#: Span fields 1, 2, 4 with their lengths (trace id, span id, parent span id).
_TRACE_ID, _SPAN_ID, _PARENT_ID = b"\x0a\x10", b"\x12\x08", b"\x22\x08"
_INTERNAL, _CLIENT = b"\x30\x01", b"\x30\x03"  # kind (field 6)
#: start (field 7) and end (field 8) times, fixed64 each
_times = struct.Struct("<BQBQ").pack
#: flags (field 16, fixed32): SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK, never remote.
_FLAGS = b"\x85\x01" + struct.pack("<I", 0x100)
_NO_STATUS = b"\x7a\x00"  # status (field 15), UNSET, as the SDK writes it


class _OtlpWriter:
    """Writes ``ExportTraceServiceRequest`` bytes from built attempts (the wire format
    of opentelemetry-proto's trace.proto) and posts them with the SDK exporter's own HTTP
    client (its endpoint, headers, compression, TLS, timeout and retries)."""

    def __init__(self, post: Callable[[bytes], bool], resource: Resource) -> None:
        self._post = post
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
        probe = encode_spans([ReadableSpan("probe", context=SpanContext(1, 1, False),
                                           resource=resource, instrumentation_scope=SCOPE)])
        rs = probe.resource_spans[0]
        self._resource = b"\x0a" + _ld(rs.resource.SerializeToString())
        self._resource_tail = b"\x1a" + _ld(rs.schema_url.encode()) if rs.schema_url \
            else b""
        ss = rs.scope_spans[0]
        self._scope = b"\x0a" + _ld(ss.scope.SerializeToString())
        self._scope_tail = b"\x1a" + _ld(ss.schema_url.encode()) if ss.schema_url else b""

    @classmethod
    def for_exporter(cls, exporter: SpanExporter, resource: Resource) -> _OtlpWriter | None:
        """A writer posting through ``exporter`` when it is the SDK's OTLP/HTTP exporter
        of a version whose client takes encoded requests; None otherwise (the batch then
        goes through ``exporter.export`` as SDK spans)."""
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
                OTLPSpanExporter,
            )
        except ImportError:  # pragma: no cover - a dependency of lockgate
            return None
        client = getattr(exporter, "_client", None)
        if type(exporter) is not OTLPSpanExporter or not callable(
                getattr(client, "export", None)):
            return None

        def post(body: bytes) -> bool:
            return bool(client.export(body).success)  # type: ignore[union-attr]
        return cls(post, resource)

    def export(self, built: list[Built]) -> bool:
        return self._post(self.request(built))

    def request(self, built: list[Built]) -> bytes:
        """The encoded ``ExportTraceServiceRequest`` of built attempts."""
        parts = [self._scope]
        append = parts.append
        for (trace_id, run_id, call_id, start, end, sent, name, run_attrs, run_error,
             call_name, call_attrs, error) in built:
            ids = _TRACE_ID + trace_id.to_bytes(16, "big") + _SPAN_ID
            run = run_id.to_bytes(8, "big")
            tail = _times(0x39, start, 0x41, end)
            # Both spans' varying attributes start with the task id: encoded once.
            first, *more = run_attrs[0]
            task = _attribute(*first)
            append(b"\x12" + _ld(b"".join((
                ids, run, b"\x2a", _str(name), _INTERNAL, tail, task,
                *[_attribute(k, v) for k, v in more], run_attrs[2],
                _status_field(run_error), _FLAGS))))
            if call_id:
                append(b"\x12" + _ld(b"".join((
                    ids, call_id.to_bytes(8, "big"), _PARENT_ID, run, b"\x2a",
                    _str(call_name), _CLIENT,
                    tail if sent == start else _times(0x39, sent, 0x41, end), task,
                    *[_attribute(k, v) for k, v in call_attrs[0][1:]], call_attrs[2],
                    _status_field(error), _FLAGS))))
        append(self._scope_tail)
        scope_spans = b"".join(parts)
        resource_spans = self._resource + b"\x12" + _ld(scope_spans) + self._resource_tail
        return b"\x0a" + _ld(resource_spans)


def _status_field(error: str | None) -> bytes:
    """A span's status field: UNSET, or ERROR with ``error`` as its message."""
    if error is None:
        return _NO_STATUS
    return b"\x7a" + _ld(b"\x12" + _str(error) + b"\x18\x02")  # message (2), ERROR (3)


#: Distinct sets of repeating attribute values kept encoded (then the cache starts again).
_MAX_CACHED = 4096


def _attribute(key: str, value: Any) -> bytes:
    """A span's ``attributes`` field (9) holding a ``KeyValue``; empty for a value type
    the SDK leaves out."""
    if type(value) is str:  # the common cases: a string, a small count
        b = value.encode()
        v = b"\x0a" + _len(len(b)) + b
    elif type(value) is int and 0 <= value < 16384:
        v = b"\x18" + _VARINTS[value]
    else:
        found = _any(value)
        if found is None:
            return b""
        v = found
    k = _KEYS.get(key)
    if k is None:
        k = _KEYS[key] = b"\x0a" + _str(key)
    kv = k + b"\x12" + _len(len(v)) + v
    return b"\x4a" + _len(len(kv)) + kv


#: Attribute keys, encoded (field 1 of a KeyValue).
_KEYS: dict[str, bytes] = {}


def _ld(b: bytes) -> bytes:
    """A length-delimited value: its length, then it."""
    return _len(len(b)) + b


def _str(s: str) -> bytes:
    b = s.encode()
    return _len(len(b)) + b


def _any(value: Any) -> bytes | None:
    """An ``AnyValue`` as the SDK encodes it (None: a type the SDK leaves out)."""
    if isinstance(value, str):
        return b"\x0a" + _str(value)
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, int):
        return b"\x18" + _varint(value if value >= 0 else value + (1 << 64))
    if isinstance(value, float):
        return b"\x21" + _pack_d(value)
    if isinstance(value, (list, tuple)):
        items = [_any(v) for v in value]
        return b"\x2a" + _ld(b"".join(b"\x0a" + _ld(i) for i in items if i is not None))
    return None


def _body(text: str | None) -> dict[str, Any] | None:
    """The response body's JSON object (None: no body, or not an object)."""
    if not text:
        return None
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def _finish_reasons(body: dict[str, Any] | None) -> list[str]:
    choices = body.get("choices") if body is not None else None
    if not isinstance(choices, list):
        return []
    return [str(c["finish_reason"]) for c in choices
            if isinstance(c, dict) and c.get("finish_reason")]


def _input_messages(snapshot: str) -> str:
    """The rendered messages in the convention's form (role and text parts), at most
    :data:`MAX_CONTENT` bytes."""
    try:
        messages = orjson.loads(snapshot)
    except orjson.JSONDecodeError:
        messages = [{"role": "user", "content": snapshot}]
    if not isinstance(messages, list):
        messages = [{"role": "user", "content": snapshot}]
    return _fitted([{"role": str(m.get("role", "user"))[:_MAX_ROLE], "parts": [
        {"type": "text", "content": str(m.get("content", ""))}]}
        for m in messages if isinstance(m, dict)])


def _output_messages(text: str, reasons: Sequence[str]) -> str:
    """The answer as the convention's output message (with its finish reason, when the
    response said it), at most :data:`MAX_CONTENT` bytes."""
    message: dict[str, Any] = {"role": "assistant",
                               "parts": [{"type": "text", "content": text}]}
    if reasons:
        message["finish_reason"] = reasons[0]
    return _fitted([message])


#: The longest role a captured message keeps (characters; roles are words).
_MAX_ROLE = 64


def _cut_marker(n: int) -> str:
    return f"\n[lockgate: {n:,} more characters not kept]"


def _fitted(messages: list[dict[str, Any]]) -> str:
    """``messages`` as JSON of at most :data:`MAX_CONTENT` bytes, valid whatever was cut.

    The texts longer than a common length are cut to it, the longest length at which the
    whole fits, and end with a marker saying how many characters they lost: a long
    system prompt and a long input each keep their beginning. When that is not enough
    (thousands of short messages), the oldest messages go, and a first part of the first
    message kept says how many went. Sizes are added up, not encoded again: a string's
    JSON is the same wherever it stands."""
    out = orjson.dumps(messages)
    size = len(out)
    if size <= MAX_CONTENT:
        return out.decode()
    parts = [p for m in messages for p in m["parts"]]
    texts = [str(p["content"]) for p in parts]
    # each text's JSON bytes (without its quotes), and the most its marker can take
    sizes = [len(orjson.dumps(t)) - 2 for t in texts]
    marks = [len(orjson.dumps(_cut_marker(len(t)))) - 2 for t in texts]

    def cut_to(level: int) -> int:
        """The size of the whole with every text that gains from it cut to ``level``."""
        return size - sum(max(0, n - level - m) for n, m in zip(sizes, marks, strict=True))

    level, top = 0, max(sizes)
    if cut_to(0) <= MAX_CONTENT:
        while level < top:  # the longest level at which the whole fits
            mid = (level + top + 1) // 2
            if cut_to(mid) <= MAX_CONTENT:
                level = mid
            else:
                top = mid - 1
    for p, text, n, m in zip(parts, texts, sizes, marks, strict=True):
        if n - level - m > 0:
            k = _prefix(text, level)
            p["content"] = text[:k] + _cut_marker(len(text) - k)
    out = orjson.dumps(messages)
    size = len(out)
    if size <= MAX_CONTENT:
        return out.decode()
    each = [len(orjson.dumps(m)) + 1 for m in messages]  # each with its comma
    note = len(orjson.dumps(_dropped_note(len(messages)))) + 1
    gone = 0
    while size + note > MAX_CONTENT and gone < len(messages) - 1:
        size -= each[gone]
        gone += 1
    kept = messages[gone:]
    first = {**kept[0], "parts": [_dropped_note(gone), *kept[0]["parts"]]}
    out = orjson.dumps([first, *kept[1:]])
    if len(out) > MAX_CONTENT:  # one message whose parts alone are too many
        out = orjson.dumps([{**kept[-1], "parts": [_dropped_note(len(messages))]}])
    return out.decode()


def _dropped_note(n: int) -> dict[str, str]:
    return {"type": "text", "content": f"[lockgate: {n:,} earlier message(s) not kept]"}


def _prefix(text: str, room: int) -> int:
    """The most characters of ``text`` whose JSON string (without its quotes) holds in
    ``room`` bytes."""
    lo, hi = 0, max(0, min(len(text), room))  # a character takes a byte at least
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(orjson.dumps(text[:mid])) - 2 <= room:
            lo = mid
        else:
            hi = mid - 1
    return lo
