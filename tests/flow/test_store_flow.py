"""Flow control's SQL on every backend: buckets leased under the database clock, shared
pauses, lanes (pool x batch) and their claims, window pacing, worker metrics."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import text

from lockgate.flow.bucket import Ask, Limits
from lockgate.flow.lanes import pace_of, window_of
from lockgate.flow.leasing import LeaseRequest, lease_buckets
from lockgate.flow.window import BatchPlan, Window
from lockgate.spec import parse_task
from lockgate.store import Finish, Store
from lockgate.store.flow import BucketSpec, FlowStore, window_bucket

from .support import rows, scalar, task, tasks


def req(name: str, **ask: Any) -> LeaseRequest:
    return LeaseRequest(name, Ask(**ask), headroom=0.0, burst=0.01)


def age(store: Store, name: str, ms: int) -> None:
    """Pretend ``ms`` passed since the bucket was last refilled."""
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE rate_limit SET refilled_at = refilled_at - :ms "
                          "WHERE name = :n"), {"ms": ms, "n": name})


def test_a_bucket_starts_small_and_refills_on_the_database_clock(store: Store) -> None:
    fs = FlowStore(store)
    fs.ensure([BucketSpec("ep", "endpoint", 6000, None, 60_000)])
    g = lease_buckets(fs, [req("ep", requests=1000)])["ep"].grant
    assert g.requests == 60, "a new bucket holds 1% of the window, not the whole minute"
    t1 = scalar(store, "SELECT refilled_at FROM rate_limit")
    g2 = lease_buckets(fs, [req("ep", requests=1000)])["ep"].grant.requests
    t2 = scalar(store, "SELECT refilled_at FROM rate_limit")
    assert g2 <= (t2 - t1) * 0.1 + 1, "more than the refill since the last lease (99/s)"
    age(store, "ep", 500)  # half a second at 99/s (100/s less the cap's 60 per minute)
    g = lease_buckets(fs, [req("ep", requests=1000)])["ep"].grant
    assert 49 <= g.requests <= 60  # half a second of refill, never above the cap
    row = rows(store, "SELECT granted_requests, version FROM rate_limit")[0]
    assert row["version"] >= 2 and row["granted_requests"] == 60 + g2 + g.requests


def test_ensure_is_idempotent_and_applies_new_capacities(store: Store) -> None:
    fs = FlowStore(store)
    fs.ensure([BucketSpec("ep", "endpoint", 600, 1000, 60_000)])
    fs.ensure([BucketSpec("ep", "endpoint", 600, 1000, 60_000)])
    fs.ensure([BucketSpec("ep", "endpoint", 1200, None, 10_000)])
    (r,) = rows(store, "SELECT rpm, tpm, window_ms FROM rate_limit")
    assert (r["rpm"], r["tpm"], r["window_ms"]) == (1200, None, 10_000)


def test_concurrent_leases_never_grant_more_than_the_bucket_holds(db_url: str) -> None:
    setup = Store(db_url)
    FlowStore(setup).ensure([BucketSpec("ep", "endpoint", 60_000, None, 60_000)])
    granted: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(6)

    def worker() -> None:
        s = Store(db_url, pool_size=1)
        fs = FlowStore(s)
        barrier.wait()
        for _ in range(10):
            n = lease_buckets(fs, [req("ep", requests=50)])["ep"].grant.requests
            with lock:
                granted.append(n)
        s.close()

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (r,) = rows(setup, "SELECT granted_requests, req_allowance, refilled_at FROM rate_limit")
    setup.close()
    total = sum(granted)
    # 600 at the start (1%), plus at most 1000/s for the seconds the test took.
    assert total == r["granted_requests"], "a grant was lost or counted twice"
    assert total >= 600
    assert r["req_allowance"] >= -1e-6


def test_returns_and_settlements_reach_the_shared_row(store: Store) -> None:
    fs = FlowStore(store)
    fs.ensure([BucketSpec("ep", "endpoint", 6000, 600_000, 60_000)])
    lease_buckets(fs, [req("ep", requests=10, tokens=1000)])
    (b,) = rows(store, "SELECT tok_allowance, refilled_at FROM rate_limit")
    lease_buckets(fs, [req("ep", debt_tokens=300)])
    (a,) = rows(store, "SELECT tok_allowance, refilled_at FROM rate_limit")
    # 10 per ms, less the cap's 6,000 per minute
    refill = (a["refilled_at"] - b["refilled_at"]) * Limits(6000, 600_000, 60_000, 0.0, 0.01
                                                            ).rate(600_000)
    expected = min(6000.0, b["tok_allowance"] + refill) - 300
    assert a["tok_allowance"] == pytest.approx(expected)


def test_a_pause_is_shared_and_never_shortened(db_url: str) -> None:
    a, b = Store(db_url), Store(db_url)
    try:
        fa, fb = FlowStore(a), FlowStore(b)
        fa.ensure([BucketSpec("ep", "endpoint", 6000, None, 60_000)])
        res = lease_buckets(fa, [LeaseRequest("ep", Ask(pause_ms=30_000), 0.0, 0.01,
                                     pause_reason="rate_limited")])["ep"]
        assert res.grant.paused_ms > 29_000 and res.pause_reason == "rate_limited"
        other = lease_buckets(fb, [req("ep", requests=5)])["ep"]
        assert other.grant.requests == 0, "another worker got budget during the pause"
        assert 0 < other.grant.paused_ms <= 30_000
        assert fb.pause("ep", 1000, "exhausted") > 28_000, "a short pause shortened it"
        assert fb.pause("ep", 60_000, "quota") > 59_000
        assert scalar(a, "SELECT pause_reason FROM rate_limit") == "quota"
    finally:
        a.close()
        b.close()


def test_learned_limits_lower_the_bucket_and_can_be_forgotten(store: Store) -> None:
    fs = FlowStore(store)
    fs.ensure([BucketSpec("ep", "endpoint", 6000, None, 60_000)])
    r = lease_buckets(fs, [LeaseRequest("ep", Ask(), 0.0, 0.01, learned_rpm=600)])["ep"]
    assert r.rpm == 600
    r = lease_buckets(fs, [LeaseRequest("ep", Ask(), 0.0, 0.01, learned_rpm=9000)])["ep"]
    assert r.rpm == 6000  # a higher limit than configured is not adopted
    assert scalar(store, "SELECT learned_rpm FROM rate_limit") is None


def _submit(store: Store, n: int, batch: str, pool: str = "default",
            plan: BatchPlan | None = None) -> None:
    store.submit([parse_task(t) for t in tasks(n, prefix=batch)], batch_id=batch,
                 pool_of=lambda _s: pool, batch_fields=plan.fields() if plan else None)


def test_lanes_are_found_per_pool_and_claims_stay_in_their_lane(store: Store) -> None:
    _submit(store, 5, "a", pool="gpt")
    _submit(store, 4, "b", pool="gpt", plan=BatchPlan(base_weight=10))
    _submit(store, 3, "c", pool="local")
    fs = FlowStore(store)
    lanes, now = fs.lanes("gpt")
    assert [(ln.pool, ln.batch_id, ln.base_weight) for ln in lanes] == [
        ("gpt", "a", 1.0), ("gpt", "b", 10.0)]
    assert now > 0
    every, _ = fs.lanes()
    assert {(ln.pool, ln.batch_id) for ln in every} == {("gpt", "a"), ("gpt", "b"),
                                                        ("local", "c")}
    got = fs.claim_lanes({("gpt", "b"): 3, ("local", "c"): 10}, lease_ms=60_000,
                         token="t" * 32, worker_id="w")
    assert sorted(t.task_id for t in got[("gpt", "b")]) == ["b-00000", "b-00001", "b-00002"]
    assert len(got[("local", "c")]) == 3
    assert all(t.attempt == 1 and t.lease_token == "t" * 32
               for ts in got.values() for t in ts)
    # Leased rows are not claimable; the lane then offers what is left.
    again = fs.claim_lanes({("gpt", "b"): 10}, lease_ms=60_000, token="u" * 32,
                           worker_id="w")
    assert [t.task_id for t in again[("gpt", "b")]] == ["b-00003"]
    # A drained lane disappears from discovery once nothing in it is PENDING.
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE task SET status = 'SUCCEEDED' WHERE batch_id = 'c'"))
    assert {ln.batch_id for ln in fs.lanes()[0]} == {"a", "b"}


def test_a_window_batch_is_invisible_until_its_start(store: Store) -> None:
    now = store.db_now()
    _submit(store, 3, "w", plan=BatchPlan(window=Window(now + 3_600_000, now + 7_200_000)))
    _submit(store, 2, "n")
    claimed = store.claim(10, lease_ms=60_000, worker_id="w")
    assert sorted(t.batch_id for t in claimed) == ["n", "n"]
    (b,) = rows(store, "SELECT window_start, window_end, deadline_at FROM batch "
                       "WHERE id = 'w'")
    assert b["window_end"] - b["window_start"] == 3_600_000
    assert b["deadline_at"] == b["window_end"]
    lanes, _ = FlowStore(store).lanes()
    (lw,) = [ln for ln in lanes if ln.batch_id == "w"]
    w = window_of(lw)
    assert w is not None and w.start_ms == b["window_start"]


def test_status_tells_scheduled_tasks_from_those_backing_off(store: Store) -> None:
    """Tasks waiting for their batch's window were counted as "backing off", which the
    operations guide says to alert on (the provider refusing calls): every nightly
    windowed batch would have raised it."""
    now = store.db_now()
    _submit(store, 3, "w", plan=BatchPlan(window=Window(now + 3_600_000, now + 7_200_000)))
    _submit(store, 1, "n")
    [c] = store.claim(10, lease_ms=60_000, worker_id="x")
    store.finish([Finish(id=c.id, lease_token=c.lease_token, status="PENDING",
                         error_class="server_error", error_message="HTTP 500",
                         delay_ms=600_000,
                         attempt={"attempt": c.attempt, "outcome": "retry",
                                  "started_at": now})], worker_id="x")
    st = store.status()
    assert (st.backing_off, st.scheduled) == (1, 3)


def test_status_lists_workers_gone_silent_apart(store: Store) -> None:
    """A worker killed without a word was shown as running for 30 s, then vanished:
    the heartbeat age the operations guide says to alarm on could hardly be seen."""
    for w in ("alive", "killed", "long-gone", "stopped"):
        store.register_worker(w, hostname="h", pid=1, concurrency=4)
    store.transaction(lambda tx: (
        tx.execute("UPDATE worker SET heartbeat_at = :now - 90000 WHERE id = 'killed'"),
        tx.execute("UPDATE worker SET heartbeat_at = :now - 7200000 WHERE id = 'long-gone'"),
        tx.execute("UPDATE worker SET status = 'stopped' WHERE id = 'stopped'")))
    st = store.status()
    assert [w.id for w in st.workers] == ["alive"]
    [silent] = st.silent_workers
    assert (silent.id, silent.status) == ("killed", "running")
    assert 85 <= silent.heartbeat_age_s <= 120


def test_the_pace_is_computed_once_per_period_by_whoever_comes_first(store: Store) -> None:
    now = store.db_now()
    _submit(store, 100, "w", plan=BatchPlan(window=Window(now - 1000, now + 99_000)))
    fs = FlowStore(store)
    (lane,), _ = fs.lanes()
    w = window_of(lane)
    assert w is not None
    assert fs.pace("w", opens_at=w.start_ms, every_ms=60_000, rate=pace_of(w))
    assert not fs.pace("w", opens_at=w.start_ms, every_ms=60_000, rate=pace_of(w)), \
        "a second worker recomputed it at once"
    rate = scalar(store, "SELECT rpm FROM rate_limit WHERE name = :n", n=window_bucket("w"))
    # 100 tasks over ~100 s minus a 3% margin: about 1.03/s.
    assert 1.0 <= rate <= 1.2
    grant = lease_buckets(fs, [LeaseRequest(window_bucket("w"), Ask(requests=50), 0.0, 0.25)])
    assert grant[window_bucket("w")].grant.requests <= 1  # a bucket of 250 ms of pace


def test_failure_rates_come_from_recent_attempts_of_the_task_type(store: Store) -> None:
    store.submit([parse_task(t) for t in tasks(4, prefix="x")], batch_id="x")
    store.submit([parse_task(task("y-0", "other", model={"temperature": 0.5}))],
                 batch_id="y")
    claimed = store.claim(10, lease_ms=60_000, worker_id="w")
    now = store.db_now()
    with store.engine.begin() as conn:
        for i, t in enumerate(claimed):
            outcome = "retry" if (t.batch_id == "x" and i % 2) else "succeeded"
            conn.execute(text(
                "INSERT INTO task_attempt (task_pk, attempt, worker_id, lease_token, outcome, "
                "started_at) VALUES (:pk, 1, 'w', :tok, :o, :at)"),
                {"pk": t.id, "tok": t.lease_token, "o": outcome, "at": now})
        conn.execute(text(
            "INSERT INTO task_attempt (task_pk, attempt, worker_id, lease_token, outcome, "
            "started_at) VALUES (:pk, 1, 'w', 't', 'retry', :at)"),
            {"pk": claimed[0].id, "at": now - 7_200_000})  # too old to count
    rates = FlowStore(store).failure_rates(since_ms=3_600_000)
    assert rates == {"x": pytest.approx(0.5), "y": 0.0}


def test_worker_metrics_land_on_the_worker_row(store: Store) -> None:
    store.register_worker("w1", hostname="h", pid=1, concurrency=10)
    FlowStore(store).report("w1", pool="gpt", concurrency_limit=42, latency_ms=123.5,
                            failure_rate=0.01, detail={"ep": {"limit": 42}})
    (r,) = rows(store, "SELECT pool, concurrency_limit, latency_ms, failure_rate, flow "
                       "FROM worker")
    assert (r["pool"], r["concurrency_limit"], r["latency_ms"], r["failure_rate"]) == (
        "gpt", 42, 123.5, 0.01)
    assert '"limit":42' in r["flow"]


def test_windows_report_counts_and_rates(store: Store) -> None:
    now = store.db_now()
    _submit(store, 10, "w", plan=BatchPlan(window=Window(now - 1000, now + 60_000, 0.5)))
    (w,) = FlowStore(store).windows()
    assert w["id"] == "w" and w["counts"] == {"PENDING": 10} and w["pools"] == ["default"]
    assert w["target_per_s"] == 0.5 and w["recent_done"] == 0
