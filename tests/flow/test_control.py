"""The per-worker flow controller on an in-memory fake of its store: budgets, pauses,
concurrency slots, breakers and fallbacks, without a database or a network."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import pytest

from lockgate.config import Endpoint, Settings
from lockgate.errors import ErrorClass
from lockgate.flow.admission import COLD_CALLS
from lockgate.flow.control import FlowControl
from lockgate.providers.base import CallOutcome, Completion, CompletionRequest, ProviderError
from lockgate.spec import load_config
from lockgate.store import ClaimedTask
from lockgate.store.flow import BucketRow, BucketSpec, BucketState, BucketStep, Lane

from .support import task

T = TypeVar("T")


class FakeFlowStore:
    """The bucket rows in a dict, on this process's monotonic clock (ms); the lease
    arithmetic is flow control's own, as on a database."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[BucketSpec, BucketState]] = {}

    @staticmethod
    def now() -> int:
        return int(time.monotonic() * 1000)

    def ensure(self, specs: Iterable[BucketSpec]) -> None:
        for s in specs:
            if s.name not in self.rows:
                self.rows[s.name] = (s, BucketState(0.0, 0.0, self.now() - s.window_ms, 0,
                                                    None, None, None, 1.0, 0))

    def update_buckets(self, names: Iterable[str],
                       step: BucketStep[T]) -> dict[str, tuple[T, bool]]:
        out = {}
        for name in sorted(set(names)):
            if name not in self.rows:
                continue
            spec, state = self.rows[name]
            update, answer = step(BucketRow(name, spec.rpm, spec.tpm, spec.window_ms, state,
                                            self.now()))
            if update is not None:
                self.rows[name] = (spec, update.state)
            out[name] = (answer, True)
        return out

    def lanes(self, pool: str | None = None) -> tuple[list[Lane], int]:
        return [], self.now()

    def pace(self, batch_id: str, *, opens_at: int, every_ms: int,
             rate: Callable[[int, int], float | None]) -> bool:
        return False

    def failure_rates(self, *, since_ms: int) -> dict[str, float]:
        return {}

    def claim(self, n: int, *, lease_ms: int, worker_id: str) -> list[ClaimedTask]:
        return []

    def claim_lanes(self, plan: Mapping[tuple[str, str], int], *, lease_ms: int,
                    token: str, worker_id: str) -> dict[tuple[str, str], list[ClaimedTask]]:
        return {}

    def report(self, worker_id: str, *, pool: str | None, concurrency_limit: int,
               latency_ms: float | None, failure_rate: float | None,
               detail: Mapping[str, Any]) -> None:
        pass


class NoProvider:
    name = "none"

    async def complete(self, request: CompletionRequest) -> Completion:
        raise AssertionError("not called in these tests")

    async def close(self) -> None:
        pass


async def db(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return fn(*args, **kwargs)


def controller(endpoints: list[dict[str, Any]], **flow: Any) -> tuple[FlowControl,
                                                                      FakeFlowStore]:
    settings = Settings.model_validate({"endpoint": endpoints, "flow": flow})
    fake = FakeFlowStore()
    fc = FlowControl(fake, settings, "w1", db=db, provider=lambda ep: NoProvider())
    return fc, fake


CONFIG = load_config({k: v for k, v in task("x").items()
                      if k in ("prompt_template", "model_config", "delivery_rule",
                               "retry_policy")})


def claimed(i: int) -> ClaimedTask:
    return ClaimedTask(i, f"t{i}", "b", "cfg", '{"text": "where is my parcel"}', 1, "tok")


def result(error: ErrorClass | None = None, *, latency: float = 50.0,
           retry_after_ms: int | None = None, tokens: tuple[int, int] = (40, 5),
           headers: dict[str, str] | None = None) -> CallOutcome:
    """What a call came to: an answer with this usage, or an error of this class."""
    if error is None:
        return CallOutcome(Completion("{}", 200, "m", tokens[0], tokens[1],
                                      rate_limit=headers or {}), None, latency)
    return CallOutcome(None, ProviderError(error, "failed", http_status=500,
                                           retry_after_ms=retry_after_ms,
                                           rate_limit=headers), latency)


def ep(name: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, "base_url": "http://127.0.0.1:9/v1", **kw}


async def _calls(fc: FlowControl, ids: range, timeout_s: float) -> int:
    """Calls ``ids`` through the controller at once, each answered with 400 + 10 tokens;
    how many went (within ``timeout_s``)."""
    primary = fc.settings.endpoint[0]
    done = 0

    async def one(i: int) -> None:
        nonlocal done
        t = await fc.acquire(claimed(i), CONFIG, primary)
        fc.release(t, result(tokens=(400, 10)))
        done += 1

    await asyncio.wait_for(asyncio.gather(*(one(i) for i in ids)), timeout_s)
    return done


def test_token_bound_calls_all_get_through_without_a_deadlock() -> None:
    """Plenty of requests but few tokens: leases must still bring tokens."""
    async def main() -> int:
        fc, _fake = controller([ep("a", rpm=600_000, tpm=60_000, limit_window_s=1)],
                               lease_interval_s=0.02)
        stop = asyncio.Event()
        loop = asyncio.create_task(fc.run(stop))
        done = await _calls(fc, range(60), 20)
        stop.set()
        await loop
        return done

    assert asyncio.run(main()) == 60


def test_one_answer_with_an_impossible_usage_owes_one_window_at_most() -> None:
    """An answer claiming 500M tokens was charged in full: the endpoint's token
    allowance owed 500M and every worker's calls waited for days (at 100k a minute).
    A provider refuses a request larger than its limit per window, so the debt stops
    at one window: the next calls wait about a window, then go."""
    async def main() -> int:
        fc, fake = controller([ep("a", rpm=600_000, tpm=60_000, limit_window_s=1)],
                              lease_interval_s=0.02)
        stop = asyncio.Event()
        loop = asyncio.create_task(fc.run(stop))
        bogus = await fc.acquire(claimed(0), CONFIG, fc.settings.endpoint[0])
        fc.release(bogus, result(tokens=(500_000_000, 10)))
        done = await _calls(fc, range(1, 21), 10)
        assert fake.rows["a"][1].tok_allowance >= -60_000
        stop.set()
        await loop
        return done

    assert asyncio.run(main()) == 20


def test_concurrency_slots_hold_calls_until_one_finishes() -> None:
    async def main() -> list[str]:
        fc, _ = controller([ep("a", max_concurrency=2, concurrency_policy="fixed")])
        stop = asyncio.Event()
        loop = asyncio.create_task(fc.run(stop))
        primary = fc.settings.endpoint[0]
        order: list[str] = []
        t1 = await fc.acquire(claimed(1), CONFIG, primary)
        await fc.acquire(claimed(2), CONFIG, primary)
        third = asyncio.create_task(fc.acquire(claimed(3), CONFIG, primary))
        await asyncio.sleep(0.05)
        order.append("third waits" if not third.done() else "third went")
        assert fc.waiting == 1 and fc.claim_room(100) == 15  # min_backlog 16, minus 1
        fc.release(t1, result())
        await asyncio.wait_for(third, 1)
        order.append("third went")
        stop.set()
        third.result().state.in_flight -= 2  # (the other two never finish here)
        await loop
        return order

    assert asyncio.run(main()) == ["third waits", "third went"]


def test_a_429_pauses_the_endpoint_locally_and_for_everyone() -> None:
    async def main() -> tuple[float, float, str | None]:
        fc, fake = controller([ep("a")], lease_interval_s=0.02)
        stop = asyncio.Event()
        loop = asyncio.create_task(fc.run(stop))
        primary = fc.settings.endpoint[0]
        t = await fc.acquire(claimed(1), CONFIG, primary)
        fc.release(t, result(ErrorClass.RATE_LIMITED, retry_after_ms=400,
                             headers={"retry-after-ms": "400"}))
        t0 = time.monotonic()
        t2 = await fc.acquire(claimed(2), CONFIG, primary)  # waits out the pause
        waited = time.monotonic() - t0
        fc.release(t2, result())
        _spec, bucket = fake.rows["a"]
        stop.set()
        await loop
        return waited, bucket.paused_until - t0 * 1000, bucket.pause_reason

    waited, published_ms, why = asyncio.run(main())
    assert waited >= 0.39, "a call went before the time the 429 named"
    assert published_ms > 350 and why == "rate_limited"


def test_quota_and_an_open_breaker_route_to_the_fallback() -> None:
    async def main() -> list[tuple[str, str | None]]:
        fc, _ = controller([ep("hosted", fallback="local"), ep("local")],
                           quota_pause_s=30, breaker_consecutive=2, breaker_open_s=30)
        stop = asyncio.Event()
        loop = asyncio.create_task(fc.run(stop))
        hosted = fc.settings.endpoint[0]
        seen = []
        t = await fc.acquire(claimed(1), CONFIG, hosted)
        seen.append((t.state.name, t.routed_from))
        fc.release(t, result(ErrorClass.QUOTA_EXHAUSTED))
        assert fc.reroutes(hosted, ErrorClass.QUOTA_EXHAUSTED)
        t = await fc.acquire(claimed(2), CONFIG, hosted)
        seen.append((t.state.name, t.routed_from))
        fc.release(t, result())
        # The quota pause ends; two server errors in a row open the breaker.
        fc.states["hosted"].paused_until = 0.0
        for i in (3, 4):
            t = await fc.acquire(claimed(i), CONFIG, hosted)
            seen.append((t.state.name, t.routed_from))
            fc.release(t, result(ErrorClass.SERVER_ERROR))
        t = await fc.acquire(claimed(5), CONFIG, hosted)
        seen.append((t.state.name, t.routed_from))
        fc.release(t, result())
        assert fc.detail()["hosted"]["breaker"] == "open"
        stop.set()
        await loop
        return seen

    assert asyncio.run(main()) == [("hosted", None), ("local", "hosted"), ("hosted", None),
                                   ("hosted", None), ("local", "hosted")]


def test_without_a_fallback_calls_wait_for_the_breaker_to_half_open() -> None:
    async def main() -> bool:
        fc, _ = controller([ep("a")], breaker_consecutive=1, breaker_open_s=0.2,
                           breaker_probes=1)
        stop = asyncio.Event()
        loop = asyncio.create_task(fc.run(stop))
        primary = fc.settings.endpoint[0]
        t = await fc.acquire(claimed(1), CONFIG, primary)
        fc.release(t, result(ErrorClass.TIMEOUT))
        t0 = time.monotonic()
        probe = await asyncio.wait_for(fc.acquire(claimed(2), CONFIG, primary), 2)
        assert time.monotonic() - t0 >= 0.19 and probe.probe
        blocked = asyncio.create_task(fc.acquire(claimed(3), CONFIG, primary))
        await asyncio.sleep(0.05)
        assert not blocked.done(), "a second call passed a half-open breaker"
        fc.release(probe, result())
        await asyncio.wait_for(blocked, 1)
        stop.set()
        blocked.result().state.in_flight -= 1
        await loop
        return fc.detail()["a"]["breaker"] == "closed"

    assert asyncio.run(main())


def test_stopping_cancels_calls_still_waiting() -> None:
    async def main() -> None:
        fc, _ = controller([ep("a", max_concurrency=1, concurrency_policy="fixed")])
        stop = asyncio.Event()
        loop = asyncio.create_task(fc.run(stop))
        primary = fc.settings.endpoint[0]
        t = await fc.acquire(claimed(1), CONFIG, primary)
        waiting = asyncio.create_task(fc.acquire(claimed(2), CONFIG, primary))
        await asyncio.sleep(0.05)
        stop.set()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        fc.release(t, result())
        await asyncio.wait_for(loop, 2)
        assert fc.waiting == 0

    asyncio.run(main())


def test_routing_refuses_unknown_policies_at_config_time() -> None:
    with pytest.raises(ValueError):
        Endpoint(name="a", base_url="x", concurrency_policy="vegas")  # type: ignore[arg-type]


class Clocked:
    """A provider that notes which endpoint was called, and when."""

    def __init__(self, name: str, calls: list[tuple[str, float]]) -> None:
        self.name = name
        self.calls = calls

    async def complete(self, request: CompletionRequest) -> Completion:
        self.calls.append((self.name, time.monotonic()))
        return Completion("{}", 200, "m", 40, 5)

    async def close(self) -> None:
        pass


def _pause_after_passage(endpoints: list[dict[str, Any]], pause_ms: int
                         ) -> tuple[list[tuple[str, float]], float, str | None]:
    """One call gets passage; before it is sent, another call's 429 names ``pause_ms``
    (longer than the short hold, ``fallback_after_s`` = 0.1 s)."""
    calls: list[tuple[str, float]] = []

    async def main() -> tuple[float, str | None]:
        settings = Settings.model_validate({"endpoint": endpoints,
                                            "flow": {"fallback_after_s": 0.1}})
        fc = FlowControl(FakeFlowStore(), settings, "w1", db=db,
                         provider=lambda e: Clocked(e.name, calls))
        stop = asyncio.Event()
        loop = asyncio.create_task(fc.run(stop))
        primary = fc.settings.endpoint[0]
        other = await fc.acquire(claimed(1), CONFIG, primary)
        t0 = 0.0

        async def fn(e: Endpoint, provider: Any) -> Completion:
            nonlocal t0
            if t0 == 0.0:  # the first time through: the other call's 429 arrives now
                fc.release(other, result(ErrorClass.RATE_LIMITED, retry_after_ms=pause_ms))
                t0 = time.monotonic()
            req = CompletionRequest(messages=[{"role": "user", "content": "x"}], model="m",
                                    params={}, timeout_s=5)
            comp: Completion = await provider.complete(req)
            return comp

        _res, passage = await asyncio.wait_for(fc.call(claimed(2), CONFIG, primary, fn), 10)
        routed_from = passage.routed_from
        stop.set()
        await loop
        return t0, routed_from

    t0, routed_from = asyncio.run(main())
    return calls, t0, routed_from


def test_a_call_never_goes_out_during_a_pause_that_began_after_its_passage() -> None:
    calls, t0, routed_from = _pause_after_passage([ep("a")], 600)
    assert [name for name, _t in calls] == ["a"] and routed_from is None
    assert calls[0][1] - t0 >= 0.59, "the call was sent before the time the 429 named"


def test_a_long_pause_after_passage_sends_the_call_to_the_fallback_instead() -> None:
    calls, t0, routed_from = _pause_after_passage([ep("a", fallback="b"), ep("b")], 5000)
    assert [name for name, _t in calls] == ["b"], "the paused primary was called"
    assert routed_from == "a" and calls[0][1] - t0 < 1.0


def test_a_cold_task_type_sends_a_few_calls_until_an_answer_teaches_its_estimate() -> None:
    """The first estimate is a dear guess: reserving it for every call in flight and
    refunding it moments later would hand the shared bucket a burst. Until the first
    answer, at most COLD_CALLS calls of the type go; then the rest, at the taught size."""
    async def main() -> tuple[int, int, float, float]:
        fc, _ = controller([ep("a", rpm=600_000, tpm=6_000_000)], lease_interval_s=0.02)
        stop = asyncio.Event()
        loop = asyncio.create_task(fc.run(stop))
        primary = fc.settings.endpoint[0]
        pending = [asyncio.create_task(fc.acquire(claimed(i), CONFIG, primary))
                   for i in range(20)]
        await asyncio.sleep(0.3)
        first = [p for p in pending if p.done()]
        cold_estimate = first[0].result().tokens
        fc.release(first[0].result(), result(tokens=(40, 5)))
        await asyncio.wait_for(asyncio.gather(*pending), 5)
        warm = pending[-1].result().tokens
        for p in pending[1:]:
            fc.release(p.result(), result(tokens=(40, 5)))
        stop.set()
        await loop
        return len(first), sum(1 for p in pending if p.done()), cold_estimate, warm

    n_cold, n_all, cold_estimate, warm = asyncio.run(main())
    assert n_cold == COLD_CALLS
    assert n_all == 20
    assert warm < cold_estimate / 3, "the later calls did not reserve the taught estimate"


def test_per_task_type_caches_stay_bounded_however_many_types_pass() -> None:
    """With OpenAI-batch input every task may be a task type of its own: the token
    models, the cold-start records and the per-batch token figures keep only the most
    recently used (issue: unbounded per-config caches)."""
    from lockgate.flow.admission import COLD_KEPT
    from lockgate.flow.estimate import MODELS_KEPT
    from lockgate.flow.lanes import BATCHES_KEPT

    n = max(MODELS_KEPT, COLD_KEPT, BATCHES_KEPT) + 500

    async def main() -> tuple[int, int, int, float]:
        fc, _ = controller([ep("a", rpm=600_000_000, tpm=600_000_000)],
                           lease_interval_s=0.02)
        stop = asyncio.Event()
        loop = asyncio.create_task(fc.run(stop))
        primary = fc.settings.endpoint[0]
        for i in range(n):
            t = await fc.acquire(ClaimedTask(i, f"t{i}", f"b{i}", f"cfg{i}", "{}", 1, "tok"),
                                 CONFIG, primary)
            # Every other type never gets an answer that teaches it (a 400): it stays cold.
            fc.release(t, result() if i % 2 else result(ErrorClass.INVALID_REQUEST))
        taught = fc.admission.models.get(primary, CONFIG, f"cfg{n - 1}").samples
        stop.set()
        await loop
        return (len(fc.admission.models), len(fc.admission.cold), len(fc.lanes.tokens),
                taught)

    models, cold, batches, taught = asyncio.run(main())
    assert models <= MODELS_KEPT and cold <= COLD_KEPT and batches <= BATCHES_KEPT
    assert cold > 0 and batches > 0
    assert taught == 1, "the most recent task type was evicted"


class Hanging:
    """A provider whose calls are sent and never answered."""

    name = "hanging"

    async def complete(self, request: CompletionRequest) -> Completion:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def close(self) -> None:
        pass


def test_a_probe_cancelled_while_it_was_sent_frees_its_place_in_the_half_open_breaker() -> None:
    """A half-open breaker lets ``probes`` calls through at a time. A probe cancelled
    mid-send (its lease lost, the worker stopping a task) has no verdict on the
    endpoint; it kept its place, and once every place had leaked that way no call of
    the endpoint ever passed again: the worker's tasks waited for nothing."""
    async def main() -> bool:
        settings = Settings.model_validate({
            "endpoint": [ep("a")],
            "flow": {"breaker_consecutive": 1, "breaker_open_s": 0.1, "breaker_probes": 1}})
        fc = FlowControl(FakeFlowStore(), settings, "w1", db=db,
                         provider=lambda e: Hanging())
        stop = asyncio.Event()
        loop = asyncio.create_task(fc.run(stop))
        primary = fc.settings.endpoint[0]
        t = await fc.acquire(claimed(1), CONFIG, primary)
        fc.release(t, result(ErrorClass.TIMEOUT))  # the breaker opens
        assert fc.detail()["a"]["breaker"] == "open"

        async def fn(e: Endpoint, provider: Any) -> Completion:
            req = CompletionRequest(messages=[{"role": "user", "content": "x"}], model="m",
                                    params={}, timeout_s=5)
            comp: Completion = await provider.complete(req)
            return comp

        probe = asyncio.create_task(fc.call(claimed(2), CONFIG, primary, fn))
        await asyncio.sleep(0.3)  # half-open; the probe is sent and hangs
        assert fc.states["a"].breaker.probes_in_flight == 1
        probe.cancel()
        with pytest.raises(asyncio.CancelledError):
            await probe
        try:
            t = await asyncio.wait_for(fc.acquire(claimed(3), CONFIG, primary), 2)
        except TimeoutError:
            passed = False
        else:
            passed = t.probe
            fc.release(t, result())
        stop.set()
        await loop
        return passed

    assert asyncio.run(main()), "no call passed the half-open breaker after a probe was cancelled"


@pytest.mark.parametrize(("status", "opens"), [(401, True), (403, False), (400, True)])
def test_a_refused_key_opens_the_breaker_but_a_403_for_one_model_does_not(
        status: int, opens: bool) -> None:
    """A 401 is the endpoint's key, refused for every call, and so is a key refused in
    another 4xx (Gemini's 400 ``API_KEY_INVALID``, classified ``auth_error``); a 403
    may be one model not enabled on an endpoint that serves others, so it is the
    task's."""
    async def main() -> str:
        fc, _ = controller([ep("a")], breaker_consecutive=1)
        stop = asyncio.Event()
        loop = asyncio.create_task(fc.run(stop))
        t = await fc.acquire(claimed(1), CONFIG, fc.settings.endpoint[0])
        fc.release(t, CallOutcome(None, ProviderError(ErrorClass.AUTH_ERROR, "refused",
                                                      http_status=status), 5.0))
        stop.set()
        await loop
        return str(fc.detail()["a"]["breaker"])

    assert (asyncio.run(main()) == "open") is opens


def test_calls_refused_before_a_limit_was_known_are_not_charged_once_it_is() -> None:
    """A burst into an endpoint with no known limit: most calls come back 429 without a
    header (as gateways send them), then an answer names the limit. Only the calls the
    provider took are in its window; the refused ones were charged too, and every worker
    stayed silent for tens of seconds at a low limit (200 sent, 5 a second taken: 39 s)."""
    async def main() -> float:
        fc, _ = controller([ep("a")], lease_interval_s=0.02)
        stop = asyncio.Event()
        loop = asyncio.create_task(fc.run(stop))
        primary = fc.settings.endpoint[0]
        # A first answer naming no limit: before it, a few calls only go (cold start).
        fc.release(await fc.acquire(claimed(99), CONFIG, primary), result())
        tickets = [await fc.acquire(claimed(i), CONFIG, primary) for i in range(20)]
        for t in tickets[:15]:
            fc.release(t, result(ErrorClass.RATE_LIMITED))
        for t in tickets[15:]:
            fc.release(t, result(headers={"x-ratelimit-limit-requests": "300",
                                          "x-ratelimit-remaining-requests": "290"}))
        st = fc.states["a"]
        assert st.req_limited
        debt = st.ledger.debt_req  # what the next grant charges
        stop.set()
        await loop
        return debt

    assert asyncio.run(main()) == 6  # the 5 taken, and the first answer


def test_a_429_now_and_then_neither_pauses_nor_slows_the_endpoint() -> None:
    """1% of calls refused at random (a provider refusing now and then, no limit
    reached): each refusal paused the whole endpoint for its Retry-After and cut its
    pace, and a worker that could do 200 calls a second settled at about 12. Only the
    refused call waits now; a burst of refusals still pauses everyone."""
    async def main() -> tuple[bool, bool, bool]:
        fc, _ = controller([ep("a")], lease_interval_s=0.02)
        stop = asyncio.Event()
        loop = asyncio.create_task(fc.run(stop))
        primary = fc.settings.endpoint[0]
        # A first answer naming no limit: before it, a few calls only go (cold start).
        fc.release(await fc.acquire(claimed(999), CONFIG, primary), result())
        tickets = [await fc.acquire(claimed(i), CONFIG, primary) for i in range(60)]
        st = fc.states["a"]
        for t in tickets[:59]:
            fc.release(t, result())
        fc.release(tickets[59], result(ErrorClass.RATE_LIMITED, retry_after_ms=2000,
                                       headers={"retry-after-ms": "2000"}))
        now = time.monotonic()
        sporadic_paused, sporadic_paced = st.paused(now), st.pace is not None or \
            st.refused is not None
        burst = [await fc.acquire(claimed(100 + i), CONFIG, primary) for i in range(10)]
        for t in burst:  # 11 refusals among 70 answers: a limit, not chance
            fc.release(t, result(ErrorClass.RATE_LIMITED, retry_after_ms=2000,
                                 headers={"retry-after-ms": "2000"}))
        burst_paused = st.paused(time.monotonic())
        stop.set()
        await loop
        return sporadic_paused, sporadic_paced, burst_paused

    assert asyncio.run(main()) == (False, False, True)


@pytest.mark.parametrize("at_the_limit", [True, False])
def test_a_429_now_and_then_at_the_limit_cuts_the_rate_without_a_pause(
        at_the_limit: bool) -> None:
    """A provider that names a per-minute limit and enforces it per second refuses the
    calls that bunched up on the way, now and then, while the bucket paces at the
    limit (calls wait for its budget). Left alone, those 429s went on at 0.7-0.9 % of
    the calls with the limit configured (0.01 % when each cut the rate). Such a 429
    cuts the shared rate a small step (5 %: the rate is about right; a 10 % step cost
    four times the throughput while the rate climbed back) without pausing the
    endpoint; below the limit (no call waiting for budget) the rate is left alone."""
    async def main() -> tuple[bool, float, int]:
        fc, fake = controller([ep("a", rpm=6000)], lease_interval_s=0.02)
        stop = asyncio.Event()
        loop = asyncio.create_task(fc.run(stop))
        primary = fc.settings.endpoint[0]
        n = 60 if at_the_limit else 30
        pending = [asyncio.create_task(fc.acquire(claimed(i), CONFIG, primary))
                   for i in range(n)]
        await asyncio.sleep(0.3)  # 100 a second: about 30 granted
        while not at_the_limit and not all(p.done() for p in pending):
            await asyncio.sleep(0.02)
        granted = [p.result() for p in pending if p.done()]
        st = fc.states["a"]
        waiting = len(st.waiters)
        for t in granted[:-1]:
            fc.release(t, result(headers={"x-ratelimit-limit-requests": "6000",
                                          "x-ratelimit-remaining-requests": "5000"}))
        fc.release(granted[-1], result(
            ErrorClass.RATE_LIMITED, retry_after_ms=2000,
            headers={"retry-after-ms": "2000", "x-ratelimit-limit-requests": "6000",
                     "x-ratelimit-remaining-requests": "5000"}))
        paused = st.paused(time.monotonic())
        await asyncio.sleep(0.1)  # a few leases
        factor = fake.rows["a"][1].rate_factor
        for p in pending:
            p.cancel()
        released = {id(t) for t in granted}
        for t in await asyncio.gather(*pending, return_exceptions=True):
            if not isinstance(t, BaseException) and id(t) not in released:
                fc.release(t, result())  # granted meanwhile
        stop.set()
        await loop
        return paused, factor, waiting

    paused, factor, waiting = asyncio.run(main())
    assert not paused
    assert (waiting > 0) is at_the_limit
    assert factor == (pytest.approx(0.95, abs=0.005) if at_the_limit else 1.0)
