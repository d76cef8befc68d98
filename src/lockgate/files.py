"""Task files in and result files out.

In: task JSONL (the six meta-fields per line) and the OpenAI Batch API input format
(``custom_id``, ``method``, ``url``, ``body``). A file is validated whole before any of
its tasks is submitted (:func:`check_file`): with bad lines nothing is submitted unless
``skip_invalid`` is given, and then the rejects go to a file with their line numbers and
reasons. A streamed submit (:func:`read_tasks`) writes as it reads, and stops at its
first bad line instead.

Out: JSONL, CSV and the OpenAI Batch API output format.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import hashlib
import io
import json
import logging
import marshal
import os
import re
import shlex
import stat
import tempfile
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal, TextIO

import orjson

from lockgate.errors import LockgateError, SpecError, cannot, not_utf8
from lockgate.results import ReviewItem, TaskResult, iso
from lockgate.runtime import check_delivery_rule, check_template
from lockgate.spec import (
    MAX_INPUT_BYTES,
    MAX_TASK_ID,
    RESERVED_ID_PREFIX,
    RESERVED_REQUEST_FIELDS,
    ModelConfig,
    TaskSpec,
    canonical_json,
    check_model_keys,
    check_storable,
    nonfinite_field,
    parse_task,
    registry_reference,
)
from lockgate.store.store import new_task
from lockgate.store.types import ConfigRow, NewTask
from lockgate.taskids import TaskIds, shown

log = logging.getLogger("lockgate.submit")

Format = Literal["tasks", "openai-batch"]
MAX_SHOWN = 20


def _escape(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


def from_openai_batch(obj: Any, line: int | None = None,
                      max_input_bytes: int = MAX_INPUT_BYTES) -> TaskSpec:
    """Turn one OpenAI Batch API request line into a task (messages taken literally)."""
    task = openai_batch_task(obj, line)
    try:
        return parse_task(task, line=line, max_input_bytes=max_input_bytes)
    except SpecError as exc:
        raise batch_error(exc) from None


#: Where the fields of a task made of an OpenAI batch line (:func:`openai_batch_task`)
#: came from in the line, longest prefix first: an error names the line's own field.
_BATCH_FIELDS = (
    ("model_config.provider_params.response_format", "body.response_format"),
    ("model_config.response_format", "body.response_format"),
    ("model_config.name", "body.model"),
    ("model_config", "body"),
    ("prompt_template", "body.messages"),
    ("delivery_rule.schema", "body.response_format.json_schema.schema"),
    ("delivery_rule", "body.response_format"),
    ("task_id", "custom_id"),
)
_QUOTED_FIELD = re.compile(r"'((?:model_config|prompt_template|delivery_rule|task_id)"
                           r"[^']*)'")


def batch_field(path: str) -> str:
    """A task's field path (``model_config.temperature``) as the OpenAI batch line
    that made the task names it (``body.temperature``)."""
    for inner, outer in _BATCH_FIELDS:
        if path == inner or path.startswith((inner + ".", inner + "[")):
            return outer + path[len(inner):]
    return path


def batch_error(exc: SpecError) -> SpecError:
    """An error about a task made of an OpenAI batch line, naming the line's fields
    (``custom_id``, ``body.temperature``, ``body.messages[1].role``), not the task's."""
    reason = _QUOTED_FIELD.sub(lambda m: f"'{batch_field(m.group(1))}'", exc.reason)
    reason = reason.replace("model_config.provider_params", "body.provider_params")
    return type(exc)(reason, field=batch_field(exc.field) if exc.field else None,
                     line=exc.line)


def openai_batch_task(obj: Any, line: int | None = None) -> dict[str, Any]:
    """One OpenAI Batch API request line as a task mapping (the six meta-fields)."""
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
    model: dict[str, Any] = {"name": body.get("model") or "", **params}
    rule = _response_format(model, line)
    return {
        "task_id": obj["custom_id"], "prompt_template": template, "input_data": {},
        "model_config": model, "delivery_rule": rule, "retry_policy": {},
    }


def _response_format(model: dict[str, Any], line: int | None) -> dict[str, Any]:
    """Move a line's ``response_format`` into its model config (``model``, in place),
    where it is sent to the provider, and return the delivery rule it calls for.

    ``json_object`` is the model config's own ``response_format``; a ``json_schema``
    one is kept as given under ``provider_params`` (sent verbatim), and its ``schema``
    becomes the delivery rule's; ``text`` is the default. Anything else is refused
    rather than dropped."""
    rf = model.pop("response_format", None)
    if rf is None:
        return {"format": "text"}
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind == "text":
        return {"format": "text"}
    if kind == "json_object":
        model["response_format"] = "json_object"
        return {"format": "json"}
    if kind != "json_schema":
        raise SpecError('must be {"type": "json_object"}, {"type": "json_schema", '
                        '"json_schema": {...}} or {"type": "text"}',
                        field="body.response_format", line=line)
    js = rf.get("json_schema")
    if not isinstance(js, dict):
        raise SpecError('must be an object ({"name": ..., "schema": {...}}) with type '
                        "json_schema", field="body.response_format.json_schema", line=line)
    schema = js.get("schema")
    if schema is not None and not isinstance(schema, dict):
        raise SpecError("must be a JSON Schema object",
                        field="body.response_format.json_schema.schema", line=line)
    extra = model.get("provider_params")
    if extra is not None and not isinstance(extra, dict):
        raise SpecError("must be a JSON object", field="body.provider_params", line=line)
    model["provider_params"] = {**(extra or {}), "response_format": rf}
    return {"format": "json"} if schema is None else {"format": "json", "schema": schema}


#: A line's digits and minus signs as "0", every other byte as a space: a run of 20
#: zeros then marks where an integer orjson cannot read exactly may be (beyond 64 bits,
#: which it reads as a float: 20 digits, or a minus sign and 19). A translation and a
#: find cost about a microsecond a line; a regular expression, several.
_DIGIT_RUNS = bytes(48 if chr(b) in "-0123456789" else 32 for b in range(256))
_LONG_RUN = b"0" * 20
_INT_MIN, _INT_MAX = -(2**63), 2**64 - 1


class _BigInt(str):
    """An integer literal too long to be worth converting (the stdlib's second read)."""


def _int_or_big(text: str) -> int | _BigInt:
    return int(text) if len(text) <= 24 else _BigInt(text)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads_line(raw: bytes, line: int) -> Any:
    """One line of a task file as JSON; :class:`SpecError` naming the line (and the
    field) when it is not JSON, or when it holds an integer beyond 64 bits, which
    orjson would read as a float (the stdlib reads such a line again to find it)."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as bad:  # orjson's words for it name no byte
            raise SpecError(not_utf8(raw, bad, of_line=True), line=line) from None
        if "surrogate" not in str(exc):
            raise SpecError(f"not valid JSON ({exc})", line=line) from None
        # A lone surrogate escape ("\ud800"), which orjson refuses: the stdlib reads
        # it, and the input's is replaced by "?" as a dict given to submit has it.
        try:
            obj = json.loads(text, parse_constant=_no_constant)
        except ValueError:
            raise SpecError(f"not valid JSON ({exc})", line=line) from None
    where = big_int_field(raw)
    if where is not None:
        raise SpecError("holds an integer beyond 64 bits, which would be read as a "
                        "float and lose digits: write it as a string",
                        field=where or None, line=line)
    return obj


def big_int_field(raw: bytes) -> str | None:
    """In valid JSON text, the path of the first integer beyond 64 bits, which orjson
    reads as a float ("" for the text itself); None when there is none (most texts:
    one translation and a find tell)."""
    if raw.translate(_DIGIT_RUNS).find(_LONG_RUN) < 0:
        return None
    try:
        exact = json.loads(raw, parse_int=_int_or_big)
    except (ValueError, RecursionError):  # nested past what a task may be: refused
        return None
    return _big_int_field(exact)


def _big_int_field(value: Any) -> str | None:
    """The path (``input_data.n[1].x``) of the first integer beyond 64 bits, in the
    order of the text; None when there is none ("" for the line itself)."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        v, path = stack.pop()
        if type(v) is dict:
            stack.extend((x, f"{path}.{k}" if path else str(k))
                         for k, x in reversed(v.items()))
        elif type(v) is list:
            stack.extend((v[i], f"{path}[{i}]") for i in range(len(v) - 1, -1, -1))
        elif type(v) is _BigInt or (type(v) is int and not _INT_MIN <= v <= _INT_MAX):
            return path
    return None


@dataclass(frozen=True)
class Checks:
    """What a submit checks beyond the task schema, set by the configuration and the
    database: the modules whose pydantic models a rule may name, and the largest input
    the database can store (which bounds a task's metadata and each part of its config
    too)."""

    model_modules: tuple[str, ...] = ()
    max_input_bytes: int = MAX_INPUT_BYTES
    #: What is wrong with a registry reference (``NAME``, ``NAME@label``, ``NAME@3``),
    #: or None when it names a version; None: references are not checked.
    reference_problem: Callable[[str], str | None] | None = None


def validate_line(raw: bytes, line: int, fmt: Format, checks: Checks = Checks()) -> TaskSpec:
    """Parse and fully check one line (JSON, fields, placeholders against the input)."""
    obj = loads_line(raw, line)
    spec = (from_openai_batch(obj, line, checks.max_input_bytes) if fmt == "openai-batch"
            else parse_task(obj, line, max_input_bytes=checks.max_input_bytes))
    try:
        check_spec(spec, checks)
    except SpecError as exc:
        raise (batch_error(exc) if fmt == "openai-batch" else exc).at_line(line) from None
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
    # The other large fields of a task have the input's bound: a row the database
    # cannot take in one statement (MySQL/MariaDB: max_allowed_packet) would end the
    # connection mid-submit, and every run of the submit again.
    if spec.metadata is not None:
        _check_size(canonical_json(spec.metadata), "metadata", checks.max_input_bytes)
    for name, part in spec.config_document().items():
        _check_size(canonical_json(part), name, checks.max_input_bytes)


def _check_size(encoded: bytes | str, field: str, limit: int) -> None:
    if len(encoded) > limit:
        raise SpecError(f"is {len(encoded):,} bytes as JSON; this database takes at most "
                        f"{limit:,} per field of a task (split it, or store it elsewhere "
                        "and pass a reference)", field=field)


#: The keys of a task line that make up its config (content-addressed, checked once).
_CONFIG_KEYS = ("prompt_template", "model_config", "delivery_rule", "retry_policy")
#: Every key a task line may have, as a submit's fast path knows them.
_LINE_KEYS = frozenset({*_CONFIG_KEYS, "task_id", "input_data", "batch_id", "priority",
                        "metadata"})
#: Distinct configs (and input key lists per config) an intake remembers; past that it
#: starts again, so that its memory stays bounded whatever the file.
_REMEMBERED = 10_000


@dataclass(slots=True)
class _Config:
    """A config that passed every check, as its tasks are written."""

    row: ConfigRow
    pool: str
    #: Input key lists (in order) that passed the template's placeholder check.
    inputs: set[tuple[str, ...]]


def batch_id_problem(value: str) -> str | None:
    """What is wrong with ``value`` as a batch id, or None: the checks a line's own
    ``batch_id`` gets (:class:`TaskSpec`: 1 to 191 printable characters, no leading or
    trailing whitespace, not the release gate's ``gate:``), for a batch named apart from
    the lines (``--batch``, or a task file's name)."""
    if not value:
        return "must not be empty"
    if len(value) > MAX_TASK_ID:
        return f"should have at most {MAX_TASK_ID} characters (it has {len(value):,})"
    try:
        TaskSpec._printable(value)  # the field's own check, with its words
    except ValueError as exc:
        return str(exc)
    return None


def file_batch(path: Path, batch_id: str | None) -> str:
    """The batch a file's tasks go to unless a line names its own: ``batch_id`` (the
    submit's ``--batch``) when given, else the file's name without its extension; each
    checked as a line's ``batch_id`` is (:func:`batch_id_problem`), so that a batch id
    the database would cut (MariaDB) or refuse in its own words (PostgreSQL) is refused
    here, naming where it came from, before anything is written."""
    if batch_id is not None:
        problem = batch_id_problem(batch_id)
        if problem is not None:
            raise SpecError(f"--batch {shown(batch_id)}: {problem}")
        return batch_id
    if os.path.abspath(path).startswith(("/dev/", "/proc/")):
        # A name the system gave (``<(...)`` is /dev/fd/63, /dev/stdin): a batch named
        # "63" or "stdin" says nothing, and the next pipe would get the same one.
        raise SpecError(f"{path} is a pipe or a device, whose name makes no batch id; "
                        "name the batch with --batch NAME")
    problem = batch_id_problem(path.stem)
    if problem is not None:
        raise SpecError(f"the file name {shown(path.name)} makes a bad batch id "
                        f"({shown(path.stem)}: {problem}); name the batch with --batch")
    return path.stem


def _plain_id(v: str) -> bool:
    """What ``TaskSpec`` accepts as a task or batch id (the fast path's check)."""
    return (0 < len(v) <= MAX_TASK_ID and v.isprintable() and v == v.strip()
            and not v.startswith(RESERVED_ID_PREFIX))


class Intake:
    """Task lines, mappings or specs checked and turned into the rows a submit writes.

    Every check of :func:`parse_task` and :func:`check_spec` applies, but each distinct
    config (template, model config, delivery rule, retry policy: the part tasks share)
    is validated, checked and hashed once: the first task that carries it takes the
    full path, and the tasks after it are checked for their own fields only (id,
    input, batch, priority, metadata, placeholders against the input's keys). A task
    the fast path is not sure of (an unusual type, an unknown key, input keys it has
    not seen with that config) takes the full path, so an error reads the same either
    way."""

    def __init__(self, checks: Checks = Checks(),
                 pool_of: Callable[[TaskSpec], str] | None = None) -> None:
        self.checks = checks
        self.pool_of = pool_of
        self._configs: dict[bytes, _Config] = {}
        self._rows: dict[str, ConfigRow] = {}
        self._batches: set[str] = set()  # batch ids that passed

    def line(self, raw: bytes, line: int, fmt: Format = "tasks") -> NewTask:
        """One line of a task file (JSON) as a row; :class:`SpecError` naming the line
        and the field if it is bad."""
        obj = loads_line(raw, line)
        if fmt == "openai-batch":
            obj = openai_batch_task(obj, line)
            try:
                return self.mapping(obj, line)
            except SpecError as exc:  # named as the line names its fields
                raise batch_error(exc) from None
        return self.mapping(obj, line)

    def task(self, task: TaskSpec | dict[str, Any], line: int | None = None) -> NewTask:
        """A task given as a spec or a mapping, as a row."""
        if isinstance(task, TaskSpec):
            try:
                check_storable(task)
                check_spec(task, self.checks)
            except SpecError as exc:
                raise exc.at_line(line) from None
            return self._row(task)
        return self.mapping(task, line)

    def mapping(self, obj: Any, line: int | None = None) -> NewTask:
        """A task mapping (a parsed task line) as a row."""
        key: bytes | None = None
        if type(obj) is dict and obj.keys() <= _LINE_KEYS:
            try:
                key = orjson.dumps({k: obj[k] for k in _CONFIG_KEYS if k in obj})
            except (TypeError, orjson.JSONEncodeError):
                key = None  # values orjson cannot write: the full path says what
            cfg = self._configs.get(key) if key is not None else None
            if cfg is not None:
                row = self._fast(obj, cfg)
                if row is not None:
                    return row
        spec = parse_task(obj, line, max_input_bytes=self.checks.max_input_bytes)
        try:
            check_storable(spec)  # a mapping built in Python can hold what JSON cannot
            check_spec(spec, self.checks)
        except SpecError as exc:
            raise exc.at_line(line) from None
        row = self._row(spec)
        if key is not None:
            if len(self._configs) >= _REMEMBERED:
                self._configs.clear()
            cfg = self._configs.setdefault(key, _Config(row.config, row.pool, set()))
            if len(cfg.inputs) < _REMEMBERED:
                cfg.inputs.add(tuple(obj["input_data"]))
        return row

    def _fast(self, obj: dict[str, Any], cfg: _Config) -> NewTask | None:
        """A task of a config already checked, as a row; None if unsure."""
        tid = obj.get("task_id")
        data = obj.get("input_data")
        if type(tid) is not str or type(data) is not dict or not 0 < len(tid) <= MAX_TASK_ID \
                or not tid.isprintable() or tid != tid.strip() \
                or tid.startswith(RESERVED_ID_PREFIX) or tuple(data) not in cfg.inputs:
            return None
        batch = obj.get("batch_id")
        if batch is not None and (type(batch) is not str or batch not in self._batches):
            if type(batch) is not str or not _plain_id(batch):
                return None  # (a list or an object: the full path names the field)
            if len(self._batches) >= _REMEMBERED:
                self._batches.clear()
            self._batches.add(batch)
        priority = obj.get("priority", 0)
        if type(priority) is not int or not -1000 <= priority <= 1000:
            return None
        meta = obj.get("metadata")
        if meta is not None and type(meta) is not dict:
            return None
        try:
            raw = orjson.dumps(data)
            meta_json = None if meta is None else orjson.dumps(meta).decode()
        except (TypeError, orjson.JSONEncodeError):
            return None
        if len(raw) > self.checks.max_input_bytes or (
                meta_json is not None and len(meta_json) > self.checks.max_input_bytes):
            return None
        # A NaN or an infinity (a mapping built in Python) is written as null: the
        # full path refuses it, naming the field.
        if (b"null" in raw and nonfinite_field(data) is not None) or (
                meta_json is not None and "null" in meta_json
                and nonfinite_field(meta) is not None):
            return None
        return NewTask(tid, batch, cfg.row, raw.decode(), meta_json, priority, cfg.pool)

    def _row(self, spec: TaskSpec) -> NewTask:
        """A checked spec as a row (its config row shared with earlier tasks')."""
        try:
            row = new_task(spec, self.pool_of(spec) if self.pool_of else "default")
        except (TypeError, orjson.JSONEncodeError) as exc:
            raise SpecError(f"cannot be encoded as JSON: {exc}", field="metadata") from None
        if spec.metadata is not None and row.metadata_json is None:
            row = row._replace(metadata_json="{}")  # an empty object stays one
        known = self._rows.get(row.config.hash)
        if known is None:
            if len(self._rows) >= _REMEMBERED:
                self._rows.clear()
            self._rows[row.config.hash] = row.config
        elif known is not row.config:
            row = row._replace(config=known)
        return row


def rereadable(path: Path) -> bool:
    """Whether ``path`` can be read a second time from its start: a regular file (or
    what cannot be looked at: opening it says why). A pipe, a FIFO, ``/dev/stdin`` on a
    pipe or a process substitution (``<(...)``) gives its lines once."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return True


def _lines(path: Path) -> Generator[tuple[int, bytes], None, None]:
    """The file's non-blank lines, numbered. The file is opened by this call, not when
    the lines are first asked for: a missing file, a folder or a file that cannot be
    read is refused before a submit writes anything (a batch row too)."""
    if not path.exists():
        if str(path) == "-":  # the usual name of standard input elsewhere
            raise LockgateError(
                "file - does not exist: '-' is not read as standard input; give "
                "/dev/stdin and name the batch, e.g. zcat tasks.jsonl.gz | lockgate "
                "submit /dev/stdin --batch nightly")
        raise LockgateError(f"file {path} does not exist")
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise cannot("read", path, exc) from None
    lines = _numbered(fh, path)
    # Inside its with block: the file is closed however the lines end. The first line
    # is read and looked at here: a file that is no JSON Lines text is refused whole.
    next(lines)
    return lines


#: Byte order marks of text that is not UTF-8 (UTF-32's before UTF-16's: they start
#: alike).
_OTHER_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
               (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16"))
#: The largest file read whole to tell whether it is one JSON document.
_DOCUMENT_BYTES = 256 << 20


def not_jsonl(path: Path, first: bytes) -> str | None:
    """Why a file whose first line is ``first`` is no JSON Lines text at all (gzip,
    UTF-16 or UTF-32 text, one JSON document spread over lines), with the fix; None
    when it may be (each line is then checked on its own)."""
    if first.startswith(b"\x1f\x8b"):
        return (f"{path} is gzip-compressed (line 1 starts with the bytes 1f 8b), not JSON "
                f"Lines text: decompress it first (gunzip), or submit <(zcat {path}) with "
                "--batch NAME")
    for bom, name in _OTHER_BOMS:
        if first.startswith(bom):
            return (f"{path} is {name} text (line 1 starts with the byte order mark "
                    f"{bom.hex(' ')}), not UTF-8: save it as UTF-8 (iconv -f {name} -t "
                    "UTF-8)")
    if len(first) > 1 and b"\x00" in first[:2] and first.strip(b"\x00\r\n"):
        return (f"{path} looks like UTF-16 text (line 1 has a NUL byte beside each "
                "character), not UTF-8: save it as UTF-8 (iconv -f UTF-16 -t UTF-8)")
    return _one_document(path, first.removeprefix(codecs.BOM_UTF8).strip())


def _one_document(path: Path, first: bytes) -> str | None:
    """Why a file is refused when it is one JSON document (a pretty-printed array or
    object) rather than one task per line; None when it is not, or cannot be told (a
    pipe, read once; a file over 256 MB)."""
    if not first.startswith((b"[", b"{")):
        return None
    if first.startswith(b"{"):
        try:
            orjson.loads(first)
            return None  # a task line
        except orjson.JSONDecodeError:
            pass
    try:
        if not stat.S_ISREG(os.stat(path).st_mode) or os.path.getsize(path) > _DOCUMENT_BYTES:
            return None
        data = path.read_bytes()
        doc = orjson.loads(data.removeprefix(codecs.BOM_UTF8))
    except (OSError, orjson.JSONDecodeError):
        return None
    jsonl, src = shlex.quote(str(_converted(path))), shlex.quote(str(path))
    last = data.rstrip().count(b"\n") + 1
    span = f"line 1 to {last:,}" if last > 1 else "line 1"
    if isinstance(doc, list):
        return (f"{path} is one JSON document (an array of {len(doc):,} item(s), {span}), "
                "not JSON Lines: a task file holds one JSON object per line. Convert it "
                f"with jq -c '.[]' {src} > {jsonl}")
    if isinstance(doc, dict):  # its first line is not a whole object: spread over lines
        return (f"{path} is one JSON object spread over {span}, not JSON Lines: a task "
                f"file holds one JSON object per line. Convert it with jq -c . {src} > "
                f"{jsonl}")
    return None


def _converted(path: Path) -> Path:
    """Where a suggested conversion of ``path`` writes: beside it, never onto it (a
    shell empties the output before the command reads its input)."""
    out = path.with_suffix(".jsonl")
    if out.name == path.name:
        out = path.with_name(f"{path.stem}.lines.jsonl")
    return out


def _numbered(fh: BinaryIO, path: Path) -> Generator[tuple[int, bytes], None, None]:
    with fh:
        first = fh.readline()
        problem = not_jsonl(path, first)
        if problem is not None:
            raise SpecError(problem)
        yield 0, b""  # taken by _lines
        # A byte order mark some tools put at the start (PowerShell, Excel): not the line's.
        first = first.removeprefix(codecs.BOM_UTF8)
        if first and not first.isspace():  # (strip() would copy every line)
            yield 1, first
        for n, raw in enumerate(fh, start=2):
            if raw and not raw.isspace():
                yield n, raw


@dataclass
class FileCheck:
    """The result of validating a whole file."""

    valid: int
    rejected: list[tuple[int, SpecError]]


class Spool:
    """The rows of a file's checking pass, kept on disk for its write pass, so the file
    is read and parsed once. Rows go to a temporary file in marshalled chunks (a config
    once per chunk), so memory stays flat in the file's size. The file is made in
    ``folder`` (the task file's own: a temporary folder may be memory, and the spool
    takes about as much room as the file's inputs and ids, less than the file) and
    deleted at once, so nothing is left behind however the process ends. A spool that
    cannot write (a read-only folder, a full disk) gives up quietly, and the write pass
    reads the file again; :attr:`problem` says why.

    A file that can be read only once (a pipe: see :func:`rereadable`) gets
    ``temp_fallback``: when its folder takes no file (``/dev/fd`` for ``<(...)``, a
    read-only folder), the spool is made in the temporary folder instead."""

    CHUNK = 5000

    def __init__(self, folder: Path | None = None, *, temp_fallback: bool = False) -> None:
        self._folder = folder
        self._temp_fallback = temp_fallback and folder is not None
        self._file: Any = None
        self._rows: list[tuple[Any, ...]] = []
        self._configs: dict[str, int] = {}  # a chunk's configs: hash -> number
        self._documents: list[tuple[str, str]] = []  # (hash, document) by number
        self.usable = True
        #: Why the spool gave up (None: it did not).
        self.problem: str | None = None

    def _open(self) -> Any:
        """The spool's temporary file: in its folder, else (``temp_fallback``) in the
        temporary folder."""
        try:
            # Kept open across calls; closed by close() (or the with block).
            return tempfile.TemporaryFile(
                prefix=".lockgate-submit-", dir=self._folder)
        except OSError as exc:
            if not self._temp_fallback:
                raise
            log.info("submit: cannot keep the checked rows in %s (%s); keeping them in "
                     "the temporary folder", self._folder, exc)
            return tempfile.TemporaryFile(prefix="lockgate-submit-")

    def add(self, row: NewTask) -> None:
        if not self.usable:
            return
        cfg = row.config
        at = self._configs.get(cfg.hash)
        if at is None:
            at = self._configs[cfg.hash] = len(self._documents)
            self._documents.append((cfg.hash, cfg.document))
        self._rows.append((row.task_id, row.batch_id, at, row.input_json,
                           row.metadata_json, row.priority, row.pool))
        if len(self._rows) >= self.CHUNK:
            self._flush()

    def _flush(self) -> None:
        if not self._rows:
            return
        try:
            if self._file is None:
                self._file = self._open()
            # Length-prefixed, read back by one read() and marshal.loads: marshal.load
            # on a file object reads each string of a chunk by its own method call (14
            # times slower).
            block = marshal.dumps((self._documents, self._rows))
            self._file.write(len(block).to_bytes(8, "little"))
            self._file.write(block)
        except (OSError, ValueError) as exc:
            log.info("submit: cannot keep the checked rows on disk (%s)", exc)
            self.problem = (f"{exc.strerror or exc}" if isinstance(exc, OSError)
                            else str(exc))
            self.usable = False
            self.close()
        self._rows = []
        self._configs = {}
        self._documents = []

    def finish(self) -> bool:
        """Write what is left; whether :meth:`rows` can give every row added."""
        self._flush()
        return self.usable

    def rows(self) -> Iterator[NewTask]:
        """The rows added, in order (once, after :meth:`finish` said yes)."""
        if not self.usable:
            raise LockgateError("the submit's spool is unusable: read the file again")
        if self._file is None:
            return
        self._file.seek(0)
        read = self._file.read
        new = tuple.__new__  # NewTask(...) costs twice as much a row
        while size := int.from_bytes(read(8), "little"):
            configs, rows = marshal.loads(read(size))
            cfgs = [ConfigRow(h, document) for h, document in configs]
            for tid, batch, at, data, meta, prio, pool in rows:
                yield new(NewTask, (tid, batch, cfgs[at], data, meta, prio, pool))

    def close(self) -> None:
        """Delete the spool's file (a temporary file: gone with the process too)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


#: What a line of each format calls its task id.
_ID_FIELD: dict[str, str] = {"tasks": "task_id", "openai-batch": "custom_id"}


def check_file(path: Path, fmt: Format, *, reject_sink: TextIO | None = None,
               progress: Callable[[int], None] | None = None,
               checks: Checks = Checks(), intake: Intake | None = None,
               spool: Spool | None = None) -> FileCheck:
    """Validate every line (streaming: nothing is kept but the rejects, and the valid
    rows in ``spool`` if given); keep the first errors, count them all. ``intake`` is
    the one the write pass uses after it (it then meets every config already
    checked)."""
    lines = _lines(path)  # opened (or refused) now
    intake = intake or Intake(checks)
    ids = TaskIds()
    valid = 0
    rejected: list[tuple[int, SpecError]] = []
    with contextlib.closing(lines):  # the file closed now, however the loop ends
        for n, raw in lines:
            try:
                row = intake.line(raw, n, fmt)
                ids.check(row, n, _ID_FIELD[fmt])
                valid += 1
                if spool is not None:
                    spool.add(row)
            except SpecError as exc:
                rejected.append((n, exc))
                if reject_sink is not None:
                    _write_reject(reject_sink, n, exc, raw)
            if progress and n % 1000 == 0:
                progress(n)
    return FileCheck(valid, rejected)


@dataclass
class Reading:
    """What a one-pass submit met while reading its file (see :func:`read_tasks`)."""

    valid: int = 0
    rejected: list[tuple[int, SpecError]] = field(default_factory=list)
    #: The bad line a ``stop`` read stopped at.
    stopped_at: int | None = None
    #: The batch ids the lines yielded name (None: the submit's own).
    batches: set[str | None] = field(default_factory=set)


def read_tasks(path: Path, fmt: Format, intake: Intake, reading: Reading, *,
               on_bad: Literal["stop", "skip"],
               reject_sink: TextIO | None = None) -> Generator[NewTask, None, None]:
    """One pass over a file: each line checked and yielded as a row as it is read, for
    a streamed submit that writes while it reads. A bad line is written to
    ``reject_sink`` and then, by ``on_bad``: ``skip`` passes it over; ``stop`` raises
    its :class:`SpecError` at once. The file is opened by this call: one that does not
    exist or cannot be read (a folder) is refused here, before the submit opens its
    batch."""
    return _read(_lines(path), fmt, intake, reading, on_bad, reject_sink)


def _read(lines: Generator[tuple[int, bytes], None, None], fmt: Format, intake: Intake,
          reading: Reading, on_bad: Literal["stop", "skip"],
          reject_sink: TextIO | None) -> Generator[NewTask, None, None]:
    ids = TaskIds()
    with contextlib.closing(lines):  # the file closed now, however the loop ends
        for n, raw in lines:
            try:
                row = intake.line(raw, n, fmt)
                ids.check(row, n, _ID_FIELD[fmt])
            except SpecError as exc:
                reading.rejected.append((n, exc))
                if reject_sink is not None:
                    _write_reject(reject_sink, n, exc, raw)
                if on_bad == "stop":
                    reading.stopped_at = n
                    raise
                continue
            reading.valid += 1
            if row.batch_id not in reading.batches and len(reading.batches) < _REMEMBERED:
                reading.batches.add(row.batch_id)
            yield row


def refusal(path: Path, valid: int, rejected: list[tuple[int, SpecError]]) -> str:
    """Why a file with bad lines was refused, and what to do."""
    return (f"{path}: {len(rejected)} bad line(s); nothing was submitted. Fix them, or "
            f"pass --skip-invalid to submit the {valid} good line(s):\n"
            + describe_rejects(rejected))


def _write_reject(sink: TextIO, n: int, exc: SpecError, raw: bytes) -> None:
    sink.write(orjson.dumps({
        "line": n, "field": exc.field, "error": str(exc),
        "raw": raw.decode("utf-8", "replace").rstrip("\n")}).decode() + "\n")


def valid_tasks(path: Path, fmt: Format, skip: set[int], intake: Intake) -> Iterator[NewTask]:
    """Second pass: the valid lines as rows (the file was checked already). A file that
    gives its lines once (a pipe) is refused: read again it would give nothing, and the
    submit would write nothing and say so as if it had succeeded."""
    if not rereadable(path):
        raise LockgateError(f"{path} is a pipe and cannot be read a second time; nothing "
                            "was submitted")
    return _valid(_lines(path), fmt, skip, intake)


def _valid(lines: Generator[tuple[int, bytes], None, None], fmt: Format, skip: set[int],
           intake: Intake) -> Iterator[NewTask]:
    with contextlib.closing(lines):  # the file closed now, however the loop ends
        for n, raw in lines:
            if n not in skip:
                yield intake.line(raw, n, fmt)


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


# -- tasks held for review (``lockgate export --review``) --------------------------------

def _json(value: Any) -> str:
    return "" if value is None else orjson.dumps(value).decode()


def write_review_jsonl(rows: Iterable[ReviewItem], out: TextIO) -> int:
    """One JSON object per task held for review (``ReviewItem.to_dict()``)."""
    n = 0
    for row in rows:
        out.write(orjson.dumps(row.to_dict()).decode() + "\n")
        n += 1
    return n


REVIEW_CSV_COLUMNS = ["task_id", "batch_id", "prompt", "held_at", "reason", "attempts",
                      "input", "messages", "last_output", "last_parse_status",
                      "last_error_class", "last_error_message", "output_schema",
                      "model_config"]


#: What a spreadsheet takes a cell starting with for a formula (or the start of one).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _cell(text: str | None) -> str:
    """A text cell of the review CSV as a spreadsheet may open it: one that starts like
    a formula (``=cmd|' /C calc'!A0``, from a model's output, say) gets a leading
    single quote, so it is shown as text and never run."""
    if not text:
        return ""
    return "'" + text if text.startswith(_FORMULA_START) else text


def write_review_csv(rows: Iterable[ReviewItem], out: TextIO) -> int:
    """CSV for a spreadsheet: JSON columns for the input, the prompt, the schema and the
    task's model config (the same fields as the JSONL export's).
    Text cells that start like a formula (=, +, -, @, tab, carriage return) are given a
    leading single quote (the JSON columns start with ``{``, ``[`` or ``"``); this CSV
    is for people, unlike :func:`write_csv`'s, which is an exact round trip."""
    w = csv.writer(out)
    w.writerow(REVIEW_CSV_COLUMNS)
    n = 0
    for row in rows:
        err = row.last_error
        w.writerow([_cell(row.task_id), _cell(row.batch_id), _cell(row.prompt),
                    iso(row.held_at) or "", _cell(row.reason), str(row.attempts),
                    _json(row.input),
                    _json(row.messages), _cell(row.last_output),
                    _cell(row.last_parse_status), _cell(err.error_class if err else None),
                    _cell(err.message if err else None), _json(row.output_schema),
                    _json(row.model_config)])
        n += 1
    return n


#: Model config fields that configure lockgate itself (runtime.sampling never sends
#: them), left out of an OpenAI batch request body.
_LOCAL_MODEL_FIELDS = frozenset({"endpoint", "timeout_ms", "max_input_tokens",
                                 "temperature_jitter", "tokenizer"})


def openai_batch_body(model: ModelConfig | dict[str, Any]) -> dict[str, Any]:
    """A model config as the ``body`` of an OpenAI batch request line carries it (the
    messages aside): ``model`` from its name, and the parameters a call sends (the
    declared ones, its extra keys, then ``provider_params`` as given), without the
    fields that configure lockgate itself. :func:`openai_batch_task` reads it back."""
    doc = model.model_dump(exclude_none=True) if isinstance(model, ModelConfig) \
        else dict(model)
    body: dict[str, Any] = {"model": doc.get("name")}
    for key, value in doc.items():
        if key in _LOCAL_MODEL_FIELDS or key in ("name", "provider_params") \
                or value is None:
            continue
        if key == "response_format" and isinstance(value, str):
            value = {"type": value}
        body[key] = value
    extra = doc.get("provider_params")
    if isinstance(extra, dict):
        body.update(extra)
    for key in RESERVED_REQUEST_FIELDS - {"model"}:
        body.pop(key, None)
    return body


def write_review_openai_batch(rows: Iterable[ReviewItem], out: TextIO) -> int:
    """The OpenAI Batch API *input* format (``custom_id``, ``method``, ``url``, ``body``
    with the rendered messages): the held prompts, to be answered elsewhere, or
    submitted again with ``--input-format openai-batch``. ``body`` carries the task's
    model and its parameters (:func:`openai_batch_body`) when the item has its model
    config (a ``model_config`` attribute)."""
    n = 0
    for row in rows:
        model = getattr(row, "model_config", None)
        body = openai_batch_body(model) if model is not None else {}
        body["messages"] = row.messages
        out.write(orjson.dumps({"custom_id": row.task_id, "method": "POST",
                                "url": "/v1/chat/completions",
                                "body": body}).decode() + "\n")
        n += 1
    return n


REVIEW_WRITERS: dict[str, Callable[[Iterable[ReviewItem], TextIO], int]] = {
    "jsonl": write_review_jsonl, "csv": write_review_csv,
    "openai-batch": write_review_openai_batch}
