"""Flow control: shared rate-limit buckets, pools, batch weights and windows, the
endpoint that answered an attempt, and per-worker concurrency metrics.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

KEY = 191


def upgrade() -> None:
    op.create_table(
        "rate_limit",
        sa.Column("name", sa.String(KEY), primary_key=True),
        sa.Column("kind", sa.String(12), nullable=False),
        sa.Column("rpm", sa.Double),
        sa.Column("tpm", sa.Double),
        sa.Column("window_ms", sa.BigInteger, nullable=False),
        sa.Column("learned_rpm", sa.Double),
        sa.Column("learned_tpm", sa.Double),
        sa.Column("req_allowance", sa.Double, nullable=False, server_default="0"),
        sa.Column("tok_allowance", sa.Double, nullable=False, server_default="0"),
        sa.Column("refilled_at", sa.BigInteger, nullable=False),
        sa.Column("paused_until", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("pause_reason", sa.String(32)),
        sa.Column("granted_requests", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("granted_tokens", sa.Double, nullable=False, server_default="0"),
        sa.Column("paced_at", sa.BigInteger),
        sa.Column("rate_factor", sa.Double, nullable=False, server_default="1"),
        sa.Column("cut_at", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
        sa.Column("version", sa.Integer, nullable=False, server_default="0"),
    )
    with op.batch_alter_table("task") as batch:
        batch.add_column(sa.Column("pool", sa.String(100), nullable=False,
                                   server_default="default"))
    op.create_index("ix_task_lane", "task", ["pool", "status", "batch_id", "visible_at"])
    with op.batch_alter_table("batch") as batch:
        batch.add_column(sa.Column("base_weight", sa.Double, nullable=False,
                                   server_default="1"))
        batch.add_column(sa.Column("deadline_at", sa.BigInteger))
        batch.add_column(sa.Column("window_start", sa.BigInteger))
        batch.add_column(sa.Column("window_end", sa.BigInteger))
        batch.add_column(sa.Column("target_per_s", sa.Double))
    with op.batch_alter_table("task_attempt") as batch:
        batch.add_column(sa.Column("routed_from", sa.String(100)))
    with op.batch_alter_table("worker") as batch:
        batch.add_column(sa.Column("pool", sa.String(100)))
        batch.add_column(sa.Column("concurrency_limit", sa.Integer))
        batch.add_column(sa.Column("latency_ms", sa.Double))
        batch.add_column(sa.Column("failure_rate", sa.Double))
        batch.add_column(sa.Column("flow", sa.Text))


def downgrade() -> None:
    with op.batch_alter_table("worker") as batch:
        for name in ("flow", "failure_rate", "latency_ms", "concurrency_limit", "pool"):
            batch.drop_column(name)
    with op.batch_alter_table("task_attempt") as batch:
        batch.drop_column("routed_from")
    with op.batch_alter_table("batch") as batch:
        for name in ("target_per_s", "window_end", "window_start", "deadline_at",
                     "base_weight"):
            batch.drop_column(name)
    op.drop_index("ix_task_lane", table_name="task")
    with op.batch_alter_table("task") as batch:
        batch.drop_column("pool")
    op.drop_table("rate_limit")
