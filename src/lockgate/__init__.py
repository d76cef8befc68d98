"""lockgate: durable, leased LLM prompt tasks on SQL databases, with a release gate.

The public names below are imported lazily, so ``import lockgate.simulator`` (or any
one submodule) does not pay for SQLAlchemy and the worker.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "AsyncLockgate": "lockgate.app",
    "Lockgate": "lockgate.app",
    "connect": "lockgate.app",
    "connect_async": "lockgate.app",
    "ConfigError": "lockgate.errors",
    "DatabaseUnavailable": "lockgate.errors",
    "ErrorClass": "lockgate.errors",
    "LockgateError": "lockgate.errors",
    "NotFound": "lockgate.errors",
    "SpecError": "lockgate.errors",
    "StateConflict": "lockgate.errors",
    "StoreError": "lockgate.errors",
    "TemplateError": "lockgate.errors",
    "TaskSpec": "lockgate.spec",
    "parse_task": "lockgate.spec",
    "Attempt": "lockgate.results",
    "Response": "lockgate.results",
    "BatchSummary": "lockgate.results",
    "CircuitView": "lockgate.results",
    "ReviewItem": "lockgate.results",
    "Status": "lockgate.results",
    "TaskError": "lockgate.results",
    "TaskResult": "lockgate.results",
    "TaskView": "lockgate.results",
    "Usage": "lockgate.results",
    "WorkerInfo": "lockgate.results",
    "Worker": "lockgate.worker",
    "WorkerStats": "lockgate.worker",
    "SubmitReport": "lockgate.store",
    "QualityRow": "lockgate.quality",
    "Alert": "lockgate.quality.alerts",
    "AlertSample": "lockgate.quality.alerts",
}
_MODULES = ("config", "files")

__all__ = [
    "Alert",
    "AlertSample",
    "AsyncLockgate",
    "Attempt",
    "BatchSummary",
    "CircuitView",
    "ConfigError",
    "DatabaseUnavailable",
    "ErrorClass",
    "Lockgate",
    "LockgateError",
    "NotFound",
    "QualityRow",
    "Response",
    "ReviewItem",
    "SpecError",
    "StateConflict",
    "Status",
    "StoreError",
    "SubmitReport",
    "TaskError",
    "TaskResult",
    "TaskSpec",
    "TaskView",
    "TemplateError",
    "Usage",
    "Worker",
    "WorkerInfo",
    "WorkerStats",
    "__version__",
    "config",
    "connect",
    "connect_async",
    "files",
    "parse_task",
]

if TYPE_CHECKING:
    from lockgate import config, files
    from lockgate.app import AsyncLockgate, Lockgate, connect, connect_async
    from lockgate.errors import (
        ConfigError,
        DatabaseUnavailable,
        ErrorClass,
        LockgateError,
        NotFound,
        SpecError,
        StateConflict,
        StoreError,
        TemplateError,
    )
    from lockgate.quality import QualityRow
    from lockgate.quality.alerts import Alert, AlertSample
    from lockgate.results import (
        Attempt,
        BatchSummary,
        CircuitView,
        Response,
        ReviewItem,
        Status,
        TaskError,
        TaskResult,
        TaskView,
        Usage,
        WorkerInfo,
    )
    from lockgate.spec import TaskSpec, parse_task
    from lockgate.store import SubmitReport
    from lockgate.worker import Worker, WorkerStats


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _MODULES:
        value = importlib.import_module(f"lockgate.{name}")
    else:
        raise AttributeError(f"module 'lockgate' has no attribute {name!r}")
    globals()[name] = value
    return value
