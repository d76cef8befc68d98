"""Every SQL statement of flow control: shared budgets, pauses, lanes, paced windows,
per-worker metrics and the status report.

The arithmetic lives in flow control (:mod:`lockgate.flow.leasing`), which hands it in
as a function: here rows are read under a lock together with the database clock, given
to that function, and written back under their version.
One transaction serves every bucket a worker touches in one tick, so a worker costs the
database a handful of small transactions per second however many calls it makes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from sqlalchemy import TextClause, text

from lockgate.errors import SpecError
from lockgate.store import schema
from lockgate.store.store import Store
from lockgate.store.tx import Tx, sql
from lockgate.store.types import ClaimedTask

#: Most batches per pool a lane scan reports (the rest wait for a later scan).
MAX_LANES = 64
#: Attempts the failure-rate query looks at, newest first, within its time span.
RECENT_ATTEMPTS = 5000

R = TypeVar("R")

_ROW_COLS = ("name, kind, rpm, tpm, window_ms, learned_rpm, learned_tpm, req_allowance, "
             "tok_allowance, refilled_at, paused_until, pause_reason, version, rate_factor, "
             "cut_at")

# -- the statements (``{lock}``: the dialect's row lock, filled in once per store) ----
_RECENT_TOP = sql("SELECT MAX(id) FROM task_attempt")
_BUCKET_LIMITS = sql("SELECT name, rpm, tpm, window_ms FROM rate_limit WHERE name IN :n",
                     "n")
_SET_LIMITS = sql("UPDATE rate_limit SET rpm = :rpm, tpm = :tpm, window_ms = :w, "
                  "updated_at = :now, version = version + 1 WHERE name = :name")
_LOCK_BUCKETS = (f"SELECT {_ROW_COLS}, :now FROM rate_limit WHERE name IN :n "
                 "ORDER BY name{lock}")
_WRITE_BUCKET = sql(
    "UPDATE rate_limit SET req_allowance = :ra, tok_allowance = :ta, "
    "refilled_at = :at, paused_until = :pu, pause_reason = :why, "
    "learned_rpm = :lr, learned_tpm = :lt, rate_factor = :f, cut_at = :cut, "
    "granted_requests = granted_requests + :gr, "
    "granted_tokens = granted_tokens + :gt, updated_at = :now, "
    "version = version + 1 WHERE name = :name AND version = :v")
_PAUSE = sql("UPDATE rate_limit SET paused_until = :now + :ms, pause_reason = :why, "
             "updated_at = :now, version = version + 1 "
             "WHERE name = :name AND paused_until < :now + :ms")
_PAUSE_LEFT = sql("SELECT paused_until - :now FROM rate_limit WHERE name = :name")
_BUCKETS = sql("SELECT * FROM rate_limit ORDER BY kind, name")
_LOCK_PACE = "SELECT paced_at, rpm FROM rate_limit WHERE name = :n{lock}"
_PACED = sql("UPDATE rate_limit SET paced_at = :now, version = version + 1 WHERE name = :n")
_PENDING_OF_BATCH = sql(
    "SELECT COUNT(*) FROM task WHERE batch_id = :b AND status = 'PENDING'")
_SET_PACE = sql("UPDATE rate_limit SET rpm = :r, version = version + 1 WHERE name = :n")
_FIRST_POOL = sql("SELECT pool FROM task ORDER BY pool LIMIT 1")
_NEXT_POOL = sql("SELECT pool FROM task WHERE pool > :p ORDER BY pool LIMIT 1")
_NEXT_LANE = sql("SELECT batch_id FROM task WHERE pool = :p AND status = 'PENDING' "
                 "AND batch_id > :b ORDER BY batch_id LIMIT 1")
_LANE_BATCHES = sql(
    "SELECT id, base_weight, deadline_at, window_start, window_end, target_per_s "
    "FROM batch WHERE id IN :ids", "ids")
_FAILURES = sql(
    "SELECT t.batch_id, t.config_hash, COUNT(*), SUM(CASE WHEN a.outcome IN "
    "('retry', 'failed', 'dead') THEN 1 ELSE 0 END) FROM task_attempt a "
    "JOIN task t ON t.id = a.task_pk WHERE a.id > :low AND a.started_at >= "
    ":now - :since AND a.outcome <> 'discarded' "
    "AND a.outcome <> 'released' GROUP BY t.batch_id, t.config_hash")
_USAGE = sql("SELECT endpoint, COUNT(*), AVG(input_tokens), AVG(output_tokens) "
             "FROM task_attempt WHERE id > :low AND input_tokens IS NOT NULL "
             "GROUP BY endpoint")
_REPORT = sql("UPDATE worker SET pool = :pool, concurrency_limit = :c, latency_ms = :lat, "
              "failure_rate = :f, flow = :flow WHERE id = :id")
_WINDOW_BATCHES = sql(
    "SELECT id, window_start, window_end, target_per_s, base_weight, deadline_at "
    "FROM batch WHERE window_end IS NOT NULL AND window_end >= :since "
    "ORDER BY window_start")
_BATCH_COUNTS = sql("SELECT status, COUNT(*) FROM task WHERE batch_id = :b GROUP BY status")
_RECENT_DONE = sql("SELECT COUNT(*) FROM task WHERE batch_id = :b AND status <> 'PENDING' "
                   "AND finished_at >= :t")
_TOKENS_PER_TASK = sql(
    "SELECT AVG(x.tok) FROM (SELECT a.input_tokens + a.output_tokens AS tok "
    "FROM task_attempt a JOIN task t ON t.id = a.task_pk WHERE t.batch_id = :b "
    "AND a.outcome = 'succeeded' ORDER BY a.id DESC LIMIT 200) x")
_BATCH_POOLS = sql("SELECT DISTINCT pool FROM task WHERE batch_id = :b")
#: The fields given (checked against a fixed set) are the only dynamic part.
_SET_BATCH = "UPDATE batch SET {sets} WHERE id = :id"


@dataclass(frozen=True, slots=True)
class BucketSpec:
    """A bucket's configured capacity (None: unlimited in that dimension)."""

    name: str
    kind: str
    rpm: float | None
    tpm: float | None
    window_ms: int


@dataclass(frozen=True, slots=True)
class BucketState:
    """What a lease changes in a ``rate_limit`` row: allowances and the database time
    they were computed at, the pause, the limits the provider reported, the share of
    the limits in force and when it was last cut."""

    req_allowance: float
    tok_allowance: float
    refilled_at: int
    paused_until: int
    pause_reason: str | None
    learned_rpm: float | None
    learned_tpm: float | None
    rate_factor: float
    cut_at: int


@dataclass(frozen=True, slots=True)
class BucketRow:
    """A ``rate_limit`` row as read under its lock, with the database's now (ms)."""

    name: str
    rpm: float | None
    tpm: float | None
    window_ms: int
    state: BucketState
    now: int


@dataclass(frozen=True, slots=True)
class BucketUpdate:
    """A row's new state and what the lease granted (added to the row's counters)."""

    state: BucketState
    granted_requests: int
    granted_tokens: float


#: Decides a locked row's update and what to answer for it (flow control's arithmetic,
#: :func:`lockgate.flow.leasing.lease_step`); None: leave the row as it is.
BucketStep = Callable[[BucketRow], tuple[BucketUpdate | None, R]]


def _recent_floor(tx: Tx) -> int | None:
    """The attempt id below which attempts are not "recent" (None: there are none):
    the newest :data:`RECENT_ATTEMPTS`, found through the primary key."""
    top = tx.execute(_RECENT_TOP).scalar()
    return None if top is None else int(top) - RECENT_ATTEMPTS


@dataclass(frozen=True, slots=True)
class Lane:
    """A (pool, batch) with PENDING tasks, and what the batch row says about it."""

    pool: str
    batch_id: str
    base_weight: float
    deadline_at: int | None
    window_start: int | None
    window_end: int | None
    target_per_s: float | None


def _bucket_row(r: Any) -> tuple[BucketRow, int]:
    """A row of ``SELECT {_ROW_COLS}, now`` and its version."""
    (name, _kind, rpm, tpm, window_ms, l_rpm, l_tpm, req_allow, tok_allow, refilled,
     paused_until, reason, version, factor, cut_at, now) = r
    state = BucketState(float(req_allow), float(tok_allow), int(refilled), int(paused_until),
                        reason, l_rpm, l_tpm, float(factor), int(cut_at))
    return BucketRow(name, rpm, tpm, int(window_ms), state, int(now)), int(version)


def window_bucket(batch_id: str) -> str:
    """Name of the pacing bucket of a window batch."""
    return f"window:{batch_id}"[:191]


class FlowStore:
    """Flow-control queries on a :class:`~lockgate.store.Store`'s engine."""

    def __init__(self, store: Store) -> None:
        self.store = store
        lock = store.dialect.lock_for_update()
        self._lock_buckets = sql(_LOCK_BUCKETS.format(lock=lock), "n")
        self._lock_pace = sql(_LOCK_PACE.format(lock=lock))


    # -- buckets --------------------------------------------------------------------

    def ensure(self, specs: Iterable[BucketSpec]) -> None:
        """Create missing buckets and apply configured capacities.

        A new row counts as last refilled a whole window ago, so its first lease finds
        it full, at the small cap the bucket's arithmetic sets (never a window's worth).
        Several workers may start with different configs; the last to start wins, as
        with any shared setting.
        """
        specs = list(specs)
        if not specs:
            return

        def work(tx: Tx) -> None:
            now = tx.now
            names = [s.name for s in specs]
            have = {r[0]: r for r in tx.execute(_BUCKET_LIMITS, {"n": names})}
            for s in specs:
                row = have.get(s.name)
                if row is None:
                    tx.execute(self.store.dialect.insert_ignore(schema.rate_limit), [{
                        "name": s.name, "kind": s.kind, "rpm": s.rpm, "tpm": s.tpm,
                        "window_ms": s.window_ms, "req_allowance": 0.0,
                        "tok_allowance": 0.0, "refilled_at": now - s.window_ms,
                        "paused_until": 0, "updated_at": now, "version": 0}])
                elif (row[1], row[2], row[3]) != (s.rpm, s.tpm, s.window_ms):
                    tx.execute(_SET_LIMITS, {"rpm": s.rpm, "tpm": s.tpm, "w": s.window_ms,
                                             "now": now, "name": s.name})

        self.store.transaction(work)

    def update_buckets(self, names: Iterable[str],
                       step: BucketStep[R]) -> dict[str, tuple[R, bool]]:
        """Lock the rows named (in name order) in one transaction, read each with the
        database clock, and write back what ``step`` decides, guarded by the row's
        version. Returns per row found what ``step`` answered and whether its update
        (if any) was written."""
        names = sorted(set(names))
        if not names:
            return {}

        def work(tx: Tx) -> dict[str, tuple[R, bool]]:
            rows = tx.execute(self._lock_buckets, {"n": names}).all()
            out: dict[str, tuple[R, bool]] = {}
            for r in rows:
                row, version = _bucket_row(r)
                update, answer = step(row)
                out[row.name] = (answer, update is None or self._write(tx, row, update,
                                                                       version))
            return out

        return self.store.transaction(work)

    @staticmethod
    def _write(tx: Tx, row: BucketRow, u: BucketUpdate, version: int) -> bool:
        st = u.state
        return tx.execute(_WRITE_BUCKET, {
            "ra": st.req_allowance, "ta": st.tok_allowance, "at": st.refilled_at,
            "pu": st.paused_until, "why": st.pause_reason, "lr": st.learned_rpm,
            "lt": st.learned_tpm, "f": st.rate_factor, "cut": st.cut_at,
            "gr": u.granted_requests, "gt": u.granted_tokens, "now": row.now,
            "name": row.name, "v": version}).rowcount == 1

    def pause(self, name: str, ms: int, reason: str) -> int:
        """Pause a bucket for ``ms`` from the database's now (never shortening a pause);
        returns the pause still in force, in ms."""
        def work(tx: Tx) -> int:
            tx.execute(_PAUSE, {"ms": ms, "why": reason, "name": name})
            row = tx.execute(_PAUSE_LEFT, {"name": name}).first()
            return max(0, int(row[0])) if row else 0
        return self.store.transaction(work)

    def buckets(self) -> list[dict[str, Any]]:
        """Every bucket row with the database's now (for status)."""
        with self.store.read() as tx:
            now = tx.now
            rows = tx.rows(_BUCKETS)
        for r in rows:
            r["now"] = now
        return rows

    # -- windows --------------------------------------------------------------------

    def pace(self, batch_id: str, *, opens_at: int, every_ms: int,
             rate: Callable[[int, int], float | None]) -> bool:
        """Recompute a window batch's pace at most once per ``every_ms`` across all
        workers (and at once when the window ``opens_at``); returns whether this call
        did it. ``rate(remaining, now)`` gives the tasks/s to store (None: only the
        endpoint's limits apply)."""
        name = window_bucket(batch_id)

        def claim_turn(tx: Tx) -> int | None:
            now = tx.now
            row = tx.execute(self._lock_pace, {"n": name}).first()
            if row is None:
                tx.execute(self.store.dialect.insert_ignore(schema.rate_limit), [{
                    "name": name, "kind": "window", "rpm": 0.0, "tpm": None,
                    "window_ms": 1000, "req_allowance": 0.0, "tok_allowance": 0.0,
                    "refilled_at": now, "paused_until": 0, "updated_at": now,
                    "paced_at": now, "version": 0}])
                return now
            paced_at, rpm = row
            opening = rpm == 0 and now >= opens_at  # the window just opened: at once
            if paced_at is not None and now - paced_at < every_ms and not opening:
                return None
            tx.execute(_PACED, {"now": now, "n": name})
            return now

        now = self.store.transaction(claim_turn)
        if now is None:
            return False
        with self.store.read() as tx:
            remaining = int(tx.execute(_PENDING_OF_BATCH, {"b": batch_id}).scalar_one())
        per_s = rate(remaining, now)
        self.store.transaction(lambda tx: tx.execute(_SET_PACE, {"r": per_s, "n": name}))
        return True

    # -- lanes ----------------------------------------------------------------------

    @staticmethod
    def _pools(tx: Tx) -> list[str]:
        """Every pool that has tasks (a skip scan over ``ix_task_lane``)."""
        out: list[str] = []
        row = tx.execute(_FIRST_POOL).first()
        while row is not None and len(out) < 1000:
            out.append(row[0])
            row = tx.execute(_NEXT_POOL, {"p": row[0]}).first()
        return out

    def lanes(self, pool: str | None = None) -> tuple[list[Lane], int]:
        """The batches with PENDING tasks in ``pool`` (or every pool), with their batch
        settings, and the database's now.

        One index seek per pool and per batch found (``pool, status, batch_id``), so
        the cost does not depend on how many tasks are pending or finished.
        """
        found: list[tuple[str, str]] = []
        with self.store.read() as tx:
            now = tx.now
            pools = [pool] if pool is not None else self._pools(tx)
            for pool in pools:
                after = ""
                for _ in range(MAX_LANES):
                    row = tx.execute(_NEXT_LANE, {"p": pool, "b": after}).first()
                    if row is None:
                        break
                    found.append((pool, row[0]))
                    after = row[0]
            if not found:
                return [], now
            ids = sorted({b for _p, b in found})
            meta = {r[0]: r for r in tx.execute(_LANE_BATCHES, {"ids": ids})}
        lanes = []
        for pool, b in found:
            m = meta.get(b)
            lanes.append(Lane(pool, b, float(m[1]) if m else 1.0,
                              m[2] if m else None, m[3] if m else None,
                              m[4] if m else None, m[5] if m else None))
        return lanes, now

    def _recent(self, statement: TextClause, **params: Any) -> Sequence[Any]:
        """Rows of ``statement`` over the recent attempts (``:low`` bound to the floor
        below which attempts are not recent); none when there are no attempts at all."""
        with self.store.read() as tx:
            low = _recent_floor(tx)
            if low is None:
                return []
            return tx.execute(statement, {"low": low, **params}).all()

    def failure_rates(self, *, since_ms: int) -> dict[str, float]:
        """Failure rate per batch, from the recent attempts of its task types.

        A task type is a config (template, model config, delivery rule, retry policy);
        its rate counts retried, failed and dead attempts over all attempts of the last
        ``since_ms`` (at most the newest :data:`RECENT_ATTEMPTS`, found through the
        primary key, so the query stays cheap however long the history). A batch gets
        the rates of its task types, weighted by its attempts of each.
        """
        rows = self._recent(_FAILURES, since=since_ms)
        per_cfg: dict[str, list[int]] = {}
        for _b, cfg, n, bad in rows:
            acc = per_cfg.setdefault(cfg, [0, 0])
            acc[0] += int(n)
            acc[1] += int(bad or 0)
        cfg_rate = {c: bad / n for c, (n, bad) in per_cfg.items() if n}
        per_batch: dict[str, list[float]] = {}
        for b, cfg, n, _bad in rows:
            acc2 = per_batch.setdefault(b, [0.0, 0.0])
            acc2[0] += int(n)
            acc2[1] += int(n) * cfg_rate.get(cfg, 0.0)
        return {b: s / n for b, (n, s) in per_batch.items() if n}

    def usage(self) -> dict[str, tuple[int, float, float]]:
        """Per endpoint over its newest answered calls (at most :data:`RECENT_ATTEMPTS`
        overall): (calls, mean input tokens, mean output tokens)."""
        rows = self._recent(_USAGE)
        return {r[0]: (int(r[1]), float(r[2] or 0), float(r[3] or 0))
                for r in rows if r[0] is not None}

    def claim(self, n: int, *, lease_ms: int, worker_id: str) -> list[ClaimedTask]:
        """The engine's plain claim (:meth:`Store.claim`): a worker serving one batch."""
        return self.store.claim(n, lease_ms=lease_ms, worker_id=worker_id)

    def claim_lanes(self, plan: Mapping[tuple[str, str], int], *, lease_ms: int,
                    token: str, worker_id: str) -> dict[tuple[str, str], list[ClaimedTask]]:
        """Claim from several lanes in one transaction, one index-backed statement each."""
        d = self.store.dialect

        def work(tx: Tx) -> dict[tuple[str, str], list[ClaimedTask]]:
            return {key: d.claim_lane(tx.conn, pool=key[0], batch_id=key[1], limit=n,
                                      lease_ms=lease_ms, token=token, worker_id=worker_id)
                    for key, n in sorted(plan.items()) if n > 0}

        return self.store.transaction(work)

    # -- workers and status ---------------------------------------------------------

    def report(self, worker_id: str, *, pool: str | None, concurrency_limit: int,
               latency_ms: float | None, failure_rate: float | None,
               detail: Mapping[str, Any]) -> None:
        """Write the worker's adaptive limits and recent health to its row."""
        self.store.transaction(lambda tx: tx.execute(_REPORT, {
            "pool": pool, "c": concurrency_limit, "lat": latency_ms, "f": failure_rate,
            "flow": orjson.dumps(detail).decode(), "id": worker_id}))

    def windows(self) -> list[dict[str, Any]]:
        """Window batches with PENDING tasks or a window not yet over, with their counts,
        recent rate and mean tokens per task (for projections)."""
        with self.store.read() as tx:
            now = tx.now
            batches = tx.rows(_WINDOW_BATCHES, {"since": now - 86_400_000})
            for b in batches:
                counts = {s: int(n) for s, n in tx.execute(_BATCH_COUNTS, {"b": b["id"]})}
                b["counts"] = counts
                b["recent_done"] = int(tx.execute(
                    _RECENT_DONE, {"b": b["id"], "t": now - 30_000}).scalar_one())
                tok = tx.execute(_TOKENS_PER_TASK, {"b": b["id"]}).scalar()
                b["tokens_per_task"] = float(tok) if tok is not None else None
                pools = [r[0] for r in tx.execute(_BATCH_POOLS, {"b": b["id"]})]
                b["pools"] = pools
                b["now"] = now
        return [b for b in batches if b["counts"].get("PENDING", 0) or b["window_end"] >= now]

    def set_batch(self, batch_id: str, **fields: Any) -> None:
        """Set a batch's weight, deadline or window (only the fields given)."""
        allowed = {"base_weight", "deadline_at", "window_start", "window_end", "target_per_s"}
        bad = set(fields) - allowed
        if bad:
            raise SpecError(f"unknown batch fields {sorted(bad)}", field="batch")
        if not fields:
            return
        sets = ", ".join(f"{k} = :{k}" for k in sorted(fields))
        self.store.transaction(lambda tx: tx.execute(
            text(_SET_BATCH.format(sets=sets)), {**fields, "id": batch_id}))

