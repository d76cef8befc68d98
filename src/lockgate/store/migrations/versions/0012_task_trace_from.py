"""A task run again by hand (``lockgate tasks retry``) remembers where its new run's
trace starts (column ``trace_from`` of ``task``: the last ``task_attempt`` id before
the retry). Its retry budget counts only the attempts after it: the earlier run's
retries, still in the trace, made a claim lost with a crashed worker count as a spent
retry.

One nullable column: rows already there read NULL (their whole trace is the run).

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

from lockgate.store.migrations import steps

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    steps.add_columns("task", sa.Column("trace_from", sa.BigInteger))


def downgrade() -> None:
    with op.batch_alter_table("task") as batch:
        batch.drop_column("trace_from")
