"""Rollups kept by real workers against the simulator: the figures ``lockgate quality``
reports are the ones the attempts of the run hold."""

from __future__ import annotations

from pathlib import Path

import orjson
from typer.testing import CliRunner, Result

from engine.support import run_worker, tasks, write_jsonl
from helpers import rows
from lockgate import Lockgate
from lockgate.cli import app
from lockgate.simulator.testing import SimulatorProcess
from lockgate.store import Store
from lockgate.worker.calls import max_lost_leases

SCHEMA = {"type": "object", "properties": {"label": {"type": "string",
                                                     "enum": ["yes", "no"]}},
          "required": ["label"]}


def lockgate(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_a_run_is_rolled_up_per_prompt_with_its_watched_values(
        db_url: str, store: Store, simulator: SimulatorProcess, tmp_path: Path) -> None:
    n = 90
    simulator.configure(rate_500=0.1, seed=7, latency={"kind": "lognormal", "mean_ms": 5.0})
    path = write_jsonl(tmp_path / "t.jsonl", tasks(n, delivery={"schema": SCHEMA}))
    assert lockgate("submit", path, "--db", db_url).exit_code == 0
    run_worker(store, concurrency=8)

    result = lockgate("quality", "--db", db_url, "--json")
    assert result.exit_code == 0, result.output
    [row] = orjson.loads(result.stdout)
    attempts = rows(store, "SELECT * FROM task_attempt")
    calls = [a for a in attempts if a["prompt_sha256"] is not None]
    assert row["prompt"].startswith("inline:")
    assert row["tasks"] == n
    assert row["attempts"] == len(attempts)
    assert row["calls"] == len(calls) == simulator.stats()["requests"]
    assert row["retries"] == sum(a["outcome"] == "retry" for a in attempts) > 0
    assert row["errors"] == {"server_error": row["retries"]}
    assert row["input_tokens"] == sum(a["input_tokens"] or 0 for a in calls)
    assert row["completeness"] == 1.0 and row["conformance"] == 1.0
    assert row["watched"] == {"label=no": 60 / 90, "label=yes": 30 / 90}
    assert row["outputs_watched"] == n
    lat = sorted(a["latency_ms"] for a in calls)
    p50 = lat[int(0.5 * (len(lat) - 1))]
    assert abs(row["latency_p50_ms"] - p50) <= 0.02 * p50 + 1e-9

    by_model = orjson.loads(lockgate("quality", "--db", db_url, "--json", "--by",
                                     "model").stdout)
    assert [(r["model"], r["tasks"]) for r in by_model] == [("sim-small", n)]
    by_hour = orjson.loads(lockgate("quality", row["prompt"], "--db", db_url, "--json",
                                    "--by", "hour").stdout)
    assert sum(r["tasks"] for r in by_hour) == n
    other = f"inline:{'0' * 12}"  # no such template: none of its calls
    assert lockgate("quality", other, "--db", db_url).stdout.strip() == \
        f"no attempts of {other} recorded in the last 24h"


def test_a_registry_task_ended_without_a_call_counts_under_its_version(
        db_url: str, store: Store, simulator: SimulatorProcess) -> None:
    """A task of ``p@1`` whose leases were lost (its workers killed) ends DEAD without a
    call; its attempt row named no prompt, and the rollups filed it under no prompt at
    all: the version's tasks and error mix never showed it."""
    with Lockgate(db_url) as lg:
        lg.prompts.create("p", [{"role": "user", "content": "{text}"}],
                          model_config={"name": "sim-small"})
        lg.submit([{"task_id": f"t{i}", "prompt_template": "@registry:p@1",
                    "input_data": {"text": "hello"}, "retry_policy": {"max_retries": 0}}
                   for i in range(2)], batch_id="b")
    for _ in range(max_lost_leases(0)):  # claimed and lost, no write-back
        assert len(store.claim(10, lease_ms=0, worker_id="killed")) == 2
    run_worker(store, concurrency=2)
    attempts = rows(store, "SELECT outcome, error_class, prompt_version, model "
                           "FROM task_attempt")
    assert [(a["outcome"], a["error_class"], a["prompt_version"], a["model"])
            for a in attempts] == [("dead", "lease_expired", "p@1", "sim-small")] * 2
    [row] = orjson.loads(lockgate("quality", "--db", db_url, "--json").stdout)
    assert (row["prompt"], row["tasks"], row["calls"], row["errors"]) == \
        ("p@1", 2, 0, {"lease_expired": 2})
    assert simulator.stats()["requests"] == 0
