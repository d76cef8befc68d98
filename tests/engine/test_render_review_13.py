"""Found by a review: rendering held the worker's event loop, and what rendering did to
an input was not recorded.

A large input under a token budget takes about a second per MB to condense; the worker
rendered it on its event loop, so a claim of a few such tasks held the loop past their
leases: no lease was renewed meanwhile, the tasks were called again and again and ended
DEAD (``lease_expired``), and the worker blamed the database. Rendering's alerts
(``input_default:<name>``, ``empty_input:<name>``, ``over_budget``) and notes
(``condensed:...``) were computed and dropped: the trace did not say that a value was
filled from a default or that the input was cut."""

from __future__ import annotations

import random
import threading
import time

import pytest

import lockgate
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store

from .support import (
    SYSTEM,
    BackgroundWorker,
    rows,
    run_worker,
    scalar,
    status_counts,
    task,
    wait_for,
)

WORDS = ["parcel", "late", "box", "damaged", "support", "refund", "order", "customer",
         "delivery", "week"]


def long_text(seed: int, sentences: int) -> str:
    """Sentences of prose, about 25 characters each (what condensing works on)."""
    rnd = random.Random(seed)
    return " ".join(f"{rnd.choice(WORDS).capitalize()} {rnd.choice(WORDS)} {j}."
                    for j in range(sentences))


def test_large_inputs_condensed_to_a_budget_keep_their_leases(
        sqlite_store: Store, simulator: SimulatorProcess) -> None:
    """Three tasks of 2 MB each under a 500-token budget, claimed at once by a worker
    whose lease is a second, while a second worker waits for work: condensing each
    input takes longer than a lease (about a second per MB). Each is called once, by
    the worker that claimed it, and succeeds: rendering does not hold the event loop
    that renews the leases. (Once was: the second worker took them over as their
    leases lapsed, the first one's results were refused, and tasks ended DEAD.)"""
    store = sqlite_store
    n = 3
    store.submit([parse_task(task(f"big-{i}", long_text(i, 80_000),
                                  model={"max_input_tokens": 500},
                                  retry={"max_retries": 0}))
                  for i in range(n)], batch_id="big")
    with BackgroundWorker(store, concurrency=n, claim_batch=n, lease_s=1.0,
                          heartbeat_s=0.2) as holder:
        wait_for(lambda: scalar(store, "SELECT COUNT(*) FROM task WHERE status = 'PENDING' "
                                       "AND lease_token IS NOT NULL") == n,
                 "the tasks claimed")
        # The second worker runs until no task is left to do: it takes any whose lease
        # lapses.
        run_worker(store, until=lambda: not scalar(
            store, "SELECT COUNT(*) FROM task WHERE status = 'PENDING'"),
            timeout=120, lease_s=30.0)
        stats = holder.stop()
    assert status_counts(store) == {"SUCCEEDED": n}, rows(
        store, "SELECT task_id, status, error_class, error_message FROM task")
    assert simulator.stats()["requests"] == n
    assert (stats.succeeded, stats.discarded, stats.dead) == (n, 0, 0)
    trace = rows(store, "SELECT t.task_id, a.outcome, a.fixes FROM task_attempt a "
                        "JOIN task t ON t.id = a.task_pk ORDER BY t.task_id")
    assert [(r["task_id"], r["outcome"]) for r in trace] == [
        (f"big-{i}", "succeeded") for i in range(n)]
    # the trace says the input was cut to fit
    assert all(r["fixes"] and r["fixes"].startswith("condensed:text:") for r in trace), trace


def test_rendering_alerts_and_notes_are_kept_with_the_attempt(
        db_url: str, store: Store, simulator: SimulatorProcess) -> None:
    """A value filled from ``input_defaults``, an empty one, a prompt over its budget and
    a condensed input each say so in the attempt's ``fixes`` (before the answer's own
    fixes), which ``Lockgate.task`` (``lockgate tasks show``) returns; a task that
    rendering changed nothing of has none."""
    template = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "In {lang}: <input>{text}</input>"}]
    rule = {"input_defaults": {"lang": "English"}}
    specs = [
        task("default", "where is my parcel", template=template, delivery=rule),
        task("empty", "", template=template, delivery=rule, input_data={
            "text": None, "lang": "fr"}),
        task("over", "x", template=[{"role": "system", "content": "Rules. " * 100 + SYSTEM},
                                    template[1]], delivery=rule, model={"max_input_tokens": 50},
             input_data={"text": "x", "lang": "fr"}),
        task("condensed", "", template=template, delivery=rule,
             model={"max_input_tokens": 80},
             input_data={"text": "Late parcel. Broken box. " * 200, "lang": "fr"}),
        task("plain", "where is my parcel", template=template, delivery=rule,
             input_data={"text": "where is my parcel", "lang": "fr"}),
    ]
    store.submit([parse_task(s) for s in specs], batch_id="alerts")
    run_worker(store, concurrency=4)
    fixes = {r["task_id"]: r["fixes"] for r in rows(
        store, "SELECT t.task_id, a.fixes FROM task_attempt a JOIN task t "
               "ON t.id = a.task_pk")}
    assert set(fixes) == {s["task_id"] for s in specs}
    assert fixes["default"] is not None
    assert fixes["default"].split(",")[0] == "input_default:lang", fixes
    assert fixes["empty"] is not None
    assert fixes["empty"].split(",")[0] == "empty_input:text", fixes
    assert fixes["over"] is not None and "over_budget" in fixes["over"].split(","), fixes
    assert fixes["condensed"] is not None
    assert fixes["condensed"].startswith("condensed:text:"), fixes
    assert fixes["plain"] is None or not any(
        f.startswith(("input_", "empty_input", "over_budget", "condensed"))
        for f in fixes["plain"].split(",")), fixes
    with lockgate.connect(db_url) as lg:
        (attempt,) = lg.task("default").attempt_log
    assert attempt.fixes[0] == "input_default:lang"


def test_a_renewal_held_up_by_the_event_loop_says_so_not_the_database(
        sqlite_store: Store, simulator: SimulatorProcess,
        caplog: pytest.LogCaptureFixture) -> None:
    """The worker's event loop held for more than a lease (work between two awaits):
    the warning says the loop was busy, not that the database was locked or slow."""
    simulator.configure(latency={"kind": "fixed", "mean_ms": 4000})
    sqlite_store.submit([parse_task(task(f"t-{i}")) for i in range(2)], batch_id="b")
    with caplog.at_level("WARNING", logger="lockgate.worker"), \
            BackgroundWorker(sqlite_store, concurrency=2, lease_s=1.0,
                             heartbeat_s=0.2) as bg:
        wait_for(lambda: int(simulator.stats()["in_flight"]) >= 2, "calls in flight")
        loop = bg._loop
        assert loop is not None
        held = threading.Event()

        def hold() -> None:
            time.sleep(2.5)
            held.set()

        loop.call_soon_threadsafe(hold)
        wait_for(held.is_set, "the loop to be held")
        wait_for(lambda: "longer than a lease (1s)" in caplog.text,
                 "the held-up renewal to be said", timeout=10)
        bg.stop()
    assert "this worker's event loop was busy" in caplog.text, caplog.text
    assert "the database was locked or slow" not in caplog.text, caplog.text
