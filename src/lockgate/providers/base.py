"""The provider protocol and the values it exchanges."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from lockgate.errors import ErrorClass


@dataclass(slots=True)
class CompletionRequest:
    """One chat-completion call."""

    messages: list[dict[str, str]]
    model: str
    params: dict[str, Any]
    timeout_s: float
    idempotency_key: str | None = None


@dataclass(slots=True)
class Completion:
    """A provider's answer (the text, before any parsing)."""

    content: str
    http_status: int
    model: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    request_id: str | None = None
    rate_limit: dict[str, str] = field(default_factory=dict)
    #: The response body as the provider returned it (its JSON text), for exports in
    #: the provider's own format; None when it was not JSON or is too large to keep.
    body: str | None = None
    #: Whether the request was sent twice: its pooled keep-alive connection turned out
    #: closed by the server, and it went again on a new one (counted as two calls).
    resent: bool = False


class ProviderError(Exception):
    """A call failed; ``error_class`` says why in the taxonomy retry policies use."""

    def __init__(self, error_class: ErrorClass, message: str, *, http_status: int | None = None,
                 retry_after_ms: int | None = None,
                 rate_limit: dict[str, str] | None = None, request_id: str | None = None,
                 body: str | None = None, prompt_tokens: int | None = None,
                 completion_tokens: int | None = None, model: str | None = None) -> None:
        super().__init__(f"{error_class}: {message}")
        self.error_class = error_class
        self.message = message
        self.http_status = http_status
        self.retry_after_ms = retry_after_ms
        self.rate_limit = rate_limit or {}
        #: The provider's ``x-request-id`` and error body as returned, if it answered.
        self.request_id = request_id
        self.body = body
        #: The usage and model of an answer the provider billed although it is an
        #: error here (a refusal, a filtered answer, tool calls, no choices): recorded
        #: on the attempt as a completion's are (None when the answer named none).
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens
        self.model = model
        #: Whether the request was sent twice (see :attr:`Completion.resent`).
        self.resent = False
        #: The HTTP status an error object inside a 2xx answer names as its code
        #: (OpenRouter's ``{"error": {"code": 403, ...}}`` in a 200), None otherwise:
        #: what the status would have been, for flow control (:attr:`status`).
        self.inner_status: int | None = None

    @property
    def status(self) -> int | None:
        """The status the error stands for: the one its error object names inside a
        2xx answer (:attr:`inner_status`), else the answer's HTTP status."""
        return self.inner_status if self.inner_status is not None else self.http_status


@dataclass(slots=True)
class CallOutcome:
    """What one call to a provider came to, as flow control judges it: the answer or
    the error, and how long the provider took. (Whether the answer was usable is the
    prompt's business, not the endpoint's.)"""

    completion: Completion | None
    error: ProviderError | None
    latency_ms: float

    @property
    def error_class(self) -> ErrorClass | None:
        return None if self.error is None else self.error.error_class

    @property
    def rate_limit(self) -> dict[str, str]:
        """The ``x-ratelimit-*`` headers of the answer or of the error."""
        if self.completion is not None:
            return self.completion.rate_limit
        return self.error.rate_limit if self.error is not None else {}

    @property
    def retry_after_ms(self) -> int | None:
        return None if self.error is None else self.error.retry_after_ms


class Provider(Protocol):
    """Anything that answers chat completions."""

    name: str

    async def complete(self, request: CompletionRequest) -> Completion:
        """Make one call; raise :class:`ProviderError` on failure."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...
