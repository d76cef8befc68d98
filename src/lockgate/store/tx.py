"""The one way into the database for the stores: a transaction (or a read) with its clock.

:meth:`Store.transaction` runs a function in one transaction and hands it a :class:`Tx`;
:meth:`Store.read` opens a read-only one. Every statement the stores run goes through
:meth:`Tx.execute`, which binds ``:now`` to the database clock in milliseconds, read
once per transaction (the first time a statement or the code asks for it): the rows a
transaction writes share one time, and no store repeats the clock's SQL. The claim and
write-back statements of the hot path (``store/dialects/``) are single statements and use
the clock expression inline.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson
from sqlalchemy import BindParameter, Connection, CursorResult, Executable, TextClause, text
from sqlalchemy import bindparam as _bindparam
from sqlalchemy.util.typing import TupleAny

from lockgate.errors import NotFound
from lockgate.store.types import Finish, row_dict

_NOW = re.compile(r":now\b")


def in_list(name: str) -> BindParameter[Any]:
    """A parameter that takes a list and expands to ``(:x_1, :x_2, ...)`` for ``IN``
    (the driver binds each value; nothing is pasted into the SQL)."""
    return _bindparam(name, expanding=True)


def sql(statement: str, *lists: str) -> TextClause:
    """A named statement: ``text()`` with the listed parameters expanding for ``IN``."""
    clause = text(statement)
    return clause.bindparams(*(in_list(n) for n in lists)) if lists else clause


class Tx:
    """One transaction's connection and clock (see the module docstring)."""

    __slots__ = ("_now", "clock_sql", "conn")

    def __init__(self, conn: Connection, clock_sql: str) -> None:
        #: The SQLAlchemy connection, for the dialect's hot-path statements.
        self.conn = conn
        #: The dialect's SQL for the clock in ms (``Dialect.now``).
        self.clock_sql = clock_sql
        self._now: int | None = None

    @property
    def now(self) -> int:
        """The database clock in ms, read once per transaction."""
        if self._now is None:
            self._now = int(self.conn.execute(text(f"SELECT {self.clock_sql}")).scalar_one())
        return self._now

    def execute(self, statement: Executable | str,
                parameters: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
                ) -> CursorResult[*TupleAny]:
        """Run a statement (a string is taken as SQL text); ``:now`` is bound to
        :attr:`now` wherever the statement names it."""
        if isinstance(statement, str):
            statement = text(statement)
        if isinstance(statement, TextClause) and _NOW.search(statement.text):
            if parameters is None:
                parameters = {"now": self.now}
            elif isinstance(parameters, Mapping):
                parameters = {"now": self.now, **parameters}
            else:
                parameters = [{"now": self.now, **p} for p in parameters]
        return self.conn.execute(statement, parameters)

    def rows(self, statement: Executable | str,
             parameters: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Every row of a query as a dict of column name to value."""
        return [row_dict(r) for r in self.execute(statement, parameters)]

    def one(self, statement: Executable | str, parameters: Mapping[str, Any] | None = None,
            *, missing: NotFound, json: Sequence[str] = ()) -> dict[str, Any]:
        """The first row of a query as a dict of column name to value, with the JSON text
        of the ``json`` columns decoded (NULL stays None); raises ``missing`` (naming
        what is absent and how to list or create it) when there is none."""
        row = self.execute(statement, parameters).first()
        if row is None:
            raise missing
        out = row_dict(row)
        for column in json:
            if out[column] is not None:
                out[column] = orjson.loads(out[column])
        return out

    def stream(self, statement: Executable, parameters: Mapping[str, Any] | None = None, *,
               rows: int = 1000) -> CursorResult[*TupleAny]:
        """Run a query whose rows are fetched ``rows`` at a time (a server-side cursor
        where the driver has one), for results too large to hold."""
        return self.conn.execution_options(yield_per=rows).execute(statement, parameters)


#: What :meth:`Store.finish` (and a review's resolution) hands the attempt rows it wrote
#: to, in its transaction.
AttemptObserver = Callable[[Tx, Sequence[tuple[Finish, dict[str, Any]]]], None]
