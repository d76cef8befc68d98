"""Review 3 of the configuration and the duration grammar: numbers take the checks text
takes, an endpoint's base_url is an HTTP URL, two spellings of one setting are named,
an empty pool is refused, and each refused duration says the real reason."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

import helpers
import lockgate
from lockgate.cli import app
from lockgate.config import Settings, WorkerSettings, load_settings
from lockgate.durations import parse_duration
from lockgate.errors import ConfigError, SpecError
from lockgate.flow.window import parse_when

refused = helpers.config_refused


# -- numeric durations: the 100-year cap and finiteness ------------------------------

@pytest.mark.parametrize("toml, setting", [
    ("[worker]\nheartbeat_s = inf\n", "worker.heartbeat_s"),
    ("[worker]\npoll_max_s = 1e300\n", "worker.poll_max_s"),
    ("[worker]\nflush_interval_s = inf\n", "worker.flush_interval_s"),
    ("[gate]\npoll_s = inf\n", "gate.poll_s"),
    ("[flow]\nendpoint_down_max_s = 4e9\n", "flow.endpoint_down_max_s"),
    ("[worker]\nshutdown_grace_s = 9223372036854775807\n", "worker.shutdown_grace_s"),
])
def test_a_number_of_seconds_over_a_century_is_refused_like_the_text(
        tmp_path: Path, toml: str, setting: str) -> None:
    """``heartbeat_s = inf`` and ``flush_interval_s = inf`` were accepted (the latter
    made `run` hang at 0/2 finished) while ``"200y"`` and ``"5300w"`` are refused."""
    message = refused(tmp_path, toml)
    assert f"'{setting}'" in message and "must be at most 100 years" in message, message


def test_nan_is_not_a_duration_rather_than_over_a_bound(tmp_path: Path) -> None:
    """``lease_s = nan`` said "nan: must be at most 1d"."""
    message = refused(tmp_path, "[worker]\nlease_s = nan\n")
    assert "'worker.lease_s': nan is not a duration; e.g." in message, message
    assert "at most" not in message


@pytest.mark.parametrize("toml", ["[worker]\nlease_s = -inf\n", "[worker]\nlease_s = -5\n"])
def test_a_negative_number_of_seconds_is_refused_as_negative(tmp_path: Path,
                                                             toml: str) -> None:
    assert "must not be negative" in refused(tmp_path, toml)


def test_numbers_in_range_pass_and_each_settings_own_bounds_still_apply(
        tmp_path: Path) -> None:
    cfg = tmp_path / "lockgate.toml"
    cfg.write_text("[worker]\nheartbeat_s = 7\npoll_max_s = 2.5\nlease_s = 90\n"
                   "[gate]\npoll_s = 0.5\n")
    s = load_settings(cfg)
    assert (s.worker.heartbeat_s, s.worker.poll_max_s, s.worker.lease_s,
            s.gate.poll_s) == (7.0, 2.5, 90.0, 0.5)
    assert "must be at most 1d" in refused(tmp_path, "[worker]\nlease_s = 86401\n")
    assert "must be at least 1s" in refused(tmp_path, "[worker]\nlease_s = 0.5\n")


def test_worker_overrides_take_the_same_checks() -> None:
    """The API's worker overrides (``with_changes``) go through the same validator."""
    with pytest.raises(SpecError, match="at most 100 years") as err:
        WorkerSettings().with_changes(heartbeat_s=float("inf"))
    assert err.value.field == "heartbeat_s"
    with pytest.raises(SpecError, match="at most 100 years"):
        WorkerSettings().with_changes(poll_max_s=10 ** 400)  # beyond a float


# -- the reason a duration is refused ------------------------------------------------

def test_a_400_digit_number_is_over_the_cap_not_negative_and_is_not_echoed_whole() -> None:
    with pytest.raises(SpecError) as err:
        parse_duration("9" * 400, field="older_than")
    message = str(err.value)
    assert "must be at most 100 years" in message and "negative" not in message, message
    assert len(message) < 200, message


def test_the_cli_says_why_400_digits_are_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    lockgate.connect(url).close()
    result = CliRunner().invoke(app, ["cleanup", "--older-than", "9" * 400, "--db", url])
    assert result.exit_code == 2, result.output
    assert "--older-than:" in result.output and "at most 100 years" in result.output
    assert "negative" not in result.output


NOW = datetime(2026, 3, 10, 1, 0, tzinfo=UTC)


@pytest.mark.parametrize("spec, words", [
    ("0s", "must be longer than zero"), ("+0", "must be longer than zero"),
    ("100000d", "must be at most 100 years"),
])
def test_a_deadline_duration_refused_for_its_value_says_why(spec: str, words: str) -> None:
    """``--deadline 0s`` and ``--deadline 100000d`` said "is neither a time nor a
    duration": they are durations, refused for their value."""
    with pytest.raises(SpecError) as err:
        parse_when(spec, NOW)
    assert err.value.field == "deadline"
    assert words in str(err.value) and "neither" not in str(err.value), str(err.value)


def test_a_deadline_that_is_no_duration_is_still_neither() -> None:
    with pytest.raises(SpecError, match="neither a time"):
        parse_when("soon", NOW)


# -- base_url -------------------------------------------------------------------------

@pytest.mark.parametrize("url, words", [
    ("ftp://127.0.0.1:8471/v1", "is not an HTTP URL"),
    ("127.0.0.1:8000/v1", "is not an HTTP URL"),
    ("file:///tmp/sock", "is not an HTTP URL"),
    ("http:///v1", "names no host"),
    ("https://", "names no host"),
    ("http://127.0.0.1:99999/v1", "has an invalid port"),
])
def test_a_base_url_that_is_not_http_is_a_config_error_naming_the_fix(
        tmp_path: Path, url: str, words: str) -> None:
    """``ftp://...`` was accepted, then `run` retried it as a connection error for up
    to endpoint_down_max_s (1 h)."""
    message = refused(tmp_path, f'[[endpoint]]\nname = "a"\nbase_url = "{url}"\n')
    assert "[[endpoint]] 'a' (the 1st): 'base_url'" in message and words in message, message
    assert "http://HOST[:PORT]/PATH or https://" in message


@pytest.mark.parametrize("url", ["https://api.openai.com/v1", "http://127.0.0.1:11434/v1",
                                 "HTTP://LOCALHOST:8000/v1", "http://[::1]:8000/v1",
                                 "https://user:pw@gw.example/v1"])
def test_http_base_urls_pass(tmp_path: Path, url: str) -> None:
    cfg = tmp_path / "lockgate.toml"
    cfg.write_text(f'[[endpoint]]\nname = "a"\nbase_url = "{url}"\n')
    assert load_settings(cfg).endpoint[0].base_url == url


def test_a_base_url_from_the_environment_is_checked_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCKGATE_BASE_URL", "ftp://127.0.0.1:8471/v1")
    with pytest.raises(ConfigError, match=r"\$LOCKGATE_BASE_URL: 'ftp://127.0.0.1:8471/v1' "
                                          r"is not an HTTP URL"):
        Settings().endpoints()
    monkeypatch.setenv("LOCKGATE_BASE_URL", "")  # empty: unset, the default
    assert Settings().endpoints()[0].base_url.startswith("http://127.0.0.1:")


@pytest.mark.parametrize("url, words", [
    ("http:///hook", "names no host"),
    ("ftp://hooks.example/x", "is not an HTTP URL"),
    ("https://hooks.example:0/x", "has an invalid port"),
])
def test_a_webhook_url_is_checked_as_a_base_url_is(tmp_path: Path, url: str,
                                                   words: str) -> None:
    """``http:///hook`` passed a ``^https?://`` pattern, and every delivery then failed
    at send time; ``HTTPS://`` was refused though any client takes it."""
    message = refused(tmp_path, f'[[quality.webhook]]\nurl = "{url}"\n')
    assert "the 1st [[quality.webhook]]: 'url'" in message and words in message, message


def test_a_webhook_url_in_capitals_passes(tmp_path: Path) -> None:
    cfg = tmp_path / "lockgate.toml"
    cfg.write_text('[[quality.webhook]]\nurl = "HTTPS://hooks.example/x"\n')
    assert load_settings(cfg).quality.webhook[0].url == "HTTPS://hooks.example/x"


# -- two spellings of one setting ------------------------------------------------------

def test_both_spellings_of_a_setting_are_named_as_such(tmp_path: Path) -> None:
    """It said "'endpoint.0.timeout': unknown setting; did you mean 'timeout'?"."""
    message = refused(tmp_path, '[[endpoint]]\nname = "a"\nbase_url = "http://h/v1"\n'
                                'timeout = "5s"\ntimeout_s = 3\n')
    assert "did you mean" not in message, message
    assert "'timeout' and 'timeout_s' are spellings of one setting" in message
    assert "keep one" in message


def test_a_misspelt_setting_still_gets_its_suggestion(tmp_path: Path) -> None:
    message = refused(tmp_path, '[[endpoint]]\nname = "a"\nbase_url = "http://h/v1"\n'
                                'timeot_s = 3\n')
    assert "unknown setting; did you mean 'timeout_s'?" in message, message


# -- the pool a worker serves ----------------------------------------------------------

def test_an_empty_pool_is_refused_in_the_config_and_as_an_override(tmp_path: Path) -> None:
    """``pool = ""`` was accepted and `worker --burst` then waited forever."""
    message = refused(tmp_path, '[worker]\npool = ""\n')
    assert "'worker.pool': must not be empty" in message, message
    with pytest.raises(SpecError, match="must not be empty") as err:
        WorkerSettings().with_changes(pool="")
    assert err.value.field == "pool"
    assert WorkerSettings().with_changes(pool="fast").pool == "fast"
