"""Workers with different configurations on one database (a rolling change): the
evaluator role passes between them, and each one resolves only the alerts it can judge;
the events reach the webhooks the alert's earlier events went to, and a sender leaves
the deliveries of a webhook it does not know to a sender that knows it."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest

from helpers import rows
from lockgate.config import CircuitSettings, QualitySettings, Settings, Webhook
from lockgate.quality.alerts import Evaluator, list_alerts, waiting_deliveries
from lockgate.quality.circuit import CIRCUIT_RULE, set_circuit
from lockgate.quality.webhooks import Sender
from lockgate.store import Store, schema

from .alerting import Receiver, collapse, settings

SECRET = b"whsec-rolling"


def _events(evs: list) -> list[tuple[str, str]]:
    return [(e.event, e.alert.rule) for e in evs]


def _circuit(**kw: object) -> CircuitSettings:
    return CircuitSettings(**{"prompt": "cx", "threshold": 0.9, "window": "2m",
                              "min_calls": 5, "probation": "2m", "probe_share": 0.1,
                              "fallback": "review", **kw})


def _with_circuit(circuit: CircuitSettings | None = None, **kw: object) -> Settings:
    return Settings(quality=QualitySettings(
        evaluate_every=1.0, evaluator_lease_s=30.0, circuit=(circuit or _circuit(),),
        webhook=(Webhook(name="ops", url="http://127.0.0.1:9/hook"),), **kw))


def _turn(store: Store, s: Settings, who: str) -> Evaluator:
    """The evaluator of a worker that takes the role (the previous holder released)."""
    ev = Evaluator(store, s, worker_id=who)
    assert ev.claim(), f"{who} takes the role"
    return ev


def _sent(store: Store) -> list[tuple[int, str, str]]:
    return [(int(d["alert_id"]), d["event"], d["target"]) for d in rows(
        store, "SELECT alert_id, event, target FROM alert_delivery ORDER BY id")]


def test_a_holder_without_the_circuit_keeps_its_alert_until_the_circuit_closes(
        store: Store) -> None:
    """Worker A has the circuit `cx` and the webhook `ops`, worker B neither. B held the
    role while the circuit was still OPEN and resolved A's alert (it found no finding
    for it); A, back, opened a second alert for the same incident, and `ops` got two
    opens and never a resolve (B knows no webhook: no delivery row was written)."""
    a_cfg, b_cfg = _with_circuit(), settings()
    set_circuit(store, a_cfg.quality, "cx", "OPEN", actor="t", reason="probe")
    a = _turn(store, a_cfg, "A")
    assert _events(a.tick()) == [("open", CIRCUIT_RULE)]
    [first] = list_alerts(store)
    a.release()

    b = _turn(store, b_cfg, "B")
    assert b.tick() == []  # the circuit is still OPEN: not B's to resolve
    assert [x.status for x in list_alerts(store, everything=True)] == ["OPEN"]
    b.release()

    a = _turn(store, a_cfg, "A")
    assert a.tick() == []  # the same incident: no second alert
    [still] = list_alerts(store, everything=True)
    assert (still.id, still.status) == (first.id, "OPEN")
    a.release()

    # the circuit closes while B holds the role: B resolves the alert, and its resolve
    # goes to the webhook the open went to, though B's configuration names none
    set_circuit(store, a_cfg.quality, "cx", "CLOSED", actor="t")
    b = _turn(store, b_cfg, "B")
    assert _events(b.tick()) == [("resolve", CIRCUIT_RULE)]
    assert _sent(store) == [(first.id, "open", "ops"), (first.id, "resolve", "ops")]


def test_a_holder_with_another_fallback_keeps_the_episodes_one_alert(store: Store) -> None:
    """Changing the circuit's fallback changes its alert's subject: the new holder must
    update the episode's alert, not open a second one."""
    a_cfg = _with_circuit()
    b_cfg = _with_circuit(_circuit(fallback=None, fallback_prompt="cx-safe@1"))
    set_circuit(store, a_cfg.quality, "cx", "OPEN", actor="t")
    a = _turn(store, a_cfg, "A")
    assert _events(a.tick()) == [("open", CIRCUIT_RULE)]
    a.release()
    b = _turn(store, b_cfg, "B")
    assert b.tick() == []
    [alert] = list_alerts(store, everything=True)
    assert (alert.status, alert.subject) == ("OPEN", "to review")
    # closed and opened again: the episode's alert resolves, the new one opens (once)
    b.release()
    set_circuit(store, a_cfg.quality, "cx", "CLOSED", actor="t")
    set_circuit(store, a_cfg.quality, "cx", "OPEN", actor="t")
    b = _turn(store, b_cfg, "B")
    assert sorted(_events(b.tick())) == [("open", CIRCUIT_RULE), ("resolve", CIRCUIT_RULE)]
    assert b.tick() == []
    assert [x.status for x in list_alerts(store, everything=True)] == ["OPEN", "RESOLVED"]


def test_a_holder_with_other_rule_settings_leaves_the_alert_it_does_not_fire_on(
        store: Store) -> None:
    """A fires completeness_collapse (drop 15%: bound 0.85, completeness 0.5), B's looser
    setting (drop 60%: bound 0.4) does not: B resolved A's alert, and A, back, could not
    open it again for the cool-down (or opened a second alert for the incident)."""
    a_cfg, b_cfg = settings(), settings(completeness_drop=0.6)
    collapse(store)
    a = _turn(store, a_cfg, "A")
    assert _events(a.tick()) == [("open", "completeness_collapse")]
    a.release()
    b = _turn(store, b_cfg, "B")
    assert b.tick() == []
    b.release()
    a = _turn(store, a_cfg, "A")
    assert a.tick() == []
    [alert] = list_alerts(store, everything=True)
    assert alert.status == "OPEN" and alert.threshold == pytest.approx(0.85)
    a.release()
    # a holder whose own rule fires on it updates it, and judges it from then on
    c_cfg = settings(completeness_drop=0.3)
    c = _turn(store, c_cfg, "C")
    assert c.tick() == []
    [alert] = list_alerts(store, everything=True)
    assert alert.status == "OPEN" and alert.threshold == pytest.approx(0.7)
    c.release()
    # once the settings that judge it have not updated it for a whole window, they are
    # gone: the holder there is judges it
    b = _turn(store, b_cfg, "B")
    assert b.tick() == []
    old = store.db_now() - int(b_cfg.quality.window * 1000) - 1000
    with store.engine.begin() as conn:
        conn.execute(schema.quality_alert.update().values(updated_at=old))
    assert _events(b.tick()) == [("resolve", "completeness_collapse")]


def test_a_sender_leaves_the_deliveries_of_a_webhook_it_does_not_know(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    """The webhook `ops` renamed `ops2` (same URL): B's sender claimed the pending `ops`
    deliveries and marked them FAILED ("no webhook named 'ops'"); and many of them, due
    first, filled its claims. They stay PENDING, untouched, for a sender that knows
    `ops`, and B's own deliveries go out."""
    rec = Receiver(SECRET).start()
    try:
        old_q = settings(webhook=(rec.webhook(name="ops"),)).quality
        new_q = settings(webhook=(rec.webhook(name="ops2"),)).quality
        now = store.db_now()
        with store.engine.begin() as conn:
            conn.execute(schema.alert_delivery.insert(), [
                {"delivery_id": f"d{k:02d}", "alert_id": k, "event": "open",
                 "target": "ops2" if k == 10 else "ops",
                 "body": orjson.dumps({"n": k}).decode(), "status": "PENDING",
                 "next_at": now - 1000 + k, "created_at": now - 60_000}
                for k in range(11)])
        sender = Sender(store, new_q, batch=4)
        assert asyncio.run(sender.pass_once()) == 1
        assert [orjson.loads(r.body)["n"] for r in rec.got] == [10]
        assert asyncio.run(sender.pass_once()) == 0  # nothing it knows is due
        left = rows(store, "SELECT status, attempts, last_error FROM alert_delivery "
                           "WHERE target = 'ops'")
        assert len(left) == 10
        assert all((d["status"], d["attempts"], d["last_error"]) == ("PENDING", 0, None)
                   for d in left)
        # how long they wait is seen
        [waiting] = waiting_deliveries(store)
        assert waiting["target"] == "ops" and waiting["pending"] == 10
        assert waiting["oldest_s"] >= 59
        caplog.set_level(logging.WARNING, logger="lockgate.quality")
        assert [w["target"] for w in sender.report_strangers()] == ["ops"]
        assert any("'ops'" in r.getMessage() and "10 deliver" in r.getMessage()
                   for r in caplog.records)
        # a sender that knows `ops` delivers them
        old = Sender(store, old_q, batch=20)
        assert sum(asyncio.run(old.pass_once()) for _ in range(4)) == 10  # 4 at once
        assert {d["status"] for d in rows(store, "SELECT status FROM alert_delivery")} \
            == {"DELIVERED"}
        assert waiting_deliveries(store) == []
    finally:
        rec.stop()


def test_status_shows_the_deliveries_waiting_over_a_minute_per_webhook(
        store: Store, db_url: str) -> None:
    from typer.testing import CliRunner

    from lockgate.cli import app

    now = store.db_now()
    with store.engine.begin() as conn:
        conn.execute(schema.alert_delivery.insert(), [
            {"delivery_id": f"w{k}", "alert_id": 1, "event": "open", "target": target,
             "body": "{}", "status": "PENDING", "next_at": now, "created_at": created}
            for k, (target, created) in enumerate([
                ("ops", now - 600_000), ("ops", now - 5_000), ("fresh", now - 5_000)])])
    runner = CliRunner()
    result = runner.invoke(app, ["status", "--db", db_url])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())  # (said on stderr, beside the tables)
    assert "webhook 'ops': 2 alert deliveries waiting, the oldest 10m" in text, text
    assert "'fresh'" not in text  # seconds old: on its way
    result = runner.invoke(app, ["status", "--db", db_url, "--json"])
    assert result.exit_code == 0, result.output
    waiting = {w["target"]: w for w in orjson.loads(result.stdout)["webhooks_waiting"]}
    assert waiting.keys() == {"ops", "fresh"} and waiting["ops"]["pending"] == 2
    assert waiting["ops"]["oldest_s"] >= 599
