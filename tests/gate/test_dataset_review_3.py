"""Review 3 of `dataset add`: integers beyond 64 bits, CSV cells over 128 KiB, and the
values a file gave twice or under no name, which were dropped or misfiled silently."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lockgate.cli import app
from lockgate.errors import SpecError
from lockgate.registry.datasets import read_items

BIG = "123456789012345678901234567890"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# -- integers beyond 64 bits --------------------------------------------------------

@pytest.mark.parametrize("line, field", [
    ('{"id": "1", "input": {"n": %s}, "expected": 1}', "input.n"),
    ('{"id": "1", "input": {"t": "a"}, "expected": {"n": [1, %s]}}', "expected.n[1]"),
    ('{"id": "1", "n": %s, "label": "x"}', "n"),
    ('{"id": %s, "input": {"t": "a"}, "expected": 1}', "id"),
    ('{"id": "1", "input": {"t": "a"}, "expected": -%s}', "expected"),
])
def test_a_jsonl_integer_beyond_64_bits_is_refused_naming_line_and_field(
        tmp_path: Path, line: str, field: str) -> None:
    """``{"n": 123...890}`` and ``{"n": 123...891}`` were both stored as
    1.2345678901234568e+29, so distinct values became one."""
    f = write(tmp_path / "d.jsonl", '{"id": "0", "input": {"t": "ok"}, "expected": 1}\n'
                                    + line % BIG + "\n")
    with pytest.raises(SpecError, match="beyond 64 bits") as err:
        read_items(f)
    assert (err.value.line, err.value.field) == (2, field)
    assert "write it as a string" in str(err.value)


def test_64_bit_integers_and_big_integers_as_strings_are_kept_exactly(
        tmp_path: Path) -> None:
    f = write(tmp_path / "d.jsonl",
              '{"id": "1", "input": {"n": 9223372036854775807}, '
              '"expected": -9223372036854775808}\n'
              f'{{"id": "2", "input": {{"n": "{BIG}"}}, "expected": "{BIG}1"}}\n')
    items = read_items(f)
    assert items[0].input == {"n": 9223372036854775807}
    assert items[0].expected == -9223372036854775808
    assert (items[1].input, items[1].expected) == ({"n": BIG}, BIG + "1")


@pytest.mark.parametrize("header, cell, field", [
    ("expected", BIG, "expected"),
    ("expected", f'"{{""a"": [1, {BIG}]}}"', "expected.a[1]"),
    ("expected.n", BIG, "expected.n"),
    ("label", f'"[{BIG}]"', "label[0]"),
])
def test_a_csv_expected_cell_with_an_integer_beyond_64_bits_is_refused(
        tmp_path: Path, header: str, cell: str, field: str) -> None:
    f = write(tmp_path / "d.csv", f"id,t,{header}\n1,x,1\n2,y,{cell}\n")
    with pytest.raises(SpecError, match="beyond 64 bits") as err:
        read_items(f)
    assert (err.value.line, err.value.field) == (3, field)
    assert "JSON string" in str(err.value)


def test_a_big_integer_quoted_in_a_csv_cell_is_text(tmp_path: Path) -> None:
    f = write(tmp_path / "d.csv", f'id,t,expected\n1,{BIG},"""{BIG}"""\n')
    [item] = read_items(f)
    assert (item.input, item.expected) == ({"t": BIG}, BIG)  # input cells are text


def test_the_cli_refuses_a_big_integer_and_writes_nothing(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    f = write(tmp_path / "d.jsonl", f'{{"id": "1", "input": {{"n": {BIG}}}, '
                                    f'"expected": {{"n": {BIG}1}}}}\n')
    r = CliRunner().invoke(app, ["dataset", "add", "big", str(f), "--db", url])
    assert r.exit_code == 2, r.output
    assert "line 1, field 'input.n': holds an integer beyond 64 bits" in r.output
    shown = CliRunner().invoke(app, ["dataset", "show", "big", "--db", url])
    assert shown.exit_code == 2 and "no dataset 'big'" in shown.output


# -- CSV cells over the csv module's 128 KiB -------------------------------------------

@pytest.mark.parametrize("quoted", [False, True])
def test_a_csv_cell_over_128_kib_is_read(tmp_path: Path, quoted: bool) -> None:
    """It was refused as "field larger than field limit (131072): a quoted field must
    end with a closing quote", while an item may hold 8 MiB."""
    text = "x" * 200_000
    cell = f'"{text}"' if quoted else text
    f = write(tmp_path / "d.csv", f"id,text,expected\n1,{cell},y\n")
    before = csv.field_size_limit()
    [item] = read_items(f)
    assert item.input == {"text": text} and item.expected == "y"
    assert csv.field_size_limit() == before  # the process-wide limit is put back


def test_a_csv_cell_over_the_item_bound_is_refused_as_too_large(tmp_path: Path) -> None:
    f = write(tmp_path / "d.csv", "id,text,expected\n1,ok,y\n2," + "x" * (9 << 20) + ",y\n")
    before = csv.field_size_limit()
    with pytest.raises(SpecError) as err:
        read_items(f)
    assert err.value.line == 3
    assert "more than 8 MiB" in str(err.value), str(err.value)
    assert "field limit" not in str(err.value)
    assert csv.field_size_limit() == before


# -- values given twice, or under no name ----------------------------------------------

def test_a_line_with_both_expected_and_label_is_refused(tmp_path: Path) -> None:
    """``{"expected": 1, "label": 2}`` kept 1 and dropped 2 silently."""
    f = write(tmp_path / "d.jsonl", '{"id": "1", "input": {"t": "a"}, "expected": 1, '
                                    '"label": 2}\n')
    with pytest.raises(SpecError, match=r"'expected' and 'label'.*keep one") as err:
        read_items(f)
    assert (err.value.line, err.value.field) == (1, "label")


def test_a_csv_with_an_expected_column_and_expected_field_columns_is_refused(
        tmp_path: Path) -> None:
    """``id,t,expected,expected.a`` kept ``expected`` and dropped ``expected.a``."""
    f = write(tmp_path / "d.csv", "id,t,expected,expected.a\n1,x,1,2\n")
    with pytest.raises(SpecError, match=r"expected column \('expected'\) and "
                                        r"'expected\.FIELD' columns \(expected\.a\)"):
        read_items(f)
    g = write(tmp_path / "e.csv", "id,t,answer,expected.a\n1,x,1,2\n")
    with pytest.raises(SpecError, match=r"\('answer'\) and 'expected\.FIELD' columns"):
        read_items(g, expected_column="answer")


def test_a_csv_with_both_expected_and_label_columns_is_refused(tmp_path: Path) -> None:
    """The ``label`` column became an input field: the model would see the answer."""
    f = write(tmp_path / "d.csv", "id,t,expected,label\n1,x,yes,yes\n")
    with pytest.raises(SpecError, match="both an 'expected' and a 'label' column"):
        read_items(f)
    [item] = read_items(f, expected_column="label")  # chosen: the other is an input
    assert (item.input, item.expected) == ({"t": "x", "expected": "yes"}, "yes")


@pytest.mark.parametrize("header", ["id,,expected", "id, ,expected", "id,t,expected,"])
def test_a_csv_column_without_a_name_is_refused(tmp_path: Path, header: str) -> None:
    """``id,,expected`` made an input field named ""."""
    row = ",".join(["1", "a", "b", ""][:len(header.split(","))])
    f = write(tmp_path / "d.csv", f"{header}\n{row}\n")
    with pytest.raises(SpecError, match=r"column \d has no name in the header \(line 1\)"):
        read_items(f)
