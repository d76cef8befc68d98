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

    [[endpoint]]
    name = "local"
    base_url = "http://127.0.0.1:11434/v1"   # Ollama
    supports_top_k = true

    [worker]
    concurrency = 256
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from lockgate.errors import ConfigError
from lockgate.spec import ModelConfig

DEFAULT_BASE_URL = "http://127.0.0.1:8400/v1"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Endpoint(_Strict):
    """One OpenAI-compatible endpoint and its limits."""

    name: str = Field(min_length=1, max_length=100)
    base_url: str
    api_key_env: str | None = None
    model: str | None = Field(None, description="model name sent instead of the task's")
    models: tuple[str, ...] = Field((), description="task model names routed here")
    timeout_s: float | None = Field(None, gt=0)
    max_concurrency: int = Field(1000, ge=1)
    supports_top_k: bool = False
    send_idempotency_key: bool = True
    headers: dict[str, str] = Field(default_factory=dict)

    def api_key(self) -> str | None:
        """The key from the environment variable this endpoint names."""
        if not self.api_key_env:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ConfigError(
                f"endpoint '{self.name}' reads its API key from ${self.api_key_env}, "
                f"which is not set; export {self.api_key_env}=... before starting")
        return key


class WorkerSettings(_Strict):
    """How a worker process runs. Every field can be set in ``[worker]`` or by flag."""

    concurrency: int = Field(512, ge=1, le=100_000, description="calls in flight")
    claim_batch: int = Field(256, ge=1, le=5000, description="rows per claim")
    lease_s: float = Field(60.0, ge=1.0, description="lease length; renewed at 1/3")
    flush_interval_s: float = Field(0.02, gt=0, description="write-behind flush period")
    flush_rows: int = Field(500, ge=1, le=5000, description="write-behind batch size")
    poll_max_s: float = Field(1.0, gt=0, description="longest sleep on an empty queue")
    heartbeat_s: float = Field(5.0, gt=0)
    shutdown_grace_s: float = Field(30.0, ge=0, description="time to finish in-flight calls")
    store_snapshots: bool = Field(True, description="keep the rendered prompt per attempt")


class Settings(_Strict):
    """The whole configuration."""

    default_endpoint: str | None = None
    endpoint: tuple[Endpoint, ...] = ()
    worker: WorkerSettings = Field(default_factory=WorkerSettings)

    def endpoints(self) -> tuple[Endpoint, ...]:
        """Configured endpoints, or one from the environment (the simulator by default)."""
        if self.endpoint:
            return self.endpoint
        return (Endpoint(
            name="default",
            base_url=os.environ.get("LOCKGATE_BASE_URL", DEFAULT_BASE_URL),
            api_key_env=os.environ.get("LOCKGATE_API_KEY_ENV") or None),)

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


def load_settings(path: str | Path | None = None, **worker_overrides: Any) -> Settings:
    """Read the TOML file (``path``, ``$LOCKGATE_CONFIG`` or ``./lockgate.toml``)."""
    chosen = path or os.environ.get("LOCKGATE_CONFIG")
    data: dict[str, Any] = {}
    if chosen is None and Path("lockgate.toml").exists():
        chosen = "lockgate.toml"
    if chosen is not None:
        p = Path(chosen)
        if not p.exists():
            raise ConfigError(f"config file {p} does not exist")
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{p}: {exc}") from None
    overrides = {k: v for k, v in worker_overrides.items() if v is not None}
    if overrides:
        data["worker"] = {**data.get("worker", {}), **overrides}
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        e = exc.errors()[0]
        where = ".".join(str(x) for x in e["loc"])
        raise ConfigError(f"config {chosen or '(defaults)'}: '{where}': {e['msg']}") from None
