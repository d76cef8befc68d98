"""A/B tests of prompt versions (table ``experiment``, see store/schema.py): a candidate
version takes a share of the traffic that follows the live version, for a time, and is
then promoted or kept out (docs/quality.md "A/B tests").

A new table only: nothing already there is rewritten or locked. ``running`` holds the
prompt's id while the experiment runs and NULL after, so a UNIQUE index keeps one
running experiment per prompt and is the worker's lookup.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

from lockgate.store.migrations import steps

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    steps.create_table(
        "experiment",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("prompt_id", sa.BigInteger, nullable=False),
        sa.Column("control_version", sa.Integer, nullable=False),
        sa.Column("candidate_version", sa.Integer, nullable=False),
        sa.Column("share_bp", sa.Integer, nullable=False),
        sa.Column("status", sa.String(12), nullable=False),
        sa.Column("running", sa.BigInteger),
        sa.Column("started_at", sa.BigInteger, nullable=False),
        sa.Column("ends_at", sa.BigInteger, nullable=False),
        sa.Column("concluded_at", sa.BigInteger),
        sa.Column("decision", sa.Text),
        sa.Column("actor", sa.String(200)),
        sa.Column("reason", sa.Text),
        sa.UniqueConstraint("running", name="uq_experiment_running"),
        mysql_charset="utf8mb4", mysql_collate="utf8mb4_bin",
    )
    steps.create_index("ix_experiment_prompt", "experiment", ["prompt_id", "id"])


def downgrade() -> None:
    op.drop_table("experiment")
