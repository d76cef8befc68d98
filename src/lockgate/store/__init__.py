"""Persistent state: schema, migrations, queue operations and dialect differences."""

from lockgate.store.store import Store, SubmitReport
from lockgate.store.types import ClaimedTask, Finish, FinishReport

__all__ = ["ClaimedTask", "Finish", "FinishReport", "Store", "SubmitReport"]
