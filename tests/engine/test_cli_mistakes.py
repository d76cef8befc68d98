"""A user's mistakes on the command line, each refused in one line (``error: ...``, exit
code 2) before it can do harm, and a `lockgate run` stopped before its end that says so
(exit code 130). Found by a newcomer's review; each test failed before its fix."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner, Result

from helpers import clean_env, wait_for
from lockgate.cli import app
from lockgate.simulator.testing import SimulatorProcess
from lockgate.store import Store

from .support import one_error, rows, status_counts, tasks, write_jsonl


def lockgate(*args: str | Path, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args], env=env)



@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'lockgate.db'}"


# -- worker flags are checked as the config file is -----------------------------------


@pytest.mark.parametrize("args, words", [
    (["--concurrency", "0"], "--concurrency: 0: must be at least 1"),
    (["--concurrency", "-1"], "--concurrency: -1: must be at least 1"),
    (["--claim-batch", "99999"], "--claim-batch: 99999: must be at most 5000"),
    (["--lease", "1ms"], "--lease: 1ms: must be at least 1s"),
])
def test_worker_flags_out_of_range_are_refused_naming_the_flag(
        sqlite_url: str, tmp_path: Path, args: list[str], words: str) -> None:
    store = Store(sqlite_url)
    try:
        path = write_jsonl(tmp_path / "b.jsonl", tasks(2))
        assert lockgate("submit", path, "--db", sqlite_url).exit_code == 0
        assert words in one_error(lockgate("worker", "--burst", "--db", sqlite_url, *args))
        assert status_counts(store) == {"PENDING": 2}, "no task was worked, none DEAD"
        # `run` refuses them before submitting anything (it used to hang on 0)
        other = write_jsonl(tmp_path / "c.jsonl", tasks(2, prefix="c"))
        assert words in one_error(lockgate("run", other, "--db", sqlite_url, *args))
        assert status_counts(store) == {"PENDING": 2}
    finally:
        store.close()


def test_the_python_api_checks_worker_overrides_too(sqlite_url: str) -> None:
    import lockgate as pkg

    with pkg.connect(sqlite_url) as lg, pytest.raises(pkg.SpecError) as err:
        lg.worker(burst=True, concurrency=0)
    assert err.value.field == "concurrency"


# -- a path that cannot be used, a choice that does not exist ------------------------


def test_paths_that_cannot_be_read_or_written_are_one_line(
        sqlite_url: str, simulator: SimulatorProcess, tmp_path: Path) -> None:
    folder = str(tmp_path)
    tasks_file = write_jsonl(tmp_path / "b.jsonl", tasks(2))
    assert lockgate("submit", tasks_file, "--db", sqlite_url).exit_code == 0
    cases = [
        (["submit", folder], f"cannot read {folder}: Is a directory"),
        (["status", "--config", folder], f"cannot read config file {folder}: Is a directory"),
        (["dataset", "add", "dd", folder], f"cannot read {folder}: Is a directory"),
        (["export", "b", "-o", "/nonexistent/dir/x.jsonl"],
         "cannot write /nonexistent/dir/x.jsonl: No such file or directory"),
        (["export", "b", "-o", folder], f"cannot write {folder}: Is a directory"),
        (["submit", tasks_file, "--skip-invalid", "--rejects", "/nonexistent/r.jsonl"],
         "cannot write /nonexistent/r.jsonl: No such file or directory"),
        (["worker", "--burst", "--log-level", "verbose"],
         "--log-level must be one of DEBUG, INFO, WARNING, ERROR, not 'verbose'"),
    ]
    for args, words in cases:
        assert words in one_error(lockgate(*args, "--db", sqlite_url)), args
    assert words_in_env_config(sqlite_url, folder)


def test_an_export_over_the_database_it_reads_is_refused(
        sqlite_url: str, tmp_path: Path) -> None:
    """``export -o`` naming the SQLite file it exports from renamed the export over
    it: "exported 2 task(s)", then every task was gone ("file is not a database")."""
    assert lockgate("submit", write_jsonl(tmp_path / "b.jsonl", tasks(2)),
                    "--db", sqlite_url).exit_code == 0
    db = Path(sqlite_url.removeprefix("sqlite:///"))
    for target in (db, db.with_name(db.name + "-wal")):
        if not target.exists():
            continue
        error = one_error(lockgate("export", "b", "-o", target, "--db", sqlite_url))
        assert f"{target} is the database this exports from" in error
    assert lockgate("status", "--db", sqlite_url).exit_code == 0  # still a database


def words_in_env_config(url: str, folder: str) -> bool:
    error = one_error(lockgate("status", "--db", url, env={"LOCKGATE_CONFIG": folder}))
    return f"cannot read config file {folder}: Is a directory" in error


# -- `lockgate run` stopped before its end --------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_run_stopped_by_a_signal_says_how_many_tasks_are_left_and_exits_130(
        simulator: SimulatorProcess, tmp_path: Path, sig: signal.Signals) -> None:
    simulator.configure(latency={"kind": "fixed", "mean_ms": 300})
    url = f"sqlite:///{tmp_path / 'run.db'}"
    path = write_jsonl(tmp_path / "slow.jsonl", tasks(40))
    proc = subprocess.Popen(
        [sys.executable, "-m", "lockgate.cli", "run", str(path), "--db", url,
         "--concurrency", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=tmp_path, env=clean_env(LOCKGATE_BASE_URL=simulator.url))
    try:
        wait_for(lambda: simulator.stats()["requests"] >= 2, "the run's first calls")
        proc.send_signal(sig)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    said = " ".join(err.split())
    assert proc.returncode == 130, err
    found = re.search(r"interrupted: (\d+) task\(s\) not finished; run the same command "
                      r"again", said)
    assert found, err
    store = Store(url)
    try:
        left = status_counts(store).get("PENDING", 0)
    finally:
        store.close()
    assert int(found.group(1)) == left > 0


# -- a batch named on the command line wins over the lines' batch_id ------------------


def test_an_explicit_batch_wins_over_the_lines_batch_id_and_says_so(
        sqlite_url: str, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "file.jsonl",
                       [{**t, "batch_id": "lines-b"} for t in tasks(3)])
    r = lockgate("submit", path, "--batch", "nightly", "--weight", "2", "--db", sqlite_url)
    assert r.exit_code == 0, r.output
    said = " ".join(r.output.split())
    assert "batch nightly: 3 submitted" in said
    assert "3 line(s) named another batch (batch_id); --batch nightly took them" in said
    store = Store(sqlite_url)
    try:
        assert rows(store, "SELECT batch_id, COUNT(*) AS n FROM task GROUP BY batch_id") == [
            {"batch_id": "nightly", "n": 3}]
        assert rows(store, "SELECT base_weight FROM batch WHERE id = 'nightly'") == [
            {"base_weight": 2.0}]
    finally:
        store.close()
    assert lockgate("export", "nightly", "--db", sqlite_url).exit_code == 0


def test_without_batch_the_lines_batches_are_named_and_planned(
        sqlite_url: str, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "file.jsonl",
                       [{**t, "batch_id": "lines-b"} for t in tasks(3)])
    r = lockgate("submit", path, "--weight", "3", "--db", sqlite_url)
    assert r.exit_code == 0, r.output
    assert "batch lines-b: 3 submitted" in " ".join(r.output.split())
    store = Store(sqlite_url)
    try:
        assert rows(store, "SELECT id, base_weight FROM batch") == [
            {"id": "lines-b", "base_weight": 3.0}]
    finally:
        store.close()


def test_the_python_api_puts_tasks_in_the_batch_it_is_given(sqlite_url: str) -> None:
    import lockgate as pkg

    with pkg.connect(sqlite_url) as lg:
        report = lg.submit([{**t, "batch_id": "lines-b"} for t in tasks(2)],
                           batch_id="mine")
        assert (report.batches, report.moved, report.inserted) == (("mine",), 2, 2)
        kept = lg.submit([{**t, "batch_id": "lines-c"} for t in tasks(2, prefix="k")])
        assert (kept.batches, kept.moved) == (("lines-c",), 0)


# -- the README's example task succeeds against the built-in simulator ----------------


def test_the_readme_example_task_succeeds_against_the_simulator(
        sqlite_url: str, simulator: SimulatorProcess, tmp_path: Path) -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    block = readme.split("```json\n", 1)[1].split("```", 1)[0]
    line = orjson.dumps(orjson.loads(block))
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(line + b"\n")
    assert lockgate("init", "--db", sqlite_url).exit_code == 0
    assert lockgate("submit", path, "--db", sqlite_url).exit_code == 0
    r = lockgate("worker", "--burst", "--db", sqlite_url)
    assert r.exit_code == 0, r.output
    store = Store(sqlite_url)
    try:
        [row] = rows(store, "SELECT status, result FROM task")
    finally:
        store.close()
    assert row["status"] == "SUCCEEDED", row
    assert orjson.loads(row["result"])["category"] in {"logistics", "quality", "refund", "other"}


# -- settings and references checked where they are given -----------------------------


def test_a_prompt_version_refuses_a_misspelt_model_config_key(
        sqlite_url: str, tmp_path: Path) -> None:
    prompt = tmp_path / "p.txt"
    prompt.write_text("[user]\nClassify {text}\n")
    bad = '{"name": "x", "temprature": 1}'
    error = one_error(lockgate("prompt", "create", "px", "-f", prompt, "--model-config", bad,
                               "--db", sqlite_url))
    assert "'model_config.temprature'" in error and "did you mean 'temperature'" in error
    assert lockgate("prompt", "create", "px", "-f", prompt, "--model-config",
                    '{"name": "x"}', "--db", sqlite_url).exit_code == 0
    error = one_error(lockgate("prompt", "propose", "px", "-f", prompt, "--model-config",
                               bad, "--db", sqlite_url))
    assert "'model_config.temprature'" in error and "did you mean 'temperature'" in error


@pytest.mark.parametrize("toml, words", [
    ('default_endpoint = "nope"\n[[endpoint]]\nname = "a"\nbase_url = "http://h/v1"\n',
     "default_endpoint 'nope' is not a defined endpoint (defined: a)"),
    ("[worker]\nconcurency = 256\n",
     "'worker.concurency': unknown setting; did you mean 'concurrency'?"),
    ("[wroker]\nconcurrency = 256\n",
     "'wroker': unknown section or setting; did you mean 'worker'?"),
    ('[endpoint]\nname = "x"\nbase_url = "http://h/v1"\n',
     "'endpoint': use [[endpoint]] (an array of tables)"),
    ("[worker]\nlease_s = 0\n", "'worker.lease_s': 0: must be at least 1s; it is a duration"),
    ('[worker]\nlease_s = "1ms"\n', "'worker.lease_s': 1ms: must be at least 1s"),
])
def test_config_mistakes_are_explained(sqlite_url: str, tmp_path: Path, toml: str,
                                       words: str) -> None:
    cfg = tmp_path / "lockgate.toml"
    cfg.write_text(toml)
    assert words in one_error(lockgate("status", "--db", sqlite_url, "--config", cfg))


def test_a_malformed_csv_dataset_is_refused_at_its_line(sqlite_url: str,
                                                        tmp_path: Path) -> None:
    cases = {
        "id,text,expected\n1,hello,yes\n2,world\n":
            "line 3: 2 field(s), the header has 3 (no expected)",
        'id,text,expected\n1,hello,yes\n3,"unterminated,no\n4,a,b\n':
            "line 3: not valid CSV (unexpected end of data)",
        "id,text,expected\n1,hello,yes,extra\n": "line 2: 4 fields, the header has 3",
    }
    for i, (text, words) in enumerate(cases.items()):
        path = tmp_path / f"d{i}.csv"
        path.write_text(text)
        assert words in one_error(lockgate("dataset", "add", f"d{i}", path, "--db",
                                           sqlite_url))


def test_duration_flags_and_signs(sqlite_url: str) -> None:
    from lockgate.cli.queue import _simulator_args
    from lockgate.durations import parse_duration
    from lockgate.errors import SpecError

    assert _simulator_args(["--window-s", "1m", "--hang-s=0", "--enforce-s", "250ms",
                            "--rpm", "5"]) == ["--window-s", "60.0", "--hang-s=0.0",
                                               "--enforce-s", "0.25", "--rpm", "5"]
    assert "--window-s: 'soon' is not a duration" in one_error(
        lockgate("simulate", "--window-s", "soon"))
    for text in ("+90", "+90m"):
        with pytest.raises(SpecError, match="without '\\+'"):
            parse_duration(text)
    assert lockgate("init", "--db", sqlite_url).exit_code == 0
    error = one_error(lockgate("quality", "p", "--since", "5 min", "--db", sqlite_url))
    assert error.startswith("error: --since: '5 min' is not a duration"), error


def test_retry_refuses_an_unknown_error_class(sqlite_url: str, tmp_path: Path) -> None:
    assert lockgate("submit", write_jsonl(tmp_path / "b.jsonl", tasks(1)), "--db",
                    sqlite_url).exit_code == 0
    error = one_error(lockgate("tasks", "retry", "--batch", "b", "--error-class",
                               "conection_error", "--db", sqlite_url))
    assert error == ("error: --error-class: 'conection_error' is not an error class; "
                     "did you mean 'connection_error'?")


def test_a_worker_of_a_pool_no_endpoint_is_in_is_warned(sqlite_url: str,
                                                         tmp_path: Path) -> None:
    """``--pool fast`` with no endpoint in pool 'fast' started silently, and the worker
    never had an endpoint for its tasks."""
    cfg = tmp_path / "lockgate.toml"
    cfg.write_text('[[endpoint]]\nname = "a"\nbase_url = "http://127.0.0.1:9/v1"\n'
                   'pool = "slow"\n')
    got = lockgate("worker", "--burst", "--pool", "fast", "--db", sqlite_url,
                   "--config", cfg)
    assert got.exit_code == 0, got.output
    assert "no endpoint of this config is in pool 'fast' (its pools: 'slow')" in \
        " ".join(got.output.split()), got.output
    served = lockgate("worker", "--burst", "--pool", "slow", "--db", sqlite_url,
                      "--config", cfg)
    assert "no endpoint of this config is in pool" not in served.output


def test_an_unreachable_endpoint_from_the_environment_names_the_variable(
        sqlite_url: str, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "b.jsonl", tasks(1))
    error = one_error(lockgate("run", path, "--db", sqlite_url,
                               env={"LOCKGATE_BASE_URL": "http://127.0.0.1:9/v1"}))
    assert "fix $LOCKGATE_BASE_URL" in error and "config file" not in error
