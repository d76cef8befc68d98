"""Fixtures shared by the test suite: a migrated database on every backend, and the simulator.

``db_url`` runs each test that asks for it on SQLite, PostgreSQL and MariaDB:

* SQLite: a fresh file in the test's ``tmp_path`` (a copy of one file migrated once per
  session);
* PostgreSQL: a fresh schema per test module in the ``test`` database (the URL sets
  ``search_path``, so lockgate and its worker subprocesses see only that schema);
* MariaDB: a fresh database per test module.

Server databases are migrated once per module and emptied before every test, which
isolates tests as well as a new database would at a fraction of the cost (a MariaDB
migration takes most of a second). Under ``CI=true`` an unreachable server fails the
test; elsewhere the test is skipped with the command that starts the server.

Server locations can be overridden with ``LOCKGATE_TEST_PG_URL`` and
``LOCKGATE_TEST_MARIADB_URL`` (an existing database the tests may create schemas or
databases from).
"""

from __future__ import annotations

import atexit
import functools
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from sqlalchemy import Engine, create_engine, inspect, text

from lockgate.simulator.config import SimulatorConfig
from lockgate.simulator.testing import SimulatorProcess
from lockgate.store import Store
from lockgate.store.engine import database_url

BACKENDS = ("sqlite", "postgresql", "mariadb")

# The worker processes of ``pytest -n`` start with COLUMNS=80; rich fixes a console's
# width when it is created under COLUMNS, so the CLI's tables would ignore the width a
# test sets. Without it the width is read at each print, as in a serial run.
os.environ.pop("COLUMNS", None)

#: Property tests judge the code, not the machine: a loaded machine (the suite beside
#: databases, a simulator and workers on two cores) made Hypothesis's timing checks
#: fail tests whose every example passed ("Input generation is slow").
settings.register_profile("lockgate", suppress_health_check=[HealthCheck.too_slow],
                          deadline=None)
settings.load_profile("lockgate")

PG_URL = os.environ.get("LOCKGATE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
MARIADB_URL = os.environ.get("LOCKGATE_TEST_MARIADB_URL", "mysql://root@127.0.0.1:3306/test")

_SERVERS = {
    "postgresql": (PG_URL, "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) "
                           "main start"),
    "mariadb": (MARIADB_URL, "start-stop-daemon --start --oknodo --background "
                             "--exec /usr/sbin/mariadbd"),
}

def in_ci() -> bool:
    """Whether a missing database server must fail the run instead of skipping."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def _admin_engine(url: str) -> Engine:
    return create_engine(database_url(url), isolation_level="AUTOCOMMIT", poolclass=None,
                         connect_args={"connect_timeout": 5})


@functools.cache
def _server_problem(backend: str) -> str | None:
    """Why the server of ``backend`` cannot be used, or None (checked once per session)."""
    url, _start = _SERVERS[backend]
    try:
        engine = _admin_engine(url)
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        finally:
            engine.dispose()
    except Exception as exc:  # any driver error means: not usable
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return None


def require_server(backend: str) -> None:
    """Skip (or, under CI, fail) the current test when the backend's server is down."""
    if backend == "sqlite":
        return
    problem = _server_problem(backend)
    if problem is None:
        return
    url, start = _SERVERS[backend]
    msg = (f"{backend} is not reachable at {url} ({problem}). Start it with: {start}")
    if in_ci():
        pytest.fail(f"CI=true and {msg}", pytrace=False)
    pytest.skip(msg)


@dataclass
class ServerDatabase:
    """A schema (PostgreSQL) or database (MariaDB) that lives for one test module."""

    backend: str
    name: str
    url: str
    admin: Engine
    cleaner: Engine
    tables: list[str]

    def wipe(self) -> None:
        """Delete every row of every table the migrations created, and start the ids
        from 1 again."""
        with self.cleaner.begin() as conn:
            if self.backend == "postgresql":
                # DELETE and setval: a few ms, where TRUNCATE takes about 50 ms (it
                # gives every table new files). The schema has no foreign keys.
                for table in self.tables:
                    conn.execute(text(f"DELETE FROM {table}"))
                sequences = conn.execute(text(
                    "SELECT sequence_name FROM information_schema.sequences "
                    "WHERE sequence_schema = current_schema()")).scalars().all()
                if sequences:
                    conn.execute(text("SELECT " + ", ".join(
                        f"setval('{name}', 1, false)" for name in sequences)))
            else:
                conn.execute(text("SET FOREIGN_KEY_CHECKS = 0"))
                for table in self.tables:
                    conn.execute(text(f"DELETE FROM {table}"))
                conn.execute(text("SET FOREIGN_KEY_CHECKS = 1"))

    def drop(self) -> None:
        """Remove the schema or database and close every connection to it."""
        self.cleaner.dispose()
        with self.admin.connect() as conn:
            if self.backend == "postgresql":
                conn.execute(text(f"DROP SCHEMA IF EXISTS {self.name} CASCADE"))
            else:
                conn.execute(text(f"DROP DATABASE IF EXISTS {self.name}"))
        self.admin.dispose()


def _create_server_database(backend: str, *, migrate: bool = True) -> ServerDatabase:
    base, _start = _SERVERS[backend]
    name = f"lockgate_t_{secrets.token_hex(4)}"
    admin = _admin_engine(base)
    with admin.connect() as conn:
        if backend == "postgresql":
            conn.execute(text(f"CREATE SCHEMA {name}"))
        else:
            conn.execute(text(f"CREATE DATABASE {name} CHARACTER SET utf8mb4"))
    if backend == "postgresql":
        sep = "&" if "?" in base else "?"
        url = f"{base}{sep}options=-csearch_path%3D{name}"
    else:
        url = f"{base.rsplit('/', 1)[0]}/{name}"
    if migrate:
        store = Store(url, pool_size=1)
        try:
            store.migrate()
        finally:
            store.close()
    cleaner = create_engine(database_url(url), pool_size=1)
    tables = sorted(set(inspect(cleaner).get_table_names()) - {"alembic_version"})
    return ServerDatabase(backend, name, url, admin, cleaner, tables)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--chaos", choices=("short", "long"), default="short",
                     help="size of the chaos and fuzz suite (tests/chaos): short (part of "
                          "make test, under two minutes) or long (make chaos)")


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every test: no LOCKGATE_* setting from the caller's shell, and no ./lockgate.toml,
    leaks in."""
    for name in list(os.environ):
        if name.startswith("LOCKGATE_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The database family a test runs on (one test per backend)."""
    return str(request.param)


@pytest.fixture(scope="module")
def _module_database(backend: str) -> Iterator[ServerDatabase | None]:
    if backend == "sqlite" or _server_problem(backend) is not None:
        yield None  # SQLite gets a file per test; a down server skips in db_url
        return
    db = _create_server_database(backend)
    try:
        yield db
    finally:
        db.drop()


@pytest.fixture
def db_url(backend: str, _module_database: ServerDatabase | None, tmp_path: Path) -> str:
    """URL of a migrated, empty lockgate database on ``backend``."""
    require_server(backend)
    if _module_database is None:
        target = tmp_path / "lockgate.db"
        shutil.copyfile(_migrated_sqlite_template(), target)
        return f"sqlite:///{target}"
    _module_database.wipe()
    return _module_database.url


@functools.cache
def _migrated_sqlite_template() -> Path:
    """A migrated SQLite file, made once per test session and copied for each test (a
    migration takes about 0.1 s; a copy a millisecond). Closing the store checkpoints
    the WAL into the file, so the file alone is the whole database."""
    directory = Path(tempfile.mkdtemp(prefix="lockgate-template-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    path = directory / "template.db"
    store = Store(f"sqlite:///{path}", pool_size=1)
    try:
        store.migrate()
    finally:
        store.close()
    assert not path.with_name(path.name + "-wal").exists(), "the WAL was not checkpointed"
    return path


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    """A :class:`Store` on a fresh, migrated SQLite file (for SQLite-only tests)."""
    target = tmp_path / "lockgate.db"
    shutil.copyfile(_migrated_sqlite_template(), target)
    s = Store(f"sqlite:///{target}")
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def fresh_db_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """URL of a brand-new database on ``backend`` that no migration has touched."""
    require_server(backend)
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    db = _create_server_database(backend, migrate=False)
    try:
        yield db.url
    finally:
        db.drop()


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    """A :class:`Store` on the test's database, closed afterwards."""
    s = Store(db_url)
    try:
        yield s
    finally:
        s.close()


# -- the simulator -------------------------------------------------------------------

#: The simulator's defaults: no latency, no faults (restored before every test).
SIM_DEFAULTS: dict[str, Any] = SimulatorConfig().model_dump(mode="json")


@pytest.fixture(scope="session")
def _simulator_process() -> Iterator[SimulatorProcess]:
    with SimulatorProcess({}) as sim:
        yield sim


@pytest.fixture
def simulator(_simulator_process: SimulatorProcess,
              monkeypatch: pytest.MonkeyPatch) -> Iterator[SimulatorProcess]:
    """The shared simulator with default config and zeroed stats; ``LOCKGATE_BASE_URL``
    points at it for the test. Tests may ``configure`` faults: they are undone after."""
    sim = _simulator_process
    sim.configure(**SIM_DEFAULTS)
    sim.reset()
    monkeypatch.setenv("LOCKGATE_BASE_URL", sim.url)
    try:
        yield sim
    finally:
        sim.configure(**SIM_DEFAULTS)
        sim.reset()
