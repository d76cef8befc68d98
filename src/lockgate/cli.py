"""The command line: ``lockgate init|submit|run|worker|status|export|tasks|simulate|cleanup``
and, from cli_registry.py, ``prompt|dataset|bind|gate``."""

from __future__ import annotations

import logging
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from lockgate.app import Lockgate
from lockgate.cli_registry import register as register_registry
from lockgate.errors import LockgateError
from lockgate.files import WRITERS
from lockgate.flow.status import report as flow_report
from lockgate.flow.window import BatchPlan, plan_from_options
from lockgate.report import summarize, summary_table

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Durable, leased LLM prompt tasks on SQL databases.")
tasks_app = typer.Typer(no_args_is_help=True, help="Inspect and operate on single tasks.")
app.add_typer(tasks_app, name="tasks")
register_registry(app)  # prompt, dataset, bind, gate (cli_registry.py)
console = Console(stderr=True)
out = Console()

DbOpt = Annotated[str | None, typer.Option("--db", envvar="LOCKGATE_DATABASE_URL",
                                           help="database URL [default: sqlite:///lockgate.db]")]
ConfigOpt = Annotated[Path | None, typer.Option("--config", envvar="LOCKGATE_CONFIG",
                                                help="TOML file with endpoints and [worker]")]
FormatOpt = Annotated[str, typer.Option("--format", help="tasks | openai-batch")]


def _open(db: str | None, config: Path | None = None) -> Lockgate:
    return Lockgate(db, config=config)


def _fail(exc: Exception) -> None:
    console.print(f"[red]error:[/red] {exc}", markup=True, highlight=False)
    raise typer.Exit(2)


def _progress(auto_refresh: bool = True) -> Progress:
    """A progress bar; without ``auto_refresh`` it starts no thread of its own and is
    redrawn on each update (worker processes are forked only from a single thread)."""
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TaskProgressColumn(), TextColumn("{task.fields[rate]}"),
                    TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                    console=console, transient=False, auto_refresh=auto_refresh)


def _submit(lg: Lockgate, file: Path, fmt: str, batch: str | None, skip_invalid: bool,
            rejects: Path | None, plan: BatchPlan | None = None) -> str:
    if fmt not in ("tasks", "openai-batch"):
        raise LockgateError(f"--format must be tasks or openai-batch, not {fmt!r}")
    if skip_invalid and rejects is None:
        rejects = file.with_suffix(".rejects.jsonl")
    with _progress() as prog:
        bar = prog.add_task("submitting", total=None, rate="")
        report = lg.submit_file(file, format=fmt, batch_id=batch,  # type: ignore[arg-type]
                                skip_invalid=skip_invalid, rejects=rejects,
                                progress=lambda n: prog.advance(bar, n), plan=plan)
    console.print(f"batch [bold]{report.batch_id}[/bold]: {report.inserted:,} submitted, "
                  f"{report.duplicates:,} already present (skipped)")
    if report.elsewhere:
        where = ", ".join(f"{n:,} in batch '{b}'" for b, n in sorted(report.elsewhere.items()))
        console.print(f"[yellow]{sum(report.elsewhere.values()):,} task id(s) already belong "
                      f"to another batch ({where}); they were not moved"
                      + ("" if report.inserted else
                         f", and batch '{report.batch_id}' was not created") + "[/yellow]")
    if skip_invalid and rejects is not None and rejects.stat().st_size:
        console.print(f"rejected lines written to {rejects}")
    return report.batch_id


@app.command()
def init(db: DbOpt = None) -> None:
    """Create or upgrade the database schema."""
    try:
        lg = _open(db)
        lg.close()
    except LockgateError as exc:
        _fail(exc)
    console.print("schema is up to date")


@app.command()
def submit(file: Path, db: DbOpt = None, fmt: FormatOpt = "tasks",
           batch: Annotated[str | None, typer.Option(help="batch id [default: file stem]")] = None,
           skip_invalid: Annotated[bool, typer.Option(
               "--skip-invalid", help="submit the good lines, write rejects to a file")] = False,
           rejects: Annotated[Path | None, typer.Option(help="where rejects go")] = None,
           config: ConfigOpt = None,
           window: Annotated[str | None, typer.Option(
               help="time window HH:MM-HH:MM (local time): tasks start at its start and "
                    "are paced to finish inside it")] = None,
           cron: Annotated[str | None, typer.Option(
               help="window start from a cron expression, e.g. '0 2 * * *'")] = None,
           duration: Annotated[str | None, typer.Option(
               help="window length with --cron, e.g. 90m")] = None,
           target: Annotated[float | None, typer.Option(
               help="window target tasks/s [tasks / window length]")] = None,
           weight: Annotated[float | None, typer.Option(
               help="SLA base weight of the batch [1]")] = None,
           deadline: Annotated[str | None, typer.Option(
               help="deadline (ISO time or +90m): urgency grows as it nears")] = None) -> None:
    """Submit a task file (idempotent on task_id; nothing is half-submitted)."""
    try:
        plan = plan_from_options(window=window, cron=cron, duration=duration, weight=weight,
                                 deadline=deadline, target=target,
                                 now=datetime.now().astimezone())
    except ValueError as exc:
        _fail(LockgateError(str(exc)))
    try:
        with _open(db, config) as lg:
            _submit(lg, file, fmt, batch, skip_invalid, rejects, plan)
    except LockgateError as exc:
        _fail(exc)
    if plan is not None and plan.window is not None:
        w = plan.window
        console.print(f"window {_clock(w.start_ms)} - {_clock(w.end_ms)}: tasks start at "
                      "its start and are paced to finish inside it")


def _clock(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000).astimezone().strftime("%m-%d %H:%M:%S")


WorkerOpts = dict[str, Any]


def _worker_overrides(concurrency: int | None, claim_batch: int | None,
                      lease: float | None, grace: float | None) -> WorkerOpts:
    return {k: v for k, v in {"concurrency": concurrency, "claim_batch": claim_batch,
                              "lease_s": lease, "shutdown_grace_s": grace}.items()
            if v is not None}


ConcOpt = Annotated[int | None, typer.Option(help="calls in flight per process")]
BatchOpt = Annotated[int | None, typer.Option(help="rows per claim")]
LeaseOpt = Annotated[float | None, typer.Option(help="lease seconds (renewed at 1/3)")]
GraceOpt = Annotated[float | None, typer.Option(help="seconds to finish calls on SIGTERM")]
ProcOpt = Annotated[int, typer.Option(
    "--processes", "-p", min=1, max=256,
    help="worker processes on this machine (each uses about one core)")]


@app.command()
def worker(db: DbOpt = None, config: ConfigOpt = None, concurrency: ConcOpt = None,
           claim_batch: BatchOpt = None, lease: LeaseOpt = None, grace: GraceOpt = None,
           burst: Annotated[bool, typer.Option(help="exit when no task is pending")] = False,
           gate: Annotated[bool, typer.Option(help="also run the release gate's roles")]
           = True,
           pool: Annotated[str | None, typer.Option(
               help="serve only this pool (endpoint.pool) [all pools]")] = None,
           processes: ProcOpt = 1,
           log_level: Annotated[str, typer.Option(help="logging level")] = "WARNING") -> None:
    """Work tasks until SIGTERM/SIGINT. Run any number, on any number of machines."""
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    overrides = {**_worker_overrides(concurrency, claim_batch, lease, grace),
                 **({"pool": pool} if pool else {})}
    try:
        with _open(db, config) as lg:
            ws = lg.settings.worker.model_copy(update=overrides)
            console.print(f"{processes} worker process(es) on {lg.store.dialect.name}: "
                          f"concurrency {ws.concurrency} each, lease {ws.lease_s:g}s"
                          if processes > 1 else
                          f"worker on {lg.store.dialect.name}: concurrency "
                          f"{ws.concurrency}, lease {ws.lease_s:g}s")
            stats = lg.run_worker(burst=burst, gate=gate, processes=processes,
                                  log_level=log_level, **overrides)
    except LockgateError as exc:
        _fail(exc)
    console.print(f"worker stopped: {stats.succeeded:,} succeeded, {stats.failed:,} failed, "
                  f"{stats.dead:,} dead, {stats.retried:,} retried, "
                  f"{stats.discarded:,} discarded")


def run_batch(lg: Lockgate, batch_id: str, processes: int = 1, **overrides: Any) -> float:
    """Work until the queue is drained, with a progress bar for ``batch_id``."""
    counts = lg.store.batch_counts(batch_id)
    total = sum(counts.values())
    done0 = total - counts.get("PENDING", 0)
    t0 = time.perf_counter()
    with _progress(auto_refresh=processes == 1) as prog:
        bar = prog.add_task(f"batch {batch_id}", total=total, completed=done0, rate="")

        def show(done: int) -> None:
            elapsed = time.perf_counter() - t0
            rate = (done - done0) / elapsed if elapsed > 0 else 0.0
            prog.update(bar, completed=done, rate=f"{rate:,.0f} tasks/s",
                        refresh=processes > 1)

        def poll() -> None:  # most workers are other processes: read the database
            c = lg.store.batch_counts(batch_id)
            show(sum(c.values()) - c.get("PENDING", 0))

        lg.run_worker(burst=True, processes=processes, tick=poll,
                      on_progress=lambda stats: show(done0 + stats.finished), **overrides)
        if processes > 1:
            poll()
    return time.perf_counter() - t0


@app.command()
def run(file: Path, db: DbOpt = None, config: ConfigOpt = None, fmt: FormatOpt = "tasks",
        batch: Annotated[str | None, typer.Option(help="batch id [default: file stem]")] = None,
        skip_invalid: Annotated[bool, typer.Option("--skip-invalid")] = False,
        concurrency: ConcOpt = None, claim_batch: BatchOpt = None,
        lease: LeaseOpt = None, processes: ProcOpt = 1) -> None:
    """Submit FILE and work until every task is finished (single machine)."""
    try:
        with _open(db, config) as lg:
            batch_id = _submit(lg, file, fmt, batch, skip_invalid, None)
            elapsed = run_batch(lg, batch_id, processes,
                                **_worker_overrides(concurrency, claim_batch, lease, None))
            out.print(summary_table(summarize(lg.store, batch_id, elapsed)))
    except LockgateError as exc:
        _fail(exc)


@app.command()
def status(db: DbOpt = None,
           as_json: Annotated[bool, typer.Option("--json", help="machine-readable")] = False,
           config: ConfigOpt = None) -> None:
    """Counts per state and batch, leases in flight, workers alive, endpoints and windows."""
    try:
        with _open(db, config) as lg:
            st = lg.status()
            st["flow"] = flow_report(lg.store, lg.settings, st["workers"])
    except LockgateError as exc:
        _fail(exc)
    if as_json:
        sys.stdout.write(orjson.dumps(st, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    states = ["PENDING", "SUCCEEDED", "FAILED", "DEAD", "CANCELLED"]
    t = Table(title="tasks")
    t.add_column("batch")
    for s in states:
        t.add_column(s, justify="right")
    for b, counts in sorted(st["batches"].items()):
        t.add_row(b, *[f"{counts.get(s, 0):,}" for s in states])
    out.print(t)
    out.print(f"leases in flight: {st['leased']:,}   backing off: {st['backing_off']:,}")
    w = Table(title=f"workers alive: {len(st['workers'])}")
    for col in ("id", "status", "in_flight", "claimed", "succeeded", "failed", "discarded",
                "heartbeat age"):
        w.add_column(col)
    for row in st["workers"]:
        w.add_row(row["id"], row["status"], str(row["in_flight"]), str(row["claimed"]),
                  str(row["succeeded"]), str(row["failed"]), str(row["discarded"]),
                  f"{(st['now'] - row['heartbeat_at']) / 1000:.1f}s")
    out.print(w)
    _print_flow(st["flow"])


def _print_flow(flow: dict[str, Any]) -> None:
    """Endpoints (limits, pauses, concurrency, health) and windows (projections)."""
    if flow["endpoints"]:
        t = Table(title="endpoints")
        for col in ("endpoint", "pool", "rpm", "tpm", "paused", "breaker", "concurrency",
                    "in flight", "waiting", "latency", "failures", "cost/1k calls",
                    "fallback"):
            t.add_column(col)
        for e in flow["endpoints"]:
            t.add_row(e["endpoint"], e["pool"] or "-", _num(e["rpm"]), _num(e["tpm"]),
                      f"{e['paused_s']:g}s ({e['pause_reason']})" if e["paused_s"] else "-",
                      e["breaker"], str(e["concurrency"]), str(e["in_flight"]),
                      str(e["waiting"]),
                      f"{e['latency_ms']:,.0f} ms" if e["latency_ms"] else "-",
                      f"{e['failure_rate']:.2%}" if e["failure_rate"] is not None else "-",
                      _num(e["cost_per_1k_calls"]), e["fallback"] or "-")
        out.print(t)
    if flow["windows"]:
        t = Table(title="windows")
        for col in ("batch", "window", "done", "target/s", "rate/s", "needs/s", "limits/s",
                    "projected finish", "status"):
            t.add_column(col)
        for w in flow["windows"]:
            done = w["total"] - w["remaining"]
            t.add_row(w["batch"], f"{_clock(w['window_start'])} - {_clock(w['window_end'])}",
                      f"{done:,}/{w['total']:,}", _num(w["target_per_s"]),
                      f"{w['rate_per_s']:,.1f}", f"{w['required_per_s']:,.1f}",
                      _num(w["capacity_per_s"]), _clock(w["projected_finish"]),
                      "ok" if w["warning"] is None else "WARNING")
        out.print(t)
        for w in flow["windows"]:
            if w["warning"]:
                console.print(f"[yellow]window {w['batch']}: {w['warning']}[/yellow]")


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:,.4g}"


@app.command()
def export(batch: str, db: DbOpt = None,
           fmt: Annotated[str, typer.Option("--format", help="jsonl | csv | openai-batch")]
           = "jsonl",
           output: Annotated[Path | None, typer.Option("--out", "-o", help="file [stdout]")]
           = None) -> None:
    """Write every task of BATCH: its result, or the precise error."""
    if fmt not in WRITERS:
        _fail(LockgateError(f"--format must be one of {sorted(WRITERS)}, not {fmt!r}"))
    try:
        with _open(db) as lg:
            if not lg.store.batch_exists(batch):
                raise LockgateError(f"no batch '{batch}'; `lockgate status` lists them")
            fh = output.open("w", encoding="utf-8", newline="") if output else sys.stdout
            try:
                n = WRITERS[fmt](lg.results(batch), fh)
            finally:
                if output:
                    fh.close()
    except LockgateError as exc:
        _fail(exc)
    console.print(f"exported {n:,} task(s)")


@tasks_app.command("show")
def tasks_show(task_id: str, db: DbOpt = None) -> None:
    """A task with its config, result or error, and every attempt."""
    try:
        with _open(db) as lg:
            row = lg.task(task_id)
    except LockgateError as exc:
        _fail(exc)
    sys.stdout.write(orjson.dumps(row, option=orjson.OPT_INDENT_2, default=str).decode() + "\n")


@tasks_app.command("retry")
def tasks_retry(task_id: str, db: DbOpt = None) -> None:
    """Run a FAILED, DEAD or CANCELLED task again with a fresh attempt budget."""
    try:
        with _open(db) as lg:
            lg.retry(task_id)
    except LockgateError as exc:
        _fail(exc)
    console.print(f"task {task_id} is PENDING again")


@tasks_app.command("cancel")
def tasks_cancel(task_id: str, db: DbOpt = None) -> None:
    """Cancel a PENDING task (a worker holding it will have its write-back fenced)."""
    try:
        with _open(db) as lg:
            lg.cancel(task_id)
    except LockgateError as exc:
        _fail(exc)
    console.print(f"task {task_id} is CANCELLED")


_UNITS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


@app.command()
def cleanup(older_than: Annotated[str, typer.Option(help="age, e.g. 30d, 12h")] = "30d",
            tasks: Annotated[bool, typer.Option("--tasks", help="also finished tasks")] = False,
            db: DbOpt = None) -> None:
    """Retention: delete attempt traces (and optionally finished tasks) older than an age."""
    try:
        n, unit = float(older_than[:-1]), older_than[-1]
        ms = int(n * _UNITS[unit])
    except (ValueError, KeyError, IndexError):
        _fail(LockgateError(f"--older-than takes a number and s/m/h/d, e.g. 30d, not "
                            f"{older_than!r}"))
    try:
        with _open(db) as lg:
            deleted = lg.store.cleanup(older_than_ms=ms, tasks=tasks)
    except LockgateError as exc:
        _fail(exc)
    console.print(f"deleted {deleted['attempts']:,} attempt(s), {deleted['tasks']:,} task(s)")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True,
                                "help_option_names": []})
def simulate(ctx: typer.Context) -> None:
    """Run the built-in OpenAI-compatible simulator (`lockgate simulate --help` for flags)."""
    from lockgate.simulator.cli import main as simulator_main

    raise typer.Exit(simulator_main(list(ctx.args)))


def main() -> None:
    """Entry point of the ``lockgate`` command."""
    app()


if __name__ == "__main__":
    main()
