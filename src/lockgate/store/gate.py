"""Release-gate persistence: bindings, candidate updates, runs, run items.

Every state transition goes through :meth:`GateStore._move`, one conditional UPDATE
that names the states it leaves; the arrows it may take are listed in
:data:`ARROWS`, and nothing leaves a terminal state. Role steps that span several
transactions (materialise, finalise) hold a lease on their ``prompt_run`` row: a
random token and an expiry on the database clock; each of their transactions first
renews the lease *fenced by the token*, so a worker that lost its lease (killed,
stalled) can never write again, and any other worker resumes after expiry.

Evaluation items execute as ordinary tasks (``task`` rows in batch ``gate:u…:d…:…``),
inserted together with their ``prompt_run_item`` rows, both idempotently.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import text

from lockgate.errors import NotFound, StateConflict
from lockgate.spec import config_hash
from lockgate.states import (
    ACTIVE_RUNS,
    ACTIVE_UPDATES,
    ARROWS,
    RunStatus,
    UpdateStatus,
    Verdict,
)
from lockgate.store import schema
from lockgate.store.registry import RegistryStore, VersionContent, dumps, inserted_id
from lockgate.store.store import Store
from lockgate.store.tx import Tx, in_list, sql

U, R, V = UpdateStatus, RunStatus, Verdict


@dataclass(frozen=True, slots=True)
class RunPlan:
    """One run to create when an evaluation starts: a version on a dataset snapshot."""

    dataset_id: int
    dataset_name: str
    subject: str  # candidate | baseline
    prompt_version: int
    config_document: dict[str, Any]
    expected_items: int


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


_TASK_COUNTS = sql("SELECT batch_id, status, COUNT(*) FROM task WHERE batch_id IN :ids "
                   "GROUP BY batch_id, status", "ids")


def batch_id_for(update_id: int, dataset_id: int, subject: str) -> str:
    """The task batch of one run: ``gate:u{update}:d{dataset}:{subject}``."""
    return f"gate:u{update_id}:d{dataset_id}:{subject}"



class GateStore:
    """Bindings, candidates, runs and run items on one :class:`Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.registry = RegistryStore(store)
        self.dialect = store.dialect


    def _move(self, tx: Tx, table: str, ids: Sequence[int], frm: Iterable[str],
              to: str, now: int, *, sets: str = "", where: str = "",
              params: dict[str, Any] | None = None) -> int:
        """The one way a status changes: ``UPDATE … WHERE id IN … AND status IN (from)``."""
        frm = tuple(frm)
        for f in frm:
            if (f, to) not in ARROWS[table]:
                raise AssertionError(f"{table}: {f} -> {to} is not an allowed transition")
        if not ids:
            return 0
        sql = text(f"UPDATE {table} SET status = :to, version = version + 1, "
                   f"updated_at = :now{sets} WHERE id IN :ids AND status IN :frm{where}"
                   ).bindparams(in_list("ids"), in_list("frm"))
        return int(tx.execute(sql, {"to": to, "now": now, "ids": list(ids),
                                      "frm": list(frm), **(params or {})}).rowcount)

    # -- bindings -------------------------------------------------------------------------

    def bind(self, prompt: str, dataset: str, settings: dict[str, Any]) -> None:
        """Bind a dataset to a prompt with its thresholds (insert or replace)."""

        def work(tx: Tx) -> None:
            now = tx.now
            p = self.registry.prompt_row(tx, prompt)
            d = tx.execute(text("SELECT id FROM dataset WHERE name = :n"),
                             {"n": dataset}).scalar()
            if d is None:
                raise NotFound(f"no dataset '{dataset}'; add it with `lockgate dataset add`")
            doc = dumps(settings)
            tx.execute(self.dialect.insert_ignore(schema.prompt_dataset), [{
                "prompt_id": p.id, "dataset_id": d, "settings": doc, "created_at": now,
                "updated_at": now}])
            tx.execute(text(
                "UPDATE prompt_dataset SET settings = :s, updated_at = :now, "
                "version = version + 1 WHERE prompt_id = :p AND dataset_id = :d"),
                {"s": doc, "now": now, "p": p.id, "d": d})

        self.store.transaction(work)

    def unbind(self, prompt: str, dataset: str) -> bool:
        """Remove a binding; True when one existed."""

        def work(tx: Tx) -> bool:
            p = self.registry.prompt_row(tx, prompt)
            return bool(tx.execute(text(
                "DELETE FROM prompt_dataset WHERE prompt_id = :p AND dataset_id = "
                "(SELECT id FROM dataset WHERE name = :n)"), {"p": p.id, "n": dataset}
            ).rowcount)

        return self.store.transaction(work)

    def bindings(self, prompt: str) -> list[dict[str, Any]]:
        """The datasets bound to a prompt, with their settings and current revision."""
        with self.store.read() as tx:
            p = self.registry.prompt_row(tx, prompt)
            return self._bindings(tx, int(p.id))

    def _bindings(self, tx: Tx, prompt_id: int) -> list[dict[str, Any]]:
        return [{"dataset": r.name, "dataset_id": int(r.id), "revision": int(r.revision),
                 "items": int(r.item_count), "items_hash": r.items_hash,
                 "input_keys": orjson.loads(r.input_keys),
                 "settings": orjson.loads(r.settings)}
                for r in tx.execute(text(
                    "SELECT d.id, d.name, d.revision, d.item_count, d.items_hash, "
                    "d.input_keys, b.settings FROM prompt_dataset b JOIN dataset d "
                    "ON d.id = b.dataset_id WHERE b.prompt_id = :p ORDER BY d.name"),
                    {"p": prompt_id})]

    # -- proposals ------------------------------------------------------------------------

    def propose(self, name: str, content: VersionContent, *, tag: str | None,
                author: str | None, note: str | None, retry_policy: dict[str, Any],
                execution_path: dict[str, Any]) -> Proposal:
        """Record a candidate and freeze its snapshot, in one transaction.

        The prompt row is locked first (``submissions + 1``), so concurrent proposals
        for one prompt are serialised: each newer one sees, and cancels, the older
        ones. Refused when no dataset is bound or the content is already live.
        """

        def work(tx: Tx) -> Proposal:
            now = tx.now
            p = self.registry.prompt_row(tx, name, lock=True)
            pid = int(p.id)
            tx.execute(text("UPDATE prompt SET submissions = submissions + 1, "
                              "updated_at = :now WHERE id = :p"), {"now": now, "p": pid})
            seq = int(p.submissions) + 1
            version, created = self.registry.add_version(
                tx, pid, content, tag=tag, author=author, note=note, now=now)
            if version == p.live_version:
                raise StateConflict(f"that content is version {version} of '{name}', which "
                                    "is already live; nothing to evaluate")
            bound = self._bindings(tx, pid)
            if not bound:
                raise StateConflict(f"no dataset is bound to '{name}'; bind one first with "
                                    f"`lockgate bind {name} DATASET --threshold ...`")
            cand = self.registry._version(tx, name, pid, version)
            base = (self.registry._version(tx, name, pid, int(p.live_version))
                    if p.live_version is not None else None)
            snapshot = {
                "prompt": name,
                "candidate": _version_doc(cand),
                "base": _version_doc(base) if base else None,
                "base_generation": int(p.generation),
                "retry_policy": retry_policy,
                "datasets": [{"name": b["dataset"], "id": b["dataset_id"],
                              "revision": b["revision"], "items": b["items"],
                              "items_hash": b["items_hash"], "binding": b["settings"]}
                             for b in bound],
                "execution_path": execution_path,
            }
            uid = inserted_id(tx.execute(schema.prompt_update.insert().values(
                prompt_id=pid, seq=seq, candidate_version=version,
                base_version=p.live_version, base_generation=p.generation,
                status=U.PENDING, snapshot=dumps(snapshot),
                snapshot_hash=config_hash(snapshot), author=author, created_at=now,
                updated_at=now)))
            older = [int(r[0]) for r in tx.execute(text(
                "SELECT id FROM prompt_update WHERE prompt_id = :p AND id <> :u "
                "AND status IN :st").bindparams(in_list("st")),
                {"p": pid, "u": uid, "st": list(ACTIVE_UPDATES)})]
            self._cancel(tx, older, f"superseded by update {uid}", now)
            for old in older:
                self.registry.audit(tx, pid, "cancel", None, None,
                                    generation=int(p.generation), actor=author,
                                    reason=f"superseded by update {uid}", now=now,
                                    update_id=old)
            self.registry.audit(tx, pid, "propose", p.live_version, version,
                                generation=int(p.generation), actor=author, reason=note,
                                now=now, update_id=uid)
            return Proposal(uid, version, created, p.live_version, older)

        return self.store.transaction(work)

    def _cancel(self, tx: Tx, update_ids: Sequence[int], reason: str,
                now: int) -> int:
        """Updates -> CANCELLED, their runs -> CANCELLED, their queued tasks -> CANCELLED
        (a worker holding one finds its write-back fenced)."""
        if not update_ids:
            return 0
        n = self._move(tx, "prompt_update", update_ids, ACTIVE_UPDATES, U.CANCELLED, now,
                       sets=", reason = :reason, decided_at = :now", params={"reason": reason})
        runs = tx.execute(text(
            "SELECT id, batch_id FROM prompt_run WHERE update_id IN :ids AND status IN :st"
        ).bindparams(in_list("ids"), in_list("st")), {"ids": list(update_ids),
                                           "st": list(ACTIVE_RUNS)}).all()
        self._move(tx, "prompt_run", [int(r.id) for r in runs], ACTIVE_RUNS, R.CANCELLED,
                   now, sets=", reason = :reason, finished_at = :now, lease_token = NULL, "
                   "lease_until = NULL", params={"reason": reason})
        batches = [r.batch_id for r in runs]
        for i in range(0, len(batches), 500):
            tx.execute(text(
                "UPDATE task SET status = 'CANCELLED', finished_at = :now, updated_at = :now, "
                "version = version + 1, error_message = :msg WHERE batch_id IN :ids "
                "AND status = 'PENDING'").bindparams(in_list("ids")),
                {"now": now, "msg": f"release gate: {reason}", "ids": batches[i:i + 500]})
        return n

    def cancel(self, update_id: int, reason: str, *, actor: str | None = None) -> bool:
        """Withdraw a candidate: PENDING/EVALUATING -> CANCELLED. False if already final."""

        def work(tx: Tx) -> bool:
            now = tx.now
            row = tx.execute(text("SELECT prompt_id, candidate_version, base_version, "
                                    "status FROM prompt_update WHERE id = :u"),
                               {"u": update_id}).first()
            if row is None:
                raise NotFound(f"no release-gate update {update_id}")
            if self._cancel(tx, [update_id], reason, now) != 1:
                return False
            gen = tx.execute(text("SELECT generation FROM prompt WHERE id = :p"),
                               {"p": row.prompt_id}).scalar_one()
            self.registry.audit(tx, int(row.prompt_id), "cancel", row.base_version,
                                row.candidate_version, generation=int(gen), actor=actor,
                                reason=reason, now=now, update_id=update_id)
            return True

        return self.store.transaction(work)

    # -- reads ----------------------------------------------------------------------------

    def update(self, update_id: int) -> dict[str, Any]:
        """One update with its snapshot and decision decoded."""
        with self.store.read() as tx:
            row = tx.execute(text(
                "SELECT u.*, p.name AS prompt, p.live_version, p.generation "
                "FROM prompt_update u JOIN prompt p ON p.id = u.prompt_id WHERE u.id = :u"),
                {"u": update_id}).first()
        if row is None:
            raise NotFound(f"no release-gate update {update_id}; `lockgate gate list` shows "
                           "them")
        out = dict(row._mapping)
        out["snapshot"] = orjson.loads(out["snapshot"])
        out["decision"] = orjson.loads(out["decision"]) if out["decision"] else None
        return out

    def updates(self, prompt: str | None = None, *, limit: int = 50) -> list[dict[str, Any]]:
        """Recent updates, newest first."""
        sql = ("SELECT u.id, p.name AS prompt, u.seq, u.candidate_version, u.base_version, "
               "u.status, u.reason, u.created_at, u.decided_at FROM prompt_update u "
               "JOIN prompt p ON p.id = u.prompt_id")
        params: dict[str, Any] = {"lim": limit}
        if prompt is not None:
            sql += " WHERE p.name = :n"
            params["n"] = prompt
        with self.store.read() as tx:
            return [dict(r._mapping) for r in tx.execute(
                text(sql + " ORDER BY u.id DESC LIMIT :lim"), params)]

    def active_updates(self) -> list[tuple[int, str]]:
        """(id, status) of every update still PENDING or EVALUATING (index on status)."""
        with self.store.read() as tx:
            return [(int(r[0]), str(r[1])) for r in tx.execute(text(
                "SELECT id, status FROM prompt_update WHERE status IN :st ORDER BY id"
            ).bindparams(in_list("st")), {"st": list(ACTIVE_UPDATES)})]

    def runs(self, update_id: int) -> list[dict[str, Any]]:
        """The runs of an update, with their metrics decoded."""
        with self.store.read() as tx:
            rows = [dict(r._mapping) for r in tx.execute(text(
                "SELECT *, :now AS db_now FROM prompt_run WHERE update_id = :u "
                "ORDER BY dataset_name, subject DESC"), {"u": update_id})]
        for r in rows:
            r["metrics"] = orjson.loads(r["metrics"]) if r["metrics"] else None
        return rows

    def task_counts(self, batch_ids: Sequence[str]) -> dict[str, dict[str, int]]:
        """Tasks per status for each batch (progress of the Execute role)."""
        if not batch_ids:
            return {}
        out: dict[str, dict[str, int]] = {b: {} for b in batch_ids}
        with self.store.read() as tx:
            for b, s, n in tx.execute(_TASK_COUNTS, {"ids": list(batch_ids)}):
                out[b][s] = int(n)
        return out

    def verdict_counts(self, run_ids: Sequence[int]) -> dict[int, dict[str, int]]:
        """Run items per verdict for each run."""
        if not run_ids:
            return {}
        out: dict[int, dict[str, int]] = {r: {} for r in run_ids}
        with self.store.read() as tx:
            for r, v, n in tx.execute(text(
                    "SELECT run_id, verdict, COUNT(*) FROM prompt_run_item WHERE run_id IN :ids "
                    "GROUP BY run_id, verdict").bindparams(in_list("ids")), {"ids": list(run_ids)}):
                out[int(r)][v] = int(n)
        return out

    # -- Start: PENDING -> EVALUATING -----------------------------------------------------

    def start(self, update_id: int, plans: Sequence[RunPlan]) -> bool:
        """Begin an evaluation: the update moves to EVALUATING and its runs are created
        MATERIALIZING, with the task configs their items will run under."""

        def work(tx: Tx) -> bool:
            now = tx.now
            if self._move(tx, "prompt_update", [update_id], [U.PENDING], U.EVALUATING, now,
                          sets=", started_at = :now") != 1:
                return False
            for plan in plans:
                h = config_hash(plan.config_document)
                tx.execute(self.dialect.insert_ignore(schema.task_config), [{
                    "hash": h, "document": dumps(plan.config_document), "created_at": now}])
                batch = batch_id_for(update_id, plan.dataset_id, plan.subject)
                tx.execute(self.dialect.insert_ignore(schema.batch), [{
                    "id": batch, "source": f"release gate update {update_id}",
                    "created_at": now}])
                tx.execute(schema.prompt_run.insert().values(
                    update_id=update_id, dataset_id=plan.dataset_id,
                    dataset_name=plan.dataset_name, subject=plan.subject,
                    prompt_version=plan.prompt_version, config_hash=h, batch_id=batch,
                    expected_items=plan.expected_items, status=R.MATERIALIZING,
                    created_at=now, updated_at=now))
            return True

        return self.store.transaction(work)

    # -- leases on runs --------------------------------------------------------------------

    def claim_run(self, run_id: int, status: str, *, token: str, lease_ms: int,
                  worker_id: str, require_tasks_done: bool = False) -> bool:
        """Take the lease of a run in ``status`` (MATERIALIZING or EXECUTING: a terminal
        run has no lease to take) if nobody holds a live one."""
        if status not in ACTIVE_RUNS:
            return False
        sql = ("UPDATE prompt_run SET lease_token = :tok, lease_until = :now + :lease, "
               "leased_by = :w, version = version + 1, updated_at = :now "
               "WHERE id = :r AND status = :st AND (lease_until IS NULL OR "
               "lease_until <= :now)")
        if require_tasks_done:
            sql += (" AND NOT EXISTS (SELECT 1 FROM task WHERE task.batch_id = "
                    "prompt_run.batch_id AND task.status = 'PENDING')")
        return bool(self.store.transaction(lambda tx: tx.execute(text(sql), {
            "tok": token, "lease": lease_ms, "w": worker_id, "r": run_id, "st": status,
        }).rowcount))

    def _fence(self, tx: Tx, run_id: int, token: str, status: str,
               lease_ms: int) -> Any:
        """Renew the lease, fenced by the token; the run row, or None if the lease is lost."""
        n = tx.execute(text(
            "UPDATE prompt_run SET lease_until = :now + :lease, updated_at = :now "
            "WHERE id = :r AND lease_token = :tok AND status = :st"),
            {"lease": lease_ms, "r": run_id, "tok": token, "st": status}).rowcount
        if n != 1:
            return None
        return tx.execute(text("SELECT * FROM prompt_run WHERE id = :r"),
                            {"r": run_id}).one()

    def release_run(self, run_id: int, token: str) -> None:
        """Give a lease back early (the step could not proceed yet)."""
        self.store.transaction(lambda tx: tx.execute(text(
            "UPDATE prompt_run SET lease_token = NULL, lease_until = NULL, leased_by = NULL "
            "WHERE id = :r AND lease_token = :tok"), {"r": run_id, "tok": token}))

    # -- Materialize ------------------------------------------------------------------------

    def materialize_page(self, run_id: int, *, token: str, lease_ms: int, revision: int,
                         page: int,
                         pool_of: Callable[[dict[str, Any]], str] | None = None) -> str:
        """Freeze the next page of the dataset revision into run items and tasks.

        Returns ``"more"``, the run's new status when this was the last page
        (EXECUTING, EMPTY, or FAILED if the count does not match the snapshot), or
        ``"lost"`` when the lease was lost (nothing written). ``pool_of`` maps the run's
        config document to the pool its tasks go to (as ``submit`` routes them), so
        that ``lockgate worker --pool`` workers evaluate candidates for their pool.
        """

        def work(tx: Tx) -> str:
            now = tx.now
            run = self._fence(tx, run_id, token, R.MATERIALIZING, lease_ms)
            if run is None:
                return "lost"
            items = tx.execute(text(
                "SELECT id, item_key, content_hash, input_data, expected FROM dataset_item "
                "WHERE dataset_id = :d AND id > :cur AND added_rev <= :rev AND "
                "(retired_rev IS NULL OR retired_rev > :rev) ORDER BY id LIMIT :n"),
                {"d": run.dataset_id, "cur": run.page_cursor, "rev": revision, "n": page}
            ).all()
            if items:
                meta = dumps({"gate": {"update": int(run.update_id), "run": run_id,
                                       "subject": run.subject}})
                pool = "default"
                if pool_of is not None:
                    doc = tx.execute(text("SELECT document FROM task_config WHERE hash = :h"),
                                       {"h": run.config_hash}).scalar()
                    if doc is not None:
                        pool = pool_of(orjson.loads(doc))
                tasks = [{
                    "task_id": f"{run.batch_id}:{it.id}", "batch_id": run.batch_id,
                    "config_hash": run.config_hash, "input_data": it.input_data,
                    "metadata": meta, "priority": 0, "pool": pool, "status": "PENDING",
                    "visible_at": now, "created_at": now, "updated_at": now}
                    for it in items]
                tx.execute(self.dialect.insert_ignore(schema.task), tasks)
                # Insert-ignore keeps a row that exists already: make sure each is the
                # one this run made (the ``gate:`` namespace is refused to submitters,
                # but a database may hold older rows), and point the items at them by
                # row id, never by task id.
                rows = {r.task_id: r for r in tx.execute(text(
                    "SELECT id, task_id, batch_id, config_hash FROM task WHERE task_id IN :ids"
                ).bindparams(in_list("ids")), {"ids": [t["task_id"] for t in tasks]})}
                foreign = [t["task_id"] for t in tasks
                           if rows[t["task_id"]].batch_id != run.batch_id
                           or rows[t["task_id"]].config_hash != run.config_hash]
                if foreign:
                    why = (f"task id {foreign[0]!r} belongs to a task the release gate did "
                              "not create; the evaluation cannot trust its result")
                    self._move(tx, "prompt_run", [run_id], [R.MATERIALIZING], R.FAILED, now,
                               sets=", reason = :reason, lease_token = NULL, "
                                    "lease_until = NULL, finished_at = :now",
                               params={"reason": why})
                    return str(R.FAILED)
                tx.execute(self.dialect.insert_ignore(schema.prompt_run_item), [{
                    "run_id": run_id, "item_id": it.id, "item_key": it.item_key,
                    "content_hash": it.content_hash, "task_id": t["task_id"],
                    "task_pk": rows[t["task_id"]].id, "expected": it.expected,
                    "verdict": V.PENDING, "created_at": now}
                    for it, t in zip(items, tasks, strict=True)])
                tx.execute(text("UPDATE prompt_run SET page_cursor = :c WHERE id = :r"),
                             {"c": items[-1].id, "r": run_id})
            if len(items) == page:
                return "more"
            count = int(tx.execute(text(
                "SELECT COUNT(*) FROM prompt_run_item WHERE run_id = :r"), {"r": run_id}
            ).scalar_one())
            reason: str | None = None
            if count != run.expected_items:
                to = R.FAILED
                reason = (f"materialised {count} items but the snapshot holds "
                          f"{run.expected_items}")
            else:
                to = R.EMPTY if count == 0 else R.EXECUTING
                if to is R.EMPTY:
                    reason = "the dataset snapshot has no items"
            self._move(tx, "prompt_run", [run_id], [R.MATERIALIZING], to, now,
                       sets=", materialized = :n, reason = :reason, lease_token = NULL, "
                            "lease_until = NULL" + (", finished_at = :now"
                                                    if to is not R.EXECUTING else ""),
                       params={"n": count, "reason": reason})
            return str(to)

        return self.store.transaction(work)

    # -- Finalize -----------------------------------------------------------------------------

    def undecided_items(self, run_id: int, *, limit: int) -> list[dict[str, Any]]:
        """Run items without a verdict, with their task's outcome and attempt figures."""
        with self.store.read() as tx:
            rows = [dict(r._mapping) for r in tx.execute(text(
                "SELECT i.item_id, i.item_key, i.task_id, i.expected, t.id AS task_pk, "
                "t.status, t.result, t.error_class, t.error_message, t.attempts, "
                "t.input_data FROM prompt_run_item i LEFT JOIN task t "
                "ON t.id = i.task_pk WHERE i.run_id = :r AND i.verdict = 'PENDING' "
                "ORDER BY i.item_id LIMIT :n"), {"r": run_id, "n": limit})]
            pks = [r["task_pk"] for r in rows if r["task_pk"] is not None]
            figures: dict[int, dict[str, Any]] = {}
            if pks:
                for a in tx.execute(text(
                        "SELECT task_pk, outcome, latency_ms, input_tokens, output_tokens "
                        "FROM task_attempt WHERE task_pk IN :ids ORDER BY id"
                ).bindparams(in_list("ids")), {"ids": pks}):
                    f = figures.setdefault(int(a.task_pk), {
                        "calls": 0, "input_tokens": 0, "output_tokens": 0, "latency_ms": None})
                    if a.outcome != "released":
                        f["calls"] += 1
                    f["input_tokens"] += a.input_tokens or 0
                    f["output_tokens"] += a.output_tokens or 0
                    if a.outcome == "succeeded":
                        f["latency_ms"] = a.latency_ms
        for r in rows:
            r["figures"] = figures.get(r["task_pk"] or -1)
        return rows

    def record_verdicts(self, run_id: int, *, token: str, lease_ms: int,
                        verdicts: Sequence[dict[str, Any]]) -> bool:
        """Write verdicts (PENDING -> MATCH | MISMATCH | ERROR), fenced by the lease."""

        def work(tx: Tx) -> bool:
            now = tx.now
            if self._fence(tx, run_id, token, R.EXECUTING, lease_ms) is None:
                return False
            if verdicts:
                for v in verdicts:
                    if (V.PENDING, v["verdict"]) not in ARROWS["prompt_run_item"]:
                        raise AssertionError(f"bad verdict {v['verdict']}")
                tx.execute(text(
                    "UPDATE prompt_run_item SET verdict = :verdict, actual = :actual, "
                    "error = :error, latency_ms = :latency_ms, input_tokens = :input_tokens, "
                    "output_tokens = :output_tokens, attempts = :attempts, decided_at = :now "
                    "WHERE run_id = :run AND item_id = :item_id AND verdict = 'PENDING'"),
                    [{**v, "run": run_id, "now": now} for v in verdicts])
            return True

        return self.store.transaction(work)

    def outcomes(self, run_id: int) -> list[dict[str, Any]]:
        """Every item of a run with its verdict, for metrics and the snapshot check."""
        with self.store.read() as tx:
            return [dict(r._mapping) for r in tx.execute(text(
                "SELECT i.item_id, i.item_key, i.content_hash, i.expected, i.actual, "
                "i.verdict, i.error, i.latency_ms, i.input_tokens, i.output_tokens, "
                "i.attempts FROM prompt_run_item i WHERE i.run_id = :r ORDER BY i.item_id"),
                {"r": run_id})]

    def finish_run(self, run_id: int, *, token: str, status: str,
                   metrics: dict[str, Any] | None, reason: str | None) -> bool:
        """EXECUTING -> FINALIZED (metrics) or FAILED, fenced by the lease; FINALIZED only
        when no item is left without a verdict."""

        def work(tx: Tx) -> bool:
            now = tx.now
            where = " AND lease_token = :tok"
            if status == R.FINALIZED:
                where += (" AND NOT EXISTS (SELECT 1 FROM prompt_run_item i WHERE "
                          "i.run_id = prompt_run.id AND i.verdict = 'PENDING')")
            return self._move(
                tx, "prompt_run", [run_id], [R.EXECUTING], status, now,
                sets=", metrics = :m, reason = :reason, finished_at = :now, "
                     "lease_token = NULL, lease_until = NULL",
                where=where, params={"m": dumps(metrics) if metrics is not None else None,
                                     "reason": reason, "tok": token}) == 1

        return self.store.transaction(work)

    def step_failed(self, run_id: int, message: str, *, token: str,
                    max_failures: int) -> str | None:
        """Count a failed role step on a run and give its lease back; the run ends FAILED
        after ``max_failures``. Fenced by the step's lease ``token``: a step whose lease
        was taken over by another worker changes nothing (it may not clear the new
        holder's lease). Returns the run's status when it changed."""

        def work(tx: Tx) -> str | None:
            now = tx.now
            if not tx.execute(text(
                "UPDATE prompt_run SET failures = failures + 1, reason = :m, "
                "lease_token = NULL, lease_until = NULL WHERE id = :r AND status IN :st "
                "AND (lease_token = :tok OR lease_token IS NULL)"
            ).bindparams(in_list("st")), {"m": message[:2000], "r": run_id, "tok": token,
                                       "st": list(ACTIVE_RUNS)}).rowcount:
                return None
            row = tx.execute(text("SELECT status, failures FROM prompt_run WHERE id = :r"),
                               {"r": run_id}).one()
            if row.status in ACTIVE_RUNS and row.failures >= max_failures:
                self._move(tx, "prompt_run", [run_id], [row.status], R.FAILED, now,
                           sets=", finished_at = :now")
                return str(R.FAILED)
            return None

        return self.store.transaction(work)

    # -- Reconcile ------------------------------------------------------------------------------

    def activate(self, update_id: int, decision: dict[str, Any]) -> Outcome:
        """The activation transaction: the live pointer moves to the candidate
        and the update becomes ACTIVATED together, only if the candidate is still the
        newest submission and the live version is still its base (compare-and-swap on
        ``prompt.generation``). Otherwise the update ends CANCELLED or STALE."""

        def work(tx: Tx) -> Outcome:
            now = tx.now
            u = tx.execute(text(
                "SELECT prompt_id, seq, base_generation, base_version, candidate_version, "
                "status FROM prompt_update WHERE id = :u"), {"u": update_id}).one()
            if u.status != U.EVALUATING:
                return Outcome(str(u.status), None)
            doc = dumps(decision)
            swapped = tx.execute(text(
                "UPDATE prompt SET live_version = :c, generation = generation + 1, "
                "updated_at = :now WHERE id = :p AND generation = :g AND submissions = :seq"),
                {"c": u.candidate_version, "now": now, "p": u.prompt_id,
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
            p = tx.execute(text("SELECT live_version, generation, submissions FROM prompt "
                                  "WHERE id = :p"), {"p": u.prompt_id}).one()
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
        """EVALUATING -> REJECTED or FAILED with the decision; live stays unchanged."""

        def work(tx: Tx) -> bool:
            now = tx.now
            u = tx.execute(text(
                "SELECT prompt_id, base_version, candidate_version FROM prompt_update "
                "WHERE id = :u"), {"u": update_id}).one()
            if self._move(tx, "prompt_update", [update_id], [U.EVALUATING], status, now,
                          sets=", decision = :d, reason = :reason, decided_at = :now",
                          params={"d": dumps(decision), "reason": reason}) != 1:
                return False
            gen = tx.execute(text("SELECT generation FROM prompt WHERE id = :p"),
                               {"p": u.prompt_id}).scalar_one()
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
