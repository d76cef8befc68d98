"""SLA weights and the weighted fair share of claims, measured in tokens."""

from __future__ import annotations

from collections import Counter

import pytest

from lockgate.flow.priority import MIN_HEALTH, Demand, FairShare, urgency, weight

H = 3_600_000


def test_urgency_rises_as_the_deadline_nears() -> None:
    assert urgency(None, 0) == 0.0
    assert urgency(2 * H, 0, horizon_ms=H) == 0.0
    assert urgency(H, 0, horizon_ms=H) == 0.0
    assert urgency(H // 2, 0, horizon_ms=H) == pytest.approx(1.0)
    assert urgency(H // 4, 0, horizon_ms=H) == pytest.approx(3.0)
    assert urgency(1, 0, horizon_ms=H, max_urgency=9) == 9
    assert urgency(-5, 0, max_urgency=9) == 9  # overdue


def test_weight_formula() -> None:
    assert weight(10, 0, 0) == 10
    assert weight(10, 1.0, 0.2) == pytest.approx(10 * 2 * 0.8)
    assert weight(3, 0, 1.0) == pytest.approx(3 * MIN_HEALTH)  # slowed, never parked


def run(fs: FairShare, lanes: list[Demand], rounds: int, room: int,
        available: dict[str, int] | None = None) -> Counter[str]:
    got: Counter[str] = Counter()
    left = dict(available or {})
    for _ in range(rounds):
        plan = fs.plan(room, lanes)
        assert sum(plan.values()) <= room
        real = {}
        for k, n in plan.items():
            have = left.get(str(k), 10**9)
            real[k] = min(n, have)
            left[str(k)] = have - real[k]
            got[str(k)] += real[k]
        fs.settle(lanes, plan, real)
    return got


def test_shares_follow_weights() -> None:
    lanes = [Demand("a", 10, 100), Demand("b", 3, 100)]
    got = run(FairShare(), lanes, 200, 13)
    assert got["a"] / got["b"] == pytest.approx(10 / 3, rel=0.05)
    assert sum(got.values()) == 200 * 13  # work-conserving


def test_shares_are_in_tokens_not_tasks() -> None:
    # Equal weights; b's tasks cost four times as many tokens: b gets a quarter of the tasks.
    lanes = [Demand("a", 1, 100), Demand("b", 1, 400)]
    got = run(FairShare(), lanes, 400, 10)
    tokens_a, tokens_b = got["a"] * 100, got["b"] * 400
    assert tokens_a / tokens_b == pytest.approx(1.0, rel=0.05)


def test_a_light_batch_is_never_starved_even_one_task_at_a_time() -> None:
    lanes = [Demand("heavy", 100, 50), Demand("light", 1, 50)]
    got = run(FairShare(), lanes, 1000, 1)
    assert got["light"] >= 8  # about 1 in 101 rounds


def test_an_empty_lane_banks_no_credit() -> None:
    fs = FairShare()
    lanes = [Demand("a", 1, 100), Demand("b", 1, 100)]
    # b has nothing for 50 rounds, then 1000 tasks appear.
    run(fs, lanes, 50, 10, available={"b": 0})
    got = run(fs, lanes, 10, 10)
    assert got["b"] <= 60, "b must not burst on credit earned while it was empty"
    assert got["a"] >= 40


def test_caps_limit_a_paced_lane_and_the_rest_goes_elsewhere() -> None:
    lanes = [Demand("paced", 10, 100, cap=2), Demand("other", 1, 100)]
    plan = FairShare().plan(20, lanes)
    assert plan == {"paced": 2, "other": 18}
    assert FairShare().plan(5, [Demand("x", 1, 1, cap=0)]) == {}
    assert FairShare().plan(5, [Demand("x", 1, 1)]) == {"x": 5}
    assert FairShare().plan(5, [Demand("x", 1, 1, cap=3)]) == {"x": 3}


def test_forget_drops_state_of_gone_lanes() -> None:
    fs = FairShare()
    run(fs, [Demand("a", 1, 1), Demand("b", 1, 1)], 3, 4)
    fs.forget({"a"})
    assert set(fs._deficit) == {"a"}
