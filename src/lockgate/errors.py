"""The exception tree and the error taxonomy.

Every error a user can see is a :class:`LockgateError`; each class has a stable
``code`` and its docstring is the default message::

    LockgateError
    ├── ConfigError            bad configuration (file, environment, URL)
    ├── SpecError              a task spec or file line is invalid (names the field)
    │   └── TemplateError      a template's placeholders do not match its input
    ├── NotFound               a task, batch or prompt does not exist
    ├── StateConflict          a conditional update found the row in another state
    └── StoreError             the database refused the operation
        └── DatabaseUnavailable    the database cannot be reached (retry later)

Database driver and SQLAlchemy exceptions never leave the store: they are mapped at one
boundary (:func:`lockgate.store.failures.map_db_errors`) to :class:`StoreError`, whose
``transient`` flag says whether trying again later can succeed (a lost connection, a
deadlock, a locked or full SQLite file) or not (a value the schema refuses).

Provider failures are not exceptions of this tree: they are classified into an
:class:`ErrorClass` (the typed taxonomy that retry policies name in ``stop_on``)
and carried by :class:`lockgate.providers.base.ProviderError`.
"""

from __future__ import annotations

import logging
from enum import StrEnum


class LockgateError(Exception):
    """lockgate failed."""

    code = "lockgate_error"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or self.code).strip())


class ConfigError(LockgateError):
    """The configuration is invalid."""

    code = "config_error"


class SpecError(LockgateError):
    """The task spec is invalid."""

    code = "spec_error"

    def __init__(self, message: str | None = None, *, field: str | None = None,
                 line: int | None = None) -> None:
        self.field = field
        self.line = line
        parts = []
        if line is not None:
            parts.append(f"line {line}")
        if field:
            parts.append(f"field '{field}'")
        prefix = ": ".join([", ".join(parts)]) + ": " if parts else ""
        #: The message without the line and field prefix.
        self.reason = message or "invalid task spec"
        super().__init__(prefix + self.reason)

    def at_line(self, line: int | None) -> SpecError:
        """The same error, located at ``line`` of a file."""
        return type(self)(self.reason, field=self.field, line=line)


class TemplateError(SpecError):
    """The prompt template does not match its input."""

    code = "template_error"


class NotFound(LockgateError):
    """No such object."""

    code = "not_found"


class StateConflict(LockgateError):
    """The row is not in the state this operation needs."""

    code = "state_conflict"


class StoreError(LockgateError):
    """The database refused the operation or could not be reached."""

    code = "store_error"

    def __init__(self, message: str | None = None, *, transient: bool = False) -> None:
        #: Whether the same operation may succeed if tried again later.
        self.transient = transient
        super().__init__(message)


class DatabaseUnavailable(StoreError):
    """The database could not be reached."""

    code = "database_unavailable"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message, transient=True)


def cannot(verb: str, path: object, exc: OSError) -> LockgateError:
    """A file the user named that cannot be read or written, as one line:
    ``cannot read PATH: Is a directory``."""
    return LockgateError(f"cannot {verb} {path}: {exc.strerror or exc}")


def not_utf8(data: bytes, exc: UnicodeDecodeError, *, base: int = 0,
             of_line: bool = False) -> str:
    """The words for text that is not UTF-8, the same for every file a user gives
    (task files, datasets, templates, the config): the first bad byte, its offset
    (``data`` starts at byte ``base`` of the file; ``of_line``: the offset counts from
    the line's start) and the fix."""
    where = " of the line" if of_line else ""
    return (f"not UTF-8 text (byte {data[exc.start]:#04x} at byte offset "
            f"{base + exc.start}{where}): save the file as UTF-8 (from Latin-1 or "
            "Windows-1252: iconv -f cp1252 -t utf-8)")


class ErrorClass(StrEnum):
    """Why an attempt failed. Stored on attempts and tasks; named by ``stop_on``."""

    RATE_LIMITED = "rate_limited"
    QUOTA_EXHAUSTED = "quota_exhausted"
    TIMEOUT = "timeout"
    CONNECTION_ERROR = "connection_error"
    SERVER_ERROR = "server_error"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    INVALID_REQUEST = "invalid_request"
    AUTH_ERROR = "auth_error"
    CONTENT_FILTERED = "content_filtered"
    INVALID_OUTPUT = "invalid_output"
    RENDER_ERROR = "render_error"
    #: The database refused to store the attempt's result (a value its schema cannot
    #: hold); not retried: the same answer would be refused again.
    STORAGE_ERROR = "storage_error"
    LEASE_EXPIRED = "lease_expired"
    #: No worker could route it: its ``model_config.endpoint`` was in no running worker's
    #: config for ``[worker] unroutable_after_s`` (a worker's configuration, never the
    #: task's own error; until then each worker without it hands it back uncalled).
    UNROUTABLE = "unroutable"
    #: Given back unfinished by a worker that was shutting down (no attempt spent).
    RELEASED_AT_SHUTDOWN = "released_at_shutdown"
    INTERNAL_ERROR = "internal_error"


#: Error classes a retry can cure. The rest fail the task at once (FAILED).
RETRYABLE: frozenset[ErrorClass] = frozenset({
    ErrorClass.RATE_LIMITED,
    ErrorClass.QUOTA_EXHAUSTED,
    ErrorClass.TIMEOUT,
    ErrorClass.CONNECTION_ERROR,
    ErrorClass.SERVER_ERROR,
    # A refused key is the endpoint's condition, never the task's: once it is fixed
    # (the key set, the account unblocked), the task runs.
    ErrorClass.AUTH_ERROR,
    ErrorClass.INVALID_OUTPUT,
    ErrorClass.LEASE_EXPIRED,
    ErrorClass.RELEASED_AT_SHUTDOWN,
    ErrorClass.INTERNAL_ERROR,
})


class Streak:
    """The failures in a row of a duty that keeps being retried (a worker's lease
    renewal, its budget grants, its reports...), and the level to log the latest at:
    WARNING for the first three and every tenth, DEBUG for the others, so that a
    database outage says what fails without filling the log."""

    __slots__ = ("failures",)

    def __init__(self) -> None:
        self.failures = 0

    def failed(self) -> int:
        """Count a failure; the logging level to report it at."""
        self.failures += 1
        n = self.failures
        return logging.WARNING if n <= 3 or n % 10 == 0 else logging.DEBUG

    def ok(self) -> None:
        self.failures = 0
