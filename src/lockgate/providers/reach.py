"""Whether endpoints can be reached at all, checked when a worker starts (docs/flow.md,
"When an endpoint is down").

A TCP connection to each endpoint's host and port, as the HTTP client would open it:
no request is sent, so no key, no model and no cost are involved, and a provider that
answers every request with an error still counts as reachable (its errors are the
breaker's business once calls run). What is reported is why a connection could not
be opened: the name does not resolve, nothing listens, no answer in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from lockgate.config import Endpoint
from lockgate.redact import redact_url

#: Seconds a connection may take before the endpoint counts as unreachable.
CHECK_TIMEOUT_S = 3.0


@dataclass(frozen=True, slots=True)
class Unreachable:
    """An endpoint no connection could be opened to, and why."""

    name: str
    url: str  # base_url with its credentials hidden
    cause: str

    def describe(self) -> str:
        return f"endpoint '{self.name}' ({self.url}) is unreachable: {self.cause}"


def _address(base_url: str) -> tuple[str, int] | None:
    parts = urlsplit(base_url)
    if not parts.hostname:
        return None
    try:
        port = parts.port
    except ValueError:
        return None
    return parts.hostname, port or (443 if parts.scheme == "https" else 80)


def _cause(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer within {CHECK_TIMEOUT_S:g} s"
    if isinstance(exc, socket.gaierror):
        return f"the host name does not resolve ({exc.strerror or exc})"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (nothing listens on that port)"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__


async def _check(ep: Endpoint, timeout: float) -> Unreachable | None:
    url = redact_url(ep.base_url)
    addr = _address(ep.base_url)
    if addr is None:
        return Unreachable(ep.name, url, "base_url has no host")
    try:
        _reader, writer = await asyncio.wait_for(asyncio.open_connection(*addr), timeout)
    except (OSError, TimeoutError) as exc:
        return Unreachable(ep.name, url, _cause(exc))
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return None


async def unreachable(endpoints: Sequence[Endpoint],
                      timeout: float = CHECK_TIMEOUT_S) -> list[Unreachable]:
    """The endpoints (checked together) no connection could be opened to."""
    found = await asyncio.gather(*(_check(ep, timeout) for ep in endpoints))
    return [u for u in found if u is not None]


def check(endpoints: Sequence[Endpoint], timeout: float = CHECK_TIMEOUT_S) -> list[Unreachable]:
    """:func:`unreachable`, from synchronous code (the CLI before a worker starts)."""
    return asyncio.run(unreachable(endpoints, timeout))
