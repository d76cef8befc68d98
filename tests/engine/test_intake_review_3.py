"""Task intake on a database, as a third review found it: a ``--rejects`` file that is
the task file or the SQLite database (both were emptied before anything was read), a
rejects file emptied when nothing was rejected, ``--skip-invalid`` on a pipe, a batch
named after a pipe's descriptor, two lines with one task id, and metadata larger than
the database takes (MariaDB: the submit failed as "cannot reach the database" at every
run). Each test failed before its fix."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner, Result

from lockgate import Lockgate
from lockgate.cli import app
from lockgate.errors import SpecError
from lockgate.store import Store

from .support import one_error, pipe_file, status_counts, task, tasks, write_jsonl


def lockgate(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'lockgate.db'}"


def _counts(url: str) -> dict[str, int]:
    store = Store(url)
    try:
        store.migrate()  # a command refused before it opened the database made none
        return status_counts(store)
    finally:
        store.close()


# -- --rejects never destroys the task file or the database ------------------------------


@pytest.mark.parametrize("command", ["submit", "run"])
@pytest.mark.parametrize("skip", [True, False])
def test_rejects_naming_the_task_file_is_refused_and_the_file_kept(
        tmp_path: Path, sqlite_url: str, command: str, skip: bool) -> None:
    """`submit rr.jsonl --skip-invalid --rejects rr.jsonl` emptied rr.jsonl, then said
    `0 submitted`, exit 0 (without --skip-invalid too)."""
    path = write_jsonl(tmp_path / "rr.jsonl", [*tasks(2), "{bad"])
    before = path.read_bytes()
    link = tmp_path / "link.jsonl"
    link.symlink_to(path)
    for rejects in (path, link, Path(os.path.relpath(path))):
        error = one_error(lockgate(command, path, "--db", sqlite_url, "--rejects", rejects,
                                   *(["--skip-invalid"] if skip else [])))
        assert error.startswith(f"error: --rejects {rejects} is the task file"), error
        assert "--rejects rr.rejects.jsonl" in error
        assert path.read_bytes() == before
    assert _counts(sqlite_url) == {}


def test_rejects_naming_the_sqlite_database_is_refused_and_the_database_kept(
        tmp_path: Path, sqlite_url: str) -> None:
    """`--rejects lockgate.db` truncated the database, then a traceback."""
    first = write_jsonl(tmp_path / "a.jsonl", tasks(2))
    assert lockgate("submit", first, "--db", sqlite_url).exit_code == 0
    db = tmp_path / "lockgate.db"
    target = db
    size = target.stat().st_size
    second = write_jsonl(tmp_path / "b.jsonl", [*tasks(2, prefix="b"), "{bad"])
    for command in ("submit", "run"):
        error = one_error(lockgate(command, second, "--db", sqlite_url, "--skip-invalid",
                                   "--rejects", target))
        assert "is the SQLite database's file" in error and "--rejects" in error, error
    assert target.stat().st_size == size
    assert _counts(sqlite_url) == {"PENDING": 2}
    with Lockgate(sqlite_url) as lg, pytest.raises(Exception, match="SQLite database"):
        lg.submit_file(second, skip_invalid=True, rejects=str(db))
    assert _counts(sqlite_url) == {"PENDING": 2}


def test_a_rejects_file_is_left_alone_when_no_line_is_rejected(
        tmp_path: Path, sqlite_url: str) -> None:
    """`--rejects keep.txt` emptied keep.txt although no line was bad."""
    keep = tmp_path / "keep.txt"
    keep.write_text("keep\n")
    good = write_jsonl(tmp_path / "good.jsonl", tasks(2))
    for extra in ([], ["--skip-invalid"]):
        result = lockgate("submit", good, "--db", sqlite_url, "--rejects", keep, *extra)
        assert result.exit_code == 0, result.output
        assert "rejected lines written" not in result.output
        assert keep.read_text() == "keep\n"
    assert not (tmp_path / "good.rejects.jsonl").exists()
    # a bad line: the file is written then (and said)
    bad = write_jsonl(tmp_path / "bad.jsonl", [*tasks(1, prefix="x"), "{bad"])
    result = lockgate("submit", bad, "--db", sqlite_url, "--rejects", keep, "--skip-invalid")
    assert result.exit_code == 0, result.output
    assert f"rejected lines written to {keep}" in result.output
    [reject] = [orjson.loads(x) for x in keep.read_text().splitlines()]
    assert reject["line"] == 2 and reject["raw"] == "{bad"
    # streamed, too
    keep.write_text("keep\n")
    result = lockgate("submit", good, "--db", sqlite_url, "--rejects", keep, "--stream",
                      "--skip-invalid")
    assert result.exit_code == 0, result.output
    assert keep.read_text() == "keep\n"


def test_a_rejects_file_in_a_missing_folder_is_refused_before_anything_is_read(
        tmp_path: Path, sqlite_url: str) -> None:
    path = write_jsonl(tmp_path / "t.jsonl", tasks(2))
    error = one_error(lockgate("submit", path, "--db", sqlite_url, "--skip-invalid",
                               "--rejects", tmp_path / "nowhere" / "r.jsonl"))
    assert error.endswith("r.jsonl: No such file or directory"), error
    error = one_error(lockgate("submit", path, "--db", sqlite_url, "--rejects", tmp_path))
    assert error == f"error: cannot write {tmp_path}: Is a directory"
    assert _counts(sqlite_url) == {}


# -- a pipe: --skip-invalid needs --rejects, and the batch needs a name ---------------------


def _lines(n: int, prefix: str = "p") -> bytes:
    return b"".join(orjson.dumps(t) + b"\n" for t in tasks(n, prefix=prefix))


@pytest.mark.parametrize("command", ["submit", "run"])
def test_skip_invalid_on_a_pipe_asks_for_rejects(sqlite_url: str, command: str) -> None:
    """It said `cannot write /dev/fd/63.rejects.jsonl: No such file or directory`, and
    `/dev/stdin` wrote /dev/stdin.rejects.jsonl into /dev."""
    with pipe_file(_lines(2) + b"{bad\n") as path:
        error = one_error(lockgate(command, path, "--batch", "p", "--skip-invalid",
                                   "--db", sqlite_url))
    assert f"--skip-invalid on {path} (a pipe or a device) needs --rejects FILE" in error
    assert _counts(sqlite_url) == {}


def test_skip_invalid_on_a_pipe_with_rejects_works(tmp_path: Path, sqlite_url: str) -> None:
    rejects = tmp_path / "r.jsonl"
    with pipe_file(_lines(2) + b"{bad\n") as path:
        result = lockgate("submit", path, "--batch", "p", "--skip-invalid", "--rejects",
                          rejects, "--db", sqlite_url)
    assert result.exit_code == 0, result.output
    assert "batch p: 2 submitted" in result.output
    assert [orjson.loads(x)["line"] for x in rejects.read_text().splitlines()] == [3]


@pytest.mark.parametrize("command", ["submit", "run"])
def test_a_pipe_without_batch_is_refused_naming_batch(sqlite_url: str,
                                                      command: str) -> None:
    """`submit <(...)` named the batch `63`, after the descriptor."""
    with pipe_file(_lines(1)) as path:
        error = one_error(lockgate(command, path, "--db", sqlite_url))
    assert error == (f"error: {path} is a pipe or a device, whose name makes no batch id; "
                     "name the batch with --batch NAME")
    assert one_error(lockgate("submit", "/dev/stdin", "--db", sqlite_url)).startswith(
        "error: /dev/stdin is a pipe or a device")
    assert _counts(sqlite_url) == {}


# -- two lines of one file with the same task id ------------------------------------------


def test_two_lines_with_one_task_id_are_refused_naming_both(
        tmp_path: Path, db_url: str, store: Store) -> None:
    """The second was dropped: `1 submitted, 1 already present (skipped)`, exit 0."""
    path = write_jsonl(tmp_path / "dup.jsonl", [task("t30"), task("t31"),
                                                 task("t30", "DIFFERENT")])
    error = lockgate("submit", path, "--db", db_url)
    assert error.exit_code == 2, error.output
    assert "line 3, field 'task_id': 't30' is also the task_id of line 1" in error.output
    assert status_counts(store) == {}
    with Lockgate(db_url, migrate=False) as lg:
        with pytest.raises(SpecError, match="is also the task_id of line 1"):
            lg.submit([task("a"), task("a", "other")])
        assert status_counts(store) == {}
        lg.submit([task("a"), task("a")])  # the same task twice: one task
        assert status_counts(store) == {"PENDING": 1}
    result = lockgate("submit", path, "--db", db_url, "--skip-invalid")
    assert result.exit_code == 0, result.output
    assert "2 submitted" in result.output
    rejects = [orjson.loads(x) for x in (tmp_path / "dup.rejects.jsonl").read_text()
               .splitlines()]
    assert [r["line"] for r in rejects] == [3] and "line 1" in rejects[0]["error"]
    assert status_counts(store) == {"PENDING": 3}


def test_a_streamed_submit_stops_at_the_second_line_with_the_id(
        tmp_path: Path, sqlite_url: str) -> None:
    path = write_jsonl(tmp_path / "dup.jsonl", [task("a"), task("a", "other")])
    error = one_error(lockgate("submit", path, "--stream", "--db", sqlite_url))
    assert "line 2, field 'task_id': 'a' is also the task_id of line 1" in error, error
    assert _counts(sqlite_url) == {"PENDING": 1}


# -- metadata is bounded as the input is ------------------------------------------------------


def test_metadata_larger_than_the_database_takes_is_refused_before_the_insert(
        tmp_path: Path, db_url: str, store: Store) -> None:
    """MariaDB: 20 MB of metadata (the input was bounded, the metadata not) failed as
    `cannot reach the database ... MySQL server has gone away`, at every run."""
    limit = store.max_input_bytes()
    big = task("big", metadata={"blob": "x" * limit})
    path = write_jsonl(tmp_path / "bm.jsonl", [task("small"), big])
    result = lockgate("submit", path, "--db", db_url)
    assert result.exit_code == 2, result.output
    assert f"line 2, field 'metadata': is {limit + 11:,} bytes as JSON; this database " \
           f"takes at most {limit:,} per field of a task" in result.output, result.output
    assert "cannot reach" not in result.output
    assert status_counts(store) == {}
    with Lockgate(db_url, migrate=False) as lg, pytest.raises(SpecError, match="metadata"):
        lg.submit([task("small"), big])
    assert status_counts(store) == {}
