"""Quality alerts: the evaluator's role lease, alerts, their failing samples and the
webhook outbox (tables ``role_lease``, ``quality_alert``, ``quality_alert_sample``,
``alert_delivery``, see store/schema.py), and an index on ``task_attempt`` by prompt
version and start time (the samples' bounded reads).

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from lockgate.store.migrations import steps

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

KEY = 191
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
LongText = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def upgrade() -> None:
    steps.create_table(
        "role_lease",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("holder", sa.String(64)),
        sa.Column("token", sa.String(32)),
        sa.Column("lease_until", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("acquired_at", sa.BigInteger),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
    )
    steps.create_table(
        "quality_alert",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("alert_key", sa.String(64), nullable=False),
        sa.Column("open_key", sa.String(64)),
        sa.Column("rule", sa.String(32), nullable=False),
        sa.Column("prompt", sa.String(KEY), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("subject", sa.String(KEY)),
        sa.Column("status", sa.String(12), nullable=False),
        sa.Column("window_s", sa.Double, nullable=False),
        sa.Column("value", sa.Double, nullable=False),
        sa.Column("baseline", sa.Double),
        sa.Column("threshold", sa.Double, nullable=False),
        sa.Column("calls", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("tasks", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("batches", sa.Integer, nullable=False, server_default="0"),
        sa.Column("batches_exact", sa.Integer, nullable=False, server_default="1"),
        sa.Column("onset_at", sa.BigInteger, nullable=False),
        sa.Column("opened_at", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
        sa.Column("notified_at", sa.BigInteger, nullable=False),
        sa.Column("resolved_at", sa.BigInteger),
        sa.Column("acked_at", sa.BigInteger),
        sa.Column("acked_by", sa.String(200)),
        sa.Column("ack_reason", sa.Text),
        sa.Column("version", sa.Integer, nullable=False, server_default="0"),
        sa.UniqueConstraint("open_key", name="uq_quality_alert_open"),
    )
    steps.create_index("ix_quality_alert_key", "quality_alert", ["alert_key", "resolved_at"])
    steps.create_index("ix_quality_alert_status", "quality_alert", ["status", "id"])
    steps.create_table(
        "quality_alert_sample",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("alert_id", sa.BigInteger, nullable=False),
        sa.Column("attempt_id", sa.BigInteger, nullable=False),
        sa.Column("task_id", sa.String(KEY), nullable=False),
        sa.Column("batch_id", sa.String(KEY), nullable=False),
        sa.Column("started_at", sa.BigInteger, nullable=False),
        sa.Column("latency_ms", sa.Float),
        sa.Column("endpoint", sa.String(100)),
        sa.Column("parse_status", sa.String(24)),
        sa.Column("completeness", sa.Float),
        sa.Column("error_class", sa.String(32)),
        sa.Column("error_message", sa.Text),
        sa.Column("prompt_snapshot", LongText),
        sa.Column("raw_output", LongText),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("alert_id", "attempt_id", name="uq_quality_alert_sample"),
    )
    steps.create_table(
        "alert_delivery",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("delivery_id", sa.String(32), nullable=False),
        sa.Column("alert_id", sa.BigInteger, nullable=False),
        sa.Column("event", sa.String(12), nullable=False),
        sa.Column("target", sa.String(100), nullable=False),
        sa.Column("body", LongText, nullable=False),
        sa.Column("status", sa.String(12), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_at", sa.BigInteger, nullable=False),
        sa.Column("lease_token", sa.String(32)),
        sa.Column("last_error", sa.Text),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("delivered_at", sa.BigInteger),
        sa.UniqueConstraint("delivery_id", name="uq_alert_delivery_id"),
    )
    steps.create_index("ix_alert_delivery_due", "alert_delivery", ["status", "next_at"])
    steps.create_index("ix_task_attempt_version", "task_attempt",
                    ["prompt_version", "started_at"],
                    mysql_length={"prompt_version": KEY},
                    mariadb_length={"prompt_version": KEY})


def downgrade() -> None:
    op.drop_index("ix_task_attempt_version", "task_attempt")
    op.drop_index("ix_alert_delivery_due", "alert_delivery")
    op.drop_table("alert_delivery")
    op.drop_table("quality_alert_sample")
    op.drop_index("ix_quality_alert_status", "quality_alert")
    op.drop_index("ix_quality_alert_key", "quality_alert")
    op.drop_table("quality_alert")
    op.drop_table("role_lease")
