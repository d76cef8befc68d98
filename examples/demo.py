"""The demo job: 5,000 synthetic Chinese customer complaints labelled three ways
(category, emotion 1-5, summary) on SQLite, against the built-in simulator with
realistic faults. Run it with ``make demo``.

1. start the simulator (lognormal latency around 200 ms, ~1% 429 with Retry-After,
   ~0.5% 500, ~2% malformed or chatty output);
2. generate the tasks (examples/complaints/generate.py) and submit them;
3. work them with a progress bar (rate, ETA);
4. print the summary: tasks by terminal state, retries, calls, duplicate calls,
   throughput, latency percentiles, field completeness, and label accuracy.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import orjson
from rich.console import Console

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "complaints"))
import generate  # noqa: E402

import lockgate  # noqa: E402
from lockgate.cli import run_batch  # noqa: E402
from lockgate.report import summarize, summary_table  # noqa: E402
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
            elapsed = run_batch(lg, "complaints")
            summary = summarize(lg.store, "complaints", elapsed)
            right = {"category": 0, "emotion": 0}
            scored = 0
            for row in lg.results("complaints"):
                if row["status"] != "SUCCEEDED":
                    continue
                value = orjson.loads(row["result"])
                scored += 1
                for k in right:
                    right[k] += value.get(k) == expected[row["task_id"]][k]
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
            console.print("try: .venv/bin/lockgate status --db sqlite:///demo-out/demo.db")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
