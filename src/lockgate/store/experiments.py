"""Experiment persistence: A/B tests of prompt versions (docs/quality.md "A/B tests").

An experiment row names a prompt, the control (the live version when it started), the
candidate and its share of the traffic that follows the live version, in basis points
(500 = 5 %, stored exactly). Starting and ending one lock the prompt row, as every
change of the registry does, so at most one runs per prompt (``running`` holds the
prompt's id while it runs, NULL after: a UNIQUE column); a promotion moves the live
pointer in the same transaction that ends the experiment, audited as ``promote``, which
``prompt rollback`` undoes. Workers read the running experiment together with the live
pointer, in the one statement their refresh already runs (:meth:`live_split`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import orjson

from lockgate.errors import NotFound, StateConflict
from lockgate.states import UpdateStatus
from lockgate.store import schema
from lockgate.store.registry import RegistryStore, dumps, inserted_id
from lockgate.store.store import Store
from lockgate.store.tx import Tx, sql


class ExperimentStatus(StrEnum):
    """RUNNING until concluded (PROMOTED, KEPT) or stopped without a decision."""

    RUNNING = "RUNNING"
    PROMOTED = "PROMOTED"
    KEPT = "KEPT"
    STOPPED = "STOPPED"


#: The audit action of each end, and of the start (``prompt_audit.action``).
_AUDIT = {ExperimentStatus.RUNNING: "experiment", ExperimentStatus.PROMOTED: "promote",
          ExperimentStatus.KEPT: "experiment-keep",
          ExperimentStatus.STOPPED: "experiment-stop"}

#: An experiment row, with its prompt's live version now (a running test splits only
#: while that is its control).
_COLUMNS = ("SELECT e.id, p.name AS prompt, e.control_version, e.candidate_version, "
            "e.share_bp, e.status, e.started_at, e.ends_at, e.concluded_at, e.decision, "
            "e.actor, e.reason, p.live_version FROM experiment e "
            "JOIN prompt p ON p.id = e.prompt_id")
_BY_ID = sql(_COLUMNS + " WHERE e.id = :e")
_LATEST = sql(_COLUMNS + " WHERE p.name = :n ORDER BY e.id DESC LIMIT 1")
_OF_PROMPT = sql(_COLUMNS + " WHERE p.name = :n ORDER BY e.id")
_ALL = sql(_COLUMNS + " ORDER BY p.name, e.id")
_RUNNING_OF = sql("SELECT id, candidate_version, ends_at FROM experiment WHERE running = :p")
_GATE_UPDATES = sql("SELECT id, status FROM prompt_update WHERE prompt_id = :p "
                    "AND candidate_version = :v ORDER BY id DESC")
_END = sql("UPDATE experiment SET status = :s, running = NULL, concluded_at = :now, "
           "decision = :d WHERE id = :e AND running IS NOT NULL")

_UNDECIDED = (UpdateStatus.PENDING, UpdateStatus.EVALUATING)


@dataclass(frozen=True, slots=True)
class Split:
    """A running experiment as a worker applies it: until ``left_ms`` from the read
    (the database clock's), while the live version is ``control``, a task whose hash
    falls under ``share_bp`` runs ``candidate``."""

    experiment: int
    control: int
    candidate: int
    share_bp: int
    left_ms: int


def control_moved(name: str, live: int | None, control: int) -> str:
    """Why a running experiment neither splits nor decides once the live version is
    another than its control (a rollback, a release gate's activation)."""
    now = "has no live version now" if live is None else f"is v{live} now"
    return (f"the live version of '{name}' {now}, not the control v{control}: "
            f"no task runs the candidate and the comparison no longer holds; end it with "
            f"`lockgate prompt experiment stop {name}`")


def _row(r: Any) -> dict[str, Any]:
    out = dict(r._mapping)
    out["share"] = out["share_bp"] / 10_000
    out["decision"] = orjson.loads(out["decision"]) if out["decision"] else None
    return out


class ExperimentStore:
    """Experiment rows on one :class:`Store`, changed under the registry's prompt lock."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.registry = RegistryStore(store)
        # One read: the live pointer and, through the UNIQUE ``running`` column, the
        # experiment running on it, with its time left on the database's clock.
        self._live_split = sql(
            "SELECT p.live_version, p.generation, e.id AS experiment, e.control_version, "
            "e.candidate_version, e.share_bp, e.ends_at - "
            f"{store.dialect.now} AS left_ms FROM prompt p LEFT JOIN experiment e "
            "ON e.running = p.id WHERE p.name = :n")

    def live_split(self, name: str) -> tuple[int | None, int, Split | None]:
        """(live version, generation, running experiment or None): the workers' refresh
        of a reference that follows the live version."""
        with self.store.read() as tx:
            r = tx.one(self._live_split, {"n": name}, missing=NotFound(f"no prompt '{name}'"))
        live = None if r["live_version"] is None else int(r["live_version"])
        split = None if r["experiment"] is None else Split(
            int(r["experiment"]), int(r["control_version"]), int(r["candidate_version"]),
            int(r["share_bp"]), int(r["left_ms"]))
        return live, int(r["generation"]), split

    def start(self, name: str, candidate: int, share_bp: int, duration_ms: int, *,
              actor: str | None, reason: str | None) -> dict[str, Any]:
        """A new RUNNING experiment of ``candidate`` against the live version; refused
        while another runs, for the live version itself, and for a version the release
        gate rejected or has not decided on."""
        actor = schema.audit_name(actor)

        def work(tx: Tx) -> dict[str, Any]:
            now = tx.now
            p = self.registry.prompt_row(tx, name, lock=True)
            pid, live = int(p["id"]), p["live_version"]
            self.registry.version_row(tx, name, pid, candidate)
            if live is None:
                raise StateConflict(f"prompt '{name}' has no live version to compare with")
            if candidate == live:
                raise StateConflict(f"version {candidate} is the live version of '{name}': "
                                    "an A/B test runs another version beside it; name a "
                                    "version with --version")
            running = tx.execute(_RUNNING_OF, {"p": pid}).first()
            if running is not None:
                raise StateConflict(
                    f"prompt '{name}' has an A/B test running already (experiment "
                    f"{running.id}, version {running.candidate_version}); one runs at a "
                    f"time: `lockgate prompt experiment conclude {name}` or `... stop "
                    f"{name}` first")
            self._check_gate(tx, name, pid, candidate)
            eid = inserted_id(tx.execute(schema.experiment.insert().values(
                prompt_id=pid, control_version=int(live), candidate_version=candidate,
                share_bp=share_bp, status=ExperimentStatus.RUNNING, running=pid,
                started_at=now, ends_at=now + duration_ms, actor=actor, reason=reason)))
            self.registry.audit(tx, pid, _AUDIT[ExperimentStatus.RUNNING], int(live),
                                candidate, generation=int(p["generation"]), actor=actor,
                                reason=reason, now=now)
            return _row(tx.execute(_BY_ID, {"e": eid}).one())

        return self.store.transaction(work)

    @staticmethod
    def _check_gate(tx: Tx, name: str, pid: int, version: int) -> None:
        """StateConflict for a version the release gate is still evaluating, or whose
        last decision was a rejection: a version the gate refused takes no production
        traffic."""
        updates = tx.execute(_GATE_UPDATES, {"p": pid, "v": version}).all()  # newest first
        for u in updates:
            if u.status in _UNDECIDED:
                raise StateConflict(
                    f"version {version} of '{name}' is still being evaluated by the release "
                    f"gate (update {u.id}, {u.status}); a version takes production traffic "
                    f"only once the gate has not refused it: wait for `lockgate gate status "
                    f"{u.id} --wait`")
        for u in updates:  # the gate's last decision on it counts
            if u.status == UpdateStatus.REJECTED:
                raise StateConflict(
                    f"version {version} of '{name}' was REJECTED by the release gate "
                    f"(update {u.id}); a version the gate refused takes no production "
                    "traffic: propose a better one")
            if u.status == UpdateStatus.ACTIVATED:
                return

    def end(self, name: str, experiment_id: int, status: ExperimentStatus,
            decision: dict[str, Any], *, actor: str | None,
            reason: str | None) -> dict[str, Any]:
        """End the running experiment ``experiment_id`` as ``status``; PROMOTED moves
        the live pointer to its candidate in the same transaction (generation + 1). A
        decision (PROMOTED, KEPT) is refused once the live version is no longer the
        control: the arms no longer compare a change against what is live."""
        actor = schema.audit_name(actor)

        def work(tx: Tx) -> dict[str, Any]:
            now = tx.now
            p = self.registry.prompt_row(tx, name, lock=True)
            e = tx.execute(_BY_ID, {"e": experiment_id}).one()
            if e.status != ExperimentStatus.RUNNING:
                raise StateConflict(f"experiment {experiment_id} of '{name}' ended meanwhile "
                                    f"({e.status}); see `lockgate prompt experiment status "
                                    f"{name}`")
            generation = int(p["generation"])
            if status != ExperimentStatus.STOPPED and p["live_version"] != e.control_version:
                raise StateConflict(control_moved(name, p["live_version"],
                                                  int(e.control_version)))
            if status == ExperimentStatus.PROMOTED:
                generation = self.registry.move_live(
                    tx, p, int(e.candidate_version), _AUDIT[status], actor=actor,
                    reason=reason, now=now)
            else:
                self.registry.audit(tx, int(p["id"]), _AUDIT[status], e.control_version,
                                    e.candidate_version, generation=generation, actor=actor,
                                    reason=reason, now=now)
            tx.execute(_END, {"s": status, "d": dumps(decision), "e": experiment_id})
            out = _row(tx.execute(_BY_ID, {"e": experiment_id}).one())
            out["generation"] = generation
            return out

        return self.store.transaction(work)

    def latest(self, name: str) -> dict[str, Any]:
        """The prompt's newest experiment; NotFound naming how to start one."""
        with self.store.read() as tx:
            self.registry.prompt_row(tx, name)
            r = tx.execute(_LATEST, {"n": name}).first()
        if r is None:
            raise NotFound(f"prompt '{name}' has no A/B test; start one with `lockgate "
                           f"prompt experiment start {name} --version N`")
        return _row(r)

    def running(self, name: str) -> dict[str, Any]:
        """The prompt's running experiment; NotFound (naming the last one) otherwise."""
        e = self.latest(name)
        if e["status"] != ExperimentStatus.RUNNING:
            raise NotFound(f"prompt '{name}' has no A/B test running (the last one, "
                           f"experiment {e['id']}, ended {e['status']})")
        return e

    def list(self, name: str | None = None) -> list[dict[str, Any]]:
        """Every experiment (of one prompt), by prompt and age."""
        with self.store.read() as tx:
            if name is None:
                return [_row(r) for r in tx.execute(_ALL)]
            self.registry.prompt_row(tx, name)
            return [_row(r) for r in tx.execute(_OF_PROMPT, {"n": name})]

    def now(self) -> int:
        """The database clock (ms)."""
        return self.store.db_now()
