"""Persistent state: schema, migrations, queue operations and dialect differences."""

from lockgate.store.store import Store, SubmitReport
from lockgate.store.types import TERMINAL, ClaimedTask, Finish, FinishReport, TaskStatus

__all__ = ["TERMINAL", "ClaimedTask", "Finish", "FinishReport", "Store", "SubmitReport",
           "TaskStatus"]
