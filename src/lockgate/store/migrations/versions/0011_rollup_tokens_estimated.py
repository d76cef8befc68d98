"""Quality rollups keep the input tokens of calls whose provider reported no usage, as
lockgate estimated them (column ``input_tokens_or_estimate`` of ``quality_rollup``): the
performance rule compares latency at equal input size, and an endpoint that never
reports usage (some gateways, local servers) left it nothing to compare.

One column with a default: rows already there read 0 (no estimate kept for them).

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

from lockgate.store.migrations import steps

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    steps.add_columns("quality_rollup", sa.Column(
        "input_tokens_or_estimate", sa.BigInteger, nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("quality_rollup") as batch:
        batch.drop_column("input_tokens_or_estimate")
