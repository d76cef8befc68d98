"""Creating SQLAlchemy engines from a URL, with each dialect's session settings."""

from __future__ import annotations

import logging
import math
import os
import socket
import sqlite3
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import NoSuchModuleError

from lockgate.durations import parse_duration
from lockgate.errors import ConfigError, SpecError, StoreError
from lockgate.redact import redact_url

DEFAULT_URL = "sqlite:///lockgate.db"
#: How long a SQLite statement waits for a lock held by another connection.
BUSY_TIMEOUT_MS = 60_000
log = logging.getLogger("lockgate.store")
#: A wait for SQLite's write lock this long (seconds) is logged.
LOCK_WARN_S = 5.0
#: A session that leaves a transaction open and idle this long is ended by the server
#: (PostgreSQL's idle_in_transaction_session_timeout, MariaDB's idle_transaction_timeout).
#: lockgate never waits on anything but the database inside a transaction; a client cut
#: off from the network, or frozen, in the middle of one would otherwise keep its row
#: locks (tasks no other worker can claim) until the server's TCP keepalive notices,
#: two hours by default.
IDLE_IN_TRANSACTION_S = 60
#: How long this client waits on a server that has gone silent before it gives the
#: connection up (``LOCKGATE_DB_TIMEOUT``, any duration): the TCP user timeout (data
#: sent and not acknowledged), keepalive probes while it waits for an answer (a long
#: query is not cut: the server's kernel answers the probes), and the connect timeout.
#: Without these a worker whose database link drops packets (a partition, a host that
#: vanished) waits on its socket for as long as TCP retransmits, 15 minutes on Linux,
#: and after the link is back for up to two minutes more (the retransmission back-off).
DB_TIMEOUT_S = 20.0

_DRIVERS = {
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
    "mysql": "mysql+pymysql",
    "mariadb": "mysql+pymysql",
}


_EXAMPLES = ("sqlite:///lockgate.db (a file here), sqlite:////var/lib/lockgate.db "
             "(an absolute path), postgresql://user@host/db or mysql://user@host/db")


def database_url(url: str | None = None, *, with_driver: bool = True) -> str:
    """The URL to use: the argument, else ``LOCKGATE_DATABASE_URL``, else SQLite, with
    the driver lockgate uses for its scheme (unless ``with_driver`` is false). A
    malformed URL is refused with a message that shows it (password hidden) and how to
    write it."""
    url = url or os.environ.get("LOCKGATE_DATABASE_URL") or DEFAULT_URL
    scheme, sep, rest = url.partition("://")
    if not sep:
        head, colon, _tail = url.partition(":")
        if colon and head.split("+")[0].lower() in {*_DRIVERS, "sqlite"}:
            raise ConfigError(
                f"database URL '{redact_url(url)}' lacks '//' after '{head}:'; write it "
                f"as {head}://... (e.g. {_EXAMPLES})")
        raise ConfigError(f"'{redact_url(url)}' is not a database URL (it has no scheme); "
                          f"use e.g. {_EXAMPLES}")
    scheme = scheme.lower()  # a scheme is case-insensitive (RFC 3986): POSTGRES://
    family = scheme.split("+")[0]
    if family not in {*_DRIVERS, "sqlite"}:
        raise ConfigError(f"database URL '{redact_url(url)}': unsupported database "
                          f"'{scheme}'; use sqlite, postgresql or mysql/mariadb")
    return f"{_DRIVERS.get(scheme, scheme) if with_driver else scheme}://{rest}"


def create(url: str | None = None, *, pool_size: int = 4) -> Engine:
    """An engine for ``url`` with WAL on SQLite and UTC sessions on MySQL."""
    resolved = database_url(url)
    try:
        parsed = make_url(resolved)
    except Exception as exc:
        raise ConfigError(f"cannot parse database URL '{redact_url(resolved)}': "
                          f"{str(exc).replace(resolved, redact_url(resolved))}") from None
    kwargs: dict[str, Any] = {}
    backend = parsed.get_backend_name()
    _check_target(parsed, database_url(url, with_driver=False), backend)
    timeout_s = DB_TIMEOUT_S if backend == "sqlite" else db_timeout_s()
    if backend == "sqlite":
        kwargs["connect_args"] = {"timeout": 60, "check_same_thread": False}
        kwargs["pool_size"] = pool_size
        from sqlalchemy.pool import QueuePool

        kwargs["poolclass"] = QueuePool
    else:
        kwargs["pool_size"] = pool_size
        kwargs["max_overflow"] = 2
        kwargs["pool_pre_ping"] = True
        kwargs["pool_recycle"] = 1800
        kwargs["connect_args"] = _tcp_connect_args(backend, parsed.query, timeout_s)
        kwargs["isolation_level"] = "READ COMMITTED"
    try:
        engine = create_engine(parsed, **kwargs)
    except NoSuchModuleError:  # e.g. postgresql+nodriver://: a driver SQLAlchemy lacks
        raise ConfigError(
            f"database URL '{redact_url(resolved)}': no database driver "
            f"'{parsed.drivername}'; leave the driver out (postgresql://, mysql://, "
            "sqlite:///) and lockgate uses its own") from None
    except ImportError as exc:
        raise ConfigError(f"no driver for '{parsed.drivername}': {exc}") from None
    pool = type(engine.pool)
    logging.getLogger(f"{pool.__module__}.{pool.__name__}").addFilter(_LOST_ON_RETURN)
    if backend == "sqlite":
        _sqlite_setup(engine)
    elif backend in ("mysql", "mariadb"):
        _mysql_setup(engine, timeout_s, login_only="read_timeout" not in parsed.query)
    else:
        _postgres_setup(engine, timeout_s)
    return engine


class _LostOnReturn(logging.Filter):
    """SQLAlchemy logs a connection whose reset failed as it went back to the pool (its
    rollback met a session the server had ended, a network cut) as an ERROR with a
    traceback, in a worker's log. The pool discards that connection and the next use
    opens another: routine after a database restart or a killed session, so one
    WARNING line. A non-Exception (a cancellation) keeps SQLAlchemy's record."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if record.msg == "Error closing cursor" and isinstance(exc, Exception):
            # A result cursor on a connection that was lost: the read that used it has
            # raised the error that says so already.
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg = "a result cursor could not be closed: its connection was lost (%s)"
            record.args = (str(exc).strip() or type(exc).__name__,)
            record.exc_info = record.exc_text = None
            return True
        if record.msg == "Exception during reset or similar" and isinstance(exc, Exception):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg = ("a database connection given back to the pool was found lost "
                          "(%s); it is discarded and replaced")
            record.args = (str(exc).strip() or type(exc).__name__,)
            record.exc_info = record.exc_text = None
        return True


_LOST_ON_RETURN = _LostOnReturn()


def _check_target(parsed: URL, given: str, backend: str) -> None:
    """Refuse a URL that names no lasting database: a SQLite URL without a file (an
    in-memory database belongs to one connection and ends with the process: tasks
    submitted there are lost, and a worker's other connections see no tables), one
    whose file was written as a host (two slashes), a server URL (PostgreSQL, MySQL)
    without a database, a MySQL URL with a ``charset`` its driver does not know."""
    shown = redact_url(given)
    if backend == "sqlite":
        path = parsed.database or ""
        if parsed.host:
            raise ConfigError(
                f"database URL '{shown}' names '{parsed.host}' as a host; a SQLite file "
                f"follows three slashes: sqlite:///{parsed.host} (a file here) or "
                f"sqlite:////var/lib/{parsed.host} (an absolute path)")
        if path in ("", ":memory:") or path.startswith("file::memory:") \
                or parsed.query.get("mode") == "memory":
            raise ConfigError(
                f"database URL '{shown}' names no file: an in-memory SQLite database "
                "lives in one connection and ends with the process, so submitted tasks "
                "would be lost; name a file, e.g. sqlite:///lockgate.db")
        return
    if backend in ("mysql", "mariadb"):
        _check_charset(parsed, shown)
    if not parsed.database:
        # PostgreSQL would connect to the server's default database (named after the
        # user) and create the tables there, where nobody looks for them.
        scheme = "mysql" if backend in ("mysql", "mariadb") else "postgresql"
        create_it = ("CREATE DATABASE lockgate" if scheme == "mysql"
                     else "createdb lockgate, or CREATE DATABASE lockgate")
        raise ConfigError(
            f"database URL '{shown}' names no database; add it after the server, e.g. "
            f"{scheme}://{parsed.username or 'user'}@{parsed.host or 'host'}"
            f"{f':{parsed.port}' if parsed.port else ''}/lockgate (create it first: "
            f"{create_it})")


def _check_charset(parsed: URL, shown: str) -> None:
    """Refuse a MySQL URL's ``charset`` PyMySQL does not know: it failed every
    connection with an ``AttributeError`` and a traceback (PyMySQL looks the name up
    and uses what it found without checking)."""
    from pymysql.charset import charset_by_name  # deferred: only a MySQL URL

    given = parsed.query.get("charset")
    for name in (given,) if isinstance(given, str) else given or ():
        if charset_by_name(name) is None:
            raise ConfigError(
                f"database URL '{shown}': charset {name!r} is not a character set "
                "the MySQL driver (PyMySQL) knows; leave charset out (lockgate's tables "
                "use utf8mb4), or write a known one, e.g. charset=utf8mb4")


def db_timeout_s() -> float:
    """``LOCKGATE_DB_TIMEOUT`` in seconds (see :data:`DB_TIMEOUT_S`)."""
    raw = os.environ.get("LOCKGATE_DB_TIMEOUT", "").strip()
    if not raw:
        return DB_TIMEOUT_S
    try:
        return parse_duration(raw, field="LOCKGATE_DB_TIMEOUT", allow_zero=False)
    except SpecError as exc:
        raise ConfigError(f"{exc}; it bounds how long a worker waits on a silent "
                          f"database (default {DB_TIMEOUT_S:g}s)") from None


#: The largest keepalive idle time and interval the kernel takes (Linux: 32767 s), and
#: the largest TCP user timeout in milliseconds (a C int): a ``LOCKGATE_DB_TIMEOUT`` of
#: 37 hours or more made every connection fail with "Invalid argument".
MAX_KEEPALIVE_S = 32_767
MAX_USER_TIMEOUT_MS = 2**31 - 1


def _keepalive_s(timeout_s: float) -> int:
    """Keepalive idle time and probe interval: three unanswered probes after an idle
    spell span about ``timeout_s`` (up to the kernel's largest)."""
    return min(MAX_KEEPALIVE_S, max(1, round(timeout_s / 4)))


def _user_timeout_ms(timeout_s: float) -> int:
    """``TCP_USER_TIMEOUT`` for ``timeout_s``, up to the largest the kernel takes."""
    return min(MAX_USER_TIMEOUT_MS, int(timeout_s * 1000))


def _tcp_connect_args(backend: str, query: Any, timeout_s: float) -> dict[str, Any]:
    """The driver's connect arguments that bound a silent server; a parameter the URL
    sets itself is left to the URL."""
    if backend in ("mysql", "mariadb"):
        # PyMySQL's connect_timeout bounds the TCP connect only: a server that accepts
        # and never greets (frozen, a stuck proxy) held the login forever. The read
        # timeout bounds the login; it is lifted once connected (``_mysql_setup``),
        # unless the URL sets it.
        args: dict[str, Any] = {"connect_timeout": min(31_536_000, max(1, math.ceil(timeout_s))),
                                "read_timeout": timeout_s}
    else:
        probe = _keepalive_s(timeout_s)
        # libpq's connect_timeout is whole seconds, at least 2.
        args = {"connect_timeout": max(2, math.ceil(timeout_s)), "keepalives": 1,
                "keepalives_idle": probe, "keepalives_interval": probe,
                "keepalives_count": 3, "tcp_user_timeout": _user_timeout_ms(timeout_s)}
    return {k: v for k, v in args.items() if k not in query}


def _bound_socket(sock: socket.socket, timeout_s: float) -> None:
    """TCP keepalive and user timeout on a connected socket (what libpq does for
    PostgreSQL; PyMySQL only turns keepalive on, at the system's two-hour idle)."""
    probe = _keepalive_s(timeout_s)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", probe), ("TCP_KEEPINTVL", probe),
                        ("TCP_KEEPCNT", 3), ("TCP_USER_TIMEOUT", _user_timeout_ms(timeout_s))):
        option = getattr(socket, name, None)  # Linux has them all; others some
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


def _postgres_setup(engine: Engine, timeout_s: float) -> None:
    # The server side of the session gets the same bounds: a client gone silent in the
    # middle of a transaction (a partition, a vanished host) has its session ended,
    # and its row locks released, within about ``timeout_s`` rather than at the idle
    # transaction timeout. (A frozen client's kernel still answers the probes: the idle
    # transaction timeout covers it.)
    probe = _keepalive_s(timeout_s)
    session = (f"SET idle_in_transaction_session_timeout = "
               f"{int(IDLE_IN_TRANSACTION_S * 1000)}; "
               f"SET tcp_keepalives_idle = {probe}; SET tcp_keepalives_interval = {probe}; "
               f"SET tcp_keepalives_count = 3; "
               f"SET tcp_user_timeout = {_user_timeout_ms(timeout_s)}")

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        with dbapi_conn.cursor() as cur:
            cur.execute(session)
        dbapi_conn.commit()


def _sqlite_setup(engine: Engine) -> None:
    # pysqlite's own transaction handling defers BEGIN and cannot take the write lock
    # up front; take control and begin every transaction IMMEDIATE, so two writers
    # queue for the lock instead of failing on a lock upgrade. Reads (Store.read) begin
    # deferred: in WAL mode they need no lock at all.
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        _sqlite_wal(cur)
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Straight to the driver: it runs once per transaction on the hot path.
        raw = conn.connection.driver_connection
        if conn.get_execution_options().get("lockgate_read"):
            raw.execute("BEGIN")  # a WAL reader takes no lock
        else:
            _begin_immediate(raw)


def _begin_immediate(raw: sqlite3.Connection, *, deadline_s: float | None = None) -> None:
    """Take SQLite's write lock, trying again every millisecond while another process
    holds it. SQLite's own busy handler sleeps 1, 2, 5, 10 ... then 100 ms between
    tries, so a writer that lost a few rounds to a busy neighbour slept up to 100 ms
    past the moment the lock was free (two worker processes on one file lost seconds
    per run to it). Other statements keep the busy timeout."""
    if deadline_s is None:
        deadline_s = BUSY_TIMEOUT_MS / 1000
    raw.execute("PRAGMA busy_timeout=0")
    try:
        _while_locked(lambda: raw.execute("BEGIN IMMEDIATE"), deadline_s=deadline_s,
                      pause_s=0.001, max_pause_s=0.001, warn_after_s=LOCK_WARN_S)
    except sqlite3.OperationalError as exc:
        if "locked" not in str(exc):
            raise
        # Out of SQLAlchemy's begin event the driver's error would pass unwrapped,
        # taken by every caller for a bug (a worker died; a submit printed a
        # traceback; a write-back dropped its trace). It is the database's trouble,
        # and passes.
        raise StoreError(
            f"the SQLite database is locked: another process has held its write lock for "
            f"over {deadline_s:g} s (a long transaction, a backup, or a sqlite3 shell left "
            f"inside BEGIN). Nothing was written; a worker waits for the lock and goes "
            f"on, a command can be run again once the lock is released", transient=True
        ) from exc
    finally:
        raw.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")


def _sqlite_wal(cur: Any, *, deadline_s: float = BUSY_TIMEOUT_MS / 1000) -> None:
    """Switch a new database file to WAL. The switch takes an exclusive lock and
    SQLite answers "database is locked" at once, without waiting on busy_timeout,
    while another connection opens the same fresh file; so retry for as long as a
    writer would wait. A file that is already WAL needs no lock at all."""
    if str(cur.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
        return
    _while_locked(lambda: cur.execute("PRAGMA journal_mode=WAL"), deadline_s=deadline_s,
                  pause_s=0.005, max_pause_s=0.2)


def _while_locked(run: Callable[[], object], *, deadline_s: float, pause_s: float,
                  max_pause_s: float, warn_after_s: float | None = None) -> None:
    """Call ``run`` until SQLite no longer answers "database is locked" (pausing
    ``pause_s``, doubled up to ``max_pause_s``), re-raising after ``deadline_s``; with
    ``warn_after_s``, a wait that long is logged once, as it goes on."""
    start = time.monotonic()
    give_up = start + deadline_s
    warn_at = start + warn_after_s if warn_after_s is not None else math.inf
    warned = False
    while True:
        try:
            run()
            break
        except sqlite3.OperationalError as exc:
            now = time.monotonic()
            if "locked" not in str(exc) or now >= give_up:
                raise
            if now >= warn_at and not warned:
                warned = True
                log.warning("waiting for the SQLite write lock: another process has held "
                            "it for %.0f s (up to %.0f s, then this operation fails and "
                            "is tried again)", now - start, deadline_s)
        time.sleep(pause_s)
        pause_s = min(pause_s * 2, max_pause_s)
    if warned:
        log.warning("the SQLite write lock was released after %.1f s",
                    time.monotonic() - start)


def _mysql_setup(engine: Engine, timeout_s: float, *, login_only: bool) -> None:
    @event.listens_for(engine, "handle_error")
    def _lost(ctx: Any) -> None:
        # A connection lost while an unbuffered (streamed) result was being read:
        # PyMySQL would read the rest of that result again when the cursor is
        # collected, on the dead socket, and print "Exception ignored in ..." with a
        # traceback after the error that said the database was lost.
        if not ctx.is_disconnect or ctx.execution_context is None:
            return
        result: Any = getattr(getattr(ctx.execution_context, "cursor", None), "_result",
                              None)
        if result is not None and getattr(result, "unbuffered_active", False):
            result.unbuffered_active = False

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        sock = getattr(dbapi_conn, "_sock", None)  # PyMySQL's (a Unix socket needs none)
        if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET,
                                                               socket.AF_INET6):
            _bound_socket(sock, timeout_s)
        cur = dbapi_conn.cursor()
        cur.execute("SET time_zone = '+00:00'")
        cur.execute("SET SESSION innodb_lock_wait_timeout = 30")
        if "mariadb" in str(dbapi_conn.get_server_info()).lower():  # not in MySQL
            cur.execute(f"SET SESSION idle_transaction_timeout = "
                        f"{max(1, int(IDLE_IN_TRANSACTION_S))}")
        cur.close()
        if login_only and hasattr(dbapi_conn, "_read_timeout"):
            # Logged in: a statement may take as long as it takes (a silent server
            # is noticed by the TCP user timeout and keepalives set above).
            dbapi_conn._read_timeout = None
