"""Plain values that cross the store boundary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, TypedDict

from sqlalchemy import Row


@dataclass(frozen=True, slots=True)
class ClaimedTask:
    """A task this worker holds under ``lease_token`` until it writes back."""

    id: int
    task_id: str
    batch_id: str
    config_hash: str
    input_data: str
    attempt: int
    lease_token: str


@dataclass(frozen=True, slots=True)
class ConfigRow:
    """A content-addressed task config as stored: its hash and canonical JSON."""

    hash: str
    document: str


class NewTask(NamedTuple):
    """A validated task as a submit writes it: its config by reference (one object per
    distinct config), its input and metadata already encoded as JSON text. (A tuple:
    a submit makes millions.)"""

    task_id: str
    batch_id: str | None
    config: ConfigRow
    input_json: str
    metadata_json: str | None
    priority: int
    pool: str


class AttemptRow(TypedDict, total=False):
    """A ``task_attempt`` row as a worker writes it (the trace of one call). Keys are
    column names: a key that is not a column is a type error here, not a SQL error at
    run time. The store adds ``task_pk``, ``lease_token`` and ``worker_id``."""

    attempt: int
    outcome: str
    started_at: int
    latency_ms: float | None
    endpoint: str | None
    model: str | None
    prompt_sha256: str | None
    prompt_snapshot: str | None
    token_estimator: str | None
    estimated_tokens: int | None
    input_tokens: int | None
    output_tokens: int | None
    http_status: int | None
    raw_output: str | None
    parse_status: str | None
    fixes: str | None
    completeness: float | None
    error_class: str | None
    error_message: str | None
    prompt_version: str | None
    routed_from: str | None
    request_id: str | None


@dataclass(slots=True)
class Finish:
    """One write-back: the task's new state, fenced by the lease token it was claimed with.

    ``status`` PENDING means "release for a retry after ``delay_ms``".
    """

    id: int
    lease_token: str
    status: str
    result: str | None = None
    parse_status: str | None = None
    error_class: str | None = None
    error_message: str | None = None
    delay_ms: int = 0
    attempt: AttemptRow | None = None
    release_attempt: bool = False
    #: The call this write-back ends (kept on the task row, for results and exports
    #: without a join): the model that answered, its usage and latency, the HTTP status,
    #: the provider's request id and response body as returned. None for no call.
    model: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    latency_ms: float | None = None
    http_status: int | None = None
    request_id: str | None = None
    response: str | None = None
    #: When the call's request was sent (ms, the worker's database clock; None: no call
    #: or not known): for the trace's call span only, not written to any column.
    sent_at: int | None = None


@dataclass(frozen=True, slots=True)
class FinishReport:
    """What a write-back did: applied ids and the ones whose lease was lost.

    ``applied_claims`` names each applied write-back by (task pk, lease token): a batch
    may hold a stale and a current result of one task, and only the claim tells them
    apart. A write-back found already applied (its earlier transaction committed but the
    acknowledgement was lost) counts as applied."""

    applied: list[int]
    discarded: list[int]
    applied_claims: frozenset[tuple[int, str]] = frozenset()
    discarded_claims: frozenset[tuple[int, str]] = frozenset()


def row_dict(row: Row[Any] | Any) -> dict[str, Any]:
    """A result row as a plain dict with plain ``str`` keys (SQLAlchemy's may be
    ``quoted_name``, a str subclass that orjson refuses as a key)."""
    return {str(k): v for k, v in row._mapping.items()}
