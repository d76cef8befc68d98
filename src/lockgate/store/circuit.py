"""Every SQL statement of the completeness circuits (tables ``quality_circuit`` and
``quality_circuit_event``, docs/quality.md).

A circuit's row moves only by compare-and-swap: one UPDATE naming the state and the
version it leaves, its row count checked, and the event row of the move inserted in the
same transaction (UNIQUE(prompt, version)). Any number of workers may evaluate the same
circuit at once without a lease: one of them moves it, the others find the row changed
and do nothing; a process killed mid-move leaves the transaction uncommitted, so the row
and its history always agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import select

from lockgate.store import schema
from lockgate.store.store import Store
from lockgate.store.tx import Tx, sql

_C, _E = schema.quality_circuit, schema.quality_circuit_event

_MOVE = sql("UPDATE quality_circuit SET state = :to, since = :now, reason = :reason, "
            "figures = :figures, manual = :manual, version = version + 1, "
            "changed_by = :actor, updated_at = :now "
            "WHERE prompt = :p AND state = :frm AND version = :v")


@dataclass(frozen=True, slots=True)
class CircuitRow:
    """A circuit as stored."""

    prompt: str
    state: str
    since: int
    reason: str | None
    figures: dict[str, Any] | None
    manual: bool
    version: int
    changed_by: str | None
    updated_at: int

    @classmethod
    def from_row(cls, m: Any) -> CircuitRow:
        return cls(str(m["prompt"]), str(m["state"]), int(m["since"]), m["reason"],
                   orjson.loads(m["figures"]) if m["figures"] else None, bool(m["manual"]),
                   int(m["version"]), m["changed_by"], int(m["updated_at"]))


@dataclass(frozen=True, slots=True)
class CircuitEvent:
    """One move of a circuit."""

    prompt: str
    version: int
    from_state: str
    to_state: str
    at: int
    actor: str
    reason: str | None
    figures: dict[str, Any] | None


class CircuitStore:
    """The circuit rows on one :class:`Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def ensure(self, prompts: Iterable[str], *, state: str = "CLOSED") -> None:
        """A row for each prompt that has none (insert-ignore: concurrent callers agree)."""
        wanted = sorted(set(prompts))
        if not wanted:
            return

        def work(tx: Tx) -> None:
            tx.execute(self.store.dialect.insert_ignore(_C), [
                {"prompt": p, "state": state, "since": tx.now, "manual": 0, "version": 0,
                 "updated_at": tx.now} for p in wanted])
        self.store.transaction(work)

    def rows(self) -> tuple[dict[str, CircuitRow], int]:
        """Every circuit row by prompt, and the database clock (ms)."""
        with self.store.read() as tx:
            return self.rows_in(tx), tx.now

    @staticmethod
    def rows_in(tx: Tx) -> dict[str, CircuitRow]:
        """Every circuit row by prompt, read in ``tx``."""
        return {str(r._mapping["prompt"]): CircuitRow.from_row(r._mapping)
                for r in tx.execute(select(_C))}

    def move(self, row: CircuitRow, to: str, *, actor: str, reason: str,
             figures: dict[str, Any] | None = None, manual: bool = False) -> CircuitRow | None:
        """Compare-and-swap ``row`` (its state and version) to ``to``, with the event row
        of the move; the row as moved, or None when another process moved it first."""
        text = None if figures is None else orjson.dumps(figures).decode()

        def work(tx: Tx) -> CircuitRow | None:
            n = tx.execute(_MOVE, {"p": row.prompt, "frm": row.state, "v": row.version,
                                   "to": to, "reason": reason[:2000], "figures": text,
                                   "manual": 1 if manual else 0,
                                   "actor": actor[:64]}).rowcount
            if n != 1:
                return None
            tx.execute(_E.insert(), [{
                "prompt": row.prompt, "version": row.version + 1, "from_state": row.state,
                "to_state": to, "at": tx.now, "actor": actor[:64], "reason": reason[:2000],
                "figures": text}])
            return CircuitRow(row.prompt, to, tx.now, reason[:2000], figures, manual,
                              row.version + 1, actor[:64], tx.now)
        return self.store.transaction(work)

    @staticmethod
    def last_move_in(tx: Tx, prompt: str, to_state: str) -> CircuitEvent | None:
        """The latest move of a circuit to ``to_state``, read in ``tx``, or None."""
        q = select(_E).where(_E.c.prompt == prompt, _E.c.to_state == to_state) \
            .order_by(_E.c.version.desc()).limit(1)
        for r in tx.execute(q):
            return _event(r._mapping)
        return None

    @staticmethod
    def moves_after(tx: Tx, prompt: str, after: int, *, limit: int = 5000
                    ) -> list[CircuitEvent]:
        """The moves of a circuit made after ``after`` (ms), oldest first (at most
        ``limit``), read in ``tx``."""
        q = select(_E).where(_E.c.prompt == prompt, _E.c.at > after) \
            .order_by(_E.c.version).limit(limit)
        return [_event(r._mapping) for r in tx.execute(q)]

    def events(self, prompt: str | None = None, *, limit: int = 100) -> list[CircuitEvent]:
        """The latest moves (of one prompt, or all), newest first."""
        q = select(_E).order_by(_E.c.id.desc()).limit(limit)
        if prompt is not None:
            q = q.where(_E.c.prompt == prompt)
        with self.store.read() as tx:
            return [_event(r._mapping) for r in tx.execute(q)]


def _event(m: Any) -> CircuitEvent:
    """A ``circuit_event`` row as a :class:`CircuitEvent`."""
    return CircuitEvent(str(m["prompt"]), int(m["version"]), str(m["from_state"]),
                        str(m["to_state"]), int(m["at"]), str(m["actor"]), m["reason"],
                        orjson.loads(m["figures"]) if m["figures"] else None)
