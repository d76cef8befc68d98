"""The migrations build exactly the tables the code declares (store/schema.py), on every
backend: a column added to one and not the other fails here, not in production."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect

import lockgate.store.store
from lockgate.store import Store, schema
from lockgate.store.store import SCHEMA_HEAD


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


def test_the_declared_head_is_the_migrations_head() -> None:
    """A database at SCHEMA_HEAD is not migrated (alembic is not even loaded): a new
    migration must move it."""
    migrations = Path(lockgate.store.store.__file__).parent / "migrations"
    assert ScriptDirectory(str(migrations)).get_current_head() == SCHEMA_HEAD


def test_a_database_at_the_head_is_left_alone_and_an_older_one_upgraded(
        fresh_db_url: str) -> None:
    store = Store(fresh_db_url)
    try:
        store.migrate()
        with store.engine.begin() as conn:  # back to 0007: 0008's tables gone
            conn.exec_driver_sql("DROP TABLE quality_circuit_event")
            conn.exec_driver_sql("DROP TABLE quality_circuit")
            conn.exec_driver_sql("UPDATE alembic_version SET version_num = '0007'")
        store.migrate()
        assert store._revision() == SCHEMA_HEAD
        assert inspect(store.engine).has_table("quality_circuit")
        store.migrate()  # at the head: one read, nothing done
        assert store._revision() == SCHEMA_HEAD
    finally:
        store.close()


def test_every_text_column_compares_case_and_accents_on_mysql(store: Store) -> None:
    """Under MySQL's default collations "Doc-1" and "doc-1" (and "café", "cafe") are
    one value: the second task of a file was skipped as already present."""
    if store.dialect.name != "mysql":
        pytest.skip("a collation question of MySQL/MariaDB only")
    with store.engine.connect() as conn:
        loose = conn.exec_driver_sql(
            "SELECT table_name, column_name, collation_name FROM information_schema.columns "
            "WHERE table_schema = DATABASE() AND collation_name IS NOT NULL "
            "AND collation_name <> 'utf8mb4_bin' AND table_name <> 'alembic_version'"
        ).all()
    assert loose == []
