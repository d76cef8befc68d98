"""A UTF-8 byte order mark at the start of a file (PowerShell's and Excel's UTF-8, many
Windows editors) is not part of its first line: a task file, a dataset's JSONL and a
config file were refused at line 1 ("BOM is not supported", "Invalid statement")."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

import lockgate
from lockgate.cli import app
from lockgate.config import load_settings
from lockgate.registry.datasets import read_jsonl

BOM = b"\xef\xbb\xbf"


def _task(i: int) -> bytes:
    return orjson.dumps({"task_id": f"t{i}", "prompt_template": "Say {x}",
                         "input_data": {"x": i}, "model_config": {"name": "m"},
                         "delivery_rule": {"format": "text"}, "retry_policy": {}})


@pytest.mark.parametrize("stream", [False, True])
def test_a_task_file_with_a_byte_order_mark_is_submitted_whole(
        stream: bool, tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(BOM + b"\n".join(_task(i) for i in range(3)) + b"\n")
    url = f"sqlite:///{tmp_path / 'x.db'}"
    result = CliRunner().invoke(app, ["submit", str(path), "--db", url,
                                      *(["--stream"] if stream else [])])
    assert result.exit_code == 0, result.output
    with lockgate.connect(url) as lg:
        assert sorted(r.task_id for r in lg.results("tasks")) == ["t0", "t1", "t2"]


def test_a_bad_line_keeps_its_number_after_a_byte_order_mark(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(BOM + _task(0) + b"\n\n{oops\n")
    result = CliRunner().invoke(app, ["submit", str(path),
                                      "--db", f"sqlite:///{tmp_path / 'x.db'}"])
    assert result.exit_code == 2
    assert "1 bad line(s)" in result.output and "  line 3: not valid JSON" in result.output


def test_a_dataset_and_a_config_with_a_byte_order_mark_are_read(tmp_path: Path) -> None:
    data = tmp_path / "items.jsonl"
    data.write_bytes(BOM + b'{"id": "a", "input": {"text": "x"}, "expected": "yes"}\n')
    items = list(read_jsonl(data))
    assert [(i.key, i.line) for i in items] == [("a", 1)]
    cfg = tmp_path / "lockgate.toml"
    cfg.write_bytes(BOM + b"[worker]\nconcurrency = 7\n")
    assert load_settings(cfg).worker.concurrency == 7
