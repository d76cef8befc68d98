"""Review 4 of the quality loop: a circuit's alert carries the figures the circuit was
decided on and counts its volume from the onset itself; a resolved alert carries the
figures of the evaluation that cleared it; the CLI's refusals and wording."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from helpers import rows, wait_for
from lockgate import Lockgate
from lockgate.cli import app
from lockgate.config import CircuitSettings, QualitySettings, Settings, Webhook
from lockgate.errors import NotFound
from lockgate.quality.alerts import Evaluator, get_alert, list_alerts
from lockgate.quality.circuit import CircuitEvaluator, set_circuit
from lockgate.quality.writer import RollupWriter
from lockgate.spec import parse_task
from lockgate.states import TaskStatus
from lockgate.store import Finish, Store

from .alerting import collapse, feed

MINUTE = 60_000
HOOK = Webhook(name="ops", url="http://127.0.0.1:9/hook")


def _circuit_settings(**kw: object) -> Settings:
    c = {"prompt": "p", "threshold": 0.9, "window": "3m", "min_calls": 10,
         "probation": "2m", "fallback": "review", **kw}
    return Settings(quality=QualitySettings(evaluate_every=1.0, evaluator_lease_s=30.0,
                                            circuit=(CircuitSettings(**c),),  # type: ignore[arg-type]
                                            webhook=(HOOK,)))


def _resolve_body(store: Store, alert_id: int) -> dict[str, object]:
    [d] = rows(store, "SELECT body FROM alert_delivery WHERE alert_id = :a AND "
                      "event = 'resolve'", a=alert_id)
    return orjson.loads(d["body"])["alert"]  # type: ignore[no-any-return]


# -- 1. a circuit's alert: the figures it was decided on, volume from the onset --------

def test_a_circuit_alert_reports_the_window_that_opened_it_not_one_minute_more(
        store: Store) -> None:
    # window 1m: the circuit opened on the current minute (30 calls at 80%), the alert
    # said 97.1% over 210 calls (the healthy minute before it added: 180 at 100%)
    s = _circuit_settings(threshold=0.98, window="1m", min_calls=15)
    wait_for(lambda: store.db_now() % MINUTE < 30_000, "a fresh minute", timeout=40,
             interval=0.5)
    feed(store, 180, ago_ms=MINUTE, batch="healthy")
    feed(store, 30, ago_ms=0, completeness=0.8, batch="bad")
    assert CircuitEvaluator(store, s.quality, actor="w1").tick() == 1
    [move] = rows(store, "SELECT figures FROM quality_circuit_event WHERE to_state = 'OPEN'")
    decided = orjson.loads(move["figures"])
    assert [m["calls"] for m in decided["minutes"]] == [30]

    Evaluator(store, s, worker_id="w1").tick()
    [a] = list_alerts(store)
    assert a.value == pytest.approx(0.8) and a.calls == 30
    assert a.value < a.threshold
    assert a.onset is not None and int(a.onset.timestamp() * 1000) == \
        decided["minutes"][0]["minute"]
    assert (a.tasks, a.batches) == (30, 1)  # the healthy minute is before the onset


def test_a_circuit_opened_by_hand_mid_minute_counts_tasks_from_its_onset(
        store: Store) -> None:
    # opened by hand at 05:09:27.9, the alert counted the 86 tasks of the whole minute,
    # 11 of which ended after the onset
    s = _circuit_settings()
    wait_for(lambda: 15_000 <= store.db_now() % MINUTE < 40_000, "mid-minute",
             timeout=70, interval=0.2)
    feed(store, 20, ago_ms=12_000, batch="before")  # this minute, before the onset
    set_circuit(store, s.quality, "p", "OPEN", actor="ana", reason="vendor incident")
    feed(store, 5, ago_ms=0, completeness=0.5, batch="after")
    Evaluator(store, s, worker_id="w1").tick()
    [a] = list_alerts(store)
    assert (a.tasks, a.batches) == (5, 1)


# -- 2. a resolved alert carries the figures that cleared it -----------------------------

def test_a_resolved_rule_alert_carries_the_figures_that_cleared_it(store: Store) -> None:
    s = Settings(quality=QualitySettings(evaluate_every=1.0, evaluator_lease_s=30.0,
                                         webhook=(HOOK,)))
    collapse(store)  # 150 calls at 50% against a baseline of 100%
    ev = Evaluator(store, s, worker_id="w1")
    assert [e.event for e in ev.tick()] == ["open"]
    [a] = list_alerts(store)
    assert a.value == pytest.approx(0.5) and a.calls == 150

    feed(store, 700, ago_ms=60_000)  # healthy again: (75 + 700) / 850
    assert [e.event for e in ev.tick()] == ["resolve"]
    r = get_alert(store, a.id)
    assert r.status == "RESOLVED"
    assert r.value == pytest.approx(775 / 850) and r.calls == 850
    assert r.value >= r.threshold == pytest.approx(0.85)
    assert r.baseline == pytest.approx(1.0)
    body = _resolve_body(store, a.id)
    assert body["status"] == "RESOLVED"
    assert body["value"] == pytest.approx(775 / 850) and body["calls"] == 850


def test_a_circuit_alert_closed_by_its_evaluator_resolves_with_the_probes_figures(
        store: Store) -> None:
    s = _circuit_settings()
    wait_for(lambda: store.db_now() % MINUTE < 40_000, "a fresh minute", timeout=30,
             interval=0.5)
    for k in (3, 2, 1):
        feed(store, 20, ago_ms=k * MINUTE, completeness=0.5, batch=f"b{k}")
    circuits = CircuitEvaluator(store, s.quality, actor="w1")
    assert circuits.tick() == 1
    ev = Evaluator(store, s, worker_id="w1")
    assert [e.event for e in ev.tick()] == ["open"]
    [a] = list_alerts(store)
    assert a.value == pytest.approx(0.5)

    # the probes of the minutes after the opening are back (pinned clock: 3 min on)
    feed(store, 20, ago_ms=-2 * MINUTE, batch="probes")
    assert circuits.tick(now=store.db_now() + 3 * MINUTE) == 1
    assert [e.event for e in ev.tick()] == ["resolve"]
    r = get_alert(store, a.id)
    assert r.status == "RESOLVED"
    assert r.value == pytest.approx(1.0) and r.calls == 20
    assert r.value >= r.threshold and r.window_s == pytest.approx(120.0)
    assert _resolve_body(store, a.id)["value"] == pytest.approx(1.0)


def test_a_circuit_alert_closed_by_hand_resolves_with_its_window_now(store: Store) -> None:
    s = _circuit_settings()
    set_circuit(store, s.quality, "p", "OPEN", actor="ana")
    feed(store, 12, ago_ms=0, completeness=0.5, batch="probes")
    ev = Evaluator(store, s, worker_id="w1")
    assert [e.event for e in ev.tick()] == ["open"]
    feed(store, 12, ago_ms=0, batch="mended")
    set_circuit(store, s.quality, "p", "CLOSED", actor="ana")
    assert [e.event for e in ev.tick()] == ["resolve"]
    [r] = list_alerts(store, everything=True)
    assert r.status == "RESOLVED"
    assert r.calls == 24 and r.value == pytest.approx(0.75)


# -- 3. the CLI -------------------------------------------------------------------------

LABELS = ["a", "b", "c", "d", "e", "f"]


def _labelled(store: Store, version: str, n: int = 12) -> None:
    """``n`` tasks of ``version`` answered a minute ago, their labels cycling over six
    enum members (six watched values)."""
    schema = {"type": "object", "properties": {"label": {"enum": LABELS}}}
    store.submit([parse_task({
        "task_id": f"l{i}", "prompt_template": f"@registry:{version}", "input_data": {"x": i},
        "delivery_rule": {"schema": schema}, "retry_policy": {}}) for i in range(n)],
        batch_id="b")
    writer = RollupWriter(store, shard="w")
    now = store.db_now() - 60_000
    done = []
    for i, t in enumerate(store.claim(n, lease_ms=60_000, worker_id="w")):
        result = orjson.dumps({"label": LABELS[i % len(LABELS)]}).decode()
        done.append(Finish(id=t.id, lease_token=t.lease_token, status=TaskStatus.SUCCEEDED,
                           result=result, attempt={
                               "attempt": 1, "outcome": "succeeded", "started_at": now,
                               "latency_ms": 100.0, "endpoint": "e", "model": "m",
                               "prompt_sha256": "h", "prompt_version": version,
                               "input_tokens": 10, "output_tokens": 2,
                               "parse_status": "valid", "completeness": 1.0}))
    store.finish(done, worker_id="w", observe=writer.record)


def _registered(db_url: str) -> None:
    with Lockgate(db_url) as lg:
        lg.prompts.create("labels", [{"role": "user", "content": "{x}"}],
                          model_config={"name": "m"})


def test_quality_takes_a_version_as_anywhere_else_and_refuses_unknown_ones(
        store: Store, db_url: str) -> None:
    # `quality labels@v1` said "no attempts of labels@v1"; `quality labels@9`,
    # `quality --check labels@9` and `quality --check nosuch` said "no attempts" (or
    # "no prompt has the calls a rule needs") with exit 0
    _registered(db_url)
    _labelled(store, "labels@1")
    runner = CliRunner()
    for ref in ("labels@v1", "labels@1", "labels@production"):
        res = runner.invoke(app, ["quality", ref, "--db", db_url, "--since", "1h", "--json"])
        assert res.exit_code == 0, res.output
        assert [(r["prompt"], r["tasks"]) for r in orjson.loads(res.stdout)] == \
            [("labels@1", 12)], ref
    for args in (["labels@9"], ["--check", "labels@9"]):
        res = runner.invoke(app, ["quality", *args, "--db", db_url])
        assert res.exit_code == 2, (args, res.output)
        assert "prompt 'labels' has no version 9" in " ".join(res.stderr.split())
    res = runner.invoke(app, ["quality", "--check", "nosuch", "--db", db_url])
    assert res.exit_code == 2, res.output
    assert "no prompt named 'nosuch'" in " ".join(res.stderr.split())
    # the Python API reads a version as the command does, and refuses the same
    with Lockgate(db_url) as lg:
        assert [r.tasks for r in lg.quality("labels@v1", since="1h")] == [12]
        with pytest.raises(NotFound, match="no version 9"):
            lg.quality("labels@9", since="1h")


def test_the_quality_table_says_when_more_values_are_watched(
        store: Store, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    _registered(db_url)
    _labelled(store, "labels@1")
    res = CliRunner().invoke(app, ["quality", "labels", "--db", db_url, "--since", "1h"])
    assert res.exit_code == 0, res.output
    assert "(+2 more; --json lists all)" in res.stdout
    js = CliRunner().invoke(app, ["quality", "labels", "--db", db_url, "--since", "1h",
                                  "--json"])
    assert len(orjson.loads(js.stdout)[0]["watched"]) == 6


def test_alerts_list_honours_limit_without_all(store: Store, db_url: str) -> None:
    s = Settings(quality=QualitySettings(evaluate_every=1.0, evaluator_lease_s=30.0))
    collapse(store)
    feed(store, 150, ago_ms=30 * 3_600_000, version="q@1")
    feed(store, 150, ago_ms=60_000, completeness=0.5, version="q@1")
    Evaluator(store, s, worker_id="w1").tick()
    assert len(list_alerts(store)) == 2
    res = CliRunner().invoke(app, ["alerts", "list", "--limit", "1", "--json", "--db",
                                   db_url])
    assert res.exit_code == 0, res.output
    [only] = orjson.loads(res.stdout)
    assert only["id"] == max(a.id for a in list_alerts(store))  # the newest
    assert "the newest 1 open alerts" in " ".join(res.stderr.split())


def test_a_circuit_to_review_is_worded_once(store: Store, db_url: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture) -> None:
    # the log said "new tasks go to review review", `circuit list` "review: review"
    monkeypatch.setenv("COLUMNS", "200")
    conf = tmp_path / "lockgate.toml"
    conf.write_text('[[quality.circuit]]\nprompt = "p"\nwindow = "1m"\nmin_calls = 10\n'
                    'fallback = "review"\n', encoding="utf-8")
    s = _circuit_settings(window="1m")
    wait_for(lambda: store.db_now() % MINUTE < 40_000, "a fresh minute", timeout=30,
             interval=0.5)
    feed(store, 20, ago_ms=MINUTE, completeness=0.5)
    with caplog.at_level("WARNING", logger="lockgate.quality"):
        assert CircuitEvaluator(store, s.quality, actor="w1").tick() == 1
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "new tasks go to review," in said and "review review" not in said
    res = CliRunner().invoke(app, ["circuit", "list", "--db", db_url, "--config",
                                   str(conf)])
    assert res.exit_code == 0, res.output
    assert "review: review" not in res.stdout and "review" in res.stdout
