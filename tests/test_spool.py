"""A checked-first submit parses its file once: the checking pass keeps the valid rows on
disk (:class:`lockgate.files.Spool`) and the write pass reads them back. The rows read
back must be exactly those a second reading of the file makes, whatever the file holds;
a spool that cannot write falls back to reading the file again."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lockgate.app import Lockgate
from lockgate.files import Intake, Spool, check_file, valid_tasks

TEXT = st.text(st.characters(codec="utf-8"), max_size=30)
LINE = st.fixed_dictionaries(
    {"input_data": st.dictionaries(st.sampled_from(["text", "x"]), TEXT, min_size=2),
     "model_config": st.fixed_dictionaries({"name": st.sampled_from(["m1", "m2", "m3"])})},
    optional={"batch_id": st.sampled_from(["a", "b", None]),
              "priority": st.integers(-1000, 1000),
              "metadata": st.dictionaries(st.text(max_size=5),
                                          st.integers(-2**63, 2**63 - 1) | TEXT, max_size=3),
              "bad": st.just(True)})


def _file(tmp: Path, lines: list[dict[str, Any]]) -> Path:
    path = tmp / "tasks.jsonl"
    with path.open("wb") as out:
        for i, line in enumerate(lines):
            obj = {"task_id": f"t{i}", "prompt_template": "{text} {x}",
                   "delivery_rule": {}, "retry_policy": {}, **line}
            if obj.pop("bad", False):
                obj["priority"] = "high"  # refused: not an integer
            out.write(orjson.dumps(obj) + b"\n")
            if i % 7 == 3:
                out.write(b"\n")  # blank lines are passed over
    return path


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(LINE, max_size=40), chunk=st.sampled_from([1, 3, 5000]))
def test_the_spooled_rows_are_the_rows_of_a_second_reading(
        tmp_path: Path, lines: list[dict[str, Any]], chunk: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Spool, "CHUNK", chunk)
    path = _file(tmp_path, lines)
    intake = Intake()
    with Spool() as spool:
        checked = check_file(path, "tasks", intake=intake, spool=spool)
        assert spool.finish()
        spooled = list(spool.rows())
    skip = {n for n, _ in checked.rejected}
    again = list(valid_tasks(path, "tasks", skip, intake))
    assert spooled == again
    assert len(spooled) == checked.valid == sum(1 for x in lines if not x.get("bad"))
    # The configs are whole: their documents, not only their hashes.
    assert [r.config.document for r in spooled] == [r.config.document for r in again]


def _tasks(path: Path, n: int) -> None:
    path.write_bytes(b"".join(orjson.dumps({
        "task_id": f"t{i}", "prompt_template": "{x}", "input_data": {"x": f"v{i}"},
        "model_config": {"name": "m"}, "delivery_rule": {}, "retry_policy": {},
        "metadata": {"i": i}}) + b"\n" for i in range(n)))


def test_a_checked_submit_writes_the_spooled_rows(db_url: str, tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    _tasks(path, 12_001)  # three chunks of the spool and a row
    with Lockgate(db_url) as lg:
        report = lg.submit_file(path, batch_id="b")
        assert report.inserted == 12_001
        assert lg.status().batches == {"b": {"PENDING": 12_001}}
        last = lg.task("t12000")
        assert (last.metadata, last.input_data) == ({"i": 12_000}, {"x": "v12000"})
        assert last.config["prompt_template"] == "{x}"


def test_without_room_for_the_spool_the_file_is_read_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tasks.jsonl"
    _tasks(path, 7000)
    with Spool(tmp_path / "no-such-dir") as spool:
        check_file(path, "tasks", intake=Intake(), spool=spool)
        assert not spool.finish()
    # The task file's folder is read-only: the submit reads the file twice instead.
    monkeypatch.setattr(tempfile, "TemporaryFile", _refused)
    with Lockgate(f"sqlite:///{tmp_path / 'lg.db'}") as lg:
        assert lg.submit_file(path, batch_id="b").inserted == 7000
        assert lg.status().batches == {"b": {"PENDING": 7000}}


def _refused(*_args: Any, **_kwargs: Any) -> Any:
    raise PermissionError(13, "Permission denied")


def test_the_spool_is_made_beside_the_task_file_and_leaves_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tasks.jsonl"
    _tasks(path, 10)
    folders: list[Any] = []
    made = tempfile.TemporaryFile

    def recorded(*args: Any, **kwargs: Any) -> Any:
        folders.append(kwargs.get("dir"))
        return made(*args, **kwargs)
    monkeypatch.setattr(tempfile, "TemporaryFile", recorded)
    with Lockgate(f"sqlite:///{tmp_path / 'lg.db'}") as lg:
        assert lg.submit_file(path, batch_id="b").inserted == 10
    assert folders == [tmp_path]
    assert sorted(p.name for p in tmp_path.iterdir() if "lockgate-submit" in p.name) == []
