"""The compact store of a submit's task ids (lockgate.taskids) decides exactly as a
plain dict of every id would: the same id with another task refused naming its first
line, the same task repeated passing, however the ids are spread over the recent dict,
the frozen runs, their merges and the Bloom filter."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lockgate import taskids
from lockgate.errors import SpecError
from lockgate.store.types import ConfigRow, NewTask
from lockgate.taskids import TaskIds

CONFIGS = [ConfigRow(f"h{i}", "{}") for i in range(2)]


def row(tid: str, text: str = "x", config: int = 0, batch: str | None = None,
        priority: int = 0) -> NewTask:
    return NewTask(tid, batch, CONFIGS[config], f'{{"text": "{text}"}}', "{}", priority,
                   None)


class Small(TaskIds):
    """Freezes at 5 ids, then every 3, and caps runs at 12: every path taken by a few
    dozen ids."""

    FIRST = 5
    CHUNK = 3
    RUN_CAP = 12


def reference(rows: list[NewTask], lines: list[int] | None = None) -> list[int | None]:
    """Per row: the first line of its id when refused, else None (a plain dict)."""
    seen: dict[str, tuple[int, NewTask]] = {}
    out: list[int | None] = []
    for n, r in zip(lines or range(1, len(rows) + 1), rows, strict=True):
        first = seen.get(r.task_id)
        if first is None:
            seen[r.task_id] = (n, r)
            out.append(None)
        else:
            same = first[1]._replace(task_id="") == r._replace(task_id="")
            out.append(None if same else first[0])
    return out


def outcomes(ids: TaskIds, rows: list[NewTask],
             lines: list[int] | None = None) -> list[int | None]:
    out: list[int | None] = []
    for n, r in zip(lines or range(1, len(rows) + 1), rows, strict=True):
        try:
            ids.check(r, n)
        except SpecError as exc:
            assert exc.line == n and exc.field == "task_id"
            first = int(str(exc).split("of line ")[1].split(",")[0])
            out.append(first)
        else:
            out.append(None)
    return out


rows_strategy = st.lists(
    st.builds(row, st.sampled_from([f"id{i}" for i in range(40)] + ["", "é", "a" * 60]),
              st.sampled_from(["x", "y"]), st.integers(0, 1),
              st.sampled_from([None, "b"]), st.integers(0, 1)),
    max_size=300)


@settings(max_examples=300, deadline=None)
@given(rows_strategy)
def test_decides_as_a_dict_of_every_id(rows: list[NewTask]) -> None:
    assert outcomes(Small(), rows) == reference(rows)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 10_000), min_size=1, max_size=400),
       st.integers(0, 399), st.booleans())
def test_a_repeat_long_after_its_first_line_is_found(
        numbers: list[int], pick: int, same: bool) -> None:
    """Distinct ids (most frozen and merged by the time the repeat comes), then one of
    them again, as it was or with another task."""
    distinct = list(dict.fromkeys(numbers))
    rows = [row(f"task-{n}") for n in distinct]
    first = pick % len(rows)
    rows.append(row(rows[first].task_id, "x" if same else "other"))
    got = outcomes(Small(), rows)
    assert got[:-1] == [None] * (len(rows) - 1)
    assert got[-1] == (None if same else first + 1)


@settings(max_examples=150, deadline=None)
@given(rows_strategy)
def test_ids_whose_first_hashes_collide_are_told_apart(rows: list[NewTask]) -> None:
    """Every id's first hash one of three values: the second hash tells them apart."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(taskids, "_hash1", lambda s: hash(s) % 3 - 1)
        assert outcomes(Small(), rows) == reference(rows)


@settings(max_examples=100, deadline=None)
@given(rows_strategy.flatmap(lambda rows: st.tuples(
    st.just(rows), st.lists(st.integers(-2**40, 2**40), min_size=len(rows),
                            max_size=len(rows)))))
def test_any_line_numbers_are_kept_as_given(case: tuple[list[NewTask], list[int]]) -> None:
    """Lines out of order, negative or past 2**32 (a caller's own numbering)."""
    rows, lines = case
    assert outcomes(Small(), rows, lines) == reference(rows, lines)


def test_the_real_sizes_keep_every_id_once() -> None:
    """Past the first freeze and three chunks (numpy's runs and filter in use): every
    id counted once, a repeat of the first line found 180,000 lines later, the same
    task repeated passing."""
    ids = TaskIds()
    total = TaskIds.FIRST + 3 * TaskIds.CHUNK + 17
    for n in range(1, total + 1):
        ids.check(row(f"t{n}"), n)
    assert len(ids) == total
    ids.check(row("t1"), total + 1)  # the same task: passes, not counted again
    assert len(ids) == total
    with pytest.raises(SpecError, match="'t1' is also the task_id of line 1, with"):
        ids.check(row("t1", "other"), total + 2)
    with pytest.raises(SpecError, match=f"'t{total}' is also the task_id of line {total}"):
        ids.check(row(f"t{total}", config=1), total + 3)
