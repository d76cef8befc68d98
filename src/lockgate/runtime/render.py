"""Strict ``{name}`` rendering (``{{`` and ``}}`` for literal braces)."""

from __future__ import annotations

import hashlib
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from lockgate.errors import TemplateError
from lockgate.spec import Message, TaskConfig

_FORMATTER = string.Formatter()


@dataclass(frozen=True, slots=True)
class Rendered:
    """A rendered prompt and what is needed to replay it byte for byte."""

    messages: list[dict[str, str]]
    snapshot: str
    sha256: str
    input_tokens: int
    estimator: str
    notes: tuple[str, ...] = ()
    alerts: tuple[str, ...] = ()


def _texts(template: str | tuple[Message, ...]) -> list[str]:
    return [template] if isinstance(template, str) else [m.content for m in template]


def placeholders(template: str | tuple[Message, ...]) -> set[str]:
    """The placeholder names a template uses; raises TemplateError on bad syntax."""
    names: set[str] = set()
    for text in _texts(template):
        try:
            parsed = list(_FORMATTER.parse(text))
        except ValueError as exc:
            raise TemplateError(
                f"{exc}; write '{{{{' and '}}}}' for literal braces",
                field="prompt_template") from None
        for _literal, name, spec, conv in parsed:
            if name is None:
                continue
            if not name.isidentifier() or spec or conv:
                raise TemplateError(
                    f"placeholder '{{{name}}}' is not a plain {{name}}; write '{{{{' and "
                    f"'}}}}' for literal braces", field="prompt_template")
            names.add(name)
    return names


def check_template(template: str | tuple[Message, ...], input_keys: set[str] | None,
                   defaults: Mapping[str, Any] | None = None) -> set[str]:
    """Check placeholders against the input's keys (and declared defaults)."""
    names = placeholders(template)
    if input_keys is None:
        return names
    known = set(input_keys) | set(defaults or {})
    missing = sorted(names - known)
    if missing:
        raise TemplateError(
            f"placeholder(s) {missing} have no value in input_data; add them to input_data "
            "or to delivery_rule.input_defaults", field="input_data")
    unused = sorted(set(input_keys) - names)
    if unused:
        raise TemplateError(
            f"input key(s) {unused} are not used by the template; remove them or add "
            "placeholders for them", field="input_data")
    return names


def _value_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def render(config: TaskConfig, input_data: Mapping[str, Any]) -> Rendered:
    """Render a task's template with its input into chat messages."""
    defaults = config.delivery_rule.input_defaults
    values: dict[str, str] = {}
    alerts: list[str] = []
    for name in placeholders(config.prompt_template):
        if name in input_data and input_data[name] is not None:
            values[name] = _value_text(input_data[name])
        elif name in defaults:
            values[name] = _value_text(defaults[name])
            alerts.append(f"input_default:{name}")
        else:
            raise TemplateError(f"placeholder '{{{name}}}' has no value", field="input_data")
    tpl = config.prompt_template
    if isinstance(tpl, str):
        messages = [{"role": "user", "content": tpl.format_map(values)}]
    else:
        messages = [{"role": m.role, "content": m.content.format_map(values)} for m in tpl]
    snapshot = orjson.dumps(messages).decode()
    tokens = sum(len(m["content"]) for m in messages) // 3 + 4 * len(messages)
    return Rendered(
        messages=messages,
        snapshot=snapshot,
        sha256=hashlib.sha256(snapshot.encode()).hexdigest(),
        input_tokens=tokens,
        estimator="chars/3",
        alerts=tuple(alerts),
    )
