"""The command line, ``lockgate ...``: one Typer app (``_common``) and a module per
family of commands (``queue``: init, submit, run, worker, status, export, cleanup,
simulate; ``tasks``; ``quality``; ``alerts``; ``circuit``; ``registry``: prompt,
dataset, bind, gate). Every command runs behind one error boundary
(``_common.handles_errors``): a lockgate error is one line and exit code 2."""

from __future__ import annotations

from lockgate.cli import alerts, circuit, quality, queue, registry, tasks
from lockgate.cli._common import app

__all__ = ["alerts", "app", "circuit", "main", "quality", "queue", "registry", "tasks"]


def main() -> None:
    """Entry point of the ``lockgate`` command."""
    app()
