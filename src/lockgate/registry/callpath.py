"""The identity of the production call path, frozen into every release-gate snapshot
(the execution-path version of an evaluation): the lockgate version and the settings
that shape a call's outcome, without a secret."""

from __future__ import annotations

import hashlib
from importlib import metadata
from typing import Any

from lockgate.config import Settings
from lockgate.redact import without_credentials
from lockgate.spec import canonical_json

_FALLBACK_VERSION = "0+unknown"


def lockgate_version() -> str:
    """The installed lockgate version."""
    try:
        return metadata.version("lockgate")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare tree
        return _FALLBACK_VERSION


def runtime_settings(settings: Settings) -> dict[str, Any]:
    """The settings that shape a call's outcome: endpoints and routing. Never a secret:
    no API key, and base URLs without user, password or query string."""
    return {
        "default_endpoint": settings.default_endpoint,
        "endpoints": [{"name": e.name, "base_url": without_credentials(e.base_url),
                       "model": e.model,
                       "models": list(e.models), "timeout_s": e.timeout_s,
                       "supports_top_k": e.supports_top_k} for e in settings.endpoints()],
    }


def execution_path(settings: Settings) -> dict[str, Any]:
    """The execution-path version frozen into a snapshot."""
    doc = runtime_settings(settings)
    return {"lockgate": lockgate_version(), "settings": doc,
            "settings_hash": hashlib.sha256(canonical_json(doc)).hexdigest()}


