"""``lockgate submit --window/--cron/--weight/--deadline``, ``worker --pool`` and the
flow part of ``lockgate status``."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner, Result

import lockgate.cli.queue as queue
from lockgate.cli import app
from lockgate.store import Store
from lockgate.store.flow import BucketSpec, FlowStore

from .support import rows, tasks


def lockgate(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def write(path: Path, n: int, prefix: str = "t") -> Path:
    path.write_bytes(b"".join(orjson.dumps(t) + b"\n" for t in tasks(n, prefix=prefix)))
    return path


CONFIG = """
[[endpoint]]
name = "hosted"
base_url = "http://127.0.0.1:9/v1"
rpm = 60
limit_window_s = 60
pool = "fast"
fallback = "local"
timeout = 30

[[endpoint]]
name = "local"
base_url = "http://127.0.0.1:9/v1"
pool = "slow"
"""


def test_submit_with_a_window_weight_and_pool_routing(db_url: str, store: Store,
                                                      tmp_path: Path) -> None:
    cfg = tmp_path / "lockgate.toml"
    cfg.write_text(CONFIG)
    f = write(tmp_path / "night.jsonl", 30)
    r = lockgate("submit", f, "--db", db_url, "--config", cfg, "--window", "02:00-03:30",
                 "--weight", "10")
    assert r.exit_code == 0, r.output
    said = " ".join(r.output.split())
    assert "window" in said and "paced to finish inside it" in said
    (b,) = rows(store, "SELECT base_weight, window_start, window_end, target_per_s, "
                       "deadline_at FROM batch WHERE id = 'night'")
    assert b["base_weight"] == 10.0
    assert b["window_end"] - b["window_start"] == 90 * 60 * 1000
    assert b["target_per_s"] == 30 / 5400  # tasks / window length
    assert b["deadline_at"] == b["window_end"]
    start = datetime.fromtimestamp(b["window_start"] / 1000).astimezone()
    assert (start.hour, start.minute) == (2, 0)
    # Routed by model_config.name: no endpoint lists it, so the first endpoint's pool;
    # tasks become visible at the window's start (or now, if it is already open).
    for r in rows(store, "SELECT pool, visible_at, created_at FROM task"):
        assert r["pool"] == "fast"
        assert r["visible_at"] == max(b["window_start"], r["created_at"])

def test_submit_with_cron_and_deadline(db_url: str, store: Store, tmp_path: Path) -> None:
    f = write(tmp_path / "nightly.jsonl", 5)
    r = lockgate("submit", f, "--db", db_url, "--cron", "30 2 * * *", "--duration", "45m",
                 "--target", "3")
    assert r.exit_code == 0, r.output
    (b,) = rows(store, "SELECT window_start, window_end, target_per_s FROM batch")
    assert b["window_end"] - b["window_start"] == 45 * 60 * 1000
    assert b["target_per_s"] == 3.0
    start = datetime.fromtimestamp(b["window_start"] / 1000).astimezone()
    assert (start.hour, start.minute) == (2, 30)
    g = write(tmp_path / "urgent.jsonl", 2, prefix="u")
    assert lockgate("submit", g, "--db", db_url, "--deadline", "+30m").exit_code == 0
    (u,) = rows(store, "SELECT deadline_at, window_start FROM batch WHERE id = 'urgent'")
    assert u["window_start"] is None and u["deadline_at"] > store.db_now()


def test_a_deadline_is_placed_on_the_database_clock(
        db_url: str, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A submitting machine whose clock is 10 minutes fast stored ``--deadline 2h`` as
    2 h 10 min ahead on the clock workers read (the database's)."""

    class Fast(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return super().now(tz) + timedelta(minutes=10)

    monkeypatch.setattr(queue, "datetime", Fast)
    f = write(tmp_path / "urgent.jsonl", 2)
    before = store.db_now()
    r = lockgate("submit", f, "--db", db_url, "--deadline", "2h")
    assert r.exit_code == 0, r.output
    after = store.db_now()
    (b,) = rows(store, "SELECT deadline_at FROM batch WHERE id = 'urgent'")
    hours2 = 2 * 3600 * 1000
    assert before + hours2 - 1000 <= b["deadline_at"] <= after + hours2 + 1000


def test_bad_window_options_are_refused_with_the_reason(db_url: str, tmp_path: Path) -> None:
    f = write(tmp_path / "x.jsonl", 1)
    for args, words in (
            (["--window", "25:00-26:00"], "--window: '25:00-26:00' has an hour above 23"),
            (["--cron", "0 2 * * *"], "--duration: is needed with a cron start"),
            (["--window", "01:00-02:00", "--cron", "0 2 * * *", "--duration", "1h"],
             "not both"),
            (["--target", "5"], "--target: goes with a window or a cron start"),
            (["--cron", "0 2 * * *", "--duration", "soon"], "--duration: 'soon' is not a "
                                                            "duration"),
            (["--deadline", "soon"], "--deadline: 'soon' is neither a time")):
        r = lockgate("submit", f, "--db", db_url, *args)
        assert r.exit_code == 2 and words in " ".join(r.output.split()), r.output


def test_status_shows_endpoints_and_warns_of_an_infeasible_window(
        db_url: str, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    cfg = tmp_path / "lockgate.toml"
    cfg.write_text(CONFIG)
    f = write(tmp_path / "big.jsonl", 200)
    # 200 tasks in under 2 minutes need over 1.6/s; the endpoint allows 60/min (1/s).
    now = datetime.now().astimezone()
    spec = f"{now:%H:%M}-{now + timedelta(minutes=2):%H:%M}"
    assert lockgate("submit", f, "--db", db_url, "--config", cfg, "--window", spec
                    ).exit_code == 0
    FlowStore(store).ensure([BucketSpec("hosted", "endpoint", 60, None, 60_000),
                             BucketSpec("local", "endpoint", None, None, 60_000)])
    FlowStore(store).pause("hosted", 30_000, "rate_limited")
    r = lockgate("status", "--db", db_url, "--config", cfg)
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "endpoints" in text and "hosted" in text and "(rate_limited)" in text
    assert "windows" in text and "window big: infeasible" in text
    js = lockgate("status", "--db", db_url, "--config", cfg, "--json")
    doc = orjson.loads(js.stdout)
    (w,) = doc["flow"]["windows"]
    assert w["feasible"] is False and w["capacity_per_s"] < w["required_per_s"]
    hosted = next(e for e in doc["flow"]["endpoints"] if e["endpoint"] == "hosted")
    assert hosted["pool"] == "fast" and hosted["fallback"] == "local"
    assert hosted["paused_s"] > 20


def test_a_window_submitted_the_evening_before_summer_time_is_at_its_wall_time(
        db_url: str, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The command placed tomorrow's window with today's offset (a fixed zone from
    # astimezone()): submitted at 23:30 before the clocks went on, 04:00-05:00 was
    # stored as 05:00-06:00.
    class Evening(datetime):
        @classmethod
        def now(cls, tz: object = None) -> Evening:  # type: ignore[override]
            return cls(2026, 3, 28, 23, 30)

    monkeypatch.setenv("TZ", "Europe/Berlin")
    time.tzset()
    monkeypatch.setattr(queue, "datetime", Evening)
    try:
        r = lockgate("submit", write(tmp_path / "dst.jsonl", 3), "--db", db_url,
                     "--window", "04:00-05:00")
        assert r.exit_code == 0, r.output
        (b,) = rows(store, "SELECT window_start, window_end FROM batch WHERE id = 'dst'")
        assert [datetime.fromtimestamp(b[k] / 1000).hour
                for k in ("window_start", "window_end")] == [4, 5]
    finally:
        monkeypatch.undo()
        time.tzset()
