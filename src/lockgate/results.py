"""What the Python API hands back: typed rows with Python values, not database text.

One shape everywhere: a task's result is its parsed JSON value; its error is
``TaskError(error_class, message)`` (``{"class": ..., "message": ...}`` in files);
times are timezone-aware UTC :class:`~datetime.datetime` objects in Python and ISO-8601
UTC strings (``2026-12-03T09:12:05.123Z``) in every file and JSON output
(:meth:`to_dict`). The store builds these from its rows; exports write them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

import orjson


def utc(ms: int | None) -> datetime | None:
    """A database time (integer ms since the epoch, database clock) as a UTC datetime."""
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


def iso(t: datetime | None) -> str | None:
    """ISO-8601 UTC with milliseconds and ``Z``, as every file lockgate writes has it."""
    return None if t is None else _iso(t)


@lru_cache(maxsize=4096)  # the rows of a submit chunk share their creation time
def _iso(t: datetime) -> str:
    if t.tzinfo is not UTC:
        t = t.astimezone(UTC)
    return t.isoformat(timespec="milliseconds")[:-6] + "Z"  # drop "+00:00"


def _json(text: str | None) -> Any:
    return None if text is None else orjson.loads(text)


def plain(value: Any) -> Any:
    """A value as JSON takes it: datetimes as ISO strings, rows as their ``to_dict()``."""
    if isinstance(value, datetime):
        return iso(value)
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


class _Row:
    """``to_dict()`` for the dataclasses below: JSON-ready, times in ISO-8601 UTC."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: plain(getattr(self, f.name))
                for f in fields(self)}  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class TaskError(_Row):
    """Why a task (or an attempt) did not succeed: the error class of the taxonomy
    (``lockgate.ErrorClass``, or the task's state when it has none) and the message."""

    error_class: str | None
    message: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"class": self.error_class, "message": self.message}


@dataclass(frozen=True, slots=True)
class Usage(_Row):
    """What the call that produced a result cost: tokens, the model that answered, its
    latency."""

    input_tokens: int | None
    output_tokens: int | None
    model: str | None
    latency_ms: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "model": self.model, "latency_ms": self.latency_ms}


@dataclass(frozen=True, slots=True)
class Response(_Row):
    """What the provider answered to the call that ended the task, as it answered it:
    the HTTP status, its ``x-request-id`` and its body (parsed JSON; None when the body
    was not JSON or too large to keep)."""

    status_code: int
    request_id: str | None
    body: Any

    def to_dict(self) -> dict[str, Any]:
        return {"status_code": self.status_code, "request_id": self.request_id,
                "body": self.body}  # already a JSON value: no walk through it


@dataclass(frozen=True, slots=True)
class TaskResult(_Row):
    """One task of a batch as :meth:`lockgate.Lockgate.results` streams it."""

    task_id: str
    batch_id: str
    status: str
    #: The delivered value (parsed JSON); also for FAILED with fallback values.
    result: Any
    parse_status: str | None
    #: None for SUCCEEDED; else the reason (a PENDING task: its last retry's reason).
    error: TaskError | None
    attempts: int
    created_at: datetime
    finished_at: datetime | None
    #: Of the call that ended the task (the one whose answer was delivered, for
    #: SUCCEEDED); None when no call got an answer.
    usage: Usage | None
    #: The provider's answer to that call, as returned; None without an HTTP answer.
    response: Response | None = None

    #: The task columns :meth:`from_row` reads, in the order it reads them.
    COLUMNS = ("task_id", "batch_id", "status", "result", "parse_status", "error_class",
               "error_message", "attempts", "created_at", "finished_at", "input_tokens",
               "output_tokens", "model", "latency_ms", "http_status", "request_id",
               "response")

    @classmethod
    def from_row(cls, r: Sequence[Any]) -> TaskResult:
        """From the values of :data:`COLUMNS`, in that order (one result row)."""
        (task_id, batch_id, status, result, parse_status, error_class, error_message,
         attempts, created_at, finished_at, input_tokens, output_tokens, model,
         latency_ms, http_status, request_id, body) = r
        error = None
        if status != "SUCCEEDED" and (error_class or error_message or status != "PENDING"):
            error = TaskError(error_class or (None if status == "PENDING"
                                              else status.lower()), error_message)
        usage = None
        if model is not None or input_tokens is not None:
            usage = Usage(input_tokens, output_tokens, model,
                          None if latency_ms is None else float(latency_ms))
        response = None
        if http_status is not None:
            try:
                parsed = None if body is None else orjson.loads(body)
            except orjson.JSONDecodeError:
                parsed = None
            response = Response(int(http_status), request_id, parsed)
        return cls(task_id, batch_id, status, _json(result), parse_status, error,
                   int(attempts), datetime.fromtimestamp(created_at / 1000, UTC),
                   utc(finished_at), usage, response)

    def to_dict(self) -> dict[str, Any]:
        # Written out: the result and the response body are JSON values already, and
        # exports call this once per row.
        return {"task_id": self.task_id, "batch_id": self.batch_id, "status": self.status,
                "result": self.result, "parse_status": self.parse_status,
                "error": None if self.error is None else self.error.to_dict(),
                "attempts": self.attempts, "created_at": iso(self.created_at),
                "finished_at": iso(self.finished_at),
                "usage": None if self.usage is None else self.usage.to_dict(),
                "response": None if self.response is None else self.response.to_dict()}


@dataclass(frozen=True, slots=True)
class Attempt(_Row):
    """One call of a task (its ``task_attempt`` row: the trace)."""

    attempt: int
    outcome: str
    worker_id: str
    started_at: datetime
    latency_ms: float | None
    endpoint: str | None
    model: str | None
    prompt_version: str | None
    prompt_sha256: str | None
    #: The rendered messages as sent (None unless the worker keeps snapshots).
    prompt: list[dict[str, str]] | None
    token_estimator: str | None
    estimated_tokens: int | None
    input_tokens: int | None
    output_tokens: int | None
    http_status: int | None
    raw_output: str | None
    parse_status: str | None
    fixes: list[str]
    completeness: float | None
    error: TaskError | None
    routed_from: str | None

    @classmethod
    def from_row(cls, r: Mapping[str, Any]) -> Attempt:
        started = utc(r["started_at"])
        assert started is not None
        return cls(
            attempt=int(r["attempt"]), outcome=r["outcome"], worker_id=r["worker_id"],
            started_at=started, latency_ms=r["latency_ms"], endpoint=r["endpoint"],
            model=r["model"], prompt_version=r["prompt_version"],
            prompt_sha256=r["prompt_sha256"], prompt=_json(r["prompt_snapshot"]),
            token_estimator=r["token_estimator"], estimated_tokens=r["estimated_tokens"],
            input_tokens=r["input_tokens"], output_tokens=r["output_tokens"],
            http_status=r["http_status"], raw_output=r["raw_output"],
            parse_status=r["parse_status"],
            fixes=r["fixes"].split(",") if r["fixes"] else [],
            completeness=r["completeness"],
            error=TaskError(r["error_class"], r["error_message"])
            if r["error_class"] or r["error_message"] else None,
            routed_from=r["routed_from"])


@dataclass(frozen=True, slots=True)
class TaskView(_Row):
    """One task with its input, config, state and every attempt (``lockgate tasks
    show``, :meth:`lockgate.Lockgate.task`)."""

    task_id: str
    batch_id: str
    status: str
    input_data: dict[str, Any]
    metadata: dict[str, Any] | None
    result: Any
    parse_status: str | None
    error: TaskError | None
    attempts: int
    priority: int
    pool: str
    #: While PENDING: when it becomes claimable (its lease's or back-off's end).
    visible_at: datetime | None
    leased_by: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    config_hash: str
    #: Template, model config, delivery rule and retry policy, as submitted.
    config: dict[str, Any]
    attempt_log: list[Attempt] = field(default_factory=list)

    @classmethod
    def from_rows(cls, t: Mapping[str, Any], config: dict[str, Any],
                  attempts: Sequence[Mapping[str, Any]]) -> TaskView:
        base = TaskResult.from_row([t[name] for name in TaskResult.COLUMNS])
        updated = utc(t["updated_at"])
        assert updated is not None
        return cls(
            task_id=t["task_id"], batch_id=t["batch_id"], status=t["status"],
            input_data=orjson.loads(t["input_data"]), metadata=_json(t["metadata"]),
            result=base.result, parse_status=t["parse_status"], error=base.error,
            attempts=int(t["attempts"]), priority=int(t["priority"]), pool=t["pool"],
            visible_at=utc(t["visible_at"]) if t["status"] == "PENDING" else None,
            leased_by=t["leased_by"], created_at=base.created_at, updated_at=updated,
            finished_at=base.finished_at, config_hash=t["config_hash"], config=config,
            attempt_log=[Attempt.from_row(a) for a in attempts])


@dataclass(frozen=True, slots=True)
class WorkerInfo(_Row):
    """A worker process alive now, from its heartbeat row."""

    id: str
    hostname: str
    pid: int
    status: str
    pool: str | None
    concurrency: int
    concurrency_limit: int | None
    in_flight: int
    claimed: int
    succeeded: int
    failed: int
    discarded: int
    started_at: datetime
    heartbeat_at: datetime
    #: Seconds since its last heartbeat, on the database clock.
    heartbeat_age_s: float
    #: Its flow controller's view of each endpoint (limits, breaker, in flight).
    endpoints: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_row(cls, r: Mapping[str, Any], now_ms: int) -> WorkerInfo:
        started, beat = utc(r["started_at"]), utc(r["heartbeat_at"])
        assert started is not None and beat is not None
        return cls(id=r["id"], hostname=r["hostname"], pid=int(r["pid"]), status=r["status"],
                   pool=r["pool"], concurrency=int(r["concurrency"]),
                   concurrency_limit=r["concurrency_limit"], in_flight=int(r["in_flight"]),
                   claimed=int(r["claimed"]), succeeded=int(r["succeeded"]),
                   failed=int(r["failed"]), discarded=int(r["discarded"]),
                   started_at=started, heartbeat_at=beat,
                   heartbeat_age_s=(now_ms - int(r["heartbeat_at"])) / 1000,
                   endpoints=_endpoints(r.get("flow")))


def _endpoints(text: str | None) -> dict[str, Any]:
    try:
        value = orjson.loads(text or "{}")
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True, slots=True)
class Status(_Row):
    """The queue at a glance (``lockgate status``, :meth:`lockgate.Lockgate.status`)."""

    #: The database clock when it was read.
    now: datetime
    #: Tasks per state, per batch.
    batches: dict[str, dict[str, int]]
    #: PENDING tasks some worker holds a lease on now.
    leased: int
    #: PENDING tasks waiting after an error: a retry's back-off, or a call given back
    #: while its endpoint was down.
    backing_off: int
    #: Workers alive (a heartbeat within the last 30 s).
    workers: list[WorkerInfo]
    #: Batches whose submit has not finished writing (run it again to complete them).
    incomplete_batches: list[str]
    #: The completeness circuits configured (docs/quality.md), each a :class:`CircuitView`.
    circuits: list[CircuitView] = field(default_factory=list)
    #: The submits of each incomplete batch that did not finish: "FILE on HOST" (the
    #: same command run again there completes it).
    unfinished_submits: dict[str, list[str]] = field(default_factory=dict)
    #: PENDING tasks not due yet without any error: their batch's window has not
    #: opened, or its pace holds them back.
    scheduled: int = 0
    #: Workers that never said they stopped and have been silent for over 30 s (up to
    #: an hour): crashed, killed or cut off; their leases expire and others take over.
    silent_workers: list[WorkerInfo] = field(default_factory=list)
    #: PENDING tasks handed back by workers whose config lacks the endpoint they name
    #: (error class ``unroutable``): waiting for a worker that has it (a rolling config
    #: change; docs/operations.md, "Upgrading").
    unroutable: int = 0

    @property
    def review(self) -> int:
        """Tasks held for a person (REVIEW), all batches."""
        return sum(c.get("REVIEW", 0) for c in self.batches.values())


@dataclass(frozen=True, slots=True)
class CircuitView(_Row):
    """A completeness circuit: its configuration and its state now."""

    prompt: str
    state: str
    #: When it last moved (database clock), None for a circuit that never did.
    since: datetime | None
    reason: str | None
    #: Held by an operator (``lockgate circuit open``): the evaluator leaves it alone.
    manual: bool
    changed_by: str | None
    #: ``prompt``, ``endpoint`` or ``review``, and what it names.
    fallback_kind: str
    fallback: str
    threshold: float
    window_s: float
    min_calls: int
    probation_s: float
    probe_share: float
    #: The figures the last move was decided on (minutes, completeness, calls).
    figures: dict[str, Any] | None
    version: int


@dataclass(frozen=True, slots=True)
class ReviewItem(_Row):
    """A task held for a person (REVIEW): what ``lockgate export --review`` writes."""

    task_id: str
    batch_id: str
    input: Any
    #: The prompt version (``name@N``) or inline key the task was held under.
    prompt: str | None
    #: The rendered prompt (chat messages) a call would have sent.
    messages: Any
    #: Why it is held (the circuit and its figures).
    reason: str | None
    held_at: datetime | None
    attempts: int
    #: The last call's raw output, parse status and error, when an earlier attempt made one.
    last_output: str | None
    last_parse_status: str | None
    last_error: TaskError | None
    #: The output schema a resolution is checked against (JSON Schema), if any.
    output_schema: Any
    #: The model config it would have run under (name and parameters), if known.
    model_config: Any = None


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The q-quantile (0..1) by nearest rank; None for no data."""
    if not sorted_values:
        return None
    k = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[k]


@dataclass
class BatchSummary(_Row):
    """What happened to a batch, from the database (not from any worker's memory)."""

    batch_id: str | None
    states: dict[str, int]
    calls: int
    retries: int
    duplicate_calls: int
    outcomes: dict[str, int]
    errors: dict[str, int]
    parse_status: dict[str, int]
    latency_ms: dict[str, float | None]
    completeness: float | None
    elapsed_s: float | None
    #: Tasks of the batch already finished when ``elapsed_s`` began (a run resumed, or
    #: run again): not counted in the throughput.
    done_before: int = 0

    @property
    def tasks(self) -> int:
        return sum(self.states.values())

    @property
    def throughput(self) -> float | None:
        done = self.tasks - self.states.get("PENDING", 0) - self.states.get("REVIEW", 0)
        now = done - self.done_before
        return now / self.elapsed_s if self.elapsed_s and now > 0 else None


__all__ = ["Attempt", "BatchSummary", "CircuitView", "Response", "ReviewItem", "Status",
           "TaskError", "TaskResult", "TaskView", "Usage", "WorkerInfo", "iso", "percentile",
           "plain", "utc"]
