"""What the quality loop costs the engine: ``lockgate run`` of N tasks against the 0 ms
simulator with rollups and OpenTelemetry export on (to an OTLP/HTTP receiver in this
process, which decodes each request and counts its spans) against the same run with both
off, in pairs whose order alternates (on off, off on, on off ...) so a drift of the
shared machine hits both alike, after an unmeasured pair (``--warmup``). Each run
starts from an empty database; the figures are
tasks/s from the run's own wall time (end to end: start, claims, calls, write-backs,
exit with the spans exported), the CPU seconds of the whole ``lockgate run`` process
(and its children), the spans the receiver got (a run's spans all arrive before it
exits, so a shortfall is spans dropped) and the load average at each pair.

    python bench/quality_overhead.py --tasks 20000 --pairs 5 --backends sqlite,postgresql,mariadb
    python bench/quality_overhead.py --tasks 20000 --pairs 5 --sample 0.01
    python bench/quality_overhead.py --tasks 20000 --pairs 5 --no-otel
    python bench/quality_overhead.py --tasks 20000 --pairs 5 --in-thread
    python bench/quality_overhead.py --tasks 50000 --pairs 3 --decode-after

Target (issue: the quality loop): on/off throughput ratio >= 0.95.
"""

from __future__ import annotations

import argparse
import gzip
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import orjson
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _flow_common  # noqa: E402
from lockgate.simulator.testing import SimulatorProcess  # noqa: E402

SCHEMA = {"type": "object", "properties": {"label": {"type": "string",
                                                     "enum": ["yes", "no"]}}}


class _Receiver(BaseHTTPRequestHandler):
    """Takes OTLP/HTTP exports and counts their requests, bytes and spans (answers an
    empty response). With ``later`` set, it keeps the bodies and :func:`_decode_kept`
    decodes them once the run is timed: its decoding then does not compete with the
    run for the machine's cores (a collector on another machine)."""

    exported: ClassVar[list[int]] = [0, 0, 0]  # requests, bytes, spans
    later: ClassVar[bool] = False
    kept: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        n = int(self.headers["Content-Length"])
        body = self.rfile.read(n)
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.exported[0] += 1
        self.exported[1] += n
        if self.later:
            self.kept.append(body)
        else:
            self.exported[2] += _spans(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def _spans(body: bytes) -> int:
    request = ExportTraceServiceRequest.FromString(body)
    return sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)


def _decode_kept() -> None:
    """Decode the requests kept during a run (``--decode-after``) and count their spans."""
    kept, _Receiver.kept = _Receiver.kept, []
    _Receiver.exported[2] += sum(_spans(body) for body in kept)


def _tasks(path: Path, n: int) -> None:
    with path.open("wb") as f:
        for i in range(n):
            line = _flow_common.task_line(i, "q", model="sim-small")
            line["delivery_rule"]["schema"] = SCHEMA
            f.write(orjson.dumps(line) + b"\n")


def _database(backend: str, tmp: Path) -> str:
    """An empty, migrated database (a server's is dropped and made again)."""
    return _flow_common.fresh_db(backend, tmp, "lockgate_quality_bench")


def _one(url: str, tasks: Path, sim: str, otlp: str | None, on: bool,
         tmp: Path, ratio: float | None, in_thread: bool = False
         ) -> tuple[float, float, float]:
    config = tmp / ("on.toml" if on else "off.toml")
    config.write_text(f'[quality]\nrollups = {"true" if on else "false"}\n')
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LOCKGATE_", "OTEL_"))}
    env["LOCKGATE_BASE_URL"] = sim
    if on and otlp:
        env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = otlp
        if in_thread:
            env["LOCKGATE_OTEL_EXPORT_PROCESS"] = "0"
        if ratio is not None:
            env["OTEL_TRACES_SAMPLER"] = "traceidratio"
            env["OTEL_TRACES_SAMPLER_ARG"] = str(ratio)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    here = time.process_time()  # this process only serves the receiver meanwhile
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "lockgate.cli", "run", str(tasks), "--db", url,
                    "--config", str(config), "--concurrency", "512"],
                   env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    receiver = time.process_time() - here
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    _decode_kept()
    return wall, cpu, receiver


def _commit() -> str:
    done = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=False)
    dirty = subprocess.run(["git", "-C", str(HERE), "status", "--porcelain", "--",
                            "../src"], capture_output=True, text=True, check=False)
    return done.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=20_000)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--backends", default="sqlite")
    ap.add_argument("--warmup", type=int, default=1,
                    help="unmeasured pairs run first on each backend (caches, "
                         "compiled files) [1]")
    ap.add_argument("--no-otel", action="store_true",
                    help="rollups alone on (no OTLP export) against off")
    ap.add_argument("--in-thread", action="store_true",
                    help="export the spans from the worker's own thread "
                         "(LOCKGATE_OTEL_EXPORT_PROCESS=0), not an exporter process")
    ap.add_argument("--sample", type=float, help="trace this share of the tasks "
                    "(OTEL_TRACES_SAMPLER=traceidratio) [every task]")
    ap.add_argument("--decode-after", action="store_true",
                    help="the receiver keeps the requests and decodes them after each "
                         "run (its decoding off the run's cores, as a collector on "
                         "another machine) [decoded as they arrive]")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    _Receiver.later = args.decode_after

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    otlp = None if args.no_otel else f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    out: dict[str, Any] = {"machine": _flow_common.machine(), "commit": _commit(),
                           "command": " ".join(sys.argv), "tasks": args.tasks,
                           "pairs": args.pairs, "sample": args.sample,
                           "otel": not args.no_otel, "in_thread": args.in_thread,
                           "decode_after": args.decode_after,
                           "backends": {}}
    with SimulatorProcess() as sim, tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        tasks = tmp / "tasks.jsonl"
        _tasks(tasks, args.tasks)
        for backend in args.backends.split(","):
            for _ in range(args.warmup):  # the first runs of a backend are slower
                for on in (True, False):
                    _one(_database(backend, tmp), tasks, sim.url, otlp, on, tmp,
                         args.sample, args.in_thread)
            rows: list[dict[str, float]] = []
            for i in range(args.pairs):
                pair: dict[str, float] = {"load_1m": os.getloadavg()[0]}
                for on in ((True, False) if i % 2 == 0 else (False, True)):
                    url = _database(backend, tmp)
                    spans = _Receiver.exported[2]
                    wall, cpu, receiver = _one(url, tasks, sim.url, otlp, on, tmp,
                                               args.sample, args.in_thread)
                    key = "on" if on else "off"
                    pair[f"{key}_tps"] = args.tasks / wall
                    pair[f"{key}_cpu_s"] = cpu
                    if on:
                        pair["spans"] = _Receiver.exported[2] - spans
                        pair["receiver_cpu_s"] = receiver
                pair["ratio_tps"] = pair["on_tps"] / pair["off_tps"]
                pair["ratio_cpu"] = pair["on_cpu_s"] / pair["off_cpu_s"]
                rows.append(pair)
                print(f"{backend} pair {i + 1} (load {pair['load_1m']:.1f}): on "
                      f"{pair['on_tps']:,.0f} tasks/s ({pair['on_cpu_s']:.2f} cpu s, "
                      f"{pair['spans']:,.0f} spans received, receiver "
                      f"{pair['receiver_cpu_s']:.2f} cpu s), off {pair['off_tps']:,.0f} "
                      f"tasks/s ({pair['off_cpu_s']:.2f} cpu s), ratio "
                      f"{pair['ratio_tps']:.3f}", flush=True)
            summary = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            summary["ratio_tps_min"] = min(r["ratio_tps"] for r in rows)
            summary["ratio_tps_max"] = max(r["ratio_tps"] for r in rows)
            summary["ratio_cpu_min"] = min(r["ratio_cpu"] for r in rows)
            summary["ratio_cpu_max"] = max(r["ratio_cpu"] for r in rows)
            summary["load_min"] = min(r["load_1m"] for r in rows)
            summary["load_max"] = max(r["load_1m"] for r in rows)
            out["backends"][backend] = {"pairs": rows, "median": summary}
            print(f"{backend}: median on {summary['on_tps']:,.0f} / off "
                  f"{summary['off_tps']:,.0f} tasks/s, ratio {summary['ratio_tps']:.3f} "
                  f"(min {summary['ratio_tps_min']:.3f}, max "
                  f"{summary['ratio_tps_max']:.3f}); cpu ratio {summary['ratio_cpu']:.3f} "
                  f"({summary['ratio_cpu_min']:.3f}-{summary['ratio_cpu_max']:.3f}); "
                  f"load {summary['load_min']:.1f}-{summary['load_max']:.1f}", flush=True)
    out["otlp_exports"] = {"requests": _Receiver.exported[0], "bytes": _Receiver.exported[1],
                           "spans": _Receiver.exported[2]}
    print(f"OTLP exports received: {_Receiver.exported[0]} requests, "
          f"{_Receiver.exported[1]:,} bytes, {_Receiver.exported[2]:,} spans; commit "
          f"{out['commit']}, {out['machine']}")
    if args.json:
        args.json.write_bytes(orjson.dumps(out, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
