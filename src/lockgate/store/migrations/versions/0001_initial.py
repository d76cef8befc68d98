"""Initial schema: task configs, batches, tasks, attempts, workers.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from lockgate.store.migrations import steps

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

LongText = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    steps.create_table(
        "task_config",
        sa.Column("hash", sa.String(64), primary_key=True),
        sa.Column("document", LongText, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
    )
    steps.create_table(
        "batch",
        sa.Column("id", sa.String(191), primary_key=True),
        sa.Column("source", sa.String(1000)),
        sa.Column("created_at", sa.BigInteger, nullable=False),
    )
    steps.create_table(
        "task",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("task_id", sa.String(191), nullable=False, unique=True),
        sa.Column("batch_id", sa.String(191), nullable=False),
        sa.Column("config_hash", sa.String(64), nullable=False),
        sa.Column("input_data", LongText, nullable=False),
        sa.Column("metadata", LongText),
        sa.Column("priority", sa.Integer, nullable=False, server_default="0"),
        sa.Column("status", sa.String(12), nullable=False),
        sa.Column("visible_at", sa.BigInteger, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("lease_token", sa.String(32)),
        sa.Column("leased_by", sa.String(64)),
        sa.Column("version", sa.Integer, nullable=False, server_default="0"),
        sa.Column("result", LongText),
        sa.Column("parse_status", sa.String(24)),
        sa.Column("error_class", sa.String(32)),
        sa.Column("error_message", sa.Text),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
        sa.Column("finished_at", sa.BigInteger),
    )
    steps.create_index("ix_task_claim", "task", ["status", "visible_at"])
    steps.create_index("ix_task_batch_status", "task", ["batch_id", "status"])
    steps.create_table(
        "task_attempt",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("task_pk", sa.BigInteger, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("worker_id", sa.String(64), nullable=False),
        sa.Column("lease_token", sa.String(32), nullable=False),
        sa.Column("outcome", sa.String(12), nullable=False),
        sa.Column("started_at", sa.BigInteger, nullable=False),
        sa.Column("latency_ms", sa.Float),
        sa.Column("endpoint", sa.String(100)),
        sa.Column("model", sa.String(200)),
        sa.Column("prompt_sha256", sa.String(64)),
        sa.Column("prompt_snapshot", LongText),
        sa.Column("token_estimator", sa.String(32)),
        sa.Column("estimated_tokens", sa.Integer),
        sa.Column("input_tokens", sa.Integer),
        sa.Column("output_tokens", sa.Integer),
        sa.Column("http_status", sa.Integer),
        sa.Column("raw_output", LongText),
        sa.Column("parse_status", sa.String(24)),
        sa.Column("fixes", sa.Text),
        sa.Column("completeness", sa.Float),
        sa.Column("error_class", sa.String(32)),
        sa.Column("error_message", sa.Text),
    )
    steps.create_index("ix_task_attempt_task", "task_attempt", ["task_pk", "attempt"])
    steps.create_table(
        "worker",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("hostname", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer, nullable=False),
        sa.Column("status", sa.String(12), nullable=False),
        sa.Column("started_at", sa.BigInteger, nullable=False),
        sa.Column("heartbeat_at", sa.BigInteger, nullable=False),
        sa.Column("stopped_at", sa.BigInteger),
        sa.Column("concurrency", sa.Integer, nullable=False, server_default="0"),
        sa.Column("in_flight", sa.Integer, nullable=False, server_default="0"),
        sa.Column("claimed", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("succeeded", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("failed", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("retried", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("discarded", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("conflicts", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("version", sa.Integer, nullable=False, server_default="0"),
    )


def downgrade() -> None:
    for name in ("worker", "task_attempt", "task", "batch", "task_config"):
        op.drop_table(name)
