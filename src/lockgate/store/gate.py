"""Release-gate persistence: bindings, candidate updates and their decisions (the run
steps of the roles are in :mod:`lockgate.store.gate_runs`, which this builds on).

Every state transition goes through ``GateRows._move`` (one conditional UPDATE naming
the states it leaves, :data:`lockgate.states.ARROWS`); activation is a compare-and-swap
on ``prompt.generation`` and the submission counter (docs/gate.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from sqlalchemy import TextClause

from lockgate.errors import NotFound, SpecError, StateConflict
from lockgate.spec import config_hash
from lockgate.states import (
    ACTIVE_RUNS,
    ACTIVE_UPDATES,
    RunStatus,
    UpdateStatus,
    Verdict,
)
from lockgate.store import schema
from lockgate.store.gate_runs import RunPlan, RunSteps, batch_id_for
from lockgate.store.registry import VersionContent, dumps, inserted_id
from lockgate.store.tx import Tx, sql

U, R, V = UpdateStatus, RunStatus, Verdict


@dataclass(frozen=True, slots=True)
class Proposal:
    """What ``propose`` did: the tracking id, the version, and what it superseded."""

    update_id: int
    version: int
    new_version: bool
    base_version: int | None
    superseded: list[int]


@dataclass(frozen=True, slots=True)
class Outcome:
    """The end of a reconcile step: the update's status now, and why."""

    status: str
    reason: str | None


class _Abort(Exception):
    def __init__(self, status: str) -> None:
        super().__init__(status)
        self.status = status


K = TypeVar("K", str, int)

# The statements, the same on every dialect (inserts go through the schema's tables and
# ``Dialect.insert_ignore``; status changes through ``GateRows._move``).

# -- bindings of datasets to prompts
_DATASET_ID = sql("SELECT id, revision FROM dataset WHERE name = :n")
_EXPECTED_AT = sql("SELECT expected FROM dataset_item WHERE dataset_id = :d AND added_rev "
                   "<= :rev AND (retired_rev IS NULL OR retired_rev > :rev)")
_SET_BINDING = sql("UPDATE prompt_dataset SET settings = :s, updated_at = :now, "
                   "version = version + 1 WHERE prompt_id = :p AND dataset_id = :d")
_UNBIND = sql("DELETE FROM prompt_dataset WHERE prompt_id = :p AND dataset_id = "
              "(SELECT id FROM dataset WHERE name = :n)")
_BINDINGS = sql("SELECT d.id, d.name, d.revision, d.item_count, d.items_hash, "
                "d.input_keys, b.settings FROM prompt_dataset b JOIN dataset d "
                "ON d.id = b.dataset_id WHERE b.prompt_id = :p ORDER BY d.name")

# -- proposals and their cancellation
_COUNT_SUBMISSION = sql("UPDATE prompt SET submissions = submissions + 1, "
                        "updated_at = :now WHERE id = :p")
_OTHER_ACTIVE = sql("SELECT id FROM prompt_update WHERE prompt_id = :p AND id <> :u "
                    "AND status IN :st", "st")
_ACTIVE_RUNS_OF = sql("SELECT id, batch_id FROM prompt_run WHERE update_id IN :ids "
                      "AND status IN :st", "ids", "st")
_CANCEL_TASKS = sql("UPDATE task SET status = 'CANCELLED', finished_at = :now, "
                    "updated_at = :now, version = version + 1, error_message = :msg "
                    "WHERE batch_id IN :ids AND status = 'PENDING'", "ids")

# -- updates and their runs, for people and the roles
_UPDATE_ROW = sql("SELECT prompt_id, seq, base_generation, base_version, candidate_version, "
                  "status FROM prompt_update WHERE id = :u")
_UPDATE = sql("SELECT u.*, p.name AS prompt, p.live_version, p.generation "
              "FROM prompt_update u JOIN prompt p ON p.id = u.prompt_id WHERE u.id = :u")
_UPDATES_COLUMNS = ("SELECT u.id, p.name AS prompt, u.seq, u.candidate_version, "
                    "u.base_version, u.status, u.reason, u.created_at, u.decided_at "
                    "FROM prompt_update u JOIN prompt p ON p.id = u.prompt_id")
_UPDATES = sql(_UPDATES_COLUMNS + " ORDER BY u.id DESC LIMIT :lim")
_UPDATES_OF = sql(_UPDATES_COLUMNS + " WHERE p.name = :n ORDER BY u.id DESC LIMIT :lim")
_ACTIVE_UPDATES = sql("SELECT id, status FROM prompt_update WHERE status IN :st ORDER BY id",
                      "st")
_RUNS = sql("SELECT *, :now AS db_now FROM prompt_run WHERE update_id = :u "
            "ORDER BY dataset_name, subject DESC")
_VERDICT_COUNTS = sql("SELECT run_id, verdict, COUNT(*) FROM prompt_run_item "
                      "WHERE run_id IN :ids GROUP BY run_id, verdict", "ids")
_TASK_COUNTS = sql("SELECT batch_id, status, COUNT(*) FROM task WHERE batch_id IN :ids "
                   "GROUP BY batch_id, status", "ids")

# -- the live pointer, read and compare-and-swapped by Reconcile
_GENERATION = sql("SELECT generation FROM prompt WHERE id = :p")
_PROMPT_STATE = sql("SELECT live_version, generation, submissions FROM prompt WHERE id = :p")
_ACTIVATE = sql("UPDATE prompt SET live_version = :c, generation = generation + 1, "
                "updated_at = :now WHERE id = :p AND generation = :g AND submissions = :seq")


class GateStore(RunSteps):
    """Bindings, candidates, runs and run items on one :class:`Store` (the run steps
    are in :mod:`lockgate.store.gate_runs`)."""

    # -- bindings -------------------------------------------------------------------------

    def bind(self, prompt: str, dataset: str, settings: dict[str, Any], *,
             expected_fields: Sequence[str] = (),
             check_expected: Callable[[str, Iterator[Any]], None] | None = None) -> None:
        """Bind a dataset to a prompt with its thresholds (insert or replace).
        ``expected_fields``: fields the comparison reads from expected objects; each
        must be held by at least one expected value of the dataset (a misspelt field
        would be absent from both sides of every item, and so match everywhere).
        ``check_expected(dataset, expected values)`` raises to refuse a binding the
        dataset's current expected values cannot serve (the gate's rules, which this
        layer does not know), in the binding's transaction, before ``expected_fields``
        are looked for and on a dataset without items too."""

        def work(tx: Tx) -> None:
            now = tx.now
            p = self.registry.prompt_row(tx, prompt)
            row = tx.one(_DATASET_ID, {"n": dataset}, missing=NotFound(
                f"no dataset '{dataset}'; add it with `lockgate dataset add`"))
            d = row["id"]
            if check_expected is not None:  # first: it says why an empty dataset will not do
                check_expected(dataset, (orjson.loads(r.expected) for r in tx.execute(
                    _EXPECTED_AT, {"d": d, "rev": row["revision"]})))
            if expected_fields:
                _check_expected_fields(tx, dataset, int(d), int(row["revision"]),
                                       expected_fields)
            doc = dumps(settings)
            tx.execute(self.dialect.insert_ignore(schema.prompt_dataset), [{
                "prompt_id": p["id"], "dataset_id": d, "settings": doc, "created_at": now,
                "updated_at": now}])
            tx.execute(_SET_BINDING, {"s": doc, "p": p["id"], "d": d})

        self.store.transaction(work)

    def unbind(self, prompt: str, dataset: str) -> bool:
        """Remove a binding; True when one existed."""

        def work(tx: Tx) -> bool:
            p = self.registry.prompt_row(tx, prompt)
            return bool(tx.execute(_UNBIND, {"p": p["id"], "n": dataset}).rowcount)

        return self.store.transaction(work)

    def bindings(self, prompt: str) -> list[dict[str, Any]]:
        """The datasets bound to a prompt, with their settings and current revision."""
        with self.store.read() as tx:
            p = self.registry.prompt_row(tx, prompt)
            return self._bindings(tx, int(p["id"]))

    def _bindings(self, tx: Tx, prompt_id: int) -> list[dict[str, Any]]:
        return [{"dataset": r.name, "dataset_id": int(r.id), "revision": int(r.revision),
                 "items": int(r.item_count), "items_hash": r.items_hash,
                 "input_keys": orjson.loads(r.input_keys),
                 "settings": orjson.loads(r.settings)}
                for r in tx.execute(_BINDINGS, {"p": prompt_id})]

    # -- proposals ------------------------------------------------------------------------

    def propose(self, name: str, content: VersionContent, *, tag: str | None,
                author: str | None, note: str | None, retry_policy: dict[str, Any],
                execution_path: dict[str, Any]) -> Proposal:
        """Record a candidate and freeze its snapshot, in one transaction.

        The prompt row is locked first (``submissions + 1``), so concurrent proposals
        for one prompt are serialised: each newer one sees, and cancels, the older
        ones. Refused when no dataset is bound or the content is already live.
        """
        author = schema.audit_name(author)

        def work(tx: Tx) -> Proposal:
            now = tx.now
            p = self.registry.prompt_row(tx, name, lock=True)
            pid = int(p["id"])
            tx.execute(_COUNT_SUBMISSION, {"p": pid})
            seq = int(p["submissions"]) + 1
            version, created = self.registry.add_version(
                tx, pid, content, tag=tag, author=author, note=note, now=now)
            if version == p["live_version"]:
                raise StateConflict(f"that content is version {version} of '{name}', which "
                                    "is already live; nothing to evaluate")
            bound = self._bindings(tx, pid)
            if not bound:
                raise StateConflict(f"no dataset is bound to '{name}'; bind one first with "
                                    f"`lockgate bind {name} DATASET --threshold ...`")
            cand = self.registry.version_row(tx, name, pid, version)
            base = (self.registry.version_row(tx, name, pid, int(p["live_version"]))
                    if p["live_version"] is not None else None)
            snapshot = {
                "prompt": name,
                "candidate": _version_doc(cand),
                "base": _version_doc(base) if base else None,
                "base_generation": int(p["generation"]),
                "retry_policy": retry_policy,
                "datasets": [{"name": b["dataset"], "id": b["dataset_id"],
                              "revision": b["revision"], "items": b["items"],
                              "items_hash": b["items_hash"], "binding": b["settings"]}
                             for b in bound],
                "execution_path": execution_path,
            }
            uid = inserted_id(tx.execute(schema.prompt_update.insert().values(
                prompt_id=pid, seq=seq, candidate_version=version,
                base_version=p["live_version"], base_generation=p["generation"],
                status=U.PENDING, snapshot=dumps(snapshot),
                snapshot_hash=config_hash(snapshot), author=author, created_at=now,
                updated_at=now)))
            older = [int(r[0]) for r in tx.execute(
                _OTHER_ACTIVE, {"p": pid, "u": uid, "st": list(ACTIVE_UPDATES)})]
            self._cancel(tx, older, f"superseded by update {uid}", now)
            for old in older:
                self.registry.audit(tx, pid, "cancel", None, None,
                                    generation=int(p["generation"]), actor=author,
                                    reason=f"superseded by update {uid}", now=now,
                                    update_id=old)
            self.registry.audit(tx, pid, "propose", p["live_version"], version,
                                generation=int(p["generation"]), actor=author, reason=note,
                                now=now, update_id=uid)
            return Proposal(uid, version, created, p["live_version"], older)

        return self.store.transaction(work)

    def _cancel(self, tx: Tx, update_ids: Sequence[int], reason: str,
                now: int) -> int:
        """Updates -> CANCELLED, their runs -> CANCELLED, their queued tasks -> CANCELLED
        (a worker holding one finds its write-back fenced)."""
        if not update_ids:
            return 0
        n = self._move(tx, "prompt_update", update_ids, ACTIVE_UPDATES, U.CANCELLED, now,
                       sets=", reason = :reason, decided_at = :now", params={"reason": reason})
        runs = tx.execute(_ACTIVE_RUNS_OF, {"ids": list(update_ids),
                                            "st": list(ACTIVE_RUNS)}).all()
        self._move(tx, "prompt_run", [int(r.id) for r in runs], ACTIVE_RUNS, R.CANCELLED,
                   now, sets=", reason = :reason, finished_at = :now, lease_token = NULL, "
                   "lease_until = NULL", params={"reason": reason})
        batches = [r.batch_id for r in runs]
        for i in range(0, len(batches), 500):
            tx.execute(_CANCEL_TASKS, {"now": now, "msg": f"release gate: {reason}",
                                       "ids": batches[i:i + 500]})
        return n

    def cancel(self, update_id: int, reason: str, *, actor: str | None = None) -> bool:
        """Withdraw a candidate: PENDING/EVALUATING -> CANCELLED. False if already final."""
        actor = schema.audit_name(actor)

        def work(tx: Tx) -> bool:
            now = tx.now
            row = tx.one(_UPDATE_ROW, {"u": update_id},
                         missing=NotFound(f"no release-gate update {update_id}"))
            if self._cancel(tx, [update_id], reason, now) != 1:
                return False
            gen = tx.execute(_GENERATION, {"p": row["prompt_id"]}).scalar_one()
            self.registry.audit(tx, int(row["prompt_id"]), "cancel", row["base_version"],
                                row["candidate_version"], generation=int(gen), actor=actor,
                                reason=reason, now=now, update_id=update_id)
            return True

        return self.store.transaction(work)

    # -- reads ----------------------------------------------------------------------------

    def update(self, update_id: int) -> dict[str, Any]:
        """One update with its snapshot and decision decoded."""
        with self.store.read() as tx:
            return tx.one(_UPDATE, {"u": update_id}, json=("snapshot", "decision"),
                          missing=NotFound(f"no release-gate update {update_id}; "
                                           "`lockgate gate list` shows them"))

    def updates(self, prompt: str | None = None, *, limit: int = 50) -> list[dict[str, Any]]:
        """Recent updates, newest first."""
        params: dict[str, Any] = {"lim": limit}
        statement = _UPDATES
        if prompt is not None:
            statement, params["n"] = _UPDATES_OF, prompt
        with self.store.read() as tx:
            return tx.rows(statement, params)

    def active_updates(self) -> list[tuple[int, str]]:
        """(id, status) of every update still PENDING or EVALUATING (index on status)."""
        with self.store.read() as tx:
            return [(int(r[0]), str(r[1]))
                    for r in tx.execute(_ACTIVE_UPDATES, {"st": list(ACTIVE_UPDATES)})]

    def runs(self, update_id: int) -> list[dict[str, Any]]:
        """The runs of an update, with their metrics decoded."""
        with self.store.read() as tx:
            rows = tx.rows(_RUNS, {"u": update_id})
        for r in rows:
            r["metrics"] = orjson.loads(r["metrics"]) if r["metrics"] else None
        return rows

    def task_counts(self, batch_ids: Sequence[str]) -> dict[str, dict[str, int]]:
        """Tasks per status for each batch (progress of the Execute role)."""
        return self._counts(_TASK_COUNTS, batch_ids)

    def verdict_counts(self, run_ids: Sequence[int]) -> dict[int, dict[str, int]]:
        """Run items per verdict for each run."""
        return self._counts(_VERDICT_COUNTS, run_ids)

    def _counts(self, statement: TextClause, keys: Sequence[K]) -> dict[K, dict[str, int]]:
        """Rows per state for each key of ``keys`` (a statement of key, state, count)."""
        out: dict[K, dict[str, int]] = {k: {} for k in keys}
        if keys:
            with self.store.read() as tx:
                for k, state, n in tx.execute(statement, {"ids": list(keys)}):
                    out[k][state] = int(n)
        return out

    # -- Reconcile ------------------------------------------------------------------------------

    def activate(self, update_id: int, decision: dict[str, Any]) -> Outcome:
        """The activation transaction: the live pointer moves to the candidate
        and the update becomes ACTIVATED together, only if the candidate is still the
        newest submission and the live version is still its base (compare-and-swap on
        ``prompt.generation``). Otherwise the update ends CANCELLED or STALE."""

        def work(tx: Tx) -> Outcome:
            now = tx.now
            u = tx.execute(_UPDATE_ROW, {"u": update_id}).one()
            if u.status != U.EVALUATING:
                return Outcome(str(u.status), None)
            doc = dumps(decision)
            swapped = tx.execute(_ACTIVATE, {"c": u.candidate_version, "p": u.prompt_id,
                                             "g": u.base_generation, "seq": u.seq}).rowcount
            if swapped == 1:
                reason = "passed every threshold"
                if self._move(tx, "prompt_update", [update_id], [U.EVALUATING], U.ACTIVATED,
                              now, sets=", decision = :d, reason = :reason, decided_at = :now",
                              params={"d": doc, "reason": reason}) != 1:
                    raise _Abort("changed")  # decided or cancelled meanwhile: undo the swap
                self.registry.audit(tx, int(u.prompt_id), "activate", u.base_version,
                                    u.candidate_version, generation=int(u.base_generation) + 1,
                                    actor="release-gate", reason=reason, now=now,
                                    update_id=update_id)
                return Outcome(str(U.ACTIVATED), reason)
            p = tx.execute(_PROMPT_STATE, {"p": u.prompt_id}).one()
            if int(p.submissions) != int(u.seq):
                to, reason = U.CANCELLED, "superseded by a newer submission"
            else:
                to = U.STALE
                reason = (f"passed, but the live version moved from v{u.base_version} to "
                          f"v{p.live_version} (generation {u.base_generation} -> "
                          f"{p.generation}) during the evaluation")
            if self._move(tx, "prompt_update", [update_id], [U.EVALUATING], to, now,
                          sets=", decision = :d, reason = :reason, decided_at = :now",
                          params={"d": doc, "reason": reason}) != 1:
                raise _Abort("changed")
            self.registry.audit(tx, int(u.prompt_id), to.lower(), u.base_version,
                                u.candidate_version, generation=int(p.generation),
                                actor="release-gate", reason=reason, now=now,
                                update_id=update_id)
            return Outcome(str(to), reason)

        try:
            return self.store.transaction(work)
        except _Abort:
            return Outcome(str(self.update(update_id)["status"]), None)

    def conclude(self, update_id: int, status: str, reason: str,
                 decision: dict[str, Any]) -> bool:
        """EVALUATING (or PENDING, an update that could not start) -> REJECTED or
        FAILED with the decision; live stays unchanged."""

        def work(tx: Tx) -> bool:
            now = tx.now
            u = tx.execute(_UPDATE_ROW, {"u": update_id}).one()
            frm = [U.PENDING, U.EVALUATING] if status == U.FAILED else [U.EVALUATING]
            if self._move(tx, "prompt_update", [update_id], frm, status, now,
                          sets=", decision = :d, reason = :reason, decided_at = :now",
                          params={"d": dumps(decision), "reason": reason}) != 1:
                return False
            gen = tx.execute(_GENERATION, {"p": u.prompt_id}).scalar_one()
            self.registry.audit(tx, int(u.prompt_id), status.lower(), u.base_version,
                                u.candidate_version, generation=int(gen),
                                actor="release-gate", reason=reason, now=now,
                                update_id=update_id)
            return True

        return self.store.transaction(work)



def _version_doc(v: Any) -> dict[str, Any]:
    return {"version": v.version, "content_hash": v.content_hash, "template": v.template,
            "model_config": v.model_config, "delivery_rule": v.delivery_rule}


__all__ = ["GateStore", "Outcome", "Proposal", "RunPlan", "VersionContent", "batch_id_for"]


def _check_expected_fields(tx: Tx, dataset: str, dataset_id: int, revision: int,
                           fields: Sequence[str]) -> None:
    """SpecError naming the ``fields`` no expected object of the dataset's revision holds
    (and the fields they do hold)."""
    wanted = set(fields)
    seen: set[str] = set()
    any_item = False
    for r in tx.execute(_EXPECTED_AT, {"d": dataset_id, "rev": revision}):
        any_item = True
        expected = orjson.loads(r.expected)
        if isinstance(expected, dict):
            seen.update(expected)
            if wanted <= seen:
                return
    missing = [f for f in fields if f not in seen]
    held = ", ".join(sorted(seen)[:20]) or (
        "none: its expected values are not objects" if any_item else
        "none: the dataset has no items; add them first with `lockgate dataset add`")
    raise SpecError(
        f"comparison: no expected value of dataset '{dataset}' holds field"
        f"{'s' if len(missing) > 1 else ''} {', '.join(repr(f) for f in missing)} "
        f"(fields held: {held}); name fields of the expected objects after fields:")
