"""Tables, as SQLAlchemy Core metadata. Migrations (``migrations/``) create them.

Times are integer milliseconds since the Unix epoch taken from the database's clock
(see :mod:`lockgate.store.dialects`), so lease arithmetic never depends on a worker's
clock and compares exactly on every dialect.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Double,
    Float,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.dialects import mysql

metadata = MetaData()

#: TEXT that may hold megabytes on every dialect (MySQL's TEXT stops at 64 KiB).
LongText = Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
#: An auto-increment primary key: INTEGER on SQLite (rowid alias), BIGINT elsewhere.
BigId = BigInteger().with_variant(Integer(), "sqlite")

KEY = 191  # longest indexed VARCHAR that fits every MySQL row format in utf8mb4
NAME = 200  # who acted (author, actor, updated_by, acked_by): audit columns
SOURCE = 1000  # a file's path (batch, batch_submit, dataset)


def audit_name(who: str | None) -> str | None:
    """Who acted, as the audit columns hold it: a longer name is cut, not refused
    (PostgreSQL and MariaDB refuse an over-long value, SQLite keeps it)."""
    return who[:NAME] if who else who


def source_path(path: str | None) -> str | None:
    """A file's path as the ``source`` columns hold it: its end, where the file name is."""
    return path[-SOURCE:] if path else path

# On MySQL/MariaDB every table is utf8mb4 with the binary collation (migration 0009),
# so identifiers compare as on PostgreSQL and SQLite: case and accents count. A table
# a later migration adds says so too (mysql_charset="utf8mb4",
# mysql_collate="utf8mb4_bin"); tests/engine/test_schema.py checks every column.

task_config = Table(
    "task_config", metadata,
    Column("hash", String(64), primary_key=True),
    Column("document", LongText, nullable=False),
    Column("created_at", BigInteger, nullable=False),
)

batch = Table(
    "batch", metadata,
    Column("id", String(KEY), primary_key=True),
    Column("source", String(SOURCE)),
    Column("created_at", BigInteger, nullable=False),
    # flow control (migration 0003): SLA weight, deadline and time window
    Column("base_weight", Double, nullable=False, server_default="1"),
    Column("deadline_at", BigInteger),
    Column("window_start", BigInteger),
    Column("window_end", BigInteger),
    Column("target_per_s", Double),
    # 0004: 0 while a submit is writing the batch's tasks (an interrupted submit leaves
    # it 0: running the same submit again completes the batch)
    Column("complete", Integer, nullable=False, server_default="1"),
)

#: Submits writing a batch's tasks now, or interrupted (migration 0010): one row per
#: batch and submit (``submit_key``: the file's absolute path and the machine's name,
#: hashed), made when the submit starts writing to the batch and deleted when it ends.
#: A batch is complete when no row of it is left, so a second file submitted to the
#: same batch does not hide an interrupted first; the same submit run again removes
#: its row.
batch_submit = Table(
    "batch_submit", metadata,
    Column("batch_id", String(KEY), primary_key=True),
    Column("submit_key", String(64), primary_key=True),
    Column("source", String(SOURCE)),
    Column("host", String(255)),
    Column("started_at", BigInteger, nullable=False),
    mysql_charset="utf8mb4", mysql_collate="utf8mb4_bin",
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
    Column("pool", String(100), nullable=False, server_default="default"),  # 0003
    # 0005: the call that ended the task's last claim (results and exports read these,
    # not task_attempt): the model that answered, usage, latency, HTTP status, the
    # provider's request id and its response body as returned
    Column("model", String(200)),
    Column("input_tokens", Integer),
    Column("output_tokens", Integer),
    Column("latency_ms", Float),
    Column("http_status", Integer),
    Column("request_id", String(128)),
    Column("response", LongText),
    # 0012: run again by hand, the last task_attempt id of the earlier runs (the retry
    # budget counts the attempts after it)
    Column("trace_from", BigInteger),
    Index("ix_task_claim", "status", "visible_at"),
    Index("ix_task_batch_status", "batch_id", "status"),
    # Per-pool, per-batch claims and the discovery of batches with pending work.
    Index("ix_task_lane", "pool", "status", "batch_id", "visible_at"),
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
    Column("prompt_version", String(255)),  # name@N; 0004 (was 191)
    Column("routed_from", String(100)),  # 0003: the primary, when a fallback answered
    Column("request_id", String(128)),  # 0005: the provider's x-request-id
    Index("ix_task_attempt_task", "task_pk", "attempt"),
    # 0007: the alert samples' bounded reads (a prompt version's recent attempts)
    Index("ix_task_attempt_version", "prompt_version", "started_at",
          mysql_length={"prompt_version": KEY}, mariadb_length={"prompt_version": KEY}),
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
    # flow control (migration 0003): what the worker's adaptive limits look like now
    Column("pool", String(100)),
    Column("concurrency_limit", Integer),
    Column("latency_ms", Double),
    Column("failure_rate", Double),
    Column("flow", Text),
)

# -- prompt registry (migration 0002) ---------------------------------------------------
# JSON documents are stored as canonical JSON text (sorted keys), so equal content has
# equal bytes and hashes on every dialect.

prompt = Table(
    "prompt", metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("name", String(KEY), nullable=False, unique=True),
    Column("live_version", Integer),
    Column("generation", BigInteger, nullable=False, server_default="0"),
    Column("submissions", Integer, nullable=False, server_default="0"),
    Column("description", Text),
    Column("created_at", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
)

prompt_version = Table(
    "prompt_version", metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("prompt_id", BigInteger, nullable=False),
    Column("version", Integer, nullable=False),
    Column("template", LongText, nullable=False),
    Column("model_config", Text, nullable=False),
    Column("delivery_rule", Text, nullable=False),
    Column("content_hash", String(64), nullable=False),
    Column("tag", String(100)),
    Column("author", String(NAME)),
    Column("note", Text),
    Column("created_at", BigInteger, nullable=False),
    UniqueConstraint("prompt_id", "version", name="uq_prompt_version_number"),
    UniqueConstraint("prompt_id", "content_hash", name="uq_prompt_version_content"),
    UniqueConstraint("prompt_id", "tag", name="uq_prompt_version_tag"),
)

prompt_label = Table(
    "prompt_label", metadata,
    Column("prompt_id", BigInteger, nullable=False),
    Column("label", String(64), nullable=False),
    Column("version", Integer, nullable=False),
    Column("updated_by", String(NAME)),
    Column("updated_at", BigInteger, nullable=False),
    PrimaryKeyConstraint("prompt_id", "label", name="pk_prompt_label"),
)

prompt_audit = Table(
    "prompt_audit", metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("prompt_id", BigInteger, nullable=False),
    Column("action", String(16), nullable=False),
    Column("from_version", Integer),
    Column("to_version", Integer),
    Column("label", String(64)),
    Column("update_id", BigInteger),
    Column("generation", BigInteger, nullable=False),
    Column("actor", String(NAME)),
    Column("reason", Text),
    Column("created_at", BigInteger, nullable=False),
    Index("ix_prompt_audit_prompt", "prompt_id", "id"),
)

# -- datasets ------------------------------------------------------------------------------

dataset = Table(
    "dataset", metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("name", String(KEY), nullable=False, unique=True),
    Column("description", Text),
    Column("source", String(SOURCE)),
    Column("revision", Integer, nullable=False, server_default="0"),
    Column("item_count", Integer, nullable=False, server_default="0"),
    Column("items_hash", String(64), nullable=False),
    Column("input_keys", Text, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
)

#: Items are immutable: a changed item is a new row, the old one is retired at the
#: revision that replaced it, so any past revision can be read again exactly.
dataset_item = Table(
    "dataset_item", metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("dataset_id", BigInteger, nullable=False),
    Column("item_key", String(KEY), nullable=False),
    Column("content_hash", String(64), nullable=False),
    Column("input_data", LongText, nullable=False),
    Column("expected", LongText, nullable=False),
    Column("added_rev", Integer, nullable=False),
    Column("retired_rev", Integer),
    Column("created_at", BigInteger, nullable=False),
    UniqueConstraint("dataset_id", "item_key", "added_rev", name="uq_dataset_item_rev"),
    Index("ix_dataset_item_page", "dataset_id", "id"),
)

# -- release gate -------------------------------------------------------------

prompt_dataset = Table(
    "prompt_dataset", metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("prompt_id", BigInteger, nullable=False),
    Column("dataset_id", BigInteger, nullable=False),
    Column("settings", Text, nullable=False),
    Column("created_at", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    Column("version", Integer, nullable=False, server_default="0"),
    UniqueConstraint("prompt_id", "dataset_id", name="uq_prompt_dataset"),
)

prompt_update = Table(
    "prompt_update", metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("prompt_id", BigInteger, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("candidate_version", Integer, nullable=False),
    Column("base_version", Integer),
    Column("base_generation", BigInteger, nullable=False),
    Column("status", String(12), nullable=False),
    Column("reason", Text),
    Column("snapshot", LongText, nullable=False),
    Column("snapshot_hash", String(64), nullable=False),
    Column("decision", LongText),
    Column("author", String(NAME)),
    Column("created_at", BigInteger, nullable=False),
    Column("started_at", BigInteger),
    Column("decided_at", BigInteger),
    Column("updated_at", BigInteger, nullable=False),
    Column("version", Integer, nullable=False, server_default="0"),
    UniqueConstraint("prompt_id", "seq", name="uq_prompt_update_seq"),
    Index("ix_prompt_update_status", "status"),
)

prompt_run = Table(
    "prompt_run", metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("update_id", BigInteger, nullable=False),
    Column("dataset_id", BigInteger, nullable=False),
    Column("dataset_name", String(KEY), nullable=False),
    Column("subject", String(10), nullable=False),
    Column("prompt_version", Integer, nullable=False),
    Column("config_hash", String(64), nullable=False),
    Column("batch_id", String(KEY), nullable=False),
    Column("expected_items", Integer, nullable=False),
    Column("materialized", Integer, nullable=False, server_default="0"),
    Column("page_cursor", BigInteger, nullable=False, server_default="0"),
    Column("status", String(14), nullable=False),
    Column("reason", Text),
    Column("metrics", LongText),
    Column("lease_token", String(32)),
    Column("lease_until", BigInteger),
    Column("leased_by", String(64)),
    Column("failures", Integer, nullable=False, server_default="0"),
    Column("created_at", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    Column("finished_at", BigInteger),
    Column("version", Integer, nullable=False, server_default="0"),
    UniqueConstraint("update_id", "dataset_id", "subject", name="uq_prompt_run"),
)

prompt_run_item = Table(
    "prompt_run_item", metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("run_id", BigInteger, nullable=False),
    Column("item_id", BigInteger, nullable=False),
    Column("item_key", String(KEY), nullable=False),
    Column("content_hash", String(64), nullable=False),
    Column("task_id", String(KEY), nullable=False),
    Column("task_pk", BigInteger),  # 0004: the task row this item runs as
    Column("expected", LongText, nullable=False),
    Column("actual", LongText),
    Column("verdict", String(8), nullable=False),
    Column("error", Text),
    Column("latency_ms", Float),
    Column("input_tokens", Integer),
    Column("output_tokens", Integer),
    Column("attempts", Integer),
    Column("created_at", BigInteger, nullable=False),
    Column("decided_at", BigInteger),
    UniqueConstraint("run_id", "item_id", name="uq_prompt_run_item"),
    Index("ix_prompt_run_item_verdict", "run_id", "verdict", "item_id"),
)

# -- flow control (migration 0003) ------------------------------------------------------

#: One shared token bucket per endpoint (``kind`` 'endpoint') or per paced window batch
#: ('window'): capacities per ``window_ms``, current allowances as of ``refilled_at``
#: (database clock), and the pause every worker honours.
rate_limit = Table(
    "rate_limit", metadata,
    Column("name", String(KEY), primary_key=True),
    Column("kind", String(12), nullable=False),
    Column("rpm", Double),
    Column("tpm", Double),
    Column("window_ms", BigInteger, nullable=False),
    Column("learned_rpm", Double),
    Column("learned_tpm", Double),
    Column("req_allowance", Double, nullable=False, server_default="0"),
    Column("tok_allowance", Double, nullable=False, server_default="0"),
    Column("refilled_at", BigInteger, nullable=False),
    Column("paused_until", BigInteger, nullable=False, server_default="0"),
    Column("pause_reason", String(32)),
    Column("granted_requests", BigInteger, nullable=False, server_default="0"),
    Column("granted_tokens", Double, nullable=False, server_default="0"),
    Column("paced_at", BigInteger),  # window buckets: when the pace was last computed
    Column("rate_factor", Double, nullable=False, server_default="1"),  # cut by 429s
    Column("cut_at", BigInteger, nullable=False, server_default="0"),
    Column("updated_at", BigInteger, nullable=False),
    Column("version", Integer, nullable=False, server_default="0"),
)

# -- quality rollups (migration 0006) -----------------------------------------------------

#: Quality figures of the attempts written back, per prompt (``name@N``, or
#: ``inline:<template hash>``), model and endpoint, per minute, hour and day
#: (``resolution`` m, h, d; ``bucket`` the start of the span, ms). Each worker keeps its
#: own rows (``shard`` its id), so workers flushing at once never wait on one row;
#: readers merge the shards. Counters add; ``parse_mix``, ``error_mix``, ``outcomes``
#: and ``watched`` are JSON maps of counts; ``latency_sketch`` is a serialised DDSketch
#: (mergeable). See :mod:`lockgate.quality.rollup`.
quality_rollup = Table(
    "quality_rollup", metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("resolution", String(1), nullable=False),
    Column("bucket", BigInteger, nullable=False),
    Column("prompt", String(KEY), nullable=False),
    Column("model", String(200), nullable=False),
    Column("endpoint", String(100), nullable=False),
    Column("shard", String(64), nullable=False),
    Column("attempts", BigInteger, nullable=False, server_default="0"),
    Column("tasks", BigInteger, nullable=False, server_default="0"),
    Column("calls", BigInteger, nullable=False, server_default="0"),
    Column("retries", BigInteger, nullable=False, server_default="0"),
    Column("discarded", BigInteger, nullable=False, server_default="0"),
    Column("fallbacks", BigInteger, nullable=False, server_default="0"),
    Column("parsed", BigInteger, nullable=False, server_default="0"),
    Column("conforming", BigInteger, nullable=False, server_default="0"),
    Column("completeness_sum", Double, nullable=False, server_default="0"),
    Column("completeness_n", BigInteger, nullable=False, server_default="0"),
    Column("latency_sum", Double, nullable=False, server_default="0"),
    Column("latency_sketch", Text),
    Column("input_tokens", BigInteger, nullable=False, server_default="0"),
    Column("output_tokens", BigInteger, nullable=False, server_default="0"),
    Column("cost", Double),
    Column("watch_n", BigInteger, nullable=False, server_default="0"),
    Column("watched", Text),
    Column("parse_mix", Text),
    Column("error_mix", Text),
    Column("outcomes", Text),
    # input tokens as reported, or as estimated for calls reported without usage
    # (migration 0011)
    Column("input_tokens_or_estimate", BigInteger, nullable=False, server_default="0"),
    Column("updated_at", BigInteger, nullable=False),
    UniqueConstraint("resolution", "bucket", "prompt", "model", "endpoint", "shard",
                     name="uq_quality_rollup"),
    Index("ix_quality_rollup_prompt", "resolution", "prompt", "bucket"),
)

# -- quality alerts (migration 0007) --------------------------------------------------------

#: A role only one process may hold at a time (``name`` e.g. ``quality_evaluator``): the
#: holder's worker id and a fencing ``token``, valid until ``lease_until`` (database
#: clock). Claimed and renewed with conditional UPDATEs; a write of the role checks its
#: token in the same transaction.
role_lease = Table(
    "role_lease", metadata,
    Column("name", String(64), primary_key=True),
    Column("holder", String(64)),
    Column("token", String(32)),
    Column("lease_until", BigInteger, nullable=False, server_default="0"),
    Column("acquired_at", BigInteger),
    Column("updated_at", BigInteger, nullable=False),
)

#: One incident of an anomaly rule on a prompt version and model (and the watched value
#: of a drift). ``alert_key`` is the sha256 of (rule, prompt, model, subject);
#: ``open_key`` holds it while the alert is OPEN and is NULL once RESOLVED: its unique
#: constraint lets at most one alert per key be open, whoever writes.
quality_alert = Table(
    "quality_alert", metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("alert_key", String(64), nullable=False),
    Column("open_key", String(64)),
    Column("rule", String(32), nullable=False),
    Column("prompt", String(KEY), nullable=False),
    Column("model", String(200), nullable=False),
    Column("subject", String(KEY)),
    Column("status", String(12), nullable=False),
    Column("window_s", Double, nullable=False),
    Column("value", Double, nullable=False),
    Column("baseline", Double),
    Column("threshold", Double, nullable=False),
    Column("calls", BigInteger, nullable=False, server_default="0"),
    Column("tasks", BigInteger, nullable=False, server_default="0"),
    Column("batches", Integer, nullable=False, server_default="0"),
    Column("batches_exact", Integer, nullable=False, server_default="1"),
    Column("onset_at", BigInteger, nullable=False),
    Column("opened_at", BigInteger, nullable=False),
    Column("updated_at", BigInteger, nullable=False),
    Column("notified_at", BigInteger, nullable=False),
    Column("resolved_at", BigInteger),
    Column("acked_at", BigInteger),
    Column("acked_by", String(NAME)),
    Column("ack_reason", Text),
    Column("version", Integer, nullable=False, server_default="0"),
    UniqueConstraint("open_key", name="uq_quality_alert_open"),
    Index("ix_quality_alert_key", "alert_key", "resolved_at"),
    Index("ix_quality_alert_status", "status", "id"),
)

#: Failing attempts of an alert (at most 100), copied with their rendered prompt and raw
#: output (secrets masked), so they outlive the attempt rows.
quality_alert_sample = Table(
    "quality_alert_sample", metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("alert_id", BigInteger, nullable=False),
    Column("attempt_id", BigInteger, nullable=False),
    Column("task_id", String(KEY), nullable=False),
    Column("batch_id", String(KEY), nullable=False),
    Column("started_at", BigInteger, nullable=False),
    Column("latency_ms", Float),
    Column("endpoint", String(100)),
    Column("parse_status", String(24)),
    Column("completeness", Float),
    Column("error_class", String(32)),
    Column("error_message", Text),
    Column("prompt_snapshot", LongText),
    Column("raw_output", LongText),
    Column("created_at", BigInteger, nullable=False),
    UniqueConstraint("alert_id", "attempt_id", name="uq_quality_alert_sample"),
)

#: The webhook outbox: one row per event and webhook (``target`` its name), written in
#: the transaction of the alert change it announces. ``delivery_id`` is the idempotency
#: id every (re-)delivery carries; a sender claims a row by setting ``lease_token`` and
#: moving ``next_at`` past its timeout (status PENDING, DELIVERED or FAILED).
alert_delivery = Table(
    "alert_delivery", metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("delivery_id", String(32), nullable=False),
    Column("alert_id", BigInteger, nullable=False),
    Column("event", String(12), nullable=False),
    Column("target", String(100), nullable=False),
    Column("body", LongText, nullable=False),
    Column("status", String(12), nullable=False),
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("next_at", BigInteger, nullable=False),
    Column("lease_token", String(32)),
    Column("last_error", Text),
    Column("created_at", BigInteger, nullable=False),
    Column("delivered_at", BigInteger),
    UniqueConstraint("delivery_id", name="uq_alert_delivery_id"),
    Index("ix_alert_delivery_due", "status", "next_at"),
)

# 0008: the completeness circuits (docs/quality.md). One row per configured prompt path,
# moved only by compare-and-swap on (state, version); every move is one event row,
# written in the same transaction (UNIQUE(prompt, version): a move is recorded once).
quality_circuit = Table(
    "quality_circuit", metadata,
    Column("prompt", String(KEY), primary_key=True),
    Column("state", String(12), nullable=False),
    Column("since", BigInteger, nullable=False),
    Column("reason", Text),
    Column("figures", Text),
    Column("manual", Integer, nullable=False, server_default="0"),
    Column("version", Integer, nullable=False, server_default="0"),
    Column("changed_by", String(64)),
    Column("updated_at", BigInteger, nullable=False),
)

quality_circuit_event = Table(
    "quality_circuit_event", metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("prompt", String(KEY), nullable=False),
    Column("version", Integer, nullable=False),
    Column("from_state", String(12), nullable=False),
    Column("to_state", String(12), nullable=False),
    Column("at", BigInteger, nullable=False),
    Column("actor", String(64), nullable=False),
    Column("reason", Text),
    Column("figures", Text),
    UniqueConstraint("prompt", "version", name="uq_quality_circuit_event"),
)

# 0013: A/B tests of prompt versions (docs/quality.md "A/B tests"). ``share_bp`` is the
# candidate's share in basis points (500 = 5%: stored exactly); ``running`` is the
# prompt's id while RUNNING, else NULL: UNIQUE, so one runs per prompt, and the index
# the workers' pointer read joins on. ``decision`` is the figures and verdict (JSON).
experiment = Table(
    "experiment", metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("prompt_id", BigInteger, nullable=False),
    Column("control_version", Integer, nullable=False),
    Column("candidate_version", Integer, nullable=False),
    Column("share_bp", Integer, nullable=False),
    Column("status", String(12), nullable=False),
    Column("running", BigInteger),
    Column("started_at", BigInteger, nullable=False),
    Column("ends_at", BigInteger, nullable=False),
    Column("concluded_at", BigInteger),
    Column("decision", Text),
    Column("actor", String(NAME)),
    Column("reason", Text),
    UniqueConstraint("running", name="uq_experiment_running"),
    Index("ix_experiment_prompt", "prompt_id", "id"),
    mysql_charset="utf8mb4", mysql_collate="utf8mb4_bin",
)
