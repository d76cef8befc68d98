"""``SubmitReport.moved`` counts the tasks a named batch took from another: written by
this submit into the batch it names (``--batch``, ``batch_id=``) while their line named
another. A task id already in (in any batch) is skipped, not moved, and a re-submit
says so; "batch ... was not created" only of a batch that is not there after the
submit. Counted per written chunk, on the three databases, checked first or streamed.
Found by a newcomer's review; the tests of the count failed before the fix."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event
from typer.testing import CliRunner, Result

import lockgate
from lockgate.cli import app
from lockgate.store import SubmitReport

from .support import rows, task, write_jsonl

#: How submit_file is called: checked whole first, streamed, streamed with cancel (the
#: writer then reads the new ids of every chunk anyway).
MODES: dict[str, dict[str, Any]] = {
    "checked": {}, "stream": {"stream": True},
    "stream-cancel": {"stream": True, "on_bad_line": "cancel"}}


def lockgate_cli(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def said(r: Result) -> str:
    assert r.exit_code == 0, r.output
    return " ".join(r.output.split())


@pytest.fixture
def lg(db_url: str) -> Iterator[lockgate.Lockgate]:
    with lockgate.connect(db_url) as handle:
        yield handle


def line(task_id: str, batch: str | None) -> dict[str, Any]:
    return task(task_id, f"text of {task_id}",
                **({} if batch is None else {"batch_id": batch}))


def mixed(prefix: str) -> list[dict[str, Any]]:
    """The reviewer's file: lines naming alpha, none and beta."""
    return [line(f"{prefix}1", "alpha"), line(f"{prefix}2", None), line(f"{prefix}3", "beta")]


def batch_sizes(db_url: str) -> dict[str, int]:
    with lockgate.connect(db_url) as handle:
        return {b: sum(c.values()) for b, c in handle.status().batches.items()}


def reviewers_scenario(db_url: str, tmp_path: Path) -> Path:
    """mix.jsonl submitted without --batch; batch `named` made of other tasks (two of
    them taken from the batches their lines named)."""
    mix = write_jsonl(tmp_path / "mix.jsonl", mixed("a"))
    other = write_jsonl(tmp_path / "other.jsonl", mixed("b"))
    said(lockgate_cli("submit", mix, "--db", db_url))
    out = said(lockgate_cli("submit", other, "--batch", "named", "--db", db_url))
    assert "2 line(s) named another batch (batch_id); --batch named took them" in out
    return mix


# -- the reviewer's scenario: a re-submit into a named batch moves nothing ------------


@pytest.mark.parametrize("stream", [False, True], ids=["checked", "stream"])
def test_a_resubmit_into_an_existing_named_batch_says_nothing_moved(
        db_url: str, tmp_path: Path, stream: bool) -> None:
    mix = reviewers_scenario(db_url, tmp_path)
    out = said(lockgate_cli("submit", mix, "--batch", "named", "--db", db_url,
                            *(["--stream"] if stream else [])))
    assert "batch named: 0 submitted, 3 already present (skipped)" in out
    assert "took them" not in out, out
    assert ("3 task id(s) already belong to another batch (1 in batch 'alpha', 1 in "
            "batch 'beta', 1 in batch 'mix'); they were not moved") in out
    assert "was not created" not in out, out  # it was there, and still is
    assert batch_sizes(db_url) == {"alpha": 1, "beta": 1, "mix": 1, "named": 3}


def test_a_window_on_a_resubmit_into_an_existing_batch_is_said(
        db_url: str, tmp_path: Path) -> None:
    """The window's note was asked whether the batch is there after the database was
    closed: silent although the window was set on the batch."""
    mix = reviewers_scenario(db_url, tmp_path)
    out = said(lockgate_cli("submit", mix, "--batch", "named", "--window", "22:00-06:00",
                            "--db", db_url))
    assert "was not created" not in out, out
    assert "window " in out and "tasks start at its start" in out, out


@pytest.mark.parametrize("mode", MODES)
def test_the_python_api_reports_no_move_on_a_resubmit(
        db_url: str, tmp_path: Path, mode: str) -> None:
    mix = reviewers_scenario(db_url, tmp_path)
    with lockgate.connect(db_url) as lg:
        report = lg.submit_file(mix, batch_id="named", **MODES[mode])
        assert (report.inserted, report.duplicates, report.moved) == (0, 3, 0)
        again = lg.submit(mixed("a"), batch_id="named")
        assert (again.inserted, again.moved) == (0, 0)


def test_a_named_batch_left_empty_is_still_said_not_created(
        db_url: str, tmp_path: Path) -> None:
    mix = reviewers_scenario(db_url, tmp_path)
    out = said(lockgate_cli("submit", mix, "--batch", "fresh", "--db", db_url))
    assert "batch 'fresh' was not created" in out and "took them" not in out, out
    assert "fresh" not in batch_sizes(db_url)


# -- a fresh submit: the lines that named another batch are moved ----------------------


def spread(n: int, prefix: str = "t") -> tuple[list[dict[str, Any]], set[str]]:
    """``n`` lines over more than one chunk (the first holds 1,000): every third names
    alpha, every fifth (not third) the named batch itself, the rest none. Returns the
    lines and the ids of those that named another batch."""
    lines, other = [], set()
    for i in range(n):
        tid = f"{prefix}-{i:05d}"
        batch = "alpha" if i % 3 == 0 else "named" if i % 5 == 0 else None
        lines.append(line(tid, batch))
        if batch == "alpha":
            other.add(tid)
    return lines, other


@pytest.mark.parametrize("mode", MODES)
def test_a_fresh_submit_moves_exactly_the_lines_that_named_another_batch(
        lg: lockgate.Lockgate, db_url: str, tmp_path: Path, mode: str) -> None:
    lines, other = spread(1500)
    path = write_jsonl(tmp_path / "fresh.jsonl", lines)
    report = lg.submit_file(path, batch_id="named", **MODES[mode])
    assert (report.inserted, report.moved, report.batches) == (1500, len(other), ("named",))
    assert batch_sizes(db_url) == {"named": 1500}


def test_lg_submit_moves_exactly_the_tasks_that_named_another_batch(
        lg: lockgate.Lockgate) -> None:
    lines, other = spread(1200, prefix="m")
    report = lg.submit(lines, batch_id="named")
    assert (report.inserted, report.moved) == (1200, len(other))
    # without a batch named, nothing is moved: each line keeps its own
    plain = lg.submit(spread(30, prefix="p")[0])
    assert plain.moved == 0 and set(plain.batches) == {"default", "alpha", "named"}


def test_the_cli_says_how_many_lines_a_fresh_named_submit_took(
        db_url: str, tmp_path: Path) -> None:
    lines, other = spread(40)
    path = write_jsonl(tmp_path / "fresh.jsonl", lines)
    out = said(lockgate_cli("submit", path, "--batch", "named", "--db", db_url))
    assert (f"{len(other)} line(s) named another batch (batch_id); --batch named took "
            "them") in out


# -- a mixed re-submit: only the new ids that named another batch are moved ------------


@pytest.mark.parametrize("mode", MODES)
def test_a_mixed_resubmit_moves_only_the_new_tasks(
        lg: lockgate.Lockgate, db_url: str, tmp_path: Path, mode: str) -> None:
    lines, other = spread(1500)
    # Lines 0-699 are in already: 0-349 in the lines' own batches, 350-699 in `named`.
    lg.submit_file(write_jsonl(tmp_path / "first.jsonl", lines[:350]))
    lg.submit_file(write_jsonl(tmp_path / "second.jsonl", lines[350:700]),
                   batch_id="named")
    before = batch_sizes(db_url)
    path = write_jsonl(tmp_path / "all.jsonl", lines)
    report: SubmitReport = lg.submit_file(path, batch_id="named", **MODES[mode])
    new = {t["task_id"] for t in lines[700:]}
    assert (report.inserted, report.duplicates) == (800, 700)
    assert report.moved == len(other & new)
    after = batch_sizes(db_url)
    assert after["named"] == before["named"] + 800
    # a task met again is not moved: it stays where it was
    assert rows(lg.store, "SELECT batch_id FROM task WHERE task_id = 't-00000'") == [
        {"batch_id": "alpha"}]


def test_a_repeated_id_in_a_named_submit_is_moved_once(
        lg: lockgate.Lockgate, tmp_path: Path) -> None:
    same = line("r-1", "alpha")
    path = write_jsonl(tmp_path / "twice.jsonl", [same, same, line("r-2", None)])
    report = lg.submit_file(path, batch_id="named")
    assert (report.inserted, report.duplicates, report.moved) == (2, 1, 1)


# -- the count costs no query when no line named another batch -------------------------


def test_no_line_naming_another_batch_reads_no_ids_while_writing(
        lg: lockgate.Lockgate, tmp_path: Path) -> None:
    reads: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT TASK_ID, BATCH_ID FROM TASK"):
            reads.append(statement)

    event.listen(lg.store.engine, "before_cursor_execute", seen)
    try:
        plain = [line(f"q-{i:05d}", None if i % 2 else "named") for i in range(1500)]
        report = lg.submit_file(write_jsonl(tmp_path / "plain.jsonl", plain),
                                batch_id="named", stream=True)
        assert (report.inserted, report.moved, reads) == (1500, 0, [])
        some = [line(f"s-{i:05d}", "alpha" if i == 1200 else None) for i in range(1500)]
        report = lg.submit_file(write_jsonl(tmp_path / "some.jsonl", some),
                                batch_id="named", stream=True)
        assert (report.inserted, report.moved) == (1500, 1)
        assert len(reads) == 1, "only the chunk holding that line reads its new ids"
    finally:
        event.remove(lg.store.engine, "before_cursor_execute", seen)
