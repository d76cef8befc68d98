"""Reads of the task store for people and programs (status, a task, results, summaries)
and operator actions on tasks (cancel, retry, retention): mixed into :class:`Store`."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from sqlalchemy import TextClause, select

from lockgate.errors import NotFound, SpecError, StateConflict
from lockgate.results import (
    BatchSummary,
    Status,
    TaskResult,
    TaskView,
    WorkerInfo,
    percentile,
    utc,
)
from lockgate.store import schema
from lockgate.store.tx import AttemptObserver, Tx, sql
from lockgate.store.types import Finish, row_dict

if TYPE_CHECKING:
    from lockgate.store.dialects import Dialect

T = TypeVar("T")

#: PENDING tasks not visible yet and not leased: after an error (a retry's back-off, a
#: call given back while its endpoint was down), or scheduled (a batch's window or
#: pace: no error yet).
_WAITING = sql("SELECT error_class IS NULL, COUNT(*) FROM task WHERE status = 'PENDING' "
               "AND lease_token IS NULL AND visible_at > :now GROUP BY error_class IS NULL")
#: PENDING tasks a worker handed back because its config lacks their endpoint.
_UNROUTABLE = sql("SELECT COUNT(*) FROM task WHERE status = 'PENDING' "
                  "AND error_class = 'unroutable'")
_BATCH_COUNTS = sql("SELECT status, COUNT(*) FROM task WHERE batch_id = :b GROUP BY status")
_BATCH_EXISTS = sql("SELECT id FROM batch WHERE id = :b")
_CANCEL = sql("UPDATE task SET status = 'CANCELLED', finished_at = :now, updated_at = :now, "
              "version = version + 1, error_class = NULL, "
              "error_message = 'cancelled by operator' "
              "WHERE task_id = :tid AND status IN ('PENDING', 'REVIEW')")
#: REVIEW -> SUCCEEDED with a person's result (``lockgate tasks resolve``).
_RESOLVE = sql("UPDATE task SET status = 'SUCCEEDED', result = :result, "
               "parse_status = 'resolved', error_class = NULL, error_message = NULL, "
               "finished_at = :now, updated_at = :now, version = version + 1 "
               "WHERE task_id = :tid AND status = 'REVIEW'")
_TASK_KEY = sql("SELECT id, attempts FROM task WHERE task_id = :tid")
_CONFIG = sql("SELECT document FROM task_config WHERE hash = :h")
_COUNTS = sql("SELECT batch_id, status, COUNT(*) FROM task GROUP BY batch_id, status")
#: The batches of release-gate runs still in progress: their tasks and traces are what
#: the run's Finalize scores (tokens, latency, cost), so retention leaves them.
_EVALUATING = ("SELECT batch_id FROM prompt_run "
               "WHERE status IN ('MATERIALIZING', 'EXECUTING')")
#: The trace of a task not yet finished stays: a PENDING task's retries are what its
#: next claim counts its lost leases against (and what it failed with so far), and the
#: export of a task held for review hands its prompt to a person.
_DELETE_ATTEMPTS = sql("DELETE FROM task_attempt WHERE started_at <= :c AND task_pk NOT IN "
                       "(SELECT id FROM task WHERE status IN ('PENDING', 'REVIEW')) "
                       "AND task_pk NOT IN "
                       f"(SELECT id FROM task WHERE batch_id IN ({_EVALUATING}))")
_DELETE_FINISHED = sql("DELETE FROM task WHERE status IN ('SUCCEEDED', 'FAILED', 'DEAD', "
                       f"'CANCELLED') AND finished_at <= :c AND batch_id NOT IN ({_EVALUATING})")
_INCOMPLETE = sql("SELECT id FROM batch WHERE complete = 0 ORDER BY id")
_UNFINISHED_SUBMITS = sql("SELECT batch_id, source, host FROM batch_submit "
                          "ORDER BY batch_id, started_at")
_LEASED = sql("SELECT COUNT(*) FROM task WHERE status = 'PENDING' "
              "AND lease_token IS NOT NULL AND visible_at > :now")
_RETRY = sql("UPDATE task SET status = 'PENDING', visible_at = :now, updated_at = :now, "
             "attempts = 0, lease_token = NULL, leased_by = NULL, finished_at = NULL, "
             "result = NULL, parse_status = NULL, error_class = NULL, "
             "error_message = NULL, model = NULL, input_tokens = NULL, "
             "output_tokens = NULL, latency_ms = NULL, http_status = NULL, "
             "request_id = NULL, response = NULL, version = version + 1, "
             # the new run's trace starts after the earlier runs' (its retry budget)
             "trace_from = (SELECT COALESCE(MAX(a.id), 0) FROM task_attempt a "
             "WHERE a.task_pk = task.id) "
             "WHERE task_id = :tid AND status IN ('FAILED', 'DEAD', 'CANCELLED')")
_RETRY_BATCH = sql(_RETRY.text.replace("WHERE task_id = :tid AND status IN "
                                      "('FAILED', 'DEAD', 'CANCELLED')",
                                      "WHERE batch_id = :b AND status IN :st"), "st")
_RETRY_BATCH_CLASS = sql(_RETRY_BATCH.text + " AND error_class = :ec", "st")
_STATUS_OF = sql("SELECT status FROM task WHERE task_id = :tid")
_CANCEL_SUBMITTED = sql(_CANCEL.text.replace("'cancelled by operator'", ":why").replace(
    "WHERE task_id = :tid", "WHERE task_id IN :ids AND created_at IN :at"), "ids", "at")


class TaskViews:
    """The read side and the operator actions of the task store."""

    if TYPE_CHECKING:  # provided by Store
        dialect: Dialect

        def read(self) -> AbstractContextManager[Tx]: ...

        def transaction(self, fn: Callable[[Tx], T], *, attempts: int = 8) -> T: ...

    def batch_counts(self, batch_id: str) -> dict[str, int]:
        """Tasks of one batch per state (index-backed: cheap enough to poll)."""
        with self.read() as tx:
            return {s: int(n) for s, n in tx.execute(_BATCH_COUNTS, {"b": batch_id})}

    def status(self, *, alive_within_ms: int = 30_000,
               silent_within_ms: int = 3_600_000) -> Status:
        """Counts per batch and state, leases in flight, live workers, and the workers
        silent for longer than ``alive_within_ms`` (but less than ``silent_within_ms``)
        that never said they stopped: crashed, killed or cut off."""
        w = schema.worker
        with self.read() as tx:
            counts: dict[str, dict[str, int]] = {}
            for b, s, n in tx.execute(_COUNTS):
                counts.setdefault(b, {})[s] = int(n)
            leased = tx.execute(_LEASED).scalar_one()
            waiting = {bool(no_error): int(n) for no_error, n in tx.execute(_WAITING)}
            unroutable = int(tx.execute(_UNROUTABLE).scalar_one())
            workers: list[WorkerInfo] = []
            silent: list[WorkerInfo] = []
            for r in tx.execute(select(w).where(
                    w.c.status != "stopped", w.c.heartbeat_at >= tx.now - silent_within_ms)
                    .order_by(w.c.started_at)):
                info = WorkerInfo.from_row(row_dict(r), tx.now)
                (workers if info.heartbeat_age_s * 1000 <= alive_within_ms
                 else silent).append(info)
            incomplete = [str(b) for b in tx.execute(_INCOMPLETE).scalars()]
            unfinished: dict[str, list[str]] = {}
            for b, source, host in tx.execute(_UNFINISHED_SUBMITS):
                unfinished.setdefault(str(b), []).append(
                    f"{source or 'tasks given in memory'} on {host or 'an unknown host'}")
            now = utc(tx.now)
            assert now is not None
            return Status(now=now, batches=counts, leased=int(leased),
                          backing_off=waiting.get(False, 0), workers=workers,
                          incomplete_batches=incomplete, unfinished_submits=unfinished,
                          scheduled=waiting.get(True, 0), silent_workers=silent,
                          unroutable=unroutable)

    def task(self, task_id: str) -> TaskView:
        """One task with its config and every attempt, for ``lockgate tasks show``."""
        t, a = schema.task, schema.task_attempt
        with self.read() as tx:
            task = tx.one(select(t).where(t.c.task_id == task_id), missing=NotFound(
                f"no task '{task_id}'; check the id with `lockgate status`"))
            attempts = tx.rows(
                select(a).where(a.c.task_pk == task["id"]).order_by(a.c.id))
            config = orjson.loads(tx.execute(_CONFIG, {"h": task["config_hash"]}).scalar_one())
        return TaskView.from_rows(task, config, attempts)

    def cancel(self, task_id: str) -> None:
        """PENDING or REVIEW -> CANCELLED. A worker holding it will find its write-back
        fenced."""
        self._transition(task_id, _CANCEL, "PENDING or REVIEW", "cancel")

    def resolve(self, task_id: str, result: str, *, actor: str,
                reason: str | None = None, prompt_version: str | None = None,
                observe: AttemptObserver | None = None) -> None:
        """REVIEW -> SUCCEEDED with ``result`` (JSON text, already validated), one
        conditional UPDATE; the resolution is kept in the task's trace as an attempt row
        with outcome ``resolved`` (who: ``worker_id``, why: ``error_message``, the
        result: ``raw_output``; ``prompt_version``: the prompt it was held under).
        ``observe`` sees that row in the transaction, as a write-back's (the rollups
        count the task as ended)."""
        def work(tx: Tx) -> None:
            self._apply(tx, task_id, _RESOLVE, {"result": result}, "REVIEW", "resolve")
            pk, attempts = tx.execute(_TASK_KEY, {"tid": task_id}).one()
            row: dict[str, Any] = {
                "task_pk": int(pk), "attempt": int(attempts), "worker_id": actor[:64],
                "lease_token": "", "outcome": "resolved", "started_at": tx.now,
                "raw_output": result, "error_message": reason,
                "prompt_version": prompt_version}
            tx.execute(schema.task_attempt.insert(), [row])
            if observe is not None:
                observe(tx, [(Finish(id=int(pk), lease_token="", status="SUCCEEDED",
                                     result=result, parse_status="resolved"), row)])
        self.transaction(work)

    def cancel_submitted(self, task_ids: Iterable[str], created_at: Iterable[int],
                         why: str) -> int:
        """Cancel what a stopped submit wrote that no worker finished: the tasks of
        ``task_ids`` created at one of the ``created_at`` stamps of its chunks (a task
        of the same id another submit wrote bears another) and still PENDING; returns
        how many. A worker holding one finds its write-back fenced."""
        stamps = sorted(set(created_at))
        if not stamps:
            return 0
        n = 0
        ids = iter(task_ids)
        while part := list(itertools.islice(ids, 1000)):

            def cancel(tx: Tx, part: list[str] = part) -> int:
                return int(tx.execute(_CANCEL_SUBMITTED, {
                    "ids": part, "at": stamps, "why": why}).rowcount)
            n += self.transaction(cancel)
        return n

    def retry(self, task_id: str) -> None:
        """FAILED, DEAD or CANCELLED -> PENDING with a fresh attempt budget."""
        self._transition(task_id, _RETRY, "FAILED, DEAD or CANCELLED", "retry")

    def retry_batch(self, batch_id: str, *, statuses: Iterable[str] = ("FAILED", "DEAD"),
                    error_class: str | None = None) -> int:
        """Every task of a batch in one of ``statuses`` (FAILED, DEAD, CANCELLED), and
        with ``error_class`` if given, back to PENDING with a fresh attempt budget, in
        one statement; returns how many. Running it again finds nothing more to do. One
        status may be given as a string."""
        if isinstance(statuses, str):  # "DEAD" was read as D, E, A, D
            statuses = [statuses]
        wanted = sorted({str(st).upper() for st in statuses})
        bad = set(wanted) - {"FAILED", "DEAD", "CANCELLED"}
        if bad or not wanted:
            raise SpecError(f"can only be FAILED, DEAD or CANCELLED, not {', '.join(sorted(bad))}"
                            if bad else "name at least one of FAILED, DEAD or CANCELLED",
                            field="status")
        sql_ = _RETRY_BATCH if error_class is None else _RETRY_BATCH_CLASS

        def work(tx: Tx) -> int:
            if tx.execute(_BATCH_EXISTS, {"b": batch_id}).first() is None:
                raise NotFound(f"no batch '{batch_id}'; `lockgate status` lists them")
            return int(tx.execute(sql_, {"b": batch_id, "st": wanted,
                                         "ec": error_class}).rowcount)
        return self.transaction(work)

    def _transition(self, task_id: str, statement: TextClause, needs: str,
                    verb: str) -> None:
        self.transaction(lambda tx: self._apply(tx, task_id, statement, {}, needs, verb))

    @staticmethod
    def _apply(tx: Tx, task_id: str, statement: TextClause, params: dict[str, Any],
               needs: str, verb: str) -> None:
        """One conditional UPDATE naming the state it leaves; its row count checked."""
        if tx.execute(statement, {"tid": task_id, **params}).rowcount == 1:
            return
        st = tx.execute(_STATUS_OF, {"tid": task_id}).scalar()
        if st is None:
            raise NotFound(f"no task '{task_id}'; check the id with `lockgate status`")
        raise StateConflict(f"cannot {verb} task '{task_id}': it is {st}, "
                            f"and {verb} needs {needs}")

    def review_rows(self, batch_id: str | None = None, *,
                    page: int = 500) -> Iterator[dict[str, Any]]:
        """Every task in REVIEW (of one batch, or all), in id order, as a dict: the task
        row's ``id``, ``task_id``, ``batch_id``, ``input_data``, ``config_hash``,
        ``attempts``, ``created_at``, ``updated_at``, with ``held`` (the attempt row
        that held it for review: its prompt version and rendered prompt) and ``last``
        (the last attempt that called the model: its raw output or error), each None
        when there is none. Read in pages (keyset on id)."""
        if batch_id is not None and not self.batch_exists(batch_id):
            raise NotFound(f"no batch '{batch_id}'; `lockgate status` lists them")
        t, a = schema.task, schema.task_attempt
        cols = [t.c.id, t.c.task_id, t.c.batch_id, t.c.input_data, t.c.config_hash,
                t.c.attempts, t.c.created_at, t.c.updated_at, t.c.error_message]
        after = 0
        while True:
            q = select(*cols).where(t.c.status == "REVIEW", t.c.id > after)
            if batch_id is not None:
                q = q.where(t.c.batch_id == batch_id)
            with self.read() as tx:
                tasks = tx.rows(q.order_by(t.c.id).limit(page))
                if not tasks:
                    return
                attempts = tx.rows(select(
                    a.c.task_pk, a.c.outcome, a.c.prompt_version, a.c.prompt_snapshot,
                    a.c.raw_output, a.c.error_class, a.c.error_message, a.c.endpoint,
                    a.c.model, a.c.started_at, a.c.parse_status).where(
                    a.c.task_pk.in_([r["id"] for r in tasks])).order_by(a.c.id))
            held: dict[int, dict[str, Any]] = {}
            last: dict[int, dict[str, Any]] = {}
            for r in attempts:
                pk = int(r["task_pk"])
                if r["outcome"] == "review":
                    held[pk] = r
                elif r["raw_output"] is not None or r["error_class"] is not None:
                    last[pk] = r
            for r in tasks:
                yield {**r, "held": held.get(int(r["id"])), "last": last.get(int(r["id"]))}
            after = int(tasks[-1]["id"])

    def results(self, batch_id: str | None = None) -> Iterator[TaskResult]:
        """Stream every task of a batch (or all) in id order, with the usage of the call
        whose answer was delivered. :class:`NotFound` for a batch never submitted."""
        if batch_id is not None and not self.batch_exists(batch_id):
            raise NotFound(f"no batch '{batch_id}'; `lockgate status` lists them")
        return self._results(batch_id)

    def _results(self, batch_id: str | None) -> Iterator[TaskResult]:
        # One table, no join: the call that ended each task is on its row, so the plan
        # is a scan whatever the planner's statistics (a join to task_attempt could be
        # planned as a nested loop over a freshly loaded, unanalysed table).
        t = schema.task
        q, values = self.dialect.select_stream([t.c[name] for name in TaskResult.COLUMNS])
        q = q.order_by(t.c.id)
        if batch_id is not None:
            q = q.where(t.c.batch_id == batch_id)
        from_row = TaskResult.from_row
        # The cursor is closed however the reading ends: a reader that stops early
        # (``export | head``, an interrupted export) leaves no server cursor open.
        with self.read() as tx, self.dialect.long_read(tx.conn), \
                tx.stream(q, rows=5000) as result:
            for rows in result.partitions():
                for row in rows:
                    yield from_row(values(row))

    def batch_exists(self, batch_id: str) -> bool:
        """Whether a batch of this id was ever submitted."""
        with self.read() as tx:
            return tx.execute(_BATCH_EXISTS, {"b": batch_id}).first() is not None

    def attempt_stats(self, batch_id: str | None = None) -> dict[str, Any]:
        """Calls, outcomes, latencies and completeness over the attempts of a batch."""
        t, a = schema.task, schema.task_attempt
        q = select(a.c.outcome, a.c.latency_ms, a.c.completeness, a.c.error_class,
                   a.c.parse_status, a.c.prompt_sha256)
        if batch_id is not None:
            q = q.join(t, t.c.id == a.c.task_pk).where(t.c.batch_id == batch_id)
        latencies: list[float] = []
        outcomes: dict[str, int] = {}
        errors: dict[str, int] = {}
        parse: dict[str, int] = {}
        comp_sum = 0.0
        comp_n = calls = 0
        with self.read() as tx:
            for outcome, lat, comp, err, ps, sha in tx.stream(q, rows=5000):
                outcomes[outcome] = outcomes.get(outcome, 0) + 1
                if lat is not None and (sha is not None or lat > 0):
                    calls += 1
                    latencies.append(float(lat))
                if err:
                    errors[err] = errors.get(err, 0) + 1
                if ps:
                    parse[ps] = parse.get(ps, 0) + 1
                if outcome == "succeeded" and comp is not None:
                    comp_sum += comp
                    comp_n += 1
        # A call is an attempt that was sent, as the quality rollups count it: a latency
        # and the hash of a rendered prompt (a trace with a measured latency but no hash
        # kept counts too). A review hold, a resolution by hand and a claim ended
        # without a call (lost leases, a configuration error) have no latency; a prompt
        # that did not render (latency 0, no prompt) was never sent.
        return {"calls": calls, "outcomes": outcomes, "errors": errors,
                "parse_status": parse, "latencies_ms": latencies,
                "completeness": comp_sum / comp_n if comp_n else None}

    def summary(self, batch_id: str | None = None,
                elapsed_s: float | None = None) -> BatchSummary:
        """What happened to one batch (or to everything): states, calls, retries,
        duplicate calls, errors, parse statuses, latency percentiles, completeness.
        :class:`NotFound` for a batch never submitted."""
        if batch_id is not None and not self.batch_exists(batch_id):
            raise NotFound(f"no batch '{batch_id}'; `lockgate status` lists them")
        states: dict[str, int] = {}
        for b, counts in self.status().batches.items():
            if batch_id is None or b == batch_id:
                for k, v in counts.items():
                    states[k] = states.get(k, 0) + v
        a = self.attempt_stats(batch_id)
        lat = sorted(a["latencies_ms"])
        return BatchSummary(
            batch_id=batch_id, states=states, calls=a["calls"],
            retries=a["outcomes"].get("retry", 0),
            duplicate_calls=a["outcomes"].get("discarded", 0),
            outcomes=a["outcomes"], errors=a["errors"], parse_status=a["parse_status"],
            latency_ms={q: percentile(lat, v) for q, v in
                        (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))},
            completeness=a["completeness"], elapsed_s=elapsed_s)

    def cleanup(self, *, older_than_ms: int, tasks: bool = False) -> dict[str, int]:
        """Retention: delete attempts (and optionally finished tasks) at least
        ``older_than_ms`` old (0: everything finished up to now, this millisecond's too).

        The cutoff is the database clock minus ``older_than_ms``; tasks' ``finished_at``
        and attempts' ``started_at`` are on that clock (a worker stamps its attempts
        with its own clock corrected by the offset it measures against the database's).
        A negative age is refused: it would reach into work still in flight."""
        if older_than_ms < 0:
            raise SpecError(f"must not be negative (got {older_than_ms} ms)",
                            field="older_than")
        deleted = {"attempts": 0, "tasks": 0}

        def work(tx: Tx) -> None:
            cutoff = {"c": tx.now - older_than_ms}
            deleted["attempts"] = tx.execute(_DELETE_ATTEMPTS, cutoff).rowcount
            if tasks:
                deleted["tasks"] = tx.execute(_DELETE_FINISHED, cutoff).rowcount
        self.transaction(work)
        return deleted

    def truncate_all(self) -> None:
        """Delete every row (tests and benchmarks only)."""
        def work(tx: Tx) -> None:
            for tbl in reversed(schema.metadata.sorted_tables):
                tx.execute(tbl.delete())
        self.transaction(work)
