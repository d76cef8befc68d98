"""lockgate: durable, leased LLM prompt tasks on SQL databases, with a release gate."""

from lockgate import config, files
from lockgate.app import AsyncLockgate, Lockgate, connect, connect_async
from lockgate.errors import (
    ConfigError,
    ErrorClass,
    LockgateError,
    NotFound,
    SpecError,
    StateConflict,
    StoreError,
    TemplateError,
)
from lockgate.spec import TaskSpec, parse_task

__version__ = "0.1.0"

__all__ = [
    "AsyncLockgate",
    "ConfigError",
    "ErrorClass",
    "Lockgate",
    "LockgateError",
    "NotFound",
    "SpecError",
    "StateConflict",
    "StoreError",
    "TaskSpec",
    "TemplateError",
    "__version__",
    "config",
    "connect",
    "connect_async",
    "files",
    "parse_task",
]
