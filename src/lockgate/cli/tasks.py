"""``lockgate tasks show|retry|cancel``: one task, or a batch's failed tasks at once."""

from __future__ import annotations

from typing import Annotated

import typer

from lockgate.cli._common import DbOpt, app, command, console, opened, opened_for_change, print_json
from lockgate.errors import LockgateError

tasks_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                        help="Inspect a task; run failed tasks again; cancel tasks.")
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
    """Cancel a PENDING task (a worker holding it will have its write-back fenced)."""
    with opened_for_change(db) as lg:
        lg.cancel(task_id)
    console.print(f"task {task_id} is CANCELLED", markup=False)
