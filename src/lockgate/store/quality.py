"""Every SQL statement of the quality rollups (table ``quality_rollup``).

The arithmetic lives in :mod:`lockgate.quality` (rollups merge in Python: the latency
sketch and the maps of counts cannot be added in SQL). Writes happen inside the
write-back's transaction (:meth:`Store.finish` hands its attempt rows over): the rows of
one flush are read under a row lock, merged and written back, one row per key, each
statement taking every key of the flush at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import select
from sqlalchemy.engine import Dialect

from lockgate.store import schema
from lockgate.store.store import Store
from lockgate.store.tx import Tx, sql

#: (resolution, bucket, prompt, model, endpoint): a rollup row's key within a shard.
RowKey = tuple[str, int, str, str, str]

_T = schema.quality_rollup
_KEY_NAMES = ("resolution", "bucket", "prompt", "model", "endpoint")
_VALUE_COLS = tuple(c.name for c in _T.columns
                    if c.name not in ("id", *_KEY_NAMES, "shard", "updated_at"))

_TASKS_SQL = "SELECT id, config_hash, task_id, batch_id FROM task WHERE id IN ({})"
_CONFIGS = sql("SELECT hash, document FROM task_config WHERE hash IN :h", "h")
_CONFIG_HASHES = sql("SELECT hash FROM task_config")
_PRUNE = sql("DELETE FROM quality_rollup WHERE resolution = :r AND bucket < :before")
_VERSION_RULE = sql("SELECT v.delivery_rule FROM prompt_version v JOIN prompt p "
                    "ON p.id = v.prompt_id WHERE p.name = :name AND v.version = :version")


def _mark(dialect: Dialect) -> str:
    """The driver's positional parameter marker (SQL text sent as it is)."""
    return "?" if dialect.paramstyle == "qmark" else "%s"


class _RollupSql:
    """The write-back's rollup statements as SQL text in the driver's parameter style."""

    def __init__(self, dialect: Dialect, lock: str,
                 upsert: Callable[[Sequence[str], Sequence[str]], str]) -> None:
        quote = dialect.identifier_preparer.quote
        mark = _mark(dialect)
        keys = [quote(c) for c in _KEY_NAMES]
        values = [quote(c) for c in _VALUE_COLS]
        table = quote(_T.name)
        self._select = (f"SELECT {', '.join(keys + values)} FROM {table} "
                        f"WHERE {quote('shard')} = {mark} AND (")
        self._one = "(" + " AND ".join(f"{k} = {mark}" for k in keys) + ")"
        self._lock = lock
        self._selects: dict[int, str] = {}
        columns = [*keys, quote("shard"), quote("updated_at"), *values]
        self.insert = (f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
                       f"({', '.join([mark] * len(columns))})")
        # Rows that exist (locked by the read before) are written by an upsert: one
        # multi-row statement where an UPDATE would be one statement per row (PyMySQL).
        # New rows are plainly inserted, so that two writers of one shard opening the
        # same row collide (and retry) instead of one overwriting the other's counts.
        self.update = self.insert + upsert([*keys, quote("shard")],
                                           [*values, quote("updated_at")])

    def select(self, n: int) -> str:
        """Rows of ``n`` keys of one shard: the shard, then each key's five values."""
        text_ = self._selects.get(n)
        if text_ is None:
            text_ = self._selects[n] = (self._select + " OR ".join([self._one] * n) + ")"
                                        + self._lock)
        return text_


@dataclass(frozen=True, slots=True)
class TaskInfo:
    """What the quality loop files a task's attempts under."""

    config_hash: str
    task_id: str
    batch_id: str


@dataclass(frozen=True, slots=True)
class StoredRollup:
    """One stored row: its key, shard and the columns :class:`Rollup` reads."""

    resolution: str
    bucket: int
    prompt: str
    model: str
    endpoint: str
    shard: str
    values: dict[str, Any]


class QualityStore:
    """Rollup rows on one :class:`Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.dialect = store.dialect
        self._texts: _RollupSql | None = None

    # -- what the writer needs to know about the tasks of a flush ---------------------

    def tasks(self, tx: Tx, ids: Iterable[int]) -> dict[int, TaskInfo]:
        """The config hash, task id and batch of each task among ``ids``.

        On the write-back's path: the statement goes to the driver as text (no
        compilation of an expanding IN per flush), its id list padded to a power of two
        so a connection caches at most a handful of statement texts."""
        wanted = sorted(set(ids))
        out: dict[int, TaskInfo] = {}
        for i in range(0, len(wanted), 512):
            part = wanted[i:i + 512]
            size = 1 << (len(part) - 1).bit_length()
            params = tuple(part) + (part[-1],) * (size - len(part))
            mark = _mark(tx.conn.dialect)
            marks = ", ".join([mark] * size)
            out.update((int(pk), TaskInfo(str(h), str(t), str(b))) for pk, h, t, b in
                       tx.conn.exec_driver_sql(_TASKS_SQL.format(marks), params))
        return out

    @staticmethod
    def config_hashes(tx: Tx) -> list[str]:
        """Every config's hash (one per distinct task config: few for most files, one
        per line for an OpenAI batch file)."""
        return [str(h) for h in tx.execute(_CONFIG_HASHES).scalars()]

    @staticmethod
    def config_documents(tx: Tx, hashes: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Config documents by hash."""
        wanted = sorted(set(hashes))
        if not wanted:
            return {}
        return {str(h): orjson.loads(d) for h, d in tx.execute(_CONFIGS, {"h": wanted})}

    @staticmethod
    def version_rule(tx: Tx, name: str, version: int) -> dict[str, Any] | None:
        """The delivery rule of a registry prompt version, or None if it is unknown."""
        doc = tx.execute(_VERSION_RULE, {"name": name, "version": version}).scalar()
        return None if doc is None else orjson.loads(doc)

    # -- writing ---------------------------------------------------------------------

    def locked(self, tx: Tx, shard: str, keys: Sequence[RowKey]) -> dict[RowKey, dict[str, Any]]:
        """The stored rows of ``keys`` in ``shard`` (row-locked), by key.

        On the write-back's path, as :meth:`tasks`: SQL text straight to the driver, one
        text per number of keys (a write-back touches a handful)."""
        out: dict[RowKey, dict[str, Any]] = {}
        ordered = sorted(set(keys))
        sql_ = self._sql(tx)
        for i in range(0, len(ordered), 200):
            part = ordered[i:i + 200]
            params: list[Any] = [shard]
            for k in part:
                params.extend(k)
            for r in tx.conn.exec_driver_sql(sql_.select(len(part)), tuple(params)):
                out[(r[0], int(r[1]), r[2], r[3], r[4])] = dict(zip(_VALUE_COLS, r[5:],
                                                                    strict=True))
        return out

    def write(self, tx: Tx, shard: str, rows: Mapping[RowKey, dict[str, Any]],
              existing: Iterable[RowKey], updated_at: int) -> None:
        """Write merged rows: one INSERT of the keys not in ``existing``, one upsert of
        those that are (read under lock before). A write-back's rollup thus costs the
        database the locked read and one or two statements, whatever its number of
        rows."""
        have = set(existing)
        sql_ = self._sql(tx)
        new: list[tuple[Any, ...]] = []
        old: list[tuple[Any, ...]] = []
        for k, v in sorted(rows.items()):
            (old if k in have else new).append(
                (*k, shard, updated_at, *(v[c] for c in _VALUE_COLS)))
        if new:
            tx.conn.exec_driver_sql(sql_.insert, new)
        if old:
            tx.conn.exec_driver_sql(sql_.update, old)

    def _sql(self, tx: Tx) -> _RollupSql:
        if self._texts is None:
            self._texts = _RollupSql(tx.conn.dialect, self.dialect.lock_for_update(),
                                     self.dialect.upsert_suffix)
        return self._texts

    def prune(self, keep_ms: dict[str, int]) -> int:
        """Delete rows of each resolution whose span began more than ``keep_ms`` of it
        ago (database clock); returns how many."""
        def work(tx: Tx) -> int:
            n = 0
            for res, keep in sorted(keep_ms.items()):
                n += tx.execute(_PRUNE, {"r": res, "before": tx.now - keep}).rowcount
            return n
        return self.store.transaction(work)

    # -- reading ---------------------------------------------------------------------

    def rows(self, resolution: str, *, since: int, until: int | None = None,
             prompt: str | None = None, prompt_prefix: str | None = None
             ) -> list[StoredRollup]:
        """Stored rows of ``resolution`` whose bucket starts at or after ``since`` (and
        before ``until``), of one prompt or of prompts starting with a prefix."""
        query = select(_T).where(_T.c.resolution == resolution, _T.c.bucket >= since)
        if until is not None:
            query = query.where(_T.c.bucket < until)
        if prompt is not None:
            query = query.where(_T.c.prompt == prompt)
        if prompt_prefix is not None:
            query = query.where(_T.c.prompt.startswith(prompt_prefix, autoescape=True))
        query = query.order_by(_T.c.bucket, _T.c.prompt, _T.c.model, _T.c.endpoint,
                               _T.c.shard)
        with self.store.read() as tx:
            return [StoredRollup(m["resolution"], int(m["bucket"]), m["prompt"], m["model"],
                                 m["endpoint"], m["shard"], {c: m[c] for c in _VALUE_COLS})
                    for m in (r._mapping for r in tx.execute(query))]

    def now(self) -> int:
        """The database clock (ms)."""
        return self.store.db_now()
