"""The worker: claim loop, execution, write-behind, lease renewal, heartbeat."""

from lockgate.worker.execute import AttemptResult, Decision, decide, run_attempt
from lockgate.worker.worker import Worker, WorkerStats

__all__ = ["AttemptResult", "Decision", "Worker", "WorkerStats", "decide", "run_attempt"]
