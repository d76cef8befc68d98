"""The one duration grammar (lockgate.durations): flags and config files alike."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lockgate.config import load_settings
from lockgate.durations import format_duration, parse_duration
from lockgate.errors import ConfigError, SpecError


@pytest.mark.parametrize("text, seconds", [
    ("90", 90), ("1.5", 1.5), ("250ms", 0.25), ("45s", 45), ("90m", 5400),
    ("1h30m", 5400), ("1.5h", 5400), ("30d", 30 * 86400), ("2w", 14 * 86400),
    ("1d12h", 36 * 3600), ("1h 30m", 5400), ("1H30m", 5400), ("0", 0), (".5s", 0.5),
])
def test_every_form_of_the_grammar(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text, words", [
    ("soon", "not a duration"), ("-1d", "must not be negative"), ("30m1h", "larger units"),
    ("1h1h", "larger units"), ("5x", "not a duration"), ("", "not a duration"),
    ("h", "not a duration"), ("1h 30", "not a duration"),
])
def test_what_is_not_a_duration_is_refused_naming_the_field(text: str, words: str) -> None:
    with pytest.raises(SpecError, match=words) as err:
        parse_duration(text, field="older_than")
    assert err.value.field == "older_than"
    assert "e.g." in str(err.value) or "negative" in str(err.value)


def test_zero_is_refused_where_a_duration_must_pass() -> None:
    with pytest.raises(SpecError, match="longer than zero"):
        parse_duration("0s", allow_zero=False)


@given(st.integers(min_value=0, max_value=10**8))
def test_format_reads_back(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


def test_config_settings_in_seconds_take_the_grammar(tmp_path: object) -> None:
    from pathlib import Path

    cfg = Path(str(tmp_path)) / "lockgate.toml"
    cfg.write_text('[worker]\nlease_s = "1m30s"\nshutdown_grace_s = "2m"\n'
                   'flush_interval_s = "20ms"\n[gate]\nrefresh_s = "500ms"\n')
    s = load_settings(cfg)
    assert (s.worker.lease_s, s.worker.shutdown_grace_s, s.worker.flush_interval_s) == (
        90.0, 120.0, 0.02)
    assert s.gate.refresh_s == 0.5
    cfg.write_text('[worker]\nlease_s = "soon"\n')
    with pytest.raises(ConfigError, match=r"worker\.lease_s") as err:
        load_settings(cfg)
    assert "not a duration" in str(err.value)


@pytest.mark.parametrize("text", ["5300w", "99999999999w", "3000000d", "1e400",
                                  "99999999999999999999"])
def test_a_duration_beyond_a_century_is_refused_by_name(text: str) -> None:
    """``--older-than 99999999999w`` overflowed SQLite's integer and ``--deadline
    3000000d`` a date, each as a traceback: refused here, as every other bad value."""
    with pytest.raises(SpecError, match=r"at most 100 years|not a duration") as err:
        parse_duration(text, field="older_than")
    assert err.value.field == "older_than"
    assert parse_duration("5200w") == 5200 * 604800


def test_true_and_false_are_not_durations_in_a_config(tmp_path: object) -> None:
    """``lease_s = true`` was taken as 1 s and ``shutdown_grace_s = false`` as 0, while
    ``--older-than true`` is refused: one grammar refuses both."""
    from pathlib import Path

    cfg = Path(str(tmp_path)) / "lockgate.toml"
    for line in ("[worker]\nlease_s = true\n", "[worker]\nshutdown_grace_s = false\n"):
        cfg.write_text(line)
        with pytest.raises(ConfigError, match=r"worker\.\w+_s") as err:
            load_settings(cfg)
        assert "not a duration" in str(err.value)
