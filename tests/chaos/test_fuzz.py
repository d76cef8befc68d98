"""Fuzz of everything a user hands lockgate: task specs (dicts given to ``submit``), task
files (bytes), OpenAI batch lines and config files. Every input is either taken or
refused with a :class:`LockgateError` that names the line or the field; nothing else
escapes (0 crashes), and a refused submit writes nothing (0 partial submissions).

``--chaos=short`` runs a few hundred cases; ``--chaos=long`` 2,500 per property
(10,000 in all)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lockgate
from engine.support import task
from helpers import scalar
from lockgate.config import load_settings
from lockgate.errors import ConfigError, LockgateError, SpecError

from .conftest import Scale

pytestmark = pytest.mark.chaos

#: JSON-like values, with what JSON from Python can carry and files cannot: integers
#: beyond 64 bits, lone surrogates, NaN, deep nesting.
TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
                    TEXT)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)), max_leaves=12)
FIELDS = ("task_id", "prompt_template", "input_data", "model_config", "delivery_rule",
          "retry_policy", "batch_id", "priority", "metadata")


def _settings(scale: Scale) -> Any:
    return settings(max_examples=scale.fuzz_cases, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck))


@st.composite
def task_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid task with some fields replaced, removed or added, at any depth."""
    spec: dict[str, Any] = task(f"t-{draw(st.integers(0, 10**6))}",
                                draw(st.sampled_from(["refund please", "where is it"])))
    for name in draw(st.lists(st.sampled_from(FIELDS), max_size=3, unique=True)):
        choice = draw(st.integers(0, 3))
        if choice == 0:
            spec.pop(name, None)
        elif choice == 1 or not isinstance(spec.get(name), dict):
            spec[name] = draw(VALUES)
        else:
            inner = dict(spec[name])
            inner[draw(st.sampled_from([*inner, "extra", "name", "stop", "schema"]))] = \
                draw(VALUES)
            spec[name] = inner
    if draw(st.booleans()):
        spec[draw(TEXT)] = draw(VALUES)
    return spec


def _line(obj: Any) -> bytes:
    # Python's json, not orjson: it writes big integers, NaN and lone surrogates.
    return json.dumps(obj).encode("utf-8", "surrogatepass")


@st.composite
def task_files(draw: st.DrawFn, openai: bool = False) -> bytes:
    """A few lines: valid ones, mutated ones (bytes changed, cut, spliced) and garbage."""
    lines = []
    for _ in range(draw(st.integers(1, 4))):
        base = _openai_line(draw) if openai else task(f"f-{draw(st.integers(0, 10**6))}")
        raw = _line(draw(task_specs()) if not openai and draw(st.booleans()) else base)
        kind = draw(st.integers(0, 4))
        if kind == 1 and raw:
            at = draw(st.integers(0, len(raw) - 1))
            raw = raw[:at] + draw(st.binary(max_size=4)) + raw[at + 1:]
        elif kind == 2:
            raw = raw[:draw(st.integers(0, len(raw)))]
        elif kind == 3:
            raw = draw(st.binary(max_size=60))
        lines.append(raw)
    return b"\n".join(lines) + draw(st.sampled_from([b"", b"\n", b"\r\n"]))


def _openai_line(draw: st.DrawFn) -> dict[str, Any]:
    line: dict[str, Any] = {
        "custom_id": f"o-{draw(st.integers(0, 10**6))}", "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "sim-small", "messages": [{"role": "user", "content": "hi"}]}}
    for key in draw(st.lists(st.sampled_from(["custom_id", "method", "url", "body",
                                              "messages", "model", "temperature",
                                              "response_format", "seed"]),
                             max_size=2, unique=True)):
        target = line if key in ("custom_id", "method", "url", "body") else line.get("body")
        if not isinstance(target, dict):
            continue
        if draw(st.booleans()) and key in target:
            del target[key]
        else:
            target[key] = draw(VALUES)
    return line


def _count(lg: lockgate.Lockgate) -> int:
    return int(scalar(lg.store, "SELECT COUNT(*) FROM task"))


def _names_a_line_or_field(exc: LockgateError) -> bool:
    if isinstance(exc, SpecError):
        return exc.line is not None or exc.field is not None or "line " in str(exc)
    return "line " in str(exc) or "field" in str(exc)


@pytest.fixture
def lg(tmp_path: Path) -> Any:
    with lockgate.connect(f"sqlite:///{tmp_path / 'fuzz.db'}") as handle:
        yield handle


def test_fuzz_task_specs(lg: lockgate.Lockgate, scale: Scale) -> None:
    @_settings(scale)
    @given(st.lists(task_specs(), min_size=1, max_size=3))
    def run(specs: list[dict[str, Any]]) -> None:
        before = _count(lg)
        try:
            lg.submit(specs, batch_id="fuzz")
        except LockgateError as exc:
            assert _names_a_line_or_field(exc), str(exc)
            assert "\n" not in str(exc), str(exc)
            assert _count(lg) == before, f"a refused submit wrote tasks: {exc}"

    run()


@pytest.mark.parametrize("fmt", ["tasks", "openai-batch"])
def test_fuzz_task_files(lg: lockgate.Lockgate, scale: Scale, tmp_path: Path,
                         fmt: str) -> None:
    path = tmp_path / "tasks.jsonl"

    @_settings(scale)
    @given(task_files(openai=fmt == "openai-batch"))
    def run(content: bytes) -> None:
        path.write_bytes(content)
        before = _count(lg)
        try:
            report = lg.submit_file(path, format=fmt,  # type: ignore[arg-type]
                                    batch_id="fuzz")
        except LockgateError as exc:
            assert _names_a_line_or_field(exc), str(exc)
            assert _count(lg) == before, f"a refused file wrote tasks: {exc}"
        else:
            assert _count(lg) == before + report.inserted

    run()


CONFIG = """\
[worker]
concurrency = 64
lease_s = 60

[[endpoint]]
name = "default"
base_url = "http://127.0.0.1:9/v1"
api_key_env = "SIM_KEY"
models = ["sim-small"]
rpm = 1000

[flow]
headroom = 0.02

[gate]
enabled = true
"""


@st.composite
def config_files(draw: st.DrawFn) -> bytes:
    """The sample config with lines replaced, values changed, bytes broken."""
    lines = CONFIG.splitlines()
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        kind = draw(st.integers(0, 3))
        if kind == 0 and "=" in lines[i]:
            key = lines[i].split("=")[0].strip()
            value = draw(st.one_of(st.integers(), st.floats(allow_nan=True), st.booleans(),
                                   TEXT.map(json.dumps), st.sampled_from(
                                       ['"30s"', '"-1"', "[]", "{}", '"x"', "inf"])))
            lines[i] = f"{key} = {value}"
        elif kind == 1:
            lines[i] = draw(TEXT)
        elif kind == 2:
            lines.insert(i, f"{draw(st.sampled_from(['unknown', 'lease', 'concurency']))}"
                            f" = {draw(st.integers(-5, 5))}")
        else:
            del lines[i]
    raw = "\n".join(lines).encode("utf-8", "surrogatepass")
    if draw(st.booleans()):
        at = draw(st.integers(0, len(raw)))
        raw = raw[:at] + draw(st.binary(max_size=3)) + raw[at:]
    return raw


def test_fuzz_config_files(scale: Scale, tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIM_KEY", "k")
    path = tmp_path / "lockgate.toml"

    @_settings(scale)
    @given(config_files())
    def run(content: bytes) -> None:
        path.write_bytes(content)
        try:
            load_settings(path)
        except ConfigError as exc:
            assert str(path) in str(exc) or "config" in str(exc), str(exc)
            assert "\n" not in str(exc).strip(), str(exc)

    run()


def test_the_fuzz_reaches_valid_inputs_too(lg: lockgate.Lockgate, tmp_path: Path) -> None:
    """Not only refusals: unmutated lines of the generators are taken."""
    rng = random.Random(7)
    path = tmp_path / "ok.jsonl"
    path.write_bytes(b"\n".join(_line(task(f"ok-{rng.randrange(10**6)}-{i}"))
                                for i in range(5)))
    assert lg.submit_file(path, batch_id="ok").inserted == 5


def test_a_config_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    """Found by the fuzz: a byte that is not UTF-8 raised UnicodeDecodeError."""
    path = tmp_path / "lockgate.toml"
    path.write_bytes(b"[worker]\nconcurrency = 4\n\x80lease_s = 60\n")
    with pytest.raises(ConfigError, match=r"line 3: not UTF-8 text \(byte 0x80 at byte "
                                          r"offset 25\): save the file as UTF-8 \(from "
                                          r"Latin-1 or Windows-1252: iconv"):
        load_settings(path)
    # the offset is the file's, a byte order mark included
    path.write_bytes(b"\xef\xbb\xbf[worker]\nconcurrency = 4\n\x80lease_s = 60\n")
    with pytest.raises(ConfigError, match=r"line 3: not UTF-8 text \(byte 0x80 at byte "
                                          r"offset 28\)"):
        load_settings(path)


def test_an_unknown_field_with_a_line_break_in_its_name_stays_one_line(tmp_path: Path) -> None:
    """Found by the fuzz: a key "\\n" split the error message over two lines."""
    spec = task("t-1")
    spec["a\nb\x00"] = 1
    with pytest.raises(SpecError) as caught:
        lockgate.connect(f"sqlite:///{tmp_path / 'x.db'}").submit([spec])
    assert caught.value.field == "a\\nb\\x00" and "\n" not in str(caught.value)
