"""Alembic environment: lockgate runs migrations programmatically on a given connection."""

from __future__ import annotations

from alembic import context

from lockgate.store.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only reached when run by the alembic CLI
    raise RuntimeError("run migrations through `lockgate init` (lockgate.store.migrate)")

context.configure(connection=connection, target_metadata=metadata,
                  render_as_batch=connection.dialect.name == "sqlite")
with context.begin_transaction():
    context.run_migrations()
