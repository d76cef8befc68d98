"""The store's queue operations on every backend: claims, fenced write-backs, renewals,
operator transitions. Lease expiry is observed on the database clock, never by sleeping.
"""

from __future__ import annotations

import sqlite3
import threading
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import event, text
from sqlalchemy.exc import DBAPIError

from lockgate.errors import NotFound, StateConflict, StoreError
from lockgate.spec import parse_task
from lockgate.store import ClaimedTask, Finish, Store
from lockgate.store.dialects import base as dialect_base
from lockgate.store.engine import BUSY_TIMEOUT_MS, _begin_immediate
from lockgate.store.failures import is_conflict, is_transient
from lockgate.store.tx import Tx

from .support import rows, scalar, task_row, tasks, wait_for


def submit(store: Store, n: int, prefix: str = "t", batch_id: str = "b") -> list[str]:
    """Submit ``n`` tasks; return their task ids."""
    specs = [parse_task(t) for t in tasks(n, prefix)]
    report = store.submit(specs, batch_id=batch_id)
    assert report.inserted == n
    return [s.task_id for s in specs]


def trace(c: ClaimedTask, outcome: str, **extra: Any) -> dict[str, Any]:
    """A minimal attempt trace for a write-back."""
    return {"attempt": c.attempt, "outcome": outcome, "started_at": 0, **extra}


def succeed(c: ClaimedTask, value: Any) -> Finish:
    return Finish(id=c.id, lease_token=c.lease_token, status="SUCCEEDED",
                  result=orjson.dumps(value).decode(), parse_status="valid",
                  attempt=trace(c, "succeeded", raw_output=orjson.dumps(value).decode()))


def wait_lease_expired(store: Store, pk: int) -> None:
    """Poll the database clock until the lease on task ``pk`` has run out."""
    visible_at = scalar(store, "SELECT visible_at FROM task WHERE id = :i", i=pk)
    wait_for(lambda: store.db_now() > visible_at, f"lease of task pk {pk} to expire",
             timeout=10)


# -- claims ---------------------------------------------------------------------------

def test_claim_batches_are_bounded_and_each_gets_a_fresh_token(store: Store) -> None:
    submit(store, 25)
    batches = [store.claim(10, lease_ms=60_000, worker_id="w1") for _ in range(4)]
    assert [len(b) for b in batches] == [10, 10, 5, 0]
    claimed = [c for b in batches for c in b]
    assert len({c.id for c in claimed}) == 25
    tokens = [{c.lease_token for c in b} for b in batches[:3]]
    assert all(len(t) == 1 for t in tokens), "one token per claim"
    assert len(set.union(*tokens)) == 3, "a fresh token per claim"
    assert {c.attempt for c in claimed} == {1}
    db = {r["id"]: r for r in rows(store, "SELECT id, lease_token, leased_by, attempts, "
                                          "status FROM task")}
    for c in claimed:
        assert db[c.id]["lease_token"] == c.lease_token
        assert db[c.id]["leased_by"] == "w1"
        assert db[c.id]["attempts"] == 1
        assert db[c.id]["status"] == "PENDING"


def test_claim_never_returns_leased_finished_or_cancelled_rows(store: Store) -> None:
    ids = submit(store, 6)
    held = store.claim(2, lease_ms=60_000, worker_id="w1")
    assert len(held) == 2
    report = store.finish([succeed(held[0], {"label": "no"})], worker_id="w1")
    assert report.applied == [held[0].id]
    held_ids = {c.task_id for c in held}
    unclaimed = [t for t in ids if t not in held_ids]
    store.cancel(unclaimed[0])
    second = store.claim(100, lease_ms=60_000, worker_id="w2")
    assert {c.task_id for c in second} == set(unclaimed[1:])
    assert store.claim(100, lease_ms=60_000, worker_id="w3") == []


def test_backing_off_task_is_invisible_until_its_delay_passes(store: Store) -> None:
    submit(store, 1)
    (c,) = store.claim(1, lease_ms=60_000, worker_id="w1")
    before = store.db_now()
    report = store.finish([Finish(id=c.id, lease_token=c.lease_token, status="PENDING",
                                  error_class="server_error", error_message="HTTP 500",
                                  delay_ms=1000, attempt=trace(c, "retry"))], worker_id="w1")
    assert report.applied == [c.id]
    row = task_row(store, c.task_id)
    assert row["lease_token"] is None and row["leased_by"] is None
    assert row["attempts"] == 1
    assert row["visible_at"] - row["updated_at"] == 1000
    assert row["visible_at"] >= before + 1000
    assert store.claim(1, lease_ms=60_000, worker_id="w2") == []
    wait_for(lambda: store.db_now() >= row["visible_at"], "back-off to pass", timeout=10)
    (again,) = store.claim(1, lease_ms=60_000, worker_id="w2")
    assert again.id == c.id
    assert again.attempt == 2
    assert again.lease_token != c.lease_token


def test_release_gives_the_attempt_back(store: Store) -> None:
    submit(store, 1)
    (c,) = store.claim(1, lease_ms=60_000, worker_id="w1")
    store.finish([Finish(id=c.id, lease_token=c.lease_token, status="PENDING",
                         error_class="lease_expired", error_message="released",
                         release_attempt=True, attempt=trace(c, "released"))], worker_id="w1")
    row = task_row(store, c.task_id)
    assert (row["status"], row["attempts"], row["lease_token"]) == ("PENDING", 0, None)
    (again,) = store.claim(1, lease_ms=60_000, worker_id="w2")
    assert again.attempt == 1


@pytest.mark.slow
def test_concurrent_claimers_never_share_a_row(db_url: str, store: Store) -> None:
    total = 1500
    submit(store, total)
    n_threads = 4
    barrier = threading.Barrier(n_threads)
    lock = threading.Lock()
    got: list[list[ClaimedTask]] = []
    errors: list[BaseException] = []
    claimed = [0]

    def claimer(name: str) -> None:
        s = Store(db_url, pool_size=1)
        try:
            barrier.wait(timeout=30)
            while True:
                with lock:
                    if claimed[0] >= total:
                        return
                batch = s.claim(7, lease_ms=120_000, worker_id=name)
                with lock:
                    claimed[0] += len(batch)
                    if batch:
                        got.append(batch)
        except BaseException as exc:  # reported below, with the thread's name
            errors.append(exc)
        finally:
            s.close()

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a claimer hung"
    assert not errors, errors
    every = [c for b in got for c in b]
    assert len(every) == total, "a row was claimed twice or lost"
    assert len({c.id for c in every}) == total
    assert all(len(b) <= 7 for b in got)
    assert len({b[0].lease_token for b in got}) == len(got), "tokens are unique per claim"
    db = {r["id"]: (r["lease_token"], r["attempts"]) for r in rows(
        store, "SELECT id, lease_token, attempts FROM task")}
    for c in every:
        assert db[c.id] == (c.lease_token, 1), "the row holds the token of its only claim"
    workers = {r["leased_by"] for r in rows(store, "SELECT DISTINCT leased_by FROM task")}
    assert len(workers) > 1, "the claimers did not overlap at all"


# -- fenced write-backs ------------------------------------------------------------------

def test_stale_write_back_after_reclaim_is_discarded(store: Store) -> None:
    submit(store, 1)
    (first,) = store.claim(1, lease_ms=300, worker_id="slow-worker")
    wait_lease_expired(store, first.id)
    (second,) = store.claim(1, lease_ms=60_000, worker_id="fast-worker")
    assert second.id == first.id
    assert second.lease_token != first.lease_token
    assert second.attempt == 2
    before = task_row(store, first.task_id)

    report = store.finish([succeed(first, {"label": "stale"})], worker_id="slow-worker")
    assert report.applied == []
    assert report.discarded == [first.id]
    assert task_row(store, first.task_id) == before, "a stale write-back changed the row"
    (stale,) = [a for a in rows(store, "SELECT * FROM task_attempt")]
    assert stale["outcome"] == "discarded"
    assert stale["worker_id"] == "slow-worker"
    assert stale["lease_token"] == first.lease_token
    assert stale["attempt"] == 1

    report = store.finish([succeed(second, {"label": "fresh"})], worker_id="fast-worker")
    assert report.applied == [second.id]
    after = task_row(store, first.task_id)
    assert after["status"] == "SUCCEEDED"
    assert orjson.loads(after["result"]) == {"label": "fresh"}
    assert after["version"] > before["version"]
    outcomes = [a["outcome"] for a in rows(store, "SELECT outcome FROM task_attempt "
                                                  "ORDER BY id")]
    assert outcomes == ["discarded", "succeeded"]


def test_write_back_after_expiry_but_before_any_reclaim_is_kept(store: Store) -> None:
    """Documented choice (DESIGN "Leases as visibility"): the token still matches, so
    no other holder exists and keeping the result is safe."""
    submit(store, 1)
    (c,) = store.claim(1, lease_ms=300, worker_id="w1")
    wait_lease_expired(store, c.id)
    report = store.finish([succeed(c, {"label": "yes"})], worker_id="w1")
    assert report.applied == [c.id]
    row = task_row(store, c.task_id)
    assert row["status"] == "SUCCEEDED"
    assert store.claim(1, lease_ms=60_000, worker_id="w2") == []


def test_write_back_to_a_cancelled_task_is_discarded(store: Store) -> None:
    submit(store, 1)
    (c,) = store.claim(1, lease_ms=60_000, worker_id="w1")
    store.cancel(c.task_id)
    before = task_row(store, c.task_id)
    report = store.finish([succeed(c, {"label": "yes"})], worker_id="w1")
    assert report.discarded == [c.id]
    assert task_row(store, c.task_id) == before
    assert before["status"] == "CANCELLED" and before["result"] is None
    assert scalar(store, "SELECT outcome FROM task_attempt") == "discarded"


def test_terminal_state_is_final_for_a_second_write_back(store: Store) -> None:
    submit(store, 1)
    (c,) = store.claim(1, lease_ms=60_000, worker_id="w1")
    assert store.finish([succeed(c, {"label": "no"})], worker_id="w1").applied == [c.id]
    before = task_row(store, c.task_id)
    again = Finish(id=c.id, lease_token=c.lease_token, status="PENDING", delay_ms=0,
                   error_class="server_error", attempt=trace(c, "retry"))
    report = store.finish([again], worker_id="w1")
    # The claim's write-back is already in: a second one changes nothing (and is taken
    # for the resend of the first, below).
    assert report.applied == [] and report.discarded == []
    assert task_row(store, c.task_id) == before
    assert scalar(store, "SELECT COUNT(*) FROM task_attempt") == 1


def test_a_write_back_sent_again_after_a_lost_acknowledgement_counts_as_applied(
        store: Store) -> None:
    """A worker whose write-back committed but whose connection dropped before the
    acknowledgement sends the same batch again: it is recognised as written, neither
    recorded twice nor counted as a lost lease."""
    submit(store, 3)
    claims = store.claim(3, lease_ms=60_000, worker_id="w1")
    batch = [succeed(c, {"label": "no"}) for c in claims[:2]]
    first = store.finish(batch, worker_id="w1")
    before = [task_row(store, c.task_id) for c in claims[:2]]
    again = store.finish([*batch, succeed(claims[2], {"label": "yes"})], worker_id="w1")
    assert again.applied == [claims[2].id] and again.discarded == []
    assert again.applied_claims == first.applied_claims | {(claims[2].id,
                                                            claims[2].lease_token)}
    assert [task_row(store, c.task_id) for c in claims[:2]] == before
    assert rows(store, "SELECT outcome, COUNT(*) AS n FROM task_attempt GROUP BY outcome") \
        == [{"outcome": "succeeded", "n": 3}]


def test_one_write_back_batch_applies_owned_rows_and_discards_the_rest(store: Store) -> None:
    submit(store, 6)
    lost = store.claim(2, lease_ms=300, worker_id="w1")
    kept = store.claim(2, lease_ms=60_000, worker_id="w1")
    for c in lost:
        wait_lease_expired(store, c.id)
    # Another worker takes the two expired leases and the two rows never claimed.
    taken = store.claim(10, lease_ms=60_000, worker_id="w2")
    assert len(taken) == 4 and {c.id for c in lost} <= {c.id for c in taken}
    mine = [*lost, *kept]
    report = store.finish([succeed(c, {"label": "w1"}) for c in mine], worker_id="w1")
    assert sorted(report.applied) == sorted(c.id for c in kept)
    assert sorted(report.discarded) == sorted(c.id for c in lost)
    for c in kept:
        assert task_row(store, c.task_id)["status"] == "SUCCEEDED"
    for c in lost:
        row = task_row(store, c.task_id)
        assert (row["status"], row["result"], row["leased_by"]) == ("PENDING", None, "w2")
    outcomes = {r["task_pk"]: r["outcome"] for r in rows(
        store, "SELECT task_pk, outcome FROM task_attempt")}
    assert outcomes == {**{c.id: "discarded" for c in lost},
                        **{c.id: "succeeded" for c in kept}}


def test_a_stale_and_a_current_write_back_of_one_task_in_one_batch(store: Store) -> None:
    """A worker whose own lease ran out and that re-claimed the task (its renewals were
    late) flushes both results together: only the current one may count."""
    submit(store, 1)
    (old,) = store.claim(1, lease_ms=300, worker_id="w1")
    wait_lease_expired(store, old.id)
    (new,) = store.claim(1, lease_ms=60_000, worker_id="w1")
    assert new.id == old.id and new.lease_token != old.lease_token
    report = store.finish([succeed(old, {"label": "old"}), succeed(new, {"label": "new"})],
                          worker_id="w1")
    assert orjson.loads(task_row(store, new.task_id)["result"]) == {"label": "new"}
    outcomes = {r["lease_token"]: r["outcome"] for r in rows(
        store, "SELECT lease_token, outcome FROM task_attempt")}
    assert outcomes == {old.lease_token: "discarded", new.lease_token: "succeeded"}
    assert (report.applied, report.discarded) == ([new.id], [old.id])


def test_failed_and_dead_write_backs_keep_their_reason(store: Store) -> None:
    submit(store, 2)
    a, b = store.claim(2, lease_ms=60_000, worker_id="w1")
    store.finish([
        Finish(id=a.id, lease_token=a.lease_token, status="FAILED",
               error_class="invalid_request", error_message="HTTP 400: bad",
               attempt=trace(a, "failed")),
        Finish(id=b.id, lease_token=b.lease_token, status="DEAD",
               error_class="server_error", error_message="HTTP 500: boom",
               attempt=trace(b, "dead")),
    ], worker_id="w1")
    ra, rb = task_row(store, a.task_id), task_row(store, b.task_id)
    assert (ra["status"], ra["error_class"], ra["error_message"]) == (
        "FAILED", "invalid_request", "HTTP 400: bad")
    assert (rb["status"], rb["error_class"], rb["error_message"]) == (
        "DEAD", "server_error", "HTTP 500: boom")
    assert ra["finished_at"] is not None and rb["finished_at"] is not None
    # An operator's retry starts the task afresh: no stale reason stays on a PENDING row.
    store.retry(a.task_id)
    ra = task_row(store, a.task_id)
    assert (ra["status"], ra["error_class"], ra["error_message"], ra["result"],
            ra["parse_status"]) == ("PENDING", None, None, None, None)


def test_nul_characters_in_answers_and_errors_are_stored_as_replacement(store: Store) -> None:
    # PostgreSQL refuses NUL in text: unreplaced, the whole batch's write-back failed
    # on every retry. Every backend stores the same U+FFFD.
    submit(store, 2)
    a, b = store.claim(2, lease_ms=60_000, worker_id="w1")
    report = store.finish([
        Finish(id=a.id, lease_token=a.lease_token, status="SUCCEEDED",
               result=orjson.dumps({"label": "y\x00es"}).decode(), parse_status="valid",
               attempt=trace(a, "succeeded", raw_output='{"label": "y\x00es"}')),
        Finish(id=b.id, lease_token=b.lease_token, status="FAILED",
               error_class="invalid_request", error_message="HTTP 400: b\x00ad",
               attempt=trace(b, "failed", raw_output="\x00", error_message="b\x00ad")),
    ], worker_id="w1")
    assert sorted(report.applied) == sorted([a.id, b.id])
    ra, rb = task_row(store, a.task_id), task_row(store, b.task_id)
    assert orjson.loads(ra["result"]) == {"label": "y\x00es"}, "JSON escapes it already"
    assert rb["error_message"] == "HTTP 400: b\ufffdad"
    traces = {
        r["task_pk"]: (r["raw_output"], r["error_message"])
        for r in rows(store, "SELECT task_pk, raw_output, error_message FROM task_attempt")}
    assert traces == {a.id: ('{"label": "y\ufffdes"}', None), b.id: ("\ufffd", "b\ufffdad")}


def test_nul_characters_in_the_call_kept_on_the_task_row_are_stored_as_replacement(
        store: Store) -> None:
    # The model a provider names, its request id and its body as returned are kept on
    # the task row: a NUL in any of them made PostgreSQL refuse the batch's write-back
    # on every retry, and its tasks were called again each time their leases ran out.
    submit(store, 2)
    a, b = store.claim(2, lease_ms=60_000, worker_id="w1")
    report = store.finish([
        Finish(id=a.id, lease_token=a.lease_token, status="SUCCEEDED",
               result='{"label": "yes"}', parse_status="valid",
               attempt=trace(a, "succeeded", raw_output='{"label": "yes"}'),
               model="gpt\x00x", request_id="req\x00", response='{"error": "b\x00ad\ud800"}'),
        succeed(b, {"label": "no"}),
    ], worker_id="w1")
    assert sorted(report.applied) == sorted([a.id, b.id])
    ra = task_row(store, a.task_id)
    assert (ra["model"], ra["request_id"], ra["response"]) == (
        "gpt\ufffdx", "req\ufffd", '{"error": "b\ufffdad\ufffd"}')
    assert task_row(store, b.task_id)["status"] == "SUCCEEDED"


def test_task_ids_differing_only_in_case_or_accents_are_distinct_tasks(store: Store) -> None:
    # On MySQL/MariaDB's default collation they were one value: the unique index took
    # "doc-1" for "Doc-1", already present, and the task was skipped.
    ids = ["Doc-1", "doc-1", "DOC-1", "café", "cafe", "Straße", "strasse"]
    specs = [parse_task({**t, "task_id": i}) for t, i in zip(tasks(len(ids)), ids,
                                                             strict=True)]
    report = store.submit(specs, batch_id="Nightly")
    assert (report.inserted, report.duplicates) == (len(ids), 0)
    assert store.submit([parse_task(tasks(1)[0])], batch_id="nightly").inserted == 1
    got = {r["task_id"]: r["batch_id"] for r in rows(store, "SELECT task_id, batch_id FROM task")}
    assert sorted(got) == sorted([*ids, "t-00000"])
    assert got["t-00000"] == "nightly" and got["Doc-1"] == "Nightly"


# -- renewals and operator transitions ------------------------------------------------------

def test_renew_extends_only_leases_still_held(store: Store) -> None:
    submit(store, 2)
    (a,) = store.claim(1, lease_ms=60_000, worker_id="w1")
    (b,) = store.claim(1, lease_ms=300, worker_id="w1")
    wait_lease_expired(store, b.id)
    (b2,) = store.claim(1, lease_ms=60_000, worker_id="w2")
    assert b2.id == b.id, "only b was visible"
    submit(store, 1, prefix="c")
    (c,) = store.claim(1, lease_ms=300, worker_id="w1")
    wait_lease_expired(store, c.id)
    b_before = task_row(store, b.task_id)
    now = store.db_now()
    held = {a.lease_token: [a.id], b.lease_token: [b.id], c.lease_token: [c.id]}
    # a is held; c expired but nobody re-claimed it, so its token still holds it; b was
    # re-claimed by w2 and must not move.
    assert store.renew(held, lease_ms=60_000) == 2
    assert task_row(store, b.task_id) == b_before
    for t in (a, c):
        assert task_row(store, t.task_id)["visible_at"] >= now + 60_000
    assert store.claim(10, lease_ms=60_000, worker_id="w3") == []


def _waiting_on_a_row_lock(store: Store, holder: int) -> int:
    """Statements now waiting for a row lock held by the session ``holder`` (PostgreSQL),
    or by another transaction on this test's database (MariaDB); the sessions of other
    tests running at the same time on the server do not count."""
    if store.dialect.name == "postgresql":
        sql = ("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
               "AND :holder = ANY(pg_blocking_pids(pid))")
    else:  # a two-row locking read still running after 200 ms is waiting for a lock
        sql = ("SELECT count(*) FROM information_schema.processlist WHERE command = 'Query' "
               "AND db = DATABASE() AND info LIKE '%FOR UPDATE' AND time_ms > 200 "
               "AND id <> :holder")
    return int(scalar(store, sql, holder=holder))


def test_renewal_locks_rows_in_id_order_like_a_write_back(store: Store) -> None:
    """Lease renewal and a write-back of the same leases run side by side in a worker;
    both must take their row locks in id order, or they deadlock. Row a is rewritten
    first, so its newest version lies after b's on disk, where a plain UPDATE's scan
    would find (and lock) b first."""
    if store.dialect.name == "sqlite":
        pytest.skip("SQLite has no row locks: its writers are serialised")
    submit(store, 2)
    a, b = sorted(store.claim(2, lease_ms=60_000, worker_id="w1"), key=lambda c: c.id)
    assert a.lease_token == b.lease_token
    assert store.renew({a.lease_token: [a.id]}, lease_ms=60_000) == 1
    renewed: list[int] = []
    with store.engine.connect() as holder, store.engine.connect() as prober:
        holder.begin()
        assert store.dialect.owned(holder, [a.id]) == {(a.id, a.lease_token)}
        holder_id = int(holder.execute(text(
            "SELECT pg_backend_pid()" if store.dialect.name == "postgresql"
            else "SELECT CONNECTION_ID()")).scalar_one())
        renewal = threading.Thread(target=lambda: renewed.append(store.renew(
            {a.lease_token: [b.id, a.id]}, lease_ms=60_000)))
        renewal.start()
        try:
            wait_for(lambda: _waiting_on_a_row_lock(store, holder_id) > 0,
                     "the renewal to wait on a")
            prober.begin()
            nowait = " FOR UPDATE NOWAIT"
            # The renewal waits on a without holding b: b can be locked at once.
            assert prober.execute(text(f"SELECT id FROM task WHERE id = :i{nowait}"),
                                  {"i": b.id}).scalar() == b.id
            prober.rollback()
        finally:
            holder.rollback()
        renewal.join(timeout=30)
    assert renewed == [2]


def test_a_deadlock_on_the_hot_path_is_a_retryable_error(store: Store) -> None:
    """The write-back's statements go straight to the driver; a deadlock there must
    still come out as SQLAlchemy's error, which the store retries."""
    if store.dialect.name == "sqlite":
        pytest.skip("SQLite has no row locks: its writers are serialised")
    submit(store, 2)
    a, b = sorted(store.claim(2, lease_ms=60_000, worker_id="w1"), key=lambda c: c.id)
    errors: list[BaseException] = []

    def lock(conn: Any, first: int, second: int, ready: threading.Barrier) -> None:
        try:
            store.dialect.owned(conn, [first])
            ready.wait(timeout=30)
            store.dialect.owned(conn, [second])
        except Exception as exc:
            errors.append(exc)
        finally:
            conn.rollback()

    ready = threading.Barrier(2)
    with store.engine.connect() as one, store.engine.connect() as two:
        one.begin()
        two.begin()
        threads = [threading.Thread(target=lock, args=(one, a.id, b.id, ready)),
                   threading.Thread(target=lock, args=(two, b.id, a.id, ready))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert len(errors) == 1, errors
    assert isinstance(errors[0], DBAPIError), type(errors[0])
    assert is_conflict(errors[0]), errors[0]


# -- SQLite's one write lock --------------------------------------------------------------

def _other_writer(store: Store) -> sqlite3.Connection:
    """A second connection to the same file, outside lockgate (no busy wait)."""
    return sqlite3.connect(store.engine.url.database or "", isolation_level=None, timeout=0)


def test_sqlite_reads_leave_the_write_lock_free(sqlite_store: Store) -> None:
    """Status, progress and flow-control reads must not hold the lock every claim and
    write-back needs (a plain BEGIN IMMEDIATE would take it for a SELECT)."""
    submit(sqlite_store, 3)
    other = _other_writer(sqlite_store)
    try:
        with sqlite_store.read() as conn:
            assert conn.execute(text("SELECT COUNT(*) FROM task")).scalar_one() == 3
            other.execute("BEGIN IMMEDIATE")  # would raise "database is locked"
            other.execute("ROLLBACK")
            assert sqlite_store.status().batches["b"]["PENDING"] == 3
    finally:
        other.close()


def test_sqlite_writer_waits_for_another_process_then_proceeds(sqlite_store: Store) -> None:
    submit(sqlite_store, 2)
    other = _other_writer(sqlite_store)
    other.execute("BEGIN IMMEDIATE")
    got: list[list[ClaimedTask]] = []
    claimer = threading.Thread(target=lambda: got.append(
        sqlite_store.claim(2, lease_ms=60_000, worker_id="w1")))
    try:
        claimer.start()
        claimer.join(timeout=0.3)
        assert claimer.is_alive() and not got, "the claim must wait for the lock"
    finally:
        other.execute("ROLLBACK")
        other.close()
    claimer.join(timeout=30)
    assert [len(g) for g in got] == [2]
    with sqlite_store.engine.connect() as conn:  # the busy timeout is restored after
        busy = conn.exec_driver_sql("PRAGMA busy_timeout").scalar()
    assert busy == BUSY_TIMEOUT_MS


def test_sqlite_writer_gives_up_at_its_deadline(sqlite_store: Store) -> None:
    other = _other_writer(sqlite_store)
    mine = _other_writer(sqlite_store)
    try:
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreError, match="another process has held its write lock") \
                as err:
            _begin_immediate(mine, deadline_s=0.05)
        assert err.value.transient
        assert mine.execute("PRAGMA busy_timeout").fetchone()[0] == BUSY_TIMEOUT_MS
        other.execute("ROLLBACK")
        _begin_immediate(mine, deadline_s=0.05)
        mine.execute("ROLLBACK")
    finally:
        other.close()
        mine.close()


def test_a_write_lock_held_past_the_deadline_is_a_passing_store_error(
        sqlite_store: Store, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """Found by a chaos review: raised from SQLAlchemy's begin event, the driver's
    "database is locked" passed every ``except StoreError`` unwrapped: a worker starting
    meanwhile died, a submit printed a traceback, a write-back dropped its trace."""
    monkeypatch.setattr(_begin_immediate, "__kwdefaults__", {"deadline_s": 0.3})
    monkeypatch.setattr("lockgate.store.engine.LOCK_WARN_S", 0.1, raising=False)
    submit(sqlite_store, 2)
    other = _other_writer(sqlite_store)
    try:
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreError, match="the SQLite database is locked") as err:
            sqlite_store.claim(2, lease_ms=60_000, worker_id="w1")
        assert err.value.transient
        assert "waiting for the SQLite write lock" in caplog.text
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert len(sqlite_store.claim(2, lease_ms=60_000, worker_id="w1")) == 2


def test_sqlite_batches_are_split_under_the_bound_parameter_limit(
        sqlite_store: Store) -> None:
    """SQLite's hot path binds a whole batch in one statement; a batch beyond the
    connection's limit on bound parameters goes in several, and nothing is lost."""
    ids = submit(sqlite_store, 40)
    event.listen(sqlite_store.engine, "connect", lambda raw, _rec: raw.setlimit(
        sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 100))
    sqlite_store.engine.dispose()  # reconnect under the lower limit
    claimed = sqlite_store.claim(40, lease_ms=60_000, worker_id="w1")
    assert sorted(c.task_id for c in claimed) == sorted(ids)
    assert {(c.attempt, len(c.lease_token)) for c in claimed} == {(1, 32)}
    report = sqlite_store.finish([succeed(c, {"label": f"é {c.task_id}"}) for c in claimed],
                                 worker_id="w1")
    assert len(report.applied) == 40 and report.discarded == []
    done = rows(sqlite_store, "SELECT t.task_id, t.result, t.status, a.raw_output, a.outcome "
                              "FROM task t JOIN task_attempt a ON a.task_pk = t.id")
    assert len(done) == 40
    for r in done:
        value = orjson.dumps({"label": f"é {r['task_id']}"}).decode()
        assert (r["status"], r["result"], r["raw_output"], r["outcome"]) == (
            "SUCCEEDED", value, value, "succeeded"), r


def test_server_batches_travel_as_json_split_by_size_and_keep_every_value(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL and MySQL read a write-back batch and its trace rows from JSON texts,
    several when the batch is large: quotes, backslashes, newlines, CJK and emoji,
    NULLs, integers and floats all arrive as they were, and a stale claim in the
    middle of the batch is still discarded."""
    if store.dialect.name == "sqlite":
        pytest.skip("SQLite binds its batches as VALUES lists (test above)")
    monkeypatch.setattr(type(store.dialect), "_JSON_BYTES", 2048)
    if hasattr(type(store.dialect), "_VALUES_CHARS"):  # MySQL's trace rows: VALUES lists
        monkeypatch.setattr(type(store.dialect), "_VALUES_CHARS", 4096)
    submit(store, 30)
    claimed = store.claim(30, lease_ms=60_000, worker_id="w1")
    stale = claimed[7]
    text_of = {c.id: f'"q" \\ b\nline 投诉 😀 {c.task_id} ' + "x" * 300 for c in claimed}
    batch = [Finish(id=c.id, lease_token=c.lease_token if c is not stale else "0" * 32,
                    status="SUCCEEDED" if i % 2 else "PENDING",
                    result=orjson.dumps({"t": text_of[c.id]}).decode() if i % 2 else None,
                    parse_status="valid" if i % 2 else None,
                    error_class=None if i % 2 else "rate_limited",
                    error_message=None if i % 2 else text_of[c.id], delay_ms=0 if i % 2 else 5,
                    attempt=trace(c, "succeeded" if i % 2 else "retry",
                                  raw_output=text_of[c.id], latency_ms=12.25,
                                  http_status=200 if i % 2 else 429, estimated_tokens=None))
             for i, c in enumerate(claimed)]
    report = store.finish(batch, worker_id="w1")
    assert report.discarded == [stale.id]
    assert sorted(report.applied) == sorted(c.id for c in claimed if c is not stale)
    tasks_now = {r["id"]: r for r in rows(store, "SELECT id, status, result, error_class, "
                                                 "error_message FROM task")}
    for i, c in enumerate(claimed):
        r = tasks_now[c.id]
        if c is stale:
            assert (r["status"], r["result"], r["error_message"]) == ("PENDING", None, None)
        elif i % 2:
            assert (r["status"], orjson.loads(r["result"]), r["error_message"]) == (
                "SUCCEEDED", {"t": text_of[c.id]}, None)
        else:
            assert (r["status"], r["error_class"], r["error_message"]) == (
                "PENDING", "rate_limited", text_of[c.id])
    traces = rows(store, "SELECT task_pk, outcome, raw_output, latency_ms, http_status, "
                         "estimated_tokens, worker_id FROM task_attempt")
    assert len(traces) == 30
    for t in traces:
        i = next(i for i, c in enumerate(claimed) if c.id == t["task_pk"])
        outcome = "discarded" if claimed[i] is stale else "succeeded" if i % 2 else "retry"
        assert (t["outcome"], t["raw_output"], t["latency_ms"], t["http_status"],
                t["estimated_tokens"], t["worker_id"]) == (
            outcome, text_of[t["task_pk"]], 12.25, 200 if i % 2 else 429, None, "w1"), t


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(st.text(), min_size=1, max_size=6),
       latency=st.floats(allow_nan=False, allow_infinity=False, width=32))
def test_any_text_of_a_trace_is_stored_as_it_was(store: Store, texts: list[str],
                                                  latency: float) -> None:
    """Every character a trace can hold arrives as it was (NUL and lone surrogates, which
    no backend can store, as U+FFFD), on every backend's way of writing trace rows."""
    store.engine.dispose()  # each example: a fresh start on the same database
    with store.engine.begin() as c:
        c.execute(text("DELETE FROM task_attempt"))
        c.execute(text("DELETE FROM task"))
    submit(store, len(texts), prefix=f"p{abs(hash(tuple(texts))) % 10**9}")
    claimed = sorted(store.claim(len(texts), lease_ms=60_000, worker_id="w1"),
                     key=lambda c: c.id)
    store.finish([Finish(id=c.id, lease_token=c.lease_token, status="SUCCEEDED",
                         result='{"label": "yes"}', parse_status="valid",
                         attempt=trace(c, "succeeded", raw_output=t, error_message=t,
                                       latency_ms=latency))
                  for c, t in zip(claimed, texts, strict=True)], worker_id="w1")
    got = {r["task_pk"]: r for r in rows(store, "SELECT task_pk, raw_output, error_message, "
                                                "latency_ms FROM task_attempt")}
    for c, t in zip(claimed, texts, strict=True):
        want = "".join("\ufffd" if ch == "\x00" or 0xD800 <= ord(ch) <= 0xDFFF else ch
                       for ch in t)
        assert got[c.id]["raw_output"] == want and got[c.id]["error_message"] == want
        # MySQL's FLOAT holds single precision
        assert got[c.id]["latency_ms"] == pytest.approx(latency, rel=1e-5, abs=1e-30)


def test_a_trace_of_megabytes_is_written_back_with_its_batch(store: Store) -> None:
    """A prompt snapshot or answer of 10 MB (more than half of MySQL's default 16 MB
    packet, so not as hex) goes in with the small rows around it."""
    submit(store, 3)
    claimed = store.claim(3, lease_ms=60_000, worker_id="w1")
    big = "投诉" * 1_700_000  # 10.2 MB in UTF-8
    report = store.finish([succeed(c, {"label": "no"}) if i != 1 else Finish(
        id=c.id, lease_token=c.lease_token, status="SUCCEEDED", result='{"label": "yes"}',
        parse_status="valid", attempt=trace(c, "succeeded", raw_output=big))
        for i, c in enumerate(claimed)], worker_id="w1")
    assert sorted(report.applied) == sorted(c.id for c in claimed)
    sizes = {r["task_pk"]: r["n"] for r in rows(
        store, "SELECT task_pk, LENGTH(raw_output) AS n FROM task_attempt")}
    # LENGTH counts characters on PostgreSQL and SQLite, bytes on MySQL
    assert sizes[claimed[1].id] in (len(big), len(big.encode()))
    assert len(sizes) == 3


def test_cancel_and_retry_are_conditional_transitions(store: Store) -> None:
    ids = submit(store, 3)
    store.cancel(ids[0])
    with pytest.raises(StateConflict, match="CANCELLED"):
        store.cancel(ids[0])
    with pytest.raises(StateConflict, match="PENDING"):
        store.retry(ids[1])
    with pytest.raises(NotFound):
        store.cancel("no-such-task")
    store.retry(ids[0])
    row = task_row(store, ids[0])
    assert (row["status"], row["attempts"], row["finished_at"]) == ("PENDING", 0, None)
    # A task that FAILED with its fallback delivered keeps a result and a reason: a
    # retry clears both, with its attempt count and lease.
    (c,) = [c for c in store.claim(10, lease_ms=60_000, worker_id="w1")
            if c.task_id == ids[2]] or [None]
    assert c is not None
    store.finish([Finish(id=c.id, lease_token=c.lease_token, status="FAILED",
                         result='{"label": "other"}', parse_status="invalid_json",
                         error_class="invalid_output", error_message="no JSON",
                         attempt=trace(c, "failed"), model="m", input_tokens=10,
                         output_tokens=3, latency_ms=5.2, http_status=200,
                         request_id="req-1", response='{"id": "x"}')], worker_id="w1")
    failed = task_row(store, ids[2])
    assert (failed["status"], failed["result"], failed["error_class"]) == (
        "FAILED", '{"label": "other"}', "invalid_output")
    store.retry(ids[2])
    row = task_row(store, ids[2])
    assert (row["status"], row["result"], row["parse_status"], row["error_class"],
            row["error_message"], row["attempts"], row["lease_token"],
            row["finished_at"]) == ("PENDING", None, None, None, None, 0, None, None)
    # ... and the call it ended with: the new run has made none yet
    assert [row[k] for k in ("model", "input_tokens", "output_tokens", "latency_ms",
                             "http_status", "request_id", "response")] == [None] * 7
    store.cancel(ids[1])  # leased by w1 above: cancelled all the same
    store.retry(ids[1])
    claimed = store.claim(10, lease_ms=60_000, worker_id="w2")
    assert {c.task_id for c in claimed} == {ids[1], ids[2]}  # ids[0] is w1's


def test_retention_keeps_the_traces_of_tasks_not_finished(store: Store) -> None:
    # A PENDING task's retries are what its next claim counts lost leases against:
    # deleted by `cleanup --older-than 1s` while it backed off, its next claim took
    # them for lost leases and ended it DEAD (lease_expired) instead of server_error.
    submit(store, 2)
    a, b = store.claim(2, lease_ms=60_000, worker_id="w1")
    store.finish([
        Finish(id=a.id, lease_token=a.lease_token, status="PENDING", delay_ms=0,
               error_class="server_error", error_message="HTTP 500",
               attempt=trace(a, "retry", latency_ms=1.0)),
        Finish(id=b.id, lease_token=b.lease_token, status="FAILED",
               error_class="invalid_request", error_message="HTTP 400",
               attempt=trace(b, "failed", latency_ms=1.0)),
    ], worker_id="w1")
    assert store.cleanup(older_than_ms=0)["attempts"] == 1  # the finished task's
    assert store.retries_before(a.id, 2) == 1
    assert [r["task_pk"] for r in rows(store, "SELECT task_pk FROM task_attempt")] == [a.id]


def test_retention_at_age_zero_takes_what_finished_this_millisecond(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    # `cleanup --older-than 0s` right after a task ended kept it (and its trace) when both
    # fell in the same millisecond (a test failed now and then on SQLite): the bound is
    # inclusive.
    submit(store, 1)
    [a] = store.claim(1, lease_ms=60_000, worker_id="w1")
    store.finish([Finish(id=a.id, lease_token=a.lease_token, status="FAILED",
                         error_class="invalid_request", error_message="HTTP 400",
                         attempt=trace(a, "failed", latency_ms=1.0))], worker_id="w1")
    t = int(task_row(store, a.task_id)["finished_at"])
    store.transaction(lambda tx: tx.execute(
        "UPDATE task_attempt SET started_at = :t", {"t": t}))
    monkeypatch.setattr(Tx, "now", property(lambda self: t))  # the clock stands still
    assert store.cleanup(older_than_ms=0, tasks=True) == {"attempts": 1, "tasks": 1}
    assert rows(store, "SELECT id FROM task") == []


def test_a_summary_counts_the_calls_sent_and_knows_its_batches(store: Store) -> None:
    # A claim ended without a call (lost leases), a review hold and a resolution by hand
    # were counted as calls made.
    submit(store, 2)
    a, b = store.claim(2, lease_ms=60_000, worker_id="w1")
    store.finish([
        succeed(a, {"label": "yes"}),
        Finish(id=b.id, lease_token=b.lease_token, status="DEAD",
               error_class="lease_expired", error_message="lost",
               attempt=trace(b, "dead", error_class="lease_expired")),
    ], worker_id="w1")
    with store.engine.begin() as c:  # the call of the success had a latency
        c.execute(text("UPDATE task_attempt SET latency_ms = 12.5 WHERE outcome = 'succeeded'"))
    s = store.summary("b")
    assert (s.calls, s.outcomes) == (1, {"succeeded": 1, "dead": 1})
    with pytest.raises(NotFound, match="no batch 'nope'"):
        store.summary("nope")


# -- migrations ----------------------------------------------------------------------------

def test_concurrent_migrations_of_a_fresh_database_agree(fresh_db_url: str) -> None:
    """Every process migrates on start (``lockgate.connect``), so starting several
    workers on an empty database must create the schema exactly once."""
    n = 4
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def migrate() -> None:
        s = Store(fresh_db_url, pool_size=1)
        try:
            barrier.wait(timeout=30)
            s.migrate()
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            s.close()

    threads = [threading.Thread(target=migrate) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    s = Store(fresh_db_url)
    try:
        (version,) = rows(s, "SELECT version_num FROM alembic_version")
        assert version["version_num"]
        submit(s, 3)
        assert len(s.claim(10, lease_ms=1000, worker_id="w")) == 3
        s.migrate()  # and once more: nothing to do
        assert rows(s, "SELECT version_num FROM alembic_version") == [version]
    finally:
        s.close()


def test_a_migration_lock_held_too_long_is_one_clear_error(
        fresh_db_url: str, backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """MySQL/MariaDB's migration lock has a bound; past it, a ``StoreError`` says what
    holds the start up (not a bare ``TimeoutError``)."""
    if backend != "mariadb":
        pytest.skip("only MySQL/MariaDB's migration lock gives up after a bound")
    monkeypatch.setattr(dialect_base, "MIGRATION_LOCK_WAIT_S", 1)
    holder = Store(fresh_db_url, pool_size=1)
    s = Store(fresh_db_url, pool_size=1)
    try:
        with holder.engine.connect() as c:
            assert c.execute(text("SELECT GET_LOCK('lockgate_migrate', 5)")).scalar() == 1
            with pytest.raises(StoreError, match="migration lock for 1 s"):
                s.migrate()
            c.execute(text("SELECT RELEASE_LOCK('lockgate_migrate')"))
        s.migrate()  # free again: it goes through
    finally:
        s.close()
        holder.close()


def test_priority_moves_a_task_ahead_in_the_claim_order(store: Store) -> None:
    """Claims take ready tasks oldest-ready first; priority p moves a task p seconds
    ahead (a negative one behind, and later)."""
    lines = [{**t, "priority": p} for t, p in zip(tasks(4), (0, 30, -5, 600), strict=True)]
    store.submit([parse_task(t) for t in lines], batch_id="b")
    order = [store.claim(1, lease_ms=60_000, worker_id="w")[0].task_id for _ in range(3)]
    assert order == ["t-00003", "t-00001", "t-00000"]
    assert store.claim(1, lease_ms=60_000, worker_id="w") == []  # -5: not ready yet
    wait_for(lambda: store.claim(1, lease_ms=60_000, worker_id="w"), "the deferred task",
             timeout=15)


@pytest.mark.parametrize("message", ["database is locked", "database table is locked",
                                     "locking protocol"])
def test_sqlite_lock_races_are_conflicts_tried_again(message: str) -> None:
    # SQLITE_PROTOCOL ("locking protocol") is a lost WAL lock race under contention:
    # like SQLITE_BUSY it passes when the transaction runs again, so a read or write
    # during a burst of worker restarts must not fail outright on it.
    exc = DBAPIError("SELECT 1", None, sqlite3.OperationalError(message))
    assert is_conflict(exc) and is_transient(exc)


def test_sqlite_corruption_is_not_tried_again() -> None:
    exc = DBAPIError("SELECT 1", None, sqlite3.DatabaseError("database disk image is malformed"))
    assert not is_conflict(exc) and not is_transient(exc)
