"""A hypothesis state machine that interleaves submissions, role steps of several workers,
task execution, crashes (claims abandoned mid-step) and rollbacks on PostgreSQL and
MariaDB (and, with fewer examples, SQLite), and checks after every step:

* the live version is always the initial one, a candidate that passed the gate (and
  was the newest submission, evaluated against the live version it replaced), or an
  explicit rollback target that had been live before;
* no superseded, stale, rejected or failed evaluation ever activates;
* no update or run ever leaves a terminal state;
* at the end, every evaluation reaches a decision.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from lockgate.errors import NotFound, StateConflict
from lockgate.gate.roles import score_item
from lockgate.states import ACTIVE_RUNS, ACTIVE_UPDATES, TERMINAL_RUNS, RunStatus
from lockgate.store import Store

from .support import BAD, GOOD, MEDIOCRE, Env, execute, rows, yes_no

#: Candidate templates and whether they pass (accuracy >= 0.7 on the dataset).
POOL: list[tuple[list[dict[str, str]], bool]] = [
    (GOOD, True), (yes_no("refund|money back|reimburse|refunded"), True),
    (MEDIOCRE, True), (BAD, False), (yes_no("colour"), False),
]
ITEMS = 12


class GateMachine(RuleBasedStateMachine):
    """The gate under random interleavings; ``store`` and ``seen`` are set by the test."""

    store: Store
    seen: set[str]

    @initialize(first=st.integers(0, len(POOL) - 1))
    def fresh(self, first: int) -> None:
        self.store.truncate_all()
        self.env = Env(self.store)
        self.env.setup(datasets={"d": ITEMS}, thresholds=["accuracy>=0.7"])
        self.passing: dict[int, bool] = {1: True}  # version -> passes
        self.terminal: dict[tuple[str, int], tuple[Any, ...]] = {}
        self.rng = random.Random(0)
        self.submitted = 0
        # a history to roll back to: v2 passed the gate and went live
        self.submit(0)
        self.work(3)
        assert self.env.live() == 2
        self.submit(first)

    # -- rules -----------------------------------------------------------------------

    @precondition(lambda self: self.submitted < 5
                  and len(self.env.gate.gs.active_updates()) < 2)
    @rule(choice=st.integers(0, len(POOL) - 1))
    def submit(self, choice: int) -> None:
        tpl, passes = POOL[choice]
        self.submitted += 1
        try:
            p = self.env.prompts.propose("p", tpl)
        except StateConflict:  # identical to the live version
            return
        self.passing[p.version] = passes

    @rule(worker=st.sampled_from(["w1", "w2", "w3"]), page=st.sampled_from([2, 5, 500]))
    def gate_step(self, worker: str, page: int) -> None:
        self.env.roles(worker, page=page).tick()

    @rule(limit=st.integers(1, 30))
    def run_tasks(self, limit: int) -> None:
        execute(self.store, limit=limit)

    @rule(rounds=st.integers(1, 4))
    def work(self, rounds: int) -> None:
        """Workers left alone for a while: role steps and calls in turn."""
        for _ in range(rounds):
            self.env.roles("w1").tick()
            execute(self.store)

    @rule(limit=st.integers(1, 10))
    def crash_in_execute(self, limit: int) -> None:
        execute(self.store, limit=limit, crash=True)

    @rule(data=st.data())
    def crash_in_a_role(self, data: st.DataObject) -> None:
        """A worker takes a run's lease, does part of its step, and dies."""
        gs = self.env.gate.gs
        active = [r for u, _s in gs.active_updates() for r in gs.runs(u)
                  if r["status"] in ACTIVE_RUNS]
        if not active:
            return
        run = data.draw(st.sampled_from(active))
        rid, token = int(run["id"]), f"dead{self.rng.randrange(10**6)}"
        if not gs.claim_run(rid, run["status"], token=token, lease_ms=1,
                            worker_id="dead", require_tasks_done=
                            run["status"] == RunStatus.EXECUTING):
            return
        if run["status"] == RunStatus.MATERIALIZING:
            snap = self.env.gate.gs.update(int(run["update_id"]))["snapshot"]
            gs.materialize_page(rid, token=token, lease_ms=1,
                                revision=snap["datasets"][0]["revision"], page=3)
        else:
            roles = self.env.roles("dead")
            comp = roles.comparator(roles.settings_for(run))
            part = gs.undecided_items(rid, limit=4)
            gs.record_verdicts(rid, token=token, lease_ms=1,
                               verdicts=[score_item(comp, r) for r in part])

    @rule(to=st.one_of(st.none(), st.integers(1, 6)))
    def rollback(self, to: int | None) -> None:
        try:
            self.env.prompts.rollback("p", to=to, reason="hypothesis")
        except (StateConflict, NotFound):  # not a known-good version, or no such one
            return

    @rule()
    def cancel_one(self) -> None:
        active = self.env.gate.gs.active_updates()
        if active:
            self.env.gate.cancel(active[0][0], reason="hypothesis")

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def live_is_gated_or_rolled_back(self) -> None:
        audit = self.env.prompts.history("p")["audit"]
        live = self.env.live()
        updates = {u["id"]: u for u in rows(self.store, "SELECT * FROM prompt_update")}
        history: list[int] = []
        newest_seq = 0
        for a in audit:
            if a["action"] == "propose":
                newest_seq = max(newest_seq, int(updates[a["update_id"]]["seq"]))
            if a["action"] == "create":
                history.append(a["to_version"])
            elif a["action"] == "activate":
                u = updates[a["update_id"]]
                assert u["status"] == "ACTIVATED", u
                assert self.passing[u["candidate_version"]], "a failing version went live"
                assert int(u["seq"]) == newest_seq, "an older submission activated"
                assert history[-1] == u["base_version"], "activated over a moved base"
                history.append(a["to_version"])
            elif a["action"] == "rollback":
                assert a["to_version"] in history, "rolled back to a never-live version"
                assert a["from_version"] == history[-1]
                history.append(a["to_version"])
        assert live == history[-1]
        activated = {u["id"] for u in updates.values() if u["status"] == "ACTIVATED"}
        assert activated == {a["update_id"] for a in audit if a["action"] == "activate"}

    @invariant()
    def terminal_states_are_never_left(self) -> None:
        for u in rows(self.store, "SELECT id, status, decided_at, version FROM prompt_update"):
            if u["status"] not in ACTIVE_UPDATES:
                key = ("update", int(u["id"]))
                seen = self.terminal.setdefault(key, (u["status"], u["decided_at"],
                                                      u["version"]))
                assert seen == (u["status"], u["decided_at"], u["version"]), key
        for r in rows(self.store, "SELECT id, status, metrics FROM prompt_run"):
            if r["status"] in TERMINAL_RUNS:
                key = ("run", int(r["id"]))
                seen = self.terminal.setdefault(key, (r["status"], r["metrics"]))
                assert seen == (r["status"], r["metrics"]), key

    def teardown(self) -> None:
        if not hasattr(self, "env"):
            return
        for _ in range(60):  # liveness: with workers left alone, everything is decided
            if not self.env.gate.gs.active_updates():
                break
            self.env.roles("final").tick()
            execute(self.store)
        assert not self.env.gate.gs.active_updates(), "an evaluation never finished"
        self.live_is_gated_or_rolled_back()
        self.terminal_states_are_never_left()
        self.seen.update(r["status"] for r in rows(self.store, "SELECT status FROM prompt_update"))
        self.seen.update(r["action"] for r in rows(self.store, "SELECT action FROM prompt_audit"))


@pytest.mark.slow
def test_gate_state_machine(backend: str, store: Store) -> None:
    GateMachine.store = store
    GateMachine.seen = seen = set()
    run_state_machine_as_test(GateMachine, settings=settings(
        max_examples=10 if backend != "sqlite" else 5, stateful_step_count=20,
        deadline=None, suppress_health_check=[HealthCheck.too_slow]))
    assert {"ACTIVATED", "activate", "propose"} <= seen, seen
