"""Worker CPU per task through the command line, for any version: the marginal CPU of
``lockgate worker --burst`` between two sizes, (cpu(N2) - cpu(N1)) / (N2 - N1), so that
start-up, imports and one-time loads cancel out. Each source tree given runs its own
``lockgate submit`` and ``lockgate worker`` (PYTHONPATH), on a fresh SQLite file per run,
against one 0 ms simulator; trees alternate round by round.

    python bench/worker_cpu_cli.py this=src before=/tmp/old/src [--small 2000 --large 12000]

(``git archive <commit> src | tar -x -C /tmp/old`` gives an older tree.) Unlike
``bench/worker_cpu.py``, which calls the worker's Python API, this works across versions
whose APIs differ.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from lockgate.simulator.testing import SimulatorProcess  # noqa: E402
from workload import task_line  # noqa: E402

CLI = "from lockgate.cli import main; main()"


def _cpu_s(cmd: list[str], env: dict[str, str]) -> float:
    """CPU seconds (user + system) of a command run to its end."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd[3:])} failed:\n{err[-3000:]}")
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="+", metavar="LABEL=SRC",
                    help="a label and the src/ directory of a source tree")
    ap.add_argument("--small", type=int, default=2_000)
    ap.add_argument("--large", type=int, default=12_000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    trees = {}
    for item in a.trees:
        label, _, src = item.partition("=")
        if not src or not Path(src, "lockgate").is_dir():
            raise SystemExit(f"{item!r}: give LABEL=SRC, SRC holding the lockgate package")
        trees[label] = str(Path(src).resolve())
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}, load {os.getloadavg()[0]:.1f}; SQLite, 0 ms model, "
          f"marginal between {a.small:,} and {a.large:,} tasks", flush=True)
    got: dict[str, list[float]] = {label: [] for label in trees}
    with tempfile.TemporaryDirectory() as tmp_s, \
            SimulatorProcess({"latency": {"kind": "fixed", "mean_ms": 0}}) as sim:
        tmp = Path(tmp_s)
        files = {}
        for n in (a.small, a.large):
            files[n] = tmp / f"tasks-{n}.jsonl"
            files[n].write_bytes(b"".join(orjson.dumps(task_line(i)) + b"\n"
                                          for i in range(n)))
        for r in range(a.rounds):
            for label, src in trees.items():
                env = {**os.environ, "PYTHONPATH": src, "LOCKGATE_BASE_URL": sim.url}
                cpu = {}
                for n in (a.small, a.large):
                    url = f"sqlite:///{tmp / f'{label}-{r}-{n}.db'}"
                    subprocess.run([sys.executable, "-c", CLI, "submit", str(files[n]),
                                    "--db", url], env=env, check=True, capture_output=True)
                    sim.reset()
                    cpu[n] = _cpu_s([sys.executable, "-c", CLI, "worker", "--burst",
                                     "--no-gate", "--db", url], env)
                us = (cpu[a.large] - cpu[a.small]) / (a.large - a.small) * 1e6
                got[label].append(us)
                print(f"round {r + 1} {label}: {us:.0f} µs/task (worker CPU {cpu[a.small]:.2f} s "
                      f"at {a.small:,}, {cpu[a.large]:.2f} s at {a.large:,})", flush=True)
    for label, values in got.items():
        print(f"{label}: median {statistics.median(values):.0f} µs/task "
              f"(min {min(values):.0f}, max {max(values):.0f})")
    first = next(iter(got))
    for label in list(got)[1:]:
        ratios = [x / y for x, y in zip(got[first], got[label], strict=True)]
        print(f"{first}/{label}: median {statistics.median(ratios):.3f} "
              f"(min {min(ratios):.3f}, max {max(ratios):.3f}, {len(ratios)} rounds)")


if __name__ == "__main__":
    main()
