"""MySQL/MariaDB: every table in utf8mb4_bin, so identifiers compare as they do on
PostgreSQL and SQLite. Under a server's default collation (utf8mb4_general_ci, or
MySQL 8's utf8mb4_0900_ai_ci) task ids, batch ids, prompt names, labels and rollup keys
that differ only in case or accents ("Doc-1" and "doc-1", "café" and "cafe") were one
value: the unique index took the second task of a file for the first, already present,
and skipped it. Other databases: nothing to do.

Each table is rebuilt (ALTER TABLE ... CONVERT TO), which takes a while on a large
``task`` or ``task_attempt``, under ``LOCK=SHARED``: writers wait for the rebuild of their
table, readers go on. Without it MariaDB 10.11 rebuilt
``task`` online, applying the writes made meanwhile, and workers writing to it then
left its secondary indexes corrupted (ERROR 1712 "Index task is corrupted"; repaired by
``ALTER TABLE task FORCE`` with the workers stopped). A table added by a later migration
names the same collation (``mysql_charset="utf8mb4", mysql_collate="utf8mb4_bin"``).
A table converted already is converted again at no harm, so a run stopped part way is
finished by the next.

Revision ID: 0009
Revises: 0008
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

#: lockgate's tables at this revision.
TABLES = (
    "task_config", "batch", "task", "task_attempt", "worker", "prompt", "prompt_version",
    "prompt_label", "prompt_audit", "dataset", "dataset_item", "prompt_dataset",
    "prompt_update", "prompt_run", "prompt_run_item", "rate_limit", "quality_rollup",
    "role_lease", "quality_alert", "quality_alert_sample", "alert_delivery",
    "quality_circuit", "quality_circuit_event",
)


def _convert(collation: str) -> None:
    # The context's dialect, not the connection's: the SQL can be rendered offline too.
    if op.get_context().dialect.name not in ("mysql", "mariadb"):
        return
    for table in TABLES:
        # LOCK=SHARED (MariaDB >= 10.0, MySQL >= 5.6): no online rebuild under writes.
        op.execute(f"ALTER TABLE {table} CONVERT TO CHARACTER SET utf8mb4 "
                   f"COLLATE {collation}, LOCK=SHARED")


def upgrade() -> None:
    _convert("utf8mb4_bin")


def downgrade() -> None:
    # Fails where two rows now differ only in case or accents (the unique index of the
    # old collation cannot hold both).
    _convert("utf8mb4_general_ci")
