"""Task intake as a third review found it, checked without a database server: two lines
of one file with the same task id, task files that are not UTF-8 JSON Lines (Latin-1,
UTF-16, gzip, one pretty-printed JSON document), the OpenAI batch format's field
names in errors, NaN and infinities from the Python API, the size of a task's metadata
and config, a malformed registry reference, and a statement larger than MySQL's
``max_allowed_packet``. Each test failed before its fix."""

from __future__ import annotations

import codecs
import gzip
import io
import json
from pathlib import Path
from typing import Any

import orjson
import pymysql
import pytest
from pydantic import ValidationError
from sqlalchemy.exc import DBAPIError

from lockgate.errors import DatabaseUnavailable, SpecError, StoreError
from lockgate.files import Checks, Intake, Reading, check_file, read_tasks
from lockgate.spec import TaskSpec, check_storable, parse_task
from lockgate.store.failures import translate


def _task(i: int = 1, **over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "task_id": f"t{i}", "prompt_template": "Classify: {text}",
        "input_data": {"text": "hello"}, "model_config": {"name": "sim"},
        "delivery_rule": {"format": "text"}, "retry_policy": {"max_retries": 1}}
    return base | over


def _write(path: Path, *objs: dict[str, Any] | bytes) -> Path:
    path.write_bytes(b"".join((o if isinstance(o, bytes) else orjson.dumps(o)) + b"\n"
                              for o in objs))
    return path


# -- a batch id that is not text, after a line of the same config ----------------------


@pytest.mark.parametrize("batch", [[], ["a"], {"b": 1}])
def test_a_batch_id_that_is_a_list_or_an_object_is_refused_naming_it(
        tmp_path: Path, batch: Any) -> None:
    """Found by the fuzz: after a first line of the same config, such a line took the
    fast path and raised TypeError (unhashable type) out of the submit."""
    path = _write(tmp_path / "d.jsonl", _task(1), _task(2, batch_id=batch))
    checked = check_file(path, "tasks")
    assert checked.valid == 1
    [(n, exc)] = checked.rejected
    assert n == 2 and exc.field == "batch_id", exc


# -- two lines of one file with the same task id ----------------------------------------


def test_a_second_line_with_the_same_task_id_and_another_task_is_refused(
        tmp_path: Path) -> None:
    """It was submitted as "1 submitted, 1 already present (skipped)": the second
    line's input was silently dropped."""
    path = _write(tmp_path / "d.jsonl", _task(30), _task(2),
                  _task(30, input_data={"text": "DIFFERENT"}))
    sink = io.StringIO()
    checked = check_file(path, "tasks", reject_sink=sink)
    assert checked.valid == 2
    [(n, exc)] = checked.rejected
    assert n == 3 and exc.field == "task_id"
    assert "'t30' is also the task_id of line 1" in str(exc), exc
    assert str(exc).startswith("line 3, field 'task_id'")
    [reject] = [json.loads(x) for x in sink.getvalue().splitlines()]
    assert reject["line"] == 3 and "DIFFERENT" in reject["raw"]


def test_a_line_repeated_word_for_word_is_one_task_submitted_once(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.jsonl", _task(1), _task(1), _task(2))
    assert check_file(path, "tasks").rejected == []


@pytest.mark.parametrize("change", [{"metadata": {"a": 1}}, {"priority": 3},
                                    {"batch_id": "other"},
                                    {"model_config": {"name": "other"}}])
def test_any_other_difference_is_another_task(tmp_path: Path,
                                              change: dict[str, Any]) -> None:
    path = _write(tmp_path / "d.jsonl", _task(1), _task(1, **change))
    assert [n for n, _e in check_file(path, "tasks").rejected] == [2]


def test_a_streamed_read_stops_at_the_second_line_with_the_id(tmp_path: Path) -> None:
    path = _write(tmp_path / "d.jsonl", _task(1), _task(1, input_data={"text": "x"}))
    reading = Reading()
    rows = read_tasks(path, "tasks", Intake(), reading, on_bad="stop")
    with pytest.raises(SpecError, match="is also the task_id of line 1"):
        list(rows)
    assert reading.valid == 1 and reading.stopped_at == 2


def test_an_openai_batch_file_names_its_custom_id(tmp_path: Path) -> None:
    def line(content: str) -> dict[str, Any]:
        return {"custom_id": "r1", "body": {"model": "m", "messages": [
            {"role": "user", "content": content}]}}
    path = _write(tmp_path / "b.jsonl", line("a"), line("b"))
    [(_n, exc)] = check_file(path, "openai-batch").rejected
    assert exc.field == "custom_id" and "also the custom_id of line 1" in str(exc)


# -- files that are not UTF-8 JSON Lines --------------------------------------------------


def test_a_latin1_line_is_named_not_utf8_with_the_byte_and_the_fix(tmp_path: Path) -> None:
    """It said `not valid JSON (str is not valid UTF-8: surrogates not allowed: line 1
    column 1 (char 0))`."""
    raw = orjson.dumps(_task(1, input_data={"text": "café"})).decode()
    path = _write(tmp_path / "l1.jsonl", raw.encode("latin-1"))
    [(_n, exc)] = check_file(path, "tasks").rejected
    at = raw.encode("latin-1").index(b"\xe9")
    assert str(exc) == (f"line 1: not UTF-8 text (byte 0xe9 at byte offset {at} of the "
                        "line): save the file as UTF-8 (from Latin-1 or Windows-1252: "
                        "iconv -f cp1252 -t utf-8)")


@pytest.mark.parametrize("encoding, words", [
    ("utf-16", "is UTF-16 text (line 1 starts with the byte order mark ff fe), not UTF-8"),
    ("utf-16-le", "looks like UTF-16 text"),
    ("utf-16-be", "looks like UTF-16 text"),
    ("utf-32", "is UTF-32 text"),
])
def test_a_utf16_file_is_refused_whole_in_one_line(tmp_path: Path, encoding: str,
                                                   words: str) -> None:
    text = "\n".join(orjson.dumps(_task(i)).decode() for i in range(3)) + "\n"
    path = tmp_path / "u.jsonl"
    path.write_bytes(text.encode(encoding))
    with pytest.raises(SpecError) as info:
        check_file(path, "tasks")
    assert words in str(info.value) and "save it as UTF-8" in str(info.value)


def test_a_gzip_file_is_refused_whole_saying_decompress_it(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(gzip.compress(orjson.dumps(_task(1)) + b"\n"))
    with pytest.raises(SpecError, match=r"is gzip-compressed .*decompress it first"):
        check_file(path, "tasks")
    with pytest.raises(SpecError, match="gzip"):
        list(read_tasks(path, "tasks", Intake(), Reading(), on_bad="skip"))


@pytest.mark.parametrize("doc, words", [
    ([_task(1), _task(2)], "one JSON document (an array of 2 item(s), line 1 to 34), "
                           "not JSON Lines"),
    (_task(1), "one JSON object spread over line 1 to 16, not JSON Lines"),
])
def test_a_pretty_printed_json_document_is_refused_with_the_conversion(
        tmp_path: Path, doc: Any, words: str) -> None:
    """It gave one `not valid JSON` per line (16 to 34 of them)."""
    path = tmp_path / "pretty.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    with pytest.raises(SpecError) as info:
        check_file(path, "tasks")
    assert words in str(info.value) and "jq -c" in str(info.value), info.value
    assert "\n" not in str(info.value)


def test_a_one_line_array_is_refused_with_the_conversion_too(tmp_path: Path) -> None:
    path = tmp_path / "arr.json"
    path.write_text(json.dumps([_task(1), _task(2)]) + "\n")
    with pytest.raises(SpecError, match=r"jq -c '\.\[\]'"):
        check_file(path, "tasks")


def test_jsonl_with_a_bom_and_a_broken_first_line_still_goes_line_by_line(
        tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(codecs.BOM_UTF8 + b'{"task_id": \n' + orjson.dumps(_task(2)) + b"\n")
    checked = check_file(path, "tasks")
    assert checked.valid == 1 and [n for n, _ in checked.rejected] == [1]


# -- the OpenAI batch format names its own fields ---------------------------------------


def _oab(**over: Any) -> dict[str, Any]:
    return {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}} | over


@pytest.mark.parametrize("line, field, words", [
    (_oab(custom_id=7), "custom_id", "valid string"),
    (_oab(body={"model": "m", "temperature": 5,
                "messages": [{"role": "user", "content": "hi"}]}),
     "body.temperature", "less than or equal to 2"),
    (_oab(body={"model": "m", "messages": [{"role": "user", "content": "hi"},
                                            {"role": "tool", "content": "x"}]}),
     "body.messages[1].role", "'system', 'user'"),
    (_oab(body={"model": "", "messages": [{"role": "user", "content": "hi"}]}),
     "body.model", "at least 1 character"),
    (_oab(body={"model": "m", "temprature": 1,
                "messages": [{"role": "user", "content": "hi"}]}),
     "body.temprature", "put it under body.provider_params"),
])
def test_openai_batch_errors_name_the_lines_own_fields(
        line: dict[str, Any], field: str, words: str) -> None:
    """They named lockgate's fields: 'task_id', 'model_config.temperature',
    'prompt_template[1].role'."""
    with pytest.raises(SpecError) as info:
        Intake().line(orjson.dumps(line), 4, "openai-batch")
    exc = info.value
    assert exc.field == field and words in str(exc), str(exc)
    assert str(exc).startswith(f"line 4, field '{field}'")
    for inner in ("task_id", "model_config", "prompt_template", "delivery_rule"):
        assert inner not in str(exc), str(exc)


def test_openai_batch_errors_name_every_field_of_the_line() -> None:
    line = _oab(custom_id="", body={"model": "m", "temperature": 5, "messages": [
        {"role": "tool", "content": "x"}]})
    with pytest.raises(SpecError) as info:
        Intake().line(orjson.dumps(line), 1, "openai-batch")
    text = str(info.value)
    assert "'body.temperature'" in text and "'body.messages[0].role'" in text, text
    assert "model_config" not in text and "prompt_template" not in text, text


# -- NaN and infinities from the Python API ---------------------------------------------


@pytest.mark.parametrize("over, field", [
    ({"input_data": {"text": float("nan")}}, "input_data.text"),
    ({"input_data": {"text": "x", "scores": [1.0, float("inf")]}}, "input_data.scores[1]"),
    ({"metadata": {"score": float("-inf")}}, "metadata.score"),
    ({"metadata": {"a": {"b": float("nan")}}}, "metadata.a.b"),
    ({"model_config": {"name": "sim", "provider_params": {"x": float("nan")}}},
     "model_config.provider_params.x"),
])
def test_nan_and_infinities_are_refused_naming_the_field(over: dict[str, Any],
                                                         field: str) -> None:
    """They were stored as null, silently."""
    task = _task(1, **over)
    for intake in (Intake(), _warm()):  # the full path, and a config already checked
        with pytest.raises(SpecError) as info:
            intake.task(dict(task), 1)
        assert info.value.field == field, str(info.value)
        assert "NaN or infinite" in str(info.value)


def _warm() -> Intake:
    intake = Intake()
    intake.task(_task(0), 1)
    return intake


def test_a_spec_with_nan_is_refused_too() -> None:
    spec = TaskSpec.model_validate(_task(1, metadata={"score": float("nan")}))
    with pytest.raises(SpecError, match=r"metadata\.score"):
        check_storable(spec)
    with pytest.raises(SpecError, match=r"input_data\.text"):
        parse_task(_task(1, input_data={"text": float("inf")}))
    # a null stays a null
    assert Intake().task(_task(1, input_data={"text": None}), 1).input_json == \
        '{"text":null}'


# -- metadata and the config are bounded as the input is -----------------------------------


def test_metadata_over_the_databases_bound_is_refused_naming_it() -> None:
    """Only the input was bounded: 20 MB of metadata on MariaDB gave `cannot reach
    the database ... MySQL server has gone away` at every run of the submit."""
    checks = Checks(max_input_bytes=1000)
    big = {"blob": "x" * 2000}
    for intake in (Intake(checks), _warm_with(checks)):
        with pytest.raises(SpecError) as info:
            intake.line(orjson.dumps(_task(1, metadata=big)), 3)
        assert info.value.field == "metadata"
        assert "at most 1,000 per field" in str(info.value), str(info.value)
        assert str(info.value).startswith("line 3, field 'metadata': is 2,")


def _warm_with(checks: Checks) -> Intake:
    intake = Intake(checks)
    intake.line(orjson.dumps(_task(0)), 1)
    return intake


def test_a_template_over_the_databases_bound_is_refused_naming_it() -> None:
    checks = Checks(max_input_bytes=1000)
    with pytest.raises(SpecError) as info:
        Intake(checks).line(orjson.dumps(_task(1, prompt_template="{text}" + "y" * 2000)), 1)
    assert info.value.field == "prompt_template" and "at most 1,000" in str(info.value)
    line = _oab(body={"model": "m", "messages": [{"role": "user", "content": "z" * 2000}]})
    with pytest.raises(SpecError) as info:
        Intake(checks).line(orjson.dumps(line), 1, "openai-batch")
    assert info.value.field == "body.messages"


# -- a malformed registry reference ------------------------------------------------------


@pytest.mark.parametrize("ref", ["@registry:cs@0", "@registry:cs@", "@registry:"])
def test_a_malformed_registry_reference_does_not_ask_for_a_model_config(ref: str) -> None:
    """It added "; also 'model_config' is required": a reference needs none."""
    line = {"task_id": "a", "prompt_template": ref, "input_data": {"text": "x"}}
    with pytest.raises(SpecError) as info:
        parse_task(line, 1)
    assert str(info.value) == ("line 1, field 'prompt_template': a registry reference is "
                               "@registry:NAME, @registry:NAME@LABEL or @registry:NAME@N")


def test_an_inline_template_still_needs_its_model_config() -> None:
    with pytest.raises(SpecError, match="field 'model_config': is required"):
        parse_task({k: v for k, v in _task(1).items() if k != "model_config"}, 1)
    with pytest.raises(ValidationError, match="Field required"):  # a spec built directly
        TaskSpec.model_validate({"task_id": "a", "prompt_template": "hi", "input_data": {}})


# -- a statement larger than max_allowed_packet is not "cannot reach" -----------------------


def _mysql_error(code: int, message: str) -> DBAPIError:
    return DBAPIError.instance(None, None, pymysql.err.OperationalError(code, message),
                               pymysql.err.Error, connection_invalidated=True)


def test_a_packet_too_large_is_refused_not_unreachable() -> None:
    error = translate(_mysql_error(1153, "Got a packet bigger than 'max_allowed_packet' "
                                         "bytes"), "mysql://root@db/x")
    assert not isinstance(error, DatabaseUnavailable) and not error.transient
    assert "cannot reach" not in str(error)
    assert "larger than its max_allowed_packet" in str(error), str(error)


def test_a_connection_reset_while_sending_names_max_allowed_packet() -> None:
    error = translate(_mysql_error(2006, "MySQL server has gone away (ConnectionResetError"
                                         "(104, 'Connection reset by peer'))"))
    assert isinstance(error, StoreError) and "max_allowed_packet" in str(error)
    plain = translate(_mysql_error(2003, "Can't connect to MySQL server"))
    assert "max_allowed_packet" not in str(plain)
