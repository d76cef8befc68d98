"""The PostgreSQL side shared by the PostgreSQL peers (PgQueuer, Procrastinate): a
database of their own and the table their tasks write results to (neither library
keeps a task's return value)."""

from __future__ import annotations

RESULTS_DDL = ("CREATE TABLE IF NOT EXISTS peer_result (task_id text PRIMARY KEY, "
               "content text NOT NULL, stored_at timestamptz NOT NULL DEFAULT clock_timestamp())")
#: Idempotent: a task run twice stores its answer once.
STORE_SQL = ("INSERT INTO peer_result (task_id, content) VALUES ($1, $2) "
             "ON CONFLICT (task_id) DO UPDATE SET content = EXCLUDED.content")


def database_url(admin_url: str, name: str) -> str:
    """``admin_url`` with its database replaced by ``name``."""
    return admin_url.rsplit("/", 1)[0] + f"/{name}"
