"""Processes that migrate one database at once: only the one that ran the migration
reports a creation or an upgrade, and a worker started during a long migration on
MariaDB waits for it instead of exiting."""

from __future__ import annotations

import logging
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, text

import lockgate.store.dialects.base
import lockgate.store.store
from helpers import clean_env
from lockgate.app import Lockgate
from lockgate.cli._common import _open_waiting
from lockgate.store import Store
from lockgate.store.engine import database_url
from lockgate.store.store import SCHEMA_HEAD

from .support import lockgate_cmd

PROCESSES = 4


def _upgrade(url: str, target: str) -> None:
    """Upgrade the database at ``url`` to ``target`` (not further)."""
    store = Store(url)
    try:
        cfg = Config()
        cfg.set_main_option("script_location",
                            str(Path(lockgate.store.store.__file__).parent / "migrations"))
        with store.engine.connect() as conn, conn.begin():
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, target)
    finally:
        store.close()


def _migrate_at_once(url: str) -> list[str | None]:
    """What Store.migrate returns in each of PROCESSES threads started together, each
    with its own Store (its own connections, as separate processes have)."""
    stores = [Store(url) for _ in range(PROCESSES)]
    start = threading.Barrier(PROCESSES)

    def migrate(store: Store) -> str | None:
        start.wait()
        return store.migrate()

    try:
        with ThreadPoolExecutor(PROCESSES) as pool:
            return list(pool.map(migrate, stores))
    finally:
        for store in stores:
            store.close()


@pytest.mark.parametrize("old", [None, "0008"])
def test_of_migrations_run_at_once_only_one_reports_creating_or_upgrading(
        fresh_db_url: str, old: str | None) -> None:
    """Every one of four concurrent migrations returned the revision it read before
    taking the migration lock, so each said it created (or upgraded) the schema."""
    if old is not None:
        _upgrade(fresh_db_url, old)
    found = _migrate_at_once(fresh_db_url)
    assert sorted(found, key=str) == sorted([old] + [SCHEMA_HEAD] * (PROCESSES - 1), key=str)


def test_concurrent_inits_print_one_created_line(fresh_db_url: str, tmp_path: Path) -> None:
    """Four `lockgate init` started together on a new database all printed `schema
    created in ...`; one creates it, the others find it up to date."""
    procs = [subprocess.Popen(lockgate_cmd("init", "--db", fresh_db_url),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=clean_env(), cwd=tmp_path) for _ in range(PROCESSES)]
    outputs = []
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out
        outputs.append(" ".join(out.split()))
    assert sum("schema created in" in out for out in outputs) == 1, outputs
    assert sum("schema is up to date in" in out for out in outputs) == PROCESSES - 1, outputs


class _Seen(logging.Handler):
    """Sets ``event`` when a record whose message contains ``words`` is logged."""

    def __init__(self, words: str) -> None:
        super().__init__(logging.WARNING)
        self.words = words
        self.event = threading.Event()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        if self.words in record.getMessage():
            self.event.set()


@pytest.mark.parametrize("backend", ["mariadb"], indirect=True)
def test_a_worker_waits_for_a_migration_longer_than_the_lock_wait(
        fresh_db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker starting while another process had held the MariaDB migration lock for
    more than 120 s exited with code 2; it waits for the migration, saying so."""
    monkeypatch.setattr(lockgate.store.dialects.base, "MIGRATION_LOCK_WAIT_S", 1)
    holder = create_engine(database_url(fresh_db_url), poolclass=None)
    seen = _Seen("waiting for another process's schema migration")
    logger = logging.getLogger("lockgate.cli")
    logger.addHandler(seen)
    opened: dict[str, Any] = {}

    def open_worker_db() -> None:
        try:
            opened["lg"] = _open_waiting(fresh_db_url, None, True)
        except BaseException as exc:  # reported by the assertion below
            opened["error"] = exc
        seen.event.set()

    try:
        with holder.connect() as conn:
            assert conn.execute(text("SELECT GET_LOCK('lockgate_migrate', 0)")).scalar() == 1
            worker = threading.Thread(target=open_worker_db, daemon=True)
            worker.start()
            # held until the worker has waited through at least one full lock wait
            seen.event.wait(timeout=120)
            conn.execute(text("SELECT RELEASE_LOCK('lockgate_migrate')"))
        worker.join(timeout=300)
    finally:
        logger.removeHandler(seen)
        holder.dispose()
    assert "error" not in opened, f"the worker gave up: {opened.get('error')}"
    lg: Lockgate = opened["lg"]
    try:
        assert lg.schema_found is None  # it then created the schema itself
        assert lg.store._revision() == SCHEMA_HEAD
    finally:
        lg.close()
    assert any("waiting for another process's schema migration" in m
               for m in seen.messages), seen.messages
