"""``lockgate tasks show|retry|cancel|resolve``: one task, or a batch's failed tasks at
once; ``resolve`` completes a task held for review with a person's result."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import orjson
import typer

from lockgate.cli._common import (
    ActorOpt,
    ConfigOpt,
    DbOpt,
    ReasonOpt,
    app,
    command,
    console,
    opened,
    opened_for_change,
    print_json,
)
from lockgate.errors import LockgateError, SpecError
from lockgate.registry.content import read_text

tasks_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                        help="Inspect a task; run failed tasks again; cancel tasks; "
                             "resolve tasks held for review.")
app.add_typer(tasks_app, name="tasks")


@command(tasks_app, "show")
def show(task_id: str, db: DbOpt = None) -> None:
    """A task with its input, config, result or error, and every attempt (JSON)."""
    with opened(db) as lg:
        print_json(lg.task(task_id))


@command(tasks_app, "retry")
def retry(task_id: Annotated[str | None, typer.Argument(
              help="the task to run again (or give --batch)")] = None,
          batch: Annotated[str | None, typer.Option(
              "--batch", help="run again every task of this batch in --status")] = None,
          status: Annotated[list[str] | None, typer.Option(
              "--status", help="with --batch: FAILED, DEAD or CANCELLED (repeatable) "
                               "[FAILED and DEAD]")] = None,
          error_class: Annotated[str | None, typer.Option(
              "--error-class", help="with --batch: only tasks that ended with this error "
                                    "class, e.g. connection_error")] = None,
          db: DbOpt = None) -> None:
    """Run a FAILED, DEAD or CANCELLED task again with a fresh attempt budget, or every
    such task of a batch at once (one transaction; running it twice does nothing more)."""
    if (task_id is None) == (batch is None):
        raise LockgateError("give a TASK_ID or --batch BATCH (not both)")
    if batch is None and (status or error_class):
        raise LockgateError("--status and --error-class go with --batch")
    with opened_for_change(db) as lg:
        if task_id is not None:
            lg.retry(task_id)
            console.print(f"task {task_id} is PENDING again", markup=False)
            return
        assert batch is not None
        n = lg.retry_batch(batch, statuses=status or ("FAILED", "DEAD"),
                           error_class=error_class)
    which = " or ".join(s.upper() for s in status or ("FAILED", "DEAD"))
    console.print(f"batch {batch}: {n:,} {which} task(s)"
                  + (f" with error class {error_class}" if error_class else "")
                  + " PENDING again", markup=False)


@command(tasks_app, "cancel")
def cancel(task_id: str, db: DbOpt = None) -> None:
    """Cancel a PENDING task (a worker holding it will have its write-back fenced), or
    one held for review (REVIEW)."""
    with opened_for_change(db) as lg:
        lg.cancel(task_id)
    console.print(f"task {task_id} is CANCELLED", markup=False)


def _result_arg(value: str) -> Any:
    """``--result``: JSON text, or ``@FILE`` holding it (UTF-8 text: a file that cannot
    be read or is not UTF-8 is refused naming it, never with a traceback)."""
    from lockgate.files import big_int_field  # deferred: start-up time

    text = value
    if value.startswith("@"):
        path = Path(value[1:])
        try:
            text = read_text(path, "the result file")
        except SpecError as exc:
            raise SpecError(f"{exc.reason}; give JSON text, or @FILE of a UTF-8 text file",
                            field="result") from None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise SpecError(f"not JSON ({exc}); a text result is a JSON string, e.g. "
                        "'\"yes\"'", field="result") from None
    where = big_int_field(text.encode())
    if where is not None:  # orjson read it as a float: its digits would be lost
        raise SpecError("holds an integer beyond 64 bits, which would be read as a float "
                        "and lose digits: write it as a string",
                        field=f"result.{where}" if where else "result")
    return value


@command(tasks_app, "resolve")
def resolve(task_id: str,
            result: Annotated[str, typer.Option(
                "--result", metavar="JSON|@FILE",
                help="the task's result: JSON text, or @FILE holding it; checked against "
                     "the task's output schema")],
            db: DbOpt = None, config: ConfigOpt = None, actor: ActorOpt = None,
            reason: ReasonOpt = None) -> None:
    """Complete a task held for review (REVIEW -> SUCCEEDED) with a person's result."""
    value = _result_arg(result)
    with opened_for_change(db, config) as lg:
        lg.resolve(task_id, value, actor=actor, reason=reason)
    console.print(f"task {task_id} is SUCCEEDED (resolved)", markup=False)
