"""The four anomaly rules end to end: a real worker calls the real simulator, its
write-backs keep the rollups, and ``check_rules()`` reads them. Healthy traffic builds
the baseline, one degradation switch of the simulator is turned on for the model, the
rule fires for that prompt and model with the value the attempts hold against the
baseline's, and once the switch is off again the rule is quiet.

No real hours pass: after each phase the test moves that phase's minute rollups in time
(their ``bucket``), the healthy phase to a week earlier (the baseline a rule prefers),
the degraded one out of both windows once it has been checked; ``now_ms`` places the
check at the end of the phase's busiest minute (the last whole minute format pollution
reads).
"""

from __future__ import annotations

import statistics
from typing import Any

import pytest
from sqlalchemy import text

from engine.support import run_worker, task, text_for
from helpers import rows
from lockgate.config import QualitySettings
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
SETTINGS = QualitySettings(window=1800, min_calls=50, min_calls_minute=10,
                           pollution_minutes=1)
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


def _shift(store: Store, since: int, by_ms: int) -> None:
    """Move the minute rollups from ``since`` on by ``by_ms`` (negative: into the past)."""
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE quality_rollup SET bucket = bucket + :by "
                          "WHERE resolution = 'm' AND bucket >= :since"),
                     {"by": by_ms, "since": since})


def _busiest_minute(store: Store, since: int) -> int:
    calls: dict[int, int] = {}
    for r in QualityStore(store).rows("m", since=since):
        calls[r.bucket] = calls.get(r.bucket, 0) + int(r.values["calls"])
    return max(calls, key=lambda b: calls[b])


def _check(store: Store, since: int) -> tuple[int, dict[str, Finding]]:
    """(the minute checked, the findings by rule) at the end of the phase's busiest
    minute; a drift finding is keyed ``semantic_drift:label=VALUE``."""
    minute = _busiest_minute(store, since)
    found = check_rules(store, SETTINGS, now_ms=minute + 60_000)
    assert {(f.prompt, f.model) for f in found} == {(template_key(TEMPLATE), MODEL)}
    return minute, {f.rule + (f":{f.subject}" if f.subject else ""): f for f in found}


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
    healthy_start = _phase(store, "healthy")
    # format pollution has no baseline: it holds each minute against a fixed share
    baseline = None if rule == "format_pollution" else _expected(rule, store, "healthy", 0)
    _shift(store, healthy_start, -WEEK_MS)  # the healthy phase: the week-ago baseline

    simulator.configure(degrade={MODEL: SWITCHES[rule]})
    start = _phase(store, "degraded")
    minute, found = _check(store, start)
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
    else:
        assert fired == {_key(rule)}
    assert simulator.stats()["degraded"]

    # switched off: the degraded minutes leave both windows, healthy traffic returns
    simulator.configure(degrade={})
    _shift(store, start, -2 * DAY_MS)
    start = _phase(store, "recovered")
    _minute, found = _check(store, start)
    assert {k for k, f in found.items() if f.fired} == set()
    finding = found[_key(rule)]
    if rule != "format_pollution":
        assert finding.baseline == pytest.approx(baseline,
                                                 rel=0.02 if rule.startswith("perf") else 1e-9)
        assert finding.calls == len(_calls(store, "recovered"))
