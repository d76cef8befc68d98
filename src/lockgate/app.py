"""The Python API: ``lockgate.connect(url)`` (blocking) and ``lockgate.connect_async(url)``.

Example::

    import lockgate
    lg = lockgate.connect("postgresql://app@db/lockgate")
    lg.submit_file("tasks.jsonl")
    lg.run_worker(burst=True)          # or run `lockgate worker` on many machines
    for row in lg.results("tasks"):
        print(row["task_id"], row["status"], row["result"])
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from lockgate.config import Settings, load_settings
from lockgate.errors import SpecError
from lockgate.files import Format, check_file, check_spec, describe_rejects, valid_specs
from lockgate.spec import TaskSpec, parse_task
from lockgate.store import Store, SubmitReport
from lockgate.worker import Worker, WorkerStats


def run_async(coro: Any) -> Any:
    """Run a coroutine on uvloop where installed, else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a declared dependency on POSIX
        return asyncio.run(coro)
    return uvloop.run(coro)


def _as_spec(task: TaskSpec | dict[str, Any], index: int) -> TaskSpec:
    spec = task if isinstance(task, TaskSpec) else parse_task(task, line=index)
    check_spec(spec)
    return spec


class Lockgate:
    """A handle on one lockgate database (blocking calls)."""

    def __init__(self, url: str | None = None, *, settings: Settings | None = None,
                 config: str | Path | None = None, migrate: bool = True) -> None:
        self.settings = settings or load_settings(config)
        self.store = Store(url)
        if migrate:
            self.store.migrate()

    def close(self) -> None:
        """Close the database connections."""
        self.store.close()

    def __enter__(self) -> Lockgate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, tasks: Iterable[TaskSpec | dict[str, Any]], *,
               batch_id: str = "default") -> SubmitReport:
        """Validate every task, then insert them all in one transaction (idempotent)."""
        specs = [_as_spec(t, i) for i, t in enumerate(tasks, start=1)]
        return self.store.submit(specs, batch_id=batch_id)

    def submit_file(self, path: str | Path, *, format: Format = "tasks",
                    batch_id: str | None = None, skip_invalid: bool = False,
                    rejects: str | Path | None = None,
                    progress: Callable[[int], None] | None = None) -> SubmitReport:
        """Submit a JSONL file; nothing is submitted if a line is bad (unless skipping)."""
        p = Path(path)
        sink = open(rejects, "w", encoding="utf-8") if rejects else None  # noqa: SIM115
        try:
            checked = check_file(p, format, reject_sink=sink)
        finally:
            if sink:
                sink.close()
        if checked.rejected and not skip_invalid:
            raise SpecError(
                f"{p}: {len(checked.rejected)} bad line(s); nothing was submitted. Fix them, "
                f"or pass --skip-invalid to submit the {checked.valid} good line(s):\n"
                + describe_rejects(checked.rejected))
        skip = {n for n, _ in checked.rejected}
        return self.store.submit(valid_specs(p, format, skip), batch_id=batch_id or p.stem,
                                 source=str(p), progress=progress)

    def worker(self, *, burst: bool = False, **overrides: Any) -> Worker:
        """A worker bound to this database (run it with ``asyncio``/``run_worker``)."""
        settings = self.settings
        if overrides:
            settings = settings.model_copy(update={
                "worker": settings.worker.model_copy(update=overrides)})
        return Worker(self.store, settings, burst=burst)

    def run_worker(self, *, burst: bool = False, **overrides: Any) -> WorkerStats:
        """Work tasks until stopped (SIGTERM/SIGINT) or, with ``burst``, until drained."""
        stats: WorkerStats = run_async(self.worker(burst=burst, **overrides).run())
        return stats

    def status(self) -> dict[str, Any]:
        """Counts per batch and state, leases in flight, live workers."""
        return self.store.status()

    def results(self, batch_id: str | None = None) -> Iterator[dict[str, Any]]:
        """Every task of a batch with its result or error, streamed."""
        return self.store.results(batch_id)

    def task(self, task_id: str) -> dict[str, Any]:
        """A task, its config and its attempts."""
        return self.store.task(task_id)

    def retry(self, task_id: str) -> None:
        """Run a FAILED, DEAD or CANCELLED task again."""
        self.store.retry(task_id)

    def cancel(self, task_id: str) -> None:
        """Cancel a PENDING task."""
        self.store.cancel(task_id)


class AsyncLockgate:
    """The same API for asyncio programs; database calls run in a worker thread."""

    def __init__(self, sync: Lockgate) -> None:
        self.sync = sync

    async def submit(self, tasks: Iterable[TaskSpec | dict[str, Any]], *,
                     batch_id: str = "default") -> SubmitReport:
        return await asyncio.to_thread(self.sync.submit, list(tasks), batch_id=batch_id)

    async def submit_file(self, path: str | Path, **kwargs: Any) -> SubmitReport:
        return await asyncio.to_thread(self.sync.submit_file, path, **kwargs)

    async def run_worker(self, *, burst: bool = False, **overrides: Any) -> WorkerStats:
        return await self.sync.worker(burst=burst, **overrides).run()

    async def status(self) -> dict[str, Any]:
        return await asyncio.to_thread(self.sync.status)

    async def results(self, batch_id: str | None = None) -> list[dict[str, Any]]:
        return await asyncio.to_thread(lambda: list(self.sync.results(batch_id)))

    async def task(self, task_id: str) -> dict[str, Any]:
        return await asyncio.to_thread(self.sync.task, task_id)

    async def retry(self, task_id: str) -> None:
        await asyncio.to_thread(self.sync.retry, task_id)

    async def cancel(self, task_id: str) -> None:
        await asyncio.to_thread(self.sync.cancel, task_id)

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncLockgate:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def connect(url: str | None = None, *, config: str | Path | None = None,
            settings: Settings | None = None) -> Lockgate:
    """Open a lockgate database (default ``$LOCKGATE_DATABASE_URL`` or SQLite), migrated."""
    return Lockgate(url, config=config, settings=settings)


async def connect_async(url: str | None = None, *, config: str | Path | None = None,
                        settings: Settings | None = None) -> AsyncLockgate:
    """The asyncio variant of :func:`connect`."""
    return AsyncLockgate(await asyncio.to_thread(Lockgate, url, config=config,
                                                 settings=settings))
