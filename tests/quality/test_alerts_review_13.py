"""Alerts and webhooks after review 13: a cleanup keeps the deliveries that say who heard
of an alert still able to announce something, an alert's events reach a webhook in
order even when one is retried, and a format-pollution alert resolved because traffic
stopped shows no value."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from helpers import rows, wait_for
from lockgate.cli import app
from lockgate.quality.alerts import Evaluator, ack_alert, get_alert
from lockgate.quality.rules import Finding
from lockgate.quality.webhooks import Sender
from lockgate.store import Store

from .alerting import Receiver, collapse, feed, settings

SECRET = b"whsec-review-13"


@pytest.fixture
def receiver() -> Receiver:
    rec = Receiver(SECRET).start()
    yield rec
    rec.stop()


def _deliveries(store: Store) -> list[dict]:
    return rows(store, "SELECT id, event, target, status FROM alert_delivery ORDER BY id")


def _send_all(store: Store, sender: Sender) -> None:
    def step() -> bool:
        asyncio.run(sender.pass_once())
        return all(d["status"] == "DELIVERED" for d in _deliveries(store))
    wait_for(step, "every delivery DELIVERED", timeout=30.0, interval=0.05)


def _events(rec: Receiver) -> list[str]:
    return [orjson.loads(r.body)["event"] for r in rec.got]


def _cleanup(db_url: str, age: str) -> str:
    res = CliRunner().invoke(app, ["cleanup", "--older-than", age, "--db", db_url],
                             catch_exceptions=False)
    assert res.exit_code == 0
    return res.stderr


def test_cleanup_keeps_the_deliveries_of_an_open_alert_so_its_ack_is_announced(
        store: Store, db_url: str, receiver: Receiver, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # `cleanup --older-than 0s` deleted the DELIVERED `open` of an alert still OPEN
    # ("1 webhook deliveries done"); `alerts ack` without a config then queued nothing
    # and `alerts show` had lost the delivery.
    s = settings(webhook=(receiver.webhook(),))
    collapse(store)
    [e] = Evaluator(store, s, worker_id="w1").tick()
    _send_all(store, Sender(store, s.quality))
    assert _events(receiver) == ["open"]
    assert "0 webhook deliveries done" in _cleanup(db_url, "0s")
    assert [(d["event"], d["status"]) for d in _deliveries(store)] == [
        ("open", "DELIVERED")]
    assert [d["event"] for d in get_alert(store, e.alert.id).deliveries] == ["open"]
    monkeypatch.chdir(tmp_path)  # no lockgate.toml here: the ack names no webhook
    monkeypatch.delenv("LOCKGATE_CONFIG", raising=False)
    res = CliRunner().invoke(app, ["alerts", "ack", str(e.alert.id), "--actor", "ana",
                                   "--reason", "looking", "--db", db_url],
                             catch_exceptions=False)
    assert res.exit_code == 0
    assert [(d["event"], d["target"]) for d in _deliveries(store)] == [
        ("open", "ops"), ("ack", "ops")]
    _send_all(store, Sender(store, s.quality))
    assert _events(receiver) == ["open", "ack"]


def test_cleanup_deletes_the_old_deliveries_of_a_resolved_alert(
        store: Store, db_url: str, receiver: Receiver) -> None:
    # the alert opened two days ago and resolved just now: its old deliveries go
    s = settings(webhook=(receiver.webhook(),))
    collapse(store)
    Evaluator(store, s, worker_id="w1").tick()
    _send_all(store, Sender(store, s.quality))
    store.transaction(lambda tx: tx.execute(
        "UPDATE alert_delivery SET created_at = created_at - 172800000"))
    assert "0 webhook deliveries done" in _cleanup(db_url, "1d")  # still open
    store.transaction(lambda tx: tx.execute(
        "UPDATE quality_alert SET status = 'RESOLVED', open_key = NULL, "
        "resolved_at = :now"))
    assert "1 webhook deliveries done" in _cleanup(db_url, "1d")
    assert _deliveries(store) == []
    assert len(rows(store, "SELECT id FROM quality_alert")) == 1


def test_a_retried_event_is_not_overtaken_by_the_alerts_next_one(store: Store) -> None:
    # The receiver answered 500 to the `open`, whose retry waits its back-off; the
    # alert's next event was due at once and was posted first (`resolve` before `open`).
    # Another webhook, and another alert, are not held up.
    ops = Receiver(SECRET, script=[500]).start()
    other = Receiver(SECRET).start()
    try:
        s = settings(webhook=(ops.webhook(backoff_s=3600.0),
                              other.webhook(name="other")))
        collapse(store)
        [e] = Evaluator(store, s, worker_id="w1").tick()
        sender = Sender(store, s.quality)
        asyncio.run(sender.pass_once())
        assert _events(ops) == ["open"] and _events(other) == ["open"]
        ack_alert(store, e.alert.id, actor="ana")  # a later event, due now
        assert asyncio.run(sender.pass_once()) == 1  # only the other webhook's ack
        assert _events(ops) == ["open"] and _events(other) == ["open", "ack"]
        by = {(d["event"], d["target"]): d["status"] for d in _deliveries(store)}
        assert by[("ack", "ops")] == "PENDING" and by[("open", "ops")] == "PENDING"
        # the retry comes due (its back-off over): the open, then the ack
        store.transaction(lambda tx: tx.execute(
            "UPDATE alert_delivery SET next_at = :now WHERE status = 'PENDING'"))
        _send_all(store, sender)
        assert _events(ops) == ["open", "open", "ack"]
        assert [r.headers["X-Lockgate-Delivery"] for r in ops.got][:2] == \
            [ops.got[0].headers["X-Lockgate-Delivery"]] * 2
    finally:
        ops.stop()
        other.stop()


def test_a_pollution_alert_resolved_when_traffic_stops_shows_no_value(
        store: Store, receiver: Receiver) -> None:
    # Every minute with traffic 20 % invalid, the newest whole minute without a call:
    # the resolve read "0.00% (threshold 3.00%, 100 calls)"; too few calls to compare
    # shows no value and 0 calls.
    s = settings(webhook=(receiver.webhook(),))
    for m in range(2, 7):
        feed(store, 20, ago_ms=m * 60_000)
        feed(store, 5, ago_ms=m * 60_000, parse_status="invalid_json",
             raw_output="label: yes", completeness=0.0)
    ev = Evaluator(store, s, worker_id="w1")
    assert ev.claim()
    # the alert these minutes opened a minute ago, as that evaluation wrote it
    opened = Finding("format_pollution", "p@1", "m", True, 0.2, None,
                     s.quality.invalid_json_share, 125)
    [o] = store.transaction(lambda tx: ev.apply(tx, [opened]))
    assert o.event == "open"
    events = [x for x in ev.tick() if x.alert.rule == "format_pollution"]
    assert [x.event for x in events] == ["resolve"]
    a = get_alert(store, o.alert.id)
    assert (a.status, a.value, a.calls) == ("RESOLVED", None, 0)
    _send_all(store, Sender(store, s.quality))
    body = [orjson.loads(r.body) for r in receiver.got][-1]
    assert body["event"] == "resolve"
    assert (body["alert"]["value"], body["alert"]["calls"]) == (None, 0)
