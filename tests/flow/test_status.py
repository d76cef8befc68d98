"""What ``lockgate status`` computes about endpoints and windows (pure)."""

from __future__ import annotations

import pytest

from lockgate.config import Settings
from lockgate.flow.status import endpoints, windows

SETTINGS = Settings.model_validate({"endpoint": [
    {"name": "hosted", "base_url": "http://x/v1", "pool": "fast", "fallback": "local",
     "cost_input_per_1k": 0.5, "cost_output_per_1k": 1.5},
    {"name": "local", "base_url": "http://y/v1", "pool": "fast"}]})

NOW = 1_000_000


def bucket(name: str, **kw: object) -> dict[str, object]:
    row: dict[str, object] = {"name": name, "kind": "endpoint", "rpm": 600.0, "tpm": None,
                              "learned_rpm": None, "learned_tpm": None, "window_ms": 60_000,
                              "paused_until": 0, "pause_reason": None, "granted_requests": 5,
                              "rate_factor": 1.0, "now": NOW}
    row.update(kw)
    return row


def test_endpoints_merge_the_workers_reports_pauses_limits_and_cost() -> None:
    workers = [
        {"concurrency": 512,
         "endpoints": {"hosted": {"limit": 10, "in_flight": 4, "waiting": 2,
                                  "latency_ms": 100.0, "failure_rate": 0.1,
                                  "calls": 30, "breaker": "closed"}}},
        {"concurrency": 20,  # its own --concurrency caps the endpoint's limit of 1000
         "endpoints": {"hosted": {"limit": 1000, "in_flight": 6, "waiting": 0,
                                  "latency_ms": 400.0, "failure_rate": 0.0,
                                  "calls": 10, "breaker": "half_open"}}},
        {"concurrency": 8, "endpoints": {}},
    ]
    rows = endpoints([bucket("hosted", paused_until=NOW + 2500, pause_reason="quota",
                             learned_rpm=300.0, rate_factor=0.9), bucket("local")],
                     workers, SETTINGS, {"hosted": (40, 200.0, 20.0)})
    h, loc = rows
    assert (h["concurrency"], h["in_flight"], h["waiting"], h["workers"]) == (30, 10, 2, 2)
    assert h["worker_concurrency"] == [10, 20]
    assert h["latency_ms"] == pytest.approx((100 * 30 + 400 * 10) / 40)
    assert h["failure_rate"] == pytest.approx(3 / 40)
    assert h["breaker"] == "half_open"
    assert (h["paused_s"], h["pause_reason"]) == (2.5, "quota")
    assert h["rpm"] == pytest.approx(270.0)  # learned 300, times the 429 factor
    assert h["cost_per_1k_calls"] == pytest.approx(200 * 0.5 + 20 * 1.5)
    assert (h["pool"], h["fallback"]) == ("fast", "local")
    assert (loc["workers"], loc["paused_s"], loc["cost_per_1k_calls"]) == (0, 0.0, None)


def test_windows_project_and_warn() -> None:
    eps = endpoints([bucket("hosted"), bucket("local", rpm=None)], [], SETTINGS)
    row = {"id": "night", "window_start": NOW - 10_000, "window_end": NOW + 50_000,
           "target_per_s": None, "counts": {"PENDING": 100, "SUCCEEDED": 20},
           "recent_done": 30, "tokens_per_task": None, "pools": ["fast"], "now": NOW}
    (w,) = windows([row], eps, SETTINGS, 0.0)
    assert w["open"] and w["remaining"] == 100 and w["rate_per_s"] == 1.0
    assert w["capacity_per_s"] is None  # "local" has no limit: unlimited in total
    assert w["projected_finish"] == NOW + 100_000 and w["on_time"] is False
    assert "behind" in w["warning"]
    (w2,) = windows([row], [e for e in eps if e["endpoint"] == "hosted"], SETTINGS, 0.0)
    # 600 RPM less the bucket's cap (1%, 6 requests) per minute
    assert w2["capacity_per_s"] == pytest.approx(9.9) and w2["feasible"]
