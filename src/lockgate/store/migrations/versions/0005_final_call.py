"""The call that ended a task's last claim, on the task row: the model that answered, its
usage and latency, the HTTP status, the provider's request id and response body (results
and exports read them without joining the attempts); the request id on every attempt.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from lockgate.store.migrations import steps

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

LongText = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")


def upgrade() -> None:
    steps.add_columns(
        "task",
        sa.Column("model", sa.String(200)),
        sa.Column("input_tokens", sa.Integer),
        sa.Column("output_tokens", sa.Integer),
        sa.Column("latency_ms", sa.Float),
        sa.Column("http_status", sa.Integer),
        sa.Column("request_id", sa.String(128)),
        sa.Column("response", LongText),
    )
    steps.add_columns("task_attempt", sa.Column("request_id", sa.String(128)))
    # Tasks finished before this revision: the figures of their succeeded attempt.
    op.execute(
        "UPDATE task SET model = (SELECT a.model FROM task_attempt a WHERE a.task_pk = "
        "task.id AND a.outcome = 'succeeded' ORDER BY a.id DESC LIMIT 1), "
        "input_tokens = (SELECT a.input_tokens FROM task_attempt a WHERE a.task_pk = "
        "task.id AND a.outcome = 'succeeded' ORDER BY a.id DESC LIMIT 1), "
        "output_tokens = (SELECT a.output_tokens FROM task_attempt a WHERE a.task_pk = "
        "task.id AND a.outcome = 'succeeded' ORDER BY a.id DESC LIMIT 1), "
        "latency_ms = (SELECT a.latency_ms FROM task_attempt a WHERE a.task_pk = "
        "task.id AND a.outcome = 'succeeded' ORDER BY a.id DESC LIMIT 1) "
        "WHERE status = 'SUCCEEDED'")


def downgrade() -> None:
    with op.batch_alter_table("task_attempt") as batch:
        batch.drop_column("request_id")
    with op.batch_alter_table("task") as batch:
        for name in ("response", "request_id", "http_status", "latency_ms",
                     "output_tokens", "input_tokens", "model"):
            batch.drop_column(name)
