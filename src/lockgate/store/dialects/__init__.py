"""Everything that differs between SQLite, PostgreSQL and MySQL/MariaDB, in one place.

Above this module the store is dialect-free. Each :class:`Dialect` knows its clock
expression, how to claim a batch (``FOR UPDATE SKIP LOCKED`` or SQLite's serialised
writer), how to insert ignoring duplicates, how to apply a batch of fenced write-backs
in one statement, and how to serialise migrations across processes.
"""

from __future__ import annotations

from lockgate.errors import ConfigError
from lockgate.store.dialects.base import Dialect, NewTaskValues
from lockgate.store.dialects.mysql import MySQLDialect
from lockgate.store.dialects.postgres import PostgresDialect
from lockgate.store.dialects.sqlite import SQLiteDialect


def dialect_for(name: str) -> Dialect:
    """The :class:`Dialect` for a SQLAlchemy dialect name."""
    if name == "sqlite":
        return SQLiteDialect()
    if name == "postgresql":
        return PostgresDialect()
    if name in ("mysql", "mariadb"):
        return MySQLDialect()
    raise ConfigError(f"unsupported database '{name}': use sqlite, postgresql or mysql/mariadb")


__all__ = ["Dialect", "MySQLDialect", "NewTaskValues",
           "PostgresDialect", "SQLiteDialect", "dialect_for"]
