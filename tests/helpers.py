"""Helpers shared by the test packages (``from helpers import rows, wait_for``): read-only
SQL, polling, and a clean environment for subprocesses."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import text

from lockgate.store import Store


def rows(store: Store, sql: str, **params: Any) -> list[dict[str, Any]]:
    """Rows of a read-only query as dicts."""
    with store.engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text(sql), params)]


def scalar(store: Store, sql: str, **params: Any) -> Any:
    """The single value of a read-only query."""
    with store.engine.connect() as conn:
        return conn.execute(text(sql), params).scalar()


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 30.0,
             interval: float = 0.02) -> Any:
    """Poll until ``predicate()`` is truthy and return its value; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for: {what}")
        time.sleep(interval)


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without any LOCKGATE_* setting, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOCKGATE_")}
    env.update(extra)
    return env
