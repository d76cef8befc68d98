"""Surrogates at submit: a pair in a Python str (``"\\ud83d\\ude00"``, as some JSON
decoders leave an emoji) and a lone one were refused with orjson's "str is not valid
UTF-8: surrogates not allowed", and a task file's ``\\ud800`` escape with "no low
surrogate in string"; docs/runtime.md says a pair is joined into its character and a
lone surrogate replaced by ``?``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import lockgate
from lockgate.errors import SpecError


def _task(tid: str, value: Any, **over: Any) -> dict[str, Any]:
    return {
        "task_id": tid,
        "prompt_template": "Say {a}",
        "input_data": {"a": value},
        "model_config": {"name": "m"},
        "delivery_rule": {"format": "text"},
        "retry_policy": {},
    } | over


def test_submit_joins_pairs_and_replaces_lone_surrogates(db_url: str) -> None:
    with lockgate.connect(db_url) as lg:
        report = lg.submit(
            [
                _task("p0", "\ud83d\ude00 pair"),
                _task("p1", "lone \ud800"),
                _task("p2", {"k\ud800": ["\ud83d\ude00", 1]}),
            ],
            batch_id="s",
        )
        assert report.inserted == 3
        assert lg.task("p0").input_data == {"a": "\U0001f600 pair"}
        assert lg.task("p1").input_data == {"a": "lone ?"}
        assert lg.task("p2").input_data == {"a": {"k?": ["\U0001f600", 1]}}


def test_a_lone_surrogate_elsewhere_is_refused_naming_the_field(db_url: str) -> None:
    with lockgate.connect(db_url) as lg:
        with pytest.raises(SpecError, match="lone surrogate") as err:
            lg.submit([_task("m0", "x", metadata={"note": "\ud800"})], batch_id="s")
        assert err.value.field == "metadata"


def test_a_file_with_surrogate_escapes_is_read(db_url: str, tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    lines = [
        '{"task_id":"f0","prompt_template":"Say {a}","input_data":{"a":"\\ud800 lone"},'
        '"model_config":{"name":"m"},"delivery_rule":{},"retry_policy":{}}',
        '{"task_id":"f1","prompt_template":"Say {a}","input_data":{"a":"\\ud83d\\ude00"},'
        '"model_config":{"name":"m"},"delivery_rule":{},"retry_policy":{}}',
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with lockgate.connect(db_url) as lg:
        assert lg.submit_file(path, batch_id="f").inserted == 2
        assert lg.task("f0").input_data == {"a": "? lone"}
        assert lg.task("f1").input_data == {"a": "\U0001f600"}


def test_a_file_with_a_lone_surrogate_in_the_template_names_line_and_field(
    db_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "tasks.jsonl"
    good = (
        '{"task_id":"g0","prompt_template":"Say {a}","input_data":{"a":"x"},'
        '"model_config":{"name":"m"},"delivery_rule":{},"retry_policy":{}}'
    )
    bad = (
        '{"task_id":"g1","prompt_template":"Say \\udc00 {a}","input_data":{"a":"x"},'
        '"model_config":{"name":"m"},"delivery_rule":{},"retry_policy":{}}'
    )
    path.write_text(good + "\n" + bad + "\n", encoding="utf-8")
    with lockgate.connect(db_url) as lg, pytest.raises(SpecError) as err:
        lg.submit_file(path, batch_id="g")
    text = str(err.value)
    assert "line 2" in text and "prompt_template" in text and "lone surrogate" in text, text
    assert "no low surrogate" not in text
