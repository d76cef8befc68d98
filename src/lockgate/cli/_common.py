"""What every command shares: the Typer app, consoles, options, the error boundary, the
duration and time formats, and how a command opens the database."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, ParamSpec, TypeVar

import orjson
import typer
from rich.console import Console
from rich.table import Table
from typer._click.core import Context, Parameter
from typer._click.exceptions import UsageError
from typer._click.formatting import HelpFormatter
from typer.core import TyperCommand

from lockgate import __version__
from lockgate.app import Lockgate
from lockgate.durations import EXAMPLES, parse_duration
from lockgate.errors import LockgateError, SpecError
from lockgate.results import plain, utc
from lockgate.store.dialects.base import MigrationLockBusy
from lockgate.store.failures import dropped_for_now, refused_for_now, sqlite_passing

P = ParamSpec("P")
T = TypeVar("T")

#: Exit code of a command that failed for a reason it names (bad input, no database...).
FAILED = 2
#: Exit code of a command interrupted by Ctrl-C.
INTERRUPTED = 130
#: The reader of the output went away (128 + SIGPIPE, as a shell reports `yes | head`).
BROKEN_PIPE = 141


def _version(value: bool) -> None:
    if value:
        sys.stdout.write(f"lockgate {__version__}\n")
        raise typer.Exit()


#: The metavar of an option that names none, by the type Typer shows (``<str>``).
_METAVARS = {"str": "TEXT", "int": "INTEGER", "float": "NUMBER", "path": "PATH",
             "file": "FILE", "directory": "FOLDER", "list[str]": "TEXT",
             "list[int]": "INTEGER", "list[float]": "NUMBER", "bool": "BOOLEAN",
             "int range": "INTEGER", "float range": "NUMBER"}


class Command(TyperCommand):
    """A command whose help and usage read as the README writes them: arguments in
    upper case (``lockgate submit [OPTIONS] FILE``, ``Missing argument 'TASK_ID'``),
    options with an upper-case metavar (``--pool TEXT``, ``--weight NUMBER``) rather
    than Typer's ``{file}``, ``file <path>`` and ``--pool <str>``; and a usage mistake
    found while the arguments are split (``--batch`` given no value) shows the usage
    line and the pointer to ``--help``, as an unknown option does."""

    def get_params(self, ctx: Context) -> list[Parameter]:
        params = super().get_params(ctx)
        for param in params:
            if param.metavar is not None:
                continue
            if param.param_type_name == "argument" and param.name:
                param.metavar = param.name.upper()
            elif (param.param_type_name == "option" and not getattr(param, "is_flag", False)
                    and not getattr(param, "count", False)
                    and hasattr(param, "display_type")):
                label = str(param.display_type(ctx)).strip("<>")
                param.metavar = _METAVARS.get(label, label.upper())
        return params

    def collect_usage_pieces(self, ctx: Context) -> list[str]:
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name != "argument":
                pieces.extend(param.get_usage_pieces(ctx))
                continue
            name = param.metavar or (param.name or "").upper()
            name = name if param.required else f"[{name}]"
            pieces.append(name + ("..." if param.nargs != 1 else ""))
        return pieces

    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        args, opts = [], []
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                name = param.metavar or (param.name or "").upper()
                args.append((name + ("..." if param.nargs != 1 else ""), record[1]))
            elif param.param_type_name == "option":
                opts.append(record)
        if args:
            with formatter.section("Arguments"):
                formatter.write_dl(args)
        if opts:
            with formatter.section("Options"):
                formatter.write_dl(opts)

    def parse_args(self, ctx: Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except UsageError as exc:
            if exc.ctx is None:  # Option '--batch' requires an argument.
                exc.ctx, exc.cmd = ctx, self
            raise


app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                  help="Durable, leased LLM prompt tasks on SQL databases, with a release "
                       "gate for prompt changes.")


@app.callback()
def _root(version: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True,
        help="print the version and exit")] = False) -> None:
    """Durable, leased LLM prompt tasks on SQL databases, with a release gate for prompt
    changes."""


#: Messages, progress and errors (stderr); tables and data go to ``out`` (stdout).
console = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False)

DbOpt = Annotated[str | None, typer.Option(
    "--db", envvar="LOCKGATE_DATABASE_URL", metavar="URL",
    help="database URL: sqlite:///lockgate.db (default), postgresql://user@host/db, "
         "mysql://user@host/db")]
ConfigOpt = Annotated[Path | None, typer.Option(
    "--config", envvar="LOCKGATE_CONFIG", metavar="FILE",
    help="TOML file with endpoints and the [worker], [flow], [gate] and [runtime] "
         "settings [default: ./lockgate.toml if present]")]
JsonOpt = Annotated[bool, typer.Option("--json", help="machine-readable output")]
ActorOpt = Annotated[str | None, typer.Option(
    "--actor", "--author", metavar="NAME",
    help="who does it, for the audit trail [default: login name]")]
ReasonOpt = Annotated[str | None, typer.Option(
    "--reason", "--note", metavar="TEXT", help="why, kept in the audit trail")]

#: The flag of each field a library error may name, so messages speak the user's terms.
FLAGS = {"older_than": "--older-than", "window": "--window", "cron": "--cron",
         "duration": "--duration", "deadline": "--deadline", "target": "--target",
         "weight": "--weight", "status": "--status", "lease": "--lease", "grace": "--grace",
         "timeout": "--timeout", "processes": "--processes", "since": "--since",
         "by": "--by", "concurrency": "--concurrency", "claim_batch": "--claim-batch",
         "lease_s": "--lease", "shutdown_grace_s": "--grace",
         "error_class": "--error-class", "pool": "--pool", "share": "--share",
         "for": "--for", "min_gain": "--min-gain", "min_tasks": "--min-tasks"}


def fail(exc: BaseException) -> None:
    """Print ``error: ...`` (what was wrong and what to do) and exit with code 2."""
    text = str(exc)
    if isinstance(exc, SpecError) and exc.line is None and exc.field in FLAGS:
        text = f"{FLAGS[exc.field]}: {exc.reason}"
    console.print(f"error: {text}", markup=False)
    raise typer.Exit(FAILED)


def _quiet_stdout() -> None:
    """Stdout's reader is gone: what is still buffered for it goes nowhere (else the
    interpreter's flush at exit reports the broken pipe again)."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def handles_errors(fn: Callable[P, T]) -> Callable[P, T]:
    """The CLI's one error boundary: a :class:`LockgateError` (or an ``OSError`` on a
    path the user gave, or a number beyond a database column's range) becomes one clear
    message and exit code 2 (never a traceback);
    Ctrl-C ends with exit code 130, and a closed output pipe (``| head``) quietly with
    141."""
    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return fn(*args, **kwargs)
        except LockgateError as exc:
            fail(exc)
        except BrokenPipeError:  # the reader went away (``export | head``): as `yes | head`
            _quiet_stdout()
            raise typer.Exit(BROKEN_PIPE) from None
        except OSError as exc:  # a file or folder the user named that cannot be used
            fail(LockgateError(f"cannot use {exc.filename}: {exc.strerror}"
                               if exc.filename is not None else str(exc)))
        except OverflowError as exc:  # a number given beyond what the database holds
            fail(LockgateError(f"a number given is out of range ({exc}); ids and counts "
                               f"go up to {2**63 - 1:,}"))
        except KeyboardInterrupt:
            console.print("interrupted", markup=False)
            raise typer.Exit(INTERRUPTED) from None
        raise AssertionError("unreachable")
    return wrapper


def command(group: typer.Typer, name: str | None = None,
            **kwargs: Any) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Register a command on ``group`` behind the error boundary."""
    def deco(fn: Callable[P, T]) -> Callable[P, T]:
        kwargs.setdefault("cls", Command)
        group.command(name, **kwargs)(handles_errors(fn))
        return fn
    return deco


#: The longest pause between a worker's attempts to open a database that refuses
#: connections for now (seconds).
OPEN_RETRY_MAX_S = 5.0

log = logging.getLogger("lockgate.cli")


def _open_waiting(db: str | None, config: Path | None, create: bool) -> Lockgate:
    """Open the database, waiting with back-off (until stopped: Ctrl-C or SIGTERM) for
    as long as its server answers but takes no connection for now: too many
    connections, a connection limit, starting up, shutting down, recovering; or that
    took the session and dropped it (a restart, a session killed); or, on SQLite, as
    long as the file is locked by another writer or its disk is full or cannot be
    written (the one-line warning says which, and what to check). Anything else (a
    login refused, a database that does not exist, a bad URL, a server that cannot be
    reached at all: most often a wrong host or port, a read-only SQLite file) is raised
    at once. Another process's schema migration is waited for too, however long it
    takes (MySQL/MariaDB bound each wait for its lock: the wait is taken again, with a
    warning each time)."""
    failures = 0
    started = time.monotonic()
    while True:
        try:
            return Lockgate(db, config=config, create=create, migrate=create)
        except MigrationLockBusy:
            log.warning("waiting for another process's schema migration (%d s so far)",
                        time.monotonic() - started)
        except LockgateError as exc:
            if not (refused_for_now(exc) or dropped_for_now(exc) or sqlite_passing(exc)):
                raise
            failures += 1
            delay = min(OPEN_RETRY_MAX_S, 0.25 * 2 ** (failures - 1))
            (log.warning if failures <= 3 or failures % 10 == 0 else log.debug)(
                "waiting for the database (%d attempt(s) so far), next in %.1fs: %s",
                failures, delay, exc)
            time.sleep(delay)


@contextmanager
def opened(db: str | None, config: Path | None = None, *,
           create: bool = False, wait: bool = False) -> Iterator[Lockgate]:
    """The database of a command. Only commands that write tasks or prompts (``init``,
    ``submit``, ``run``, ``worker``, ``prompt create``, ``dataset add``) may create it;
    every other command refuses a database that does not exist, and read-only ones
    never migrate it. With ``wait`` (``lockgate worker``) a server that takes no
    connection for now, or a SQLite file locked or on a full disk, is waited for
    (:func:`_open_waiting`); other commands fail at once, saying why."""
    lg = (_open_waiting(db, config, create) if wait else
          Lockgate(db, config=config, create=create, migrate=create))
    try:
        yield lg
    finally:
        lg.close()


@contextmanager
def opened_for_change(db: str | None, config: Path | None = None) -> Iterator[Lockgate]:
    """The database of a command that changes rows of an existing database (retry,
    cancel, cleanup, bind, rollback ...): it is upgraded if old, never created."""
    lg = Lockgate(db, config=config, create=False, migrate=True)
    try:
        yield lg
    finally:
        lg.close()


def seconds(value: str | None, field: str, *, allow_zero: bool = True) -> float | None:
    """A duration flag's value in seconds (the one grammar, :mod:`lockgate.durations`)."""
    if value is None:
        return None
    return parse_duration(value, field=field, allow_zero=allow_zero)


DURATION_HELP = EXAMPLES


def when(t: datetime | int | None) -> str:
    """A time as every command shows it: local time, to the second."""
    if t is None:
        return "-"
    if isinstance(t, int):
        t = utc(t)
        assert t is not None
    return t.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def table(title: str, columns: list[str] | tuple[str, ...], *,
          right: tuple[str, ...] = ()) -> Table:
    """A table that fits a narrow terminal without cutting a word to "…": the
    ``right``-aligned (numeric) columns keep their width, the others wrap."""
    t = Table(title=title)
    for col in columns:
        if col in right:
            t.add_column(col, justify="right", no_wrap=True)
        else:
            t.add_column(col, overflow="fold")
    return t


def print_json(value: Any) -> None:
    """``value`` as indented JSON on stdout (dataclasses through ``to_dict``)."""
    sys.stdout.write(orjson.dumps(plain(value), option=orjson.OPT_INDENT_2,
                                  default=_json_default).decode() + "\n")


def _json_default(value: Any) -> Any:
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if hasattr(value, "__dataclass_fields__"):
        return {k: getattr(value, k) for k in value.__dataclass_fields__}
    return str(value)
