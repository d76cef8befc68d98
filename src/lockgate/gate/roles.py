"""The four cooperating roles of the release gate, as short steps on rows.

* **Start**: a PENDING update becomes EVALUATING and gets its runs (one per bound
  dataset, plus a baseline run of the live version where non-inferiority is asked).
* **Materialize**: under a lease on the run, page through the frozen dataset revision
  and insert run items and their tasks idempotently; the run becomes EXECUTING only
  when the item count matches the snapshot (EMPTY for an empty snapshot).
* **Execute** is the ordinary worker: run items are tasks, so they get the same
  render -> call -> validate path, flow control, leases, fencing and retries.
* **Finalize**: once a run is EXECUTING and none of its tasks is PENDING, under a lease,
  score every item (MATCH / MISMATCH / ERROR), check the snapshot's items hash, and
  store the metrics (FINALIZED).
* **Reconcile**: when every run of an update is terminal, decide; activation is one
  compare-and-swap transaction (:meth:`GateStore.activate`).

Any number of processes may run :meth:`GateRoles.tick` concurrently: they coordinate
only through rows (status CAS for Start and Reconcile, leases for the paged roles), and
a process killed at any point is replaced once its lease expires. Everything here is
deterministic given the rows, so a resumed step reaches the same result.
"""

from __future__ import annotations

import contextlib
import logging
import re
import secrets
from collections.abc import Callable
from typing import Any

import orjson

from lockgate.errors import ConfigError, ErrorClass, StoreError
from lockgate.gate.binding import BindingSettings
from lockgate.gate.compare import Comparator, fold_label
from lockgate.gate.decision import decide
from lockgate.gate.metrics import Sample, compute
from lockgate.gate.snapshot import run_plans
from lockgate.states import ACTIVE_RUNS, RunStatus, UpdateStatus, Verdict
from lockgate.store import Store
from lockgate.store.gate import GateStore
from lockgate.store.registry import items_hash

log = logging.getLogger("lockgate.gate")

PAGE = 500
MAX_STEP_FAILURES = 3


class GateRoles:
    """Runs the gate's role steps for one process (sync; the worker calls it in a thread)."""

    def __init__(self, store: Store, *, worker_id: str, lease_ms: int = 30_000,
                 page: int = PAGE, max_failures: int = MAX_STEP_FAILURES,
                 should_stop: Callable[[], bool] | None = None,
                 pool_of: Callable[[dict[str, Any]], str] | None = None) -> None:
        self.gs = GateStore(store)
        #: Routes evaluation tasks to the pool of the candidate's model (else "default").
        self.pool_of = pool_of
        self.worker_id = worker_id
        self.lease_ms = lease_ms
        self.page = page
        self.max_failures = max_failures
        self.should_stop = should_stop or (lambda: False)
        self._snapshots: dict[int, dict[str, Any]] = {}
        self._comparators: dict[str, Comparator] = {}

    # -- the loop body ----------------------------------------------------------------------

    def tick(self) -> bool:
        """One pass over every active update; True if any step did work."""
        did = False
        active = self.gs.active_updates()
        for gone in self._snapshots.keys() - {uid for uid, _ in active}:
            del self._snapshots[gone]  # decided: never needed again
        for uid, status in active:
            if self.should_stop():
                break
            did |= self.advance(uid, status)
        return did

    def advance(self, update_id: int, status: str) -> bool:
        """Take whatever step an update (and its runs) is ready for."""
        if status == UpdateStatus.PENDING:
            return self._decisive(update_id, self.start)
        did = False
        runs = self.gs.runs(update_id)
        for run in runs:
            if self.should_stop():
                return did
            if run["status"] not in ACTIVE_RUNS or _leased(run):
                continue
            did |= self._guarded(run, self.materialize if run["status"] ==
                                 RunStatus.MATERIALIZING else self.finalize)
        if did:
            runs = self.gs.runs(update_id)
        if all(r["status"] not in ACTIVE_RUNS for r in runs):
            did |= self._decisive(update_id, self.reconcile)
        return did

    def _decisive(self, update_id: int, step: Callable[[int], bool]) -> bool:
        """Start or Reconcile an update. Both depend on its frozen snapshot alone, so a
        failure other than the database's would come back in every worker at every
        tick (and stop the worker): it concludes the update FAILED, with its reason."""
        try:
            return step(update_id)
        except StoreError:
            raise
        except Exception as exc:
            log.exception("release gate: %s of update %s failed", step.__name__, update_id)
            reason = f"{step.__name__}: {type(exc).__name__}: {exc}"[:2000]
            self.gs.conclude(update_id, UpdateStatus.FAILED, reason,
                             {"outcome": "fail", "reason": reason, "datasets": []})
            return True

    def _guarded(self, run: dict[str, Any],
                 step: Callable[[dict[str, Any], str], bool]) -> bool:
        """Run a paged step under a fresh lease token; a failure is counted on the run
        (FAILED after a few), except database trouble (:class:`StoreError`), which the
        caller backs off from: a database restarting never fails an evaluation."""
        token = secrets.token_hex(16)
        try:
            return step(run, token)
        except StoreError:
            # Give the lease back if the database lets us (else it expires), so that
            # the step resumes as soon as the database answers again.
            with contextlib.suppress(StoreError):
                self.gs.release_run(int(run["id"]), token)
            raise
        except Exception as exc:
            log.exception("release gate: %s of run %s failed", step.__name__, run["id"])
            self.gs.step_failed(int(run["id"]), f"{step.__name__}: {type(exc).__name__}: "
                                f"{exc}", token=token, max_failures=self.max_failures)
            return True

    def snapshot(self, update_id: int) -> dict[str, Any]:
        """The frozen snapshot of an update (immutable, so cached)."""
        snap = self._snapshots.get(update_id)
        if snap is None:
            snap = self.gs.update(update_id)["snapshot"]
            self._snapshots[update_id] = snap
        return snap

    # -- Start -----------------------------------------------------------------------------

    def start(self, update_id: int) -> bool:
        """PENDING -> EVALUATING, creating the runs (False if another process did it)."""
        return self.gs.start(update_id, run_plans(self.snapshot(update_id)))

    # -- Materialize -----------------------------------------------------------------------

    def materialize(self, run: dict[str, Any], token: str | None = None) -> bool:
        """Claim a MATERIALIZING run (under ``token``, by default a new one) and page
        through its dataset revision."""
        token = token or secrets.token_hex(16)
        run_id = int(run["id"])
        if not self.gs.claim_run(run_id, RunStatus.MATERIALIZING, token=token,
                                 lease_ms=self.lease_ms, worker_id=self.worker_id):
            return False
        revision = self._dataset(run)["revision"]
        while True:
            if self.should_stop():
                self.gs.release_run(run_id, token)
                return True
            res = self.gs.materialize_page(run_id, token=token, lease_ms=self.lease_ms,
                                           revision=int(revision), page=self.page,
                                           pool_of=self.pool_of)
            if res != "more":
                if res == "lost":
                    log.warning("release gate: lost the lease of run %s while materialising",
                                run_id)
                return True

    def _dataset(self, run: dict[str, Any]) -> dict[str, Any]:
        snap = self.snapshot(int(run["update_id"]))
        for ds in snap["datasets"]:
            if int(ds["id"]) == int(run["dataset_id"]):
                return dict(ds)
        raise AssertionError(f"run {run['id']}: dataset {run['dataset_id']} not in snapshot")

    # -- Finalize --------------------------------------------------------------------------

    def settings_for(self, run: dict[str, Any]) -> BindingSettings:
        """The binding settings a run was frozen with."""
        return BindingSettings.model_validate(self._dataset(run)["binding"])

    def comparator(self, settings: BindingSettings) -> Comparator:
        """The compiled comparison of a binding (scorers imported once per process)."""
        key = settings.comparison.model_dump_json()
        comp = self._comparators.get(key)
        if comp is None:
            comp = Comparator(settings.comparison)
            self._comparators[key] = comp
        return comp

    def finalize(self, run: dict[str, Any], token: str | None = None) -> bool:
        """Claim an EXECUTING run whose tasks are all terminal (under ``token``, by
        default a new one); score it; store metrics."""
        token = token or secrets.token_hex(16)
        run_id = int(run["id"])
        if not self.gs.claim_run(run_id, RunStatus.EXECUTING, token=token,
                                 lease_ms=self.lease_ms, worker_id=self.worker_id,
                                 require_tasks_done=True):
            return False
        ds = self._dataset(run)
        settings = self.settings_for(run)
        try:
            comp = self.comparator(settings)
        except ConfigError as exc:  # the scorer cannot be imported: no retry will help
            self.gs.finish_run(run_id, token=token, status=RunStatus.FAILED, metrics=None,
                               reason=str(exc))
            return True
        while True:
            if self.should_stop():
                self.gs.release_run(run_id, token)
                return True
            rows = self.gs.undecided_items(run_id, limit=self.page)
            if any(r["status"] == "PENDING" for r in rows):
                self.gs.release_run(run_id, token)  # a task was re-queued: wait for it
                return True
            verdicts = [score_item(comp, r) for r in rows]
            if not self.gs.record_verdicts(run_id, token=token, lease_ms=self.lease_ms,
                                           verdicts=verdicts):
                log.warning("release gate: lost the lease of run %s while finalising", run_id)
                return True
            if len(rows) < self.page:
                break
        outcomes = self.gs.outcomes(run_id)
        got = items_hash([(o["item_key"], o["content_hash"]) for o in outcomes])
        if got != ds["items_hash"] or len(outcomes) != int(ds["items"]):
            self.gs.finish_run(run_id, token=token, status=RunStatus.FAILED, metrics=None,
                               reason="the run's items do not hash to the snapshot's items "
                                      f"hash ({got[:12]} != {ds['items_hash'][:12]})")
            return True
        metrics = run_metrics(outcomes, settings, comp)
        self.gs.finish_run(run_id, token=token, status=RunStatus.FINALIZED, metrics=metrics,
                           reason=None)
        return True

    # -- Reconcile -------------------------------------------------------------------------

    def reconcile(self, update_id: int) -> bool:
        """Every run is terminal: decide, then activate (CAS) or conclude."""
        snap = self.snapshot(update_id)
        runs = self.gs.runs(update_id)
        decision = decide(snap["datasets"], runs, prompt=snap.get("prompt"),
                          candidate=snap.get("candidate", {}).get("version"))
        doc = decision.document()
        if decision.outcome == "activate":
            out = self.gs.activate(update_id, doc)
            log.info("release gate: update %s -> %s", update_id, out.status)
            return True
        status = UpdateStatus.REJECTED if decision.outcome == "reject" else UpdateStatus.FAILED
        self.gs.conclude(update_id, status, decision.reason, doc)
        log.info("release gate: update %s -> %s (%s)", update_id, status, decision.reason)
        return True


def _leased(run: dict[str, Any]) -> bool:
    until = run.get("lease_until")
    return until is not None and int(until) > int(run["db_now"])


#: The error classes an evaluation item can end with that come from the candidate itself:
#: its output (invalid, filtered), its request (refused, over the context window), its
#: template (cannot be rendered with the item's input). They count against it (ERROR).
#: Every other way a task can end without an answer says nothing about the prompt: the
#: provider (rate limited, quota exhausted, server error, timeout, connection error,
#: auth error), the workers (lease expired: killed holding it; released at shutdown;
#: internal error; unroutable: no worker had the endpoint its model config names, which
#: says what the workers' configs hold, not what the prompt is worth), the database
#: (storage error), or a task cancelled or deleted by hand. Such an item could not be
#: evaluated: it is counted apart, and the evaluation ends FAILED instead of judging the
#: candidate on partial data. (A worker whose config lacks the endpoint fails nothing:
#: it hands the task back for a worker that has it, see ``Calls._unroutable``.)
CANDIDATE_ERRORS: frozenset[str] = frozenset({
    ErrorClass.INVALID_OUTPUT, ErrorClass.CONTENT_FILTERED, ErrorClass.INVALID_REQUEST,
    ErrorClass.CONTEXT_LENGTH_EXCEEDED, ErrorClass.RENDER_ERROR,
})

#: The error a run item stores for a task that ended without an answer (written by
#: :func:`score_item`): ``task DEAD: server_error: 503 ...``.
_TASK_ERROR = re.compile(r"^task ([A-Z]+): ([a-z_]*)")
_CLASSES = frozenset(str(c) for c in ErrorClass)
_MISSING = "task missing (deleted?)"


def unevaluated(error: str | None) -> str | None:
    """Why an item with this stored ``error`` could not be evaluated (the error class,
    ``cancelled`` or ``task_missing``), or None when the error is the candidate's own
    (or the item has none, or the user's scorer raised on the candidate's output)."""
    if not error:
        return None
    if error == _MISSING:
        return "task_missing"
    m = _TASK_ERROR.match(error)
    if m is None:
        return None  # "scorer raised ...": scored on the candidate's output
    status, cls = m.groups()
    if status == "CANCELLED":
        return "cancelled"
    if cls in CANDIDATE_ERRORS:
        return None
    return cls if cls in _CLASSES else "unclassified"


def score_item(comp: Comparator, row: dict[str, Any]) -> dict[str, Any]:
    """The verdict of one run item from its task's terminal state and result."""
    fig = row.get("figures") or {}
    out: dict[str, Any] = {
        "item_id": row["item_id"], "actual": row.get("result"), "error": None,
        "latency_ms": fig.get("latency_ms"), "input_tokens": fig.get("input_tokens"),
        "output_tokens": fig.get("output_tokens"), "attempts": fig.get("calls"),
    }
    status = row.get("status")
    if status is None:
        return {**out, "verdict": Verdict.ERROR, "error": _MISSING}
    if status != "SUCCEEDED":
        why = ": ".join(x for x in (row.get("error_class"), row.get("error_message")) if x)
        return {**out, "verdict": Verdict.ERROR, "error": f"task {status}: {why}"[:2000]}
    expected = orjson.loads(row["expected"])
    actual = orjson.loads(row["result"]) if row["result"] is not None else None
    try:
        scored = comp(expected, actual, orjson.loads(row["input_data"] or "null"))
    except Exception as exc:  # the user's scorer raised: this item cannot be scored
        return {**out, "verdict": Verdict.ERROR,
                "error": f"scorer raised {type(exc).__name__}: {exc}"[:2000]}
    return {**out, "verdict": Verdict.MATCH if scored.match else Verdict.MISMATCH}


def run_metrics(outcomes: list[dict[str, Any]], settings: BindingSettings,
                comp: Comparator) -> dict[str, Any]:
    """Metrics of a run from its scored items (labels re-derived, deterministically)."""
    ic = settings.comparison.ignore_case
    samples = []
    for o in outcomes:
        predicted = truth = None
        if settings.comparison.kind == "label":
            expected = orjson.loads(o["expected"])
            truth = comp.truth(expected)
            if o["verdict"] != Verdict.ERROR and o["actual"] is not None:
                predicted = comp(expected, orjson.loads(o["actual"])).predicted
        if ic:
            predicted, truth = fold_label(predicted), fold_label(truth)
        lost = unevaluated(o["error"]) if o["verdict"] == Verdict.ERROR else None
        samples.append(Sample(o["verdict"], predicted, truth, o["latency_ms"],
                              int(o["input_tokens"] or 0), int(o["output_tokens"] or 0),
                              unevaluated=lost))
    positive = fold_label(settings.positive_label) if ic else settings.positive_label
    prices = ((settings.prices.input_per_mtok, settings.prices.output_per_mtok)
              if settings.prices else None)
    return compute(samples, positive=positive, prices=prices)

