"""lockgate: durable, leased LLM prompt tasks on SQL databases, with a release gate.

The public names below are imported lazily, so ``import lockgate.simulator`` (or any
one submodule) does not pay for SQLAlchemy and the worker.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lockgate.lazy import lazy_names as _lazy_names

__version__ = "0.1.0"

#: Where each public name lives (its module, in this package).
_EXPORTS = {
    "AsyncLockgate": "app",
    "Lockgate": "app",
    "connect": "app",
    "connect_async": "app",
    "ConfigError": "errors",
    "DatabaseUnavailable": "errors",
    "ErrorClass": "errors",
    "LockgateError": "errors",
    "NotFound": "errors",
    "SpecError": "errors",
    "StateConflict": "errors",
    "StoreError": "errors",
    "TemplateError": "errors",
    "TaskSpec": "spec",
    "parse_task": "spec",
    "Attempt": "results",
    "Response": "results",
    "BatchSummary": "results",
    "CircuitView": "results",
    "ReviewItem": "results",
    "Status": "results",
    "TaskError": "results",
    "TaskResult": "results",
    "TaskView": "results",
    "Usage": "results",
    "WorkerInfo": "results",
    "Worker": "worker",
    "WorkerStats": "worker",
    "SubmitReport": "store",
    "QualityRow": "quality",
    "Alert": "quality.alerts",
    "AlertSample": "quality.alerts",
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


__getattr__, __dir__ = _lazy_names(__name__, _EXPORTS, _MODULES)
