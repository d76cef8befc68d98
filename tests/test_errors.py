"""How a duty that keeps failing reports it (:class:`lockgate.errors.Streak`): the first
three failures in a row and every tenth at WARNING, the others at DEBUG, counting anew
after a success. Before, a worker's lease renewals, budget grants, lane discovery,
reports and gate steps each logged a WARNING at every failure: one process wrote 121
lines in a 30 s database outage."""

from __future__ import annotations

import logging

from hypothesis import given
from hypothesis import strategies as st

from lockgate.errors import Streak


@given(outcomes=st.lists(st.booleans(), max_size=200))
def test_warnings_are_the_first_three_and_every_tenth_of_a_run(outcomes: list[bool]) -> None:
    streak = Streak()
    run = 0
    for ok in outcomes:
        if ok:
            streak.ok()
            run = 0
            continue
        run += 1
        level = streak.failed()
        assert streak.failures == run
        assert level == (logging.WARNING if run <= 3 or run % 10 == 0 else logging.DEBUG)


def test_a_thirty_second_outage_polled_ten_times_a_second_warns_33_times_not_300() -> None:
    streak = Streak()
    levels = [streak.failed() for _ in range(300)]
    assert levels.count(logging.WARNING) == 3 + 30  # 1-3, then 10, 20, ..., 300
