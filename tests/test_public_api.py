"""The public API is what ``lockgate.__all__`` names: every name there resolves, and every
type the public calls hand back is among them."""

from __future__ import annotations

import inspect
import typing

import lockgate
from lockgate.app import AsyncLockgate, Lockgate


def test_every_public_name_resolves() -> None:
    for name in lockgate.__all__:
        assert getattr(lockgate, name) is not None, name


def test_what_the_api_returns_is_exported() -> None:
    public = {n: getattr(lockgate, n) for n in lockgate.__all__}
    exported = set(public.values())
    for cls in (Lockgate, AsyncLockgate):
        for name, fn in inspect.getmembers(cls, inspect.isfunction):
            if name.startswith("_"):
                continue
            # lockgate.app imports the worker's and the alerts' types for type checking
            # only (start-up time): a hint naming them resolves through the public names.
            hint = typing.get_type_hints(fn, localns=public).get("return")
            for t in (typing.get_args(hint) or (hint,)):
                for inner in (typing.get_args(t) or (t,)):
                    if inspect.isclass(inner) and inner.__module__.startswith("lockgate."):
                        assert inner in exported, f"{cls.__name__}.{name} returns {inner}"
