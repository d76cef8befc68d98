"""`dataset add` names every bad line of a file (the first 20, and how many more), as a
task file's submit does: it named only the first, so a file with several mistakes took
one run per mistake. Nothing of such a file is added."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from lockgate.cli import app
from lockgate.errors import SpecError
from lockgate.registry.datasets import read_items

GOOD = '{"id": "%d", "input": {"t": "text %d"}, "expected": "yes"}'


def test_every_bad_jsonl_line_is_named(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_bytes(b"\n".join([
        (GOOD % (1, 1)).encode(),
        b'{"id": "2", "input": {"t": "x"}',  # cut
        (GOOD % (3, 3)).encode(),
        b'{"id": "4", "input": {"t": "x"}}',  # no expected
        b'{"id": "5", "input": {"t": "caf\xe9"}, "expected": "no"}',  # Latin-1
        b"[1, 2]",
    ]) + b"\n")
    with pytest.raises(SpecError) as err:
        read_items(f)
    text = str(err.value)
    assert text.startswith(f"{f}: 4 bad lines; nothing was added")
    for line, words in [(2, "not valid JSON"), (4, "field 'expected'"),
                        (5, "UTF-8"), (6, "expected a JSON object")]:
        assert f"line {line}" in text and words in text, (line, text)
    assert "line 1" not in text and "line 3" not in text


def test_past_twenty_bad_lines_the_rest_are_counted(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text("".join(f'{{"id": "{i}", "input": {{"t": "x"}}}}\n' for i in range(1, 26)))
    with pytest.raises(SpecError) as err:
        read_items(f)
    text = str(err.value)
    assert "25 bad lines" in text and "line 20," in text and "line 21," not in text
    assert text.rstrip().endswith("... and 5 more")


def test_one_bad_line_keeps_its_own_error(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text(GOOD % (1, 1) + "\n" + '{"id": "2", "input": {"t": "x"}}\n')
    with pytest.raises(SpecError) as err:
        read_items(f)
    assert (err.value.line, err.value.field) == (2, "expected")


def test_every_bad_csv_row_is_named_and_a_broken_quote_after_them_too(
        tmp_path: Path) -> None:
    f = tmp_path / "d.csv"
    f.write_text('id,text,label\n1,a,yes\n2,b\n3,c,no,extra\n4,d,yes\n5,"e,no\n')
    with pytest.raises(SpecError) as err:
        read_items(f)
    text = str(err.value)
    assert "3 bad lines" in text
    assert "line 3: 2 field(s)" in text and "line 4: 4 fields" in text
    assert "line 6: not valid CSV" in text


def test_the_command_adds_nothing_and_names_the_lines(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'lg.db'}"
    f = tmp_path / "d.jsonl"
    f.write_text(GOOD % (1, 1) + "\n{oops\n" + GOOD % (3, 3) + "\n[]\n")
    runner = CliRunner()
    out = runner.invoke(app, ["dataset", "add", "golden", str(f), "--db", db])
    assert out.exit_code != 0
    assert "2 bad lines" in out.output and "line 2" in out.output
    assert "line 4" in out.output
    shown = runner.invoke(app, ["dataset", "show", "golden", "--db", db])
    assert shown.exit_code != 0 and "golden" in shown.output
