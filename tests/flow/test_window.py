"""Windows: clock specs, cron, the pace, projections and feasibility."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from lockgate.errors import SpecError
from lockgate.flow.window import (
    BatchPlan,
    Window,
    capacity_per_s,
    clock_window,
    next_cron,
    paced_rate,
    parse_when,
    plan_from_options,
    project,
)

TZ = timezone(timedelta(hours=8))


def at(h: int, m: int = 0, day: int = 10) -> datetime:
    return datetime(2026, 3, day, h, m, tzinfo=TZ)


def test_clock_window_today_tomorrow_and_in_progress() -> None:
    assert clock_window("02:00-03:30", at(1)) == (at(2), at(3, 30))
    assert clock_window("02:00-03:30", at(2, 45)) == (at(2), at(3, 30))  # in progress
    assert clock_window("02:00-03:30", at(4)) == (at(2, day=11), at(3, 30, day=11))
    assert clock_window("23:00-01:00", at(23, 30)) == (at(23), at(1, day=11))
    assert clock_window("23:00-01:00", at(0, 30, day=11)) == (at(23), at(1, day=11))


@pytest.mark.parametrize("bad", ["2-3", "25:00-26:00", "02:00-02:00", "02:61-03:00"])
def test_bad_clock_windows_are_refused(bad: str) -> None:
    with pytest.raises(SpecError) as err:
        clock_window(bad, at(1))
    assert err.value.field == "window"


def test_a_deadline_is_a_time_or_a_duration_from_now() -> None:
    assert parse_when("2026-03-10T05:00", at(1)) == at(5)
    assert parse_when("+90m", at(1)) == at(2, 30)
    assert parse_when("1.5h", at(1)) == at(2, 30)  # the + is optional
    assert parse_when("1d", at(1)) == at(1, day=11)
    with pytest.raises(SpecError, match="neither a time") as err:
        parse_when("soon", at(1))
    assert err.value.field == "deadline"


def test_cron() -> None:
    assert next_cron("0 2 * * *", at(1)) == at(2)
    assert next_cron("0 2 * * *", at(2)) == at(2, day=11)
    assert next_cron("*/15 * * * *", at(2, 7)) == at(2, 15)
    assert next_cron("30 1-3 * * *", at(3, 31)) == at(1, 30, day=11)
    # 2026-03-10 is a Tuesday; 6 = Saturday, 0 and 7 = Sunday
    assert next_cron("0 9 * * 6", at(10)) == at(9, day=14)
    assert next_cron("0 9 * * 7", at(10)) == at(9, day=15)
    assert next_cron("0 0 1 * *", at(10)) == datetime(2026, 4, 1, 0, 0, tzinfo=TZ)
    with pytest.raises(SpecError, match="five fields"):
        next_cron("0 2 * *", at(1))
    with pytest.raises(SpecError, match="outside 0-59"):
        next_cron("61 2 * * *", at(1))


def test_pace_is_remaining_over_time_left_minus_margin() -> None:
    w = Window(0, 120_000)  # margin 3%: 3.6 s
    assert paced_rate(w, 10_000, -1) is None  # not open yet
    assert paced_rate(w, 10_000, 0) == pytest.approx(10_000 / 116.4)
    assert paced_rate(w, 5_000, 60_000) == pytest.approx(5_000 / 56.4)  # behind: faster
    assert paced_rate(w, 0, 60_000) == 0.0
    assert math.isinf(paced_rate(w, 10, 117_000) or 0.0)  # late: as fast as allowed


def test_projection_and_feasibility() -> None:
    w = Window(0, 100_000)
    p = project(w, 1000, 20.0, 50_000, capacity_per_s=30.0)
    assert p.finish_ms == 100_000 and p.on_time and p.feasible and p.warning() is None
    late = project(w, 1000, 10.0, 50_000, capacity_per_s=30.0)
    assert late.on_time is False and "behind" in (late.warning() or "")
    bad = project(w, 1000, 10.0, 50_000, capacity_per_s=15.0)
    assert not bad.feasible and "infeasible" in (bad.warning() or "")
    assert project(w, 0, 0.0, 50_000, None).on_time


def test_capacity_from_limits() -> None:
    # The bucket's refill: the limit less its cap (1% of the window) per window.
    assert capacity_per_s(60_000, None, 60_000, 500) == pytest.approx(990)
    assert capacity_per_s(60_000, 300_000, 60_000, 500) == pytest.approx(9.9)
    assert capacity_per_s(None, None, 60_000, 500) is None


def test_batch_plan_fields() -> None:
    plan = BatchPlan(base_weight=10, window=Window(1000, 5000))
    assert plan.fields() == {"base_weight": 10.0, "window_start": 1000, "window_end": 5000,
                             "target_per_s": None, "deadline_at": 5000}
    with pytest.raises(SpecError):
        BatchPlan(window=Window(5000, 1000)).fields()
    with pytest.raises(SpecError) as err:
        BatchPlan(base_weight=0).fields()
    assert err.value.field == "weight"


def test_a_target_is_the_least_pace_while_the_window_is_open() -> None:
    # --target was stored and shown, never used: 600 tasks with --target 20 in a 2 min
    # window ran at 5/s and finished at the window's end.
    w = Window(0, 120_000, target_per_s=20.0)
    assert paced_rate(w, 600, 0) == 20.0  # the target, above the 600 / 116.4 s needed
    assert paced_rate(w, 5_000, 60_000) == pytest.approx(5_000 / 56.4)  # behind: faster
    assert paced_rate(w, 0, 1_000) == 0.0
    assert paced_rate(w, 600, -1) is None


@pytest.mark.parametrize("expr", ["0 2 30 2 *", "0 2 31 4 *"])
def test_a_cron_expression_that_never_fires_is_refused(expr: str) -> None:
    # It searched until the year could not be held, then raised OverflowError (a
    # traceback of the command line).
    with pytest.raises(SpecError, match="never fires") as err:
        next_cron(expr, at(1))
    assert err.value.field == "cron"


@pytest.mark.parametrize(("kw", "field"), [
    ({"weight": math.nan}, "weight"), ({"weight": math.inf}, "weight"),
    ({"window": "02:00-03:00", "target": -5.0}, "target"),
    ({"window": "02:00-03:00", "target": math.nan}, "target"),
    ({"window": "02:00-03:00", "target": math.inf}, "target"),
])
def test_weights_and_targets_are_finite_positive_numbers(kw: dict[str, Any],
                                                         field: str) -> None:
    with pytest.raises(SpecError) as err:
        plan_from_options(now=at(1), **kw)
    assert err.value.field == field
    with pytest.raises(SpecError):
        BatchPlan(base_weight=math.nan).fields()


@pytest.fixture
def berlin(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process's local time zone is Europe/Berlin (summer time from 2026-03-29
    02:00, back on 2026-10-25 03:00)."""
    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize("day", [datetime(2026, 3, 28, 23, 30), datetime(2026, 10, 24, 23, 30)])
def test_local_windows_and_deadlines_keep_their_wall_time_across_summer_time(
        berlin: None, day: datetime) -> None:
    # `lockgate submit` placed tomorrow's 04:00-05:00 with today's fixed offset: an
    # hour off when summer time began or ended overnight.
    plan = plan_from_options(window="04:00-05:00", deadline="2026-03-29T12:00", now=day)
    assert plan is not None and plan.window is not None and plan.deadline_ms is not None
    local = [datetime.fromtimestamp(ms / 1000) for ms in (
        plan.window.start_ms, plan.window.end_ms, plan.deadline_ms)]
    assert [(t.hour, t.minute) for t in local] == [(4, 0), (5, 0), (12, 0)]
    # a duration from now is elapsed time: 2 h after 01:30 on the day the clocks go on
    later = plan_from_options(deadline="+2h", now=datetime(2026, 3, 29, 1, 30))
    assert later is not None and later.deadline_ms is not None
    assert later.deadline_ms / 1000 - datetime(2026, 3, 29, 1, 30).timestamp() == 7200
