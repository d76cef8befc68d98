"""Release-gate persistence, the role steps: runs and their items.

Every state transition goes through :meth:`GateRows._move`, one conditional UPDATE
that names the states it leaves; the arrows it may take are listed in
:data:`lockgate.states.ARROWS`, and nothing leaves a terminal state. Role steps that
span several transactions (materialise, finalise) hold a lease on their ``prompt_run``
row: a random token and an expiry on the database clock; each of their transactions
first renews the lease *fenced by the token*, so a worker that lost its lease (killed,
stalled) can never write again, and any other worker resumes after expiry.

Evaluation items execute as ordinary tasks (``task`` rows in batch ``gate:u…:d…:…``,
a namespace refused to submitters), inserted together with their ``prompt_run_item``
rows, both idempotently; items point at their tasks by row id.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from lockgate.spec import config_hash
from lockgate.states import ACTIVE_RUNS, ARROWS, RunStatus, UpdateStatus, Verdict
from lockgate.store import schema
from lockgate.store.registry import RegistryStore, dumps
from lockgate.store.store import Store
from lockgate.store.tx import Tx, sql

U, R, V = UpdateStatus, RunStatus, Verdict

# The statements, the same on every dialect (inserts go through the schema's tables and
# ``Dialect.insert_ignore``; status changes through ``GateRows._move``).

# -- the lease of a run: claim, renew fenced by the token, give back
_CLAIM_RUN = sql("UPDATE prompt_run SET lease_token = :tok, lease_until = :now + :lease, "
                 "leased_by = :w, version = version + 1, updated_at = :now "
                 "WHERE id = :r AND status = :st AND (lease_until IS NULL OR "
                 "lease_until <= :now)")
_CLAIM_RUN_TASKS_DONE = sql(_CLAIM_RUN.text + " AND NOT EXISTS (SELECT 1 FROM task "
                            "WHERE task.batch_id = prompt_run.batch_id "
                            "AND task.status = 'PENDING')")
_RENEW_RUN = sql("UPDATE prompt_run SET lease_until = :now + :lease, updated_at = :now "
                 "WHERE id = :r AND lease_token = :tok AND status = :st")
_RELEASE_RUN = sql("UPDATE prompt_run SET lease_token = NULL, lease_until = NULL, "
                   "leased_by = NULL WHERE id = :r AND lease_token = :tok")
_RUN = sql("SELECT * FROM prompt_run WHERE id = :r")

# -- Materialize: a page of the dataset revision into run items and tasks
_ITEMS_PAGE = sql("SELECT id, item_key, content_hash, input_data, expected FROM dataset_item "
                  "WHERE dataset_id = :d AND id > :cur AND added_rev <= :rev AND "
                  "(retired_rev IS NULL OR retired_rev > :rev) ORDER BY id LIMIT :n")
_CONFIG = sql("SELECT document FROM task_config WHERE hash = :h")
_TASKS_BY_ID = sql("SELECT id, task_id, batch_id, config_hash FROM task "
                   "WHERE task_id IN :ids", "ids")
_ADVANCE_CURSOR = sql("UPDATE prompt_run SET page_cursor = :c WHERE id = :r")
_COUNT_ITEMS = sql("SELECT COUNT(*) FROM prompt_run_item WHERE run_id = :r")

# -- Finalize: items without a verdict, their verdicts, the run's outcomes
_UNDECIDED = sql("SELECT i.item_id, i.item_key, i.task_id, i.expected, t.id AS task_pk, "
                 "t.status, t.result, t.error_class, t.error_message, t.attempts, "
                 "t.input_data FROM prompt_run_item i LEFT JOIN task t "
                 "ON t.id = i.task_pk WHERE i.run_id = :r AND i.verdict = 'PENDING' "
                 "ORDER BY i.item_id LIMIT :n")
_ATTEMPT_FIGURES = sql("SELECT task_pk, outcome, latency_ms, input_tokens, output_tokens "
                       "FROM task_attempt WHERE task_pk IN :ids ORDER BY id", "ids")
_RECORD_VERDICT = sql("UPDATE prompt_run_item SET verdict = :verdict, actual = :actual, "
                      "error = :error, latency_ms = :latency_ms, "
                      "input_tokens = :input_tokens, output_tokens = :output_tokens, "
                      "attempts = :attempts, decided_at = :now "
                      "WHERE run_id = :run AND item_id = :item_id AND verdict = 'PENDING'")
_OUTCOMES = sql("SELECT i.item_id, i.item_key, i.content_hash, i.expected, i.actual, "
                "i.verdict, i.error, i.latency_ms, i.input_tokens, i.output_tokens, "
                "i.attempts FROM prompt_run_item i WHERE i.run_id = :r ORDER BY i.item_id")

# -- a failed role step
_COUNT_FAILURE = sql("UPDATE prompt_run SET failures = failures + 1, reason = :m, "
                     "lease_token = NULL, lease_until = NULL WHERE id = :r AND status IN :st "
                     "AND (lease_token = :tok OR lease_token IS NULL)", "st")
_RUN_FAILURES = sql("SELECT status, failures FROM prompt_run WHERE id = :r")


@dataclass(frozen=True, slots=True)
class RunPlan:
    """One run to create when an evaluation starts: a version on a dataset snapshot."""

    dataset_id: int
    dataset_name: str
    subject: str  # candidate | baseline
    prompt_version: int
    config_document: dict[str, Any]
    expected_items: int


def batch_id_for(update_id: int, dataset_id: int, subject: str) -> str:
    """The task batch of one run: ``gate:u{update}:d{dataset}:{subject}``."""
    return f"gate:u{update_id}:d{dataset_id}:{subject}"


class GateRows:
    """The release gate's rows on one :class:`Store`, and the one way their states
    change."""

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
        statement = sql(f"UPDATE {table} SET status = :to, version = version + 1, "
                        f"updated_at = :now{sets} WHERE id IN :ids AND status IN :frm{where}",
                        "ids", "frm")
        return int(tx.execute(statement, {"to": to, "now": now, "ids": list(ids),
                                      "frm": list(frm), **(params or {})}).rowcount)


class RunSteps(GateRows):
    """The steps of the roles that work on runs: Start, Materialize, Finalize."""

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
        statement = _CLAIM_RUN_TASKS_DONE if require_tasks_done else _CLAIM_RUN
        return bool(self.store.transaction(lambda tx: tx.execute(statement, {
            "tok": token, "lease": lease_ms, "w": worker_id, "r": run_id, "st": status,
        }).rowcount))

    def _fence(self, tx: Tx, run_id: int, token: str, status: str,
               lease_ms: int) -> Any:
        """Renew the lease, fenced by the token; the run row, or None if the lease is lost."""
        n = tx.execute(_RENEW_RUN, {"lease": lease_ms, "r": run_id, "tok": token,
                                    "st": status}).rowcount
        if n != 1:
            return None
        return tx.execute(_RUN, {"r": run_id}).one()

    def release_run(self, run_id: int, token: str) -> None:
        """Give a lease back early (the step could not proceed yet)."""
        self.store.transaction(lambda tx: tx.execute(_RELEASE_RUN,
                                                     {"r": run_id, "tok": token}))

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
            items = tx.execute(_ITEMS_PAGE, {"d": run.dataset_id, "cur": run.page_cursor,
                                             "rev": revision, "n": page}).all()
            if items:
                meta = dumps({"gate": {"update": int(run.update_id), "run": run_id,
                                       "subject": run.subject}})
                pool = "default"
                if pool_of is not None:
                    doc = tx.execute(_CONFIG, {"h": run.config_hash}).scalar()
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
                rows = {r.task_id: r for r in tx.execute(
                    _TASKS_BY_ID, {"ids": [t["task_id"] for t in tasks]})}
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
                tx.execute(_ADVANCE_CURSOR, {"c": items[-1].id, "r": run_id})
            if len(items) == page:
                return "more"
            count = int(tx.execute(_COUNT_ITEMS, {"r": run_id}).scalar_one())
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
            rows = tx.rows(_UNDECIDED, {"r": run_id, "n": limit})
            pks = [r["task_pk"] for r in rows if r["task_pk"] is not None]
            figures: dict[int, dict[str, Any]] = {}
            if pks:
                for a in tx.execute(_ATTEMPT_FIGURES, {"ids": pks}):
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
                tx.execute(_RECORD_VERDICT,
                           [{**v, "run": run_id, "now": now} for v in verdicts])
            return True

        return self.store.transaction(work)

    def outcomes(self, run_id: int) -> list[dict[str, Any]]:
        """Every item of a run with its verdict, for metrics and the snapshot check."""
        with self.store.read() as tx:
            return tx.rows(_OUTCOMES, {"r": run_id})

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
            if not tx.execute(_COUNT_FAILURE, {"m": message[:2000], "r": run_id, "tok": token,
                                               "st": list(ACTIVE_RUNS)}).rowcount:
                return None
            row = tx.execute(_RUN_FAILURES, {"r": run_id}).one()
            if row.status in ACTIVE_RUNS and row.failures >= max_failures:
                self._move(tx, "prompt_run", [run_id], [row.status], R.FAILED, now,
                           sets=", finished_at = :now")
                return str(R.FAILED)
            return None

        return self.store.transaction(work)

