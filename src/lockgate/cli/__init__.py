"""The command line, ``lockgate ...``: one Typer app (``_common``) and a module per
family of commands (``queue``: init, submit, run, worker, status, export, cleanup,
simulate; ``tasks``; ``quality``; ``alerts``; ``circuit``; ``registry``: prompt,
dataset, bind, gate). Every command runs behind one error boundary
(``_common.handles_errors``): a lockgate error is one line and exit code 2.

The command modules (and with them Typer, SQLAlchemy, pydantic: about a second of
imports) are loaded by :func:`main` inside its own boundary, so that a Ctrl-C in those
first moments ends the command as it does later (``interrupted``, exit code 130),
never with a traceback of the import under way. ``lockgate.cli.app`` (and each command
module by its name) is loaded on first use for everyone else."""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lockgate.cli import alerts, circuit, quality, queue, registry, tasks
    from lockgate.cli._common import app

__all__ = ["alerts", "app", "circuit", "main", "quality", "queue", "registry", "tasks"]

#: The modules that register the commands on ``app``, in the order of ``lockgate --help``.
COMMAND_MODULES = ("alerts", "circuit", "quality", "queue", "registry", "tasks")
#: Exit code of a command interrupted by Ctrl-C (``_common.INTERRUPTED``, which is not
#: loaded yet when the interruption comes during the imports).
INTERRUPTED = 130


def _load() -> Any:
    """The Typer app with every command registered on it."""
    for name in COMMAND_MODULES:
        importlib.import_module(f"lockgate.cli.{name}")
    return importlib.import_module("lockgate.cli._common").app


def __getattr__(name: str) -> Any:
    """``app`` and the command modules, loaded on first use (PEP 562)."""
    if name == "app":
        value = _load()
    elif name in COMMAND_MODULES:
        _load()
        value = importlib.import_module(f"lockgate.cli.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def main() -> None:
    """Entry point of the ``lockgate`` command."""
    try:
        command = _load()
    except KeyboardInterrupt:  # Ctrl-C while the command's modules load
        sys.stderr.write("interrupted\n")
        raise SystemExit(INTERRUPTED) from None
    try:
        command()
    except KeyboardInterrupt:  # while Typer builds the commands, before their boundary
        sys.stderr.write("interrupted\n")
        raise SystemExit(INTERRUPTED) from None
