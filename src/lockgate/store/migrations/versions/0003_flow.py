"""Flow control: shared rate-limit buckets, pools, batch weights and windows, the
endpoint that answered an attempt, and per-worker concurrency metrics.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

from lockgate.store.migrations import steps

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

KEY = 191


def upgrade() -> None:
    steps.create_table(
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
    steps.add_columns("task", sa.Column("pool", sa.String(100), nullable=False,
                                        server_default="default"))
    steps.create_index("ix_task_lane", "task", ["pool", "status", "batch_id", "visible_at"])
    steps.add_columns(
        "batch",
        sa.Column("base_weight", sa.Double, nullable=False, server_default="1"),
        sa.Column("deadline_at", sa.BigInteger),
        sa.Column("window_start", sa.BigInteger),
        sa.Column("window_end", sa.BigInteger),
        sa.Column("target_per_s", sa.Double),
    )
    steps.add_columns("task_attempt", sa.Column("routed_from", sa.String(100)))
    steps.add_columns(
        "worker",
        sa.Column("pool", sa.String(100)),
        sa.Column("concurrency_limit", sa.Integer),
        sa.Column("latency_ms", sa.Double),
        sa.Column("failure_rate", sa.Double),
        sa.Column("flow", sa.Text),
    )


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
