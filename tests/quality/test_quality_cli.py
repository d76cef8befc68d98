"""``lockgate quality``: the table it prints, from rollups of known attempts."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from helpers import rows
from lockgate import Lockgate
from lockgate.cli import app
from lockgate.config import Endpoint
from lockgate.quality.writer import RollupWriter
from lockgate.spec import parse_task
from lockgate.states import TaskStatus
from lockgate.store import Finish, Store

SCHEMA = {"type": "object", "properties": {"label": {"enum": ["yes", "no"]}}}
PRICED = Endpoint(name="sim", base_url="http://x", cost_input_per_1k=1.0,
                  cost_output_per_1k=2.0)


def _land(store: Store) -> None:
    """Four tasks of ``p@1`` on model m: three answered at once (yes, no, no), one after
    a retry on an invalid answer; and a duplicate call whose lease was lost."""
    store.submit([parse_task({
        "task_id": f"t{i}", "prompt_template": "@registry:p@1", "input_data": {"x": i},
        "delivery_rule": {"schema": SCHEMA}, "retry_policy": {}}) for i in range(4)],
        batch_id="b")
    writer = RollupWriter(store, shard="w", endpoint={"sim": PRICED}.get)
    now = store.db_now() - 120_000

    def call(t: object, status: TaskStatus, outcome: str, latency: float, **kw: object
             ) -> Finish:
        result = kw.pop("result", None)
        return Finish(id=t.id, lease_token=t.lease_token, status=status,  # type: ignore[attr-defined]
                      result=result, attempt={
                          "attempt": 1, "outcome": outcome, "started_at": now,
                          "latency_ms": latency, "endpoint": "sim", "model": "m",
                          "prompt_sha256": "h", "prompt_version": "p@1",
                          "input_tokens": 100, "output_tokens": 10, **kw})  # type: ignore[typeddict-item]

    first = sorted(store.claim(4, lease_ms=0, worker_id="w"), key=lambda t: t.id)
    stale = first[0]
    again = {t.id: t for t in store.claim(4, lease_ms=60_000, worker_id="w")}
    done = [call(again[t.id], TaskStatus.SUCCEEDED, "succeeded", ms, parse_status="valid",
                 completeness=1.0, result=f'{{"label": "{label}"}}')
            for t, ms, label in zip(first[:3], (100.0, 200.0, 300.0), ("yes", "no", "no"),
                                    strict=True)]
    done.append(call(again[first[3].id], TaskStatus.PENDING, "retry", 400.0,
                     parse_status="invalid_json", completeness=0.0,
                     error_class="invalid_output"))
    done.append(call(stale, TaskStatus.SUCCEEDED, "succeeded", 500.0, parse_status="valid",
                     completeness=1.0, result='{"label": "yes"}'))
    store.finish(done, worker_id="w", observe=writer.record)
    [last] = store.claim(4, lease_ms=60_000, worker_id="w")
    store.finish([call(last, TaskStatus.SUCCEEDED, "succeeded", 600.0,
                       parse_status="repaired", completeness=0.5,
                       result='{"label": "yes"}')], worker_id="w", observe=writer.record)


#: The table, each line without trailing blanks (rich pads the title).
EXPECTED = (Path(__file__).parent / "data" / "quality_by_version.txt").read_text("utf-8")


def test_quality_prints_one_row_per_version(store: Store, db_url: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    _land(store)
    result = CliRunner().invoke(app, ["quality", "--db", db_url, "--since", "1h"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    # 4 tasks (the duplicate call's write-back was discarded), 6 calls; completeness
    # (1+1+1+0+1+0.5)/6; each call costs 100 x 1/1k + 10 x 2/1k = 0.12, six per 4 tasks;
    # watched over the 4 delivered outputs (not the discarded duplicate's); p50/p95
    # within the sketch's 2%.
    assert [line.rstrip() for line in result.stdout.splitlines()] == EXPECTED.splitlines()


def test_cleanup_prunes_minute_and_hour_rollups_past_their_age(store: Store,
                                                               db_url: str) -> None:
    store.submit([parse_task({
        "task_id": f"t{i}", "prompt_template": "Say {x}", "input_data": {"x": i},
        "model_config": {"name": "m"}, "delivery_rule": {}, "retry_policy": {}})
        for i in range(2)], batch_id="b")
    writer = RollupWriter(store, shard="w")
    now = store.db_now()
    claimed = sorted(store.claim(2, lease_ms=60_000, worker_id="w"), key=lambda t: t.id)
    store.finish([Finish(id=t.id, lease_token=t.lease_token, status=TaskStatus.FAILED,
                         attempt={"attempt": 1, "outcome": "failed", "started_at": at,
                                  "error_class": "invalid_request"})
                  for t, at in zip(claimed, (now - 3 * 86_400_000, now), strict=True)],
                 worker_id="w", observe=writer.record)

    def kept() -> list[tuple[str, int]]:
        return sorted((r["resolution"], int(r["tasks"])) for r in rows(
            store, "SELECT resolution, tasks FROM quality_rollup"))

    assert kept() == [("d", 1), ("d", 1), ("h", 1), ("h", 1), ("m", 1), ("m", 1)] or \
        kept() == [("d", 2), ("h", 1), ("h", 1), ("m", 1), ("m", 1)]
    result = CliRunner().invoke(app, ["cleanup", "--db", db_url], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "1 minute or hour rollup row(s)" in result.stderr
    assert sorted(k for k in kept() if k[0] == "m") == [("m", 1)]  # the recent minute
    assert sum(n for r, n in kept() if r == "h") == 2  # hours stay 90 days


def test_release_gate_evaluations_are_not_production_quality(store: Store) -> None:
    store.submit([parse_task({
        "task_id": f"t{i}", "prompt_template": "Say {x}", "input_data": {"x": i},
        "model_config": {"name": "m"}, "delivery_rule": {}, "retry_policy": {}})
        for i in range(2)], batch_id="b")
    with store.engine.begin() as conn:  # t1 stands for an item of a gate evaluation
        conn.execute(text("UPDATE task SET batch_id = 'gate:7:1' WHERE task_id = 't1'"))
    writer = RollupWriter(store, shard="w")
    now = store.db_now()
    store.finish([Finish(id=t.id, lease_token=t.lease_token, status=TaskStatus.FAILED,
                         attempt={"attempt": 1, "outcome": "failed", "started_at": now,
                                  "error_class": "invalid_request"})
                  for t in store.claim(2, lease_ms=60_000, worker_id="w")],
                 worker_id="w", observe=writer.record)
    assert rows(store, "SELECT resolution, tasks FROM quality_rollup ORDER BY resolution") \
        == [{"resolution": "d", "tasks": 1}, {"resolution": "h", "tasks": 1},
            {"resolution": "m", "tasks": 1}]


def test_a_narrow_terminal_gets_each_row_as_a_block_of_figures(
        store: Store, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """At 120 columns and less the 14 columns folded the prompt and model names away
    and cut the figures to "…"; a narrow terminal gets one block per row instead."""
    monkeypatch.setenv("COLUMNS", "80")
    _land(store)
    result = CliRunner().invoke(app, ["quality", "--db", db_url, "--since", "1h", "--by",
                                      "model"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout
    lines = [line.split() for line in result.stdout.splitlines()]
    assert ["prompt", "p@1"] in lines and ["model", "m"] in lines
    assert ["tasks", "4"] in lines and ["complete", "75.00%"] in lines
    assert max(len(line) for line in result.stdout.splitlines()) <= 80


def test_check_refuses_options_it_does_not_use(db_url: str, store: Store) -> None:
    result = CliRunner().invoke(app, ["quality", "--db", db_url, "--check", "--since", "7d"])
    assert result.exit_code == 2 and "drop --since and --by" in " ".join(result.stderr.split())


def test_a_prompt_the_registry_lacks_is_named_not_shown_as_idle(db_url: str,
                                                                 store: Store) -> None:
    """A mistyped name read as a prompt that made no calls (exit 0): it is refused with
    the likely name; a registered prompt without calls, or an inline key, says so."""
    with Lockgate(db_url) as lg:
        lg.prompts.create("labels", [{"role": "user", "content": "{text}"}],
                          model_config={"name": "m"})
    runner = CliRunner()
    typo = runner.invoke(app, ["quality", "label", "--db", db_url])
    assert typo.exit_code == 2
    assert "no prompt named 'label' in the registry (did you mean labels?)" in " ".join(
        typo.stderr.split())
    for name in ("labels", "labels@1", "inline:0123abcd"):
        idle = runner.invoke(app, ["quality", name, "--db", db_url])
        assert idle.exit_code == 0, idle.output
        assert idle.stdout.strip() == f"no attempts of {name} recorded in the last 24h"
