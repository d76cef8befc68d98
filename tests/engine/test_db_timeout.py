"""A client gives up a silent server connection within ``LOCKGATE_DB_TIMEOUT``: the TCP
user timeout, keepalive probes and the connect timeout are set on every server
connection (libpq's parameters on PostgreSQL, socket options on MySQL/MariaDB). The
partition scenario (tests/chaos/test_partition.py) shows what they do on a lossy link."""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

from conftest import BACKENDS
from engine.support import clean_env, lockgate_cmd
from lockgate.errors import ConfigError
from lockgate.store.engine import DB_TIMEOUT_S, create, db_timeout_s


def _bounds(url: str) -> dict[str, int]:
    """The bounds a connection of an engine made for ``url`` carries, in libpq's terms."""
    engine = create(url)
    try:
        return _connection_bounds(engine)
    finally:
        engine.dispose()


def _connection_bounds(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        raw: Any = conn.connection.driver_connection
        if engine.dialect.name == "postgresql":
            params = raw.info.get_parameters()
            return {k: int(params[k]) for k in (
                "connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval",
                "keepalives_count", "tcp_user_timeout") if k in params}
        sock: socket.socket = raw._sock
        return {
            "connect_timeout": int(raw.connect_timeout),
            "keepalives": sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            "keepalives_idle": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            "keepalives_interval": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
            "keepalives_count": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
            "tcp_user_timeout": sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT),
        }


@pytest.fixture(scope="module", params=[b for b in BACKENDS if b != "sqlite"])
def backend(request: pytest.FixtureRequest) -> str:
    """The server backends only: SQLite has no network connection to bound."""
    return str(request.param)


@pytest.fixture
def server_url(db_url: str) -> str:
    return db_url


def test_every_server_connection_carries_the_default_bounds(server_url: str) -> None:
    assert _bounds(server_url) == {
        "connect_timeout": 20, "keepalives": 1, "keepalives_idle": 5,
        "keepalives_interval": 5, "keepalives_count": 3, "tcp_user_timeout": 20_000}
    assert DB_TIMEOUT_S == 20


def test_the_environment_sets_the_bounds(server_url: str,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_DB_TIMEOUT", "1m")
    assert _bounds(server_url) == {
        "connect_timeout": 60, "keepalives": 1, "keepalives_idle": 15,
        "keepalives_interval": 15, "keepalives_count": 3, "tcp_user_timeout": 60_000}


def test_a_timeout_of_days_connects_with_the_kernels_largest_bounds(
        server_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``LOCKGATE_DB_TIMEOUT=2d`` made every connection fail ("setsockopt(TCP_KEEPIDLE)
    failed: Invalid argument" on PostgreSQL, "[Errno 22] Invalid argument" on MariaDB):
    the keepalive idle time and interval take at most 32767 s."""
    monkeypatch.setenv("LOCKGATE_DB_TIMEOUT", "2d")
    bounds = _bounds(server_url)
    assert (bounds["keepalives_idle"], bounds["keepalives_interval"]) == (32_767, 32_767)
    assert bounds["tcp_user_timeout"] == 172_800_000
    monkeypatch.setenv("LOCKGATE_DB_TIMEOUT", "52w")
    assert _bounds(server_url)["tcp_user_timeout"] == 2**31 - 1


def test_a_parameter_in_the_url_wins(server_url: str) -> None:
    if not server_url.startswith("postgresql"):
        pytest.skip("libpq's parameters are PostgreSQL's")
    sep = "&" if "?" in server_url else "?"
    bounds = _bounds(f"{server_url}{sep}tcp_user_timeout=7000&connect_timeout=9")
    assert bounds["tcp_user_timeout"] == 7000
    assert bounds["connect_timeout"] == 9
    assert bounds["keepalives_idle"] == 5  # the rest stays lockgate's


@pytest.mark.parametrize("value", ["0", "soon", "-5s", "10 parsecs"])
def test_a_bad_timeout_is_refused_by_name(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_DB_TIMEOUT", value)
    with pytest.raises(ConfigError, match="LOCKGATE_DB_TIMEOUT") as info:
        db_timeout_s()
    assert "default 20s" in str(info.value)


def test_durations_in_any_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    for value, seconds in (("90", 90.0), ("2.5s", 2.5), ("1m30s", 90.0), ("500ms", 0.5)):
        monkeypatch.setenv("LOCKGATE_DB_TIMEOUT", value)
        assert db_timeout_s() == seconds
    monkeypatch.delenv("LOCKGATE_DB_TIMEOUT")
    assert db_timeout_s() == DB_TIMEOUT_S


def test_the_server_side_of_a_postgresql_session_has_the_same_bounds(
        server_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client gone silent mid-transaction has its session (and row locks) ended by
    the server within the timeout, not at the idle-transaction timeout."""
    if not server_url.startswith("postgresql"):
        pytest.skip("MySQL/MariaDB set keepalive server-wide only")
    monkeypatch.setenv("LOCKGATE_DB_TIMEOUT", "8s")
    engine = create(server_url)
    try:
        with engine.connect() as conn:
            shown = {name: conn.exec_driver_sql(f"SHOW {name}").scalar() for name in (
                "tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count",
                "tcp_user_timeout", "idle_in_transaction_session_timeout")}
    finally:
        engine.dispose()
    # The keepalive and user-timeout values are read back from the server's socket.
    assert shown == {"tcp_keepalives_idle": "2", "tcp_keepalives_interval": "2",
                     "tcp_keepalives_count": "3", "tcp_user_timeout": "8000",
                     "idle_in_transaction_session_timeout": "1min"}


def test_a_mysql_connection_is_not_held_to_the_login_read_bound(server_url: str) -> None:
    """The read timeout that bounds the login is lifted once connected: a statement
    may take as long as it takes."""
    if server_url.startswith("postgresql"):
        pytest.skip("a MySQL/MariaDB client setting")
    engine = create(server_url)
    try:
        with engine.connect() as conn:
            raw: Any = conn.connection.driver_connection
            assert raw._read_timeout is None
            assert conn.exec_driver_sql("SELECT SLEEP(0.2)").scalar() == 0
    finally:
        engine.dispose()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port whose server accepts connections and never says a word (a frozen
    server, a stuck proxy): the kernel completes the handshakes into the backlog."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(16)
        yield srv.getsockname()[1]


@pytest.mark.parametrize("scheme", ["mysql", "postgresql"])
def test_a_server_that_accepts_and_never_answers_is_given_up_within_the_timeout(
        silent_port: int, scheme: str) -> None:
    """MySQL/MariaDB's login waited for the server's greeting forever (PyMySQL's
    connect timeout bounds the TCP connect only); PostgreSQL's gave up but called the
    server's silence a refusal ("refused the operation: connection timeout expired")."""
    user = "root" if scheme == "mysql" else "postgres"
    res = subprocess.run(lockgate_cmd("status", "--db",
                                      f"{scheme}://{user}@127.0.0.1:{silent_port}/x"),
                         capture_output=True, text=True, timeout=60,
                         env=clean_env(LOCKGATE_DB_TIMEOUT="2s"))
    assert res.returncode == 2, res.stderr
    assert "cannot reach the database" in res.stderr, res.stderr
