"""The completeness circuit's evaluator on every backend, fed minute rollups through the
real writer: it opens only when every minute of its window is under the threshold,
leaves the fallback's rows out, closes after its probation once the probes are good,
never moves twice under concurrent evaluators, and a process killed mid-move leaves the
row and its history consistent."""

from __future__ import annotations

import itertools
import logging
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from helpers import clean_env, kill_settled, rows, wait_for
from lockgate.cli import app
from lockgate.config import CircuitSettings, QualitySettings, load_settings
from lockgate.errors import ConfigError, StateConflict
from lockgate.quality.circuit import (
    CircuitEvaluator,
    circuit_views,
    probes,
    set_circuit,
    should_close,
    should_open,
)
from lockgate.quality.writer import RollupWriter
from lockgate.results import utc
from lockgate.spec import parse_task
from lockgate.states import TaskStatus
from lockgate.store import Finish, Store
from lockgate.store.circuit import CircuitStore

MINUTE = 60_000
PRIMARY = "labels@2"


def _quality(**kw: Any) -> QualitySettings:
    c = CircuitSettings(**{"prompt": "labels", "threshold": 0.9, "window": "3m",
                           "min_calls": 10, "probation": "2m", "probe_share": 0.1,
                           "fallback_prompt": "labels@1", **kw})
    return QualitySettings(circuit=(c,))


def _task_pk(store: Store) -> int:
    store.submit([parse_task({"task_id": "t", "prompt_template": "@registry:labels",
                              "input_data": {"x": 1}, "retry_policy": {}})], batch_id="b")
    return int(rows(store, "SELECT id FROM task")[0]["id"])


def _land(store: Store, pk: int, minute: int, calls: int, completeness: float, *,
          prompt: str = PRIMARY, endpoint: str = "sim") -> None:
    """``calls`` answered calls of ``prompt`` in ``minute`` (its start, ms), each with
    this field completeness, written into the rollups by the workers' writer."""
    writer = RollupWriter(store, shard="w")
    written = [(Finish(id=pk, lease_token="x", status=TaskStatus.SUCCEEDED), {
        "attempt": 1, "outcome": "succeeded", "started_at": minute + 1000 + i,
        "latency_ms": 10.0, "prompt_sha256": "h", "prompt_version": prompt,
        "parse_status": "valid", "completeness": completeness, "endpoint": endpoint,
        "model": "m"}) for i in range(calls)]
    store.transaction(lambda tx: writer.record(tx, written))


def _minute_with_room(store: Store) -> int:
    """The start of the current minute, once at least 8 s of it are left (so a test's
    minutes do not roll over between its writes and its checks: they take well under a
    second, a few on a loaded machine). A test waits for the next minute one time in
    7.5, for 4 s on average."""
    now = wait_for(lambda: (n := store.db_now()) % MINUTE < 52_000 and n, "a fresh minute",
                   timeout=20, interval=0.1)
    return int(now - now % MINUTE)


def _current_minute(store: Store) -> int:
    """The start of the current minute (database clock)."""
    now = store.db_now()
    return int(now - now % MINUTE)


def _circuit(store: Store) -> dict[str, Any]:
    [row] = rows(store, "SELECT * FROM quality_circuit")
    return row


def _events(store: Store) -> list[dict[str, Any]]:
    return rows(store, "SELECT * FROM quality_circuit_event ORDER BY version")


def test_it_opens_only_when_every_minute_of_the_window_is_under_the_threshold(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    q = _quality()
    ev = CircuitEvaluator(store, q, actor="w1")
    pk = _task_pk(store)
    cur = _minute_with_room(store)
    _land(store, pk, cur - 4 * MINUTE, 50, 0.2)  # before the window
    _land(store, pk, cur - 3 * MINUTE, 50, 1.0)
    _land(store, pk, cur - 2 * MINUTE, 30, 0.5)
    _land(store, pk, cur - 1 * MINUTE, 30, 0.6)
    # the fallback's own rows and a fallback version of the same name are left out
    _land(store, pk, cur - 3 * MINUTE, 500, 0.0, prompt="labels@1")
    assert ev.tick() == 0
    assert _circuit(store)["state"] == "CLOSED" and _events(store) == []

    _land(store, pk, cur - 3 * MINUTE, 200, 0.0)  # 250 calls at 0.2: bad now
    _land(store, pk, cur, 5, 0.0)  # too few calls: the current minute does not count yet
    with caplog.at_level(logging.WARNING, logger="lockgate.quality"):
        assert ev.tick() == 1
    row = _circuit(store)
    assert (row["state"], row["version"], row["manual"], row["changed_by"]) == \
        ("OPEN", 1, 0, "w1")
    [e] = _events(store)
    assert (e["from_state"], e["to_state"], e["version"], e["actor"]) == \
        ("CLOSED", "OPEN", 1, "w1")
    assert "in each of the last 3 minute(s)" in e["reason"]
    assert "completeness circuit 'labels' OPEN" in caplog.text
    assert "fallback_prompt" not in caplog.text and "labels@1" in caplog.text
    [view] = circuit_views(store, q)
    assert view.state == "OPEN" and [m["calls"] for m in view.figures["minutes"]] == \
        [250, 30, 30]
    assert ev.tick() == 0  # open: no probe calls yet, nothing to close on


def test_completeness_exactly_at_the_threshold_neither_opens_nor_keeps_it_open() -> None:
    # 50 outputs of 49 of 50 fields each: their summed mean is 0.9799999999999991, at
    # a threshold of 0.98, not under it. Held strictly, it opened the circuit ("under
    # 98.0% ... (at most 98.0%)") and kept it from closing.
    c = CircuitSettings(prompt="p", threshold=0.98, window="3m", min_calls=20,
                        probation="2m", fallback="review")
    total = 0.0
    for _ in range(50):
        total += 0.98
    now = 10 * MINUTE + 1000
    minutes = {(10 - k) * MINUTE: (50, total, 50) for k in (1, 2, 3)}
    assert should_open(minutes, now, c)[0] is False
    below = {b: (50, total - 0.5, 50) for b in minutes}
    assert should_open(below, now, c)[0] is True
    assert should_close(minutes, now, since=6 * MINUTE, circuit=c)[0] is True
    assert should_close(below, now, since=6 * MINUTE, circuit=c)[0] is False


def test_a_minute_without_enough_calls_keeps_it_closed(store: Store) -> None:
    ev = CircuitEvaluator(store, _quality(), actor="w1")
    pk = _task_pk(store)
    cur = _minute_with_room(store)
    for k in (3, 2, 1):
        _land(store, pk, cur - k * MINUTE, 9 if k == 2 else 40, 0.1)
    assert ev.tick() == 0
    # a fallback endpoint's rows are not the primary path either
    q = _quality(fallback_prompt=None, fallback_endpoint="backup")
    _land(store, pk, cur - 2 * MINUTE, 40, 0.1, endpoint="backup")
    assert CircuitEvaluator(store, q, actor="w1").tick() == 0
    _land(store, pk, cur - 2 * MINUTE, 1, 0.1)
    assert CircuitEvaluator(store, q, actor="w1").tick() == 1


def test_it_closes_after_probation_once_the_probes_are_good(store: Store) -> None:
    q = _quality()
    ev = CircuitEvaluator(store, q, actor="w1")
    pk = _task_pk(store)
    cur = _minute_with_room(store)
    for k in (3, 2, 1):
        _land(store, pk, cur - k * MINUTE, 20, 0.5)
    assert ev.tick() == 1
    # Five minutes pass (the circuit's row and the rollups move back in time together):
    # it has been open longer than its probation of 2.
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE quality_circuit SET since = since - 300000"))
        conn.execute(text("UPDATE quality_rollup SET bucket = bucket - 300000 "
                          "WHERE resolution = 'm'"))
    first = cur - MINUTE  # a whole minute after the opening, within the probation
    _land(store, pk, first, 12, 0.5)  # bad probes
    assert ev.tick() == 0 and _circuit(store)["state"] == "OPEN"
    _land(store, pk, first, 100, 1.0)  # good ones: 112 calls at 0.946
    assert ev.tick() == 1
    row = _circuit(store)
    assert (row["state"], row["version"]) == ("CLOSED", 2)
    assert [(e["from_state"], e["to_state"]) for e in _events(store)] == \
        [("CLOSED", "OPEN"), ("OPEN", "CLOSED")]
    assert "probes back at 94.6% (threshold 90.0%, 112 calls)" in _events(store)[-1]["reason"]
    # closed: the bad minutes before the close no longer count
    assert ev.tick() == 0


def test_concurrent_evaluators_move_it_once(store: Store) -> None:
    q = _quality()
    pk = _task_pk(store)
    cur = _minute_with_room(store)
    for k in (3, 2, 1):
        _land(store, pk, cur - k * MINUTE, 20, 0.5)
    evaluators = [CircuitEvaluator(store, q, actor=f"w{i}") for i in range(8)]
    start = threading.Barrier(len(evaluators))
    moved: list[int] = []

    def run(ev: CircuitEvaluator) -> None:
        start.wait()
        moved.append(ev.tick())

    threads = [threading.Thread(target=run, args=(ev,)) for ev in evaluators]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(moved) == [0] * 7 + [1]
    assert [(e["from_state"], e["to_state"]) for e in _events(store)] == [("CLOSED", "OPEN")]
    assert _circuit(store)["version"] == 1


def test_open_and_close_by_hand(store: Store, tmp_path: Path) -> None:
    q = _quality()
    ev = CircuitEvaluator(store, q, actor="w1")
    pk = _task_pk(store)
    cur = _minute_with_room(store)
    view = set_circuit(store, q, "labels", "OPEN", actor="alice", reason="bad deploy")
    assert (view.state, view.manual, view.changed_by, view.reason) == \
        ("OPEN", True, "alice", "bad deploy")
    with pytest.raises(StateConflict, match="already OPEN"):
        set_circuit(store, q, "labels", "OPEN")
    _land(store, pk, cur - MINUTE, 500, 1.0)
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE quality_circuit SET since = since - 600000"))
    assert ev.tick() == 0  # held by hand: the evaluator leaves it open
    view = set_circuit(store, q, "labels", "CLOSED", actor="bob")
    assert (view.state, view.manual) == ("CLOSED", False)
    with pytest.raises(StateConflict, match="already CLOSED"):
        set_circuit(store, q, "labels", "CLOSED")
    with pytest.raises(ConfigError, match=r"no completeness circuit for prompt 'other'"):
        set_circuit(store, q, "other", "OPEN")
    assert [(e["to_state"], e["actor"]) for e in _events(store)] == \
        [("OPEN", "alice"), ("CLOSED", "bob")]

    cfg = tmp_path / "lockgate.toml"
    cfg.write_text('[[quality.circuit]]\nprompt = "labels"\nfallback = "review"\n')
    url = store.engine.url.render_as_string(hide_password=False)

    def cli(*args: str) -> Any:
        return CliRunner().invoke(app, [*args, "--db", url, "--config", str(cfg)],
                                  catch_exceptions=False)

    result = cli("circuit", "open", "labels", "--actor", "carol", "--reason", "drill")
    assert result.exit_code == 0 and "is OPEN: new tasks go to review" in result.output
    [listed] = orjson.loads(cli("circuit", "list", "--json").stdout)
    assert (listed["state"], listed["manual"], listed["changed_by"], listed["fallback"]) == \
        ("OPEN", True, "carol", "review")
    assert "completeness circuits" in cli("circuit", "list").stdout
    again = cli("circuit", "open", "labels")
    assert again.exit_code == 2 and "already OPEN" in again.output
    assert cli("circuit", "close", "labels").exit_code == 0
    unknown = cli("circuit", "close", "nope")
    assert unknown.exit_code == 2 and "[[quality.circuit]]" in unknown.output
    assert _circuit(store)["version"] == 4


@pytest.mark.parametrize(("toml", "message"), [
    ('prompt = "a"', "needs exactly one of fallback_prompt, fallback_endpoint or "
                     'fallback = "review" (got none)'),
    ('prompt = "a"\nfallback = "review"\nfallback_endpoint = "x"',
     "(got fallback_endpoint, fallback)"),
    ('prompt = "a"\nfallback_prompt = "b"', "fallback_prompt must be a pinned registry "
                                             "version, name@N (got 'b')"),
    ('prompt = "a"\nfallback_endpoint = "zz"', "falls back to endpoint 'zz', which is not "
                                                "defined"),
    ('prompt = "a"\nfallback = "review"\nwindow = "10s"',
     "the 1st [[quality.circuit]]: 'window'"),
])
def test_a_wrong_circuit_is_one_line_naming_it(tmp_path: Path, toml: str,
                                               message: str) -> None:
    path = tmp_path / "lockgate.toml"
    path.write_text(f"[[quality.circuit]]\n{toml}\n")
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_probing_is_a_stable_share_of_task_ids() -> None:
    c = CircuitSettings(prompt="labels", fallback="review", probe_share=0.05)
    chosen = [i for i in range(20_000) if probes(f"t-{i}", c)]
    assert 800 < len(chosen) < 1200
    assert chosen == [i for i in range(20_000) if probes(f"t-{i}", c)]
    assert not any(probes(f"t-{i}", c.model_copy(update={"probe_share": 0.0}))
                   for i in range(1000))


#: A process that moves the circuit as fast as it can: the evaluator opens it (the
#: current minute is bad), an operator holds it open, then closes it, and again.
_SWITCHER = textwrap.dedent("""
    import sys
    from lockgate.config import CircuitSettings, QualitySettings
    from lockgate.errors import StateConflict
    from lockgate.quality.circuit import CircuitEvaluator, set_circuit
    from lockgate.store import Store

    store = Store(sys.argv[1])
    q = QualitySettings(circuit=(CircuitSettings(
        prompt="labels", fallback="review", window="1m", min_calls=10, threshold=0.9),))
    ev = CircuitEvaluator(store, q, actor="evaluator")
    print("ready", flush=True)
    while True:
        ev.tick()
        for state in ("OPEN", "CLOSED"):
            try:
                set_circuit(store, q, "labels", state, actor="operator")
            except StateConflict:
                pass
""")


@pytest.mark.slow
def test_a_process_killed_mid_switch_leaves_one_consistent_state(
        store: Store, tmp_path: Path) -> None:
    url = store.engine.url.render_as_string(hide_password=False)
    pk = _task_pk(store)
    # No wait for room: should the minute roll over, the next one is just as bad.
    cur = _current_minute(store)
    for k in range(5):  # this minute and the next ones are bad
        _land(store, pk, cur + k * MINUTE, 20, 0.2)
    for round_ in range(3):
        before = len(_events(store))
        proc = subprocess.Popen([sys.executable, "-c", _SWITCHER, url],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                env=clean_env())
        try:
            assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
            wanted = before + 5 + 7 * round_
            wait_for(lambda: len(_events(store)) >= wanted,  # noqa: B023 (used at once)
                     "the process to switch the circuit", timeout=60)
            time.sleep(0.01 * round_)  # land the kill at other points of the loop
            kill_settled(proc, store)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        row = _circuit(store)
        events = _events(store)
        assert [e["version"] for e in events] == list(range(1, len(events) + 1))
        assert row["version"] == len(events)
        assert row["state"] == events[-1]["to_state"]
        assert all(a["to_state"] == b["from_state"] for a, b in itertools.pairwise(events))
        assert not row["manual"] or row["state"] == "OPEN"
        assert {e["actor"] for e in events} == {"evaluator", "operator"}
    # and the circuit still moves afterwards
    q = QualitySettings(circuit=(CircuitSettings(prompt="labels", fallback="review"),))
    state = _circuit(store)["state"]
    set_circuit(store, q, "labels", "CLOSED" if state == "OPEN" else "OPEN")
    assert CircuitStore(store).rows()[0]["labels"].version == len(_events(store))


def _land_at(store: Store, pk: int, starts: list[int], completeness: float) -> None:
    """Answered calls of the primary started at ``starts`` (ms), written into the
    rollups by the workers' writer."""
    writer = RollupWriter(store, shard="w")
    written = [(Finish(id=pk, lease_token="x", status=TaskStatus.SUCCEEDED), {
        "attempt": 1, "outcome": "succeeded", "started_at": s, "latency_ms": 10.0,
        "prompt_sha256": "h", "prompt_version": PRIMARY, "parse_status": "valid",
        "completeness": completeness, "endpoint": "sim", "model": "m"}) for s in starts]
    store.transaction(lambda tx: writer.record(tx, written))


def test_a_close_counts_only_the_minutes_that_start_after_it(store: Store) -> None:
    # Closed by hand at 20:26:29 once the primary was mended, the circuit opened again a
    # second later on the minute 20:26:00, whose calls were made before the close.
    pk = _task_pk(store)
    # a close at least 2 s into its minute: calls of that minute can precede it
    wait_for(lambda: 2_000 <= store.db_now() % MINUTE <= 50_000, "a minute under way",
             timeout=20, interval=0.05)
    ev = CircuitEvaluator(store, _quality(window="2m"), actor="w1")
    one = CircuitEvaluator(store, _quality(window="1m"), actor="w1")
    set_circuit(store, _quality(), "labels", "OPEN", actor="ana", reason="incident")
    set_circuit(store, _quality(), "labels", "CLOSED", actor="bob", reason="primary fixed")
    since = _circuit(store)["since"]
    close_minute = since - since % MINUTE
    assert since - close_minute >= 1_000  # the precondition waited for above
    before = [since - 1 - i for i in range(50)]  # all in the close's minute, before it
    _land_at(store, pk, before, 0.2)
    assert min(before) >= close_minute
    # within the close's minute, the window of one minute is that minute: not counted
    assert one.tick(now=since + 1) == 0
    assert one.tick(now=close_minute + MINUTE - 1) == 0
    # a minute later, bad calls after the close: the window of two is that minute and
    # the close's: still not counted
    _land_at(store, pk, [close_minute + MINUTE + 1_000 + i for i in range(50)], 0.3)
    assert ev.tick(now=close_minute + MINUTE + 30_000) == 0
    assert _circuit(store)["state"] == "CLOSED"
    # the primary still bad in the next minute: two whole minutes after the close open it
    _land_at(store, pk, [close_minute + 2 * MINUTE + 1_000 + i for i in range(50)], 0.3)
    assert ev.tick(now=close_minute + 2 * MINUTE + 30_000) == 1
    row = _circuit(store)
    assert (row["state"], row["changed_by"]) == ("OPEN", "w1")
    looked = orjson.loads(row["figures"])["minutes"]
    assert [m["minute"] for m in looked] == [close_minute + MINUTE,
                                             close_minute + 2 * MINUTE]
    assert all(m["minute"] >= since for m in looked)


def test_holding_an_open_circuit_by_hand_keeps_its_episode(store: Store,
                                                           tmp_path: Path) -> None:
    q = _quality()
    ev = CircuitEvaluator(store, q, actor="w1")
    pk = _task_pk(store)
    cur = _minute_with_room(store)
    for k in (3, 2, 1):
        _land(store, pk, cur - k * MINUTE, 20, 0.5)
    assert ev.tick() == 1
    opened = _circuit(store)
    cfg = tmp_path / "lockgate.toml"
    cfg.write_text('[[quality.circuit]]\nprompt = "labels"\nfallback = "review"\n')
    url = store.engine.url.render_as_string(hide_password=False)
    result = CliRunner().invoke(app, ["circuit", "open", "labels", "--actor", "carol",
                                      "--reason", "hold it", "--db", url, "--config",
                                      str(cfg)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "was already OPEN" in result.output and "now held by hand" in result.output
    held = _circuit(store)
    assert (held["state"], held["manual"], held["changed_by"]) == ("OPEN", 1, "carol")
    figures = orjson.loads(held["figures"])
    # the figures it opened on, the move that opened it (its episode) and when
    assert figures["minutes"] == orjson.loads(opened["figures"])["minutes"]
    assert (figures["episode"], figures["opened_at"]) == (opened["version"],
                                                          opened["since"])
    assert held["reason"].startswith("hold it (opened: completeness under")
    [view] = circuit_views(store, q)
    assert view.manual and view.since == utc(opened["since"])  # open since it opened
    assert [(e["from_state"], e["to_state"], e["actor"]) for e in _events(store)] == \
        [("CLOSED", "OPEN", "w1"), ("OPEN", "OPEN", "carol")]
    with pytest.raises(StateConflict, match=r"already OPEN \(held by hand\)"):
        set_circuit(store, q, "labels", "OPEN")
    # held: good probes do not close it
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE quality_circuit SET since = since - 600000"))
    _land(store, pk, cur, 100, 1.0)
    assert ev.tick() == 0 and _circuit(store)["state"] == "OPEN"
