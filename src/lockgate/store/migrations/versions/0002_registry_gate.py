"""Prompt registry and release gate: prompts, immutable versions, labels, audit trail,
datasets, bindings, candidate updates, evaluation runs and their items; the prompt
version an attempt ran with.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from lockgate.store.migrations import steps

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

LongText = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
KEY = 191


def _id() -> sa.Column:
    return sa.Column("id", BigId, primary_key=True, autoincrement=True)


def upgrade() -> None:
    steps.add_columns("task_attempt", sa.Column("prompt_version", sa.String(KEY)))
    steps.create_table(
        "prompt", _id(),
        sa.Column("name", sa.String(KEY), nullable=False, unique=True),
        sa.Column("live_version", sa.Integer),
        sa.Column("generation", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("submissions", sa.Integer, nullable=False, server_default="0"),
        sa.Column("description", sa.Text),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
    )
    steps.create_table(
        "prompt_version", _id(),
        sa.Column("prompt_id", sa.BigInteger, nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("template", LongText, nullable=False),
        sa.Column("model_config", sa.Text, nullable=False),
        sa.Column("delivery_rule", sa.Text, nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("tag", sa.String(100)),
        sa.Column("author", sa.String(200)),
        sa.Column("note", sa.Text),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("prompt_id", "version", name="uq_prompt_version_number"),
        sa.UniqueConstraint("prompt_id", "content_hash", name="uq_prompt_version_content"),
        sa.UniqueConstraint("prompt_id", "tag", name="uq_prompt_version_tag"),
    )
    steps.create_table(
        "prompt_label",
        sa.Column("prompt_id", sa.BigInteger, nullable=False),
        sa.Column("label", sa.String(64), nullable=False),
        sa.Column("version", sa.Integer, nullable=False),
        sa.Column("updated_by", sa.String(200)),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("prompt_id", "label", name="pk_prompt_label"),
    )
    steps.create_table(
        "prompt_audit", _id(),
        sa.Column("prompt_id", sa.BigInteger, nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("from_version", sa.Integer),
        sa.Column("to_version", sa.Integer),
        sa.Column("label", sa.String(64)),
        sa.Column("update_id", sa.BigInteger),
        sa.Column("generation", sa.BigInteger, nullable=False),
        sa.Column("actor", sa.String(200)),
        sa.Column("reason", sa.Text),
        sa.Column("created_at", sa.BigInteger, nullable=False),
    )
    steps.create_index("ix_prompt_audit_prompt", "prompt_audit", ["prompt_id", "id"])
    steps.create_table(
        "dataset", _id(),
        sa.Column("name", sa.String(KEY), nullable=False, unique=True),
        sa.Column("description", sa.Text),
        sa.Column("source", sa.String(1000)),
        sa.Column("revision", sa.Integer, nullable=False, server_default="0"),
        sa.Column("item_count", sa.Integer, nullable=False, server_default="0"),
        sa.Column("items_hash", sa.String(64), nullable=False),
        sa.Column("input_keys", sa.Text, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
    )
    steps.create_table(
        "dataset_item", _id(),
        sa.Column("dataset_id", sa.BigInteger, nullable=False),
        sa.Column("item_key", sa.String(KEY), nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("input_data", LongText, nullable=False),
        sa.Column("expected", LongText, nullable=False),
        sa.Column("added_rev", sa.Integer, nullable=False),
        sa.Column("retired_rev", sa.Integer),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.UniqueConstraint("dataset_id", "item_key", "added_rev", name="uq_dataset_item_rev"),
    )
    steps.create_index("ix_dataset_item_page", "dataset_item", ["dataset_id", "id"])
    steps.create_table(
        "prompt_dataset", _id(),
        sa.Column("prompt_id", sa.BigInteger, nullable=False),
        sa.Column("dataset_id", sa.BigInteger, nullable=False),
        sa.Column("settings", sa.Text, nullable=False),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
        sa.Column("version", sa.Integer, nullable=False, server_default="0"),
        sa.UniqueConstraint("prompt_id", "dataset_id", name="uq_prompt_dataset"),
    )
    steps.create_table(
        "prompt_update", _id(),
        sa.Column("prompt_id", sa.BigInteger, nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("candidate_version", sa.Integer, nullable=False),
        sa.Column("base_version", sa.Integer),
        sa.Column("base_generation", sa.BigInteger, nullable=False),
        sa.Column("status", sa.String(12), nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("snapshot", LongText, nullable=False),
        sa.Column("snapshot_hash", sa.String(64), nullable=False),
        sa.Column("decision", LongText),
        sa.Column("author", sa.String(200)),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("started_at", sa.BigInteger),
        sa.Column("decided_at", sa.BigInteger),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
        sa.Column("version", sa.Integer, nullable=False, server_default="0"),
        sa.UniqueConstraint("prompt_id", "seq", name="uq_prompt_update_seq"),
    )
    steps.create_index("ix_prompt_update_status", "prompt_update", ["status"])
    steps.create_table(
        "prompt_run", _id(),
        sa.Column("update_id", sa.BigInteger, nullable=False),
        sa.Column("dataset_id", sa.BigInteger, nullable=False),
        sa.Column("dataset_name", sa.String(KEY), nullable=False),
        sa.Column("subject", sa.String(10), nullable=False),
        sa.Column("prompt_version", sa.Integer, nullable=False),
        sa.Column("config_hash", sa.String(64), nullable=False),
        sa.Column("batch_id", sa.String(KEY), nullable=False),
        sa.Column("expected_items", sa.Integer, nullable=False),
        sa.Column("materialized", sa.Integer, nullable=False, server_default="0"),
        sa.Column("page_cursor", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("status", sa.String(14), nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("metrics", LongText),
        sa.Column("lease_token", sa.String(32)),
        sa.Column("lease_until", sa.BigInteger),
        sa.Column("leased_by", sa.String(64)),
        sa.Column("failures", sa.Integer, nullable=False, server_default="0"),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("updated_at", sa.BigInteger, nullable=False),
        sa.Column("finished_at", sa.BigInteger),
        sa.Column("version", sa.Integer, nullable=False, server_default="0"),
        sa.UniqueConstraint("update_id", "dataset_id", "subject", name="uq_prompt_run"),
    )
    steps.create_table(
        "prompt_run_item", _id(),
        sa.Column("run_id", sa.BigInteger, nullable=False),
        sa.Column("item_id", sa.BigInteger, nullable=False),
        sa.Column("item_key", sa.String(KEY), nullable=False),
        sa.Column("content_hash", sa.String(64), nullable=False),
        sa.Column("task_id", sa.String(KEY), nullable=False),
        sa.Column("expected", LongText, nullable=False),
        sa.Column("actual", LongText),
        sa.Column("verdict", sa.String(8), nullable=False),
        sa.Column("error", sa.Text),
        sa.Column("latency_ms", sa.Float),
        sa.Column("input_tokens", sa.Integer),
        sa.Column("output_tokens", sa.Integer),
        sa.Column("attempts", sa.Integer),
        sa.Column("created_at", sa.BigInteger, nullable=False),
        sa.Column("decided_at", sa.BigInteger),
        sa.UniqueConstraint("run_id", "item_id", name="uq_prompt_run_item"),
    )
    steps.create_index("ix_prompt_run_item_verdict", "prompt_run_item",
                    ["run_id", "verdict", "item_id"])


def downgrade() -> None:
    for name in ("prompt_run_item", "prompt_run", "prompt_update", "prompt_dataset",
                 "dataset_item", "dataset", "prompt_audit", "prompt_label", "prompt_version",
                 "prompt"):
        op.drop_table(name)
    with op.batch_alter_table("task_attempt") as batch:
        batch.drop_column("prompt_version")
