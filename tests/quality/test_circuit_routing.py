"""Real workers against the simulator with completeness circuits: an open circuit sends
new tasks to its fallback version or endpoint (a hash-chosen share still probing the
primary), a degraded prompt trips its circuit during a run, and no task is lost or
delivered twice while circuits switch under calls in flight."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from engine.support import TEMPLATE, BackgroundWorker, WorkerPool, task
from helpers import kill_settled, rows, wait_for
from lockgate import Lockgate
from lockgate.config import (
    CircuitSettings,
    Endpoint,
    QualitySettings,
    Settings,
    WorkerSettings,
)
from lockgate.quality.circuit import probes
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import template_key
from lockgate.store import Store

INLINE = template_key(TEMPLATE)
#: Declares both fields the delivery rule expects: complete answers.
GOOD = [{"role": "system", "content": 'Reply with JSON like {{"label": "yes", "reason": '
                                      '"text"}}.\nlabel: one of yes, no\n'
                                      "If the text mentions refund then label = yes\n"
                                      "Otherwise label = no"},
        {"role": "user", "content": "<input>\n{text}\n</input>"}]
#: Declares only the label: every answer lacks its reason (completeness 0.5), which the
#: rule's fallback value fills, so the tasks still succeed.
BAD = [{"role": "system", "content": 'Reply with JSON like {{"label": "yes"}}.\n'
                                     "label: one of yes, no\nOtherwise label = no"},
       {"role": "user", "content": "<input>\n{text}\n</input>"}]
RULE = {"format": "json", "required_keys": ["label", "reason"],
        "fallback_values": {"reason": "-"}, "on_invalid": "fallback"}
MODEL = {"name": "sim-small", "temperature": 0, "timeout_ms": 20_000}


def _settings(circuit: dict[str, Any], *, endpoints: tuple[Endpoint, ...] = (),
              **quality: Any) -> Settings:
    c = CircuitSettings(**{"threshold": 0.9, "window": "1m", "min_calls": 20,
                           "probation": "1m", "probe_share": 0.2, **circuit})
    return Settings(endpoint=endpoints,
                    worker=WorkerSettings(concurrency=16, poll_max_s=0.05),
                    quality=QualitySettings(circuit=(c,), circuit_every_s=0.1,
                                            circuit_refresh_s=0.05, **quality))


def _prompts(lg: Lockgate) -> None:
    lg.prompts.create("labels", BAD, model_config=MODEL, delivery_rule=RULE)
    lg.prompts.create("labels-safe", GOOD, model_config=MODEL, delivery_rule=RULE)


def _registry_tasks(n: int, prefix: str, retries: int = 3) -> list[dict[str, Any]]:
    return [{"task_id": f"{prefix}-{i:04d}", "prompt_template": "@registry:labels",
             "input_data": {"text": f"order {i}: where is it"},
             "retry_policy": {"max_retries": retries, "base_delay_ms": 20}}
            for i in range(n)]


def _delivered(lg: Lockgate) -> dict[str, list[dict[str, Any]]]:
    """Per task, its attempts that delivered a result (succeeded), with the path taken."""
    out: dict[str, list[dict[str, Any]]] = {}
    for a in rows(lg.store, "SELECT t.task_id, a.outcome, a.prompt_version, a.endpoint, "
                            "a.routed_from FROM task_attempt a JOIN task t "
                            "ON t.id = a.task_pk ORDER BY a.id"):
        out.setdefault(a["task_id"], [])
        if a["outcome"] == "succeeded":
            out[a["task_id"]].append(a)
    return out


def test_an_open_circuit_routes_to_a_fallback_version(
        db_url: str, simulator: SimulatorProcess) -> None:
    circuit = CircuitSettings(prompt="labels", fallback_prompt="labels-safe@1",
                              probe_share=0.2)
    simulator.configure(rate_500=0.3, seed=5)  # retries: each keeps its task's path
    with Lockgate(db_url, settings=_settings({"prompt": "labels",
                                              "fallback_prompt": "labels-safe@1"})) as lg:
        _prompts(lg)
        lg.submit(_registry_tasks(40, "r", retries=20), batch_id="r")
        lg.open_circuit("labels", actor="ops")
        lg.run_worker(burst=True)
        paths: dict[str, set[str]] = {}
        for a in rows(lg.store, "SELECT t.task_id, a.prompt_version FROM task_attempt a "
                                "JOIN task t ON t.id = a.task_pk"):
            paths.setdefault(a["task_id"], set()).add(a["prompt_version"])
        assert all(len(p) == 1 for p in paths.values())
        assert rows(lg.store, "SELECT COUNT(*) AS n FROM task_attempt WHERE outcome = "
                              "'retry'")[0]["n"] > 0
        delivered = _delivered(lg)
        assert len(delivered) == 40 and all(len(v) == 1 for v in delivered.values())
        probed = {t for t in delivered if probes(t, circuit)}
        assert 0 < len(probed) < 40
        for t, [a] in delivered.items():
            assert a["prompt_version"] == ("labels@1" if t in probed else "labels-safe@1")
        safe = [r for r in lg.results("r") if r.task_id not in probed]
        assert all(r.result["reason"] != "-" for r in safe)  # the fallback's answers
        assert {q.prompt: q.tasks for q in lg.quality(by="version")} == \
            {"labels-safe@1": 40 - len(probed), "labels@1": len(probed)}


def test_a_fallback_version_that_does_not_exist_leaves_the_tasks_on_the_primary(
        db_url: str, simulator: SimulatorProcess, caplog: pytest.LogCaptureFixture) -> None:
    settings = _settings({"prompt": "labels", "fallback_prompt": "labels-safe@9"})
    with Lockgate(db_url, settings=settings) as lg:
        _prompts(lg)
        lg.submit(_registry_tasks(20, "m"), batch_id="m")
        lg.open_circuit("labels")
        with caplog.at_level(logging.WARNING, logger="lockgate.worker"):
            lg.run_worker(burst=True)
        assert lg.status().batches["m"] == {"SUCCEEDED": 20}
        assert {a["prompt_version"] for [a] in _delivered(lg).values()} == {"labels@1"}
        assert "fallback_prompt cannot be run" in caplog.text
        assert caplog.text.count("fallback_prompt cannot be run") == 1  # then remembered


def test_an_open_circuit_on_an_inline_prompt_routes_to_another_endpoint(
        db_url: str, simulator: SimulatorProcess) -> None:
    eps = (Endpoint(name="primary", base_url=simulator.url, models=("sim-small",)),
           Endpoint(name="backup", base_url=simulator.url))
    settings = _settings({"prompt": INLINE, "fallback_endpoint": "backup"}, endpoints=eps)
    circuit = settings.quality.circuit[0]
    with Lockgate(db_url, settings=settings) as lg:
        lg.submit([task(f"e-{i}", f"order {i}") for i in range(40)], batch_id="e")
        lg.open_circuit(INLINE)
        lg.run_worker(burst=True)
        delivered = _delivered(lg)
        assert len(delivered) == 40 and all(len(v) == 1 for v in delivered.values())
        for t, [a] in delivered.items():
            if probes(t, circuit):
                assert (a["endpoint"], a["routed_from"]) == ("primary", None)
            else:
                assert (a["endpoint"], a["routed_from"]) == ("backup", "primary")
        assert {a["endpoint"] for [a] in delivered.values()} == {"primary", "backup"}
        lg.close_circuit(INLINE)
        lg.submit([task(f"f-{i}", f"order {i}") for i in range(10)], batch_id="f")
        lg.run_worker(burst=True)
        assert {a["endpoint"] for t, [a] in _delivered(lg).items() if t.startswith("f-")} \
            == {"primary"}


def test_a_degraded_prompt_trips_its_circuit_during_a_run(
        db_url: str, simulator: SimulatorProcess) -> None:
    settings = _settings({"prompt": "labels", "fallback_prompt": "labels-safe@1"})
    circuit = settings.quality.circuit[0]
    with Lockgate(db_url, settings=settings) as lg:
        _prompts(lg)
        lg.submit(_registry_tasks(60, "a"), batch_id="a")
        bg = BackgroundWorker(lg.store)
        bg.worker = lg.worker()  # with its side services: the circuit's evaluator
        with bg:
            # 60 calls at completeness 0.5: the minute they are in has its 20 calls
            wait_for(lambda: lg.circuits()[0].state == "OPEN", "the circuit to open",
                     timeout=150, interval=0.2)
            lg.submit(_registry_tasks(60, "b"), batch_id="b")
            wait_for(lambda: lg.status().batches.get("b") == {"SUCCEEDED": 60},
                     "batch b to finish", timeout=60)
            stats = bg.stop()
        [e] = rows(lg.store, "SELECT * FROM quality_circuit_event")
        assert (e["from_state"], e["to_state"], e["actor"]) == ("CLOSED", "OPEN", bg.worker.id)
        delivered = _delivered(lg)
        assert len(delivered) == 120 and all(len(v) == 1 for v in delivered.values())
        assert {a["prompt_version"] for t, [a] in delivered.items() if t.startswith("a-")
                and not probes(t, circuit)} <= {"labels@1", "labels-safe@1"}
        for t, [a] in delivered.items():
            if t.startswith("b-"):  # submitted after the trip
                assert a["prompt_version"] == ("labels@1" if probes(t, circuit)
                                               else "labels-safe@1")
        assert stats.succeeded == 120 and stats.discarded == 0


@pytest.mark.slow
def test_no_task_is_lost_or_delivered_twice_while_a_circuit_switches(
        db_url: str, simulator: SimulatorProcess) -> None:
    simulator.configure(latency={"kind": "lognormal", "mean_ms": 20.0}, seed=3)
    settings = _settings({"prompt": INLINE, "fallback": "review", "probe_share": 0.1})
    n_waves, per_wave = 6, 50
    with Lockgate(db_url, settings=settings) as lg:
        bg = BackgroundWorker(lg.store)
        bg.worker = lg.worker()
        stop = threading.Event()
        switches: list[str] = []

        def toggle() -> None:  # the operator opens and closes it while calls run
            while not stop.wait(0.15):
                state = lg.circuits()[0].state
                (lg.close_circuit if state == "OPEN" else lg.open_circuit)(INLINE)
                switches.append(state)

        with bg:
            flipper = threading.Thread(target=toggle)
            flipper.start()
            waves = 0
            try:
                # at least n_waves, and on until the circuit has switched 4 times (the
                # waves' speed, not the switching, decides how many that takes)
                while waves < n_waves or (len(switches) < 4 and waves < 40):
                    w = waves
                    lg.submit([task(f"w{w}-{i:03d}", f"order {i}") for i in range(per_wave)],
                              batch_id=f"w{w}")
                    wait_for(lambda: not lg.status().batches.get(f"w{w}", {}).get(  # noqa: B023
                        "PENDING"), f"wave {w} to leave PENDING", timeout=60)
                    waves += 1
            finally:
                stop.set()
                flipper.join()
            stats = bg.stop()
        assert len(switches) >= 4
        total = waves * per_wave
        states = {r["task_id"]: r["status"] for r in rows(
            lg.store, "SELECT task_id, status FROM task")}
        assert len(states) == total and set(states.values()) <= {"SUCCEEDED", "REVIEW"}
        review = {t for t, s in states.items() if s == "REVIEW"}
        assert review and len(review) < total
        delivered = _delivered(lg)
        for t, s in states.items():
            assert len(delivered.get(t, [])) == (1 if s == "SUCCEEDED" else 0), t
        held = rows(lg.store, "SELECT t.task_id FROM task_attempt a JOIN task t ON "
                              "t.id = a.task_pk WHERE a.outcome = 'review'")
        assert sorted(r["task_id"] for r in held) == sorted(review)
        assert not rows(lg.store, "SELECT id FROM task_attempt WHERE outcome = 'discarded'")
        assert stats.succeeded + stats.review == total
        for t in sorted(review)[:5]:
            lg.resolve(t, {"label": "no"})
        assert lg.status().review == len(review) - min(5, len(review))


@pytest.mark.slow
def test_a_tripped_circuit_probes_recovers_and_closes_during_a_run(
        db_url: str, simulator: SimulatorProcess) -> None:
    """``labels@canary`` points at a degraded version, then back at a good one: the
    circuit opens, its probes see the recovery, and after its probation it closes."""
    settings = _settings({"prompt": "labels", "fallback_prompt": "labels-safe@1",
                          "probe_share": 0.25})
    circuit = settings.quality.circuit[0]
    with Lockgate(db_url, settings=settings) as lg:
        lg.prompts.create("labels", GOOD, model_config=MODEL, delivery_rule=RULE)
        lg.prompts.create("labels-safe", GOOD, model_config=MODEL, delivery_rule=RULE)
        lg.datasets.add("d", [{"id": "1", "input": {"text": "a"}, "expected": "no"}])
        lg.gate.bind("labels", "d", thresholds=["accuracy>=0"])
        assert lg.prompts.propose("labels", BAD).version == 2  # evaluated by no one here
        lg.prompts.label("labels", "canary", 2)

        def wave(prefix: str, n: int) -> None:
            lg.submit([{**t, "prompt_template": "@registry:labels@canary"}
                       for t in _registry_tasks(n, prefix)], batch_id=prefix)

        wave("a", 60)
        bg = BackgroundWorker(lg.store)
        bg.worker = lg.worker(gate=False)
        stop = threading.Event()
        waves: list[str] = []

        def feed() -> None:  # traffic while the circuit is open: a quarter are probes
            while not stop.wait(0.5):
                waves.append(f"p{len(waves)}")
                wave(waves[-1], 8)

        with bg:
            wait_for(lambda: lg.circuits()[0].state == "OPEN", "the circuit to open",
                     timeout=150, interval=0.2)
            lg.prompts.label("labels", "canary", 1)  # the primary path is good again
            # A minute of probation passes at once. First, waves of probe traffic until
            # a probe has run the good version (the worker sees the label's move) and
            # nothing is in flight; then the circuit's row moves a minute into the past
            # and the minute rollups so far an hour (out of the probes' window), so only
            # the probes from now on decide the close.
            def primary_good() -> bool:
                waves.append(f"p{len(waves)}")
                wave(waves[-1], 8)
                wait_for(lambda: not any(c.get("PENDING")
                                         for c in lg.status().batches.values()),
                         "the wave to finish", timeout=60, interval=0.1)
                return any(a["prompt_version"] == "labels@1"
                           for t, v in _delivered(lg).items() if t.startswith("p")
                           and probes(t, circuit) for a in v)

            wait_for(primary_good, "a probe to run the good version", timeout=60,
                     interval=0.1)
            with lg.store.engine.begin() as conn:
                conn.execute(text("UPDATE quality_circuit SET since = since - 60000"))
                conn.execute(text("UPDATE quality_rollup SET bucket = bucket - 3600000 "
                                  "WHERE resolution = 'm'"))
            feeder = threading.Thread(target=feed)
            feeder.start()
            try:
                wait_for(lambda: lg.circuits()[0].state == "CLOSED", "the circuit to close",
                         timeout=240, interval=0.5)
            finally:
                stop.set()
                feeder.join()
            wave("z", 20)
            wait_for(lambda: not any(c.get("PENDING") for c in lg.status().batches.values()),
                     "every task to finish", timeout=60)
            stats = bg.stop()
        events = rows(lg.store, "SELECT * FROM quality_circuit_event ORDER BY version")
        assert [(e["from_state"], e["to_state"], e["actor"]) for e in events] == \
            [("CLOSED", "OPEN", bg.worker.id), ("OPEN", "CLOSED", bg.worker.id)]
        assert "probes back at 100.0%" in events[1]["reason"]
        delivered = _delivered(lg)
        assert all(len(v) == 1 for v in delivered.values())
        assert len(delivered) == 60 + 8 * len(waves) + 20 == stats.succeeded
        paths = {a["prompt_version"] for t, [a] in delivered.items() if t.startswith("p")
                 and probes(t, circuit)}
        assert "labels@1" in paths  # the probes ran the primary path
        assert {a["prompt_version"] for t, [a] in delivered.items() if t.startswith("z-")} \
            == {"labels@1"}  # closed: everything on the primary again


@pytest.mark.slow
def test_worker_processes_switching_paths_and_a_killed_one_lose_no_task(
        db_url: str, store: Store, simulator: SimulatorProcess, tmp_path: Path) -> None:
    """Two ``lockgate worker`` processes (each evaluating the circuit) while an operator
    opens and closes it and one worker is killed -9 mid-run: every task ends SUCCEEDED
    with exactly one delivered answer, or held for review with none."""
    simulator.configure(latency={"kind": "lognormal", "mean_ms": 300.0}, seed=11)
    cfg = tmp_path / "lockgate.toml"
    cfg.write_text(f'[quality]\ncircuit_every_s = 0.2\ncircuit_refresh_s = 0.1\n'
                   f'[[quality.circuit]]\nprompt = "{INLINE}"\nfallback = "review"\n'
                   "probe_share = 0.1\n")
    log_dir = tmp_path / "workers"
    log_dir.mkdir()
    pool = WorkerPool(db_url, simulator.url, log_dir)
    settings = _settings({"prompt": INLINE, "fallback": "review", "probe_share": 0.1})
    try:
        procs = [pool.start(burst=False, concurrency=16, lease=3.0,
                            extra=["--config", str(cfg)]) for _ in range(2)]
        with Lockgate(db_url, settings=settings) as lg:
            for w in range(6):
                (lg.open_circuit if w % 2 == 0 else lg.close_circuit)(INLINE)
                lg.submit([task(f"m{w}-{i:03d}", f"order {i}") for i in range(60)],
                          batch_id=f"m{w}")
                if w == 2:  # kill a worker while it holds leases
                    wait_for(lambda: lg.status().leased, "leases in flight", timeout=60)
                    kill_settled(procs[0].popen, store)
                    pool.start(burst=False, concurrency=16, lease=3.0,
                               extra=["--config", str(cfg)])
                wait_for(lambda: not lg.status().batches[f"m{w}"].get(  # noqa: B023
                    "PENDING"), f"wave {w} to leave PENDING", timeout=90, interval=0.1)
            states = {r["task_id"]: r["status"] for r in rows(
                lg.store, "SELECT task_id, status FROM task")}
            delivered = _delivered(lg)
            events = rows(lg.store, "SELECT * FROM quality_circuit_event ORDER BY version")
    finally:
        pool.close()
    assert len(states) == 360 and set(states.values()) == {"SUCCEEDED", "REVIEW"}, \
        pool.logs()
    for t, s in states.items():
        assert len(delivered.get(t, [])) == (1 if s == "SUCCEEDED" else 0), t
    assert [e["version"] for e in events] == list(range(1, 7))
