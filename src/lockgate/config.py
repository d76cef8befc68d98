"""Configuration: provider endpoints and worker settings, from a TOML file and the
environment. API keys are never stored: an endpoint names the environment variable
that holds its key.

Example ``lockgate.toml``::

    default_endpoint = "openai"

    [[endpoint]]
    name = "openai"
    base_url = "https://api.openai.com/v1"
    api_key_env = "OPENAI_API_KEY"
    models = ["gpt-4o-mini"]
    rpm = 10000                 # shared by every worker (docs/flow.md)
    tpm = 2000000
    fallback = "local"          # takes over on insufficient_quota or an open breaker

    [[endpoint]]
    name = "local"
    base_url = "http://127.0.0.1:11434/v1"   # Ollama
    supports_top_k = true

    [worker]
    concurrency = 256
"""

from __future__ import annotations

import codecs
import difflib
import functools
import json
import os
import re
import tomllib
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from lockgate.durations import EXAMPLES, duration_field, format_duration
from lockgate.errors import ConfigError, SpecError, not_utf8
from lockgate.redact import redact_url
from lockgate.spec import ModelConfig, load_config

DEFAULT_BASE_URL = "http://127.0.0.1:8400/v1"

#: A setting in seconds: a number, or a duration such as "1m30s" (lockgate.durations).
Seconds = Annotated[float, BeforeValidator(duration_field)]

_URL_FORM = "write http://HOST[:PORT]/PATH or https://HOST/PATH, e.g. https://api.openai.com/v1"


def http_url_problem(url: str) -> str | None:
    """What keeps ``url`` from being an endpoint's base URL (an http:// or https:// URL
    with a host and a valid port), or None. Any other scheme would be retried as a
    connection error for up to ``[flow] endpoint_down_max_s``."""
    from urllib.parse import urlsplit  # deferred: start-up time

    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or parts.port > 0
    except ValueError:  # an unbalanced [ or a port that is not a number below 65536
        parts, port_ok = urlsplit(url.split("[", 1)[0]), False
    if parts.scheme.lower() not in ("http", "https"):
        return f"'{redact_url(url)}' is not an HTTP URL; {_URL_FORM}"
    if not parts.hostname:
        return f"'{redact_url(url)}' names no host; {_URL_FORM}"
    if not port_ok:
        return f"'{redact_url(url)}' has an invalid port (1-65535); {_URL_FORM}"
    return None


def _http_url(value: Any) -> Any:
    """A pydantic ``BeforeValidator`` for ``base_url`` (text only: pydantic refuses the
    rest)."""
    problem = http_url_problem(value) if isinstance(value, str) else None
    if problem is not None:
        raise ValueError(problem)
    return value


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: An HTTP header's name (RFC 9110's token).
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}")


#: What HTTP forbids in a header's value (RFC 9110: control characters but the tab): a
#: line break left at the end of a key by an env file with Windows line ends, a NUL.
_FORBIDDEN_IN_HEADER = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_CONTROL_CHARACTER = "a line break or another control character"


def _header_name(value: Any) -> Any:
    """A pydantic ``BeforeValidator`` for ``api_key_header``. The value refused is not
    shown: it is often the key itself, or ``api-key: KEY``."""
    if isinstance(value, str) and _HEADER_NAME.fullmatch(value) is None:
        raise PydanticCustomError(
            "header_name", "the value given is not an HTTP header name (letters, digits "
            "and - or _, at most 100, without spaces or a colon; it is not shown, in "
            "case it holds the key): name the header only, e.g. api-key, and keep the "
            "key in the variable api_key_env names")
    return value


def _header_values(value: Any) -> Any:
    """A pydantic ``BeforeValidator`` for an endpoint's ``headers``: a name or value
    holding a line break or another control character would fail every call (the HTTP
    clients refuse it, and pyreqwest's error shows the value). Neither is shown."""
    if not isinstance(value, dict):
        return value
    for name, text in value.items():
        if isinstance(name, str) and _FORBIDDEN_IN_HEADER.search(name):
            raise PydanticCustomError(
                "header_value", f"a header name in headers holds {_CONTROL_CHARACTER} "
                "(it is not shown); remove it")
        if isinstance(text, str) and _FORBIDDEN_IN_HEADER.search(text):
            raise PydanticCustomError(
                "header_value", "the value of header {name} holds "
                f"{_CONTROL_CHARACTER}; remove it (the value is not shown, in case it is "
                "a secret)", {"name": repr(name)})
    return value


def env_name_problem(name: str, setting: str = "api_key_env",
                     example: str = "OPENAI_API_KEY", holds: str = "key") -> str | None:
    """Why ``name`` cannot be an environment variable's name (a key pasted in its place:
    the message never shows it), or None."""
    if _ENV_NAME.fullmatch(name):
        return None
    return (f"{setting} names the environment variable holding the {holds} (e.g. "
            f"{example}), not the {holds} itself; the value given is not a variable name "
            "(letters, digits and _; it is not shown, in case it is a secret)")


def _env_name(value: Any, info: ValidationInfo) -> Any:
    """A pydantic ``BeforeValidator`` for ``api_key_env`` and ``secret_env``."""
    if not isinstance(value, str) or not value:
        return value
    problem = (env_name_problem(value, "secret_env", "WEBHOOK_SECRET", "secret")
               if info.field_name == "secret_env" else env_name_problem(value))
    if problem is not None:
        raise PydanticCustomError("env_name", problem)
    return value


def _number_type(annotation: Any) -> bool:
    """Whether a field's type takes only numbers (``int``, ``float``, optional or not;
    ``bool`` is none). A duration (``Seconds``) is left out: :func:`duration_field`
    refuses ``true`` and ``false`` in its own words."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        inner, *metadata = typing.get_args(annotation)
        return (not any(getattr(m, "func", None) is duration_field for m in metadata)
                and _number_type(inner))
    if origin is typing.Union or origin is types.UnionType:
        kinds = [a for a in typing.get_args(annotation) if a is not type(None)]
        return bool(kinds) and all(_number_type(a) for a in kinds)
    return annotation is int or annotation is float


@functools.cache
def _number_fields(model: type[BaseModel]) -> dict[str, str]:
    """The numeric settings of ``model`` (not durations), each with an example value
    for the message refusing a boolean: its default, else 600 within its bounds."""
    found: dict[str, str] = {}
    for name, fld in model.model_fields.items():
        if (not _number_type(fld.annotation)
                or any(getattr(m, "func", None) is duration_field for m in fld.metadata)):
            continue
        example: float = 600
        if isinstance(fld.default, int | float) and not isinstance(fld.default, bool):
            example = fld.default
        else:
            for m in fld.metadata:
                for key, pick in (("le", min), ("lt", min), ("ge", max), ("gt", max)):
                    bound = getattr(m, key, None)
                    if isinstance(bound, int | float):
                        example = pick(example, bound)
        found[name] = repr(example) if isinstance(example, int) else f"{example:g}"
    return found


def _same_name(names: list[str], table: str) -> str | None:
    """The first name given to two tables or more of ``names`` (an array of ``table``),
    with their places ("the 1st and the 3rd [[endpoint]] are both named 'a'"), or None
    when every name is its own."""
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is None:
        return None
    places = [f"the {_ordinal(i + 1)}" for i, n in enumerate(names) if n == twice]
    return (f"{', '.join(places[:-1])} and {places[-1]} {table} are "
            f"{'both' if len(places) == 2 else 'all'} named '{twice}'")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="before")
    @classmethod
    def _not_a_boolean(cls, value: Any, info: ValidationInfo) -> Any:
        """Refuse ``true``/``false`` for a numeric setting: pydantic's lax mode takes
        them for 1 and 0 (``rpm = true`` would be one request a minute). Lax mode stays
        for the rest: ``rpm = "600"`` and an int for a float are still taken."""
        if isinstance(value, bool) and info.field_name is not None:
            example = _number_fields(cls).get(info.field_name)
            if example is not None:
                raise PydanticCustomError(
                    "not_a_number", "{value} is not a number: write a number ({example})",
                    {"value": str(value).lower(),
                     "example": f"{info.field_name} = {example}"})
        return value


class Endpoint(_Strict):
    """One OpenAI-compatible endpoint and its limits."""

    name: str = Field(min_length=1, max_length=100)
    base_url: Annotated[str, BeforeValidator(_http_url)]
    api_key_env: Annotated[str | None, BeforeValidator(_env_name)] = None
    api_key_header: Annotated[str | None, BeforeValidator(_header_name)] = Field(
        None, description="the header that carries the key of api_key_env, as it is "
                    "[Authorization: Bearer KEY]; e.g. api-key for an Azure OpenAI "
                    "deployment")
    model: str | None = Field(None, description="model name sent instead of the task's")
    models: tuple[str, ...] = Field((), description="task model names routed here")
    timeout_s: Seconds | None = Field(None, gt=0,
                                    validation_alias=AliasChoices("timeout_s", "timeout"))
    max_concurrency: int = Field(1000, ge=1)
    supports_top_k: bool = False
    send_idempotency_key: bool = True
    headers: Annotated[dict[str, str], BeforeValidator(_header_values)] = Field(
        default_factory=dict)
    provider: str | None = Field(
        None, min_length=1, max_length=100,
        description="gen_ai.provider.name in traces [the service of base_url's host, as "
                    "the GenAI conventions name it (azure.ai.openai, anthropic, ...), "
                    "else openai]")
    # -- flow control (docs/flow.md) --
    pool: str = Field("default", min_length=1, max_length=100,
                      description="worker pool that serves tasks routed here")
    rpm: int | None = Field(None, ge=1, description="requests per limit window, all workers")
    tpm: int | None = Field(None, ge=1, description="tokens per limit window, all workers")
    limit_window_s: Seconds = Field(60.0, gt=0, le=86_400,
                                    description="the provider's window")
    limit_enforced_s: Seconds = Field(
        1.0, gt=0, le=86_400,
        description="the shortest period the provider may enforce its limits over, "
                    "scaled (OpenAI: 1 s); the bucket paces at it")
    tpm_counts_max_tokens: bool = Field(
        False, description="the provider charges max_tokens (not the answer) at admission")
    min_concurrency: int = Field(1, ge=1)
    initial_concurrency: int | None = Field(None, ge=1, description="[max_concurrency]")
    concurrency_policy: Literal["rule", "gradient", "fixed"] = "rule"
    fallback: str | None = Field(None, description="endpoint that takes over its tasks")
    cost_input_per_1k: float = Field(0.0, ge=0, description="price per 1k input tokens")
    cost_output_per_1k: float = Field(0.0, ge=0, description="price per 1k output tokens")

    @model_validator(mode="after")
    def _check_flow(self) -> Endpoint:
        if self.api_key_header is not None:
            if not self.api_key_env:
                raise ValueError(
                    f"api_key_header = {self.api_key_header!r} names the header of the key "
                    "read from api_key_env, which is not set: add api_key_env = "
                    '"YOUR_KEY_VARIABLE" (the key itself stays in the environment)')
            if any(k.lower() == self.api_key_header.lower() for k in self.headers):
                raise ValueError(
                    f"the header {self.api_key_header!r} is both api_key_header and in "
                    "headers: a request carries it once. Keep api_key_header (its value "
                    "comes from api_key_env) and remove it from headers")
        if self.min_concurrency > self.max_concurrency:
            raise ValueError(f"min_concurrency {self.min_concurrency} is above "
                             f"max_concurrency {self.max_concurrency}")
        if self.fallback == self.name:
            raise ValueError("an endpoint cannot be its own fallback")
        return self

    @property
    def limited(self) -> bool:
        """Whether calls need budget from the shared bucket."""
        return self.rpm is not None or self.tpm is not None

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        """What a call with this usage costs at the configured prices."""
        return (input_tokens * self.cost_input_per_1k
                + output_tokens * self.cost_output_per_1k) / 1000.0

    def api_key(self) -> str | None:
        """The key from the environment variable this endpoint names."""
        if not self.api_key_env:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            state = "is not set" if key is None else "is set but empty"
            raise ConfigError(
                f"endpoint '{self.name}' reads its API key from ${self.api_key_env}, "
                f"which {state}; export {self.api_key_env}=... before starting")
        if _FORBIDDEN_IN_HEADER.search(key):
            # Sent, it would fail every call (and pyreqwest's error shows the key); a
            # key is never changed silently: spaces around it are sent as they are.
            raise ConfigError(
                f"endpoint '{self.name}': ${self.api_key_env} holds {_CONTROL_CHARACTER} "
                "(often left at the end by an env file with Windows line ends); remove "
                "it (the key is not shown)")
        return key


class WorkerSettings(_Strict):
    """How a worker process runs. Every field can be set in ``[worker]`` or by flag."""

    concurrency: int = Field(512, ge=1, le=100_000, description="calls in flight")
    claim_batch: int = Field(256, ge=1, le=5000, description="rows per claim")
    prefetch: int | None = Field(
        None, ge=0, le=100_000,
        description="claimed tasks kept ready to start the moment a call ends, beyond "
                    "the calls in flight [min(claim_batch, concurrency // 4)]")
    lease_s: Seconds = Field(60.0, ge=1.0, le=86_400.0,
                             description="lease length; renewed at 1/3 (a crashed worker's "
                                         "tasks come back after it)")
    flush_interval_s: Seconds = Field(0.02, gt=0, description="write-behind flush period")
    flush_rows: int = Field(500, ge=1, le=5000, description="write-behind batch size")
    poll_max_s: Seconds = Field(1.0, gt=0, description="longest sleep on an empty queue")
    heartbeat_s: Seconds = Field(5.0, gt=0)
    shutdown_grace_s: Seconds = Field(30.0, ge=0,
                                      description="time to finish in-flight calls")
    unroutable_after_s: Seconds = Field(
        600.0, ge=0, le=31_536_000,
        description="a task whose model_config.endpoint is in no worker's config fails "
                    "(unroutable) once it has waited this long since its submit while no "
                    "worker with that endpoint ran; until then workers without it hand it "
                    "back uncalled")
    store_snapshots: bool = Field(True, description="keep the rendered prompt per attempt")
    pool: str | None = Field(None, min_length=1, max_length=100,
                             description="serve only this pool [all pools]")
    gc_threshold: int | None = Field(
        None, ge=0, le=100_000_000,
        description="the garbage collector's young-generation threshold while the worker "
                    "runs [max(50000, 50 x concurrency)]; 0 keeps the interpreter's")
    http_client: Literal["aiohttp", "pyreqwest"] = Field(
        "aiohttp", description="HTTP client of the calls: pyreqwest (the fast-http extra) "
                               "spends less CPU per call")

    def with_changes(self, **changes: Any) -> WorkerSettings:
        """These settings with ``changes`` (command-line flags, API overrides), checked
        as strictly as the config file: :class:`SpecError` names the setting."""
        try:
            return WorkerSettings.model_validate({**self.model_dump(), **changes})
        except ValidationError as exc:
            e = exc.errors()[0]
            raise SpecError(explain(WorkerSettings, e),
                            field=str(e["loc"][0]) if e["loc"] else None) from None


class FlowSettings(_Strict):
    """Flow control (``[flow]``): shared budgets, pauses, adaptive concurrency, circuit
    breakers, fair share and windows. docs/flow.md explains each knob."""

    lease_interval_s: Seconds = Field(0.1, gt=0, le=5,
                                      description="period of budget grants (shared buckets)")
    headroom: float = Field(0.02, ge=0, lt=1, description="share of a limit left unused")
    burst: float = Field(0.01, gt=0, lt=1,
                         description="bucket size, share of a limit's enforcement period")
    backlog_s: Seconds = Field(0.5, gt=0, description="calls claimed ahead of budget")
    min_backlog: int = Field(16, ge=1)
    adjust_interval_s: Seconds = Field(1.0, gt=0, description="concurrency decision period")
    min_samples: int = Field(20, ge=1, description="calls per concurrency decision")
    latency_overhead_tokens: float = Field(20.0, ge=0,
                                           description="gradient policy: fixed cost in tokens")
    default_pause_s: Seconds = Field(1.0, gt=0, description="after a 429 without headers")
    quota_pause_s: Seconds = Field(30.0, gt=0, description="after insufficient_quota")
    fallback_after_s: Seconds = Field(2.0, ge=0,
                                    description="a longer pause sends tasks to the fallback")
    breaker_failure_rate: float = Field(0.5, gt=0, le=1)
    breaker_min_calls: int = Field(20, ge=1)
    breaker_consecutive: int = Field(10, ge=1)
    breaker_window_s: Seconds = Field(10.0, gt=0)
    breaker_open_s: Seconds = Field(5.0, gt=0)
    breaker_max_open_s: Seconds = Field(60.0, gt=0)
    breaker_probes: int = Field(3, ge=1)
    endpoint_down_max_s: Seconds = Field(
        3600.0, gt=0, description="connection errors stop sparing a task's attempts once "
                                  "its endpoint has been failing this long")
    fair_share: bool = Field(True, description="share claims among batches by weight")
    lanes_refresh_s: Seconds = Field(1.0, gt=0, description="batch (lane) discovery period")
    failure_window_s: Seconds = Field(3600.0, gt=0, description="failure rate look-back")
    urgency_horizon_s: Seconds = Field(3600.0, gt=0, description="deadline urgency starts")
    max_urgency: float = Field(9.0, ge=0)
    pace_every_s: Seconds = Field(2.0, gt=0, description="window pace recomputation")
    report_s: Seconds = Field(2.0, gt=0, description="worker row metrics period")

    @property
    def min_cap_ms(self) -> float:
        """A shared bucket holds at least two lease intervals of refill, so refills
        between two leases are never lost (:class:`lockgate.flow.bucket.Limits`)."""
        return 2000.0 * self.lease_interval_s


class GateSettings(_Strict):
    """The release gate's roles inside workers (``[gate]``), and how fast workers see a
    prompt's new live version (within 5 seconds)."""

    enabled: bool = Field(True, description="run the gate's roles in `lockgate worker`")
    page: int = Field(500, ge=1, le=5000, description="items per materialise/finalise step")
    poll_s: Seconds = Field(0.2, gt=0, description="pause between role passes while busy")
    idle_max_s: Seconds = Field(2.0, gt=0, description="longest pause when there is no work")
    lease_s: Seconds | None = Field(None, ge=1.0, description="role leases [worker lease_s]")
    refresh_s: Seconds = Field(1.0, gt=0, le=5.0,
                             description="re-check of a registry reference's live version")


class RuntimeSettings(_Strict):
    """The prompt runtime (``[runtime]``)."""

    model_modules: tuple[str, ...] = Field(
        (), description="modules (or packages) whose pydantic models a task's "
                        "delivery_rule.pydantic_model may name: workers import them")


class Webhook(_Strict):
    """Where alert events are posted (``[[quality.webhook]]``, docs/quality.md): a JSON
    body signed with HMAC-SHA256 of ``secret`` (or of the environment variable
    ``secret_env`` names), retried with back-off on 5xx, 408, 429 and connection errors."""

    name: str | None = Field(None, min_length=1, max_length=100,
                             description="its name in the outbox [the URL's host]")
    url: Annotated[str, BeforeValidator(_http_url)]
    secret: str | None = Field(None, min_length=1, description="HMAC key of the signature")
    secret_env: Annotated[str | None, BeforeValidator(_env_name)] = Field(
        None, min_length=1, description="environment variable holding the key")
    timeout_s: Seconds = Field(10.0, gt=0, le=300, description="one delivery's timeout")
    max_attempts: int = Field(12, ge=1, le=100, description="attempts before FAILED")
    backoff_s: Seconds = Field(2.0, gt=0, le=3600,
                               description="first retry's delay, doubled each time")
    backoff_max_s: Seconds = Field(3600.0, gt=0, description="longest delay of a retry")

    @model_validator(mode="after")
    def _one_secret(self) -> Webhook:
        if self.secret is not None and self.secret_env is not None:
            raise ValueError("give either secret or secret_env, not both")
        return self

    @property
    def target(self) -> str:
        """The name deliveries are filed under (never holds credentials of the URL)."""
        if self.name:
            return self.name
        rest = self.url.split("://", 1)[1]
        return rest.split("/", 1)[0].rpartition("@")[2][:100]

    def key(self) -> bytes | None:
        """The signing key: ``secret``, or the variable ``secret_env`` names."""
        if self.secret_env is not None:
            value = os.environ.get(self.secret_env)
            if not value:
                raise ConfigError(
                    f"webhook '{self.target}' reads its secret from ${self.secret_env}, "
                    f"which is not set; export {self.secret_env}=... before starting")
            return value.encode()
        return None if self.secret is None else self.secret.encode()
class CircuitSettings(_Strict):
    """One completeness circuit (``[[quality.circuit]]``, docs/quality.md): when the
    field completeness of ``prompt`` stays under ``threshold`` in every minute of
    ``window`` (each with ``min_calls`` calls), its new tasks go to exactly one fallback,
    a share ``probe_share`` still probing the primary; ``probation`` after the probes
    are back over the threshold, the circuit closes."""

    prompt: str = Field(min_length=1, max_length=191,
                        description="a registry name (every version), name@N or inline:<hex>")
    threshold: float = Field(0.98, gt=0, le=1, description="completeness a minute needs")
    window: Seconds = Field(300.0, ge=60.0, le=6 * 3600.0,
                            description="minutes under the threshold that open it")
    min_calls: int = Field(20, ge=1, description="calls a minute needs to count")
    probation: Seconds = Field(600.0, ge=60.0, le=7 * 86_400.0,
                               description="time of good probes that closes it")
    probe_share: float = Field(0.05, ge=0, le=1,
                               description="share of tasks still sent to the primary")
    fallback_prompt: str | None = Field(None, description="a pinned version, name@N")
    fallback_endpoint: str | None = Field(None, description="an endpoint's name")
    fallback: Literal["review"] | None = Field(
        None, description="'review': hold the tasks for a person (REVIEW)")

    @model_validator(mode="after")
    def _one_fallback(self) -> CircuitSettings:
        given = [k for k in ("fallback_prompt", "fallback_endpoint", "fallback")
                 if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"circuit '{self.prompt}' needs exactly one of fallback_prompt, "
                             f"fallback_endpoint or fallback = \"review\" (got "
                             f"{', '.join(given) or 'none'})")
        fp = self.fallback_prompt
        if fp is not None:
            name, sep, number = fp.rpartition("@")
            if not sep or not name or not number.isdigit():
                raise ValueError(f"circuit '{self.prompt}': fallback_prompt must be a pinned "
                                 f"registry version, name@N (got '{fp}')")
            if fp == self.prompt:
                raise ValueError(f"circuit '{self.prompt}' cannot fall back to itself")
        return self

    @property
    def window_minutes(self) -> int:
        """The whole minutes of the window (at least one)."""
        return max(1, int(self.window // 60))

    @property
    def fallback_kind(self) -> str:
        """``prompt``, ``endpoint`` or ``review``."""
        if self.fallback_prompt is not None:
            return "prompt"
        return "endpoint" if self.fallback_endpoint is not None else "review"

    @property
    def fallback_target(self) -> str:
        """What the fallback names (a version, an endpoint, or ``review``)."""
        return self.fallback_prompt or self.fallback_endpoint or "review"


class QualitySettings(_Strict):
    """The quality loop (``[quality]``, docs/quality.md)."""

    rollups: bool = Field(True, description="keep quality rollups as attempts are written")
    keywords: tuple[str, ...] = Field(
        (), description="words whose frequency in outputs is watched, beside every enum "
                        "member of the output schema")
    keep_minutes: Seconds = Field(2 * 86_400.0, ge=6 * 3600.0,
                                  description="age of minute rollups `cleanup` deletes")
    keep_hours: Seconds = Field(90 * 86_400.0, ge=14 * 86_400.0,
                                description="age of hour rollups `cleanup` deletes")
    # the anomaly rules (docs/quality.md, `lockgate quality --check`)
    window: Seconds = Field(86_400.0, ge=600.0, le=7 * 86_400.0,
                            description="the window a rule compares with its baseline")
    completeness_drop: float = Field(0.15, gt=0, lt=1, description="relative drop that fires")
    drift_drop: float = Field(0.5, gt=0, lt=1, description="relative drop of a watched share")
    drift_min_expected: float = Field(
        10.0, ge=1.0, description="times a watched value must be expected in the window "
        "at its baseline share before its drop may fire (a rare value's share is noise)")
    invalid_json_share: float = Field(0.03, gt=0, lt=1,
                                      description="invalid_json share of each minute")
    pollution_minutes: int = Field(5, ge=1, le=60, description="consecutive minutes")
    latency_rise: float = Field(1.0, gt=0, description="relative rise of latency p50")
    tokens_band: float = Field(0.10, ge=0, lt=1,
                               description="input tokens per call that count as unchanged")
    min_calls: int = Field(100, ge=1, description="calls a window needs on each side")
    min_calls_minute: int = Field(20, ge=1, description="calls each polluted minute needs")
    # alerts (docs/quality.md): one evaluator in all workers, an alert per incident
    alerts: bool = Field(True, description="workers evaluate the rules and keep alerts")
    evaluate_every: Seconds = Field(30.0, ge=1.0, le=3600.0,
                                    description="period of the evaluator")
    evaluator_lease_s: Seconds = Field(
        60.0, ge=2.0, le=3600.0,
        description="the evaluator role's lease; another worker takes over after it")
    cooldown: Seconds = Field(1800.0, ge=0, le=7 * 86_400.0,
                              description="after a resolve, the same alert stays closed")
    update_every: Seconds = Field(900.0, ge=0,
                                  description="least time between two update events of "
                                              "an alert (0: none)")
    samples: int = Field(100, ge=0, le=100, description="failing samples kept per alert")
    webhook: tuple[Webhook, ...] = ()

    @model_validator(mode="after")
    def _check_retention(self) -> QualitySettings:
        # A window kept in minute rows (up to 6 h) is compared with the window before
        # it when there is no week-old baseline: both must outlive the cleanup.
        if self.window <= 6 * 3600 and self.keep_minutes < 2 * self.window:
            raise ValueError(
                f"keep_minutes ({self.keep_minutes:g} s) must be at least twice window "
                f"({self.window:g} s): the rules compare the window with the one before "
                "it, kept in minute rows")
        return self

    @model_validator(mode="after")
    def _check_webhooks(self) -> QualitySettings:
        problem = _same_name([w.target for w in self.webhook], "[[quality.webhook]]")
        if problem is not None:
            raise ValueError(f"{problem}: give each a distinct name")
        if self.evaluator_lease_s <= self.evaluate_every:
            raise ValueError(f"evaluator_lease_s ({self.evaluator_lease_s:g} s) must be "
                             f"longer than evaluate_every ({self.evaluate_every:g} s)")
        return self

    def webhook_named(self, target: str) -> Webhook | None:
        """The configured webhook of that name."""
        return next((w for w in self.webhook if w.target == target), None)
    # the completeness circuits (docs/quality.md)
    circuit: tuple[CircuitSettings, ...] = ()
    circuit_every_s: Seconds = Field(10.0, gt=0, le=600,
                                     description="how often a worker evaluates the circuits")
    circuit_refresh_s: Seconds = Field(2.0, gt=0, le=30,
                                       description="how long a worker trusts the circuit "
                                                   "states it read")

    @model_validator(mode="after")
    def _unique_circuits(self) -> QualitySettings:
        if self.circuit and not self.rollups:
            raise ValueError("completeness circuits read the rollups: set rollups = true "
                             "or remove the [[quality.circuit]] tables")
        seen: set[str] = set()
        for c in self.circuit:
            if c.prompt in seen:
                raise ValueError(f"two circuits name the prompt '{c.prompt}'")
            seen.add(c.prompt)
        return self

    def circuit_of(self, prompt: str) -> CircuitSettings | None:
        """The circuit configured for exactly this prompt path, if any."""
        for c in self.circuit:
            if c.prompt == prompt:
                return c
        return None


class Settings(_Strict):
    """The whole configuration."""

    default_endpoint: str | None = None
    endpoint: tuple[Endpoint, ...] = ()
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    gate: GateSettings = Field(default_factory=GateSettings)
    flow: FlowSettings = Field(default_factory=FlowSettings)
    runtime: RuntimeSettings = Field(default_factory=RuntimeSettings)
    quality: QualitySettings = Field(default_factory=QualitySettings)

    @model_validator(mode="after")
    def _check_fallbacks(self) -> Settings:
        names = {e.name: e for e in self.endpoint}
        if len(names) != len(self.endpoint):
            problem = _same_name([e.name for e in self.endpoint], "[[endpoint]]")
            raise ValueError(f"{problem}: give each endpoint its own name")
        known = {e.name for e in self.endpoints()}
        if self.default_endpoint is not None and self.default_endpoint not in known:
            raise ValueError(f"default_endpoint '{self.default_endpoint}' is not a defined "
                             f"endpoint (defined: {', '.join(sorted(known))}); name one of "
                             "them, or add an [[endpoint]] of that name")
        for e in self.endpoint:
            seen = {e.name}
            cur = e
            while cur.fallback is not None:
                nxt = names.get(cur.fallback)
                if nxt is None:
                    raise ValueError(f"endpoint '{cur.name}' falls back to "
                                     f"'{cur.fallback}', which is not defined")
                if nxt.name in seen:
                    raise ValueError(f"fallbacks of endpoint '{e.name}' form a loop")
                seen.add(nxt.name)
                cur = nxt
        for c in self.quality.circuit:
            if c.fallback_endpoint is not None and c.fallback_endpoint not in known:
                raise ValueError(f"circuit '{c.prompt}' falls back to endpoint "
                                 f"'{c.fallback_endpoint}', which is not defined")
        return self

    def endpoint_named(self, name: str) -> Endpoint | None:
        """The configured (or default) endpoint of that name."""
        for ep in self.endpoints():
            if ep.name == name:
                return ep
        return None

    def pool_of(self, model: ModelConfig | None) -> str:
        """The pool a task with this model config runs in."""
        try:
            return (self.route(model) if model is not None else self._default()).pool
        except ConfigError:
            return "default"  # the worker fails such a task with the reason

    def pool_of_document(self, document: dict[str, Any]) -> str:
        """The pool of tasks made from a stored config document (the release gate's
        evaluation items): the same routing as at submit."""
        try:
            model = load_config(document).model
        except ValidationError:
            return "default"  # the worker fails such a task with the reason
        return self.pool_of(model)

    def _default(self) -> Endpoint:
        eps = self.endpoints()
        if self.default_endpoint:
            for ep in eps:
                if ep.name == self.default_endpoint:
                    return ep
        return eps[0]

    def endpoints(self) -> tuple[Endpoint, ...]:
        """Configured endpoints, or one from the environment (the simulator by default)."""
        if self.endpoint:
            return self.endpoint
        url = os.environ.get("LOCKGATE_BASE_URL") or DEFAULT_BASE_URL  # empty: unset
        problem = http_url_problem(url)
        if problem is not None:
            raise ConfigError(f"$LOCKGATE_BASE_URL: {problem}")
        key_env = os.environ.get("LOCKGATE_API_KEY_ENV") or None
        key_problem = env_name_problem(key_env) if key_env else None
        if key_problem is not None:
            raise ConfigError(f"$LOCKGATE_API_KEY_ENV: {key_problem}")
        return (Endpoint(name="default", base_url=url, api_key_env=key_env),)

    def route(self, model: ModelConfig) -> Endpoint:
        """The endpoint a task's model config goes to."""
        eps = self.endpoints()
        wanted = model.endpoint
        if wanted:
            for ep in eps:
                if ep.name == wanted:
                    return ep
            raise ConfigError(f"model_config.endpoint '{wanted}' is not a configured endpoint "
                              f"(known: {[e.name for e in eps]})")
        for ep in eps:
            if model.name in ep.models or ep.name == model.name:
                return ep
        if self.default_endpoint:
            for ep in eps:
                if ep.name == self.default_endpoint:
                    return ep
            raise ConfigError(f"default_endpoint '{self.default_endpoint}' is not defined")
        return eps[0]


def config_file(path: str | Path | None = None) -> str | Path | None:
    """The configuration file in use: ``path``, else ``$LOCKGATE_CONFIG``, else
    ``./lockgate.toml`` if it exists; None: no file. An empty ``$LOCKGATE_CONFIG``
    counts as unset (as an empty ``$LOCKGATE_DATABASE_URL`` does): a variable cleared
    with ``LOCKGATE_CONFIG=`` names no file."""
    chosen = path or os.environ.get("LOCKGATE_CONFIG") or None
    if chosen is None and Path("lockgate.toml").exists():
        chosen = "lockgate.toml"
    return chosen


def load_settings(path: str | Path | None = None, **worker_overrides: Any) -> Settings:
    """Read the TOML file (:func:`config_file`: ``path``, ``$LOCKGATE_CONFIG`` or
    ``./lockgate.toml``)."""
    chosen = config_file(path)
    data: dict[str, Any] = {}
    if chosen is not None:
        p = Path(chosen)
        if not p.exists():
            raise ConfigError(f"config file {p} does not exist")
        try:
            raw = p.read_bytes()
        except OSError as exc:
            raise ConfigError(f"cannot read config file {p}: {exc.strerror or exc}") from None
        bom = len(raw)
        raw = raw.removeprefix(codecs.BOM_UTF8)  # a byte order mark (Notepad, PowerShell)
        bom -= len(raw)
        try:
            data = tomllib.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            line = raw[:exc.start].count(b"\n") + 1
            raise ConfigError(f"{p}: line {line}: {not_utf8(raw, exc, base=bom)}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{p}: {exc}") from None
    overrides = {k: v for k, v in worker_overrides.items() if v is not None}
    if overrides:
        data["worker"] = {**data.get("worker", {}), **overrides}
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        e = exc.errors()[0]
        where = _where(tuple(e["loc"]), data)
        at = f"{where}: " if where else ""
        raise ConfigError(f"config {chosen or '(defaults)'}: {at}"
                          f"{explain(Settings, e)}") from None


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _where(loc: tuple[int | str, ...], data: Any) -> str:
    """A setting's place as the file shows it: ``'endpoint.0.name'`` is ``[[endpoint]]
    'openai' (the 1st): 'name'`` (an array of tables is counted from 1, and named by its
    ``name`` when it has one)."""
    if not any(isinstance(part, int) for part in loc):
        return f"'{'.'.join(str(x) for x in loc)}'" if loc else ""
    table: list[str] = []
    node, shown = data, ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            item = node[part] if isinstance(node, list | tuple) and part < len(node) else None
            name = item.get("name") if isinstance(item, dict) else None
            label = f"[[{'.'.join(table)}]]"
            shown = (f"{label} '{name}' (the {_ordinal(part + 1)})"
                     if isinstance(name, str) and name else f"the {_ordinal(part + 1)} {label}")
            table, node = [], item
            rest = [str(x) for x in loc[i + 1:] if not isinstance(x, int)]
            if not any(isinstance(x, int) for x in loc[i + 1:]):
                return f"{shown}: '{'.'.join(rest)}'" if rest else shown
            continue
        table.append(str(part))
        node = node.get(part) if isinstance(node, dict) else None
    return shown


def _nested(annotation: Any) -> type[BaseModel] | None:
    """The settings model inside a field's type (``tuple[Endpoint, ...]``: Endpoint)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _nested(arg)
        if found is not None:
            return found
    return None


def _located(model: type[BaseModel], loc: tuple[int | str, ...]
             ) -> tuple[type[BaseModel] | None, Any]:
    """The model holding the setting at ``loc``, and that setting's field (or None)."""
    holder: type[BaseModel] | None = model
    fld: Any = None
    for part in loc:
        if isinstance(part, int):
            continue
        if holder is None:
            return None, None
        fld = holder.model_fields.get(part)
        if fld is None:
            return holder, None
        if part != loc[-1]:
            holder = _nested(fld.annotation)
    return holder, fld


_BOUNDS = {"greater_than_equal": ("ge", "at least"), "greater_than": ("gt", "more than"),
           "less_than_equal": ("le", "at most"), "less_than": ("lt", "less than")}


def explain(model: type[BaseModel], e: ErrorDetails) -> str:
    """A settings error in the user's terms: a misspelt setting with the likely one, a
    table that should be an array of tables, a duration's bounds as durations."""
    loc = tuple(e["loc"])
    name = str(loc[-1]) if loc else ""
    holder, fld = _located(model, loc)
    if e["type"] == "extra_forbidden" and holder is not None:
        for f in holder.model_fields.values():  # `timeout` beside `timeout_s`
            spellings = ([a for a in f.validation_alias.choices if isinstance(a, str)]
                         if isinstance(f.validation_alias, AliasChoices) else [])
            if name in spellings and len(spellings) > 1:  # another one was taken
                others = " or ".join(f"'{s}'" for s in spellings if s != name)
                return (f"given twice: '{name}' and {others} are spellings of one "
                        "setting; keep one of them")
        names = [*holder.model_fields, *(a for f in holder.model_fields.values()
                                           if isinstance(f.validation_alias, AliasChoices)
                                           for a in f.validation_alias.choices
                                           if isinstance(a, str))]
        close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
        what = "section or setting" if holder is Settings else "setting"
        return f"unknown {what}" + (f"; did you mean '{close[0]}'?" if close else
                                    f" (known: {', '.join(holder.model_fields)})")
    if (e["type"] == "tuple_type" and isinstance(e["input"], dict) and fld is not None
            and _nested(fld.annotation) is not None):
        table = ".".join(str(x) for x in loc)
        return (f"use [[{table}]] (an array of tables), not [{table}]: one [[{table}]] "
                "per item")
    if (e["type"] == "string_type" and isinstance(e["input"], list | tuple)
            and holder is not None and f"{name}s" in holder.model_fields):
        # `model = ["a", "b"]` where `models` holds several
        shown = ", ".join(json.dumps(v, default=str) for v in e["input"])  # as TOML
        return f"takes one value, not a list; several go in '{name}s' ({name}s = [{shown}])"
    seconds = fld is not None and any(getattr(m, "func", None) is duration_field
                                      for m in fld.metadata)
    if e["type"] == "missing":
        return f"missing: add {name} = ... to it" if name else "missing"
    if e["type"] == "string_too_short" and (e.get("ctx") or {}).get("min_length") == 1:
        return "must not be empty" + ("" if fld is None or fld.is_required() else
                                      " (leave the setting out for its default)")
    if e["type"] in _BOUNDS:
        key, words = _BOUNDS[e["type"]]
        bound = (e.get("ctx") or {}).get(key)
        if seconds and isinstance(bound, int | float):
            got = e["input"]
            shown = (format_duration(got) if isinstance(got, int | float) and got > 0
                     else repr(got))
            return (f"{shown}: must be {words} {format_duration(bound)}; it is a duration, "
                    f"{EXAMPLES}")
        return f"{e['input']!r}: must be {words} {bound}"
    msg = str(e["msg"]).removeprefix("Value error, ")
    if seconds and "duration" not in msg:
        msg += f"; it is a duration, {EXAMPLES}"
    return msg
