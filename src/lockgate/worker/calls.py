"""A worker's calls: each claimed task started as soon as a slot is free, its
config resolved (cached), its route and flow-control passage taken, the model
called and the answer decided into a write-back (:mod:`lockgate.worker.execute`
holds the pure parts)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import orjson

from lockgate import runtime
from lockgate.config import Endpoint
from lockgate.errors import ConfigError, ErrorClass, LockgateError
from lockgate.providers.base import Provider
from lockgate.registry.refs import parse_ref
from lockgate.registry.resolver import Entry, Fixed, RegistryRef, load
from lockgate.spec import TaskConfig
from lockgate.states import TaskStatus
from lockgate.store import ClaimedTask, Finish
from lockgate.store.types import AttemptRow
from lockgate.worker.core import WorkerCore
from lockgate.worker.execute import (
    AttemptResult,
    Decision,
    attempt_trace,
    decide,
    idempotency_key,
    provider_params,
    render_prompt,
    run_attempt,
    trace_fixes,
)

log = logging.getLogger("lockgate.worker")
#: How long a worker takes a circuit's missing fallback version for missing.
MISSING_FALLBACK_RECHECK_S = 30.0
#: How many times an attempt starts again because the registry version it resolved was
#: replaced while it waited for admission; the last start sends whatever it resolved.
MAX_RESOLVES = 3
#: How long a task this worker cannot route (its endpoint is not in this worker's config)
#: is handed back for: a worker whose config has the endpoint takes it meanwhile, and
#: this one does not claim it again at once.
UNROUTABLE_DELAY_MS = 5_000
#: How often a worker repeats its warning about one endpoint it lacks (seconds).
UNROUTABLE_WARN_S = 60.0
#: How long a worker keeps its last look at which workers have an endpoint (seconds).
ENDPOINT_SEEN_CACHE_S = 10.0


class _VersionMoved(Exception):
    """The version a waiting call resolved is no longer what its reference names."""

def max_lost_leases(max_retries: int) -> int:
    """The lost leases after which a claim ends its task DEAD (``lease_expired``) without
    a call: at least 3, and never fewer than the claims the retry budget allows."""
    return max(3, max_retries + 1)


_ERROR_CLASSES = frozenset(str(c) for c in ErrorClass)


def _uncalled(t: ClaimedTask, started: int, status: TaskStatus, error_class: ErrorClass,
              message: str, detail: str, config: TaskConfig | None = None,
              prompt_version: str | None = None) -> Finish:
    """A terminal write-back for a task that ends before any call is made; ``detail`` is
    the attempt row's message, ``message`` the task's. Once its prompt is resolved
    (``config``), the row names the prompt version and the model the call would have
    used: the quality rollups count the task under them, not under no prompt."""
    attempt: AttemptRow = {"attempt": t.attempt, "outcome": str(status).lower(),
                           "started_at": started, "error_message": detail,
                           "error_class": str(error_class)}
    if config is not None:
        attempt["prompt_version"] = prompt_version
        attempt["model"] = config.model.name
    return Finish(id=t.id, lease_token=t.lease_token, status=status,
                  error_class=str(error_class), error_message=message, attempt=attempt)


class Calls(WorkerCore):
    """Starting and running the calls of claimed tasks."""

    async def _start(self, rows: list[ClaimedTask], asked: float) -> None:
        """Hold and start (or keep ready) the tasks of a claim sent at ``asked``
        (monotonic): their leases run from then at the latest."""
        self.stats.claimed += len(rows)
        for r in rows:  # held (and renewed) from now on, whatever happens next
            self._held[r.id, r.lease_token] = r
            self._ready_at[r.id, r.lease_token] = asked
        entries = {h: e for h in {r.config_hash for r in rows}
                   if (e := self._configs.get(h)) is not None}
        missing = {r.config_hash for r in rows} - entries.keys()
        if missing:
            docs = await self._db_retry("reading task configs", self.store.configs, missing)
            for h, doc in docs.items():
                entries[h] = self._configs[h] = load(h, doc)
        if time.monotonic() - asked >= self.ws.lease_s / 2:
            # The claim (or the configs' read) took long: the process was frozen
            # meanwhile, or the claim waited on a lock before it leased them. Ask the
            # database which are still this worker's (renewing them): another worker
            # may hold some by now, and calling those would only duplicate its calls.
            await self._renew(rows, retry="renewing the leases of a late claim")
        for r in rows:
            entry = entries[r.config_hash]
            if len(self._running) < self.ws.concurrency:
                if not self._lapsed(r):
                    self._launch(r, entry)
            else:
                self._ready.append((r, entry))

    def _lapsed(self, t: ClaimedTask) -> bool:
        """Whether the lease of a task kept ready has run out unrenewed (the process was
        frozen or cut off from the database for longer than a lease): another worker
        may hold the task now, so calling it would only duplicate that call. It is let
        go, without a write-back (its lease is no longer this worker's to fence)."""
        key = (t.id, t.lease_token)
        since = self._ready_at.pop(key, 0.0)  # claimed, or last renewed
        if key in self._taken_over:  # a renewal found it another worker's since
            self._taken_over.discard(key)
        elif time.monotonic() - since < self.ws.lease_s:
            return False
        self._held.pop(key, None)
        self.stats.lapsed += 1
        if self.stats.lapsed == 1 or self.stats.lapsed % 100 == 0:
            log.warning("%d task(s) kept ready outlived their lease unrenewed (the worker "
                        "was frozen or cut off from the database): let go uncalled",
                        self.stats.lapsed)
        if not self._held:
            self._held_empty.set()
        return True

    def _launch(self, t: ClaimedTask, entry: Entry) -> None:
        self._running[t.id, t.lease_token] = asyncio.create_task(self._execute(t, entry))

    async def _execute(self, t: ClaimedTask, entry: Entry) -> None:
        started = self._now_ms()
        claim = (t.id, t.lease_token)
        try:
            finish = await self._attempt(t, entry, started)
        except asyncio.CancelledError:
            # Shutdown ran out of grace: give the task back. Before its request was sent
            # (waiting for admission or a slot) this costs nothing. After, the provider
            # may be working on it: the claim stays counted, and as its outcome is not
            # written it counts as a lost lease (``_call_number``), so that rolling
            # restarts shorter than the call cannot call the provider without end.
            sent = claim in self._sent
            why = ("released: worker shut down mid-call, after the request was sent "
                   "(counted as a lost lease)" if sent else
                   "released: worker shut down before the request was sent")
            finish = Finish(id=t.id, lease_token=t.lease_token, status=TaskStatus.PENDING,
                            error_class=str(ErrorClass.RELEASED_AT_SHUTDOWN),
                            error_message=why, release_attempt=not sent,
                            attempt={"attempt": t.attempt, "outcome": "released",
                                     "started_at": started, "error_message": why,
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
                                     "error_class": str(ErrorClass.INTERNAL_ERROR),
                                     "error_message": f"{type(exc).__name__}: {exc}"[:2000]})
        self._sent.discard(claim)
        self._buffer.append(finish)
        self._running.pop(claim, None)
        while self._ready and not self._stopping.is_set():
            nxt, entry = self._ready.popleft()
            if not self._lapsed(nxt):
                self._launch(nxt, entry)
                break
        self._ended += 1
        if self._ended >= self._wake_after:
            self._slot_free.set()
        if len(self._buffer) == 1 or len(self._buffer) >= self.ws.flush_rows \
                or not self._running:
            # the first row to write (the loop sleeps till then), a full batch, or the
            # last call ended (nothing more to gather)
            self._flush_wake.set()

    async def _call_number(self, t: ClaimedTask, config: TaskConfig,
                           prompt_version: str | None, started: int) -> int | Finish:
        """This claim's call number in the task's retry budget, or its DEAD write-back.

        Each claim spends an attempt; those of earlier claims that wrote no retry were
        lost with workers that crashed or stalled holding the task. They do not spend
        its retries (a worker killed with its prefetched tasks would end them all at
        ``max_retries = 0``), but a task that keeps losing its lease (it kills its
        workers) ends DEAD instead of looping. A claim given back by a worker that was
        stopped after the request was sent keeps its attempt: it counts here as a lost
        lease too."""
        max_retries = config.retry_policy.max_retries
        lost = 0
        if t.attempt > 1:
            retried = await self._db_retry("reading the task's attempts",
                                           self.store.retries_before, t.id, t.attempt)
            lost = max(0, t.attempt - 1 - retried)
        if lost >= max_lost_leases(max_retries):
            msg = (f"its lease was lost {lost} times (its workers crashed, stalled, or "
                   "were stopped while its call was under way: a shutdown grace shorter "
                   "than the call): not called again")
            return _uncalled(t, started, TaskStatus.DEAD, ErrorClass.LEASE_EXPIRED, msg, msg,
                             config, prompt_version)
        call_no = t.attempt - lost
        if call_no > max_retries + 1:
            # Its retries are spent by retries the policy did not decide (an internal
            # error of the worker's own, or a config whose max_retries went down): the
            # task ends DEAD with the error its last retry met.
            cls, why = await self._db_retry("reading the task's attempts",
                                            self.store.last_retry, t.id, t.attempt)
            error = ErrorClass(cls) if cls in _ERROR_CLASSES else ErrorClass.INTERNAL_ERROR
            msg = (f"retries spent: {call_no - 1} calls ended in a retry (max_retries "
                   f"{max_retries}); the last: {cls or error}"
                   + (f": {why}" if why else ""))[:2000]
            return _uncalled(t, started, TaskStatus.DEAD, error, msg, msg, config,
                             prompt_version)
        return call_no

    async def _attempt(self, t: ClaimedTask, entry: Entry, started: int) -> Finish:
        """The attempt's write-back. A call that names a prompt by a moving reference
        (``NAME``, ``NAME@label``) may wait behind a rate limit or a full endpoint for
        longer than a rollback takes to reach the worker: when it is admitted, the
        reference is resolved again (cached, re-read at most every ``refresh_s``), and
        if it names another version now, the call gives its admission back unsent and
        the attempt starts again on that version."""
        for _ in range(MAX_RESOLVES - 1):
            try:
                return await self._attempt_on(t, entry, started, recheck=True)
            except _VersionMoved:
                self.stats.version_moves += 1
        return await self._attempt_on(t, entry, started, recheck=False)

    async def _attempt_on(self, t: ClaimedTask, entry: Entry, started: int, *,
                          recheck: bool) -> Finish:
        if isinstance(entry, Fixed):  # no coroutine for the common case
            config, prompt_version = entry.config, entry.version
            prompt_key = entry.prompt_key
        else:
            try:
                config, prompt_version = await self._prompts.resolve(
                    entry, functools.partial(self._db_retry, "reading the prompt registry"),
                    t.task_id)
            except LockgateError as exc:  # a registry reference that names nothing
                return _uncalled(t, started, TaskStatus.FAILED, ErrorClass.INVALID_REQUEST,
                                 f"prompt registry: {exc}", str(exc))
            prompt_key = prompt_version
        resolved = prompt_version  # (before a circuit's detour)
        fallback_endpoint = None
        if self._circuits.circuits:  # decided here, once per attempt: a call under way
            # finishes on the path it started on
            taken = await self._detour(t, entry, config, prompt_version, prompt_key, started)
            if isinstance(taken, Finish):
                return taken
            if taken is not None:
                config, prompt_version, fallback_endpoint = taken
        model_path = config.delivery_rule.pydantic_model
        if model_path and not runtime.model_allowed(model_path,
                                                    self.settings.runtime.model_modules):
            msg = (f"delivery_rule.pydantic_model {model_path!r} is not in a module listed "
                   "under [runtime] model_modules; this worker does not import it")
            return _uncalled(t, started, TaskStatus.FAILED, ErrorClass.INVALID_REQUEST, msg,
                             msg, config, prompt_version)
        route_key = t.config_hash if prompt_version is None else \
            f"{t.config_hash}@{prompt_version}"
        route = self._routes.get(route_key)
        if route is None:
            try:
                endpoint = self.settings.route(config.model)
            except ConfigError as exc:  # this worker's config lacks the endpoint: the
                # task is handed back (checked first: it spends and decides nothing)
                return await self._unroutable(t, config, prompt_version, started, exc)
            try:
                route = (endpoint, self._provider(endpoint),
                         provider_params(config, endpoint, self.id))
            except ConfigError as exc:  # not retryable: the operator must fix the config
                return _uncalled(t, started, TaskStatus.FAILED, ErrorClass.INVALID_REQUEST,
                                 f"configuration: {exc}", str(exc), config, prompt_version)
            self._routes[route_key] = route
        budget = await self._call_number(t, config, prompt_version, started)
        if isinstance(budget, Finish):
            return budget
        call_no = budget
        endpoint, _provider, params = route
        circuit_from = None
        if fallback_endpoint is not None and fallback_endpoint != endpoint.name:
            fb = self.settings.endpoint_named(fallback_endpoint)
            if fb is not None:
                circuit_from = endpoint.name
                endpoint = fb
                route_key = f"{route_key}>{fb.name}"
                params = self._fallback_params(route_key, config, fb)
        input_data = orjson.loads(t.input_data)
        key = idempotency_key(t.task_id, t.lease_token, t.attempt)

        def call(ep: Endpoint, provider: Provider) -> Coroutine[Any, Any, AttemptResult]:
            # The flow controller picks the endpoint (the primary, or its fallback; its
            # own copy of the settings, so compared by name). A plain function: the
            # coroutine it returns is awaited directly, one frame fewer to resume at
            # every step of the HTTP call. From here on the request is sent.
            self._sent.add((t.id, t.lease_token))
            self._unroutable_streak = 0
            return run_attempt(config, input_data, ep, provider,
                               idempotency_key=key, now_ms=self._now_ms,
                               input_size=len(t.input_data),
                               render_threads=self._render_threads,
                               params=params if ep.name == endpoint.name else
                               self._fallback_params(route_key, config, ep))

        fn = functools.partial(self._if_current, call, entry, resolved, t.task_id) \
            if recheck and isinstance(entry, RegistryRef) and entry.ref.version is None \
            else call
        res, passage = await self.flow.call(t, config, endpoint, fn)
        d = decide(config, call_no, res, self._rng)
        # (a task whose policy stops on the error, e.g. ``stop_on = ["auth_error"]``,
        # ends as its policy says even while its endpoint is down; a fallback that takes
        # it still does)
        unspent = passage.unspent is not None and not (
            passage.unspent in ("unreachable", "first_429")
            and res.error_class in config.retry_policy.stop_on)
        if unspent:  # not the task's fault (e.g. refused before any work, a fallback
            # takes it at once): retried without spending an attempt
            d = Decision(TaskStatus.PENDING, None, passage.delay_ms, str(passage.unspent))
        parsed = res.parsed
        c = res.completion
        trace = attempt_trace(t.attempt, started, res, d.outcome,
                              store_snapshot=self.ws.store_snapshots,
                              prompt_version=prompt_version)
        trace["routed_from"] = passage.routed_from or circuit_from
        return Finish(
            id=t.id, lease_token=t.lease_token, status=d.status, result=d.result,
            parse_status=str(parsed.status) if parsed else None,
            error_class=str(res.error_class) if res.error_class else None,
            error_message=(res.error_message or "")[:2000] or None,
            delay_ms=d.delay_ms, release_attempt=unspent, attempt=trace,
            model=c.model if c else (res.answered_model or res.model),
            input_tokens=res.prompt_tokens, output_tokens=res.completion_tokens,
            latency_ms=round(res.latency_ms, 3), http_status=res.http_status,
            request_id=res.request_id, response=res.response_body, sent_at=res.sent_at)

    async def _unroutable(self, t: ClaimedTask, config: TaskConfig,
                          prompt_version: str | None, started: int,
                          exc: ConfigError) -> Finish:
        """The write-back of a task whose endpoint this worker's config does not have (a
        rolling config change: the task was submitted with a newer config). Handed back
        uncalled, its attempt not spent, for ``UNROUTABLE_DELAY_MS``: a worker that has
        the endpoint takes it. It fails (``unroutable``, never the task's own error) at
        once if its retry policy stops on ``unroutable``, or once it has waited
        ``unroutable_after_s`` since it was submitted while no worker with the endpoint
        in its config was alive during that time."""
        name = config.model.endpoint
        if not name:  # (cannot happen: a config's default endpoint is checked)
            return _uncalled(t, started, TaskStatus.FAILED, ErrorClass.INVALID_REQUEST,
                             f"configuration: {exc}", str(exc), config, prompt_version)
        have = ", ".join(e.name for e in self.settings.endpoints())
        why = (f"model_config.endpoint '{name}' is not in the config of worker {self.id} "
               f"(its endpoints: {have})")
        fix = (f"deploy the config with endpoint '{name}' ([[endpoint]] name = \"{name}\") "
               "to the workers")
        if ErrorClass.UNROUTABLE in config.retry_policy.stop_on:
            msg = (f"{why}; retry_policy.stop_on names unroutable, so it is not left to "
                   f"another worker: {fix}, then `lockgate tasks retry`")
            return _uncalled(t, started, TaskStatus.FAILED, ErrorClass.UNROUTABLE, msg, msg,
                             config, prompt_version)
        bound_ms = int(self.ws.unroutable_after_s * 1000)
        created = await self._db_retry("reading the task", self.store.task_created_at, t.id)
        if created is not None and self._now_ms() - created >= bound_ms \
                and not await self._endpoint_seen(name, bound_ms):
            waited = f"{bound_ms / 60_000:g} min" if bound_ms >= 60_000 else \
                f"{bound_ms / 1000:g} s"
            msg = (f"no worker with endpoint '{name}' in its config ran in the "
                   f"{waited} since the task was submitted ({why}): {fix}, then "
                   "`lockgate tasks retry`")
            log.warning("task %s FAILED unroutable: %s", t.task_id, msg)
            return _uncalled(t, started, TaskStatus.FAILED, ErrorClass.UNROUTABLE, msg, msg,
                             config, prompt_version)
        now = time.monotonic()
        last, count = self._unroutable_warned.get(name, (0.0, 0))
        count += 1
        if now - last >= UNROUTABLE_WARN_S:
            log.warning("this worker's config lacks endpoint '%s' named by task %s (and %d "
                        "more handed back since the last warning): handed back for %g s "
                        "for a worker that has it, attempt not spent; %s",
                        name, t.task_id, count - 1, UNROUTABLE_DELAY_MS / 1000, fix)
            last, count = now, 0
        self._unroutable_warned[name] = (last, count)
        self.stats.unroutable += 1
        self._unroutable_streak += 1
        return Finish(id=t.id, lease_token=t.lease_token, status=TaskStatus.PENDING,
                      error_class=str(ErrorClass.UNROUTABLE),
                      error_message=(f"waiting for a worker with endpoint '{name}': {why}; "
                                     f"{fix}")[:2000],
                      delay_ms=UNROUTABLE_DELAY_MS, release_attempt=True)

    async def _endpoint_seen(self, name: str, within_ms: int) -> bool:
        """Whether a worker with endpoint ``name`` in its config was alive in the last
        ``within_ms`` (its row's heartbeat; its config's endpoints are those its flow
        controller reports), looked up at most every ``ENDPOINT_SEEN_CACHE_S``."""
        now = time.monotonic()
        cached = self._endpoints_seen.get(name)
        if cached is not None and now - cached[0] < ENDPOINT_SEEN_CACHE_S:
            return cached[1]
        seen = await self._db_retry("reading the workers' endpoints",
                                    self.store.endpoint_configured, name, within_ms)
        self._endpoints_seen[name] = (now, seen)
        return seen

    async def _if_current(self, call: Callable[[Endpoint, Provider],
                                               Coroutine[Any, Any, AttemptResult]],
                          entry: Entry, version: str | None, task_id: str, ep: Endpoint,
                          provider: Provider) -> AttemptResult:
        """``call``, unless the reference ``entry`` names no longer resolves to
        ``version`` for task ``task_id`` (raises :class:`_VersionMoved` before anything
        is sent)."""
        try:
            _config, now = await self._prompts.resolve(
                entry, functools.partial(self._db_retry, "reading the prompt registry"),
                task_id)
        except LockgateError:  # gone meanwhile: the attempt starts again and says so
            raise _VersionMoved from None
        if now != version:
            raise _VersionMoved
        return await call(ep, provider)

    async def _detour(self, t: ClaimedTask, entry: Entry, config: TaskConfig,
                      version: str | None, prompt_key: str | None, started: int
                      ) -> Finish | tuple[TaskConfig, str | None, str | None] | None:
        """Where an open completeness circuit sends this attempt: None for its primary
        path (a fallback version that cannot be run included); a write-back when it is
        held for review; else the config and version to run and the endpoint to call
        instead."""
        detour = await self._circuits.detour(
            prompt_key, t.task_id, t.batch_id,
            functools.partial(self._db_retry, "reading the completeness circuits"))
        if detour is None:
            return None
        c = detour.circuit
        if c.fallback_kind == "review":
            return await self._hold_for_review(t, config, prompt_key, started,
                                               detour.reason)
        if c.fallback_prompt is None:
            return config, version, c.fallback_endpoint
        missing = self._missing_fallbacks.get(c.fallback_prompt)
        if missing is not None and time.monotonic() - missing < MISSING_FALLBACK_RECHECK_S:
            return None
        try:
            config, version = await self._prompts.resolve(
                self._fallback_entry(t, entry, config, c.fallback_prompt),
                functools.partial(self._db_retry, "reading the prompt registry"))
        except LockgateError as exc:
            # A fallback that names nothing must not fail the path's tasks: they take
            # the primary path, and the operator is told (again every recheck).
            now = time.monotonic()
            seen = self._missing_fallbacks.get(c.fallback_prompt)
            self._missing_fallbacks[c.fallback_prompt] = now
            if seen is not None and now - seen < MISSING_FALLBACK_RECHECK_S:
                return None  # calls that were already looking it up
            log.warning("completeness circuit '%s' is open but its fallback_prompt cannot "
                        "be run (%s); its tasks take the primary path. Create that "
                        "version, or fix [[quality.circuit]] fallback_prompt", c.prompt, exc)
            return None
        try:  # a task the fallback version cannot render (its input lacks the
            # version's placeholders) is not failed for the detour: it takes the primary
            await render_prompt(config, orjson.loads(t.input_data), size=len(t.input_data),
                                threads=self._render_threads)
        except LockgateError as exc:
            warned = (c.prompt, str(version))
            if warned not in self._unrenderable_warned:
                self._unrenderable_warned.add(warned)
                log.warning("completeness circuit '%s' is open but its fallback_prompt %s "
                            "cannot render some of its tasks (task %s: %s); those take "
                            "the primary path (said once per version)", c.prompt,
                            version, t.task_id, exc)
            return None
        return config, version, None

    def _fallback_entry(self, t: ClaimedTask, entry: Entry, config: TaskConfig,
                        version: str) -> RegistryRef:
        """The task run under a circuit's fallback version: a registry task keeps its own
        overrides (as on its primary path); an inline one takes the version's template,
        model config and delivery rule, with its own retry policy."""
        # The resolver caches merged configs by (this key, version number): the key names
        # the fallback's prompt, whose numbers are not the primary's.
        key = f"{t.config_hash}>{version}"
        if isinstance(entry, RegistryRef):
            return RegistryRef(parse_ref(version), entry.document, key)
        doc = {"prompt_template": f"@registry:{version}",
               "retry_policy": config.retry_policy.model_dump(mode="json")}
        return RegistryRef(parse_ref(version), doc, key)

    async def _hold_for_review(self, t: ClaimedTask, config: TaskConfig, prompt_key: str | None,
                         started: int, reason: str) -> Finish:
        """PENDING -> REVIEW without a call: the attempt row keeps the prompt a call would
        have sent (what the person resolving it reads, ``lockgate export --review``)."""
        snapshot = sha = fixes = None
        try:
            rendered = await render_prompt(config, orjson.loads(t.input_data),
                                           size=len(t.input_data),
                                           threads=self._render_threads)
            snapshot, sha = rendered.snapshot, rendered.sha256
            fixes = trace_fixes(rendered, None)
        except LockgateError as exc:  # the person sees why it could not be rendered
            reason = f"{reason}; the prompt does not render: {exc}"
        return Finish(id=t.id, lease_token=t.lease_token, status=TaskStatus.REVIEW,
                      error_message=reason[:2000],
                      attempt={"attempt": t.attempt, "outcome": "review",
                               "started_at": started, "prompt_version": prompt_key,
                               "prompt_snapshot": snapshot, "prompt_sha256": sha,
                               "fixes": fixes,
                               "error_message": reason[:2000]})

    def _fallback_params(self, route_key: str, config: TaskConfig,
                         ep: Endpoint) -> dict[str, Any]:
        key = (route_key, ep.name)
        params = self._fb_params.get(key)
        if params is None:
            params = self._fb_params[key] = provider_params(config, ep, self.id)
        return params
