"""Alembic environment: lockgate runs migrations programmatically on a given connection."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from alembic import context
from alembic.runtime.migration import MigrationContext, MigrationInfo

from lockgate.store.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only reached when run by the alembic CLI
    raise RuntimeError("run migrations through `lockgate init` (lockgate.store.migrate)")

# Where the run stands, for Store.migrate to name the revision a failure stopped: the
# revision the database was at, then each revision applied (in the run's transaction).
progress: dict[str, Any] = context.config.attributes


def _applied(ctx: MigrationContext, step: MigrationInfo, heads: Collection[Any],
             run_args: Mapping[str, Any]) -> None:
    progress["applied"] = step.up_revision_id


context.configure(connection=connection, target_metadata=metadata,
                  render_as_batch=connection.dialect.name == "sqlite",
                  on_version_apply=_applied)
progress["start"] = context.get_context().get_current_revision()
with context.begin_transaction():
    context.run_migrations()
