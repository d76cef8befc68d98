"""The demo job: 5,000 synthetic Chinese customer complaints labelled three ways
(category, emotion 1-5, summary) on SQLite, against the built-in simulator with
realistic faults. Run it with ``make demo``.

1. start the simulator (lognormal latency around 200 ms, ~1% 429 with Retry-After,
   ~0.5% 500, ~2% malformed or chatty output);
2. generate the tasks (examples/complaints/generate.py) and submit them;
3. work them with a progress bar (rate, ETA);
4. print the summary: tasks by terminal state, retries, calls, duplicate calls,
   throughput, latency percentiles, field completeness, and label accuracy;
5. the release gate: register the prompt (v1 live), add a regular and a hard labelled
   dataset, bind them with thresholds, propose v2 (better rules) and v3 (worse rules),
   and let the workers evaluate them. The decisions are real outcomes of evaluation:
   the simulator follows the labelling rules each prompt states.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
from pathlib import Path

import orjson
from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "complaints"))
import generate  # noqa: E402

import lockgate  # noqa: E402
from lockgate.simulator.testing import SimulatorProcess  # noqa: E402

SIMULATOR = {
    "latency": {"kind": "lognormal", "mean_ms": 200, "sigma": 0.5},
    "rate_429": 0.01,
    "retry_after_ms": 500,
    "rate_500": 0.005,
    "rate_malformed": 0.01,
    "rate_chatty": 0.01,
    "seed": 7,
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=5000)
    ap.add_argument("--out", type=Path, default=Path("demo-out"))
    ap.add_argument("--gate-items", type=int, default=200,
                    help="items per release-gate dataset")
    a = ap.parse_args()
    console = Console()
    if a.out.exists():
        shutil.rmtree(a.out)
    a.out.mkdir(parents=True)
    tasks_file = a.out / "complaints.jsonl"
    prompt = generate.load_prompt(HERE / "complaints" / "prompt_v1.txt")
    lines = list(generate.tasks(a.count, 20261201, prompt, "20261201", "complaints", 0.2))
    tasks_file.write_bytes(b"".join(orjson.dumps(t) + b"\n" for t in lines))
    expected = {t["task_id"]: t["metadata"]["expected"] for t in lines}
    console.print(f"[bold]lockgate demo[/bold]: {a.count:,} complaints -> {tasks_file}")

    with SimulatorProcess(SIMULATOR) as sim:
        console.print(f"simulator at {sim.url}: lognormal ~200 ms, 1% 429, 0.5% 500, "
                      "2% malformed/chatty output")
        settings = lockgate.config.Settings(
            endpoint=(lockgate.config.Endpoint(name="simulator", base_url=sim.url),))
        with lockgate.connect(f"sqlite:///{a.out / 'demo.db'}", settings=settings) as lg:
            report = lg.submit_file(tasks_file, batch_id="complaints")
            console.print(f"submitted {report.inserted:,} tasks (batch complaints)")
            elapsed = work(lg, console, report.inserted)
            summary = lg.summary("complaints", elapsed)
            right = {"category": 0, "emotion": 0}
            scored = 0
            for row in lg.results("complaints"):
                if row.status != "SUCCEEDED":
                    continue
                scored += 1
                for k in right:
                    right[k] += row.result.get(k) == expected[row.task_id][k]
            stats = sim.stats()
            extra = {
                "simulator requests": f"{stats.get('requests', 0):,}",
                "simulator duplicate successes": f"{stats.get('duplicate_successes', 0):,}",
            }
            for k, v in right.items():
                extra[f"{k} accuracy (vs ground truth)"] = (
                    f"{v / scored * 100:.1f}%" if scored else "-")
            console.print(summary_table(summary, extra))
            export = a.out / "results.jsonl"
            with export.open("w", encoding="utf-8") as fh:
                lockgate.files.write_jsonl(lg.results("complaints"), fh)
            console.print(f"results: {export}   database: {a.out / 'demo.db'}")
            gate_act(lg, console, a.gate_items)
            console.print("try: .venv/bin/lockgate status --db sqlite:///demo-out/demo.db")
            console.print("     .venv/bin/lockgate prompt history complaints "
                          "--db sqlite:///demo-out/demo.db")
    return 0


#: What the gate checks, per dataset (SPEC G3): category and emotion must both be right.
REGULAR = {"thresholds": ["accuracy>=0.95", "error_ratio<=0.02", "latency_p95_ms<=10000"],
           "comparison": "fields:category,emotion", "non_inferiority": 0.02}
HARD = {"thresholds": ["accuracy>=0.80", "error_ratio<=0.05"],
        "comparison": "fields:category,emotion", "confidence": 0.95, "min_samples": 100}


def gate_act(lg: lockgate.Lockgate, console: Console, items: int) -> None:
    """Register the prompt, bind two datasets, and gate v2 and v3 through evaluation."""
    console.rule("[bold]release gate")
    first = next(generate.tasks(1, 1, [], "x", "x", 0.0))  # the labelling job's configs
    lg.prompts.create("complaints", generate.load_prompt(HERE / "complaints" / "prompt_v1.txt"),
                      model_config=first["model_config"], delivery_rule=first["delivery_rule"],
                      tag="prompt-v1.0.0", note="the prompt of the labelling job")
    for kind, binding in (("regular", REGULAR), ("hard", HARD)):
        lg.datasets.add(kind, list(generate.dataset(kind, items, 20261201)))
        lg.gate.bind("complaints", kind, **binding)  # type: ignore[arg-type]
    console.print(f"prompt complaints v1 is live; datasets regular and hard "
                  f"({items} labelled complaints each) bound:\n"
                  f"  regular: {', '.join(REGULAR['thresholds'])}, not worse than live by "
                  f"more than 0.02\n  hard:    {', '.join(HARD['thresholds'])}, "
                  "Wilson lower bound at 95%, at least 100 samples")
    for version, tag, why in (("v2", "prompt-v1.1.0", "more keywords per category"),
                              ("v3", "prompt-v1.2.0", "rules removed, one wrong rule")):
        template = generate.load_prompt(HERE / "complaints" / f"prompt_{version}.txt")
        proposal = lg.prompts.propose("complaints", template, tag=tag, note=why)
        console.print(f"\nproposed {version} ({why}): update {proposal.update_id}, "
                      f"evaluating against live v{proposal.base_version} ...")
        status = evaluate(lg, console, proposal.update_id)
        console.print(decision_table(status))
        console.print(f"live version now: v{lg.prompts.version('complaints').version}")


def work(lg: lockgate.Lockgate, console: Console, total: int) -> float:
    """A burst worker with a progress bar (rate and elapsed time); returns seconds."""
    t0 = time.perf_counter()
    with Progress(TextColumn("[bold]working"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[rate]}"), TimeElapsedColumn(),
                  console=console) as progress:
        bar = progress.add_task("work", total=total, rate="")

        def show(stats: lockgate.WorkerStats) -> None:
            rate = stats.finished / max(1e-9, time.perf_counter() - t0)
            progress.update(bar, completed=stats.finished, rate=f"{rate:,.0f} tasks/s")

        lg.run_worker(burst=True, on_progress=show)
    return time.perf_counter() - t0


def summary_table(s: lockgate.BatchSummary, extra: dict[str, str]) -> Table:
    """The batch's summary: states, calls, retries, duplicates, latency, completeness."""
    t = Table(title=f"batch {s.batch_id}", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value", justify="right")
    for state, n in sorted(s.states.items()):
        t.add_row(f"tasks {state}", f"{n:,}")
    t.add_row("calls made", f"{s.calls:,}")
    t.add_row("retries", f"{s.retries:,}")
    t.add_row("duplicate calls (discarded write-backs)", f"{s.duplicate_calls:,}")
    t.add_row("errors by class", ", ".join(f"{k} {v}" for k, v in sorted(s.errors.items()))
              or "-")
    t.add_row("throughput", f"{s.throughput or 0:,.1f} tasks/s")
    for q, ms in s.latency_ms.items():
        t.add_row(f"latency {q}", "-" if ms is None else f"{ms:,.0f} ms")
    comp = s.completeness
    t.add_row("field completeness", "-" if comp is None else f"{comp * 100:.2f}%")
    for k, v in extra.items():
        t.add_row(k, v)
    return t


def progress_table(st: dict) -> Table:
    """Per run of an evaluation: items materialised, tasks done, verdicts."""
    t = Table(title=f"update {st['id']}: v{st['candidate_version']} against "
                    f"v{st['base_version']}  {st['status']}")
    for col in ("dataset", "run", "status", "done", "match / mismatch / error"):
        t.add_column(col)
    for r in st["runs"]:
        total = sum(r["tasks"].values())
        v = r["verdicts"]
        t.add_row(r["dataset"], f"v{r['version']}" + (" (live)" if r["subject"] == "baseline"
                                                      else ""),
                  r["status"], f"{total - r['tasks'].get('PENDING', 0)}/{total}",
                  f"{v.get('MATCH', 0)} / {v.get('MISMATCH', 0)} / {v.get('ERROR', 0)}")
    return t


def decision_table(st: dict) -> Table:
    """Each metric of each dataset against its threshold."""
    t = Table(title=f"decision: {st['status']}" + (f" ({st['reason']})" if st.get("reason")
                                                  else ""))
    for col in ("dataset", "metric", "value", "threshold", "result"):
        t.add_column(col)
    for ds in (st.get("decision") or {}).get("datasets", []):
        for c in ds["checks"]:
            limit = "-" if c["threshold"] is None else f"{c['op']} {c['threshold']:g}"
            value = "undefined" if c["value"] is None else f"{c['value']:.4g}"
            name = c["metric"] if c["kind"] == "threshold" else f"{c['metric']} vs live"
            t.add_row(ds["dataset"], name, value, limit,
                      "[green]pass[/green]" if c["passed"] else "[red]FAIL[/red]")
    return t


def evaluate(lg: lockgate.Lockgate, console: Console, update_id: int) -> dict:
    """Run a burst worker (it runs the gate's roles too) and show progress until decided."""
    thread = threading.Thread(target=lambda: lg.run_worker(burst=True), name="demo-worker")
    thread.start()
    with Live(console=console, refresh_per_second=4, transient=True) as live:
        while True:
            status = lg.gate.status(update_id)
            live.update(progress_table(status))
            if status["terminal"] and not thread.is_alive():
                break
            time.sleep(0.25)
    thread.join()
    console.print(progress_table(status))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
