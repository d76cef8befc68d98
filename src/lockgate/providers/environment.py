"""What the process environment says about reaching an endpoint, read one way for every
part that needs it: the HTTP clients of the calls and the start check (reach.py)."""

from __future__ import annotations

import contextlib
import urllib.request
from urllib.parse import urlsplit


def proxy_for(base_url: str) -> str | None:
    """The proxy requests to ``base_url`` go through, from the environment
    (``HTTP_PROXY`` for http://, ``HTTPS_PROXY`` for https://, either case), as a URL
    with its scheme; None when none is set or ``NO_PROXY`` names the host. A proxy
    written without a scheme (``HTTPS_PROXY=proxy.corp:3128``) is an HTTP proxy, as
    curl, requests and pyreqwest read it (aiohttp's own reading took the host for a
    scheme and failed every call)."""
    parts = urlsplit(base_url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy or not parts.hostname:
        return None
    with contextlib.suppress(Exception):
        if urllib.request.proxy_bypass(parts.hostname):
            return None
    return proxy if "://" in proxy else f"http://{proxy}"
