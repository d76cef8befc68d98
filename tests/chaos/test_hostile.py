"""Hostile model outputs through the real worker and the simulator over HTTP: 10 MiB of
text or JSON, JSON nested 100,000 deep, 100,000 keys, a 5,000-digit number, a NUL, a
lone surrogate escape. No crash: every task ends (none on the internal-error path), and
the raw output is kept, cut with a marker past 1 Mi characters."""

from __future__ import annotations

import pytest

from engine.support import rows, run_worker, status_counts, task
from lockgate.simulator.hostile import KINDS
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store

from .conftest import Scale

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

KEPT = 1 << 20  # characters of an answer a trace keeps


def test_hostile_outputs_end_their_tasks_with_the_raw_output_kept(
        store: Store, simulator: SimulatorProcess, backend: str, scale: Scale) -> None:
    if backend != "sqlite" and scale.name == "short":
        pytest.skip("PostgreSQL and MariaDB in the long run (make chaos): 10 MiB answers")
    simulator.configure(hostile=True)
    kinds = [*KINDS, "fine"]
    store.submit([parse_task(task(f"t-{k}", f"[hostile:{k}] where is my parcel",
                                  retry={"max_retries": 0})) for k in kinds], batch_id="b")
    stats = run_worker(store, concurrency=4, timeout=180)
    assert stats.finished == len(kinds)
    got = {r["task_id"][2:]: r for r in rows(
        store, "SELECT t.task_id, t.status, t.error_class, a.raw_output, a.error_class AS "
               "trace_error FROM task t JOIN task_attempt a ON a.task_pk = t.id")}
    assert set(got) == set(kinds)
    for kind, r in got.items():
        assert "internal" not in str(r["error_class"]) + str(r["trace_error"]), (kind, r)
        raw = r["raw_output"]
        assert raw, f"{kind}: the raw output was not kept"
        sent = KINDS.get(kind, "")
        if len(sent) > KEPT:
            assert raw.endswith(f"[lockgate: {len(sent) - KEPT:,} more characters not "
                                "kept]"), (kind, raw[-80:])
            assert raw.startswith(sent[:1000])
        elif kind in ("deep", "bignum"):
            assert raw == sent, kind
    assert got["fine"]["status"] == "SUCCEEDED"
    assert got["nul"]["raw_output"] == '{"label": "no\ufffd"}'
    assert got["surrogate"]["raw_output"] == '{"label": "y\ufffdes"}'
    assert got["huge"]["status"] == "DEAD"
    counts = status_counts(store)
    assert sum(counts.values()) == len(kinds) and "PENDING" not in counts
    print(f"hostile outputs on {store.engine.url.get_backend_name()}: " + ", ".join(
        f"{k} {got[k]['status']}" for k in kinds))
