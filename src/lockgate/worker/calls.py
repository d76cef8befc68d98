"""A worker's calls: each claimed task started as soon as a slot is free, its
config resolved (cached), its route and flow-control passage taken, the model
called and the answer decided into a write-back (:mod:`lockgate.worker.execute`
holds the pure parts)."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Coroutine
from typing import Any

import orjson

from lockgate import runtime
from lockgate.config import Endpoint
from lockgate.errors import ConfigError, ErrorClass, LockgateError
from lockgate.providers.base import Provider
from lockgate.registry.resolver import Entry, Fixed, load
from lockgate.spec import TaskConfig
from lockgate.states import TaskStatus
from lockgate.store import ClaimedTask, Finish
from lockgate.worker.core import WorkerCore
from lockgate.worker.execute import (
    AttemptResult,
    Decision,
    attempt_trace,
    decide,
    idempotency_key,
    provider_params,
    run_attempt,
)

log = logging.getLogger("lockgate.worker")

def _uncalled(t: ClaimedTask, started: int, status: TaskStatus, error_class: ErrorClass,
              message: str, detail: str) -> Finish:
    """A terminal write-back for a task that ends before any call is made; ``detail`` is
    the attempt row's message, ``message`` the task's."""
    return Finish(id=t.id, lease_token=t.lease_token, status=status,
                  error_class=str(error_class), error_message=message,
                  attempt={"attempt": t.attempt, "outcome": str(status).lower(),
                           "started_at": started, "error_message": detail,
                           "error_class": str(error_class)})


class Calls(WorkerCore):
    """Starting and running the calls of claimed tasks."""

    async def _start(self, rows: list[ClaimedTask]) -> None:
        self.stats.claimed += len(rows)
        for r in rows:  # held (and renewed) from now on, whatever happens next
            self._held[r.id, r.lease_token] = r
        entries = {h: e for h in {r.config_hash for r in rows}
                   if (e := self._configs.get(h)) is not None}
        missing = {r.config_hash for r in rows} - entries.keys()
        if missing:
            docs = await self._db_retry("reading task configs", self.store.configs, missing)
            for h, doc in docs.items():
                entries[h] = self._configs[h] = load(h, doc)
        for r in rows:
            entry = entries[r.config_hash]
            if len(self._running) < self.ws.concurrency:
                self._launch(r, entry)
            else:
                self._ready.append((r, entry))

    def _launch(self, t: ClaimedTask, entry: Entry) -> None:
        self._running[t.id, t.lease_token] = asyncio.create_task(self._execute(t, entry))

    async def _execute(self, t: ClaimedTask, entry: Entry) -> None:
        started = self._now_ms()
        try:
            finish = await self._attempt(t, entry, started)
        except asyncio.CancelledError:
            # Shutdown ran out of grace: give the task back without spending an attempt.
            finish = Finish(id=t.id, lease_token=t.lease_token, status=TaskStatus.PENDING,
                            error_class=str(ErrorClass.RELEASED_AT_SHUTDOWN),
                            error_message="released: worker shut down mid-call",
                            release_attempt=True,
                            attempt={"attempt": t.attempt, "outcome": "released",
                                     "started_at": started,
                                     "error_class": str(ErrorClass.RELEASED_AT_SHUTDOWN)})
            self.stats.released += 1
        except Exception as exc:  # a bug must not lose the task: retry it later
            log.exception("internal error executing task %s", t.task_id)
            finish = Finish(id=t.id, lease_token=t.lease_token, status=TaskStatus.PENDING,
                            error_class=str(ErrorClass.INTERNAL_ERROR),
                            error_message=f"{type(exc).__name__}: {exc}"[:2000],
                            delay_ms=5000,
                            attempt={"attempt": t.attempt, "outcome": "retry",
                                     "started_at": started,
                                     "error_class": str(ErrorClass.INTERNAL_ERROR)})
        self._buffer.append(finish)
        self._running.pop((t.id, t.lease_token), None)
        if self._ready and not self._stopping.is_set():
            self._launch(*self._ready.popleft())
        self._ended += 1
        if self._ended >= self._wake_after:
            self._slot_free.set()
        if len(self._buffer) == 1 or len(self._buffer) >= self.ws.flush_rows:
            self._flush_wake.set()  # the first row to write (the loop sleeps till then)

    async def _attempt(self, t: ClaimedTask, entry: Entry, started: int) -> Finish:
        if isinstance(entry, Fixed):  # no coroutine for the common case
            config, prompt_version = entry.config, entry.version
        else:
            try:
                config, prompt_version = await self._prompts.resolve(
                    entry, functools.partial(self._db_retry, "reading the prompt registry"))
            except LockgateError as exc:  # a registry reference that names nothing
                return _uncalled(t, started, TaskStatus.FAILED, ErrorClass.INVALID_REQUEST,
                                 f"prompt registry: {exc}", str(exc))
        model_path = config.delivery_rule.pydantic_model
        if model_path and not runtime.model_allowed(model_path,
                                                    self.settings.runtime.model_modules):
            msg = (f"delivery_rule.pydantic_model {model_path!r} is not in a module listed "
                   "under [runtime] model_modules; this worker does not import it")
            return _uncalled(t, started, TaskStatus.FAILED, ErrorClass.INVALID_REQUEST, msg,
                             msg)
        policy = config.retry_policy
        if t.attempt > policy.max_retries + 1:
            # Earlier claims were lost (crashed workers) and spent the attempt budget.
            msg = f"attempt {t.attempt} exceeds max_retries+1 after lost leases"
            return _uncalled(t, started, TaskStatus.DEAD, ErrorClass.LEASE_EXPIRED, msg, msg)
        route_key = t.config_hash if prompt_version is None else \
            f"{t.config_hash}@{prompt_version}"
        route = self._routes.get(route_key)
        if route is None:
            try:
                endpoint = self.settings.route(config.model)
                route = (endpoint, self._provider(endpoint),
                         provider_params(config, endpoint, self.id))
            except ConfigError as exc:  # not retryable: the operator must fix the config
                return _uncalled(t, started, TaskStatus.FAILED, ErrorClass.INVALID_REQUEST,
                                 f"configuration: {exc}", str(exc))
            self._routes[route_key] = route
        endpoint, _provider, params = route
        input_data = orjson.loads(t.input_data)
        key = idempotency_key(t.task_id, t.lease_token, t.attempt)

        def call(ep: Endpoint, provider: Provider) -> Coroutine[Any, Any, AttemptResult]:
            # The flow controller picks the endpoint (the primary, or its fallback; its
            # own copy of the settings, so compared by name). A plain function: the
            # coroutine it returns is awaited directly, one frame fewer to resume at
            # every step of the HTTP call.
            return run_attempt(config, input_data, ep, provider,
                               idempotency_key=key,
                               params=params if ep.name == endpoint.name else
                               self._fallback_params(route_key, config, ep))

        res, passage = await self.flow.call(t, config, endpoint, call)
        d = decide(config, t.attempt, res, self._rng)
        unspent = passage.unspent is not None
        if unspent:  # not the task's fault (e.g. refused before any work, a fallback
            # takes it at once): retried without spending an attempt
            d = Decision(TaskStatus.PENDING, None, passage.delay_ms, str(passage.unspent))
        parsed = res.parsed
        c = res.completion
        trace = attempt_trace(t.attempt, started, res, d.outcome,
                              store_snapshot=self.ws.store_snapshots,
                              prompt_version=prompt_version)
        trace["routed_from"] = passage.routed_from
        return Finish(
            id=t.id, lease_token=t.lease_token, status=d.status, result=d.result,
            parse_status=str(parsed.status) if parsed else None,
            error_class=str(res.error_class) if res.error_class else None,
            error_message=(res.error_message or "")[:2000] or None,
            delay_ms=d.delay_ms, release_attempt=unspent, attempt=trace,
            model=c.model if c else res.model, input_tokens=c.prompt_tokens if c else None,
            output_tokens=c.completion_tokens if c else None,
            latency_ms=round(res.latency_ms, 3), http_status=res.http_status,
            request_id=res.request_id, response=res.response_body)

    def _fallback_params(self, route_key: str, config: TaskConfig,
                         ep: Endpoint) -> dict[str, Any]:
        key = (route_key, ep.name)
        params = self._fb_params.get(key)
        if params is None:
            params = self._fb_params[key] = provider_params(config, ep, self.id)
        return params
