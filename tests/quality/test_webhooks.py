"""Webhook deliveries through the outbox, to a real local HTTP receiver: signed bodies,
5xx retried then delivered, 4xx not retried (408 and 429 are), and a sender killed
mid-post loses nothing: the event is delivered again with the same idempotency id."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from helpers import clean_env, kill_settled, rows, wait_for
from lockgate.app import Lockgate
from lockgate.cli import app
from lockgate.config import QualitySettings, Settings, Webhook
from lockgate.errors import ConfigError
from lockgate.quality.alerts import Evaluator, ack_alert, get_alert
from lockgate.quality.service import AlertService
from lockgate.quality.webhooks import Sender, signature, verify
from lockgate.store import Store, schema

from .alerting import Receiver, collapse, ids, settings

SECRET = b"whsec-test-secret"


@pytest.fixture
def receiver() -> Receiver:
    rec = Receiver(SECRET).start()
    yield rec
    rec.stop()


def _deliveries(store: Store) -> list[dict]:
    return rows(store, "SELECT delivery_id, event, status, attempts, last_error "
                       "FROM alert_delivery ORDER BY id")


def _send_until(store: Store, sender: Sender, done: str, timeout: float = 30.0) -> None:
    def step() -> bool:
        asyncio.run(sender.pass_once())
        return all(d["status"] == done for d in _deliveries(store))
    wait_for(step, f"every delivery {done}", timeout=timeout, interval=0.05)


def test_5xx_is_retried_then_delivered_signed_with_one_id(store: Store,
                                                          receiver: Receiver) -> None:
    receiver.script = [500, 503]
    s = settings(webhook=(receiver.webhook(),))
    collapse(store)
    [e] = Evaluator(store, s, worker_id="w1").tick()
    assert e.event == "open" and len(e.deliveries) == 1
    [d] = _deliveries(store)
    assert (d["status"], d["attempts"]) == ("PENDING", 0)  # written with the alert
    _send_until(store, Sender(store, s.quality), "DELIVERED")
    assert len(receiver.got) == 3
    assert all(r.signed for r in receiver.got)
    assert ids(receiver.got) == [e.deliveries[0]] * 3
    body = orjson.loads(receiver.got[-1].body)
    assert body["event"] == "open" and body["delivery"] == e.deliveries[0]
    assert body["alert"]["id"] == e.alert.id
    assert body["alert"]["rule"] == "completeness_collapse"
    assert receiver.got[-1].headers["X-Lockgate-Event"] == "open"
    [d] = _deliveries(store)
    assert (d["status"], d["attempts"], d["last_error"]) == ("DELIVERED", 3, None)
    assert [x["status"] for x in get_alert(store, e.alert.id).deliveries] == ["DELIVERED"]


def test_a_4xx_is_not_retried_but_429_is(store: Store, receiver: Receiver) -> None:
    receiver.script = [429, 404]
    s = settings(webhook=(receiver.webhook(),))
    collapse(store)
    Evaluator(store, s, worker_id="w1").tick()
    _send_until(store, Sender(store, s.quality), "FAILED")
    assert len(receiver.got) == 2
    [d] = _deliveries(store)
    assert (d["attempts"], d["last_error"]) == (2, "HTTP 404")


def test_retries_stop_at_max_attempts(store: Store, receiver: Receiver) -> None:
    receiver.script = [500] * 10
    s = settings(webhook=(receiver.webhook(max_attempts=3),))
    collapse(store)
    Evaluator(store, s, worker_id="w1").tick()
    _send_until(store, Sender(store, s.quality), "FAILED")
    assert len(receiver.got) == 3
    assert _deliveries(store)[0]["last_error"] == "HTTP 500"


def test_a_receiver_whose_answer_never_ends_has_its_2xx_counted(store: Store) -> None:
    """The sender read the receiver's whole answer: one that streamed without end held
    each post to its timeout and the event was retried until it FAILED, though the
    receiver had said 200. The status is the answer; the body is not read."""
    rec = Receiver(SECRET, endless=True).start()
    try:
        s = settings(webhook=(rec.webhook(timeout_s=2.0, max_attempts=1),))
        collapse(store)
        Evaluator(store, s, worker_id="w1").tick()
        asyncio.run(Sender(store, s.quality).pass_once())
        [d] = _deliveries(store)
        assert (d["status"], d["attempts"], d["last_error"]) == ("DELIVERED", 1, None)
    finally:
        rec.stop()


_SENDER = textwrap.dedent("""
    import asyncio, sys, time
    from lockgate.config import QualitySettings, Webhook
    from lockgate.quality.webhooks import Sender
    from lockgate.store import Store
    q = QualitySettings(webhook=(Webhook(name="ops", url=sys.argv[2], secret="{secret}",
                                         timeout_s=3),))
    sender = Sender(Store(sys.argv[1]), q, margin_ms=0)
    while True:
        asyncio.run(sender.pass_once())
        time.sleep(0.05)
""")


def test_a_sender_killed_mid_post_loses_nothing(store: Store, db_url: str,
                                                receiver: Receiver) -> None:
    receiver.hang = 5.0  # the first post gets no answer before the kill
    s = settings(webhook=(receiver.webhook(timeout_s=1.0),))
    collapse(store)
    [e] = Evaluator(store, s, worker_id="w1").tick()
    proc = subprocess.Popen(
        [sys.executable, "-c", _SENDER.replace("{secret}", SECRET.decode()), db_url,
         receiver.url], env=clean_env())
    try:
        wait_for(lambda: receiver.got, "the first post", timeout=60)
    finally:
        kill_settled(proc, store)
    [d] = _deliveries(store)
    assert (d["status"], d["attempts"]) == ("PENDING", 1)  # claimed, never answered
    sender = Sender(store, s.quality, margin_ms=0)
    claim = rows(store, "SELECT next_at FROM alert_delivery")[0]["next_at"]
    if claim > store.db_now():  # the dead sender's claim (3 s) still holds
        assert asyncio.run(sender.pass_once()) == 0
    _send_until(store, sender, "DELIVERED")
    assert len(receiver.got) >= 2
    assert set(ids(receiver.got)) == {e.deliveries[0]}
    assert all(r.signed for r in receiver.got)


def test_signature_helpers() -> None:
    body = b'{"event":"open"}'
    sig = signature(SECRET, body)
    assert sig.startswith("sha256=") and len(sig) == 7 + 64
    assert verify(SECRET, body, sig)
    assert not verify(SECRET, body + b" ", sig) and not verify(b"other", body, sig)
    assert not verify(SECRET, body, None)


def test_a_worker_without_its_webhook_secret_refuses_to_start(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LG_HOOK_SECRET", raising=False)
    s = Settings(quality=QualitySettings(webhook=(Webhook(
        url="https://hooks.example.com/x", secret_env="LG_HOOK_SECRET"),)))
    with Lockgate(db_url, settings=s, migrate=False) as lg:
        with pytest.raises(ConfigError, match=r"hooks\.example\.com.*\$LG_HOOK_SECRET"):
            lg.worker()
        monkeypatch.setenv("LG_HOOK_SECRET", "k")
        lg.worker()  # builds
        assert lg.worker(gate=False) is not None


def test_cleanup_deletes_deliveries_done_and_keeps_pending_ones(store: Store, db_url: str,
                                                                receiver: Receiver) -> None:
    receiver.script = [404]
    s = settings(webhook=(receiver.webhook(), receiver.webhook(name="second")))
    collapse(store)
    first = Evaluator(store, s, worker_id="w1")
    first.tick()
    sender = Sender(store, s.quality)
    rows_before = _deliveries(store)
    assert len(rows_before) == 2
    asyncio.run(sender.pass_once())  # one FAILED (404), one DELIVERED
    store.transaction(lambda tx: tx.execute(
        "UPDATE alert_delivery SET created_at = created_at - 86400000"))
    Evaluator(store, settings(webhook=s.quality.webhook, update_every="1ms"),
              worker_id="w1", token=first.token).tick()  # an update: pending
    assert len(_deliveries(store)) == 4
    res = CliRunner().invoke(app, ["cleanup", "--older-than", "1h", "--db", db_url],
                             catch_exceptions=False)
    # The alert is open: its deliveries say which webhooks heard of it (an ack made
    # without a config reaches those), so none goes while it is not resolved.
    assert res.exit_code == 0 and "0 webhook deliveries done" in res.stderr
    assert len(_deliveries(store)) == 4
    store.transaction(lambda tx: tx.execute(
        "UPDATE quality_alert SET status = 'RESOLVED'"))
    res = CliRunner().invoke(app, ["cleanup", "--older-than", "1h", "--db", db_url],
                             catch_exceptions=False)
    assert res.exit_code == 0 and "2 webhook deliveries done" in res.stderr
    assert {d["status"] for d in _deliveries(store)} == {"PENDING"}


def test_cleanup_deletes_old_resolved_alerts_with_their_samples(
        store: Store, db_url: str, receiver: Receiver) -> None:
    s = settings(webhook=(receiver.webhook(),))
    collapse(store)
    Evaluator(store, s, worker_id="w1").tick()
    [alert] = rows(store, "SELECT id, status FROM quality_alert")
    samples = rows(store, "SELECT id FROM quality_alert_sample")
    assert alert["status"] == "OPEN" and samples

    def cleanup(age: str) -> str:
        res = CliRunner().invoke(app, ["cleanup", "--older-than", age, "--db", db_url],
                                 catch_exceptions=False)
        assert res.exit_code == 0
        return res.stderr

    assert "0 resolved alert(s)" in cleanup("0s")  # an open alert stays, however old
    day = 86_400_000
    store.transaction(lambda tx: tx.execute(
        "UPDATE quality_alert SET status = 'RESOLVED', open_key = NULL, "
        "resolved_at = :now - :ago", {"ago": 2 * day}))
    # resolved two days ago, but its webhook delivery is still pending: kept
    assert "0 resolved alert(s) with 0 sample(s)" in cleanup("1d")
    asyncio.run(Sender(store, s.quality).pass_once())
    assert {d["status"] for d in _deliveries(store)} == {"DELIVERED"}
    assert "0 resolved alert(s)" in cleanup("3d")  # not that old
    out = cleanup("1d")
    assert f"1 resolved alert(s) with {len(samples)} sample(s)" in out
    for table in ("quality_alert", "quality_alert_sample", "alert_delivery"):
        assert rows(store, f"SELECT id FROM {table}") == []


def test_an_ack_is_announced_to_the_webhooks_once(store: Store, db_url: str,
                                                  receiver: Receiver) -> None:
    s = settings(webhook=(receiver.webhook(), receiver.webhook(name="second")))
    collapse(store)
    Evaluator(store, s, worker_id="w1").tick()
    assert [d["event"] for d in _deliveries(store)] == ["open", "open"]
    with Lockgate(db_url, settings=s, migrate=False) as lg:
        [alert] = lg.alerts()
        lg.ack_alert(alert.id, actor="ops@example.com", reason="known: model upgrade")
        lg.ack_alert(alert.id, actor="someone-else")  # already acknowledged: no event
    acks = rows(store, "SELECT target FROM alert_delivery WHERE event = 'ack'")
    assert sorted(d["target"] for d in acks) == sorted(
        w.target for w in s.quality.webhook)
    # (each webhook gets the alert's open first, then its ack: events keep their order)
    _send_until(store, Sender(store, s.quality), "DELIVERED")
    bodies = [orjson.loads(r.body) for r in receiver.got]
    acked = [b["alert"] for b in bodies if b["event"] == "ack"]
    assert len(acked) == 2
    assert all(a["acked_by"] == "ops@example.com" and a["ack_reason"] ==
               "known: model upgrade" for a in acked)


def test_a_webhook_that_does_not_answer_holds_up_no_other(store: Store, db_url: str) -> None:
    """The worker's sender claims and posts each delivery on its own: while a webhook
    holds its post unanswered (for up to its 30 s timeout), a later event still reaches
    the webhook that answers."""
    stuck = Receiver(SECRET, block=threading.Event()).start()
    fine = Receiver(SECRET).start()
    s = settings(webhook=(stuck.webhook(name="stuck", timeout_s=30.0),
                          fine.webhook(name="fine")))
    collapse(store)
    service = AlertService(store, s, send_poll_s=0.05)
    loop = asyncio.new_event_loop()
    stopping = asyncio.Event()
    runner = threading.Thread(target=loop.run_until_complete,
                              args=(service.run(stopping, "w1"),))
    runner.start()

    def events(rec: Receiver) -> list[str]:
        return [orjson.loads(r.body)["event"] for r in list(rec.got)]

    try:
        wait_for(lambda: events(stuck) == ["open"] and events(fine) == ["open"],
                 "the open event posted to both webhooks", timeout=60)
        with Lockgate(db_url, settings=s, migrate=False) as lg:
            [alert] = lg.alerts()
            lg.ack_alert(alert.id, actor="ops@example.com")
        wait_for(lambda: "ack" in events(fine), "the ack at the webhook that answers",
                 timeout=120)
        # ... while the first post to the other one is still waiting for its answer
        [held] = rows(store, "SELECT status, attempts, last_error FROM alert_delivery "
                             "WHERE target = 'stuck' AND event = 'open'")
        assert (held["status"], held["attempts"], held["last_error"]) == ("PENDING", 1, None)
        assert events(stuck)[0] == "open"
    finally:
        stuck.stop()  # answers what it holds
        loop.call_soon_threadsafe(stopping.set)
        runner.join(60)
        loop.close()
        fine.stop()
    assert not runner.is_alive()


def test_a_silent_webhook_takes_at_most_its_share_of_the_posts(store: Store) -> None:
    """More events due for a webhook that does not answer than the sender posts at
    once: a claim took them all (oldest first) and every place waited for their
    timeouts while the other webhook's event stayed unsent. A webhook holds at most
    ``per_webhook`` posts; the others' deliveries go out beside them."""
    stuck = Receiver(SECRET, block=threading.Event()).start()
    fine = Receiver(SECRET).start()
    q = settings(webhook=(stuck.webhook(name="stuck", timeout_s=30.0),
                          fine.webhook(name="fine"))).quality
    now = store.db_now()
    with store.engine.begin() as conn:
        conn.execute(schema.alert_delivery.insert(), [
            {"delivery_id": f"d{k:02d}", "alert_id": k, "event": "open",
             "target": "fine" if k == 10 else "stuck", "body": orjson.dumps({"n": k}),
             "status": "PENDING", "next_at": now - 1000 + k, "created_at": now}
            for k in range(11)])
    sender = Sender(store, q, batch=4, per_webhook=2)
    loop = asyncio.new_event_loop()
    stopping = asyncio.Event()
    runner = threading.Thread(target=loop.run_until_complete,
                              args=(sender.run(lambda: True, stopping, poll_s=0.05),))
    runner.start()
    try:
        wait_for(lambda: len(fine.got) == 1, "the answering webhook's delivery", timeout=20)
        assert len(stuck.got) == 2, "the silent webhook holds two posts, no more"
    finally:
        stuck.stop()
        loop.call_soon_threadsafe(stopping.set)
        runner.join(60)
        loop.close()
        fine.stop()


def test_an_ack_made_without_the_webhook_config_is_still_announced(
        store: Store, db_url: str, receiver: Receiver, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # `cd /tmp && lockgate alerts ack 3 --db ...` recorded the ack and queued nothing;
    # an ack with the config then found it "already acked": no `ack` event, ever.
    s = settings(webhook=(receiver.webhook(), receiver.webhook(name="second")))
    collapse(store)
    [e] = Evaluator(store, s, worker_id="w1").tick()
    monkeypatch.chdir(tmp_path)  # no lockgate.toml here
    monkeypatch.delenv("LOCKGATE_CONFIG", raising=False)
    res = CliRunner().invoke(app, ["alerts", "ack", str(e.alert.id), "--actor", "ana",
                                   "--reason", "on it", "--db", db_url],
                             catch_exceptions=False)
    assert res.exit_code == 0 and "acked by ana" in res.stdout
    acks = rows(store, "SELECT target FROM alert_delivery WHERE event = 'ack' ORDER BY id")
    # to the webhooks the alert's open went to
    assert [d["target"] for d in acks] == ["ops", "second"]
    # an ack with the config changes nothing and is not announced again
    with Lockgate(db_url, settings=s, migrate=False) as lg:
        assert lg.ack_alert(e.alert.id, actor="bob").acked_by == "ana"
    assert len(rows(store, "SELECT id FROM alert_delivery WHERE event = 'ack'")) == 2
    _send_until(store, Sender(store, s.quality), "DELIVERED")
    acked = [orjson.loads(r.body)["alert"] for r in receiver.got
             if orjson.loads(r.body)["event"] == "ack"]
    assert len(acked) == 2 and all(a["acked_by"] == "ana" and a["ack_reason"] == "on it"
                                   for a in acked)


def test_an_ack_goes_to_the_alerts_webhooks_and_the_callers(store: Store) -> None:
    s = settings(webhook=(Webhook(name="ops", url="http://127.0.0.1:9/hook"),))
    collapse(store)
    [e] = Evaluator(store, s, worker_id="w1").tick()
    ack_alert(store, e.alert.id, actor="ana", targets=["pager", "ops"])
    acks = rows(store, "SELECT target FROM alert_delivery WHERE event = 'ack' ORDER BY id")
    assert [d["target"] for d in acks] == ["ops", "pager"]  # each once


def test_the_webhook_body_holds_the_alert_as_alerts_show_json_prints_it(
        store: Store, db_url: str, receiver: Receiver) -> None:
    # The body wrote times as `…Z` (microseconds), `alerts show --json` as `…+00:00`.
    s = settings(webhook=(receiver.webhook(),))
    collapse(store)
    [e] = Evaluator(store, s, worker_id="w1").tick()
    _send_until(store, Sender(store, s.quality), "DELIVERED")
    body = orjson.loads(receiver.got[-1].body)
    res = CliRunner().invoke(app, ["alerts", "show", str(e.alert.id), "--json", "--db",
                                   db_url], catch_exceptions=False)
    shown = orjson.loads(res.stdout)
    assert shown.pop("samples") and shown.pop("deliveries")
    assert body["alert"] == shown
    assert shown["opened_at"].endswith("Z") and len(shown["opened_at"]) == 24
    [listed] = orjson.loads(CliRunner().invoke(
        app, ["alerts", "list", "--json", "--db", db_url], catch_exceptions=False).stdout)
    assert listed["opened_at"] == shown["opened_at"]
