"""Packages whose public names load their modules on first use (PEP 562), so that a
command pays only for the parts it uses (:mod:`lockgate` itself, :mod:`lockgate.runtime`,
:mod:`lockgate.quality`).
A package lists its names with the checker's imports under ``TYPE_CHECKING`` and takes
its ``__getattr__`` and ``__dir__`` from :func:`lazy_names`."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Collection, Mapping
from typing import Any


def lazy_names(package: str, homes: Mapping[str, str], modules: Collection[str] = ()
               ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``package``'s ``__getattr__`` and ``__dir__``: each name of ``homes`` is imported
    from its module (``homes[name]``, in the package) when first asked for, and each of
    ``modules`` is the package's module of that name; then kept on the package. A name
    of ``homes`` must not be that of one of the package's modules: importing the module
    sets the package's attribute to it (import such a name with the package)."""

    def getattr_(name: str) -> Any:
        home = homes.get(name)
        if home is not None:
            value = getattr(importlib.import_module(f"{package}.{home}"), name)
        elif name in modules:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    def dir_() -> list[str]:
        return sorted({*vars(sys.modules[package]), *homes, *modules})

    return getattr_, dir_
