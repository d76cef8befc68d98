"""A fifth newcomer's review, on the database servers: a URL whose scheme is in upper
case, a PostgreSQL URL without a database, and a MySQL/MariaDB login refused."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from typer.testing import CliRunner, Result

from conftest import MARIADB_URL, _admin_engine, require_server
from lockgate.cli import app
from lockgate.errors import ConfigError, StoreError
from lockgate.store import Store
from lockgate.store.engine import create


def lockgate(*args: str) -> Result:
    return CliRunner().invoke(app, list(args), catch_exceptions=False, prog_name="lockgate")


def flat(text: str) -> str:
    return " ".join(text.split())


def test_an_upper_case_scheme_reaches_the_server(fresh_db_url: str) -> None:
    """``POSTGRES://`` and ``MYSQL://`` crashed with NoSuchModuleError (exit 1)."""
    scheme, _, rest = fresh_db_url.partition("://")
    r = lockgate("init", "--db", f"{scheme.upper()}://{rest}")
    assert r.exit_code == 0, r.output
    assert "schema created" in r.output, r.output


@pytest.mark.parametrize("url", ["postgresql://postgres@127.0.0.1:5432",
                                 "postgresql://postgres@127.0.0.1:5432/",
                                 "POSTGRES://app:pw@db"])
def test_a_postgresql_url_without_a_database_is_refused(url: str) -> None:
    """It connected to the server's default database and created the tables there."""
    with pytest.raises(ConfigError) as info:
        create(url)
    message = str(info.value)
    assert "names no database; add it after the server" in message, message
    assert "/lockgate" in message and "createdb lockgate" in message, message
    assert ":pw@" not in message


def test_init_without_a_database_is_refused_before_connecting() -> None:
    # (port 1: nothing listens there, so the lockgate before the fix, which would have
    # created its tables in the server's default database, fails to connect instead)
    r = lockgate("init", "--db", "postgresql://postgres@127.0.0.1:1")
    assert r.exit_code == 2, r.output
    assert "names no database" in flat(r.output), r.output


def test_a_wrong_mysql_password_names_the_url_to_fix() -> None:
    """It printed the driver's bare `(1045, "Access denied ...")`."""
    require_server("mariadb")
    url = make_url(MARIADB_URL).set(password="certainly-wrong").render_as_string(
        hide_password=False)
    store = Store(url, pool_size=1)
    try:
        with pytest.raises(StoreError) as info:
            store.migrate()
    finally:
        store.close()
    message = str(info.value)
    assert "refused the login" in message and "1045" in message, message
    assert "Fix the user or password in the URL (--db or LOCKGATE_DATABASE_URL" in message
    assert "certainly-wrong" not in message


@pytest.fixture
def low_user() -> Iterator[tuple[str, str]]:
    """A MariaDB user that may log in but reach no database."""
    require_server("mariadb")
    name, password = f"lg_r5_{secrets.token_hex(3)}", secrets.token_hex(8)
    admin = _admin_engine(MARIADB_URL)
    with admin.connect() as conn:
        conn.execute(text(f"CREATE USER '{name}'@'%' IDENTIFIED BY '{password}'"))
    try:
        yield name, password
    finally:
        with admin.connect() as conn:
            conn.execute(text(f"DROP USER IF EXISTS '{name}'@'%'"))
        admin.dispose()


def test_a_mysql_user_without_access_to_the_database_is_told_so(
        low_user: tuple[str, str]) -> None:
    name, password = low_user
    url = make_url(MARIADB_URL).set(username=name, password=password).render_as_string(
        hide_password=False)
    r = lockgate("init", "--db", url)
    assert r.exit_code == 2, r.output
    text_ = flat(r.output)
    assert "refused the user access to the database" in text_ and "1044" in text_, text_
    assert password not in text_
