"""The content of a prompt version (pure): validate, normalise, hash, read, diff.

A version is (template, model config, delivery rule). They are validated with the task
spec's own models, so anything a version holds is a config a task could run, then
stored as canonical JSON; the content hash is the SHA-256 of that canonical document,
so identical content is recognised as the same version.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import orjson
from pydantic import TypeAdapter, ValidationError

from lockgate.errors import SpecError
from lockgate.errors import not_utf8 as not_utf8_text  # (this module's not_utf8 names the file)
from lockgate.runtime import check_delivery_rule, placeholders
from lockgate.spec import (
    DeliveryRule,
    Message,
    ModelConfig,
    check_model_keys,
    config_hash,
    registry_reference,
)
from lockgate.store.registry import VersionContent

_MESSAGES = TypeAdapter(tuple[Message, ...])
_MARKERS = ("[system]", "[user]", "[assistant]", "[developer]")


def spec_error_at(exc: ValidationError, field: str) -> SpecError:
    """pydantic's first error as a SpecError naming its place under ``field``."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    return SpecError(err["msg"], field=f"{field}.{loc}" if loc else field)


def make_content(template: Any, model_config: dict[str, Any] | None,
                 delivery_rule: dict[str, Any] | None, *,
                 model_modules: tuple[str, ...] = ()) -> VersionContent:
    """Validate and normalise a version's three parts; SpecError naming the field.
    ``model_modules`` are the modules a pydantic output model may come from."""
    if not isinstance(template, str | list | tuple):
        raise SpecError("must be text or a list of {\"role\", \"content\"} messages, not "
                        f"{type(template).__name__}", field="template")
    try:
        # Messages validated as messages alone: against the union, pydantic's first
        # error would be that the list is not a string.
        tpl = (template if isinstance(template, str) else
               _MESSAGES.validate_python(template))
    except ValidationError as exc:
        raise spec_error_at(exc, "template") from None
    if isinstance(tpl, str) and not tpl.strip():
        raise SpecError("must not be empty", field="template")
    if not tpl:
        raise SpecError("must hold at least one message", field="template")
    if registry_reference(tpl) is not None:
        raise SpecError("a version holds a template, not a registry reference",
                        field="template")
    placeholders(tpl)  # refuses bad placeholder syntax
    if model_config is None:
        raise SpecError("is required for a new prompt", field="model_config")
    try:
        model = ModelConfig.model_validate(model_config)
        rule = DeliveryRule.model_validate(delivery_rule or {})
    except ValidationError as exc:
        title = exc.title
        raise spec_error_at(exc, "model_config" if title == "ModelConfig"
                          else "delivery_rule") from None
    check_model_keys(model)  # a misspelt key, as a task line's is refused
    check_delivery_rule(rule, model_modules=model_modules)
    doc_template: Any = tpl if isinstance(tpl, str) else [m.model_dump() for m in tpl]
    doc = {"template": doc_template,
           "model_config": model.model_dump(exclude_none=True),
           "delivery_rule": rule.model_dump(by_alias=True, exclude_none=True, mode="json")}
    return VersionContent(doc["template"], doc["model_config"], doc["delivery_rule"],
                          config_hash(doc))


def not_utf8(path: Path, data: bytes, exc: UnicodeDecodeError, *, base: int = 0,
             line: int | None = None) -> SpecError:
    """The one-line error for a file that is not UTF-8 text: the file, the line and the
    byte offset of its first bad byte (``data`` starts at ``base`` in the file, on
    ``line`` when given), and the fix."""
    if line is None:
        line = data.count(b"\n", 0, exc.start) + 1
    return SpecError(f"{path}: line {line}: {not_utf8_text(data, exc, base=base)}")


def read_text(path: Path, what: str) -> str:
    """A UTF-8 text file the user named; SpecError naming it (``what`` says which
    file) when it cannot be read or is not UTF-8."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SpecError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise not_utf8(path, data, exc) from None


def read_template(path: str | Path) -> Any:
    """A template from a file.

    * ``.json``: a JSON string or a list of ``{"role", "content"}`` messages;
    * text with ``[system]`` / ``[user]`` marker lines: one message per section;
    * other text: the whole file is one user message.
    """
    p = Path(path)
    raw = read_text(p, "template file")
    if p.suffix.lower() == ".json":
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise SpecError(f"{p}: not valid JSON ({exc})") from None
    lines = raw.splitlines()
    if not any(line.strip().lower() in _MARKERS for line in lines):
        return raw.strip("\n")
    messages: list[dict[str, str]] = []
    for n, line in enumerate(lines, start=1):
        marker = line.strip().lower()
        if marker in _MARKERS:
            messages.append({"role": marker[1:-1], "content": ""})
        elif messages:
            messages[-1]["content"] += line + "\n"
        elif line.strip():
            raise SpecError(f"{p} line {n}: text before the first [system]/[user] marker")
    for m in messages:
        m["content"] = m["content"].strip("\n")
    return messages


def read_json_option(value: str | None, what: str) -> dict[str, Any] | None:
    """A JSON object given inline or as ``@file.json`` (command-line options)."""
    if value is None:
        return None
    text = value
    if value.startswith("@"):
        text = read_text(Path(value[1:]), f"{what} file")
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise SpecError(f"{what} is not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise SpecError(f"{what} must be a JSON object")
    return doc


def render_text(template: Any, model_config: dict[str, Any],
                delivery_rule: dict[str, Any]) -> list[str]:
    """A version as lines of text, for ``show`` and ``diff``."""
    out: list[str] = []
    if isinstance(template, str):
        out += ["[user]", *template.splitlines()]
    else:
        for m in template:
            out += [f"[{m['role']}]", *m["content"].splitlines()]
    out += ["[model_config]", *json.dumps(model_config, indent=2, sort_keys=True,
                                          ensure_ascii=False).splitlines()]
    out += ["[delivery_rule]", *json.dumps(delivery_rule, indent=2, sort_keys=True,
                                           ensure_ascii=False).splitlines()]
    return out


def diff(a: tuple[str, Any, dict[str, Any], dict[str, Any]],
         b: tuple[str, Any, dict[str, Any], dict[str, Any]]) -> str:
    """Unified diff of two versions given as (label, template, model_config, delivery)."""
    return "\n".join(difflib.unified_diff(render_text(*a[1:]), render_text(*b[1:]),
                                          fromfile=a[0], tofile=b[0], lineterm=""))
