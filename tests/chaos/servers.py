"""Private database servers for the chaos tests: a PostgreSQL cluster (initdb and pg_ctl,
run as the ``postgres`` user) and a MariaDB server (mariadb-install-db and mariadbd), each
with its own data directory, port and socket, which a test may stop, kill and restart.
The shared servers on 5432 and 3306 are never touched.

A server that cannot be made on this machine (no binaries, not root) skips the test
that asks for it, or fails it under ``CI=true``.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
from sqlalchemy import create_engine, text

from conftest import in_ci
from lockgate.store import Store
from lockgate.store.engine import database_url


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on at ``host`` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def unavailable(why: str) -> None:
    """Skip the test (fail it under CI) when a private server cannot be made here."""
    if in_ci():
        pytest.fail(f"CI=true and {why}", pytrace=False)
    pytest.skip(why)


def _run(cmd: list[str], **kwargs: object) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n"
                           f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


@dataclass
class PrivateServer:
    """A database server of one test module; ``url`` is a migrated lockgate database."""

    backend: str
    root: Path
    host: str
    port: int
    url: str = ""
    #: Monotonic times at which the server was seen answering after each start.
    answered: list[float] = field(default_factory=list)

    # -- to implement ---------------------------------------------------------------
    def _start(self) -> None: raise NotImplementedError
    def _stop(self, *, kill: bool) -> None: raise NotImplementedError

    # -- common ---------------------------------------------------------------------
    def start(self, timeout: float = 60.0) -> float:
        """Start the server and return the moment (monotonic) it first answered."""
        self._start()
        return self.wait_answering(timeout)

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server: a fast shutdown, or SIGKILL of the server (``kill``)."""
        self._stop(kill=kill)

    def restart(self, down_s: float = 0.0, *, kill: bool = False) -> float:
        """Stop, stay down ``down_s`` seconds, start; the moment it answered again."""
        self.stop(kill=kill)
        time.sleep(down_s)
        return self.start()

    def answers(self) -> bool:
        engine = create_engine(database_url(self.url), poolclass=None,
                               connect_args={"connect_timeout": 2})
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            return True
        except Exception:  # any driver error: not answering yet
            return False
        finally:
            engine.dispose()

    def wait_answering(self, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while not self.answers():
            if time.monotonic() > deadline:
                raise AssertionError(f"private {self.backend} on port {self.port} did not "
                                     f"answer within {timeout:g}s")
            time.sleep(0.05)
        at = time.monotonic()
        self.answered.append(at)
        return at

    def migrate(self) -> None:
        store = Store(self.url, pool_size=1)
        try:
            store.migrate()
        finally:
            store.close()

    def wipe(self) -> None:
        """Empty every lockgate table (between tests of one module)."""
        engine = create_engine(database_url(self.url), poolclass=None)
        try:
            with engine.begin() as conn:
                names = [r[0] for r in conn.execute(text(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = "
                    + ("'public'" if self.backend == "postgresql" else "DATABASE()")))]
                for name in names:
                    if name != "alembic_version":
                        conn.execute(text(f"DELETE FROM {name}"))
        finally:
            engine.dispose()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._stop(kill=True)
        shutil.rmtree(self.root, ignore_errors=True)


class PrivatePostgres(PrivateServer):
    """A PostgreSQL cluster of its own (trust authentication, fsync off: the tests kill
    processes and the server, never the machine)."""

    def __init__(self, host: str = "127.0.0.1", port: int | None = None) -> None:
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        if not bins or os.geteuid() != 0 or shutil.which("runuser") is None:
            unavailable("a private PostgreSQL needs /usr/lib/postgresql/*/bin and root")
        self.bin = Path(bins[-1]).parent
        root = Path(tempfile.mkdtemp(prefix="lockgate-pg-"))
        super().__init__("postgresql", root, host, port or free_port(host))
        self.data = root / "data"
        shutil.chown(root, "postgres", "postgres")
        _run(["runuser", "-u", "postgres", "--", str(self.bin / "initdb"), "-D",
              str(self.data), "-A", "trust", "-U", "postgres", "--no-sync"])
        with (self.data / "pg_hba.conf").open("a") as hba:  # clients on the server's links
            hba.write("host all all samenet trust\n")
        self.url = f"postgresql://postgres@{host}:{self.port}/postgres"

    def _pg_ctl(self, *args: str) -> None:
        _run(["runuser", "-u", "postgres", "--", str(self.bin / "pg_ctl"), "-D",
              str(self.data), *args])

    def _start(self) -> None:
        opts = (f"-p {self.port} -k {self.root} -c listen_addresses={self.host} "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                "-c max_connections=200")
        self._pg_ctl("-o", opts, "-l", str(self.root / "server.log"), "-w", "-t", "60",
                     "start")

    def _stop(self, *, kill: bool) -> None:
        pid_file = self.data / "postmaster.pid"
        if not pid_file.exists():
            return
        if kill:
            # The whole server dies at once (postmaster and backends), as in a crash.
            with contextlib.suppress(psutil.NoSuchProcess):
                top = psutil.Process(int(pid_file.read_text().split()[0]))
                procs = [top, *top.children(recursive=True)]
                for p in procs:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        p.send_signal(signal.SIGKILL)
                psutil.wait_procs(procs, timeout=30)
            return
        self._pg_ctl("-m", "fast", "-w", "-t", "60", "stop")


class PrivateMariaDB(PrivateServer):
    """A MariaDB server of its own, root without a password over TCP."""

    def __init__(self, host: str = "127.0.0.1", port: int | None = None) -> None:
        if shutil.which("mariadbd", path="/usr/sbin:/usr/bin") is None or \
                shutil.which("mariadb-install-db") is None:
            unavailable("a private MariaDB needs mariadbd and mariadb-install-db")
        root = Path(tempfile.mkdtemp(prefix="lockgate-maria-"))
        super().__init__("mariadb", root, host, port or free_port(host))
        self.data = root / "data"
        self.proc: subprocess.Popen[bytes] | None = None
        _run(["mariadb-install-db", "--no-defaults", f"--datadir={self.data}", "--user=root",
              "--auth-root-authentication-method=normal", "--skip-test-db",
              "--skip-name-resolve"])
        self.url = f"mysql://root@{host}:{self.port}/lockgate"

    def _start(self) -> None:
        log = (self.root / "server.log").open("ab")
        self.proc = subprocess.Popen(
            [shutil.which("mariadbd", path="/usr/sbin:/usr/bin") or "mariadbd",
             "--no-defaults", f"--datadir={self.data}", f"--port={self.port}",
             f"--socket={self.root / 'mysqld.sock'}", f"--bind-address={self.host}",
             f"--pid-file={self.root / 'mysqld.pid'}", "--user=root",
             "--skip-name-resolve", "--innodb-flush-log-at-trx-commit=0",
             "--innodb-buffer-pool-size=64M", "--max-connections=200",
             "--max-allowed-packet=64M"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()

    def wait_answering(self, timeout: float) -> float:
        # The database itself is created on the first start.
        deadline = time.monotonic() + timeout
        base = self.url.rsplit("/", 1)[0] + "/mysql"
        while True:
            try:
                engine = create_engine(database_url(base), poolclass=None,
                                       connect_args={"connect_timeout": 2})
                with engine.connect() as conn:
                    conn.execute(text("CREATE DATABASE IF NOT EXISTS lockgate "
                                      "CHARACTER SET utf8mb4"))
                engine.dispose()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise AssertionError(f"private MariaDB on port {self.port} did not "
                                         f"answer within {timeout:g}s") from None
                time.sleep(0.05)
        return super().wait_answering(max(1.0, deadline - time.monotonic()))

    def _stop(self, *, kill: bool) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        self.proc.wait(60)


def _listening(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def private_server(backend: str, host: str = "127.0.0.1") -> PrivateServer:
    """A started, migrated private server of ``backend``."""
    server: PrivateServer = (PrivatePostgres(host) if backend == "postgresql"
                             else PrivateMariaDB(host))
    try:
        server.start()
        server.migrate()
    except BaseException:
        server.close()
        raise
    return server
