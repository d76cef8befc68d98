"""Reading labelled datasets from files (pure).

JSONL, one object per line::

    {"id": "r-001", "input": {"text": "..."}, "expected": {"category": "refund"}}

``expected`` may be any JSON value (``"yes"``, an object, a list); ``label`` is accepted
for it. Without ``input``, every key but ``id``/``expected``/``label`` is an input
field; with it, other keys (notes, a split) are not stored, and ``dataset add`` says
which. Without ``id``, the item id is the first 16 hex digits of the SHA-256 of its
input, so re-adding the same file is idempotent.

CSV with a header: the ``id`` column (optional), the expected column (``expected`` or
``label``, or ``--expected-column``), or several ``expected.FIELD`` columns that make
an expected object; every other column is an input field (text). Expected cells that
are valid JSON (``3``, ``true``, ``{"a": 1}``) are read as JSON, others as text.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import hashlib
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from lockgate.errors import SpecError, cannot
from lockgate.files import MAX_SHOWN, big_int_field, describe_rejects
from lockgate.registry.content import not_utf8
from lockgate.spec import MAX_INPUT_BYTES, canonical_json
from lockgate.store.registry import DatasetItem

_RESERVED = ("id", "expected", "label")
_BIG_INT = ("holds an integer beyond 64 bits, which would be read as a float and lose "
            "digits (two such numbers could become one)")


def _default_id(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(inputs)).hexdigest()[:16]


def _key(value: Any, line: int | None) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise SpecError("must be a string or an integer", field="id", line=line)
    return check_key(str(value), line)


def check_key(key: str, line: int | None = None) -> str:
    """A valid item id, or SpecError naming the line and field. Leading or trailing
    whitespace is refused, as in task ids: MariaDB compares ids without trailing spaces,
    so ``a`` and ``a `` would be one id there and two elsewhere."""
    if not key or len(key) > 191 or not key.isprintable():
        raise SpecError("must be 1-191 printable characters", field="id", line=line)
    if key != key.strip():
        raise SpecError(f"{key!r} has leading or trailing whitespace, which some databases "
                        "ignore when they compare ids: remove it", field="id", line=line)
    return key


def item_from(obj: Any, line: int) -> DatasetItem:
    """One dataset item from a JSON object; SpecError naming the line and field."""
    if not isinstance(obj, dict):
        raise SpecError("expected a JSON object", line=line)
    if "expected" in obj and "label" in obj:  # one would be dropped silently
        raise SpecError("'expected' and 'label' are two names of the expected value, and "
                        "the line gives both: keep one", field="label", line=line)
    if "expected" in obj:
        expected = obj["expected"]
    elif "label" in obj:
        expected = obj["label"]
    else:
        raise SpecError("is required (the expected output or label)", field="expected",
                        line=line)
    ignored: tuple[str, ...] = ()
    if "input" in obj:
        inputs = obj["input"]
        if not isinstance(inputs, dict) or not inputs:
            raise SpecError("must be a non-empty object of input fields", field="input",
                            line=line)
        ignored = tuple(k for k in obj if k not in _RESERVED and k != "input")
    else:
        inputs = {k: v for k, v in obj.items() if k not in _RESERVED}
        if not inputs:
            raise SpecError("no input fields (give 'input' or other keys)", field="input",
                            line=line)
    if "id" in obj:
        return DatasetItem(_key(obj["id"], line), inputs, expected, line, ignored=ignored)
    return DatasetItem(_default_id(inputs), inputs, expected, line, derived_key=True,
                       ignored=ignored)


def read_jsonl(path: Path) -> Iterator[DatasetItem | SpecError]:
    """Items of a JSONL file (a byte order mark at its start is skipped), and in the
    place of each bad line its error."""
    with path.open("rb") as fh:
        offset = 0  # of the line in the file, for a byte that is not UTF-8
        for n, raw in enumerate(fh, start=1):
            start, offset = offset, offset + len(raw)
            if n == 1:  # a byte order mark (PowerShell, Excel): not the line's
                raw = raw.removeprefix(codecs.BOM_UTF8)
            if not raw.strip():
                continue
            try:
                yield _jsonl_item(path, raw, n, start)
            except SpecError as exc:
                yield exc


def _jsonl_item(path: Path, raw: bytes, n: int, start: int) -> DatasetItem:
    """The item of line ``n`` (``start``: its offset in the file)."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as bad:
            raise not_utf8(path, raw, bad, base=start, line=n) from None
        raise SpecError(f"not valid JSON ({exc})", line=n) from None
    if isinstance(obj, dict):  # (anything else is refused by item_from)
        where = big_int_field(raw)
        if where is not None:
            raise SpecError(f"{_BIG_INT}: write it as a string", field=where or None,
                            line=n)
    return item_from(obj, n)


def _cell(value: str, column: str, line: int) -> Any:
    """An expected cell: JSON when it parses as JSON, else the text. An integer beyond
    64 bits in it is refused (JSON would make it a float that lost digits)."""
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError:
        return value
    where = big_int_field(value.encode())
    if where is not None:
        inside = f"{column}{'' if where.startswith('[') or not where else '.'}{where}"
        raise SpecError(f"{_BIG_INT}: write it as a JSON string, in double quotes "
                        "(\"123...\" in the cell, \"\"\"123...\"\"\" in the CSV text)",
                        field=inside, line=line)
    return parsed


def read_csv(path: Path, *, expected_column: str | None = None,
             id_column: str = "id") -> Iterator[DatasetItem | SpecError]:
    """Items of a CSV file with a header row, and in the place of each bad row its
    error (a bad header, quote or encoding is raised at once). A cell may hold up to
    :data:`MAX_INPUT_BYTES` characters (an item's bound), not the csv module's 128 KiB."""
    with path.open(newline="", encoding="utf-8-sig") as fh, _field_limit(MAX_INPUT_BYTES):
        reader = csv.DictReader(fh, strict=True)  # strict: an unterminated quote is refused
        read = [1]  # the lines read by the last whole row (the header: 1)
        try:
            yield from _csv_items(path, reader, expected_column, id_column, read)
        except csv.Error as exc:
            if str(exc).startswith("field larger than field limit"):
                raise SpecError(f"a field holds more than {MAX_INPUT_BYTES >> 20} MiB of "
                                "text, more than a dataset item may hold (or a quote "
                                "opened there never closes)", line=read[0] + 1) from None
            raise SpecError(f"not valid CSV ({exc}): a quoted field must end with a "
                            "closing quote", line=read[0] + 1) from None
        except UnicodeDecodeError:
            # The text layer decodes in chunks, so its error's offset is not the file's:
            # the bytes are decoded again (once, on this error path) to find the byte.
            data = path.read_bytes()
            try:
                data.decode("utf-8")
            except UnicodeDecodeError as bad:
                raise not_utf8(path, data, bad) from None
            raise SpecError(f"{path}: not UTF-8 text; save the file as UTF-8") from None


_LIMIT_LOCK = threading.Lock()
_LIMIT_USERS = [0, 0]  # readers inside _field_limit, and the limit before the first


@contextlib.contextmanager
def _field_limit(chars: int) -> Iterator[None]:
    """The csv module's field size limit (process-wide) raised to at least ``chars``
    while a reader runs, and put back when the last concurrent reader ends."""
    with _LIMIT_LOCK:
        if _LIMIT_USERS[0] == 0:
            _LIMIT_USERS[1] = csv.field_size_limit()
            csv.field_size_limit(max(chars, _LIMIT_USERS[1]))
        _LIMIT_USERS[0] += 1
    try:
        yield
    finally:
        with _LIMIT_LOCK:
            _LIMIT_USERS[0] -= 1
            if _LIMIT_USERS[0] == 0:
                csv.field_size_limit(_LIMIT_USERS[1])


def _csv_items(path: Path, reader: csv.DictReader[str], expected_column: str | None,
               id_column: str, read: list[int]) -> Iterator[DatasetItem | SpecError]:
    header = list(reader.fieldnames or [])
    repeated = [(c, k) for c, k in Counter(header).items() if k > 1]
    if repeated:  # DictReader would keep the last of them and drop the others silently
        name, times = repeated[0]
        raise SpecError(f"{path}: column '{name}' appears "
                        f"{'twice' if times == 2 else f'{times} times'} in the header "
                        "(line 1); rename the repeats so that each column has its own name")
    blank = [i for i, h in enumerate(header, start=1) if not h.strip()]
    if blank:  # it would be an input field named "" (or " ")
        raise SpecError(f"{path}: column {blank[0]} has no name in the header (line 1); "
                        "name it, or remove the column (and a trailing comma)")
    fields = [h for h in header if h.startswith("expected.")]
    if expected_column is None and "expected" in header and "label" in header:
        raise SpecError(f"{path} has both an 'expected' and a 'label' column, two names "
                        "of the expected value (the other would be an input field): keep "
                        "one, or pick one with --expected-column")
    column = expected_column or next((c for c in ("expected", "label") if c in header),
                                     None)
    if column is not None and column not in header:
        raise SpecError(f"no column '{column}' in {path} (columns: {header})")
    if column is not None and fields:  # the expected.FIELD columns would be dropped
        raise SpecError(f"{path} has an expected column ('{column}') and "
                        f"'expected.FIELD' columns ({', '.join(fields)}): the expected "
                        "value is one or the other; remove (or rename) one form")
    if column is None and not fields:
        raise SpecError(f"{path} needs an 'expected' or 'label' column, or "
                        "'expected.FIELD' columns")
    skip = {column, id_column, *fields}
    for row in reader:
        n, read[0] = read[0] + 1, reader.line_num
        try:
            yield _csv_item(row, n, header, column, fields, skip, id_column)
        except SpecError as exc:
            yield exc


def _csv_item(row: dict[str | None, Any], n: int, header: list[str], column: str | None,
              fields: list[str], skip: set[str | None], id_column: str) -> DatasetItem:
    """The item of the row that starts on line ``n``."""
    extra = row.get(None)  # the values past the header (DictReader's restkey)
    if extra:
        raise SpecError(f"{len(header) + len(extra)} fields, the header has "
                        f"{len(header)}", line=n)
    missing = [k for k, v in row.items() if v is None]
    if missing:
        raise SpecError(f"{len(header) - len(missing)} field(s), the header has "
                        f"{len(header)} (no {', '.join(str(k) for k in missing)})", line=n)
    if column is not None:
        expected: Any = _cell(row[column], column, n)
    else:
        expected = {f.split(".", 1)[1]: _cell(row[f], f, n) for f in fields}
    inputs = {k: v for k, v in row.items() if k not in skip and k is not None}
    if not inputs:
        raise SpecError("no input columns", line=n)
    if row.get(id_column):
        return DatasetItem(_key(row[id_column], n), inputs, expected, n)
    return DatasetItem(_default_id(inputs), inputs, expected, n, derived_key=True)


def read_items(path: str | Path, *, expected_column: str | None = None) -> list[DatasetItem]:
    """Items of a JSONL or CSV file (by extension: .csv is CSV, anything else JSONL)."""
    p = Path(path)
    if not p.exists():
        raise SpecError(f"file {p} does not exist")
    is_csv = p.suffix.lower() == ".csv"
    if expected_column is not None and not is_csv:
        raise SpecError(f"--expected-column applies to CSV files only, and {p} is read as "
                        "JSONL (any name but *.csv): there the expected value is the "
                        "'expected' (or 'label') key of each line")
    items: list[DatasetItem] = []
    bad: list[tuple[int, SpecError]] = []  # the first MAX_SHOWN
    count = 0
    try:
        for got in (read_csv(p, expected_column=expected_column) if is_csv
                    else read_jsonl(p)):
            if isinstance(got, DatasetItem):
                items.append(got)
                continue
            count += 1
            if len(bad) < MAX_SHOWN:
                bad.append((got.line or 0, got))
    except OSError as exc:
        raise cannot("read", p, exc) from None
    except SpecError as exc:  # the file cannot be read on (a quote, an encoding)
        if not count:
            raise
        count += 1
        if len(bad) < MAX_SHOWN:
            bad.append((exc.line or 0, exc))
    if count == 1:
        raise bad[0][1]
    if count:
        # (bad holds MAX_SHOWN errors at most; the rest are counted here)
        listed = describe_rejects(bad)
        if count > len(bad):
            listed += f"\n  ... and {count - len(bad)} more"
        raise SpecError(f"{p}: {count} bad lines; nothing was added. Fix them and add "
                        f"the file again:\n{listed}")
    return items
