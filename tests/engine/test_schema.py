"""The migrations build exactly the tables the code declares (store/schema.py), on every
backend: a column added to one and not the other fails here, not in production."""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from lockgate.store import Store, schema


def _differences(store: Store) -> list[Any]:
    with store.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True,
                                                     "compare_server_default": False})
        diffs = compare_metadata(ctx, schema.metadata)
    if store.dialect.name == "sqlite":
        # SQLite keeps a column's declared length but never enforces it: 0004 widened
        # task_attempt.prompt_version elsewhere and left SQLite's alone.
        diffs = [d for d in diffs if not (
            isinstance(d, list) and d and d[0][0] == "modify_type"
            and d[0][2:4] == ("task_attempt", "prompt_version"))]
    return diffs


def test_the_migrated_schema_is_the_declared_one(store: Store) -> None:
    assert _differences(store) == []
