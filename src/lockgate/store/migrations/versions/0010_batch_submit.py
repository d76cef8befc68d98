"""Submits under way per batch (table ``batch_submit``, see store/schema.py): a batch is
complete when none of the submits that wrote to it is left unfinished, so one finished
submit no longer marks complete a batch another, interrupted, submit was writing.

A new table only: nothing already there is rewritten or locked.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

from lockgate.store.migrations import steps

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

KEY = 191


def upgrade() -> None:
    steps.create_table(
        "batch_submit",
        sa.Column("batch_id", sa.String(KEY), primary_key=True),
        sa.Column("submit_key", sa.String(64), primary_key=True),
        sa.Column("source", sa.String(1000)),
        sa.Column("host", sa.String(255)),
        sa.Column("started_at", sa.BigInteger, nullable=False),
        mysql_charset="utf8mb4", mysql_collate="utf8mb4_bin",
    )


def downgrade() -> None:
    op.drop_table("batch_submit")
