"""Whether endpoints can be reached at all, checked when a worker starts (docs/flow.md,
"When an endpoint is down").

A TCP connection to each endpoint's host and port, as the HTTP client would open it,
and for an ``https://`` base_url the TLS handshake too: no request is sent, so no key,
no model and no cost are involved, and a provider that answers every request with an
error still counts as reachable (its errors are the breaker's business once calls run).
What is reported is why a connection could not be opened: the name does not resolve,
nothing listens, no answer in time, the port does not speak TLS (``https://`` to a
plain-HTTP port), the certificate is not trusted.

An endpoint the HTTP clients reach through a proxy (``HTTP_PROXY``, ``HTTPS_PROXY``,
not bypassed by ``NO_PROXY``) is checked by a connection to its proxy: the endpoint's
own host may not resolve from here at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from lockgate.config import Endpoint
from lockgate.providers.environment import proxy_for
from lockgate.providers.openai import tls_fix
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


def _tls_cause(exc: BaseException, timeout: float) -> str:
    """Why a TLS handshake failed, naming the fix."""
    if isinstance(exc, TimeoutError) or "taking longer" in str(exc):
        return (f"the TLS handshake got no answer within {timeout:g} s: the port may "
                "speak plain HTTP (use http:// in base_url) or not be the https port")
    said = f"{type(exc).__name__}: {exc}"
    fix = tls_fix(said)
    if fix is None and isinstance(exc, ConnectionError | ssl.SSLError):
        # a plain-HTTP server meets the ClientHello by closing or resetting
        fix = ("the TLS handshake failed: the port may speak plain HTTP (use http:// in "
               "base_url)")
    return f"{fix} ({said})" if fix else f"the TLS handshake failed ({said})"


async def _check(ep: Endpoint, timeout: float) -> Unreachable | None:
    url = redact_url(ep.base_url)
    addr = _address(ep.base_url)
    if addr is None:
        return Unreachable(ep.name, url, "base_url has no host")
    proxy = proxy_for(ep.base_url)
    if proxy is not None:  # what the clients connect to; TLS goes through it
        at = _address(proxy)
        scheme = urlsplit(ep.base_url).scheme.upper()
        if at is None:
            return Unreachable(ep.name, url, f"its proxy ({scheme}_PROXY = "
                               f"{redact_url(proxy)}) names no host")
        addr = at
    try:
        _reader, writer = await asyncio.wait_for(asyncio.open_connection(*addr), timeout)
    except (OSError, TimeoutError) as exc:
        if proxy is not None:
            return Unreachable(ep.name, url, f"its proxy {redact_url(proxy)} (from "
                               f"{scheme}_PROXY) is unreachable: {_cause(exc)}")
        return Unreachable(ep.name, url, _cause(exc))
    try:
        if proxy is None and urlsplit(ep.base_url).scheme == "https":
            await writer.start_tls(ssl.create_default_context(), server_hostname=addr[0],
                                   ssl_handshake_timeout=timeout)
    except (OSError, TimeoutError) as exc:
        return Unreachable(ep.name, url, _tls_cause(exc, timeout))
    finally:
        writer.close()
        with contextlib.suppress(OSError, TimeoutError):
            await asyncio.wait_for(writer.wait_closed(), timeout)
    return None


async def unreachable(endpoints: Sequence[Endpoint],
                      timeout: float = CHECK_TIMEOUT_S) -> list[Unreachable]:
    """The endpoints (checked together) no connection could be opened to."""
    found = await asyncio.gather(*(_check(ep, timeout) for ep in endpoints))
    return [u for u in found if u is not None]


def check(endpoints: Sequence[Endpoint], timeout: float = CHECK_TIMEOUT_S) -> list[Unreachable]:
    """:func:`unreachable`, from synchronous code (the CLI before a worker starts)."""
    return asyncio.run(unreachable(endpoints, timeout))
