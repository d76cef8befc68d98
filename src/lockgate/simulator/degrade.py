"""Deterministic degradation of a model's answers (the ``degrade`` switches).

Each switch decides per request from a stable draw: a hash (blake2b) of the seed, the
switch, the model and the request's messages, mapped to [0, 1). The same request is
therefore degraded the same way on every run, in every process and on every retry,
while a share ``p`` of distinct requests is hit. Nothing here runs unless a switch
applies to the request's model.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from lockgate.simulator.config import Degradation
from lockgate.simulator.prompt import ENUM, PromptSpec
from lockgate.simulator.responder import Answer, estimate_tokens, label, perturb

_SCALE = float(1 << 64)


class Draws:
    """The stable draws of one request: ``draws.u("drop")`` is in [0, 1)."""

    __slots__ = ("_prefix",)

    def __init__(self, seed: int | None, model: str, messages: Any) -> None:
        self._prefix = (f"{seed or 0}\x1f{model}\x1f".encode() + orjson.dumps(messages)
                        + b"\x1f")

    def u(self, switch: str) -> float:
        digest = hashlib.blake2b(self._prefix + switch.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / _SCALE


def degraded_values(spec: PromptSpec, text: str, noise: float, deg: Degradation,
                    draws: Draws) -> tuple[dict[str, Any], list[str]]:
    """The field values of a JSON answer after drift and dropped fields, and the names
    of the switches that changed it."""
    values = label(spec, text, noise)
    hit: list[str] = []
    drift = deg.drift
    if drift is not None and drift.rate > 0:
        for field in spec.fields:
            if field.kind != ENUM or (drift.field is not None and field.name != drift.field):
                continue
            if values.get(field.name) != drift.value:
                continue
            if draws.u(f"drift\x1f{field.name}") < drift.rate:
                values[field.name] = drift.to if drift.to is not None \
                    else perturb(field, drift.value, text)
                if "drift" not in hit:
                    hit.append("drift")
    if deg.drop_fields > 0 and draws.u("drop") < deg.drop_fields:
        names = deg.dropped or tuple(f.name for f in spec.fields[1:])
        for name in names:
            if name not in values:
                continue
            if deg.drop_as == "omit":
                del values[name]
            else:
                values[name] = None if deg.drop_as == "null" else ""
        hit.append("drop_fields")
    return values, hit


def degraded_answer(spec: PromptSpec, text: str, prompt_tokens: int, noise: float,
                    deg: Degradation, draws: Draws) -> tuple[Answer, list[str]]:
    """A JSON answer with the content switches of ``deg`` applied (see
    :func:`degraded_values`)."""
    values, hit = degraded_values(spec, text, noise, deg, draws)
    content = orjson.dumps(values).decode()
    return Answer(content, True, prompt_tokens, estimate_tokens(content)), hit


def broken_json(draws: Draws) -> str:
    """Garbage that starts like a JSON object but ends inside its first key, so no
    key, value or closing brace is there for a repair to use: lockgate's parser lands it
    as ``invalid_json`` (not ``no_json_found``: it is JSON-like)."""
    ref = int(draws.u("broken_json\x1fref") * 0xFFFFFFFF)
    return '{"' + f"{ref:08x} ]] <unk> ::: <unk>"


def latency_ms(base_ms: float, deg: Degradation) -> float:
    """A latency stretched by the model's slow-down switches."""
    return base_ms * deg.latency_factor + deg.latency_add_ms
