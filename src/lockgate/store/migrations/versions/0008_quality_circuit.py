"""Completeness circuits: their state per prompt path and the history of their moves
(tables ``quality_circuit`` and ``quality_circuit_event``, see store/schema.py).

Revision ID: 0008
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

from lockgate.store.migrations import steps

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

KEY = 191
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    steps.create_table(
        "quality_circuit",
        sa.Column("prompt", sa.String(KEY), primary_key=True),
        sa.Column("state", sa.String(12), nullable=False),
        sa.Column("since", sa.BigInteger, nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("figures", sa.Text),
        sa.Column("manual", sa.Integer, nullable=False, server_default="0"),
        sa.Column("version", sa.Integer, nullable=False, server_default="0"),
        sa.Column("changed_by", sa.String(64)),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
    )
    steps.create_table(
        "quality_circuit_event",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("prompt", sa.String(KEY), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("from_state", sa.String(12), nullable=False),
        sa.Column("to_state", sa.String(12), nullable=False),
        sa.Column("at", sa.BigInteger, nullable=False),
        sa.Column("actor", sa.String(64), nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("figures", sa.Text),
        sa.UniqueConstraint("prompt", "version", name="uq_quality_circuit_event"),
    )


def downgrade() -> None:
    op.drop_table("quality_circuit_event")
    op.drop_table("quality_circuit")
