"""``true``/``false`` given for a numeric setting in lockgate.toml are refused, naming the
table and the setting (pydantic's lax mode took them for 1 and 0: ``rpm = true`` was a
shared limit of one request a minute), in every config model, nested ones too, and in a
field added later; what is accepted today (``rpm = "600"``, an int for a float, real
booleans) still is. A duplicate ``[[endpoint]]`` name is refused naming the name and
the tables that share it."""

from __future__ import annotations

import inspect
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Union

import pytest
from pydantic import BaseModel

import helpers
import lockgate.config
from lockgate.config import (
    CircuitSettings,
    Endpoint,
    Settings,
    Webhook,
    WorkerSettings,
    load_settings,
)
from lockgate.errors import SpecError

refused = helpers.config_refused

#: The least an item of an array of tables needs to be valid (a new array of tables
#: must be added here: test_every_config_model_is_walked says so).
MINIMAL: dict[type[BaseModel], dict[str, str]] = {
    Endpoint: {"name": "openai", "base_url": "http://127.0.0.1:8400/v1"},
    Webhook: {"url": "http://127.0.0.1:9/hook"},
    CircuitSettings: {"prompt": "p", "fallback": "review"},
}

# One step from a model to a nested one: (setting, nested model, an array of tables?).
Step = tuple[str, type[BaseModel], bool]


def _strip(annotation: Any) -> list[Any]:
    """The types a field's annotation allows, without Annotated and None."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _strip(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return [t for arg in typing.get_args(annotation) for t in _strip(arg)]
    return [] if annotation is type(None) else [annotation]


def _nested(annotation: Any) -> tuple[type[BaseModel], bool] | None:
    """The model a field holds, and whether as an array of tables."""
    for t in _strip(annotation):
        if inspect.isclass(t) and issubclass(t, BaseModel):
            return t, False
        if typing.get_origin(t) is tuple:
            inner = [a for a in typing.get_args(t) if a is not Ellipsis]
            if len(inner) == 1 and inspect.isclass(inner[0]) and issubclass(inner[0],
                                                                             BaseModel):
                return inner[0], True
    return None


def _walk(model: type[BaseModel], path: tuple[Step, ...] = ()
          ) -> typing.Iterator[tuple[tuple[Step, ...], type[BaseModel]]]:
    yield path, model
    for name, fld in model.model_fields.items():
        found = _nested(fld.annotation)
        if found is not None:
            yield from _walk(found[0], (*path, (name, found[0], found[1])))


def _is_number(annotation: Any) -> bool:
    """An int or float setting (optional or not; ``bool`` is not one)."""
    allowed = _strip(annotation)
    return bool(allowed) and all(t is int or t is float for t in allowed)


def numeric_settings() -> list[tuple[tuple[Step, ...], str]]:
    return [(path, name) for path, model in _walk(Settings)
            for name, fld in model.model_fields.items() if _is_number(fld.annotation)]


def _toml(path: tuple[Step, ...], setting: str, value: str) -> tuple[str, str]:
    """A config file giving ``setting = value`` at ``path``, and where the message must
    say it is."""
    lines: list[str] = []
    names: list[str] = []
    for i, (name, model, array) in enumerate(path):
        names.append(name)
        header = ".".join(names)
        if array:
            lines.append(f"[[{header}]]")
            lines += [f'{k} = "{v}"' for k, v in MINIMAL[model].items()]
        elif i == len(path) - 1:
            lines.append(f"[{header}]")
    lines.append(f"{setting} = {value}")
    arrays = [s for s in path if s[2]]
    if not arrays:
        where = f"'{'.'.join([*names, setting])}'"
    else:
        last = max(i for i, s in enumerate(path) if s[2])
        header = ".".join(s[0] for s in path[:last + 1])
        label = MINIMAL[path[last][1]].get("name")
        where = (f"[[{header}]] '{label}' (the 1st): " if label
                 else f"the 1st [[{header}]]: ")
        where += f"'{'.'.join([*(s[0] for s in path[last + 1:]), setting])}'"
    return "\n".join(lines) + "\n", where


NUMERIC = numeric_settings()


def test_every_config_model_is_walked() -> None:
    """Every settings model of lockgate.config is reached from Settings (so its numeric
    settings are checked below), and every array of tables has a MINIMAL item."""
    reached = {model for _, model in _walk(Settings)}
    defined = {obj for obj in vars(lockgate.config).values()
               if inspect.isclass(obj) and issubclass(obj, BaseModel)
               and obj.__module__ == "lockgate.config"
               and obj.model_fields}
    assert defined <= reached, defined - reached
    arrays = {s[1] for path, _ in _walk(Settings) for s in path if s[2]}
    assert arrays <= set(MINIMAL), arrays - set(MINIMAL)
    names = {(".".join(s[0] for s in path), name) for path, name in NUMERIC}
    assert {("endpoint", "rpm"), ("endpoint", "tpm"), ("worker", "concurrency"),
            ("worker", "claim_batch"), ("worker", "prefetch"), ("quality", "samples"),
            ("quality.webhook", "max_attempts"), ("quality.circuit", "threshold"),
            ("flow", "headroom"), ("endpoint", "timeout_s")} <= names
    assert len(NUMERIC) > 60


@pytest.mark.parametrize("value", ["true", "false"])
@pytest.mark.parametrize(
    "path, setting", NUMERIC,
    ids=[".".join([*(s[0] for s in p), n]) for p, n in NUMERIC])
def test_a_boolean_for_a_numeric_setting_is_refused_naming_it(
        tmp_path: Path, path: tuple[Step, ...], setting: str, value: str) -> None:
    """``rpm = true`` was an rpm of 1, ``concurrency = true`` 1, ``prefetch = false``
    0: each numeric setting (a duration too) refuses a boolean, saying where."""
    toml, where = _toml(path, setting, value)
    message = refused(tmp_path, toml)
    assert f": {where}: {value} is not a " in message, (toml, message)


def test_the_message_of_a_boolean_says_what_to_write(tmp_path: Path) -> None:
    toml = ('[[endpoint]]\nname = "openai"\nbase_url = "http://127.0.0.1:8400/v1"\n'
            "rpm = true\n")
    assert refused(tmp_path, toml).endswith(
        "config " + str(tmp_path / "lockgate.toml") + ": [[endpoint]] 'openai' (the 1st): "
        "'rpm': true is not a number: write a number (rpm = 600)")
    assert refused(tmp_path, "[worker]\nconcurrency = false\n").endswith(
        "'worker.concurrency': false is not a number: write a number (concurrency = 512)")
    assert refused(tmp_path, "[flow]\nheadroom = true\n").endswith(
        "'flow.headroom': true is not a number: write a number (headroom = 0.02)")


def test_durations_still_say_they_are_durations(tmp_path: Path) -> None:
    message = refused(tmp_path, "[worker]\nlease_s = true\n")
    assert "'worker.lease_s': true is not a duration; e.g." in message, message


def test_what_is_accepted_today_still_is(tmp_path: Path) -> None:
    """Text holding a number, an int for a float and real booleans are unchanged."""
    cfg = tmp_path / "lockgate.toml"
    cfg.write_text('[[endpoint]]\nname = "openai"\nbase_url = "http://127.0.0.1:8400/v1"\n'
                   'rpm = "600"\ntpm = 2000\ncost_input_per_1k = 1\nsupports_top_k = true\n'
                   "send_idempotency_key = false\n"
                   '[worker]\nconcurrency = "8"\nprefetch = 0\nstore_snapshots = false\n'
                   "[flow]\nheadroom = 0\nfair_share = false\n"
                   "[quality]\nsamples = 0\nalerts = false\n")
    s = load_settings(cfg)
    ep = s.endpoint[0]
    assert (ep.rpm, ep.tpm, ep.cost_input_per_1k, ep.supports_top_k,
            ep.send_idempotency_key) == (600, 2000, 1.0, True, False)
    assert (s.worker.concurrency, s.worker.prefetch, s.worker.store_snapshots) == (8, 0,
                                                                                  False)
    assert (s.flow.headroom, s.flow.fair_share) == (0.0, False)
    assert (s.quality.samples, s.quality.alerts) == (0, False)
    assert isinstance(ep.cost_input_per_1k, float)


def test_worker_overrides_refuse_a_boolean_too() -> None:
    """``with_changes`` (flags, the API's worker overrides) is checked as the file is."""
    with pytest.raises(SpecError, match="true is not a number") as err:
        WorkerSettings().with_changes(concurrency=True)
    assert err.value.field == "concurrency"
    assert WorkerSettings().with_changes(concurrency="8", store_snapshots=False
                                         ).concurrency == 8


def test_a_duplicate_endpoint_name_is_named_with_its_tables(tmp_path: Path) -> None:
    """It said only "two endpoints have the same name"."""
    toml = "".join(f'[[endpoint]]\nname = "{n}"\nbase_url = "http://127.0.0.1:8400/v1"\n'
                   for n in ("a", "b", "a", "c", "b"))
    message = refused(tmp_path, toml)
    assert message.endswith(
        ": the 1st and the 3rd [[endpoint]] are both named 'a': give each endpoint its "
        "own name"), message
    toml = "".join(f'[[endpoint]]\nname = "{n}"\nbase_url = "http://127.0.0.1:8400/v1"\n'
                   for n in ("x", "y", "y", "y"))
    assert refused(tmp_path, toml).endswith(
        ": the 2nd, the 3rd and the 4th [[endpoint]] are all named 'y': give each "
        "endpoint its own name")


def test_a_duplicate_webhook_name_is_named_with_its_tables(tmp_path: Path) -> None:
    """It said only "two webhooks have the same name" (a webhook is named by its host
    when it has no name of its own)."""
    toml = "".join(f'[[quality.webhook]]\nurl = "https://{h}/x"\n'
                   for h in ("a.example", "b.example", "a.example"))
    assert refused(tmp_path, toml).endswith(
        ": the 1st and the 3rd [[quality.webhook]] are both named 'a.example': give each "
        "a distinct name")
