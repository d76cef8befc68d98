"""Schema steps that may run again over their own work, used by every migration.

MySQL and MariaDB commit each schema statement at once (their DDL is not transactional):
a migration stopped part way (``kill -9`` of ``lockgate init`` or of a worker upgrading
on its first start, a lost connection) leaves the tables, indexes and columns it made so
far, and ``alembic_version`` at the revision before. The next run starts that revision
again from its first step; each step here skips what is already there, so the run
finishes the revision. On PostgreSQL and SQLite a stopped migration leaves nothing, and
these steps do what alembic's own operations do.

What a step cannot finish (a table of the name it makes but with other columns: not one
it made) raises :class:`~lockgate.errors.ConfigError`, which ``Store.migrate`` words
with the revision. Statements that can simply run again (``UPDATE`` backfills, a column
widened, a table converted to another collation) need no step of their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.schema import SchemaItem

from lockgate.errors import ConfigError


def _inspector() -> sa.Inspector:
    # A new one at each step: an inspector caches what it has read, and steps change it.
    return sa.inspect(op.get_bind())


def create_table(name: str, *items: SchemaItem, **kw: Any) -> None:
    """``op.create_table``, unless a table ``name`` with the same columns is there (a
    run of this revision made it: one statement makes a table whole)."""
    inspector = _inspector()
    if not inspector.has_table(name):
        op.create_table(name, *items, **kw)
        return
    have = {c["name"] for c in inspector.get_columns(name)}
    want = {item.name for item in items if isinstance(item, sa.Column)}
    if have != want:
        raise ConfigError(
            f"a table {name} is there already with other columns than this revision makes "
            f"(it has {', '.join(sorted(have - want)) or 'none of its own'}, lacks "
            f"{', '.join(sorted(want - have)) or 'none'}): not made by lockgate; rename or "
            "drop it")


def create_index(name: str, table: str, columns: Sequence[str], **kw: Any) -> None:
    """``op.create_index``, unless ``table`` has an index ``name`` already."""
    if name in {ix["name"] for ix in _inspector().get_indexes(table)}:
        return
    op.create_index(name, table, list(columns), **kw)


def add_columns(table: str, *columns: sa.Column[Any]) -> None:
    """Add to ``table`` those of ``columns`` it lacks (in a batch: SQLite rewrites a
    table where ALTER TABLE cannot do the change)."""
    have = {c["name"] for c in _inspector().get_columns(table)}
    missing = [c for c in columns if c.name not in have]
    if not missing:
        return
    with op.batch_alter_table(table) as batch:
        for column in missing:
            batch.add_column(column)
