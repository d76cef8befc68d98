"""Quality rollups: per prompt version, model and endpoint, per minute, hour and day
(table ``quality_rollup``, see store/schema.py).

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

from lockgate.store.migrations import steps

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

KEY = 191
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _count(name: str) -> sa.Column:
    return sa.Column(name, sa.BigInteger, nullable=False, server_default="0")


def upgrade() -> None:
    steps.create_table(
        "quality_rollup",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("resolution", sa.String(1), nullable=False),
        sa.Column("bucket", sa.BigInteger, nullable=False),
        sa.Column("prompt", sa.String(KEY), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("endpoint", sa.String(100), nullable=False),
        sa.Column("shard", sa.String(64), nullable=False),
        *(_count(n) for n in ("attempts", "tasks", "calls", "retries", "discarded",
                              "fallbacks", "parsed", "conforming")),
        sa.Column("completeness_sum", sa.Double, nullable=False, server_default="0"),
        _count("completeness_n"),
        sa.Column("latency_sum", sa.Double, nullable=False, server_default="0"),
        sa.Column("latency_sketch", sa.Text),
        _count("input_tokens"),
        _count("output_tokens"),
        sa.Column("cost", sa.Double),
        _count("watch_n"),
        sa.Column("watched", sa.Text),
        sa.Column("parse_mix", sa.Text),
        sa.Column("error_mix", sa.Text),
        sa.Column("outcomes", sa.Text),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("resolution", "bucket", "prompt", "model", "endpoint", "shard",
                            name="uq_quality_rollup"),
    )
    steps.create_index("ix_quality_rollup_prompt", "quality_rollup",
                    ["resolution", "prompt", "bucket"])


def downgrade() -> None:
    op.drop_index("ix_quality_rollup_prompt", "quality_rollup")
    op.drop_table("quality_rollup")
