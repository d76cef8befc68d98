"""A completeness circuit's switch is an alert: opening it (by its evaluator or by hand)
opens one alert of rule ``completeness_circuit`` for its prompt path over every model,
with the path's completeness against the threshold, the volume since the first bad
minute and incomplete outputs as samples; closing it resolves the alert; every switch
alerts (no cool-down between two switches)."""

from __future__ import annotations

import pytest

from helpers import rows, wait_for
from lockgate.config import CircuitSettings, QualitySettings, Settings, Webhook
from lockgate.quality.alerts import Evaluator, get_alert, list_alerts
from lockgate.quality.circuit import CircuitEvaluator, set_circuit
from lockgate.store import Store

from .alerting import feed

MINUTE = 60_000


def _settings() -> Settings:
    circuit = CircuitSettings(prompt="p", threshold=0.9, window="3m", min_calls=10,
                              probation="2m", fallback="review")
    return Settings(quality=QualitySettings(evaluate_every=1.0, evaluator_lease_s=30.0,
                                            circuit=(circuit,)))


def _events(evs: list) -> list[tuple[str, str]]:
    return [(e.event, e.alert.rule) for e in evs]


def test_a_circuit_switch_opens_an_alert_and_closing_it_resolves_it(store: Store) -> None:
    s = _settings()
    # the three whole minutes before the current one, each under the threshold
    wait_for(lambda: store.db_now() % MINUTE < 40_000, "a fresh minute", timeout=30,
             interval=0.5)
    for k in (3, 2, 1):
        feed(store, 20, ago_ms=k * MINUTE, completeness=0.5, batch=f"b{k}",
             raw_output='{"label": "yes"}')
    assert CircuitEvaluator(store, s.quality, actor="w1").tick() == 1

    ev = Evaluator(store, s, worker_id="w1")
    assert _events(ev.tick()) == [("open", "completeness_circuit")]
    [a] = list_alerts(store)
    assert (a.prompt, a.model, a.subject, a.status) == ("p", "*", "to review", "OPEN")
    assert a.value == pytest.approx(0.5) and a.threshold == pytest.approx(0.9)
    assert a.calls == 60 and (a.tasks, a.batches, a.batches_exact) == (60, 3, True)
    full = get_alert(store, a.id)
    assert len(full.samples) == 60
    assert all(x.completeness == pytest.approx(0.5) and x.raw_output == '{"label": "yes"}'
               and x.prompt is not None for x in full.samples)
    assert ev.tick() == []  # still open: one alert

    set_circuit(store, s.quality, "p", "CLOSED", actor="ana")
    assert _events(ev.tick()) == [("resolve", "completeness_circuit")]
    # opened again by hand at once: a new alert, the cool-down does not hold a switch
    set_circuit(store, s.quality, "p", "OPEN", actor="ana", reason="vendor incident")
    assert _events(ev.tick()) == [("open", "completeness_circuit")]
    assert [x.status for x in list_alerts(store, everything=True)] == ["OPEN", "RESOLVED"]


def test_a_circuit_opened_by_hand_before_any_call_has_no_value(store: Store) -> None:
    s = _settings()
    set_circuit(store, s.quality, "p", "OPEN", actor="ana", reason="vendor incident")
    assert _events(Evaluator(store, s, worker_id="w1").tick()) == [
        ("open", "completeness_circuit")]
    [a] = list_alerts(store)
    assert a.calls == 0 and a.value is None  # nothing measured, not 0% complete
    assert a.to_dict()["value"] is None


def test_a_circuit_closed_and_opened_again_between_two_evaluations_is_a_new_incident(
        store: Store) -> None:
    # Closed and opened again within one evaluate_every: the alert of the first
    # episode stayed open with its onset, and neither the close nor the new opening
    # was announced.
    s = _settings()
    ev = Evaluator(store, s, worker_id="w1")
    set_circuit(store, s.quality, "p", "OPEN", actor="ana", reason="incident 1")
    assert _events(ev.tick()) == [("open", "completeness_circuit")]
    set_circuit(store, s.quality, "p", "CLOSED", actor="ana", reason="fixed")
    set_circuit(store, s.quality, "p", "OPEN", actor="bob", reason="incident 2")
    assert _events(ev.tick()) == [("resolve", "completeness_circuit"),
                                  ("open", "completeness_circuit")]
    assert ev.tick() == []  # the second episode goes on: still one alert
    assert [x.status for x in list_alerts(store, everything=True)] == ["OPEN", "RESOLVED"]


def test_a_circuit_alert_counts_the_tasks_of_its_path_not_of_its_fallback_version(
        store: Store) -> None:
    circuit = CircuitSettings(prompt="p", threshold=0.9, window="3m", min_calls=10,
                              probation="2m", fallback_prompt="p@2")
    s = Settings(quality=QualitySettings(evaluate_every=1.0, evaluator_lease_s=30.0,
                                         circuit=(circuit,)))
    set_circuit(store, s.quality, "p", "OPEN", actor="ana")
    feed(store, 5, ago_ms=0, completeness=0.5, batch="primary")  # its probes
    feed(store, 40, ago_ms=0, batch="fallback", version="p@2")  # the fallback's traffic
    Evaluator(store, s, worker_id="w1").tick()
    [a] = list_alerts(store)
    assert (a.tasks, a.batches) == (5, 1)


def test_holding_an_open_circuit_by_hand_keeps_its_one_alert(store: Store) -> None:
    # `lockgate circuit open` on a circuit its evaluator had opened resolved the alert
    # and opened another (its webhooks got `resolve` and `open` in one second, the
    # touched tasks counted again from the hold).
    circuit = CircuitSettings(prompt="p", threshold=0.9, window="3m", min_calls=10,
                              probation="2m", fallback="review")
    s = Settings(quality=QualitySettings(evaluate_every=1.0, evaluator_lease_s=30.0,
                                         circuit=(circuit,),
                                         webhook=(Webhook(name="ops",
                                                          url="http://127.0.0.1:9/hook"),)))
    wait_for(lambda: store.db_now() % MINUTE < 40_000, "a fresh minute", timeout=30,
             interval=0.5)
    for k in (3, 2, 1):
        feed(store, 20, ago_ms=k * MINUTE, completeness=0.5, batch=f"b{k}")
    assert CircuitEvaluator(store, s.quality, actor="w1").tick() == 1
    ev = Evaluator(store, s, worker_id="w1")
    assert _events(ev.tick()) == [("open", "completeness_circuit")]
    [a] = list_alerts(store)

    held = set_circuit(store, s.quality, "p", "OPEN", actor="ana", reason="hold it")
    assert (held.state, held.manual) == ("OPEN", True)
    assert ev.tick() == []  # the same episode: no resolve, no new alert
    [b] = list_alerts(store, everything=True)
    assert (b.id, b.status, b.onset, b.tasks) == (a.id, "OPEN", a.onset, a.tasks)
    deliveries = rows(store, "SELECT event FROM alert_delivery ORDER BY id")
    assert [d["event"] for d in deliveries] == ["open"]

    set_circuit(store, s.quality, "p", "CLOSED", actor="ana")
    assert _events(ev.tick()) == [("resolve", "completeness_circuit")]
    assert [x.id for x in list_alerts(store, everything=True)] == [a.id]
