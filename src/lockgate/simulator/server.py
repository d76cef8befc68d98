"""The HTTP server: OpenAI chat-completions protocol, fault injection and admin endpoints.

One :class:`Simulator` holds the live config, the responder, the rate limiter and the
stats; the handlers are its methods. They take a request and return a protocol-neutral
:class:`~lockgate.simulator.http.Reply`, so the same handlers serve the lean server of
:mod:`.http` (what ``lockgate simulate`` runs) and an aiohttp application
(:func:`build_app`, for embedding). The request path is kept lean (one orjson parse,
cached prompt parsing, one orjson dump) so that a single process answers several
thousand requests per second and is never what a benchmark measures.

Order of checks for ``POST /v1/chat/completions`` (documented in docs/simulator.md):
body -> model/messages -> API key -> model list -> quota -> context window -> rate
limits (admission) -> one random draw for faults -> latency -> answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from aiohttp import web
from pydantic import ValidationError

from lockgate.simulator.config import FAULT_RATES, Degradation, SimulatorConfig, config_error
from lockgate.simulator.degrade import Draws, broken_json, degraded_answer, latency_ms
from lockgate.simulator.hostile import SURROGATE_ESCAPED, SURROGATE_MARK, hostile_content
from lockgate.simulator.http import DROP, Handler, Reply, Request
from lockgate.simulator.prompt import PromptSpec
from lockgate.simulator.ratelimit import RateLimiter
from lockgate.simulator.responder import (
    Answer,
    Responder,
    chatty,
    cut_to_tokens,
    estimate_tokens,
    respond,
    truncate,
)
from lockgate.simulator.stats import Stats

log = logging.getLogger("lockgate.simulator")

MAX_BODY = 64 * 1024 * 1024
_OUTCOMES = {
    "rate_429": "injected_429",
    "rate_500": "error_500",
    "rate_503": "error_503",
    "rate_timeout": "timeout",
    "rate_broken_body": "broken_body",
    "rate_malformed": "malformed",
    "rate_chatty": "chatty",
}
_USABLE = frozenset({"ok", "chatty"})


def _error_body(message: str, type_: str, code: str | None, param: str | None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": param,
                                   "code": code}})


class Simulator:
    """The simulated provider: state plus the aiohttp handlers that act on it."""

    def __init__(self, config: SimulatorConfig | Mapping[str, Any] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``config`` may be a mapping of settings (checked as ``SimulatorConfig``
        checks them: pydantic's ValidationError names a bad one)."""
        if config is None:
            config = SimulatorConfig()
        elif not isinstance(config, SimulatorConfig):
            config = SimulatorConfig.model_validate(dict(config))
        self.config = config
        self.clock = clock  # the rate limiter's time (tests pass a clock they move)
        self.responder = Responder()
        self.limiter = RateLimiter()
        #: Requests being worked on (past the concurrency check), for max_in_flight.
        self._busy = 0
        self.stats = Stats()
        self.stopping = asyncio.Event()
        self._prefix = os.urandom(4).hex()
        self._counter = 0
        self._routes = self.routes()
        self._apply(self.config, reseed=True)

    # ------------------------------------------------------------------ configuration

    def _apply(self, config: SimulatorConfig, reseed: bool) -> None:
        self.config = config
        acc = 0.0
        faults: list[tuple[float, str]] = []
        for name in FAULT_RATES:
            rate = getattr(config, name)
            if rate > 0:
                acc += rate
                faults.append((acc, _OUTCOMES[name]))
        self._faults = tuple(faults)
        if reseed:
            seed = config.seed if config.seed is not None else int.from_bytes(os.urandom(8))
            # Separate streams: changing latency must not shift which requests fail.
            self._fault_rng = random.Random(seed)
            self._latency_rng = random.Random(seed ^ 0x5EED)

    def configure(self, patch: Mapping[str, Any]) -> SimulatorConfig:
        """Apply a partial config at once (raises pydantic's ValidationError if invalid)."""
        new = self.config.patched(patch)
        self._apply(new, reseed="seed" in patch)
        return new

    def reset(self) -> None:
        """Clear stats and rate windows, and restart the random streams from the seed."""
        self.stats.reset()
        self.limiter.reset()
        self._apply(self.config, reseed=True)

    # ------------------------------------------------------------------ helpers

    def _request_id(self) -> str:
        self._counter += 1
        return f"{self._prefix}{self._counter}"

    def _error(self, status: int, outcome: str, message: str, type_: str,
               code: str | None = None, param: str | None = None,
               headers: Mapping[str, str] | None = None) -> Reply:
        self.stats.finish(status, outcome)
        out = {"x-request-id": f"req_{self._request_id()}"}
        if headers:
            out.update(headers)
        return Reply(status, _error_body(message, type_, code, param), out)

    async def _sleep_latency(self, deg: Degradation | None = None) -> None:
        lat = self.config.latency
        if lat.mean_ms <= 0:
            ms = 0.0
        elif lat.kind == "fixed" or lat.sigma == 0:
            ms = lat.mean_ms
        else:
            ms = self._latency_rng.lognormvariate(lat.mu, lat.sigma)
        if deg is not None and deg.slows:
            ms = latency_ms(ms, deg)
            self.stats.degraded["slow"] += 1
        if ms > 0:
            await asyncio.sleep(ms / 1000.0)

    def _draw(self) -> str:
        if not self._faults:
            return "ok"
        u = self._fault_rng.random()
        for bound, outcome in self._faults:
            if u < bound:
                return outcome
        return "ok"

    async def _hang(self) -> Reply:
        """Never answer: hold the request for ``hang_s`` (or until shutdown), then drop the
        connection."""
        self.stats.by_outcome["timeout"] += 1
        self.stats.hanging += 1
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), self.config.hang_s)
        finally:
            self.stats.hanging -= 1
        return DROP

    # ------------------------------------------------------------------ handlers

    async def chat(self, request: Request) -> Reply:
        """``POST /v1/chat/completions``."""
        headers = request.headers
        auth = headers.get("Authorization", "")
        api_key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        idem = headers.get("Idempotency-Key")
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        model = body.get("model") if isinstance(body, dict) else None
        if not isinstance(model, str):
            model = ""
        stats = self.stats
        stats.begin(api_key, model or "(none)", idem)
        stats.in_flight += 1
        try:
            cap = self.config.max_in_flight
            if cap is None:
                return await self._complete(body, api_key, model, idem)
            if self._busy >= cap:
                return self._too_many(cap)
            self._busy += 1
            try:
                return await self._complete(body, api_key, model, idem)
            finally:
                self._busy -= 1
        finally:
            stats.in_flight -= 1

    def _too_many(self, cap: int) -> Reply:
        """A request beyond ``max_in_flight``: a 429 naming no limit (only the retry
        hint, as ``retry_hint`` says)."""
        cfg = self.config
        out: dict[str, str] = {}
        hint = "none" if cfg.header_style == "none" else cfg.retry_hint
        if hint == "both":
            out["retry-after-ms"] = str(cfg.retry_after_ms)
        if hint != "none":
            out["retry-after"] = str(math.ceil(cfg.retry_after_ms / 1000.0))
        self.stats.limited_by["concurrency"] += 1
        return self._error(429, "rate_limited", f"Too many concurrent requests: at most "
                           f"{cap} at once. Please try again later.", "requests",
                           "rate_limit_exceeded", None, out)

    async def _complete(self, body: Any, api_key: str, model: str,
                        idem: str | None) -> Reply:
        cfg = self.config
        checked = self._check_request(body, api_key, model)
        if isinstance(checked, Reply):
            return checked
        messages = checked
        if cfg.quota_exhausted:
            return self._error(
                429, "quota", "You exceeded your current quota, please check your plan and "
                "billing details.", "insufficient_quota", "insufficient_quota")
        spec, text, prompt_tokens = self.responder.prepare(messages)
        if cfg.context_window is not None and prompt_tokens > cfg.context_window:
            return self._error(
                400, "context_length", f"This model's maximum context length is "
                f"{cfg.context_window} tokens. However, your messages resulted in "
                f"{prompt_tokens} tokens. Please reduce the length of the messages.",
                "invalid_request_error", "context_length_exceeded", "messages")
        fmt = body.get("response_format")
        json_mode = isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema")
        deg, draws = self._degradation(model, messages)
        answer = self._answer(spec, text, prompt_tokens, model, json_mode, deg, draws)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            max_tokens = None
        rate_headers: dict[str, str] = {}
        if cfg.rpm is not None or cfg.tpm is not None:
            charge = prompt_tokens + (max_tokens or answer.completion_tokens)
            decision = self.limiter.admit(api_key, charge, self.clock(), cfg.rpm, cfg.tpm,
                                          cfg.window_s, cfg.enforce_s, cfg.header_style)
            rate_headers = decision.headers
            if not decision.admitted:
                return self._rate_limited(decision.limited_by, decision.wait_s,
                                          decision.too_large, charge, rate_headers,
                                          per_s=decision.per_s, limit=decision.limit)
        outcome = self._draw()
        if outcome == "injected_429":
            return self._rate_limited("requests", cfg.retry_after_ms / 1000.0, False, 0,
                                      rate_headers, injected=True)
        if outcome == "timeout":
            return await self._hang()
        await self._sleep_latency(deg)
        if outcome == "error_500":
            return self._error(500, outcome, "The server had an error while processing your "
                               "request. Sorry about that!", "server_error",
                               headers=rate_headers)
        if outcome == "error_503":
            return self._error(503, outcome, "The engine is currently overloaded, please try "
                               "again later.", "server_error", headers=rate_headers)
        content = answer.content
        completion_tokens = answer.completion_tokens
        finish = "stop"
        if max_tokens is not None and completion_tokens > max_tokens:
            content = cut_to_tokens(content, completion_tokens, max_tokens)
            finish = "length"
        if self._broken(deg, draws, outcome):
            outcome = "broken_json"
        content = self._faulty(outcome, content, answer.is_json, draws)
        content = hostile_content(text, content) if cfg.hostile else content
        if content is not answer.content:
            completion_tokens = estimate_tokens(content)
        return self._success(model, content, finish, prompt_tokens, completion_tokens,
                             outcome, idem, rate_headers,
                             usable=outcome in _USABLE and (finish == "stop" or
                                                           not answer.is_json))

    def _degradation(self, model: str, messages: list[dict[str, Any]]
                     ) -> tuple[Degradation | None, Draws | None]:
        """The degradation switches of the model, and the request's stable draws."""
        deg = self.config.degradation(model)
        if deg is None:
            return None, None
        return deg, Draws(self.config.seed, model, messages)

    def _answer(self, spec: PromptSpec, text: str, prompt_tokens: int, model: str,
                json_mode: bool, deg: Degradation | None, draws: Draws | None) -> Answer:
        """The model's answer, with the content switches of its degradation applied."""
        noise = self.config.noise_for(model)
        if (deg is None or draws is None or not spec.wants_json
                or (deg.drop_fields <= 0 and deg.drift is None)):
            return respond(spec, text, prompt_tokens, noise, json_mode)
        answer, hit = degraded_answer(spec, text, prompt_tokens, noise, deg, draws)
        for switch in hit:
            self.stats.degraded[switch] += 1
        return answer

    @staticmethod
    def _faulty(outcome: str, content: str, is_json: bool, draws: Draws | None) -> str:
        """The content an outcome that changes it gives (the content itself otherwise)."""
        if outcome == "malformed":
            return truncate(content)
        if outcome == "chatty":
            return chatty(content, is_json)
        if outcome == "broken_json" and draws is not None:
            return broken_json(draws)
        return content

    def _broken(self, deg: Degradation | None, draws: Draws | None, outcome: str) -> bool:
        """Whether this (otherwise usable) answer is replaced by broken JSON (counted when
        it is)."""
        if (deg is None or draws is None or deg.broken_json <= 0 or outcome not in _USABLE
                or draws.u("broken_json") >= deg.broken_json):
            return False
        self.stats.degraded["broken_json"] += 1
        return True

    def _check_request(self, body: Any, api_key: str,
                       model: str) -> list[dict[str, Any]] | Reply:
        """The messages of a well-formed request, or the 4xx error to send."""
        if not isinstance(body, dict):
            return self._error(400, "bad_request", "We could not parse the JSON body of your "
                               "request. The body must be a JSON object.",
                               "invalid_request_error")
        messages = body.get("messages")
        if (not isinstance(messages, list) or not messages
                or not all(isinstance(m, dict) for m in messages)):
            return self._error(400, "bad_request", "'messages' must be a non-empty array of "
                               "message objects.", "invalid_request_error", None, "messages")
        if not model:
            return self._error(400, "bad_request", "You must provide a model parameter.",
                               "invalid_request_error", None, "model")
        if self.config.require_api_key and not api_key:
            return self._error(401, "unauthorized", "You didn't provide an API key. Send it "
                               "as 'Authorization: Bearer KEY'.", "invalid_request_error",
                               "invalid_api_key")
        if self.config.strict_models and model not in self.config.models:
            return self._error(404, "model_not_found", f"The model '{model}' does not exist.",
                               "invalid_request_error", "model_not_found", "model")
        if body.get("stream"):
            return self._error(400, "bad_request", "Streaming is not supported by the "
                               "simulator; send stream=false.", "invalid_request_error",
                               None, "stream")
        return messages

    def _rate_limited(self, limited_by: str, wait_s: float, too_large: bool, charge: int,
                      headers: dict[str, str], injected: bool = False, per_s: float = 0.0,
                      limit: int = 0) -> Reply:
        cfg = self.config
        out = dict(headers) if cfg.limit_headers_on_429 else {}
        per_s = per_s or cfg.window_s
        if too_large:
            message = (f"Request too large: it needs {charge} tokens, more than the limit of "
                       f"{limit or cfg.tpm} tokens per {per_s:g}s; it can never be admitted.")
        else:
            ms = max(1, math.ceil(wait_s * 1000.0))
            hint = "none" if cfg.header_style == "none" else cfg.retry_hint
            if hint == "both":
                out["retry-after-ms"] = str(ms)
            if hint != "none":
                out["retry-after"] = str(math.ceil(ms / 1000.0))
            if injected:
                message = "Rate limit reached (simulated). Please try again later."
            else:
                self.stats.limited_by[limited_by] += 1
                message = (f"Rate limit reached for {limited_by} per {per_s:g}s: "
                           f"limit {limit}. Please try again in {ms}ms.")
        return self._error(429, "injected_429" if injected else "rate_limited", message,
                           limited_by, "rate_limit_exceeded", None, out)

    def _success(self, model: str, content: str, finish: str, prompt_tokens: int,
                 completion_tokens: int, outcome: str, idem: str | None,
                 rate_headers: dict[str, str], usable: bool) -> Reply:
        rid = self._request_id()
        doc = {
            "id": f"chatcmpl-{rid}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "logprobs": None,
                "finish_reason": finish,
            }],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
            "system_fingerprint": "fp_lockgate_sim",
        }
        if self.config.omit_usage:
            del doc["usage"]
        body = orjson.dumps(doc)
        if SURROGATE_MARK in content:
            body = body.replace(SURROGATE_ESCAPED, b"\\ud800")
        if outcome == "broken_body":
            body = body[: len(body) // 2]
        stats = self.stats
        stats.finish(200, outcome)
        stats.tokens(prompt_tokens, completion_tokens)
        if usable:
            stats.success(idem)
        rate_headers["x-request-id"] = f"req_{rid}"
        return Reply(200, body, rate_headers)

    async def models(self, request: Request) -> Reply:
        """``GET /v1/models``."""
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "lockgate-simulator"}
                for m in self.config.models]
        return Reply(200, orjson.dumps({"object": "list", "data": data}))

    async def not_found(self, request: Request) -> Reply:
        """Any other path: OpenAI-style 404 JSON rather than a text page."""
        return Reply(404, _error_body(f"Unknown request URL: {request.method} {request.path}.",
                                      "invalid_request_error", "unknown_url", None))

    # ------------------------------------------------------------------ admin

    async def get_stats(self, request: Request) -> Reply:
        """``GET /_sim/stats[?detail=1]``."""
        detail = request.query.get("detail", "0").lower() in ("1", "true", "yes")
        return Reply(200, orjson.dumps(self.stats.snapshot(detail)))

    async def get_config(self, request: Request) -> Reply:
        """``GET /_sim/config``."""
        return Reply(200, self.config.to_json())

    async def post_config(self, request: Request) -> Reply:
        """``POST /_sim/config``: partial update, applied to the next request."""
        try:
            patch = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return Reply(400, _error_body(f"body is not JSON: {exc}", "invalid_request_error",
                                          None, None))
        if not isinstance(patch, dict):
            return Reply(400, _error_body("body must be a JSON object of config fields",
                                          "invalid_request_error", None, None))
        try:
            new = self.configure(patch)
        except ValidationError as exc:
            return Reply(400, _error_body(config_error(exc), "invalid_request_error",
                                          "invalid_config", None))
        log.info("config updated: %s", sorted(patch))
        return Reply(200, new.to_json())

    async def post_reset(self, request: Request) -> Reply:
        """``POST /_sim/reset``."""
        self.reset()
        return Reply(200, b'{"ok":true}')

    async def health(self, request: Request) -> Reply:
        """``GET /_sim/health``."""
        return Reply(200, orjson.dumps({"ok": True, "requests": self.stats.requests}))

    # ------------------------------------------------------------------ routing

    def routes(self) -> dict[tuple[str, str], Handler]:
        """(method, path) -> handler; the same table serves both server flavours."""
        return {
            ("POST", "/v1/chat/completions"): self.chat,
            ("POST", "/chat/completions"): self.chat,
            ("GET", "/v1/models"): self.models,
            ("GET", "/models"): self.models,
            ("GET", "/_sim/stats"): self.get_stats,
            ("GET", "/_sim/config"): self.get_config,
            ("POST", "/_sim/config"): self.post_config,
            ("POST", "/_sim/reset"): self.post_reset,
            ("GET", "/_sim/health"): self.health,
        }

    async def dispatch(self, request: Request) -> Reply:
        """The entry point of the lean server: one dict lookup instead of a router."""
        handler = self._routes.get((request.method, request.path), self.not_found)
        return await handler(request)


def _for_aiohttp(handler: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """An aiohttp handler around a simulator handler (aiohttp's request offers the same
    attributes as :class:`~lockgate.simulator.http.Request`)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        reply = await handler(request)  # type: ignore[arg-type]
        if reply is DROP:
            if request.transport is not None:
                request.transport.close()
            raise web.HTTPServiceUnavailable  # never delivered: the connection is gone
        return web.Response(status=reply.status, body=reply.body,
                            content_type=reply.content_type, headers=reply.headers)

    return handle


def build_app(sim: Simulator) -> web.Application:
    """An aiohttp Application serving ``sim``, for embedding into other aiohttp apps.

    :func:`~lockgate.simulator.runner.start` does not use it: it serves
    :meth:`Simulator.dispatch` on the lean server of :mod:`lockgate.simulator.http`,
    which costs a fraction of aiohttp's request machinery.
    """
    app = web.Application(client_max_size=MAX_BODY)
    for (method, path), handler in sim.routes().items():
        app.router.add_route(method, path, _for_aiohttp(handler))
    app.router.add_route("*", "/{tail:.*}", _for_aiohttp(sim.not_found))

    async def _on_shutdown(_app: web.Application) -> None:
        sim.stopping.set()

    app.on_shutdown.append(_on_shutdown)
    return app
