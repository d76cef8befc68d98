"""Tables, as SQLAlchemy Core metadata. Migrations (``migrations/``) create them.

Times are integer milliseconds since the Unix epoch taken from the database's clock
(see :mod:`lockgate.store.dialects`), so lease arithmetic never depends on a worker's
clock and compares exactly on every dialect.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)
from sqlalchemy.dialects import mysql

metadata = MetaData()

#: TEXT that may hold megabytes on every dialect (MySQL's TEXT stops at 64 KiB).
LongText = Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
#: An auto-increment primary key: INTEGER on SQLite (rowid alias), BIGINT elsewhere.
BigId = BigInteger().with_variant(Integer(), "sqlite")

KEY = 191  # longest indexed VARCHAR that fits every MySQL row format in utf8mb4

task_config = Table(
    "task_config", metadata,
    Column("hash", String(64), primary_key=True),
    Column("document", LongText, nullable=False),
    Column("created_at", BigInteger, nullable=False),
)

batch = Table(
    "batch", metadata,
    Column("id", String(KEY), primary_key=True),
    Column("source", String(1000)),
    Column("created_at", BigInteger, nullable=False),
)

task = Table(
    "task", metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("task_id", String(KEY), nullable=False, unique=True),
    Column("batch_id", String(KEY), nullable=False),
    Column("config_hash", String(64), nullable=False),
    Column("input_data", LongText, nullable=False),
    Column("metadata", LongText),
    Column("priority", Integer, nullable=False, server_default="0"),
    Column("status", String(12), nullable=False),
    Column("visible_at", BigInteger, nullable=False),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("lease_token", String(32)),
    Column("leased_by", String(64)),
    Column("version", Integer, nullable=False, server_default="0"),
    Column("result", LongText),
    Column("parse_status", String(24)),
    Column("error_class", String(32)),
    Column("error_message", Text),
    Column("created_at", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    Column("finished_at", BigInteger),
    Index("ix_task_claim", "status", "visible_at"),
    Index("ix_task_batch_status", "batch_id", "status"),
)

task_attempt = Table(
    "task_attempt", metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("task_pk", BigInteger, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("worker_id", String(64), nullable=False),
    Column("lease_token", String(32), nullable=False),
    Column("outcome", String(12), nullable=False),
    Column("started_at", BigInteger, nullable=False),
    Column("latency_ms", Float),
    Column("endpoint", String(100)),
    Column("model", String(200)),
    Column("prompt_sha256", String(64)),
    Column("prompt_snapshot", LongText),
    Column("token_estimator", String(32)),
    Column("estimated_tokens", Integer),
    Column("input_tokens", Integer),
    Column("output_tokens", Integer),
    Column("http_status", Integer),
    Column("raw_output", LongText),
    Column("parse_status", String(24)),
    Column("fixes", Text),
    Column("completeness", Float),
    Column("error_class", String(32)),
    Column("error_message", Text),
    Index("ix_task_attempt_task", "task_pk", "attempt"),
)

worker = Table(
    "worker", metadata,
    Column("id", String(64), primary_key=True),
    Column("hostname", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("status", String(12), nullable=False),
    Column("started_at", BigInteger, nullable=False),
    Column("heartbeat_at", BigInteger, nullable=False),
    Column("stopped_at", BigInteger),
    Column("concurrency", Integer, nullable=False, server_default="0"),
    Column("in_flight", Integer, nullable=False, server_default="0"),
    Column("claimed", BigInteger, nullable=False, server_default="0"),
    Column("succeeded", BigInteger, nullable=False, server_default="0"),
    Column("failed", BigInteger, nullable=False, server_default="0"),
    Column("retried", BigInteger, nullable=False, server_default="0"),
    Column("discarded", BigInteger, nullable=False, server_default="0"),
    Column("conflicts", BigInteger, nullable=False, server_default="0"),
    Column("version", Integer, nullable=False, server_default="0"),
)
