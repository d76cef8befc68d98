"""Edges of the command line found by an independent review, each a test that failed
before its fix: a task file given as a pipe, batch ids named apart from the lines, a
streamed submit of a file that cannot be read, `lockgate run` with nothing of its own
to run, `tasks resolve --result @FILE` on a file that is not UTF-8, an empty
``LOCKGATE_CONFIG``, Ctrl-C while a command's modules load, and the review CSV's
``model_config`` column."""

from __future__ import annotations

import contextlib
import csv
import io
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner, Result

from helpers import clean_env, rows
from lockgate import Lockgate
from lockgate.config import (
    CircuitSettings,
    QualitySettings,
    Settings,
    WorkerSettings,
    load_settings,
)
from lockgate.errors import SpecError
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import template_key
from lockgate.store import Store

from .support import (
    TEMPLATE,
    one_error,
    pipe_file,
    status_counts,
    task,
    tasks,
    write_jsonl,
)


def lockgate(*args: str | Path, env: dict[str, str] | None = None) -> Result:
    """The ``lockgate`` command in this process (an exception is kept, not raised: a
    traceback would show as ``exit_code`` 1)."""
    from lockgate.cli import app

    return CliRunner().invoke(app, [str(a) for a in args], env=env)



def _lines(n: int, prefix: str = "p") -> bytes:
    return b"".join(orjson.dumps(t) + b"\n" for t in tasks(n, prefix))


def _batches(store: Store) -> list[dict[str, object]]:
    return rows(store, "SELECT id, complete FROM batch ORDER BY id")


# -- 1. a task file given as a pipe is read once, and submitted whole ------------------


def test_a_pipe_as_the_task_file_is_submitted_whole(db_url: str, store: Store) -> None:
    """`lockgate submit <(cat fresh.jsonl)` said `0 submitted`, exit 0: the check pass
    could not keep its rows in /dev/fd, and the write pass read the empty pipe again."""
    with pipe_file(_lines(3)) as path:
        result = lockgate("submit", path, "--batch", "fresh", "--db", db_url)
    assert result.exit_code == 0, result.output
    assert "batch fresh: 3 submitted" in result.output
    assert status_counts(store) == {"PENDING": 3}
    assert _batches(store) == [{"id": "fresh", "complete": 1}]


def test_a_fifo_is_submitted_whole_even_when_its_folder_takes_no_file(
        db_url: str, store: Store, tmp_path: Path) -> None:
    """A real FIFO and a writer thread. The writer removes the FIFO and its folder once
    it has written every line (the reader holds it open by then), so the submit can
    neither keep its rows beside the file nor read it again: it keeps them in the
    temporary folder."""
    folder = tmp_path / "incoming"
    folder.mkdir()
    fifo = folder / "nightly.jsonl"
    os.mkfifo(fifo)
    data = _lines(4, "f")

    def write() -> None:
        with fifo.open("wb") as fh:  # blocks until the submit opens it to read
            fh.write(data[:50])
            fh.flush()
            fh.write(data[50:])
            fh.flush()
            fifo.unlink()
            folder.rmdir()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        result = lockgate("submit", fifo, "--db", db_url)
    finally:
        if writer.is_alive() and fifo.exists():  # the submit never opened it: unblock
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        writer.join(10)
    assert result.exit_code == 0, result.output
    assert "batch nightly: 4 submitted" in result.output
    assert status_counts(store) == {"PENDING": 4}
    assert _batches(store) == [{"id": "nightly", "complete": 1}]


def test_a_pipe_whose_rows_cannot_be_kept_anywhere_is_refused_loudly(
        db_url: str, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither its folder nor the temporary folder takes the spool: read again, the pipe
    would give nothing; the submit is refused, and nothing (no batch) is written."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-folder"))
    with pipe_file(_lines(3)) as path:
        error = one_error(lockgate("submit", path, "--batch", "fresh", "--db", db_url))
    assert "can be read only once" in error and "nothing was submitted" in error, error
    assert "--stream" in error
    assert status_counts(store) == {}
    assert _batches(store) == []


def test_a_streamed_pipe_still_works(db_url: str, store: Store) -> None:
    with pipe_file(_lines(3)) as path:
        result = lockgate("submit", path, "--stream", "--batch", "s", "--db", db_url)
    assert result.exit_code == 0, result.output
    assert status_counts(store) == {"PENDING": 3}


# -- 2. --batch and the file-name batch get the checks of a line's batch_id ------------


@pytest.mark.parametrize("bad, words", [
    ("b" * 300, "should have at most 191 characters"),
    (" x", "must be printable with no leading or trailing whitespace"),
    ("x\t", "must be printable with no leading or trailing whitespace"),
    ("a\nb", "must be printable with no leading or trailing whitespace"),
    ("", "must not be empty"),
    ("gate:x", "reserved for the release gate"),
])
def test_a_bad_batch_option_is_refused_before_anything_is_written(
        db_url: str, store: Store, tmp_path: Path, bad: str, words: str) -> None:
    """Accepted on SQLite, cut to 191 characters on MariaDB (the batch then could not be
    exported by its name), a raw `value too long` on PostgreSQL; ' x' and a tab were
    accepted too, and '' fell back to the file's name."""
    path = write_jsonl(tmp_path / "good.jsonl", tasks(2))
    for command in ("submit", "run"):
        error = one_error(lockgate(command, path, "--batch", bad, "--db", db_url))
        assert error.startswith("error: --batch ") and words in error, error
    error = one_error(lockgate("submit", path, "--stream", "--batch", bad, "--db", db_url))
    assert words in error, error
    assert status_counts(store) == {}
    assert _batches(store) == []
    with Lockgate(db_url, migrate=False) as lg, pytest.raises(SpecError, match=words):
        lg.submit_file(path, batch_id=bad)
    with Lockgate(db_url, migrate=False) as lg, pytest.raises(SpecError, match=words):
        lg.submit(tasks(1), batch_id=bad)
    assert status_counts(store) == {}


def test_a_file_name_that_makes_a_bad_batch_id_is_refused_with_the_fix(
        db_url: str, store: Store, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / " leading.jsonl", tasks(2))
    error = one_error(lockgate("submit", path, "--db", db_url))
    assert "file name ' leading.jsonl' makes a bad batch id" in error, error
    assert "must be printable" in error and "--batch" in error, error
    assert _batches(store) == []
    result = lockgate("submit", path, "--batch", "leading", "--db", db_url)
    assert result.exit_code == 0, result.output
    assert status_counts(store) == {"PENDING": 2}
    long_ok = "b" * 191  # the longest batch id is taken, whole, on every database
    result = lockgate("submit", write_jsonl(tmp_path / "more.jsonl", tasks(1, "m")),
                      "--batch", long_ok, "--db", db_url)
    assert result.exit_code == 0, result.output
    assert {b["id"] for b in _batches(store)} == {"leading", long_ok}


# -- 3. a streamed submit of a file that cannot be read leaves no batch ---------------


@pytest.mark.parametrize("what", ["missing", "folder"])
def test_a_streamed_submit_of_an_unreadable_file_leaves_no_batch_behind(
        db_url: str, store: Store, tmp_path: Path, what: str) -> None:
    """The batch was opened (marked incomplete) before the file: `status` showed it
    incomplete forever, `export` gave 0 tasks, and nothing could complete it."""
    path = tmp_path / "nightly.jsonl"
    if what == "folder":
        path.mkdir()
    error = one_error(lockgate("submit", path, "--stream", "--db", db_url))
    assert str(path) in error, error
    assert _batches(store) == []
    assert rows(store, "SELECT batch_id FROM batch_submit") == []
    st = orjson.loads(lockgate("status", "--json", "--db", db_url).stdout)
    assert st["batches"] == {} and st["incomplete_batches"] == []


# -- 4. `lockgate run` with nothing of its own to run ---------------------------------


def test_run_of_an_empty_file_says_there_is_nothing_to_run(
        db_url: str, store: Store, simulator: SimulatorProcess, tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    result = lockgate("run", path, "--db", db_url)
    assert result.exit_code == 0, result.output
    assert f"nothing to run: {path} holds no task" in result.output
    assert "error:" not in result.output
    assert simulator.stats()["requests"] == 0
    blank = write_jsonl(tmp_path / "bad.jsonl", ["{not json"])
    result = lockgate("run", blank, "--skip-invalid", "--db", db_url)
    assert result.exit_code == 0, result.output
    assert "holds no task that passed its checks" in result.output
    assert _batches(store) == []


def test_run_of_a_file_whose_tasks_belong_to_another_batch_runs_and_reports_them(
        db_url: str, store: Store, simulator: SimulatorProcess, tmp_path: Path) -> None:
    """Its tasks were worked (progress `3/0`), then `error: no batch ...`, exit 2."""
    first = write_jsonl(tmp_path / "first.jsonl", tasks(3))
    assert lockgate("submit", first, "--db", db_url).exit_code == 0
    again = write_jsonl(tmp_path / "again.jsonl", tasks(3))
    result = lockgate("run", again, "--db", db_url)
    assert result.exit_code == 0, result.output
    assert "already belong to another batch (3 in batch 'first')" in result.output
    assert "error:" not in result.output
    assert "batch first" in result.stdout  # its summary: where the tasks are
    assert status_counts(store) == {"SUCCEEDED": 3}
    assert [b["id"] for b in _batches(store)] == ["first"]


# -- 5. `tasks resolve --result @FILE` on a file that is not UTF-8 --------------------


def test_resolve_with_a_result_file_that_is_not_utf8_is_one_error(tmp_path: Path) -> None:
    bad = tmp_path / "answer.json"
    bad.write_bytes(b'{"label": "\xff\xfe"}\n')
    error = one_error(lockgate("tasks", "resolve", "t1", "--result", f"@{bad}", "--db",
                               f"sqlite:///{tmp_path / 'lg.db'}"))
    assert "field 'result'" in error and str(bad) in error and "not UTF-8" in error, error
    missing = one_error(lockgate("tasks", "resolve", "t1", "--result",
                                 f"@{tmp_path / 'none.json'}"))
    assert "cannot read" in missing and "none.json" in missing, missing


# -- 6. an empty LOCKGATE_CONFIG counts as unset ---------------------------------------


def test_an_empty_config_variable_counts_as_unset(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`LOCKGATE_CONFIG=` broke every command: `cannot read config file .`."""
    url = f"sqlite:///{tmp_path / 'lg.db'}"
    assert lockgate("init", "--db", url).exit_code == 0
    result = lockgate("status", "--db", url, env={"LOCKGATE_CONFIG": ""})
    assert result.exit_code == 0, result.output
    monkeypatch.setenv("LOCKGATE_CONFIG", "")
    assert load_settings().worker.concurrency == Settings().worker.concurrency
    (tmp_path / "lockgate.toml").write_text("[worker]\nconcurrency = 7\n")
    assert load_settings().worker.concurrency == 7  # as if unset: ./lockgate.toml


# -- 7. Ctrl-C while the command's modules load ----------------------------------------

#: Runs the ``lockgate`` console script with a Ctrl-C that arrives, deterministically,
#: the moment the module named by argv[1] starts to load: SIGINT is sent at once but
#: blocked (pending), and unblocked by an import hook.
EARLY_INTERRUPT = """\
import os, runpy, signal, sys
target, script = sys.argv[1], sys.argv[2]
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
os.kill(os.getpid(), signal.SIGINT)

class Trip:
    def find_spec(self, name, path=None, target_module=None):
        if name == target:
            sys.meta_path.remove(self)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        return None

sys.meta_path.insert(0, Trip())
sys.argv = [script, *sys.argv[3:]]
runpy.run_path(script, run_name="__main__")
"""


@pytest.mark.parametrize("module", ["typer", "sqlalchemy", "lockgate.cli._common",
                                    "lockgate.app", "lockgate.cli.queue",
                                    "lockgate.cli.registry"])
def test_ctrl_c_while_the_command_loads_says_interrupted_without_a_traceback(
        tmp_path: Path, module: str) -> None:
    script = Path(sys.executable).with_name("lockgate")
    assert script.exists(), script
    run = subprocess.run(
        [sys.executable, "-c", EARLY_INTERRUPT, module, str(script), "status", "--db",
         f"sqlite:///{tmp_path / 'none.db'}"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env=clean_env())
    assert "Traceback" not in run.stderr, run.stderr
    assert run.stderr.strip() == "interrupted", run.stderr
    assert run.returncode == 130, (run.returncode, run.stderr)


def test_the_app_and_its_command_modules_load_on_first_use() -> None:
    """``lockgate.cli`` loads its commands in ``main`` (or on first use of ``app``):
    every command is still there for whoever imports ``app``."""
    code = ("import sys, lockgate.cli as c\n"
            "assert 'lockgate.cli.queue' not in sys.modules\n"
            "from lockgate.cli import app\n"
            "from typer.main import get_command\n"
            "names = set(get_command(app).commands)\n"
            "assert {'submit', 'run', 'tasks', 'prompt', 'alerts', 'circuit', "
            "'quality'} <= names, names\n"
            "assert c.queue.submit and c.tasks.resolve\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=clean_env())
    assert run.returncode == 0, run.stderr


# -- 8. the review CSV's model_config column -------------------------------------------

KEY = template_key(TEMPLATE)


def test_the_review_csv_has_the_model_config_column_of_the_jsonl(
        simulator: SimulatorProcess, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'lg.db'}"
    circuit = CircuitSettings(prompt=KEY, fallback="review", probe_share=0.0)
    settings = Settings(worker=WorkerSettings(concurrency=8, poll_max_s=0.05),
                        quality=QualitySettings(circuit=(circuit,), circuit_every_s=0.1,
                                                circuit_refresh_s=0.05))
    with Lockgate(url, settings=settings) as lg:
        lg.submit([task(f"r-{i}", f"order {i}", model={"temperature": 0.3})
                   for i in range(2)], batch_id="r")
        lg.open_circuit(KEY, actor="alice", reason="drill")
        assert lg.run_worker(burst=True).review == 2
    jsonl = lockgate("export", "--review", "--db", url)
    assert jsonl.exit_code == 0, jsonl.output
    lines = [orjson.loads(x) for x in jsonl.stdout.splitlines()]
    result = lockgate("export", "--review", "--format", "csv", "--db", url)
    assert result.exit_code == 0, result.output
    table = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [r["task_id"] for r in table] == ["r-0", "r-1"]
    for line, row in zip(lines, table, strict=True):
        assert line["model_config"]["temperature"] == 0.3
        assert orjson.loads(row["model_config"]) == line["model_config"]
