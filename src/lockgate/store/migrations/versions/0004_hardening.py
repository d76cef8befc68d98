"""Hardening: room for every registry version name in a trace, run items that point at
their own task rows, and batches that know whether their submit completed.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

from lockgate.store.migrations import steps

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    if not sqlite:  # SQLite does not enforce lengths: no table rewrite for nothing
        # ``name@N`` of a 191-character prompt name did not fit in VARCHAR(191).
        op.alter_column("task_attempt", "prompt_version", type_=sa.String(255),
                        existing_type=sa.String(191))
    steps.add_columns("prompt_run_item", sa.Column("task_pk", sa.BigInteger))
    # Items materialised before this revision: their task is the one with their id in
    # their run's batch.
    op.execute(
        "UPDATE prompt_run_item SET task_pk = (SELECT t.id FROM task t JOIN prompt_run r "
        "ON r.batch_id = t.batch_id WHERE t.task_id = prompt_run_item.task_id "
        "AND r.id = prompt_run_item.run_id)")
    # 0 while a submit is writing the batch's tasks; 1 once it has written them all.
    steps.add_columns("batch", sa.Column("complete", sa.Integer, nullable=False,
                                         server_default="1"))


def downgrade() -> None:
    with op.batch_alter_table("batch") as batch:
        batch.drop_column("complete")
    with op.batch_alter_table("prompt_run_item") as batch:
        batch.drop_column("task_pk")
    if op.get_bind().dialect.name != "sqlite":
        op.alter_column("task_attempt", "prompt_version", type_=sa.String(191),
                        existing_type=sa.String(255))
