"""The states of lockgate's rows and the arrows between them, in one leaf module.

Tasks, release-gate candidates (``prompt_update``), their runs (``prompt_run``) and
samples (``prompt_run_item``) each have a state column; the domain code and the store
both name states from here. Every arrow is one conditional UPDATE naming the state it
leaves (docs/architecture.md, "State machines"); :data:`ARROWS` lists the release gate's,
and nothing leaves a terminal state.
"""

from __future__ import annotations

from enum import StrEnum


class TaskStatus(StrEnum):
    """Task states. PENDING covers visible, leased and backing-off rows (``visible_at``);
    REVIEW is a task held for a person (the completeness circuit's ``review`` fallback):
    not finished, never claimed, ended by ``lockgate tasks resolve`` or a cancel."""

    PENDING = "PENDING"
    REVIEW = "REVIEW"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    DEAD = "DEAD"
    CANCELLED = "CANCELLED"


TERMINAL: frozenset[str] = frozenset({
    TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.DEAD, TaskStatus.CANCELLED,
})
#: States of a task that is not finished: its batch is not done while it has one.
UNFINISHED: frozenset[str] = frozenset({TaskStatus.PENDING, TaskStatus.REVIEW})
#: Every arrow of a task (docs/architecture.md, "State machine of a task").
TASK_ARROWS: frozenset[tuple[str, str]] = frozenset({
    (TaskStatus.PENDING, TaskStatus.SUCCEEDED), (TaskStatus.PENDING, TaskStatus.FAILED),
    (TaskStatus.PENDING, TaskStatus.DEAD), (TaskStatus.PENDING, TaskStatus.CANCELLED),
    (TaskStatus.PENDING, TaskStatus.REVIEW),
    (TaskStatus.REVIEW, TaskStatus.SUCCEEDED), (TaskStatus.REVIEW, TaskStatus.CANCELLED),
    (TaskStatus.FAILED, TaskStatus.PENDING), (TaskStatus.DEAD, TaskStatus.PENDING),
    (TaskStatus.CANCELLED, TaskStatus.PENDING),
})


class CircuitState(StrEnum):
    """States of a completeness circuit (``quality_circuit``, docs/quality.md)."""

    CLOSED = "CLOSED"
    OPEN = "OPEN"


class UpdateStatus(StrEnum):
    """States of a candidate change (``prompt_update``)."""

    PENDING = "PENDING"
    EVALUATING = "EVALUATING"
    ACTIVATED = "ACTIVATED"
    REJECTED = "REJECTED"
    CANCELLED = "CANCELLED"
    STALE = "STALE"
    FAILED = "FAILED"


class RunStatus(StrEnum):
    """States of one evaluation of one version on one dataset (``prompt_run``)."""

    MATERIALIZING = "MATERIALIZING"
    EXECUTING = "EXECUTING"
    FINALIZED = "FINALIZED"
    EMPTY = "EMPTY"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"


class Verdict(StrEnum):
    """States of one sample (``prompt_run_item``)."""

    PENDING = "PENDING"
    MATCH = "MATCH"
    MISMATCH = "MISMATCH"
    ERROR = "ERROR"


U, R, V = UpdateStatus, RunStatus, Verdict

#: Every allowed transition, per table. Anything else is refused.
ARROWS: dict[str, frozenset[tuple[str, str]]] = {
    "prompt_update": frozenset({
        (U.PENDING, U.EVALUATING), (U.PENDING, U.CANCELLED), (U.PENDING, U.FAILED),
        (U.EVALUATING, U.ACTIVATED), (U.EVALUATING, U.REJECTED),
        (U.EVALUATING, U.CANCELLED), (U.EVALUATING, U.STALE), (U.EVALUATING, U.FAILED),
    }),
    "prompt_run": frozenset({
        (R.MATERIALIZING, R.EXECUTING), (R.MATERIALIZING, R.EMPTY),
        (R.MATERIALIZING, R.CANCELLED), (R.MATERIALIZING, R.FAILED),
        (R.EXECUTING, R.FINALIZED), (R.EXECUTING, R.CANCELLED), (R.EXECUTING, R.FAILED),
    }),
    "prompt_run_item": frozenset({
        (V.PENDING, V.MATCH), (V.PENDING, V.MISMATCH), (V.PENDING, V.ERROR),
    }),
}
ACTIVE_UPDATES = (U.PENDING, U.EVALUATING)
ACTIVE_RUNS = (R.MATERIALIZING, R.EXECUTING)
TERMINAL_UPDATES = frozenset(set(UpdateStatus) - set(ACTIVE_UPDATES))
TERMINAL_RUNS = frozenset(set(RunStatus) - set(ACTIVE_RUNS))


__all__ = ["ACTIVE_RUNS", "ACTIVE_UPDATES", "ARROWS", "TASK_ARROWS", "TERMINAL",
           "TERMINAL_RUNS", "TERMINAL_UPDATES", "UNFINISHED", "CircuitState", "RunStatus",
           "TaskStatus", "UpdateStatus", "Verdict"]
