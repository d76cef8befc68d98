"""The ``lockgate`` command line: run, status, tasks show/retry/cancel, cleanup, errors."""

from __future__ import annotations

import re
import time
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner, Result

from lockgate.cli import app
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store

from .support import (
    BackgroundWorker,
    attempts_of,
    expected_label,
    rows,
    run_worker,
    scalar,
    status_counts,
    task,
    task_row,
    tasks,
    text_for,
    wait_for,
    write_jsonl,
)


def lockgate(*args: str | Path) -> Result:
    """Run the ``lockgate`` command in this process."""
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def flat(text: str) -> str:
    return " ".join(text.split())


def test_run_submits_and_works_a_file_to_the_end(db_url: str, store: Store,
                                                 simulator: SimulatorProcess,
                                                 tmp_path: Path) -> None:
    n = 60
    path = write_jsonl(tmp_path / "tickets.jsonl", tasks(n))
    result = lockgate("run", path, "--db", db_url, "--concurrency", "16")
    assert result.exit_code == 0, result.output
    assert status_counts(store) == {"SUCCEEDED": n}
    summary = flat(result.stdout)
    assert "batch tickets" in summary
    assert re.search(rf"tasks SUCCEEDED\W+{n}\b", summary), summary
    assert re.search(rf"calls made\W+{n}\b", summary), summary
    assert re.search(r"duplicate calls \(discarded write-backs\)\W+0\b", summary), summary
    for r in rows(store, "SELECT input_data, result FROM task"):
        text = orjson.loads(r["input_data"])["text"]
        assert orjson.loads(r["result"]) == {"label": expected_label(text)}
    assert simulator.stats()["requests"] == n

    again = lockgate("run", path, "--db", db_url)
    assert again.exit_code == 0, again.output
    assert f"0 submitted, {n} already present" in flat(again.stderr)
    assert simulator.stats()["requests"] == n, "a finished batch is not run again"
    # nothing ran: no throughput (it was the earlier run's tasks over this run's time)
    assert re.search(r"throughput\W+- ", flat(again.stdout) + " "), again.stdout


def test_run_prints_progress_lines_when_its_output_is_not_a_terminal(
        db_url: str, simulator: SimulatorProcess, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Into a log file the progress bar was drawn once, at the end: two minutes of work
    showed nothing. A line every ``PLAIN_PROGRESS_S`` now says how far it got."""
    monkeypatch.setattr("lockgate.cli.queue.PLAIN_PROGRESS_S", 0.2)
    simulator.configure(latency={"kind": "fixed", "mean_ms": 50})
    path = write_jsonl(tmp_path / "slow.jsonl", tasks(40))
    result = lockgate("run", path, "--db", db_url, "--concurrency", "2")
    assert result.exit_code == 0, result.output
    seen = [int(m.group(1)) for m in re.finditer(r"batch slow: (\d+)/40 finished \(\d+%\), "
                                                 r"\d+ tasks/s", result.stderr)]
    assert len(seen) >= 2 and seen == sorted(seen), result.stderr


def test_run_follows_the_batches_its_lines_name(db_url: str, store: Store,
                                              simulator: SimulatorProcess,
                                              tmp_path: Path) -> None:
    lines = [{**t, "batch_id": "named-a" if i % 3 else "named-b"}
             for i, t in enumerate(tasks(30))]
    path = write_jsonl(tmp_path / "file-name.jsonl", lines)
    result = lockgate("run", path, "--db", db_url, "--concurrency", "8")
    assert result.exit_code == 0, result.output
    summary = flat(result.stdout)
    # Not the file's name (a batch left empty): the two batches the tasks are in.
    assert "batch file-name" not in summary
    assert re.search(r"batch named-a .*?tasks SUCCEEDED\W+20\b", summary), summary
    assert re.search(r"batch named-b .*?tasks SUCCEEDED\W+10\b", summary), summary
    assert status_counts(store) == {"SUCCEEDED": 30}


def test_status_shows_counts_leases_in_flight_and_live_workers(
        db_url: str, store: Store, simulator: SimulatorProcess) -> None:
    store.submit([parse_task(t) for t in tasks(8)], batch_id="b")
    store.submit([parse_task(t) for t in tasks(2, prefix="other")], batch_id="c")
    simulator.configure(latency={"kind": "fixed", "mean_ms": 10_000})
    with BackgroundWorker(store, concurrency=3, shutdown_grace_s=0.2) as bg:
        wait_for(lambda: simulator.stats()["in_flight"] >= 3, "calls in flight")
        result = lockgate("status", "--db", db_url)
        assert result.exit_code == 0, result.output
        table = flat(result.stdout)
        assert re.search(r"│ b │ 8 │ 0 │ 0 │ 0 │ 0 │", table), table
        assert re.search(r"│ c │ 2 │ 0 │ 0 │ 0 │ 0 │", table), table
        assert "REVIEW" not in table  # the column shows only where a task is held
        assert "leases in flight: 3" in table and "workers alive: 1" in table
        assert "running" in table
        result = lockgate("status", "--db", db_url, "--json")
        assert result.exit_code == 0, result.output
        st = orjson.loads(result.stdout)
        assert st["batches"] == {"b": {"PENDING": 8}, "c": {"PENDING": 2}}
        assert st["leased"] == 3
        assert [(w["id"], w["status"], w["concurrency"]) for w in st["workers"]] == [
            (bg.worker.id, "running", 3)]
        bg.stop()
    result = lockgate("status", "--db", db_url, "--json")
    assert result.exit_code == 0, result.output
    st = orjson.loads(result.stdout)
    assert st["batches"] == {"b": {"PENDING": 8}, "c": {"PENDING": 2}}
    assert st["workers"] == [], "a stopped worker is not alive"
    assert st["leased"] == 0


def test_status_json_lists_live_workers(db_url: str, store: Store) -> None:
    store.register_worker("w-1", hostname="host", pid=1234, concurrency=8)
    result = lockgate("status", "--db", db_url, "--json")
    assert result.exit_code == 0, result.output
    (w,) = orjson.loads(result.stdout)["workers"]
    assert (w["id"], w["status"], w["concurrency"]) == ("w-1", "running", 8)


def test_tasks_show_prints_the_task_as_json(db_url: str, store: Store) -> None:
    store.submit([parse_task(t) for t in tasks(1)], batch_id="b")
    shown = lockgate("tasks", "show", "t-00000", "--db", db_url)
    assert shown.exit_code == 0, shown.output
    doc = orjson.loads(shown.stdout)
    assert (doc["task_id"], doc["status"], doc["attempt_log"]) == ("t-00000", "PENDING", [])
    assert doc["config"]["model_config"]["name"] == "sim-small"


def test_tasks_show_cancel_and_retry(db_url: str, store: Store,
                                     simulator: SimulatorProcess) -> None:
    store.submit([parse_task(t) for t in tasks(3)], batch_id="b")
    ids = [f"t-{i:05d}" for i in range(3)]

    result = lockgate("tasks", "cancel", ids[0], "--db", db_url)
    assert result.exit_code == 0, result.output
    assert f"task {ids[0]} is CANCELLED" in result.stderr
    result = lockgate("tasks", "cancel", ids[0], "--db", db_url)
    assert result.exit_code == 2
    assert f"cannot cancel task '{ids[0]}': it is CANCELLED" in flat(result.stderr)

    result = lockgate("tasks", "retry", ids[1], "--db", db_url)
    assert result.exit_code == 2
    assert "it is PENDING" in flat(result.stderr)

    run_worker(store, concurrency=4)
    assert status_counts(store) == {"CANCELLED": 1, "SUCCEEDED": 2}

    shown = lockgate("tasks", "show", ids[1], "--db", db_url)
    assert shown.exit_code == 0, shown.output
    doc = orjson.loads(shown.stdout)
    assert (doc["task_id"], doc["status"]) == (ids[1], "SUCCEEDED")
    assert doc["result"] == {"label": expected_label(text_for(1))}
    assert doc["input_data"] == {"text": text_for(1)}
    assert doc["config"]["model_config"]["name"] == "sim-small"
    assert doc["config"]["retry_policy"]["max_retries"] == 3
    assert doc["created_at"].endswith("Z") and doc["error"] is None
    (attempt,) = doc["attempt_log"]
    assert attempt["outcome"] == "succeeded" and attempt["prompt"][-1]["role"] == "user"

    result = lockgate("tasks", "retry", ids[0], "--db", db_url)
    assert result.exit_code == 0, result.output
    row = task_row(store, ids[0])
    assert (row["status"], row["attempts"], row["finished_at"]) == ("PENDING", 0, None)
    run_worker(store, concurrency=4)
    assert task_row(store, ids[0])["status"] == "SUCCEEDED"
    assert len(attempts_of(store, ids[0])) == 1

    result = lockgate("tasks", "show", "nope", "--db", db_url)
    assert result.exit_code == 2 and "no task 'nope'" in result.stderr


def test_cleanup_deletes_old_traces_and_finished_tasks_only(
        db_url: str, store: Store, simulator: SimulatorProcess) -> None:
    store.submit([parse_task(t) for t in tasks(3)], batch_id="b")
    # The worker's machine runs an hour fast and an hour slow: its attempts are still
    # stamped on the database's clock, which cleanup compares them with.
    run_worker(store, concurrency=4, wall_clock=lambda: time.time() + 3600)
    store.submit([parse_task(t) for t in tasks(2, prefix="later")], batch_id="b")
    run_worker(store, concurrency=4, wall_clock=lambda: time.time() - 3600,
               until=lambda: scalar(store, "SELECT COUNT(*) FROM task_attempt") == 5)
    store.submit([parse_task(t) for t in tasks(2, prefix="last")], batch_id="b")
    assert lockgate("cleanup", "--db", db_url, "--older-than", "30m").exit_code == 0
    assert scalar(store, "SELECT COUNT(*) FROM task_attempt") == 5, "recent traces stay"
    wait_for(lambda: store.db_now() > scalar(store, "SELECT MAX(started_at) FROM task_attempt"),
             "the clock to pass the last attempt")
    result = lockgate("cleanup", "--db", db_url, "--older-than", "0s", "--tasks")
    assert result.exit_code == 0, result.output
    assert "deleted 5 attempt(s), 5 task(s)" in result.stderr
    assert status_counts(store) == {"PENDING": 2}
    bad = lockgate("cleanup", "--db", db_url, "--older-than", "soon")
    assert bad.exit_code == 2 and "--older-than: 'soon' is not a duration" in bad.stderr
    neg = lockgate("cleanup", "--db", db_url, "--older-than", "-1d")
    assert neg.exit_code == 2 and "must not be negative" in neg.stderr


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///", "sqlite:///:memory:",
                                 "sqlite:///file::memory:?uri=true"])
def test_a_database_that_would_not_outlive_the_command_is_refused(
        url: str, tmp_path: Path) -> None:
    """An in-memory SQLite URL (an unset variable in ``sqlite:///$DIR/x.db`` makes one)
    took a submit's tasks and said so, then lost them with the process; a worker's
    other connections saw no tables and logged errors without end."""
    tasks = write_jsonl(tmp_path / "t.jsonl", [task("t1")])
    for command in (["submit", tasks], ["run", tasks], ["init"], ["status"]):
        result = lockgate(*command, "--db", url)
        assert result.exit_code == 2, (command, result.output)
        assert "names no file" in flat(result.stderr) and "Traceback" not in result.output


def test_a_database_url_written_wrong_is_one_line_naming_the_fix() -> None:
    result = lockgate("status", "--db", "sqlite://lockgate.db")  # two slashes
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "sqlite:///lockgate.db (a file here)" in flat(result.stderr)
    result = lockgate("status", "--db", "mysql://root:pw@127.0.0.1:9/")  # no database
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    err = flat(result.stderr)
    assert "names no database" in err and "CREATE DATABASE" in err and "pw" not in err


def test_a_sqlite_file_in_a_folder_that_does_not_exist_says_so(tmp_path: Path) -> None:
    """The error blamed permissions or a read-only mount."""
    result = lockgate("init", "--db", f"sqlite:///{tmp_path / 'nosuch' / 'x.db'}")
    assert result.exit_code == 2, result.output
    err = flat(result.stderr)
    assert f"The folder {tmp_path / 'nosuch'} does not exist" in err and "chattr" not in err


def test_a_database_missing_on_its_server_says_to_create_it(db_url: str) -> None:
    """MySQL's `Unknown database` came raw; PostgreSQL's was taken for a server down
    ("Is the server running ...?")."""
    if db_url.startswith("sqlite"):
        pytest.skip("a server's database")
    url = db_url.rsplit("/", 1)[0] + "/lockgate_no_such_db"
    result = lockgate("status", "--db", url)
    assert result.exit_code == 2, result.output
    err = flat(result.stderr)
    assert "does not exist on its server" in err and "CREATE DATABASE lockgate_no_such_db" \
        in err and "Is the server running" not in err, err


def test_errors_say_what_is_wrong(tmp_path: Path) -> None:
    result = lockgate("status", "--db", "lockgate.db")
    assert result.exit_code == 2
    assert "has no scheme" in flat(result.stderr)
    result = lockgate("status", "--db", "app:s3cret@db.example/lockgate")
    assert result.exit_code == 2
    assert "app:***@db.example/lockgate" in flat(result.stderr)
    assert "s3cret" not in result.output
    result = lockgate("status", "--db", "sqlite:/tmp/a.db")
    assert result.exit_code == 2
    assert "lacks '//' after 'sqlite:'" in flat(result.stderr)
    result = lockgate("status", "--db", "postgresql://app:s3cret@127.0.0.1:9/lockgate")
    assert result.exit_code == 2
    err = flat(result.stderr)
    assert "cannot reach the database postgresql://app:***@127.0.0.1:9/lockgate" in err
    assert "s3cret" not in result.output and "Traceback" not in result.output
    result = lockgate("submit", tmp_path / "missing.jsonl", "--db",
                      f"sqlite:///{tmp_path / 'x.db'}")
    assert result.exit_code == 2
    assert "does not exist" in flat(result.stderr)


def test_worker_refuses_a_bad_configuration(db_url: str, tmp_path: Path) -> None:
    cfg = tmp_path / "lockgate.toml"
    cfg.write_text('[[endpoint]]\nname = "main"\nbase_url = "http://127.0.0.1:9/v1"\n'
                   'api_key_env = "LOCKGATE_TEST_UNSET_KEY"\n')
    result = lockgate("worker", "--db", db_url, "--config", cfg, "--burst")
    assert result.exit_code == 2
    err = flat(result.stderr)
    assert "$LOCKGATE_TEST_UNSET_KEY" in err and "not set" in err
    cfg.write_text("[worker]\nconcurrency = 0\n")
    result = lockgate("worker", "--db", db_url, "--config", cfg, "--burst")
    assert result.exit_code == 2
    assert "worker.concurrency" in flat(result.stderr)
    # a lease so long that a crashed worker's tasks would never come back
    cfg.write_text("")
    result = lockgate("worker", "--db", db_url, "--config", cfg, "--lease", "2d", "--burst")
    assert result.exit_code == 2 and "must be at most 1d" in flat(result.stderr)
    result = lockgate("worker", "--db", db_url, "--config", cfg, "--lease", "99999999999d",
                      "--burst")
    assert result.exit_code == 2 and "must be at most 100 years" in flat(result.stderr)
