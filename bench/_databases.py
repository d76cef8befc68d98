"""Fresh, empty databases for the benchmarks (servers named by the environment:
``LOCKGATE_BENCH_PG``, ``LOCKGATE_BENCH_MYSQL``, each an admin database URL)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import sqlalchemy as sa

PG_ADMIN = os.environ.get("LOCKGATE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
MY_ADMIN = os.environ.get("LOCKGATE_BENCH_MYSQL", "mysql://root@127.0.0.1:3306/test")


def fresh_url(family: str, tmp: Path, name: str) -> str | None:
    """A new, empty database ``name`` of this family (``sqlite``, ``postgresql``,
    ``mysql`` or ``mariadb``; a file ``name.db`` in ``tmp`` for SQLite), or None when its
    server does not answer."""
    if family == "sqlite":
        db = tmp / f"{name}.db"
        for suffix in ("", "-wal", "-shm"):
            Path(str(db) + suffix).unlink(missing_ok=True)
        return f"sqlite:///{db}"
    pg = family == "postgresql"
    admin = PG_ADMIN if pg else MY_ADMIN
    try:
        eng = sa.create_engine(admin.replace("mysql://", "mysql+pymysql://")
                               .replace("postgresql://", "postgresql+psycopg://"),
                               isolation_level="AUTOCOMMIT")
        with eng.connect() as c:
            c.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}" + (" WITH (FORCE)" if pg else ""))
            c.exec_driver_sql(f"CREATE DATABASE {name}" + ("" if pg else " CHARACTER SET utf8mb4"))
        eng.dispose()
    except sa.exc.OperationalError as e:
        print(f"{family}: skipped, the server does not answer ({e.orig})", file=sys.stderr)
        return None
    return admin.rsplit("/", 1)[0] + f"/{name}"
