"""Task files in and result files out.

In: task JSONL (the six meta-fields per line) and the OpenAI Batch API input format
(``custom_id``, ``method``, ``url``, ``body``). A file is validated whole before anything
is submitted: with bad lines nothing is submitted unless ``skip_invalid`` is given,
and then the rejects go to a file with their line numbers and reasons.

Out: JSONL, CSV and the OpenAI Batch API output format.
"""

from __future__ import annotations

import csv
import hashlib
import io
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

import orjson

from lockgate.errors import LockgateError, SpecError
from lockgate.results import TaskResult, iso
from lockgate.runtime import check_delivery_rule, check_template
from lockgate.spec import (
    MAX_INPUT_BYTES,
    TaskSpec,
    check_model_keys,
    parse_task,
    registry_reference,
)

Format = Literal["tasks", "openai-batch"]
MAX_SHOWN = 20


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def from_openai_batch(obj: Any, line: int | None = None,
                      max_input_bytes: int = MAX_INPUT_BYTES) -> TaskSpec:
    """Turn one OpenAI Batch API request line into a task (messages taken literally)."""
    if not isinstance(obj, dict):
        raise SpecError("expected a JSON object", line=line)
    for key in ("custom_id", "body"):
        if key not in obj:
            raise SpecError("is required in the OpenAI batch format", field=key, line=line)
    method = obj.get("method", "POST")
    if method != "POST":
        raise SpecError(f"must be POST, got {method!r}", field="method", line=line)
    url = str(obj.get("url", "/v1/chat/completions"))
    if not url.rstrip("/").endswith("/chat/completions"):
        raise SpecError(f"only /v1/chat/completions is supported, got {url!r}", field="url",
                        line=line)
    body = obj["body"]
    if not isinstance(body, dict):
        raise SpecError("must be a JSON object", field="body", line=line)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise SpecError("must be a non-empty list", field="body.messages", line=line)
    template = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise SpecError("each message needs a text 'content' (multimodal parts are not "
                            "supported)", field=f"body.messages[{i}]", line=line)
        template.append({"role": m.get("role", "user"), "content": _escape(m["content"])})
    params = {k: v for k, v in body.items() if k not in ("messages", "model")}
    rf = params.pop("response_format", None)
    json_mode = isinstance(rf, dict) and rf.get("type") == "json_object"
    model = {"name": body.get("model") or "", **params}
    if json_mode:
        model["response_format"] = "json_object"
    return parse_task({
        "task_id": obj["custom_id"], "prompt_template": template, "input_data": {},
        "model_config": model, "delivery_rule": {"format": "json" if json_mode else "text"},
        "retry_policy": {},
    }, line=line, max_input_bytes=max_input_bytes)


@dataclass(frozen=True)
class Checks:
    """What a submit checks beyond the task schema, set by the configuration and the
    database: the modules whose pydantic models a rule may name, and the largest input
    the database can store."""

    model_modules: tuple[str, ...] = ()
    max_input_bytes: int = MAX_INPUT_BYTES
    #: What is wrong with a registry reference (``NAME``, ``NAME@label``, ``NAME@3``),
    #: or None when it names a version; None: references are not checked.
    reference_problem: Callable[[str], str | None] | None = None


def validate_line(raw: bytes, line: int, fmt: Format, checks: Checks = Checks()) -> TaskSpec:
    """Parse and fully check one line (JSON, fields, placeholders against the input)."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise SpecError(f"not valid JSON ({exc})", line=line) from None
    spec = (from_openai_batch(obj, line, checks.max_input_bytes) if fmt == "openai-batch"
            else parse_task(obj, line, max_input_bytes=checks.max_input_bytes))
    try:
        check_spec(spec, checks)
    except SpecError as exc:
        raise exc.at_line(line) from None
    return spec


def check_spec(spec: TaskSpec, checks: Checks = Checks()) -> None:
    """Submit-time checks beyond the schema: model_config keys, placeholders and the
    delivery rule. A registry reference's template is checked when it is registered,
    not here."""
    if spec.model is not None:
        check_model_keys(spec.model)
    ref = registry_reference(spec.prompt_template)
    if ref is not None and checks.reference_problem is not None:
        problem = checks.reference_problem(ref)
        if problem is not None:
            raise SpecError(problem, field="prompt_template")
    if ref is None:
        check_template(spec.prompt_template, set(spec.input_data),
                       spec.delivery_rule.input_defaults)
    check_delivery_rule(spec.delivery_rule, model_modules=checks.model_modules)
    if len(spec.input_json()) > checks.max_input_bytes:
        raise SpecError(f"is {len(spec.input_json()):,} bytes as JSON; this database takes "
                        f"at most {checks.max_input_bytes:,} per task", field="input_data")


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as fh:
        for n, raw in enumerate(fh, start=1):
            if raw.strip():
                yield n, raw


@dataclass
class FileCheck:
    """The result of validating a whole file."""

    valid: int
    rejected: list[tuple[int, SpecError]]


def check_file(path: Path, fmt: Format, *, reject_sink: TextIO | None = None,
               progress: Callable[[int], None] | None = None,
               checks: Checks = Checks()) -> FileCheck:
    """Validate every line; keep the first errors, count them all."""
    if not path.exists():
        raise LockgateError(f"file {path} does not exist")
    valid = 0
    rejected: list[tuple[int, SpecError]] = []
    for n, raw in _lines(path):
        try:
            validate_line(raw, n, fmt, checks)
            valid += 1
        except SpecError as exc:
            rejected.append((n, exc))
            if reject_sink is not None:
                reject_sink.write(orjson.dumps({
                    "line": n, "field": exc.field, "error": str(exc),
                    "raw": raw.decode("utf-8", "replace").rstrip("\n")}).decode() + "\n")
        if progress and n % 1000 == 0:
            progress(n)
    return FileCheck(valid, rejected)


def valid_specs(path: Path, fmt: Format, skip: set[int],
                checks: Checks = Checks()) -> Iterator[TaskSpec]:
    """Second pass: the valid lines as specs (the file was checked already)."""
    for n, raw in _lines(path):
        if n not in skip:
            yield validate_line(raw, n, fmt, checks)


def describe_rejects(rejected: list[tuple[int, SpecError]]) -> str:
    """A readable list of the first bad lines."""
    shown = "\n".join(f"  {e}" for _n, e in rejected[:MAX_SHOWN])
    more = len(rejected) - MAX_SHOWN
    return shown + (f"\n  ... and {more} more" if more > 0 else "")


# -- export ---------------------------------------------------------------------------

def write_jsonl(rows: Iterable[TaskResult], out: TextIO) -> int:
    """One JSON object per task: its result, or the precise error (``{class,
    message}``), with ISO-8601 UTC times (the same shape as ``TaskResult.to_dict()``)."""
    n = 0
    for row in rows:
        out.write(orjson.dumps(row.to_dict()).decode() + "\n")
        n += 1
    return n


CSV_COLUMNS = ["task_id", "batch_id", "status", "parse_status", "error_class",
               "error_message", "attempts", "created_at", "finished_at", "input_tokens",
               "output_tokens", "model", "result"]


def write_csv(rows: Iterable[TaskResult], out: TextIO) -> int:
    """CSV with the result as a JSON column and ISO-8601 UTC times."""
    w = csv.writer(out)
    w.writerow(CSV_COLUMNS)
    n = 0
    for row in rows:
        err, use = row.error, row.usage
        w.writerow([row.task_id, row.batch_id, row.status, row.parse_status or "",
                    err.error_class or "" if err else "", err.message or "" if err else "",
                    row.attempts, iso(row.created_at), iso(row.finished_at) or "",
                    "" if use is None or use.input_tokens is None else use.input_tokens,
                    "" if use is None or use.output_tokens is None else use.output_tokens,
                    use.model or "" if use else "",
                    "" if row.result is None else orjson.dumps(row.result).decode()])
        n += 1
    return n


def _batch_request_id(row: TaskResult, prefix: str = "batch_req_") -> str:
    """A stable ``batch_req_…`` id per task, in the form OpenAI's lines have."""
    digest = hashlib.sha256(f"{row.task_id}\x00{iso(row.created_at)}".encode()).hexdigest()
    return f"{prefix}{digest[:24]}"


def write_openai_batch(rows: Iterable[TaskResult], out: TextIO) -> int:
    """The OpenAI Batch API output format, so existing consumers read our results.

    A task whose last call got an HTTP answer is written as the provider answered it:
    ``response: {status_code, request_id, body}`` with the body as returned (an HTTP 400
    too, its error in the body) and ``error: null``. A task with no HTTP answer (the
    connection failed, the call timed out, it never ran) has ``response: null`` and
    ``error: {code, message}``. lockgate's own verdict (repairs, validation, fallbacks)
    is in the JSONL and CSV exports; this format carries the provider's answer."""
    n = 0
    for row in rows:
        line: dict[str, Any] = {"id": _batch_request_id(row), "custom_id": row.task_id}
        resp = row.response
        if resp is not None and resp.body is not None:
            line["response"] = {"status_code": resp.status_code,
                                "request_id": resp.request_id, "body": resp.body}
            line["error"] = None
        elif row.status == "SUCCEEDED":  # the body was not kept: rebuild it
            value = row.result
            content = value if isinstance(value, str) else orjson.dumps(value).decode()
            use = row.usage
            usage = None
            if use is not None and (use.input_tokens is not None
                                    or use.output_tokens is not None):
                pt, ct = use.input_tokens or 0, use.output_tokens or 0
                usage = {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}
            line["response"] = {
                "status_code": 200, "request_id": resp.request_id if resp else None,
                "body": {"id": _batch_request_id(row, "chatcmpl-"), "object": "chat.completion",
                         "model": use.model if use else None,
                         "created": int((row.finished_at or row.created_at).timestamp()),
                         "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                                      "message": {"role": "assistant", "content": content}}],
                         "usage": usage}}
            line["error"] = None
        else:
            err = row.error
            line["response"] = None
            line["error"] = {"code": (err.error_class if err else None) or row.status.lower(),
                             "message": (err.message if err else None) or row.status}
        out.write(orjson.dumps(line).decode() + "\n")
        n += 1
    return n


WRITERS: dict[str, Callable[[Iterable[TaskResult], TextIO], int]] = {
    "jsonl": write_jsonl, "csv": write_csv, "openai-batch": write_openai_batch}


def export_text(rows: Iterable[TaskResult], fmt: str) -> str:
    """Export to a string (for small batches and tests)."""
    buf = io.StringIO()
    WRITERS[fmt](rows, buf)
    return buf.getvalue()
