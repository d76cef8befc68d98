"""The four anomaly rules end to end: a real worker calls the real simulator, its
write-backs keep the rollups, and ``check_rules()`` reads them. Healthy traffic builds
the baseline, one degradation switch of the simulator is turned on for the model, the
rule fires for that prompt and model with the value the attempts hold against the
baseline's, and once the switch is off again the rule is quiet. The evaluator turns the
same findings into one alert, with failing samples, the baseline and the volume
touched, which resolves once the switch is off.

No real hours pass: after each phase the test moves that phase in time (its minute
rollups' ``bucket`` and its attempts' ``started_at``), the healthy phase to a week
earlier (the baseline a rule prefers), the degraded one out of both windows once it has
been checked; ``now_ms`` places the check at the end of the phase's busiest minute (the
last whole minute format pollution reads).
"""

from __future__ import annotations

import statistics
from typing import Any

import pytest
from sqlalchemy import text

from engine.support import run_worker, task, text_for
from helpers import rows
from lockgate.config import QualitySettings, Settings
from lockgate.quality.alerts import Alert, Evaluator, Event, get_alert, list_alerts
from lockgate.quality.report import check_rules
from lockgate.quality.rollup import bucket_of
from lockgate.quality.rules import RULES, WEEK_MS, Finding
from lockgate.quality.writer import template_key
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store
from lockgate.store.quality import QualityStore

MODEL = "sim-small"
SYSTEM = ('Reply with JSON like {{"label": "yes", "reason": "..."}}.\n'
          "label: one of yes, no\n"
          "reason: text, at most 20 characters\n"
          "If the text mentions refund then label = yes\n"
          "Otherwise label = no")
TEMPLATE = [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "<input>\n{text}\n</input>"}]
SCHEMA = {"type": "object", "properties": {
    "label": {"type": "string", "enum": ["yes", "no"]},
    "reason": {"type": "string"}}, "required": ["label", "reason"]}
N = 120  # tasks per phase (a third ask for a refund: label yes)
# Minute rows kept over a week: the week-old baseline is read from the minute rows the
# test moves a week back (with fewer kept, from the hour rows nearest to it).
SETTINGS = QualitySettings(window=1800, min_calls=50, min_calls_minute=10,
                           pollution_minutes=1, keep_minutes="8d")
DAY_MS = 86_400_000

#: rule -> the degradation switch of the model that should make it fire
SWITCHES: dict[str, dict[str, Any]] = {
    "completeness_collapse": {"drop_fields": 0.5},
    "semantic_drift": {"drift": {"value": "yes", "rate": 0.8}},
    "format_pollution": {"broken_json": 0.5},
    "performance_degradation": {"latency_add_ms": 300},
}


def _phase(store: Store, batch: str) -> int:
    """Submit N tasks in ``batch`` and run a worker until they are done; returns the
    minute the phase began in (database clock)."""
    started = bucket_of(store.db_now(), "m")
    store.submit([parse_task(task(
        f"{batch}-{i:04d}", text_for(i), template=TEMPLATE,
        delivery={"schema": SCHEMA, "required_keys": [], "fallback_values": {"reason": "-"}},
        retry={"max_retries": 1, "base_delay_ms": 10, "jitter": 0.0}))
        for i in range(N)], batch_id=batch)
    run_worker(store, concurrency=16)
    return started


def _shift(store: Store, batch: str, since: int, by_ms: int) -> None:
    """Move a phase by ``by_ms`` (negative: into the past): the minute rollups from
    ``since`` on and the attempts of its batch."""
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE quality_rollup SET bucket = bucket + :by "
                          "WHERE resolution = 'm' AND bucket >= :since"),
                     {"by": by_ms, "since": since})
        conn.execute(text("UPDATE task_attempt SET started_at = started_at + :by WHERE "
                          "task_pk IN (SELECT id FROM task WHERE batch_id = :b)"),
                     {"by": by_ms, "b": batch})


def _busiest_minute(store: Store, since: int) -> int:
    calls: dict[int, int] = {}
    for r in QualityStore(store).rows("m", since=since):
        calls[r.bucket] = calls.get(r.bucket, 0) + int(r.values["calls"])
    return max(calls, key=lambda b: calls[b])


def _check(store: Store, since: int, evaluator: Evaluator
           ) -> tuple[int, dict[str, Finding], list[Event]]:
    """(the minute checked, the findings by rule, the evaluator's events) at the end of
    the phase's busiest minute; a drift finding is keyed ``semantic_drift:label=VALUE``.
    The evaluator applies these findings as its tick applies its own."""
    minute = _busiest_minute(store, since)
    found = check_rules(store, SETTINGS, now_ms=minute + 60_000)
    assert {(f.prompt, f.model) for f in found} == {(template_key(TEMPLATE), MODEL)}
    assert evaluator.claim()
    events = store.transaction(lambda tx: evaluator.apply(tx, found))
    return (minute, {f.rule + (f":{f.subject}" if f.subject else ""): f for f in found},
            events)


def _check_alert(rule: str, store: Store, events: list[Event], finding: Finding,
                 evaluator: Evaluator) -> Alert:
    """The rule opened one alert carrying the finding's figures, the volume of the
    degraded phase and failing samples of it."""
    assert [(e.event, e.alert.rule, e.alert.subject) for e in events] == [
        ("open", rule, finding.subject)]
    alert = get_alert(store, events[0].alert.id)
    assert (alert.status, alert.prompt, alert.model) == ("OPEN", finding.prompt, MODEL)
    assert alert.value == pytest.approx(finding.value)
    assert alert.threshold == pytest.approx(finding.threshold)
    if finding.baseline is None:
        assert alert.baseline is None
    else:
        assert alert.baseline == pytest.approx(finding.baseline)
    assert alert.calls == finding.calls
    assert (alert.tasks, alert.batches, alert.batches_exact) == (N, 1, True)
    assert alert.samples
    degraded = {a["id"]: a for a in _calls(store, "degraded")}
    for smp in alert.samples:
        assert smp.batch_id == "degraded" and smp.attempt_id in degraded
        assert smp.prompt is not None and "label: one of yes, no" in smp.prompt
        raw = smp.raw_output or ""
        if rule == "completeness_collapse":
            assert smp.completeness is not None and smp.completeness < 1
            assert '"reason"' not in raw
        elif rule == "semantic_drift":
            assert '"label":"no"' in raw.replace(" ", "")
        elif rule == "format_pollution":
            assert smp.parse_status == "invalid_json" and not raw.startswith('{"label"')
        else:
            assert smp.latency_ms is not None and smp.latency_ms >= 300
    # still firing: the same alert, no second one
    again = store.transaction(lambda tx: evaluator.apply(tx, [finding]))
    assert [e.event for e in again if e.event == "open"] == []
    assert [a.id for a in list_alerts(store)] == [alert.id]
    return alert


def _calls(store: Store, batch: str) -> list[dict[str, Any]]:
    return rows(store, "SELECT a.* FROM task_attempt a JOIN task t ON t.id = a.task_pk "
                       "WHERE t.batch_id = :b AND a.prompt_sha256 IS NOT NULL", b=batch)


def _yes_share(store: Store, batch: str) -> float:
    results = [r["result"] for r in rows(
        store, "SELECT result FROM task WHERE batch_id = :b AND status = 'SUCCEEDED'",
        b=batch)]
    return sum('"label":"yes"' in r.replace(" ", "") for r in results) / len(results)


def _expected(rule: str, store: Store, batch: str, minute: int) -> float:
    """The figure the rule compares, computed from the attempt rows and results."""
    calls = _calls(store, batch)
    if rule == "completeness_collapse":
        return statistics.fmean(a["completeness"] for a in calls
                                if a["parse_status"] is not None
                                and a["completeness"] is not None)
    if rule == "semantic_drift":
        return _yes_share(store, batch)
    if rule == "format_pollution":
        parsed = [a for a in calls if minute <= a["started_at"] < minute + 60_000
                  and a["parse_status"] is not None]
        return sum(a["parse_status"] == "invalid_json" for a in parsed) / len(parsed)
    latencies = sorted(a["latency_ms"] for a in calls)
    return latencies[int(0.5 * (len(latencies) - 1))]


def _key(rule: str) -> str:
    return "semantic_drift:label=yes" if rule == "semantic_drift" else rule


@pytest.mark.parametrize("rule", RULES)
def test_a_switch_fires_its_rule_and_the_rule_clears_when_it_is_off(
        rule: str, store: Store, simulator: SimulatorProcess) -> None:
    # A base latency, so that the noise of a shared machine is small beside it.
    simulator.configure(seed=4, latency=50)
    evaluator = Evaluator(store, Settings(quality=SETTINGS), worker_id="w-evaluator")
    healthy_start = _phase(store, "healthy")
    # format pollution has no baseline: it holds each minute against a fixed share
    baseline = None if rule == "format_pollution" else _expected(rule, store, "healthy", 0)
    _shift(store, "healthy", healthy_start, -WEEK_MS)  # the week-ago baseline

    simulator.configure(degrade={MODEL: SWITCHES[rule]})
    start = _phase(store, "degraded")
    minute, found, events = _check(store, start, evaluator)
    finding = found[_key(rule)]
    assert finding.fired, finding
    assert finding.value == pytest.approx(_expected(rule, store, "degraded", minute),
                                          rel=0.02 if rule.startswith("perf") else 1e-9)
    if rule == "format_pollution":
        assert finding.baseline is None and finding.value > SETTINGS.invalid_json_share
    else:
        assert finding.baseline == pytest.approx(baseline,
                                                 rel=0.02 if rule.startswith("perf") else 1e-9)
        assert finding.value < finding.threshold or rule.startswith("perf")
        assert finding.calls == len(_calls(store, "degraded"))
    fired = {k for k, f in found.items() if f.fired}
    if rule == "format_pollution":  # unparseable answers also lack every field
        assert fired <= {"format_pollution", "completeness_collapse"}
        events = [e for e in events if e.alert.rule == rule]
    else:
        assert fired == {_key(rule)}
    assert simulator.stats()["degraded"]
    alert = _check_alert(rule, store, events, finding, evaluator)

    # switched off: the degraded phase leaves both windows, healthy traffic returns
    simulator.configure(degrade={})
    _shift(store, "degraded", start, -2 * DAY_MS)
    start = _phase(store, "recovered")
    _minute, found, events = _check(store, start, evaluator)
    assert {k for k, f in found.items() if f.fired} == set()
    finding = found[_key(rule)]
    if rule != "format_pollution":
        assert finding.baseline == pytest.approx(baseline,
                                                 rel=0.02 if rule.startswith("perf") else 1e-9)
        assert finding.calls == len(_calls(store, "recovered"))
    assert (alert.id, "resolve") in {(e.alert.id, e.event) for e in events}
    assert list_alerts(store) == []
    resolved = get_alert(store, alert.id)
    assert resolved.status == "RESOLVED" and resolved.resolved_at is not None
    assert [a.id for a in list_alerts(store, everything=True)
            if a.rule == rule] == [alert.id]


def test_slower_answers_fire_on_an_endpoint_that_reports_no_usage(
        store: Store, simulator: SimulatorProcess) -> None:
    """Without usage in the answers the rule had no input size to hold the latency
    against, and never fired; it compares lockgate's estimates then."""
    simulator.configure(seed=4, latency=50, omit_usage=True)
    evaluator = Evaluator(store, Settings(quality=SETTINGS), worker_id="w-evaluator")
    healthy_start = _phase(store, "healthy")
    _shift(store, "healthy", healthy_start, -WEEK_MS)
    simulator.configure(degrade={MODEL: SWITCHES["performance_degradation"]})
    start = _phase(store, "degraded")
    _minute, found, events = _check(store, start, evaluator)
    calls = _calls(store, "degraded")
    assert {a["input_tokens"] for a in calls} == {None} and all(
        a["estimated_tokens"] for a in calls)
    assert found["performance_degradation"].fired, found["performance_degradation"]
    assert [(e.event, e.alert.rule) for e in events] == [("open", "performance_degradation")]
