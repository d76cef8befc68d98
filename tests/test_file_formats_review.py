"""The file formats as a review found them wanting: an OpenAI batch line's json_schema
response_format, integers beyond 64 bits in a task file, the review export's
openai-batch lines (read back by ``submit``), formulas in the review CSV, and an empty
``metadata``."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from lockgate import Lockgate
from lockgate.config import Endpoint
from lockgate.errors import SpecError
from lockgate.files import (
    Intake,
    check_file,
    from_openai_batch,
    validate_line,
    write_csv,
    write_review_csv,
    write_review_openai_batch,
)
from lockgate.results import ReviewItem, TaskError, TaskResult
from lockgate.spec import load_config
from lockgate.worker.execute import provider_params

T0 = datetime(2026, 12, 3, 9, 12, 5, tzinfo=UTC)

SCHEMA = {"type": "object", "properties": {"label": {"type": "string"}},
          "required": ["label"], "additionalProperties": False}
JSON_SCHEMA_RF = {"type": "json_schema",
                  "json_schema": {"name": "l", "strict": True, "schema": SCHEMA}}


def _oab(custom_id: str = "req-1", **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "gpt-4o-mini",
                     "messages": [{"role": "system", "content": 'Reply JSON {"label": ...}'},
                                  {"role": "user", "content": "hello"}]} | body}


def _task(i: int = 1, **over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "task_id": f"t-{i}", "prompt_template": "n={n}", "input_data": {"n": i},
        "model_config": {"name": "m"}, "delivery_rule": {"format": "text"},
        "retry_policy": {}}
    return base | over


def _sent(row_document: str) -> dict[str, Any]:
    """The parameters a worker sends the provider for a stored config document."""
    config = load_config(orjson.loads(row_document))
    return provider_params(config, Endpoint(name="e", base_url="http://x/v1"), "w-1")


# -- 1. an OpenAI batch line's json_schema response_format ------------------------------

def test_a_json_schema_response_format_is_sent_as_given_and_json_is_delivered() -> None:
    line = _oab(response_format=JSON_SCHEMA_RF, max_tokens=50)
    row = Intake().line(orjson.dumps(line), 1, "openai-batch")
    assert _sent(row.config.document)["response_format"] == JSON_SCHEMA_RF
    spec = from_openai_batch(line, 1)
    assert spec.delivery_rule.format == "json"
    assert spec.delivery_rule.json_schema == SCHEMA
    # json_object keeps working as before; no response_format still delivers text.
    plain = Intake().line(orjson.dumps(_oab(response_format={"type": "json_object"})), 2,
                          "openai-batch")
    assert _sent(plain.config.document)["response_format"] == {"type": "json_object"}
    assert orjson.loads(plain.config.document)["delivery_rule"]["format"] == "json"
    assert from_openai_batch(_oab(), 3).delivery_rule.format == "text"
    assert from_openai_batch(_oab(response_format=None), 3).delivery_rule.format == "text"
    text = from_openai_batch(_oab(response_format={"type": "text"}), 3)
    assert text.delivery_rule.format == "text"


def test_a_json_schema_without_a_schema_delivers_json_without_one() -> None:
    rf = {"type": "json_schema", "json_schema": {"name": "free"}}
    spec = from_openai_batch(_oab(response_format=rf), 1)
    assert spec.delivery_rule.format == "json" and spec.delivery_rule.json_schema is None
    assert spec.model is not None and spec.model.provider_params["response_format"] == rf


@pytest.mark.parametrize(("rf", "field"), [
    ({"type": "json_schema"}, "body.response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"schema": [1]}},
     "body.response_format.json_schema.schema"),
    ({"type": "xml"}, "body.response_format"),
    ("json_object", "body.response_format"),
])
def test_a_response_format_that_cannot_be_kept_is_refused_by_name(rf: Any, field: str) -> None:
    with pytest.raises(SpecError) as err:
        Intake().line(orjson.dumps(_oab(response_format=rf)), 4, "openai-batch")
    assert err.value.field == field and err.value.line == 4


# -- 2. integers beyond 64 bits ---------------------------------------------------------

BIG = [
    (123456789012345678901234567890, "input_data.n"),
    (18446744073709551616, "input_data.n"),  # 2**64: one past what orjson reads
    (-9223372036854775809, "input_data.n"),  # one below -2**63
]


@pytest.mark.parametrize(("value", "field"), BIG, ids=lambda v: str(v)[:8])
def test_an_integer_beyond_64_bits_in_a_task_line_is_refused_not_made_a_float(
        value: int, field: str) -> None:
    raw = orjson.dumps(_task(1, input_data={"n": 0})).replace(
        b'"n":0', b'"n":' + str(value).encode())
    for parse in (lambda: Intake().line(raw, 7), lambda: validate_line(raw, 7, "tasks")):
        with pytest.raises(SpecError) as err:
            parse()
        assert err.value.field == field and err.value.line == 7
        assert "write it as a string" in str(err.value)


def test_big_integers_are_found_where_they_are_nested_and_on_the_fast_path() -> None:
    intake = Intake()
    intake.line(orjson.dumps(_task(1, metadata={"k": 1})), 1)  # the config is known now
    raw = (b'{"task_id": "t-2", "prompt_template": "n={n}", "input_data": {"n": '
           b'[1, {"deep": 99999999999999999999}]}, "model_config": {"name": "m"}, '
           b'"delivery_rule": {"format": "text"}, "retry_policy": {}, '
           b'"metadata": {"k": 1}}')
    with pytest.raises(SpecError) as err:
        intake.line(raw, 2)
    assert err.value.field == "input_data.n[1].deep" and err.value.line == 2
    meta = raw.replace(b"99999999999999999999", b"9").replace(
        b'"metadata": {"k": 1}', b'"metadata": {"k": 1' + b"0" * 25 + b"}")
    with pytest.raises(SpecError) as err:
        intake.line(meta, 3)
    assert err.value.field == "metadata.k"


def test_long_digit_runs_that_are_not_big_integers_pass() -> None:
    ok = [
        _task(1, input_data={"n": 18446744073709551615}),  # 2**64 - 1: orjson reads it
        _task(2, input_data={"n": -9223372036854775808}),  # -2**63
        _task(3, input_data={"n": "123456789012345678901234567890"}),
        _task(4, input_data={"n": 0.123456789012345678901234}),
        _task(5, input_data={"n": 1234567890123456789}),  # a 19-digit id
        _task(6, input_data={"n": ["2024-01-01-12-00-00-000", -1234567890123456789]}),
    ]
    intake = Intake()
    for i, obj in enumerate(ok, start=1):
        row = intake.line(orjson.dumps(obj), i)
        assert orjson.loads(row.input_json) == obj["input_data"]


def test_a_file_with_a_big_integer_is_refused_naming_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(orjson.dumps(_task(1)) + b"\n"
                     + b'{"task_id": "big", "prompt_template": "n={n}", "input_data": '
                       b'{"n": 123456789012345678901234567890}, "model_config": '
                       b'{"name": "m"}, "delivery_rule": {"format": "text"}, '
                       b'"retry_policy": {}}\n')
    got = check_file(path, "tasks")
    assert got.valid == 1 and [n for n, _e in got.rejected] == [2]
    err = got.rejected[0][1]
    assert err.field == "input_data.n" and "line 2" in str(err)


# -- 3. the review export's openai-batch lines are read back by submit ------------------

@dataclass(frozen=True, slots=True)
class _Held(ReviewItem):
    """A held task with the model config its call would have used."""

    model_config: Any = None


def _held(task_id: str, model: Any, **over: Any) -> _Held:
    base: dict[str, Any] = {
        "task_id": task_id, "batch_id": "b", "input": {"text": "x"}, "prompt": "p@1",
        "messages": [{"role": "system", "content": 'Answer {"label": yes|no}'},
                     {"role": "user", "content": "order {7}"}],
        "reason": "circuit open", "held_at": T0, "attempts": 1, "last_output": None,
        "last_parse_status": None, "last_error": None, "output_schema": None,
        "model_config": model}
    return _Held(**(base | over))


def test_review_openai_batch_lines_carry_the_model_and_read_back(tmp_path: Path) -> None:
    models = [
        {"name": "gpt-4o-mini", "temperature": 0.2, "max_tokens": 40, "seed": 7,
         "response_format": "json_object", "timeout_ms": 9000, "temperature_jitter": 0.1,
         "endpoint": "main", "logprobs": True,
         "provider_params": {"chat_template_kwargs": {"x": False}}},
        {"name": "m2", "provider_params": {"response_format": JSON_SCHEMA_RF}},
    ]
    buf = io.StringIO()
    write_review_openai_batch([_held("r-1", models[0]), _held("r-2", models[1])], buf)
    lines = [orjson.loads(x) for x in buf.getvalue().splitlines()]
    assert lines[0]["body"] == {
        "model": "gpt-4o-mini", "temperature": 0.2, "max_tokens": 40, "seed": 7,
        "response_format": {"type": "json_object"}, "logprobs": True,
        "chat_template_kwargs": {"x": False}, "messages": _held("r-1", None).messages}
    assert lines[1]["body"]["response_format"] == JSON_SCHEMA_RF

    path = tmp_path / "held.jsonl"
    path.write_text(buf.getvalue())
    check = check_file(path, "openai-batch")
    assert check.valid == 2 and not check.rejected
    specs = [from_openai_batch(line, n) for n, line in enumerate(lines, start=1)]
    assert [s.model.name for s in specs if s.model] == ["gpt-4o-mini", "m2"]
    # The messages come back literally (braces are not placeholders).
    intake = Intake()
    row = intake.line(orjson.dumps(lines[0]), 1, "openai-batch")
    assert _sent(row.config.document) == {
        "temperature": 0.2, "max_tokens": 40, "seed": 7,
        "response_format": {"type": "json_object"}, "logprobs": True,
        "chat_template_kwargs": {"x": False}}
    with Lockgate(f"sqlite:///{tmp_path / 'rt.db'}") as lg:
        report = lg.submit_file(path, format="openai-batch", batch_id="again")
        assert report.inserted == 2
        assert lg.task("r-2").config["delivery_rule"]["schema"] == SCHEMA


def test_openai_batch_body_takes_a_model_config_object_too() -> None:
    from lockgate.files import openai_batch_body

    spec = from_openai_batch(_oab(response_format={"type": "json_object"}, top_p=0.5), 1)
    assert spec.model is not None
    assert openai_batch_body(spec.model) == {
        "model": "gpt-4o-mini", "top_p": 0.5, "response_format": {"type": "json_object"}}


# -- 4. formulas in the review CSV ------------------------------------------------------

@pytest.mark.parametrize("text", ["=cmd|' /C calc'!A0", "+1+1", "-2+3", "@SUM(A1)",
                                  "\tx", "\rx"])
def test_review_csv_cells_that_a_spreadsheet_would_run_are_quoted(text: str) -> None:
    buf = io.StringIO()
    write_review_csv([_held(text, None, last_output=text, reason=text, batch_id=text,
                            last_error=TaskError(text, text))], buf)
    row = next(csv.DictReader(io.StringIO(buf.getvalue())))
    for col in ("task_id", "batch_id", "reason", "last_output", "last_error_class",
                "last_error_message"):
        assert row[col] == "'" + text, col
    assert orjson.loads(row["input"]) == {"text": "x"}  # JSON columns stay JSON


def test_the_main_csv_export_stays_an_exact_round_trip() -> None:
    text = "=cmd|' /C calc'!A0"
    row = TaskResult(task_id=text, batch_id="-b", status="SUCCEEDED", result=text,
                     parse_status="valid", error=None, attempts=1, created_at=T0,
                     finished_at=T0, usage=None, response=None)
    buf = io.StringIO()
    write_csv([row], buf)
    got = next(csv.DictReader(io.StringIO(buf.getvalue())))
    assert got["task_id"] == text and got["batch_id"] == "-b"
    assert orjson.loads(got["result"]) == text


# -- 5. an empty metadata object ----------------------------------------------------------

def test_empty_metadata_stays_an_empty_object(tmp_path: Path) -> None:
    intake = Intake()
    slow = intake.line(orjson.dumps(_task(1, metadata={})), 1)  # the full path
    fast = intake.line(orjson.dumps(_task(2, metadata={})), 2)  # a known config
    assert slow.metadata_json == "{}" and fast.metadata_json == "{}"
    none = intake.line(orjson.dumps(_task(3)), 3)
    assert none.metadata_json is None
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\n".join(orjson.dumps(_task(i, metadata={})) for i in (1, 2)))
    with Lockgate(f"sqlite:///{tmp_path / 'm.db'}") as lg:
        lg.submit_file(path, batch_id="m")
        lg.submit([_task(3, metadata={})], batch_id="api")
        assert [lg.task(f"t-{i}").metadata for i in (1, 2, 3)] == [{}, {}, {}]
        assert lg.task("t-1").metadata == {}
