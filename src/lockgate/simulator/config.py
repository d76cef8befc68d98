"""Simulator configuration: every knob, with defaults that behave like a fast, perfect model.

The configuration is one JSON-serialisable pydantic model so that the same document can
come from a file, from command-line flags, or from a partial ``POST /_sim/config`` at run
time. Defaults inject no faults and no latency, so a bare simulator is never the
bottleneck of a benchmark; tests switch faults on explicitly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

#: Names under which fault rates are drawn, in the order the draw checks them.
FAULT_RATES: tuple[str, ...] = (
    "rate_429",
    "rate_500",
    "rate_503",
    "rate_timeout",
    "rate_broken_body",
    "rate_malformed",
    "rate_chatty",
)

DEFAULT_MODELS: tuple[str, ...] = ("sim-complaints", "sim-small", "sim-large")


class LatencyConfig(BaseModel):
    """Time the simulator waits before answering an admitted request.

    ``lognormal`` is parameterised by its *mean* (not its median) so that changing
    ``sigma`` changes the tail without moving the average a benchmark depends on.
    """

    model_config = ConfigDict(extra="forbid")

    kind: Literal["fixed", "lognormal"] = "fixed"
    mean_ms: float = Field(0.0, ge=0.0, le=3_600_000.0)
    sigma: float = Field(0.5, ge=0.0, le=5.0)

    @property
    def mu(self) -> float:
        """Location parameter of the underlying normal so that E[X] equals ``mean_ms``."""
        return math.log(self.mean_ms) - self.sigma * self.sigma / 2.0 if self.mean_ms else 0.0


#: The ``degrade`` key that applies to every model without an entry of its own.
ALL_MODELS = "*"


class DriftConfig(BaseModel):
    """Label drift: answers that would hold ``value`` hold another value instead."""

    model_config = ConfigDict(extra="forbid")

    value: str = Field(min_length=1, description="the enum value whose frequency falls")
    rate: float = Field(ge=0.0, le=1.0, description="share of those answers changed")
    field: str | None = Field(None, description="only this field (default: every enum field)")
    to: str | None = Field(None, description="the value given instead (default: another "
                                             "allowed value, hash-chosen)")


class Degradation(BaseModel):
    """Deterministic degradation of one model's answers (``degrade`` in the config).

    Every share is drawn per request from a hash of the seed, the switch, the model and
    the request's messages, so the same request is degraded the same way on every run
    (and on every retry)."""

    model_config = ConfigDict(extra="forbid")

    drop_fields: float = Field(0.0, ge=0.0, le=1.0,
                               description="share of JSON answers that lack fields")
    dropped: tuple[str, ...] = Field(
        (), description="the fields such an answer lacks (default: all but the first)")
    drop_as: Literal["omit", "null", "blank"] = Field(
        "omit", description="how a dropped field looks: absent, null, or an empty string")
    drift: DriftConfig | None = None
    latency_factor: float = Field(1.0, ge=1.0, le=1000.0,
                                  description="multiplies the latency of every answer")
    latency_add_ms: float = Field(0.0, ge=0.0, le=3_600_000.0,
                                  description="added to the latency of every answer")
    broken_json: float = Field(0.0, ge=0.0, le=1.0,
                               description="share of answers whose content is garbage "
                                           "that no JSON repair recovers")

    @property
    def slows(self) -> bool:
        return self.latency_factor != 1.0 or self.latency_add_ms > 0.0


class SimulatorConfig(BaseModel):
    """Everything that shapes the simulator's behaviour; all fields are optional."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    latency: LatencyConfig = Field(default_factory=LatencyConfig)

    rate_429: float = Field(0.0, ge=0.0, le=1.0, description="random rate_limit_exceeded")
    rate_500: float = Field(0.0, ge=0.0, le=1.0)
    rate_503: float = Field(0.0, ge=0.0, le=1.0)
    rate_timeout: float = Field(0.0, ge=0.0, le=1.0, description="hold open, never answer")
    rate_broken_body: float = Field(0.0, ge=0.0, le=1.0, description="2xx, HTTP body cut")
    rate_malformed: float = Field(0.0, ge=0.0, le=1.0, description="2xx, content JSON cut")
    rate_chatty: float = Field(0.0, ge=0.0, le=1.0, description="prose around fenced JSON")

    retry_after_ms: int = Field(1000, ge=0, le=3_600_000)
    hang_s: float = Field(300.0, ge=0.0, le=86_400.0)

    rpm: int | None = Field(None, ge=1, description="requests per window per API key")
    tpm: int | None = Field(None, ge=1, description="tokens per window per API key")
    window_s: float = Field(60.0, gt=0.0, le=3600.0, description="sliding window length")
    enforce_s: float | None = Field(
        None, gt=0.0, le=3600.0,
        description="also enforce rpm/tpm scaled to any sliding window of this length "
                    "(at most window_s; the headers still advertise window_s)")
    header_style: Literal["openai", "gateway", "ietf", "anthropic", "none"] = Field(
        "openai", description="rate-limit headers: openai (limit, remaining, reset), "
                              "gateway (limit, remaining), ietf (RateLimit and "
                              "RateLimit-Policy), anthropic (anthropic-ratelimit-*), none")
    limit_headers_on_429: bool = Field(
        True, description="the rate-limit headers on a 429 too (false: the 429 bare of "
                          "them, as many gateways and proxies send it; retry_hint "
                          "still applies)")
    retry_hint: Literal["both", "seconds", "none"] = Field(
        "both", description="retry headers of a 429: retry-after-ms and retry-after, "
                            "retry-after only (whole seconds), or none")

    max_in_flight: int | None = Field(
        None, ge=1, description="requests it works on at once; one more is refused with a "
                                "429 that names no limit (a concurrency limit: vLLM's "
                                "queue, LiteLLM's max_parallel_requests, a provisioned "
                                "deployment); retry_hint applies")

    quota_exhausted: bool = False
    context_window: int | None = Field(128_000, ge=1)

    accuracy_noise: float = Field(0.0, ge=0.0, le=1.0)
    model_noise: dict[str, float] = Field(default_factory=dict)

    models: tuple[str, ...] = DEFAULT_MODELS
    strict_models: bool = False
    require_api_key: bool = False
    #: Answer without a ``usage`` object (as some gateways and local servers do).
    omit_usage: bool = False

    #: Degradation switches per model name (``"*"``: every model without its own entry).
    degrade: dict[str, Degradation] = Field(default_factory=dict)

    seed: int | None = None
    #: Answer ``[hostile:KIND]`` in an input with that hostile content (simulator.hostile).
    hostile: bool = False

    @model_validator(mode="before")
    @classmethod
    def _latency_shorthand(cls, data: Any) -> Any:
        """Accept ``"latency": 200`` as a fixed 200 ms latency."""
        if isinstance(data, dict) and isinstance(data.get("latency"), int | float):
            data = {**data, "latency": {"kind": "fixed", "mean_ms": float(data["latency"])}}
        return data

    @model_validator(mode="after")
    def _check(self) -> SimulatorConfig:
        total = sum(getattr(self, name) for name in FAULT_RATES)
        if total > 1.0 + 1e-9:
            raise ValueError(f"fault rates add up to {total:.4f}; their sum must be at most 1")
        if self.enforce_s is not None and self.enforce_s > self.window_s:
            raise ValueError(f"enforce_s ({self.enforce_s:g}) must not exceed window_s "
                             f"({self.window_s:g})")
        for model, noise in self.model_noise.items():
            if not 0.0 <= noise <= 1.0:
                raise ValueError(f"model_noise[{model!r}] must be within 0..1")
        return self

    def noise_for(self, model: str) -> float:
        """The accuracy noise that applies to a model (per-model override first)."""
        return self.model_noise.get(model, self.accuracy_noise)

    def degradation(self, model: str) -> Degradation | None:
        """The degradation that applies to a model (its own entry, else ``"*"``)."""
        degrade = self.degrade
        if not degrade:
            return None
        return degrade.get(model) or degrade.get(ALL_MODELS)

    def patched(self, patch: Mapping[str, Any]) -> SimulatorConfig:
        """A new config with ``patch`` applied; nested ``latency`` keys merge, not replace."""
        data = self.model_dump(mode="json")
        for key, value in patch.items():
            if key == "latency" and isinstance(value, Mapping):
                data["latency"] = {**data["latency"], **value}
            else:
                data[key] = value
        return SimulatorConfig.model_validate(data)

    def to_json(self) -> bytes:
        """The config as JSON bytes (what ``--config`` files and ``/_sim/config`` speak)."""
        return orjson.dumps(self.model_dump(mode="json"))


def config_error(exc: ValidationError) -> str:
    """A config's validation errors on one line, each naming its field by path
    (``degrade.sim-x.drop_fields: Input should be less than or equal to 1``)."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"{loc}: {err['msg']}" if loc else str(err["msg"]))
    return "; ".join(parts)


def load_config(
    path: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> SimulatorConfig:
    """Build a config from an optional JSON file, then apply non-None ``overrides``.

    This is the single entry point for front ends (``python -m lockgate.simulator`` and
    the ``lockgate simulate`` command), so both resolve files and flags the same way.
    """
    config = SimulatorConfig()
    if path is not None:
        config = SimulatorConfig.model_validate(orjson.loads(Path(path).read_bytes()))
    patch = {k: v for k, v in (overrides or {}).items() if v is not None}
    return config.patched(patch) if patch else config
