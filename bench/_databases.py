"""Fresh, empty databases for the benchmarks that load or submit at volume."""

from __future__ import annotations

import sys
from pathlib import Path

import sqlalchemy as sa

PG = "postgresql://postgres@127.0.0.1:5432/"
MARIADB = "mysql://root@127.0.0.1:3306/"


def fresh_url(family: str, tmp: Path, name: str) -> str | None:
    """A new, empty database ``name`` of this family (a file ``name.db`` in ``tmp`` for
    SQLite), or None when its server does not answer."""
    if family == "sqlite":
        db = tmp / f"{name}.db"
        for suffix in ("", "-wal", "-shm"):
            Path(str(db) + suffix).unlink(missing_ok=True)
        return f"sqlite:///{db}"
    admin = PG + "test" if family == "postgresql" else MARIADB + "test"
    try:
        eng = sa.create_engine(admin.replace("mysql://", "mysql+pymysql://")
                               .replace("postgresql://", "postgresql+psycopg://"),
                               isolation_level="AUTOCOMMIT")
        with eng.connect() as c:
            c.exec_driver_sql(f"DROP DATABASE IF EXISTS {name}")
            c.exec_driver_sql(f"CREATE DATABASE {name}")
        eng.dispose()
    except sa.exc.OperationalError as e:
        print(f"{family}: skipped, the server does not answer ({e.orig})", file=sys.stderr)
        return None
    return (PG if family == "postgresql" else MARIADB) + name
