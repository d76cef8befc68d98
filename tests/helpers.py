"""Read-only SQL helpers shared by the test packages (``from queries import rows``)."""

from __future__ import annotations

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
