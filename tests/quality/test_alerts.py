"""Quality alerts on real databases: an incident opens one alert, which is updated while
the rule fires, acknowledged without being frozen, resolved when the rule clears, and
kept closed through the cool-down; samples carry the rendered prompt and raw output and
never a secret; the role lease fences an evaluator that lost it; the CLI and API."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time

import orjson
import pytest
from typer.testing import CliRunner

from helpers import rows, scalar, wait_for
from lockgate.app import Lockgate
from lockgate.cli import app
from lockgate.config import Endpoint, QualitySettings, Settings, Webhook
from lockgate.quality.alerts import ROLE, Evaluator, alert_key, get_alert, list_alerts
from lockgate.quality.report import check_rules
from lockgate.spec import canonical_json
from lockgate.store import Store
from lockgate.store.alerts import AlertStore, LeaseLost

from .alerting import HOUR, collapse, feed, settings


def _events(evs: list) -> list[tuple[str, str]]:
    return [(e.event, e.alert.rule) for e in evs]


def test_an_incident_opens_once_is_updated_then_resolves(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="lockgate.quality")
    collapse(store)
    ev = Evaluator(store, settings(), worker_id="w1")
    assert _events(ev.tick()) == [("open", "completeness_collapse")]
    [opened] = [r for r in caplog.records if "OPEN" in r.getMessage()]
    assert opened.levelno == logging.WARNING
    assert "completeness_collapse on p@1 / m" in opened.getMessage()
    [a] = list_alerts(store)
    assert (a.status, a.prompt, a.model, a.subject) == ("OPEN", "p@1", "m", None)
    assert a.value == pytest.approx(0.5) and a.baseline == pytest.approx(1.0)
    assert a.threshold == pytest.approx(0.85) and a.calls == 150
    assert (a.tasks, a.batches, a.batches_exact) == (150, 1, True)
    # still firing: the same alert, its figures follow (no event before update_every)
    assert ev.tick() == []
    feed(store, 50, ago_ms=30_000, completeness=0.5, batch="b2")
    assert ev.tick() == []
    [b] = list_alerts(store)
    assert b.id == a.id and (b.tasks, b.batches, b.calls) == (200, 2, 200)
    assert b.updated_at is not None and a.updated_at is not None
    assert b.updated_at >= a.updated_at
    # the rule clears: resolved once
    feed(store, 600, ago_ms=20_000)
    assert _events(ev.tick()) == [("resolve", "completeness_collapse")]
    [resolved] = [r for r in caplog.records if "RESOLVED" in r.getMessage()]
    assert resolved.levelno == logging.INFO
    assert ev.tick() == []
    assert list_alerts(store) == []
    [c] = list_alerts(store, everything=True)
    assert c.id == a.id and c.status == "RESOLVED" and c.resolved_at is not None


def test_cooldown_keeps_a_resolved_incident_closed(store: Store) -> None:
    collapse(store)
    ev = Evaluator(store, settings(cooldown="1h"), worker_id="w1")
    assert len(ev.tick()) == 1
    feed(store, 600, ago_ms=20_000)
    assert _events(ev.tick()) == [("resolve", "completeness_collapse")]
    feed(store, 2000, ago_ms=10_000, completeness=0.2)  # fires again
    assert [f.rule for f in check_rules(store, QualitySettings()) if f.fired] == [
        "completeness_collapse"]
    assert ev.tick() == []  # within the cool-down
    assert len(list_alerts(store, everything=True)) == 1
    ev.release()
    quick = Evaluator(store, settings(cooldown=0), worker_id="w2")
    assert _events(quick.tick()) == [("open", "completeness_collapse")]
    alerts = list_alerts(store, everything=True)
    assert [a.status for a in alerts] == ["OPEN", "RESOLVED"]


def test_ack_is_a_flag_the_alert_keeps_updating(store: Store, db_url: str) -> None:
    collapse(store)
    ev = Evaluator(store, settings(), worker_id="w1")
    [e] = ev.tick()
    with Lockgate(db_url, migrate=False) as lg:
        a = lg.ack_alert(e.alert.id, actor="ana", reason="looking")
        assert a.acked and a.acked_by == "ana" and a.ack_reason == "looking"
        again = lg.ack_alert(e.alert.id, actor="bob")
        assert again.acked_by == "ana"  # the first ack stays
        feed(store, 40, ago_ms=10_000, completeness=0.5)
        ev.tick()
        b = lg.alert(e.alert.id)
        assert b.status == "OPEN" and b.acked and b.tasks == 190
        feed(store, 800, ago_ms=5_000)
        assert _events(ev.tick()) == [("resolve", "completeness_collapse")]
        assert lg.alert(e.alert.id).status == "RESOLVED"


def test_samples_carry_prompt_and_output_but_no_secret(store: Store,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    monkeypatch.setenv("LG_TEST_API_KEY", "sk-test-0123456789abcdef")
    s = Settings(endpoint=(Endpoint(name="e", base_url="http://127.0.0.1:1/v1",
                                    api_key_env="LG_TEST_API_KEY"),),
                 quality=settings().quality)
    collapse(store, bad=120,
             prompt_snapshot="Label {x}. (key sk-test-0123456789abcdef)",
             raw_output='{"label": "yes", "note": "half"}',
             error_message="upstream http://app:hunter2@llm.internal/v1 said no")
    ev = Evaluator(store, s, worker_id="w1")
    [e] = ev.tick()
    a = get_alert(store, e.alert.id)
    assert len(a.samples) == 100
    for smp in a.samples:
        assert smp.prompt is not None and smp.prompt.startswith("Label ")
        assert smp.raw_output == '{"label": "yes", "note": "half"}'
        assert smp.completeness == pytest.approx(0.5)
        assert smp.batch_id == "b" and smp.task_id.startswith("t")
    stored = orjson.dumps(rows(store, "SELECT * FROM quality_alert_sample")).decode()
    assert "sk-test-0123456789abcdef" not in stored and "hunter2" not in stored
    assert "(key ***)" in stored and "app:***@llm.internal" in stored
    # the healthy baseline's attempts are never samples
    assert {smp.attempt_id for smp in a.samples} <= {
        r["id"] for r in rows(store, "SELECT id FROM task_attempt WHERE completeness < 1")}


def test_drift_samples_are_outputs_without_the_watched_value(store: Store) -> None:
    feed(store, 75, ago_ms=30 * HOUR, label="yes")
    feed(store, 75, ago_ms=30 * HOUR, label="no")
    feed(store, 10, ago_ms=60_000, label="yes")
    feed(store, 140, ago_ms=60_000, label="no")
    ev = Evaluator(store, settings(), worker_id="w1")
    events = ev.tick()
    drift = [e for e in events if e.alert.rule == "semantic_drift"]
    assert [e.alert.subject for e in drift] == ["label=yes"]
    a = get_alert(store, drift[0].alert.id)
    assert len(a.samples) == 100
    assert all(orjson.loads(s.raw_output or "null") == {"label": "no"} for s in a.samples)


def test_one_open_alert_per_incident_whoever_writes(store: Store) -> None:
    """The unique key refuses a second OPEN alert of an incident, even from a writer
    that skipped the lease."""
    key = alert_key("completeness_collapse", "p@1", "m", None)
    row = {"alert_key": key, "rule": "completeness_collapse", "prompt": "p@1",
           "model": "m", "subject": None, "window_s": 1.0, "onset_at": 0, "value": 0.5,
           "baseline": 1.0, "threshold": 0.85, "calls": 1, "tasks": 1, "batches": 1,
           "batches_exact": 1}
    store.transaction(lambda tx: AlertStore.insert_alert(tx, row))
    with pytest.raises(Exception, match=r"(?i)unique|duplicate"):
        store.transaction(lambda tx: AlertStore.insert_alert(tx, row))
    assert scalar(store, "SELECT COUNT(*) FROM quality_alert") == 1


def test_an_evaluator_whose_lease_was_taken_over_writes_nothing(store: Store) -> None:
    collapse(store)
    s = settings(evaluator_lease_s=2.0)
    old = Evaluator(store, s, worker_id="old")
    assert old.claim()
    findings = check_rules(store, s.quality)
    time.sleep(2.2)  # the lease runs out (database clock)
    heir = Evaluator(store, s, worker_id="heir")
    assert heir.claim()
    with pytest.raises(LeaseLost):
        store.transaction(lambda tx: old.apply(tx, findings))
    assert old.tick() == [] and not old.holding
    assert scalar(store, "SELECT COUNT(*) FROM quality_alert") == 0
    assert scalar(store, "SELECT COUNT(*) FROM alert_delivery") == 0
    assert _events(heir.tick()) == [("open", "completeness_collapse")]
    role = AlertStore(store).role(ROLE)
    assert role is not None and role["holder"] == "heir"


def test_a_held_role_is_not_taken(store: Store) -> None:
    a = Evaluator(store, settings(), worker_id="a")
    b = Evaluator(store, settings(), worker_id="b")
    assert a.claim() and not b.claim()
    assert a.claim()  # renewal
    a.release()
    assert b.claim() and not a.claim()


def test_cli_lists_shows_and_acks(store: Store, db_url: str) -> None:
    collapse(store)
    [e] = Evaluator(store, settings(), worker_id="w1").tick()
    run = CliRunner()
    res = run.invoke(app, ["alerts", "list", "--json", "--db", db_url],
                     catch_exceptions=False)
    assert res.exit_code == 0, res.output
    [doc] = orjson.loads(res.stdout)
    assert doc["id"] == e.alert.id and doc["rule"] == "completeness_collapse"
    res = run.invoke(app, ["alerts", "list", "--db", db_url], catch_exceptions=False,
                     terminal_width=80)
    assert res.exit_code == 0 and "completeness" in res.stdout and "OPEN" in res.stdout
    assert max(len(line) for line in res.stdout.splitlines()) <= 80
    res = run.invoke(app, ["alerts", "show", str(e.alert.id), "--json", "--db", db_url],
                     catch_exceptions=False)
    shown = orjson.loads(res.stdout)
    assert len(shown["samples"]) == 100 and shown["samples"][0]["prompt"]
    res = run.invoke(app, ["alerts", "show", str(e.alert.id), "--db", db_url],
                     catch_exceptions=False, terminal_width=80)
    assert res.exit_code == 0 and "100 failing sample(s)" in res.stdout
    res = run.invoke(app, ["alerts", "ack", str(e.alert.id), "--actor", "ana", "--reason",
                           "on it", "--db", db_url], catch_exceptions=False)
    assert res.exit_code == 0 and "acked by ana" in res.stdout
    assert get_alert(store, e.alert.id).ack_reason == "on it"
    res = run.invoke(app, ["alerts", "list", "--all", "--limit", "1", "--db", db_url],
                     catch_exceptions=False)  # as many as the limit: there may be more
    assert res.exit_code == 0 and "larger --limit" in res.stderr
    res = run.invoke(app, ["alerts", "list", "--all", "--limit", "2", "--db", db_url],
                     catch_exceptions=False)
    assert res.exit_code == 0 and "--limit" not in res.stderr
    res = run.invoke(app, ["alerts", "show", "999", "--db", db_url])
    assert res.exit_code == 2 and "no alert 999" in res.output
    res = run.invoke(app, ["quality", "--check", "--json", "--db", db_url],
                     catch_exceptions=False)
    assert res.exit_code == 0
    assert any(f["fired"] for f in orjson.loads(res.stdout))


def test_alert_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="evaluate_every"):
        QualitySettings(evaluate_every="2m", evaluator_lease_s="1m")
    q = QualitySettings(evaluate_every="30s", cooldown="2h")
    assert (q.evaluate_every, q.cooldown) == (30.0, 7200.0)


def test_an_inline_template_alerts_under_its_key_with_its_own_samples(store: Store) -> None:
    ours, other = "Label this: {x}", "Something else: {x}"
    feed(store, 150, ago_ms=30 * HOUR, template=ours)
    feed(store, 150, ago_ms=60_000, completeness=0.5, template=ours, batch="mine")
    feed(store, 150, ago_ms=30 * HOUR, template=other)
    feed(store, 150, ago_ms=50_000, completeness=0.9, template=other, batch="theirs")
    [e] = Evaluator(store, settings(), worker_id="w1").tick()
    key = "inline:" + hashlib.sha256(canonical_json(ours)).hexdigest()[:12]
    assert (e.alert.prompt, e.alert.tasks, e.alert.batches) == (key, 150, 1)
    a = get_alert(store, e.alert.id)
    assert len(a.samples) == 100 and {s.batch_id for s in a.samples} == {"mine"}


def test_a_busier_inline_template_on_the_same_model_leaves_the_samples_to_the_alert(
        store: Store) -> None:
    """The samples and the touched batches were read among the newest attempts of every
    inline template on the model, then filtered: with 2,100 later attempts of another
    template, the collapsing one's alert kept no sample and counted no batch."""
    ours, other = "Label this: {x}", "Classify this other thing: {x}"
    feed(store, 150, ago_ms=30 * HOUR, template=ours)
    feed(store, 150, ago_ms=90_000, completeness=0.5, template=ours, batch="mine")
    feed(store, 2100, ago_ms=60_000, template=other, batch="theirs")
    [e] = Evaluator(store, settings(), worker_id="w1").tick()
    key = "inline:" + hashlib.sha256(canonical_json(ours)).hexdigest()[:12]
    assert (e.alert.prompt, e.alert.tasks, e.alert.batches) == (key, 150, 1)
    a = get_alert(store, e.alert.id)
    assert len(a.samples) == 100 and {s.batch_id for s in a.samples} == {"mine"}


def test_a_worker_runs_the_evaluator(store: Store, db_url: str) -> None:
    collapse(store)
    with Lockgate(db_url, settings=settings(), migrate=False) as lg:
        worker = lg.worker(gate=False)
        loop = asyncio.new_event_loop()
        runner = threading.Thread(target=loop.run_until_complete, args=(worker.run(),))
        runner.start()
        try:
            wait_for(lambda: lg.alerts(), "the worker's evaluator to open the alert",
                     timeout=60)
        finally:
            loop.call_soon_threadsafe(worker.request_stop)
            runner.join(60)
            loop.close()
        [a] = lg.alerts()
        assert a.rule == "completeness_collapse" and len(lg.alert(a.id).samples) == 100
        role = AlertStore(store).role(ROLE)
        assert role is not None and role["holder"] == worker.id
        assert role["lease_until"] <= store.db_now()  # a stopping worker hands it over


def test_update_events_are_spaced_by_update_every(store: Store) -> None:
    hook = (Webhook(name="ops", url="http://127.0.0.1:9/hook"),)
    collapse(store)
    ev = Evaluator(store, settings(update_every="1s", webhook=hook), worker_id="w1")
    assert _events(ev.tick()) == [("open", "completeness_collapse")]
    assert ev.tick() == []  # within update_every
    time.sleep(1.1)
    assert _events(ev.tick()) == [("update", "completeness_collapse")]
    assert [r["event"] for r in rows(store, "SELECT event FROM alert_delivery "
                                            "ORDER BY id")] == ["open", "update"]
    quiet = Evaluator(store, settings(update_every=0, webhook=hook), worker_id="w1",
                      token=ev.token)
    time.sleep(1.1)
    assert quiet.tick() == []


def test_pollution_samples_are_invalid_json_and_its_onset_the_first_minute(
        store: Store) -> None:
    # This minute and the six before: the last five whole minutes are polluted even if
    # a minute turns between the feeding and the tick (with only the six before, a
    # feed at hh:mm:59.9 and a tick at the next minute left the newest whole one empty).
    for m in range(0, 7):
        feed(store, 20, ago_ms=m * 60_000)
        feed(store, 5, ago_ms=m * 60_000, parse_status="invalid_json",
             raw_output="label: yes (sure!)", completeness=0.0)
    [e] = [x for x in Evaluator(store, settings(), worker_id="w1").tick()
           if x.alert.rule == "format_pollution"]
    a = get_alert(store, e.alert.id)
    assert a.value > 0.03 and a.threshold == 0.03 and a.window_s == 300.0
    assert a.onset is not None and a.opened_at is not None
    assert (a.opened_at - a.onset).total_seconds() <= 7 * 60
    assert 25 <= len(a.samples) <= 30 and a.tasks in (100, 125, 150, 175)
    assert {(s.parse_status, s.raw_output) for s in a.samples} == {
        ("invalid_json", "label: yes (sure!)")}


def test_latency_samples_are_the_slowest_calls(store: Store) -> None:
    feed(store, 150, ago_ms=30 * HOUR, latency=100.0)
    for ms in (250.0, 300.0, 900.0):
        feed(store, 60, ago_ms=60_000, latency=ms)
    [e] = Evaluator(store, settings(), worker_id="w1").tick()
    assert e.alert.rule == "performance_degradation"
    a = get_alert(store, e.alert.id)
    lat = sorted((s.latency_ms for s in a.samples), reverse=True)
    assert len(lat) == 100 and lat[:60] == [900.0] * 60 and lat[-1] == 300.0


def test_alerts_false_runs_no_evaluator(db_url: str) -> None:
    with Lockgate(db_url, settings=settings(alerts=False), migrate=False) as lg:
        assert [s.name for s in lg.worker()._services] == ["gate"]
    with Lockgate(db_url, settings=settings(), migrate=False) as lg:
        assert [s.name for s in lg.worker()._services] == ["gate", "quality"]
