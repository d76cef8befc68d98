"""Retry policy end to end: back-off on the database clock, stop_on, DEAD after the
budget, Retry-After, fallback delivery, and the attempt trace of every call."""

from __future__ import annotations

import functools
import hashlib
import math
import random

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import RetryPolicy, parse_task
from lockgate.store import Store

from .support import (
    MODEL,
    PROSE_TEMPLATE,
    TEMPLATE,
    attempts_of,
    run_worker,
    scalar,
    task,
    task_row,
    wait_for,
)

# -- the back-off formula ---------------------------------------------------------------


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=st.integers(0, 1_000_000), factor=st.floats(1.0, 10.0),
       jitter=st.floats(0.0, 1.0), cap=st.integers(0, 10_000_000),
       retry=st.integers(1, 100), seed=st.integers(0, 2**32))
def test_delay_lies_within_the_jitter_band_of_the_capped_exponential(
        base: int, factor: float, jitter: float, cap: int, retry: int, seed: int) -> None:
    policy = RetryPolicy(base_delay_ms=base, backoff_factor=factor, jitter=jitter,
                         cap_ms=cap)
    nominal = min(float(cap), base * factor ** (retry - 1))
    delay = policy.delay_ms(retry, random.Random(seed))
    assert isinstance(delay, int)
    assert math.floor(nominal * (1 - jitter)) - 1 <= delay <= math.ceil(nominal * (1 + jitter)) + 1
    assert delay >= 0


@settings(max_examples=200, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(base=st.integers(1, 100_000), factor=st.floats(1.0, 10.0), cap=st.integers(1, 10**7),
       retry=st.integers(1, 99))
def test_without_jitter_the_delay_grows_until_the_cap(base: int, factor: float, cap: int,
                                                      retry: int) -> None:
    policy = RetryPolicy(base_delay_ms=base, backoff_factor=factor, jitter=0.0, cap_ms=cap)
    a, b = policy.delay_ms(retry), policy.delay_ms(retry + 1)
    assert a <= b <= cap


# -- end to end ------------------------------------------------------------------------------

def submit(store: Store, *lines: dict[str, object]) -> None:
    store.submit([parse_task(x) for x in lines], batch_id="b")


def released_after(store: Store, task_id: str, attempt: int) -> bool:
    """The task was written back PENDING (backing off) after its ``attempt``-th call."""
    row = task_row(store, task_id)
    return bool(row["status"] == "PENDING" and row["attempts"] >= attempt
                and row["lease_token"] is None)


def test_backoff_sets_visible_at_within_the_jitter_band_on_the_database_clock(
        store: Store, simulator: SimulatorProcess) -> None:
    simulator.configure(rate_500=1.0)
    base, jitter = 60_000, 0.25
    submit(store, task("t1", retry={"max_retries": 5, "base_delay_ms": base,
                                    "backoff_factor": 3.0, "jitter": jitter}))
    for attempt, nominal in ((1, base), (2, 3 * base)):
        before = store.db_now()
        run_worker(store, until=functools.partial(released_after, store, "t1", attempt),
                   concurrency=2)
        after = store.db_now()
        row = task_row(store, "t1")
        assert row["attempts"] == attempt
        assert before <= row["updated_at"] <= after
        delay = row["visible_at"] - row["updated_at"]
        assert math.floor(nominal * (1 - jitter)) <= delay <= math.ceil(nominal * (1 + jitter))
        assert (row["error_class"], row["lease_token"]) == ("server_error", None)
        # Make the back-off pass at once (instead of waiting a minute) for the next call.
        with store.engine.begin() as conn:
            conn.exec_driver_sql("UPDATE task SET visible_at = 0")
    trace = attempts_of(store, "t1")
    assert [(a["attempt"], a["outcome"], a["http_status"], a["error_class"]) for a in trace] == [
        (1, "retry", 500, "server_error"), (2, "retry", 500, "server_error")]


def test_retry_after_from_a_429_is_honoured(store: Store, simulator: SimulatorProcess) -> None:
    simulator.configure(rate_429=1.0, retry_after_ms=45_000)
    submit(store, task("t1", retry={"base_delay_ms": 10, "jitter": 0.0}))
    run_worker(store, until=lambda: len(attempts_of(store, "t1")) == 1
               and released_after(store, "t1", 0), concurrency=2)
    row = task_row(store, "t1")
    assert row["error_class"] == "rate_limited"
    assert row["visible_at"] - row["updated_at"] >= 45_000
    (a,) = attempts_of(store, "t1")
    # the endpoint's first refusal (it named no limit before): no attempt spent
    # (docs/flow.md); its Retry-After is honoured all the same
    assert (a["outcome"], a["http_status"], a["error_class"]) == \
        ("first_429", 429, "rate_limited")
    assert row["attempts"] == 0
    assert store.claim(1, lease_ms=1000, worker_id="probe") == [], "claimable before Retry-After"


def test_stop_on_fails_the_task_at_once(store: Store, simulator: SimulatorProcess) -> None:
    simulator.configure(rate_500=1.0)
    submit(store, task("t1", retry={"max_retries": 5, "base_delay_ms": 0,
                                    "stop_on": ["server_error"]}))
    run_worker(store, concurrency=2)
    row = task_row(store, "t1")
    assert (row["status"], row["attempts"], row["error_class"]) == ("FAILED", 1, "server_error")
    assert "HTTP 500" in row["error_message"]
    assert row["result"] is None
    assert simulator.stats()["requests"] == 1


@pytest.mark.parametrize("fault,prose,error_class,parse_status", [
    ({"rate_500": 1.0}, False, "server_error", None),
    ({"rate_503": 1.0}, False, "server_error", None),
    ({"rate_timeout": 1.0, "hang_s": 30}, False, "timeout", None),
    ({"rate_malformed": 1.0}, False, "invalid_output", "invalid_json"),
    ({}, True, "invalid_output", "no_json_found"),  # prose where JSON is required
], ids=["500", "503", "timeout", "malformed", "prose"])
def test_dead_after_max_retries(store: Store, simulator: SimulatorProcess,
                                fault: dict[str, object], prose: bool, error_class: str,
                                parse_status: str | None) -> None:
    simulator.configure(**fault)
    line = task("t1", model={"timeout_ms": 300},
                retry={"max_retries": 2, "base_delay_ms": 0, "jitter": 0.0},
                template=PROSE_TEMPLATE if prose else TEMPLATE)
    submit(store, line)
    run_worker(store, concurrency=2)
    row = task_row(store, "t1")
    assert (row["status"], row["attempts"], row["error_class"]) == ("DEAD", 3, error_class)
    assert row["result"] is None
    trace = attempts_of(store, "t1")
    assert [a["outcome"] for a in trace] == ["retry", "retry", "dead"]
    assert {a["error_class"] for a in trace} == {error_class}
    assert {a["parse_status"] for a in trace} == {parse_status}
    assert simulator.stats()["requests"] == 3
    if prose:
        assert all(a["raw_output"].startswith("Simulated reply") for a in trace)


@pytest.mark.parametrize("config,model,error_class,stop_on", [
    ({"strict_models": True}, "no-such-model", "invalid_request", []),
    ({"context_window": 20}, MODEL, "context_length_exceeded", []),
    # a refused key is retried (the endpoint's condition, docs/flow.md), unless the
    # policy stops on it
    ({"require_api_key": True}, MODEL, "auth_error", ["auth_error"]),
], ids=["unknown-model", "context-length", "auth-stop-on"])
def test_non_retryable_errors_fail_at_once_with_their_class(
        store: Store, simulator: SimulatorProcess, config: dict[str, object], model: str,
        error_class: str, stop_on: list[str]) -> None:
    simulator.configure(**config)
    submit(store, task("t1", model={"name": model},
                       retry={"max_retries": 5, "stop_on": stop_on}))
    run_worker(store, concurrency=2)
    row = task_row(store, "t1")
    assert (row["status"], row["attempts"], row["error_class"]) == ("FAILED", 1, error_class)
    (a,) = attempts_of(store, "t1")
    assert (a["outcome"], a["error_class"]) == ("failed", error_class)
    assert 400 <= a["http_status"] < 500
    assert simulator.stats()["requests"] == 1


def test_on_invalid_fallback_delivers_the_fallback_values(store: Store,
                                                          simulator: SimulatorProcess) -> None:
    submit(store, task("t1", "a text", template=PROSE_TEMPLATE,
                       delivery={"on_invalid": "fallback",
                                 "fallback_values": {"label": "unknown"}},
                       retry={"max_retries": 1, "base_delay_ms": 0}))
    run_worker(store, concurrency=2)
    row = task_row(store, "t1")
    assert (row["status"], row["attempts"], row["error_class"]) == (
        "FAILED", 2, "invalid_output"), "delivered with a fallback, and says why"
    assert orjson.loads(row["result"]) == {"label": "unknown"}
    assert [a["outcome"] for a in attempts_of(store, "t1")] == ["retry", "failed"]


def test_missing_key_is_filled_from_fallback_values(store: Store,
                                                    simulator: SimulatorProcess) -> None:
    submit(store, task("t1", "please refund",
                       delivery={"required_keys": ["label", "reason"],
                                 "fallback_values": {"reason": "n/a"}}))
    run_worker(store, concurrency=2)
    row = task_row(store, "t1")
    assert row["status"] == "SUCCEEDED"
    assert orjson.loads(row["result"]) == {"label": "yes", "reason": "n/a"}
    assert row["parse_status"] == "filled_fallback"


def test_attempt_trace_records_the_whole_call(store: Store, simulator: SimulatorProcess) -> None:
    simulator.configure(rate_500=1.0)
    submit(store, task("t1", "please refund my order",
                       retry={"max_retries": 1, "base_delay_ms": 60_000, "jitter": 0.0}))
    run_worker(store, until=lambda: released_after(store, "t1", 1), concurrency=2)
    simulator.configure(rate_500=0.0)
    with store.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE task SET visible_at = 0")  # skip the back-off
    stats = run_worker(store, concurrency=2)
    assert stats.succeeded == 1
    failed, ok = attempts_of(store, "t1")
    row = task_row(store, "t1")

    assert (ok["outcome"], ok["attempt"], ok["model"], ok["endpoint"]) == (
        "succeeded", 2, MODEL, "default")
    assert ok["worker_id"] == row["leased_by"] and ok["lease_token"] == row["lease_token"]
    messages = orjson.loads(ok["prompt_snapshot"])
    assert messages[-1] == {"role": "user",
                            "content": "<input>\nplease refund my order\n</input>"}
    assert messages[0]["role"] == "system" and 'like {"label": "yes"}' in messages[0]["content"]
    assert ok["prompt_sha256"] == hashlib.sha256(ok["prompt_snapshot"].encode()).hexdigest()
    assert ok["raw_output"] == '{"label":"yes"}'
    assert (ok["parse_status"], ok["http_status"], ok["error_class"]) == ("valid", 200, None)
    assert ok["input_tokens"] > 0 and ok["output_tokens"] > 0
    assert ok["estimated_tokens"] > 0 and ok["token_estimator"]
    assert ok["latency_ms"] > 0
    tokens = simulator.stats()["tokens"]
    assert tokens["prompt"] == ok["input_tokens"] and tokens["completion"] == ok["output_tokens"]

    assert (failed["outcome"], failed["attempt"], failed["http_status"]) == ("retry", 1, 500)
    assert failed["error_class"] == "server_error" and "HTTP 500" in failed["error_message"]
    assert failed["raw_output"] is None and failed["output_tokens"] is None
    assert failed["prompt_sha256"] == ok["prompt_sha256"], "the same prompt, replayable"
    assert failed["model"] == MODEL
    assert scalar(store, "SELECT COUNT(*) FROM task_attempt") == 2


def test_idempotency_keys_never_repeat_after_an_operator_retry_or_a_reused_task_id(
        store: Store, simulator: SimulatorProcess) -> None:
    """``tasks retry`` resets the attempt count and ``cleanup --tasks`` frees task ids for
    a new submission: a key of ``{task_id}:{attempt}`` was then sent again, and a
    provider that honours it would replay the earlier answer. Each claim's key differs."""
    simulator.configure(rate_500=1.0)
    submit(store, task("t1", "where is my parcel", retry={"max_retries": 0}))
    assert run_worker(store, concurrency=2).dead == 1
    simulator.configure(rate_500=0.0)
    store.retry("t1")
    assert run_worker(store, concurrency=2).succeeded == 1
    finished = scalar(store, "SELECT finished_at FROM task")
    wait_for(lambda: store.db_now() > finished, "the clock to pass the finish")
    assert store.cleanup(older_than_ms=0, tasks=True)["tasks"] == 1
    submit(store, task("t1", "where is my parcel"))
    assert run_worker(store, concurrency=2).succeeded == 1

    stats = simulator.stats(detail=True)
    assert (stats["requests"], stats["idempotency_keys"]) == (3, 3)
    assert (stats["duplicate_keys"], stats["duplicate_key_counts"]) == (0, {})
    assert stats["task_successes"] == {"t1": 2}, "the key still names its task"


def test_a_task_whose_every_attempt_hits_an_internal_error_ends_dead_saying_so(
        store: Store, simulator: SimulatorProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in the worker's own code is retried (it must not lose the task), within the
    task's budget; when the budget is spent the task ends DEAD with the error it kept
    hitting, not as if its lease had been lost."""
    import lockgate.worker.calls as calls

    def broken(*_args: object, **_kwargs: object) -> object:
        raise RuntimeError("renderer exploded")
    monkeypatch.setattr(calls, "run_attempt", broken)
    submit(store, task("t1", retry={"max_retries": 0}))
    run_worker(store, concurrency=2)
    row = task_row(store, "t1")
    assert (row["status"], row["error_class"]) == ("DEAD", "internal_error")
    assert "RuntimeError: renderer exploded" in row["error_message"]
    assert "max_retries 0" in row["error_message"]
    trace = attempts_of(store, "t1")
    assert [a["outcome"] for a in trace] == ["retry", "dead"]
    assert {a["error_class"] for a in trace} == {"internal_error"}
    assert "renderer exploded" in trace[0]["error_message"]
    assert simulator.stats()["requests"] == 0
