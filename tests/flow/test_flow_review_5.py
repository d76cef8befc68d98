"""Review 5 of flow control: the first claims know the lanes (windows, weights) and the
endpoints' known limits; a fallback that refuses spends the attempt; a start-up burst
into an endpoint whose limit only its headers name; a pace inferred from a cold start;
one probe after a quota pause; pause reasons; a per-day limit is not learned per
minute. Workers run on SQLite with in-process providers; assertions are counts with
wide margins, never timings."""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from typing import Any

from lockgate.errors import ErrorClass
from lockgate.flow.endpoint import PACE_CUT, Pace
from lockgate.flow.window import BatchPlan, Window
from lockgate.providers.base import Completion, CompletionRequest, ProviderError
from lockgate.spec import parse_task
from lockgate.store import Store
from lockgate.worker import Worker

from .support import rows, run_workers, settings, status_counts, tasks
from .test_control import CONFIG, claimed, controller, ep, result


def submit(store: Store, specs: list[dict[str, Any]], batch: str,
           plan: BatchPlan | None = None) -> None:
    store.submit([parse_task(t) for t in specs], batch_id=batch,
                 pool_of=lambda _s: "default", batch_fields=plan.fields() if plan else None)


def answer(headers: dict[str, str] | None = None) -> Completion:
    return Completion(json.dumps({"label": "delivery"}), 200, "m", 40, 5,
                      rate_limit=headers or {})


class Fake:
    """An in-process provider: ``behave(n)`` answers the n-th call (a Completion, or
    raises); every call is logged (its batch and when it was sent)."""

    def __init__(self, name: str, behave: Any, latency: float = 0.01) -> None:
        self.name = name
        self.behave = behave
        self.latency = latency
        self.calls: list[tuple[float, str]] = []
        self.in_flight = 0

    async def complete(self, request: CompletionRequest) -> Completion:
        text = json.dumps(request.messages)
        self.calls.append((time.monotonic(), "b" if "BATCH-B" in text else ""))
        self.in_flight += 1
        try:
            return await self.behave(len(self.calls), self)
        finally:
            self.in_flight -= 1

    async def close(self) -> None:
        pass


async def ok(_n: int, p: Fake) -> Completion:
    await asyncio.sleep(p.latency)
    return answer()


def test_a_window_open_when_the_worker_starts_is_paced_from_the_first_task(
        sqlite_store: Store) -> None:
    """600 tasks in a window opened a minute ago, target 2/s: all 600 ran in the first
    seconds (the first claims were plain, before the lanes were read)."""
    now_ms = int(time.time() * 1000)
    submit(sqlite_store, tasks(300), "w",
           BatchPlan(window=Window(now_ms - 60_000, now_ms + 240_000, 2.0)))
    prov = Fake("sim", ok)
    cfg = settings([{"name": "sim", "base_url": "http://127.0.0.1:9/v1"}],
                   flow={"pace_every_s": 0.5}, concurrency=64)
    w = Worker(sqlite_store, cfg, burst=True, providers={"sim": prov})
    t0 = time.monotonic()

    async def until() -> bool:
        return time.monotonic() - t0 > 3.0

    asyncio.run(run_workers([w], until=until, timeout=60))
    assert len(prov.calls) <= 60, f"{len(prov.calls)} of 300 called in ~3 s at 2/s"


def test_the_first_claims_share_by_weight_and_hold_a_backlog_of_the_known_limit(
        sqlite_store: Store) -> None:
    """Batches a (weight 1) and b (weight 3) on an endpoint of 3000 a minute: a got
    nearly all of the first claims (plain, 256 + 256 + 88 tasks), b none until a was
    done; 600 tasks were claimed at once against 50 calls a second."""
    submit(sqlite_store, tasks(300, prefix="a"), "a", BatchPlan(base_weight=1))
    specs_b = tasks(300, prefix="b")
    for t in specs_b:
        t["input_data"]["text"] = "BATCH-B " + t["input_data"]["text"]
    submit(sqlite_store, specs_b, "b", BatchPlan(base_weight=3))
    prov = Fake("sim", ok)
    cfg = settings([{"name": "sim", "base_url": "http://127.0.0.1:9/v1", "rpm": 3000}],
                   concurrency=512, claim_batch=256)
    w = Worker(sqlite_store, cfg, burst=True, providers={"sim": prov})
    held: list[int] = []

    async def tick(elapsed: float) -> None:
        if elapsed < 2.0:
            held.append(len(w._held))

    async def until() -> bool:
        return len(prov.calls) >= 100

    asyncio.run(run_workers([w], until=until, tick=tick, timeout=60))
    first = prov.calls[:100]
    from_b = sum(1 for _t, who in first if who == "b")
    assert from_b >= 40, f"b (weight 3) had {from_b} of the first 100 calls"
    assert max(held) <= 200, f"{max(held)} tasks held at once against 50 calls/s"


def test_a_fallback_that_refuses_spends_the_attempt(sqlite_store: Store) -> None:
    """The primary always fails (500), its fallback (none of its own) always refuses
    (429): each refusal was `rerouted` without an attempt spent, for ever (100 tasks
    of max_retries 2 made 1,323 calls, 1,023 of them `rerouted`)."""
    submit(sqlite_store, tasks(20, retry={"max_retries": 2, "base_delay_ms": 10,
                                          "jitter": 0.0}), "b")

    async def fail(_n: int, _p: Fake) -> Completion:
        await asyncio.sleep(0.002)
        raise ProviderError(ErrorClass.SERVER_ERROR, "down", http_status=500)

    async def refuse(_n: int, _p: Fake) -> Completion:
        await asyncio.sleep(0.002)
        raise ProviderError(ErrorClass.RATE_LIMITED, "slow down", http_status=429)

    primary, backup = Fake("primary", fail), Fake("backup", refuse)
    cfg = settings([{"name": "primary", "base_url": "http://127.0.0.1:9/v1",
                     "models": ["sim-complaints"], "fallback": "backup"},
                    {"name": "backup", "base_url": "http://127.0.0.1:9/v1"}],
                   flow={"default_pause_s": 0.05, "breaker_open_s": 30},
                   concurrency=8)
    w = Worker(sqlite_store, cfg, burst=True,
               providers={"primary": primary, "backup": backup})
    t0 = time.monotonic()

    async def until() -> bool:
        return time.monotonic() - t0 > 20 or status_counts(sqlite_store) == {"DEAD": 20}

    asyncio.run(run_workers([w], until=until, timeout=60))
    assert status_counts(sqlite_store) == {"DEAD": 20}
    rerouted = rows(sqlite_store, "SELECT COUNT(*) AS n FROM task_attempt "
                                  "WHERE outcome = 'rerouted' AND endpoint = 'backup'")
    assert rerouted[0]["n"] == 0
    assert len(primary.calls) + len(backup.calls) <= 70


class PerSecond:
    """A provider allowing ``limit`` calls in any second, naming its limit per minute
    in OpenAI's headers (on its answers and its 429s)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.sent: deque[float] = deque()
        self.refused = 0

    async def __call__(self, _n: int, p: Fake) -> Completion:
        await asyncio.sleep(p.latency / 2)  # the request reaches it
        now = time.monotonic()
        while self.sent and self.sent[0] <= now - 1.0:
            self.sent.popleft()
        h = {"x-ratelimit-limit-requests": str(self.limit * 60),
             "x-ratelimit-remaining-requests": str(max(0, self.limit - len(self.sent) - 1)),
             "x-ratelimit-reset-requests": "1s"}
        if len(self.sent) >= self.limit:
            self.refused += 1
            await asyncio.sleep(p.latency / 2)  # (an answer takes its round trip)
            raise ProviderError(ErrorClass.RATE_LIMITED, "Rate limit reached for requests",
                                http_status=429, rate_limit=h)
        self.sent.append(now)
        await asyncio.sleep(p.latency / 2)
        return answer(h)


def test_a_limit_named_only_by_headers_is_not_met_with_a_burst_at_start(
        sqlite_store: Store) -> None:
    """No limit configured, 50 a second named by the headers: before the first answer
    a worker sent as many calls as its concurrency, 462-465 of the first 512 met 429s
    (each an attempt), then stalled 8-10 s on the debt of the refused ones."""
    submit(sqlite_store, tasks(200, retry={"max_retries": 8}), "b")
    limiter = PerSecond(50)
    prov = Fake("sim", limiter, latency=0.5)
    cfg = settings([{"name": "sim", "base_url": "http://127.0.0.1:9/v1"}],
                   concurrency=512, claim_batch=256)
    w = Worker(sqlite_store, cfg, burst=True, providers={"sim": prov})
    asyncio.run(run_workers([w], timeout=90))
    assert status_counts(sqlite_store) == {"SUCCEEDED": 200}
    assert limiter.refused <= 30, f"{limiter.refused} calls refused"


def test_a_pace_inferred_from_a_cold_start_doubles_until_a_429() -> None:
    """A provider allowing 8 calls in flight took 16 in the worker's first second: the
    pace started at 14 a second and rose 2 % a period (minutes to its capacity)."""
    pace = Pace.inferred(16, 1.0, 0.0, cold=True)
    start = pace.rate
    for i in range(1, 5):
        pace.rise(float(i))
    assert pace.rate >= 8 * start
    assert pace.cut(5.0, sent=4.9, accepted=True)
    cut = pace.rate
    assert abs(cut - 16 * start * PACE_CUT) < 1e-6
    pace.rise(6.0)
    assert pace.rate < 1.05 * cut  # a limit found: 2 % from here
    warm = Pace.inferred(16, 1.0, 0.0)
    warm.rise(1.0)
    assert warm.rate < 1.05 * warm.held + 1e-9


def test_the_controller_infers_a_doubling_pace_from_the_first_period() -> None:
    async def main() -> float:
        fc, _ = controller([ep("a")], lease_interval_s=0.02, default_pause_s=0.05)
        stop = asyncio.Event()
        loop = asyncio.create_task(fc.run(stop))
        primary = fc.settings.endpoint[0]
        fc.release(await fc.acquire(claimed(0), CONFIG, primary), result(latency=5.0))
        tickets = [await fc.acquire(claimed(i), CONFIG, primary) for i in range(1, 12)]
        for t in tickets[:8]:
            fc.release(t, result(latency=5.0))
        for t in tickets[8:]:
            fc.release(t, result(ErrorClass.RATE_LIMITED, latency=1.0))
        await asyncio.sleep(0.1)  # the pause ends
        t = await fc.acquire(claimed(99), CONFIG, primary)
        fc.release(t, result())
        pace = fc.states["a"].pace
        stop.set()
        await loop
        assert pace is not None
        return pace.held

    assert asyncio.run(main()) == float("inf")


async def _no_quota(_n: int, _p: Fake) -> Completion:
    await asyncio.sleep(0.005)
    raise ProviderError(ErrorClass.QUOTA_EXHAUSTED, "You exceeded your current quota",
                        http_status=429)


def test_one_call_probes_an_endpoint_when_its_quota_pause_ends(sqlite_store: Store) -> None:
    """Out of quota, with a fallback serving the tasks: when each pause ended, 24-77
    calls went at once to the still exhausted endpoint. One probes it now; the others
    wait for its answer, then go to the fallback."""
    submit(sqlite_store, tasks(400, retry={"max_retries": 50, "base_delay_ms": 10}), "b")

    async def slow_ok(_n: int, _p: Fake) -> Completion:
        await asyncio.sleep(0.05)
        return answer()

    primary, backup = Fake("primary", _no_quota), Fake("backup", slow_ok)
    cfg = settings([{"name": "primary", "base_url": "http://127.0.0.1:9/v1",
                     "models": ["sim-complaints"], "fallback": "backup"},
                    {"name": "backup", "base_url": "http://127.0.0.1:9/v1",
                     "max_concurrency": 8}],
                   flow={"quota_pause_s": 0.5}, concurrency=64, shutdown_grace_s=1)
    w = Worker(sqlite_store, cfg, burst=True,
               providers={"primary": primary, "backup": backup})
    t0 = time.monotonic()

    async def until() -> bool:
        return time.monotonic() - t0 > 3.5

    asyncio.run(run_workers([w], until=until, timeout=60))
    first = primary.calls[0][0]
    after_first = [t for t, _ in primary.calls if first + 0.3 < t < first + 3.3]
    # About one probe per 0.5 s pause (7 in 3.5 s); before, dozens at each pause end.
    assert 1 <= len(after_first) <= 25, len(after_first)
    assert backup.calls  # the tasks went on meanwhile


def test_a_quota_out_for_good_with_no_fallback_ends_its_tasks(sqlite_store: Store) -> None:
    """With no fallback, the calls waiting for a quota pause are their tasks' attempts:
    they go when it ends, so a quota that never comes back ends its tasks (DEAD) within
    their retries instead of holding them a pause per attempt."""
    submit(sqlite_store, tasks(40, retry={"max_retries": 2, "base_delay_ms": 10,
                                          "jitter": 0.0}), "b")
    prov = Fake("sim", _no_quota)
    cfg = settings([{"name": "sim", "base_url": "http://127.0.0.1:9/v1"}],
                   flow={"quota_pause_s": 0.3}, concurrency=64, shutdown_grace_s=1)
    w = Worker(sqlite_store, cfg, burst=True, providers={"sim": prov})
    t0 = time.monotonic()

    async def until() -> bool:
        return time.monotonic() - t0 > 30 or status_counts(sqlite_store) == {"DEAD": 40}

    asyncio.run(run_workers([w], until=until, timeout=60))
    assert status_counts(sqlite_store) == {"DEAD": 40}
    assert len(prov.calls) == 120  # three attempts each, no call unaccounted


def test_a_retry_after_on_a_503_pauses_as_unavailable_not_exhausted() -> None:
    async def main() -> str | None:
        fc, _ = controller([ep("a")], lease_interval_s=0.02)
        stop = asyncio.Event()
        loop = asyncio.create_task(fc.run(stop))
        primary = fc.settings.endpoint[0]
        t = await fc.acquire(claimed(1), CONFIG, primary)
        fc.release(t, result(ErrorClass.SERVER_ERROR, retry_after_ms=3000,
                             headers={"retry-after-ms": "3000"}))
        reason = fc.states["a"].pause_reason
        assert fc.states["a"].paused(time.monotonic())
        stop.set()
        await loop
        return reason

    assert asyncio.run(main()) == "unavailable"


def test_a_requests_limit_whose_reset_is_beyond_a_minute_is_not_learned_per_minute(
) -> None:
    """Groq's x-ratelimit-limit-requests is per day (14,400, reset 2m59.56s): read as
    per minute it became a limit of 14,400 a minute."""
    async def main() -> tuple[bool, bool]:
        fc, _ = controller([ep("a"), ep("b")], lease_interval_s=0.02)
        stop = asyncio.Event()
        loop = asyncio.create_task(fc.run(stop))
        a, b = fc.settings.endpoint
        fc.release(await fc.acquire(claimed(1), CONFIG, a), result(headers={
            "x-ratelimit-limit-requests": "14400", "x-ratelimit-remaining-requests": "14370",
            "x-ratelimit-reset-requests": "2m59.56s"}))
        fc.release(await fc.acquire(claimed(2), CONFIG, b), result(headers={
            "x-ratelimit-limit-requests": "3000", "x-ratelimit-remaining-requests": "2990",
            "x-ratelimit-reset-requests": "200ms"}))
        out = fc.states["a"].req_limited, fc.states["b"].req_limited
        stop.set()
        await loop
        return out

    assert asyncio.run(main()) == (False, True)
