"""The one boundary where database errors become lockgate's.

SQLAlchemy and driver exceptions never leave the store: :func:`map_db_errors` turns each
into a :class:`~lockgate.errors.StoreError` that says, in one line, what went wrong on
which database (its password hidden), and whether trying again later can help
(``transient``). A server that cannot be reached, or a connection lost mid-statement,
becomes :class:`~lockgate.errors.DatabaseUnavailable`: "cannot reach the database" when
it did not answer, "the database server closed the session" when it answered and then
ended the session (a kill, a restart: the URL is right).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import (
    DataError,
    DBAPIError,
    IntegrityError,
    NotSupportedError,
    ProgrammingError,
    SQLAlchemyError,
)

from lockgate.errors import DatabaseUnavailable, LockgateError, StoreError
from lockgate.redact import redact_url

#: MySQL/MariaDB error numbers of a lock conflict that a retry resolves.
_MYSQL_CONFLICTS = frozenset({1205, 1213})
#: ... and of a connection that failed or was lost.
_MYSQL_GONE = frozenset({1040, 1053, 1927, 2002, 2003, 2005, 2006, 2013, 2055, 4031})
#: ... and of a statement larger than the server's ``max_allowed_packet`` (it then
#: closes the connection: not a server that cannot be reached).
_MYSQL_TOO_LARGE = frozenset({1153, 1301})
#: ... of a login refused (access denied: wrong password, unknown user or host), and of
#: a user refused the database the URL names.
_MYSQL_LOGIN = frozenset({1045, 1698})
_MYSQL_NO_ACCESS = frozenset({1044})
#: PostgreSQL SQLSTATEs of a lock conflict that a retry resolves (serialization
#: failure, deadlock, lock not available).
_PG_CONFLICTS = frozenset({"40001", "40P01", "55P03"})
#: ... and of a server going away or refusing connections for now.
_PG_GONE = frozenset({"57P01", "57P02", "57P03", "53300"})
#: MySQL/MariaDB error numbers of a condition that passes while the server answers: a
#: statement interrupted (KILL QUERY, ``max_statement_time``/``max_execution_time``), a
#: server made read-only (a failover, ``read_only``), a full disk or memory.
_MYSQL_PASSING = frozenset({1317, 1969, 3024, 1290, 1792, 1836, 1021, 1041})
#: PostgreSQL SQLSTATEs of a condition that passes while the server answers: a statement
#: cancelled (``statement_timeout``, ``pg_cancel_backend``), a read-only transaction (a
#: standby after a failover, ``default_transaction_read_only``), a full disk or memory.
_PG_PASSING = frozenset({"57014", "25006", "53100", "53200"})
#: SQLite messages of conditions that pass: another writer, a full disk, a file made
#: read-only (space returns, a lock is released, permissions are fixed).
_SQLITE_PASSING = ("locked", "busy", "disk is full", "disk i/o", "readonly")
#: ... of those, the ones a worker that opens the database waits out: another writer, a
#: full disk, a disk SQLite cannot write (it says "disk I/O error" when a full disk
#: leaves no room for the -shm file it creates as it opens). A file made read-only is
#: most often a mistake at start: said at once.
_SQLITE_WAIT = tuple(w for w in _SQLITE_PASSING if w != "readonly")
#: Free bytes below which the disk holding a SQLite file is called full: a few steps of
#: the -wal file and the 32 KiB -shm file do not fit.
FULL_BELOW_BYTES = 1 << 20


def _mysql_code(exc: DBAPIError) -> int | None:
    args = getattr(exc.orig, "args", None)
    return args[0] if args and isinstance(args[0], int) else None


def is_conflict(exc: DBAPIError) -> bool:
    """A deadlock, lock timeout or serialisation failure: the transaction may simply be
    run again at once."""
    if _mysql_code(exc) in _MYSQL_CONFLICTS:
        return True
    if getattr(exc.orig, "sqlstate", None) in _PG_CONFLICTS:
        return True
    # "database is locked" (another writer), and "locking protocol" (SQLITE_PROTOCOL:
    # a WAL lock race lost under heavy contention, which SQLite documents as retryable)
    return isinstance(exc.orig, sqlite3.OperationalError) and any(
        word in str(exc.orig) for word in ("locked", "locking protocol"))


def is_unavailable(exc: DBAPIError) -> bool:
    """The server could not be reached, or the connection was lost."""
    if exc.connection_invalidated:
        return True
    code = _mysql_code(exc)
    if code is not None:
        return code in _MYSQL_GONE
    sqlstate = getattr(exc.orig, "sqlstate", None)
    if sqlstate is not None:
        return sqlstate in _PG_GONE or str(sqlstate).startswith("08")
    if isinstance(exc.orig, sqlite3.Error):
        return False
    # psycopg reports a refused, failed or timed-out connection attempt without a
    # SQLSTATE, as an OperationalError or a subclass (ConnectionTimeout)
    return any(c.__name__ == "OperationalError" for c in type(exc.orig).__mro__)


def is_transient(exc: DBAPIError) -> bool:
    """Whether the same operation may succeed if tried again later."""
    if is_conflict(exc) or is_unavailable(exc):
        return True
    if _mysql_code(exc) in _MYSQL_PASSING:
        return True
    if getattr(exc.orig, "sqlstate", None) in _PG_PASSING:
        return True
    if isinstance(exc.orig, sqlite3.OperationalError):
        text = str(exc.orig).lower()
        return any(s in text for s in _SQLITE_PASSING)
    return False


def is_permanent(exc: BaseException) -> bool:
    """A :class:`StoreError` that the same operation gets every time, however long one
    waits: a constraint the row breaks (integrity), a statement or object the database
    does not know or refuses on principle (programming, a value it cannot hold)."""
    return (isinstance(exc, StoreError) and not exc.transient
            and isinstance(exc.__cause__, (IntegrityError, ProgrammingError, DataError,
                                           NotSupportedError)))


#: A server's words for connections refused for now while it answers: its connection
#: slots are full (``max_connections``, a database's or a user's connection limit), it is
#: starting up, shutting down or recovering, or the database takes no connections for
#: the moment (PostgreSQL reports these at connection without a SQLSTATE).
_REFUSED_FOR_NOW = re.compile(
    r"too many connections|connection slots are reserved|is starting up|is shutting down|"
    r"in recovery mode|not yet accepting connections|not currently accepting connections|"
    r"max_user_connections|max_connections_per_hour", re.IGNORECASE)


def refused_for_now(exc: BaseException) -> bool:
    """Whether ``exc`` is a server that answered but takes no connection for now (see
    :data:`_REFUSED_FOR_NOW`): worth waiting for, unlike a login refused, a database
    that does not exist or a server that cannot be reached at all."""
    return isinstance(exc, StoreError) and bool(_REFUSED_FOR_NOW.search(str(exc)))


#: A server's words for a session it took and then dropped: ended by an administrator,
#: a fast shutdown or a restart (PostgreSQL 57P01, 57P02 "terminating connection"), or
#: closed under the client (PostgreSQL "server closed the connection unexpectedly";
#: MySQL/MariaDB 2013 "Lost connection", 2006 "server has gone away", 1927 "Connection
#: was killed"). A server that cannot be reached at all says "Connection refused",
#: "Can't connect" or times out.
_DROPPED = re.compile(
    r"terminating connection|server closed the connection unexpectedly|"
    r"lost connection to (mysql|mariadb) server|server has gone away|"
    r"connection was killed", re.IGNORECASE)


#: A driver's words for a connection that was being made, not a session: libpq says
#: "server closed the connection unexpectedly" of a connect cut by its TCP timeout in a
#: network partition too, and MySQL/MariaDB "Lost connection" during the handshake.
_CONNECTING = re.compile(r"connection failed:|handshake|initial communication packet",
                         re.IGNORECASE)


def _dropped(text: str) -> bool:
    """Whether ``text`` tells of a connection the server dropped (:data:`_DROPPED`); one
    that timed out is a server that did not answer: not this."""
    return bool(_DROPPED.search(text)) and "timed out" not in text.lower()


def closed_by_server(text: str) -> bool:
    """Whether ``text`` (a driver's message of a connection lost) tells of a session the
    server took and then ended: dropped (:func:`_dropped`), and not while it was being
    made (:data:`_CONNECTING`: a partition cuts a connect so too)."""
    return _dropped(text) and _CONNECTING.search(text) is None


def dropped_for_now(exc: BaseException) -> bool:
    """Whether ``exc`` is a connection the server dropped (:func:`_dropped`), a session
    or one being made: it is there, and a restart or a kill passes."""
    return isinstance(exc, DatabaseUnavailable) and _dropped(str(exc))


def sqlite_passing(exc: BaseException) -> bool:
    """Whether ``exc`` is a SQLite database that is there but cannot be used for now
    (see :data:`_SQLITE_WAIT`): locked by another writer, or on a full disk or one it
    cannot write. A worker opening it waits; one-shot commands say so and end."""
    orig = getattr(exc.__cause__, "orig", exc.__cause__)
    return (isinstance(exc, StoreError) and isinstance(orig, sqlite3.OperationalError)
            and any(word in str(orig).lower() for word in _SQLITE_WAIT))


def cause(exc: BaseException) -> str:
    """The driver's own message, first line, without SQLAlchemy's background link."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip() or type(orig).__name__
    return text.splitlines()[0].strip().rstrip(".")


def _free_bytes(folder: Path) -> int | None:
    """The bytes free on the disk holding ``folder`` (None if it cannot be read)."""
    with contextlib.suppress(OSError):
        return shutil.disk_usage(folder).free
    return None


def sqlite_hint(message: str, url: str | None) -> str:
    """What to do about a SQLite file that cannot be written or has no room, as
    sentences that follow the message ("" when it is about something else)."""
    text = message.lower()
    path = Path(make_url(url).database or "") if url else None
    if "not a database" in text:  # SQLITE_NOTADB: some other file at that path
        return (f". {path or 'The file'} is not an SQLite database (another kind of file, "
                "or a damaged one): name the lockgate database file, or a new file name "
                "to create one.")
    if path is not None and path.is_dir() and "unable to open" in text:
        return f". {path} is a folder; name a database file in it, e.g. {path / 'lockgate.db'}."
    free = _free_bytes(path.parent) if path is not None else None
    full = free is not None and free < FULL_BELOW_BYTES
    if "full" in text or ("disk i/o" in text and full):
        what = (f". The disk holding {path} is full ({free:,} bytes free): SQLite cannot "
                "create the -wal and -shm files it keeps beside it. Free space on it"
                if "disk i/o" in text else  # (SQLITE_IOERR: as it opens, on a full disk)
                ". Free space on the disk that holds the file and its -wal file"
                + (f" ({free:,} bytes free)" if full else ""))
        return (f"{what}: nothing written so far is lost, and the same command run again "
                "(a worker, by itself) goes on.")
    if "disk i/o" in text:  # SQLITE_IOERR: a read or write of the file or its -wal/-shm
        folder = path.parent if path is not None else "the database's folder"
        return (". SQLite could not read or write the file or the -wal and -shm files it "
                "keeps beside it; most often the disk is full, files cannot be created in "
                f"{folder} (permissions), or it is on a network file system (NFS, SMB), "
                f"where SQLite's locks fail. Check the free space (df {folder}) and the "
                "folder's permissions; keep the database on a local disk.")
    if "readonly" not in text and "unable to open" not in text:
        return ""
    if path is not None and not path.parent.exists():
        return (f". The folder {path.parent} does not exist: create it, or name a file "
                "in a folder that does.")
    if path is not None and path.parent.is_dir():
        with contextlib.suppress(OSError):
            if os.statvfs(path.parent).f_flag & os.ST_RDONLY:
                return (f". The file system holding {path} is mounted read-only; SQLite "
                        "writes the file and its -wal and -shm files beside it, even to "
                        "read: remount it read-write.")
    return (". SQLite writes the database file and its -wal and -shm files beside it, "
            "even to read: make the file and its folder writable (permissions, a "
            "read-only mount, chattr +i).")


def refused(text: str, url: str | None, *, sqlite: bool) -> str:
    """The message of an operation the database refused, ``text`` in the driver's
    words, with what to do about a SQLite file: whole sentences, so that more advice
    may follow."""
    where = f" {redact_url(url)}" if url else ""
    hint = sqlite_hint(text, url) if sqlite else ""
    return f"the database{where} refused the operation: {text}{hint or '.'}"


#: A server's words for a database that does not exist (PostgreSQL, MySQL/MariaDB).
_MISSING_DB = re.compile(r'database "([^"]+)" does not exist|Unknown database \'([^\']+)\'')


def _login_refused(exc: DBAPIError, where: str) -> StoreError | None:
    """A MySQL/MariaDB server that refused the URL's user, password or database (None
    for any other error)."""
    code = _mysql_code(exc)
    if code in _MYSQL_LOGIN:
        return StoreError(f"the database{where} refused the login: {cause(exc)}. Fix the "
                          "user or password in the URL (--db or LOCKGATE_DATABASE_URL; "
                          "a password with @, : or / is written %40, %3A, %2F).")
    if code in _MYSQL_NO_ACCESS:
        return StoreError(f"the database{where} refused the user access to the database: "
                          f"{cause(exc)}. Fix the database name or the user in the URL "
                          "(--db or LOCKGATE_DATABASE_URL), or grant the user access "
                          "(GRANT ALL ON lockgate.* TO ...).")
    return None


def translate(exc: SQLAlchemyError, url: str | None = None) -> StoreError:
    """The lockgate error for one SQLAlchemy/driver exception."""
    where = f" {redact_url(url)}" if url else ""
    if isinstance(exc, DBAPIError):
        missing = _MISSING_DB.search(cause(exc))
        if missing:  # the server answers: the database named in the URL is not there
            name = missing.group(1) or missing.group(2)
            return StoreError(f"the database{where} does not exist on its server: create "
                              f"it first (CREATE DATABASE {name}), or fix the URL (--db or "
                              "LOCKGATE_DATABASE_URL).")
        login = _login_refused(exc, where)
        if login is not None:
            return login
        if _mysql_code(exc) in _MYSQL_TOO_LARGE:
            return StoreError(f"the database{where} refused a statement larger than its "
                              f"max_allowed_packet: {cause(exc)}. Running it again cannot "
                              "help: make the task (its input, metadata or template) "
                              "smaller, or raise max_allowed_packet on the server.")
        if is_unavailable(exc):
            text = cause(exc)
            sent = (" The server reset the connection while a statement was being sent: "
                    "it does so to a statement larger than its max_allowed_packet (SELECT "
                    "@@max_allowed_packet), which no retry can pass."
                    if _mysql_code(exc) == 2006 and ("ConnectionReset" in text
                                                     or "BrokenPipe" in text) else "")
            if closed_by_server(text):  # it answered: neither down nor a wrong URL
                at = f" ({redact_url(url)})" if url else ""
                return DatabaseUnavailable(
                    f"the database server closed the session{at}: {text}." + (sent or (
                        " It was reached and then ended the session (killed by an "
                        "administrator, a restart, a failover): the URL is right, and a "
                        "new session goes on once the server takes connections again.")))
            return DatabaseUnavailable(
                f"cannot reach the database{where}: {text}.{sent} Is the server running, "
                "and is the URL (--db or LOCKGATE_DATABASE_URL) right?")
        return StoreError(refused(cause(exc), url, sqlite=isinstance(exc.orig, sqlite3.Error)),
                          transient=is_transient(exc))
    return StoreError(f"database error{where}: {cause(exc)}.")


@contextmanager
def map_db_errors(url: str | None = None) -> Iterator[None]:
    """Raise every SQLAlchemy or driver exception from the block as a
    :class:`StoreError` naming ``url`` (password hidden). lockgate's own errors pass."""
    try:
        yield
    except LockgateError:
        raise
    except SQLAlchemyError as exc:
        raise translate(exc, url) from exc
    except sqlite3.Error as exc:  # the hot path's raw cursors, outside SQLAlchemy
        raise StoreError(refused(cause(exc), url, sqlite=True), transient=any(
            s in str(exc).lower() for s in _SQLITE_PASSING)) from exc
