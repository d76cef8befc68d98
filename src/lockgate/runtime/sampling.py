"""Sampling settings per worker, from the model config only.

Many workers sending the same prompt at exactly the same temperature produce
correlated failures; a small per-worker spread decorrelates them. The spread is
``model_config.temperature_jitter``: each worker gets a temperature in
``[temperature - jitter, temperature + jitter]`` (clipped to ``[0, 2]``), derived
deterministically from the worker's seed, so a worker's settings are reproducible
and recorded. ``top_k`` is sent only when the config sets it (providers that accept
it; prefer it to ``top_p`` there); unknown keys of the config pass through.
"""

from __future__ import annotations

import hashlib
from typing import Any

from lockgate.spec import ModelConfig

#: ModelConfig fields that configure lockgate itself, never sent to a provider.
_LOCAL_FIELDS = frozenset({"name", "endpoint", "timeout_ms", "max_input_tokens",
                           "temperature_jitter", "tokenizer"})


def worker_unit(worker_seed: int | str, salt: str = "") -> float:
    """A deterministic number in ``[-1, 1]`` for a worker (and an optional salt)."""
    digest = hashlib.blake2b(f"{worker_seed}\x00{salt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / (2**64 - 1) * 2.0 - 1.0


def sampling_params(model: ModelConfig, worker_seed: int | str) -> dict[str, Any]:
    """Provider parameters for this model config on this worker.

    Returns ``temperature`` (jittered within the band), ``top_p``, ``top_k``,
    ``max_tokens``, ``seed`` and ``response_format`` when set, plus the config's extra
    keys. ``response_format`` is given in the OpenAI-compatible form
    (``{"type": "json_object"}``).
    """
    params: dict[str, Any] = {}
    if model.temperature is not None:
        t = model.temperature
        if model.temperature_jitter:
            t += model.temperature_jitter * worker_unit(worker_seed, model.name)
        params["temperature"] = round(min(2.0, max(0.0, t)), 4)
    if model.top_p is not None:
        params["top_p"] = model.top_p
    if model.top_k is not None:
        params["top_k"] = model.top_k
    if model.max_tokens is not None:
        params["max_tokens"] = model.max_tokens
    if model.seed is not None:
        params["seed"] = model.seed
    if model.response_format is not None:
        params["response_format"] = {"type": model.response_format}
    for key, value in model.extra_params().items():
        if key not in _LOCAL_FIELDS:
            params[key] = value
    return params
