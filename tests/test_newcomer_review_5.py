"""A fifth newcomer's review: an upper-case database scheme, a conversion command that
emptied its input, ``1M`` read as a minute, an API key pasted where its variable's name
goes (and printed back), a password in a URL echoed, SQLite URLs naming a folder or a
file of another kind, Ctrl-C while a file is checked, an option given without its
value, ``gate cancel`` on a decided update, help in Typer's own notation, a window
announced for a batch that was not created, ``--deadline -1s``, ``submit -``, and
config and task errors in pydantic's words."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner, Result

import helpers
from lockgate.cli import app
from lockgate.config import Settings, load_settings
from lockgate.durations import parse_duration
from lockgate.errors import ConfigError, LockgateError, SpecError
from lockgate.files import not_jsonl
from lockgate.spec import parse_task
from lockgate.store.engine import create, database_url

SECRET = "sk-proj-AbCdEfGh0123456789SECRET"


def lockgate(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False,
                              prog_name="lockgate")


def flat(text: str) -> str:
    return " ".join(text.split())


def task(task_id: str = "t1", **model: Any) -> dict[str, Any]:
    return {"task_id": task_id, "prompt_template": "hi {x}", "input_data": {"x": 1},
            "model_config": {"name": "m", **model}, "delivery_rule": {},
            "retry_policy": {}}


def write_tasks(path: Path, *ids: str) -> Path:
    path.write_bytes(b"".join(orjson.dumps(task(i)) + b"\n" for i in ids))
    return path


refused = helpers.config_refused


# -- 1. a database URL's scheme in any case -------------------------------------------

@pytest.mark.parametrize("url, driver", [
    ("Postgresql://u@h:5432/db", "postgresql+psycopg://u@h:5432/db"),
    ("POSTGRES://u@h/db", "postgresql+psycopg://u@h/db"),
    ("MYSQL://root@h/db", "mysql+pymysql://root@h/db"),
    ("MariaDB://root@h/db", "mysql+pymysql://root@h/db"),
])
def test_a_database_scheme_is_case_insensitive(url: str, driver: str) -> None:
    """``POSTGRES://`` crashed with NoSuchModuleError and a traceback."""
    assert database_url(url) == driver
    create(url).dispose()  # no driver lookup fails


def test_an_upper_case_sqlite_url_creates_the_database(tmp_path: Path) -> None:
    r = lockgate("init", "--db", "SQLITE:///up.db")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "up.db").exists()


def test_a_driver_sqlalchemy_lacks_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"no database driver 'postgresql[+]nodriver'"):
        create("postgresql+nodriver://u:pw@h/db")


# -- 2. the conversion a refusal suggests never writes onto its input -----------------

def test_the_jq_command_for_a_pretty_jsonl_file_writes_another_file(tmp_path: Path) -> None:
    """``jq -c . pretty.jsonl > pretty.jsonl`` empties the file before jq reads it."""
    for name, text in (("pretty.jsonl", '[\n {"a": 1}\n]\n'),
                       ("obj.jsonl", '{\n "a": 1\n}\n')):
        path = tmp_path / name
        path.write_text(text)
        problem = not_jsonl(path, path.read_bytes().splitlines(keepends=True)[0])
        assert problem is not None
        assert f"> {path}" not in problem, problem
        assert f"> {tmp_path / name.replace('.jsonl', '.lines.jsonl')}" in problem, problem


def test_a_json_file_is_still_converted_to_its_jsonl_name(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_text('[\n {"a": 1}\n]\n')
    problem = not_jsonl(path, b"[\n")
    assert problem is not None and f"> {tmp_path / 'f.jsonl'}" in problem, problem


# -- 3. M is not a unit ---------------------------------------------------------------

@pytest.mark.parametrize("text", ["1M", "1MS", "2M30S", "1Ms", "1h30M"])
def test_an_upper_case_m_is_refused_as_ambiguous(text: str) -> None:
    """``1M`` was a minute: ``cleanup --older-than 1M --tasks`` (a month meant) deleted
    nearly everything; ``1MS`` was a millisecond."""
    with pytest.raises(SpecError, match=r"M is ambiguous .*months are not a unit: write 30d"):
        parse_duration(text)


def test_milliseconds_are_written_in_lower_case() -> None:
    with pytest.raises(SpecError, match="write milliseconds as ms"):
        parse_duration("5mS")
    assert parse_duration("250ms") == 0.25


@pytest.mark.parametrize("text", ["P1M", "PT1M", "pt5m", "P1D"])
def test_iso_8601_durations_are_refused_not_read_as_minutes(text: str) -> None:
    with pytest.raises(SpecError, match=r"ISO 8601 durations .* are not read"):
        parse_duration(text)


@pytest.mark.parametrize("text, seconds", [("90S", 90.0), ("1H", 3600.0), ("2D", 172800.0),
                                           ("1W", 604800.0), ("1m", 60.0), ("1H30m", 5400.0)])
def test_the_unambiguous_units_are_read_in_either_case(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_cleanup_older_than_1m_deletes_nothing(tmp_path: Path) -> None:
    db = "sqlite:///c.db"
    assert lockgate("submit", write_tasks(tmp_path / "b.jsonl", "a", "b"), "--db", db
                    ).exit_code == 0
    r = lockgate("cleanup", "--older-than", "1M", "--tasks", "--db", db)
    assert r.exit_code == 2, r.output
    assert "error: --older-than: '1M': M is ambiguous" in flat(r.output), r.output


def test_a_config_duration_refuses_m_too(tmp_path: Path) -> None:
    message = refused(tmp_path, '[worker]\nlease_s = "1M"\n')
    assert "M is ambiguous" in message, message


# -- 4. an API key where its variable's name goes --------------------------------------

def test_an_api_key_in_api_key_env_is_refused_without_being_shown(tmp_path: Path) -> None:
    """It printed "reads its API key from $sk-proj-..., export sk-proj-...=..."."""
    message = refused(tmp_path, f'[[endpoint]]\nname = "openai"\nbase_url = '
                                f'"https://api.openai.com/v1"\napi_key_env = "{SECRET}"\n')
    assert SECRET not in message and "SECRET" not in message, message
    assert ("api_key_env names the environment variable holding the key (e.g. "
            "OPENAI_API_KEY), not the key itself") in message, message


def test_an_api_key_in_lockgate_api_key_env_is_refused_without_being_shown(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_API_KEY_ENV", SECRET)
    with pytest.raises(ConfigError) as info:
        Settings().endpoints()
    assert SECRET not in str(info.value) and "$LOCKGATE_API_KEY_ENV" in str(info.value)
    assert "not the key itself" in str(info.value)


def test_a_secret_in_secret_env_is_refused_without_being_shown(tmp_path: Path) -> None:
    message = refused(tmp_path, '[[quality.webhook]]\nurl = "https://h.example/x"\n'
                                'secret_env = "whsec-0123-topsecretvalue"\n')
    assert "topsecretvalue" not in message and "not the secret itself" in message, message


def test_a_variable_name_still_passes(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[[endpoint]]\nname = "a"\nbase_url = "http://h/v1"\n'
                   'api_key_env = "OPENAI_API_KEY"\n')
    assert load_settings(cfg).endpoint[0].api_key_env == "OPENAI_API_KEY"


# -- 5. a password in a URL that is not HTTP --------------------------------------------

@pytest.mark.parametrize("toml", [
    '[[endpoint]]\nname = "a"\nbase_url = "ftp://user:s3cret@files.example/v1"\n',
    '[[quality.webhook]]\nurl = "ftp://user:s3cret@hooks.example/x"\n',
])
def test_a_password_in_a_url_that_is_not_http_is_hidden(tmp_path: Path, toml: str) -> None:
    message = refused(tmp_path, toml)
    assert "s3cret" not in message and "user:***@" in message, message
    assert "is not an HTTP URL" in message


# -- 8. a SQLite URL naming a folder, or a file of another kind ------------------------

def test_a_sqlite_url_naming_a_folder_says_so(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    r = lockgate("init", "--db", f"sqlite:///{folder}")
    assert r.exit_code == 2, r.output
    text = flat(r.output)
    assert f"{folder} is a folder; name a database file in it" in text, text
    assert "permissions" not in text, text


def test_a_file_that_is_not_sqlite_is_named(tmp_path: Path) -> None:
    (tmp_path / "notes.db").write_bytes(b"not a database, only words. " * 40)
    for cmd in ("init", "status"):
        r = lockgate(cmd, "--db", "sqlite:///notes.db")
        assert r.exit_code == 2, r.output
        assert "notes.db is not an SQLite database" in flat(r.output), r.output


# -- 9. Ctrl-C before anything was written ---------------------------------------------

def test_ctrl_c_while_the_file_is_checked_says_nothing_was_submitted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import lockgate.app as app_module

    def interrupted(*_a: Any, **_k: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(app_module, "check_file", interrupted)
    r = lockgate("submit", write_tasks(tmp_path / "b.jsonl", "a"), "--db", "sqlite:///c.db")
    assert r.exit_code == 130, r.output
    text = flat(r.output)
    assert "nothing was submitted" in text and "written so far" not in text, text


def test_ctrl_c_after_a_chunk_says_the_batch_is_incomplete(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lockgate.app import Lockgate

    def half(self: Any, *_a: Any, progress: Any = None, **_k: Any) -> Any:
        progress(5)
        raise KeyboardInterrupt

    monkeypatch.setattr(Lockgate, "submit_file", half)
    r = lockgate("submit", write_tasks(tmp_path / "b.jsonl", "a"), "--db", "sqlite:///c.db")
    assert r.exit_code == 130, r.output
    text = flat(r.output)
    assert "the tasks written so far are in" in text and "nothing was" not in text, text


# -- 10. an option without its value ------------------------------------------------------

@pytest.mark.parametrize("args, usage", [
    (["submit", "x.jsonl", "--batch"], "Usage: lockgate submit [OPTIONS] FILE"),
    (["worker", "--lease"], "Usage: lockgate worker [OPTIONS]"),
])
def test_an_option_without_its_value_shows_usage_and_help(args: list[str],
                                                          usage: str) -> None:
    r = lockgate(*args)
    assert r.exit_code == 2
    assert usage in r.output, r.output
    assert f"Try 'lockgate {args[0]} --help' for help." in r.output, r.output
    assert f"Error: Option '{args[-1]}' requires an argument." in r.output


# -- 11. gate cancel on a decided update ----------------------------------------------------

def test_gate_cancel_on_a_decided_update_is_an_error_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from lockgate.gate.api import Gate

    assert lockgate("init", "--db", "sqlite:///g.db").exit_code == 0
    monkeypatch.setattr(Gate, "cancel", lambda self, *a, **k: False)
    monkeypatch.setattr(Gate, "status", lambda self, uid: {"status": "REJECTED"})
    r = lockgate("gate", "cancel", "1", "--db", "sqlite:///g.db")
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: update 1 is already decided (REJECTED)"), r.output
    monkeypatch.setattr(Gate, "status", lambda self, uid: {"status": "CANCELLED"})
    again = lockgate("gate", "cancel", "1", "--db", "sqlite:///g.db")
    assert again.exit_code == 0 and "already withdrawn" in again.output, again.output


# -- 12. help as the README writes it -----------------------------------------------------

HELP = [["submit"], ["run"], ["worker"], ["export"], ["cleanup"], ["status"], ["bind"],
        ["quality"], ["tasks", "show"], ["tasks", "retry"], ["tasks", "list"],
        ["gate", "cancel"], ["gate", "status"], ["prompt", "create"], ["dataset", "add"]]


@pytest.mark.parametrize("cmd", HELP, ids=" ".join)
def test_help_shows_upper_case_metavars(cmd: list[str]) -> None:
    text = lockgate(*cmd, "--help").output
    for odd in ("<str>", "<path>", "<float>", "<int>", "list[str]", "INT RANGE"):
        assert odd not in text, (odd, text)
    usage = text.splitlines()[0]
    assert usage.startswith("Usage: lockgate ") and "{" not in usage, usage
    assert not re.search(r"^\s+[a-z_]+ <", text, re.MULTILINE), text  # "file <path>"


def test_arguments_read_as_in_the_readme() -> None:
    assert "Usage: lockgate submit [OPTIONS] FILE\n" in lockgate("submit", "--help").output
    assert "Usage: lockgate bind [OPTIONS] PROMPT DATASET" in lockgate("bind", "--help").output
    r = lockgate("tasks", "show")
    assert r.exit_code == 2 and "Missing argument 'TASK_ID'." in r.output, r.output
    worker = flat(lockgate("worker", "--help").output)
    assert "--pool POOL" in worker and "--lease DURATION" in worker, worker
    submit = flat(lockgate("submit", "--help").output)
    assert "--weight NUMBER" in submit and "--deadline WHEN" in submit, submit


# -- 13. no window for a batch that was not created -----------------------------------------

def test_no_window_is_announced_for_a_batch_that_was_not_created(tmp_path: Path) -> None:
    db = "sqlite:///c.db"
    tasks = write_tasks(tmp_path / "b.jsonl", "a", "b")
    assert lockgate("submit", tasks, "--db", db).exit_code == 0
    r = lockgate("submit", tasks, "--batch", "w1", "--window", "02:00-04:00", "--db", db)
    assert r.exit_code == 0, r.output
    assert "batch 'w1' was not created" in flat(r.output), r.output
    assert "tasks start at its start" not in r.output, r.output
    fresh = lockgate("submit", write_tasks(tmp_path / "n.jsonl", "c"), "--batch", "w2",
                     "--window", "02:00-04:00", "--db", db)
    assert "tasks start at its start" in flat(fresh.output), fresh.output


# -- 14. a negative deadline says why -------------------------------------------------------

def test_a_negative_deadline_says_it_must_not_be_negative(tmp_path: Path) -> None:
    r = lockgate("submit", write_tasks(tmp_path / "b.jsonl", "a"), "--deadline", "-1s",
                 "--db", "sqlite:///c.db")
    assert r.exit_code == 2
    assert "--deadline: '-1s': a deadline given as a duration from now must not be " \
           "negative" in flat(r.output), r.output


# -- 15. submit - ---------------------------------------------------------------------------

def test_submit_dash_points_to_dev_stdin() -> None:
    r = lockgate("submit", "-", "--db", "sqlite:///c.db")
    assert r.exit_code == 2
    text = flat(r.output)
    assert "'-' is not read as standard input" in text and "/dev/stdin" in text, text
    assert "--batch" in text


# -- 16. errors in the user's terms ---------------------------------------------------------

def test_a_missing_endpoint_setting_names_the_table_from_1(tmp_path: Path) -> None:
    """It said "'endpoint.0.name': Field required"."""
    message = refused(tmp_path, '[[endpoint]]\nbase_url = "http://h/v1"\n')
    assert "the 1st [[endpoint]]: 'name': missing: add name = ..." in message, message
    assert "endpoint.0" not in message and "Field required" not in message
    named = refused(tmp_path, '[[endpoint]]\nname = "a"\nbase_url = "http://h/v1"\n'
                              '[[endpoint]]\nname = "b"\nbase_url = "http://h/v1"\n'
                              'max_concurrency = 0\n')
    assert "[[endpoint]] 'b' (the 2nd): 'max_concurrency'" in named, named


def test_timeout_ms_given_as_a_duration_says_it_is_milliseconds() -> None:
    with pytest.raises(SpecError) as info:
        parse_task(task(timeout_ms="20s"))
    assert "timeout_ms is in milliseconds: write 20000" in str(info.value), info.value
    assert "unable to parse string" not in str(info.value)
    with pytest.raises(SpecError, match="a whole number of milliseconds"):
        parse_task(task(timeout_ms="soon"))
    model = parse_task(task(timeout_ms=20000)).model
    assert model is not None and model.timeout_ms == 20000


def test_lockgate_error_is_the_boundary_type() -> None:
    assert issubclass(ConfigError, LockgateError)
