"""The export writers on results built by hand: every shape of task, every format."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime

import orjson

from helpers import check_openai_batch_line
from lockgate.files import export_text
from lockgate.results import Response, TaskError, TaskResult, Usage

T0 = datetime(2026, 12, 3, 9, 12, 5, 123000, tzinfo=UTC)


def _row(task_id: str, status: str, **kw: object) -> TaskResult:
    base: dict[str, object] = {
        "task_id": task_id, "batch_id": "b", "status": status, "result": None,
        "parse_status": None, "error": None, "attempts": 1, "created_at": T0,
        "finished_at": T0, "usage": None, "response": None}
    return TaskResult(**{**base, **kw})  # type: ignore[arg-type]


ROWS = [
    _row("ok", "SUCCEEDED", result={"label": "yes"}, parse_status="valid",
         usage=Usage(12, 3, "m", 80.5),
         response=Response(200, "req_1", {"id": "chatcmpl-1", "object": "chat.completion",
                                          "created": 1, "model": "m", "choices": [
                                              {"index": 0, "finish_reason": "stop",
                                               "logprobs": None,
                                               "message": {"role": "assistant",
                                                           "content": '{"label":"yes"}'}}],
                                          "usage": {"prompt_tokens": 12,
                                                    "completion_tokens": 3,
                                                    "total_tokens": 15}})),
    _row("old", "SUCCEEDED", result={"label": "no"}, usage=Usage(5, 2, "m", 1.0)),
    _row("down", "DEAD", attempts=4,
         error=TaskError("connection_error", "ClientConnectorError: refused")),
    _row("never", "CANCELLED", attempts=0, finished_at=None,
         error=TaskError("cancelled", "cancelled by operator")),
]


def test_openai_batch_lines_for_every_shape() -> None:
    lines = {r["custom_id"]: r for r in map(orjson.loads,
                                            export_text(ROWS, "openai-batch").splitlines())}
    for line in lines.values():
        check_openai_batch_line(line)
    assert lines["ok"]["response"]["body"]["id"] == "chatcmpl-1"  # as returned
    rebuilt = lines["old"]["response"]["body"]  # no body kept: rebuilt from the result
    assert orjson.loads(rebuilt["choices"][0]["message"]["content"]) == {"label": "no"}
    assert lines["down"]["response"] is None
    assert lines["down"]["error"] == {"code": "connection_error",
                                      "message": "ClientConnectorError: refused"}
    assert lines["never"]["error"]["code"] == "cancelled"


def test_jsonl_and_csv_write_iso_utc_times_and_nested_errors() -> None:
    rows = [orjson.loads(x) for x in export_text(ROWS, "jsonl").splitlines()]
    assert rows[0]["created_at"] == "2026-12-03T09:12:05.123Z"
    assert rows[0]["result"] == {"label": "yes"} and rows[0]["error"] is None
    assert rows[2]["error"] == {"class": "connection_error",
                                "message": "ClientConnectorError: refused"}
    assert rows[3]["finished_at"] is None
    table = list(csv.DictReader(io.StringIO(export_text(ROWS, "csv"))))
    assert table[0]["finished_at"] == "2026-12-03T09:12:05.123Z"
    assert table[0]["input_tokens"] == "12" and table[0]["model"] == "m"
    assert table[2]["error_class"] == "connection_error" and table[2]["result"] == ""
