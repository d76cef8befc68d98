"""One evaluator at a time: four evaluators racing (threads, each with its own Store,
some stalling past their lease between claiming and writing; and four worker processes
running the evaluator service) make exactly one alert per incident; a holder killed
with SIGKILL is replaced once its lease has run out, and nothing is doubled."""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

from helpers import clean_env, kill_settled, rows, scalar, wait_for
from lockgate.config import Webhook
from lockgate.quality.alerts import ROLE, Evaluator, Event
from lockgate.store import Store
from lockgate.store.alerts import AlertStore

from .alerting import collapse, feed, settings

HOOK = (Webhook(name="ops", url="http://127.0.0.1:9/hook"),)


def _counts(store: Store) -> dict[str, Any]:
    return {
        "alerts": scalar(store, "SELECT COUNT(*) FROM quality_alert"),
        "events": sorted((r["event"], r["n"]) for r in rows(
            store, "SELECT event, COUNT(*) AS n FROM alert_delivery GROUP BY event")),
    }


def test_four_evaluators_racing_open_one_alert_per_incident(store: Store,
                                                             db_url: str) -> None:
    collapse(store)
    s = settings(evaluator_lease_s=2.0, webhook=HOOK)
    events: list[Event] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    resolve_at = time.monotonic() + 6.0

    def run(i: int) -> None:
        own = Store(db_url)
        ev = Evaluator(own, s, worker_id=f"w{i}")
        rnd = random.Random(i)
        claim = ev.claim

        def stalling_claim() -> bool:
            held = claim()
            if held and rnd.random() < 0.3:
                time.sleep(2.3)  # past the lease, between claiming and writing
            return held

        ev.claim = stalling_claim  # type: ignore[method-assign]
        try:
            while not stop.is_set():
                events.extend(ev.tick())
                time.sleep(rnd.uniform(0, 0.2))
        except BaseException as exc:
            errors.append(exc)
        finally:
            own.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: any(e.event == "open" for e in events), "an open", timeout=30)
        while time.monotonic() < resolve_at:
            time.sleep(0.1)
        feed(store, 800, ago_ms=10_000)  # the rule clears
        wait_for(lambda: any(e.event == "resolve" for e in events), "the resolve",
                 timeout=30)
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert errors == []
    assert sorted(e.event for e in events) == ["open", "resolve"]
    assert _counts(store) == {"alerts": 1, "events": [("open", 1), ("resolve", 1)]}


_SERVICE = textwrap.dedent("""
    import asyncio, logging, sys
    from lockgate.config import QualitySettings, Settings
    from lockgate.quality.service import AlertService
    from lockgate.store import Store
    logging.basicConfig(level=logging.INFO)
    s = Settings(quality=QualitySettings(evaluate_every=1.0,
                                         evaluator_lease_s=2.0))
    async def main():
        stopping = asyncio.Event()
        asyncio.get_running_loop().call_later(float(sys.argv[3]), stopping.set)
        await AlertService(Store(sys.argv[1]), s).run(stopping, sys.argv[2])
    asyncio.run(main())
""")


def test_four_worker_processes_keep_one_alert(store: Store, db_url: str,
                                              backend: str) -> None:
    if backend == "sqlite":
        pytest.skip("worker processes across machines share a server database")
    collapse(store)
    procs = [subprocess.Popen([sys.executable, "-c", _SERVICE, db_url, f"proc{i}", "6"],
                              env=clean_env(), stderr=subprocess.PIPE)
             for i in range(4)]
    logs = [p.communicate(timeout=120)[1].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], logs
    opened = [line for log in logs for line in log.splitlines() if " OPEN: " in line]
    assert len(opened) == 1, logs
    assert scalar(store, "SELECT COUNT(*) FROM quality_alert") == 1
    role = AlertStore(store).role(ROLE)
    assert role is not None and role["lease_until"] <= store.db_now()  # handed back


_HOLDER = textwrap.dedent("""
    import sys, time
    from lockgate.config import QualitySettings, Settings, Webhook
    from lockgate.quality.alerts import Evaluator
    from lockgate.store import Store
    s = Settings(quality=QualitySettings(evaluate_every=1.0, evaluator_lease_s=4.0,
        webhook=(Webhook(name="ops", url="http://127.0.0.1:9/hook"),)))
    ev = Evaluator(Store(sys.argv[1]), s, worker_id="victim")
    while True:
        ev.tick()
        time.sleep(0.2)
""")


def test_a_killed_evaluator_is_replaced_after_its_lease(store: Store, db_url: str) -> None:
    collapse(store)
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER, db_url], env=clean_env())
    try:
        wait_for(lambda: scalar(store, "SELECT COUNT(*) FROM quality_alert") == 1,
                 "the victim to open the alert", timeout=60)
    finally:
        kill_settled(proc, store)
    role = AlertStore(store).role(ROLE)
    assert role is not None and role["holder"] == "victim"
    heir = Evaluator(store, settings(evaluator_lease_s=4.0, webhook=HOOK),
                     worker_id="heir")
    if role["lease_until"] > store.db_now():
        assert heir.tick() == [] and not heir.holding  # the lease still stands
    wait_for(heir.claim, "the heir to take the role", timeout=30, interval=0.2)
    assert heir.tick() == []  # the incident has its alert: nothing opens again
    feed(store, 100, ago_ms=5_000, completeness=0.5)
    heir.tick()
    assert _counts(store) == {"alerts": 1, "events": [("open", 1)]}
    [a] = rows(store, "SELECT tasks, status FROM quality_alert")
    assert (a["tasks"], a["status"]) == (250, "OPEN")
    role = AlertStore(store).role(ROLE)
    assert role is not None and role["holder"] == "heir"
