"""Defects of the quality loop found in review (round 6): circuit episodes between two
evaluations, a fallback version that cannot render a task, the performance rule with
failed calls, rollups off in ``lockgate quality``, the cleanup's delivery count, and
the run summary's calls."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from helpers import rows, wait_for
from lockgate import Lockgate
from lockgate.cli import app
from lockgate.config import CircuitSettings, QualitySettings, Settings, WorkerSettings
from lockgate.quality.alerts import Evaluator, list_alerts
from lockgate.quality.circuit import CircuitEvaluator, set_circuit
from lockgate.quality.rollup import Rollup
from lockgate.quality.rules import evaluate
from lockgate.quality.webhooks import Sender
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.states import TaskStatus
from lockgate.store import Finish, Store

from .alerting import Receiver, collapse, feed, settings

KEY = ("p@1", "m")
S = QualitySettings()


# -- E3: performance_degradation with failed calls ---------------------------------------

def _perf_call(latency: float, tokens: int, *, failed: bool = False) -> dict[str, Any]:
    """A call as the worker writes its trace: every rendered call has lockgate's
    estimate; a failed call (HTTP 500) reports no usage and has no parsed output."""
    return {"outcome": "retry" if failed else "succeeded", "prompt_sha256": "h",
            "latency_ms": latency, "estimated_tokens": tokens,
            "input_tokens": None if failed else tokens,
            "parse_status": None if failed else "valid",
            "completeness": None if failed else 1.0,
            "error_class": "http_5xx" if failed else None}


def _perf_rollup(calls: list[dict[str, Any]]) -> Rollup:
    r = Rollup()
    for c in calls:
        r.observe(c)
    return r


def _perf(now: Rollup, base: Rollup) -> Any:
    [f] = [f for f in evaluate(KEY, now, None, base, [], S)
           if f.rule == "performance_degradation"]
    return f


def test_latency_tripled_with_a_quarter_of_calls_failing_fires() -> None:
    base = _perf_rollup([_perf_call(100.0, 50) for _ in range(200)])
    now = _perf_rollup([_perf_call(300.0, 50, failed=i % 4 == 0) for i in range(200)])
    assert _perf(now, base).fired


def test_failures_on_the_baseline_side_do_not_mute_it_either() -> None:
    base = _perf_rollup([_perf_call(100.0, 50, failed=i % 4 == 0) for i in range(200)])
    now = _perf_rollup([_perf_call(300.0, 50) for _ in range(200)])
    assert _perf(now, base).fired


def test_latency_up_with_longer_inputs_and_failures_does_not_fire() -> None:
    base = _perf_rollup([_perf_call(100.0, 50) for _ in range(200)])
    now = _perf_rollup([_perf_call(300.0, 80, failed=i % 4 == 0) for i in range(200)])
    assert not _perf(now, base).fired


def test_rows_without_estimates_keep_the_reported_counts() -> None:
    """Rollups written before the estimates were kept (their sum is 0): the reported
    counts, as before."""
    base = _perf_rollup([{**_perf_call(100.0, 50), "estimated_tokens": None}
                         for _ in range(200)])
    base.input_tokens_or_estimate = 0
    now = _perf_rollup([_perf_call(300.0, 50) for _ in range(200)])
    assert _perf(now, base).fired


# -- E2: a fallback version that cannot render a task ------------------------------------

_GOOD_NEEDS_CUSTOMER = [
    {"role": "system", "content": 'Reply with JSON like {{"label": "yes", "reason": '
                                  '"text"}}.\nlabel: one of yes, no\n'
                                  "If the text mentions refund then label = yes\n"
                                  "Otherwise label = no"},
    {"role": "user", "content": "<input>\n{text}\nfrom {customer}\n</input>"}]
_PRIMARY = [{"role": "system", "content": 'Reply with JSON like {{"label": "yes"}}.\n'
                                          "label: one of yes, no\nOtherwise label = no"},
            {"role": "user", "content": "<input>\n{text}\n</input>"}]
_RULE = {"format": "json", "required_keys": ["label", "reason"],
         "fallback_values": {"reason": "-"}, "on_invalid": "fallback"}
_MODEL = {"name": "sim-small", "temperature": 0, "timeout_ms": 20_000}


def test_a_task_the_fallback_version_cannot_render_takes_the_primary_path(
        db_url: str, simulator: SimulatorProcess, caplog: pytest.LogCaptureFixture) -> None:
    """The fallback's template needs ``{customer}``: the tasks without it were FAILED
    (render_error) by the detour, though the primary answers them."""
    c = CircuitSettings(prompt="labels", fallback_prompt="labels-safe@1", threshold=0.9,
                        window="1m", min_calls=20, probation="1m", probe_share=0.0)
    settings = Settings(worker=WorkerSettings(concurrency=8, poll_max_s=0.05),
                        quality=QualitySettings(circuit=(c,), circuit_every_s=0.1,
                                                circuit_refresh_s=0.05))
    with Lockgate(db_url, settings=settings) as lg:
        lg.prompts.create("labels", _PRIMARY, model_config=_MODEL, delivery_rule=_RULE)
        lg.prompts.create("labels-safe", _GOOD_NEEDS_CUSTOMER, model_config=_MODEL,
                          delivery_rule=_RULE)
        lg.submit([{"task_id": f"f-{i:03d}", "prompt_template": "@registry:labels",
                    "input_data": {"text": f"order {i}: where is it",
                                   **({"customer": "ann"} if i % 2 else {})}}
                   for i in range(20)], batch_id="f")
        lg.open_circuit("labels", actor="ops")
        with caplog.at_level(logging.WARNING, logger="lockgate.worker"):
            lg.run_worker(burst=True)
        assert lg.status().batches["f"] == {"SUCCEEDED": 20}
        paths = {r["task_id"]: r["prompt_version"] for r in rows(
            lg.store, "SELECT t.task_id, a.prompt_version FROM task_attempt a JOIN task t "
                      "ON t.id = a.task_pk WHERE a.outcome = 'succeeded'")}
        assert paths == {f"f-{i:03d}": "labels-safe@1" if i % 2 else "labels@1"
                         for i in range(20)}
        assert caplog.text.count("cannot render some of its tasks") == 1


# -- E5: the cleanup's count of webhook deliveries ----------------------------------------

@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rec = Receiver(b"whsec-review-6").start()
    yield rec
    rec.stop()


def test_cleanup_counts_the_deliveries_of_the_old_alerts_it_deletes(
        store: Store, db_url: str, receiver: Receiver) -> None:
    """An alert resolved long ago goes with its deliveries: they were deleted but the
    cleanup said "0 webhook deliveries done"."""
    s = settings(webhook=(receiver.webhook(), receiver.webhook(name="second")))
    collapse(store)
    Evaluator(store, s, worker_id="w1").tick()
    asyncio.run(Sender(store, s.quality).pass_once())
    assert {d["status"] for d in rows(store, "SELECT status FROM alert_delivery")} == \
        {"DELIVERED"}
    day = 86_400_000
    store.transaction(lambda tx: tx.execute(
        "UPDATE quality_alert SET status = 'RESOLVED', open_key = NULL, "
        "resolved_at = :now - :ago", {"ago": 2 * day}))
    store.transaction(lambda tx: tx.execute(
        "UPDATE alert_delivery SET created_at = created_at - :ago", {"ago": 2 * day}))
    res = CliRunner().invoke(app, ["cleanup", "--older-than", "1d", "--db", db_url],
                             catch_exceptions=False)
    assert res.exit_code == 0
    assert "1 resolved alert(s)" in res.stderr
    assert "2 webhook deliveries done" in res.stderr
    assert rows(store, "SELECT id FROM alert_delivery") == []


# -- E4: `lockgate quality` with rollups off ----------------------------------------------

def _has(text: str, *parts: str) -> bool:
    """Whether each part is in the printed text, however the terminal wrapped it."""
    flat = "".join(text.split())
    return all("".join(p.split()) in flat for p in parts)


def test_quality_says_rollups_are_off_rather_than_no_attempts(
        store: Store, db_url: str, tmp_path: Path) -> None:
    """With ``[quality] rollups = false`` attempts are recorded but no figures kept: the
    command said "no attempts recorded" and ``--check`` "no prompt has the calls"."""
    store.submit([parse_task({"task_id": f"r{i}", "prompt_template": "Label: {x}",
                              "input_data": {"x": i}, "model_config": {"name": "m"},
                              "delivery_rule": {}, "retry_policy": {}})
                  for i in range(3)], batch_id="b")
    now = store.db_now()
    claimed = store.claim(3, lease_ms=60_000, worker_id="w")
    store.finish([Finish(id=t.id, lease_token=t.lease_token, status=TaskStatus.SUCCEEDED,
                         result='{"label": "yes"}', attempt={
                             "attempt": 1, "outcome": "succeeded", "latency_ms": 10.0,
                             "started_at": now, "endpoint": "e", "model": "m",
                             "prompt_sha256": "h", "parse_status": "valid"})
                  for t in claimed], worker_id="w")
    cfg = tmp_path / "off.toml"
    cfg.write_text("[quality]\nrollups = false\n")
    runner = CliRunner()
    res = runner.invoke(app, ["quality", "--db", db_url, "--config", str(cfg)],
                        catch_exceptions=False)
    assert res.exit_code == 0
    assert not _has(res.stdout, "no attempts")
    assert _has(res.stdout, "rollups = false", str(cfg))
    assert _has(res.stdout, "rollups = true")
    res = runner.invoke(app, ["quality", "--check", "--db", db_url, "--config", str(cfg)],
                        catch_exceptions=False)
    assert res.exit_code == 0
    assert not _has(res.stdout, "no prompt has the calls")
    assert _has(res.stdout, "rollups = false", str(cfg))
    # rollups on (the default): the old message, nothing about rollups
    on = tmp_path / "on.toml"
    on.write_text("[quality]\nrollups = true\n")
    res = runner.invoke(app, ["quality", "--db", db_url, "--config", str(on)],
                        catch_exceptions=False)
    assert _has(res.stdout, "no attempts recorded in the last 24h")
    assert "rollups" not in res.stdout + res.stderr


# -- E6: the run summary counts calls sent ------------------------------------------------

def test_the_run_summary_counts_only_calls_that_were_sent(
        db_url: str, simulator: SimulatorProcess) -> None:
    """Tasks whose prompt does not render are never sent (latency 0, no prompt): they
    were counted as calls made and in the latency percentiles."""
    with Lockgate(db_url, settings=Settings(
            worker=WorkerSettings(concurrency=8, poll_max_s=0.05))) as lg:
        lg.prompts.create("lbl", _GOOD_NEEDS_CUSTOMER, model_config=_MODEL,
                          delivery_rule=_RULE)
        lg.submit([{"task_id": f"s-{i:03d}", "prompt_template": "@registry:lbl",
                    "input_data": {"text": f"order {i}",
                                   **({"customer": "ann"} if i < 6 else {})}}
                   for i in range(10)], batch_id="s")
        lg.run_worker(burst=True)
        assert lg.status().batches["s"] == {"SUCCEEDED": 6, "FAILED": 4}
        summary = lg.store.summary("s")
        assert summary.calls == 6
        assert summary.outcomes.get("failed") == 4
        assert summary.errors.get("render_error") == 4
        assert summary.latency_ms["p50"] is not None and summary.latency_ms["p50"] > 0
        assert {q.prompt: q.calls for q in lg.quality(by="version")}.popitem()[1] == 6


# -- E1: circuit episodes nobody evaluated while they lasted ------------------------------

MINUTE = 60_000


def _circuit_settings(*, lease_s: float = 30.0, webhook: tuple[Any, ...] = (),
                      **quality: Any) -> Settings:
    circuit = CircuitSettings(prompt="p", threshold=0.9, window="3m", min_calls=10,
                              probation="2m", fallback="review")
    return Settings(quality=QualitySettings(evaluate_every=1.0, evaluator_lease_s=lease_s,
                                            circuit=(circuit,), webhook=webhook,
                                            **quality))


def _what(events: list[Any]) -> list[tuple[str, str, str]]:
    return [(e.event, e.alert.rule, e.alert.status) for e in events]


def test_a_circuit_episode_between_two_evaluations_is_announced(
        store: Store, receiver: Receiver, caplog: pytest.LogCaptureFixture) -> None:
    """Opened and closed by hand between two ticks: no alert, no webhook event."""
    s = _circuit_settings(webhook=(receiver.webhook(),))
    ev = Evaluator(store, s, worker_id="w1")
    assert ev.tick() == []
    set_circuit(store, s.quality, "p", "OPEN", actor="ana", reason="blink")
    set_circuit(store, s.quality, "p", "CLOSED", actor="ana", reason="blink over")
    with caplog.at_level(logging.INFO, logger="lockgate.quality"):
        events = ev.tick()
    assert _what(events) == [("open", "completeness_circuit", "OPEN"),
                             ("resolve", "completeness_circuit", "RESOLVED")]
    assert "OPEN: completeness_circuit (to review) on p" in caplog.text
    assert "RESOLVED: completeness_circuit (to review) on p" in caplog.text
    [a] = list_alerts(store, everything=True)
    assert (a.prompt, a.model, a.subject, a.status) == ("p", "*", "to review", "RESOLVED")
    ids = [d for e in events for d in e.deliveries]
    assert len(ids) == 2 and len(set(ids)) == 2
    sender = Sender(store, s.quality)

    def sent() -> bool:
        asyncio.run(sender.pass_once())
        return len(receiver.got) >= 2
    wait_for(sent, "both events posted", timeout=30, interval=0.05)
    # (a webhook takes up to 4 posts at once: the two may arrive in either order)
    bodies = sorted((orjson.loads(r.body) for r in receiver.got),
                    key=lambda b: ids.index(b["delivery"]))
    assert [(b["event"], b["alert"]["status"]) for b in bodies] == [
        ("open", "OPEN"), ("resolve", "RESOLVED")]
    assert [b["delivery"] for b in bodies] == ids
    assert all(r.signed for r in receiver.got)
    # announced once: the next ticks say nothing more
    assert ev.tick() == [] and ev.tick() == []
    # a second blink is a second incident
    set_circuit(store, s.quality, "p", "OPEN", actor="ana", reason="blink 2")
    set_circuit(store, s.quality, "p", "CLOSED", actor="ana", reason="blink 2 over")
    assert _what(ev.tick()) == [("open", "completeness_circuit", "OPEN"),
                                ("resolve", "completeness_circuit", "RESOLVED")]
    assert len(list_alerts(store, everything=True)) == 2


def test_an_episode_the_evaluator_opened_between_ticks_keeps_its_figures(
        store: Store) -> None:
    s = _circuit_settings()
    ev = Evaluator(store, s, worker_id="w1")
    assert ev.tick() == []
    wait_for(lambda: store.db_now() % MINUTE < 40_000, "a fresh minute", timeout=30,
             interval=0.5)
    for k in (3, 2, 1):
        feed(store, 20, ago_ms=k * MINUTE, completeness=0.5, batch=f"b{k}")
    assert CircuitEvaluator(store, s.quality, actor="w2").tick() == 1
    set_circuit(store, s.quality, "p", "CLOSED", actor="ana")
    assert [e.event for e in ev.tick()] == ["open", "resolve"]
    [a] = list_alerts(store, everything=True)
    assert a.status == "RESOLVED" and a.calls == 60 and a.value == pytest.approx(0.5)
    assert (a.tasks, a.batches) == (60, 3)


def test_an_episode_while_the_evaluator_role_is_vacant_is_announced(store: Store) -> None:
    """The holder was killed (its lease left to run out): the episode that began and
    ended meanwhile is announced by the next holder."""
    s = _circuit_settings(lease_s=2.0)
    dead = Evaluator(store, s, worker_id="dead")
    assert dead.tick() == [] and dead.holding
    set_circuit(store, s.quality, "p", "OPEN", actor="ana", reason="while vacant")
    nxt = Evaluator(store, s, worker_id="next")
    assert nxt.tick() == [] and not nxt.holding  # the dead holder's lease still runs
    set_circuit(store, s.quality, "p", "CLOSED", actor="ana")
    wait_for(lambda: bool(nxt.claim()), "the role", timeout=10, interval=0.2)
    assert _what(nxt.tick()) == [("open", "completeness_circuit", "OPEN"),
                                 ("resolve", "completeness_circuit", "RESOLVED")]
    assert nxt.tick() == []


def test_past_episodes_are_not_replayed_beyond_the_window_or_the_newest_alert(
        store: Store) -> None:
    s = _circuit_settings()
    set_circuit(store, s.quality, "p", "OPEN", actor="ana")
    set_circuit(store, s.quality, "p", "CLOSED", actor="ana")
    day = 86_400_000
    store.transaction(lambda tx: tx.execute(
        "UPDATE quality_circuit_event SET at = at - :ago", {"ago": 2 * day}))
    ev = Evaluator(store, s, worker_id="w1")
    assert ev.tick() == []  # older than [quality] window (24h): history, not news
    # an episode seen while it lasted, then one that opened before its alert was
    # opened and closed since (it was seen): nothing replayed
    set_circuit(store, s.quality, "p", "OPEN", actor="ana")
    assert [e.event for e in ev.tick()] == ["open"]
    set_circuit(store, s.quality, "p", "CLOSED", actor="ana")
    assert [e.event for e in ev.tick()] == ["resolve"]
    assert ev.tick() == []
    assert len(list_alerts(store, everything=True)) == 1
