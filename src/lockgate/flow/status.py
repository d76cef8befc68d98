"""What ``lockgate status`` says about flow control, computed from rows (pure).

Per endpoint: its limits (as configured, lowered by what the provider reported), the
pause in force, and what the live workers report (concurrency limit, calls in flight,
latency, failure rate, breaker state). Per window batch: progress, the measured rate,
the projected finish against the window's end, and a warning as soon as the window
cannot be met at the endpoints' limits, or is projected to end late.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from lockgate.config import Settings
from lockgate.flow.bucket import effective
from lockgate.flow.window import Window, capacity_per_s, project
from lockgate.store import Store
from lockgate.store.flow import FlowStore

_BREAKER_ORDER = {"open": 2, "half_open": 1, "closed": 0}


def endpoints(buckets: Sequence[Mapping[str, Any]], workers: Iterable[Mapping[str, Any]],
              settings: Settings,
              usage: Mapping[str, tuple[int, float, float]] | None = None
              ) -> list[dict[str, Any]]:
    """One row per endpoint bucket, merged with the live workers' reports and, from
    recent traces, the mean tokens and the cost per 1,000 calls at the configured
    prices."""
    reported: dict[str, list[dict[str, Any]]] = {}
    for w in workers:
        for name, d in (w.get("endpoints") or {}).items():
            # What a worker sends at once is its own limit (--concurrency) or the
            # endpoint's adaptive one, whichever is lower.
            cap = int(w.get("concurrency") or 0)
            reported.setdefault(name, []).append(
                {**d, "limit": min(int(d.get("limit", 0)), cap) if cap else d.get("limit", 0)})
    out = []
    for b in buckets:
        if b.get("kind") != "endpoint":
            continue
        name = b["name"]
        ep = settings.endpoint_named(name)
        ds = reported.get(name, [])
        calls = sum(d.get("calls", 0) for d in ds)
        lat = [(d["latency_ms"], d.get("calls", 0)) for d in ds if d.get("latency_ms")]
        paused_ms = max(0, int(b["paused_until"]) - int(b["now"]))
        out.append({
            "endpoint": name,
            "pool": ep.pool if ep else None,
            "fallback": ep.fallback if ep else None,
            "rpm": _times(effective(b["rpm"], b["learned_rpm"]), b),
            "tpm": _times(effective(b["tpm"], b["learned_tpm"]), b),
            "rate_factor": round(float(b.get("rate_factor") or 1.0), 3),
            "window_s": int(b["window_ms"]) / 1000,
            "paused_s": round(paused_ms / 1000, 1) if paused_ms else 0.0,
            "pause_reason": b["pause_reason"] if paused_ms else None,
            "workers": len(ds),
            "concurrency": sum(d.get("limit", 0) for d in ds),
            "worker_concurrency": [d.get("limit", 0) for d in ds],
            "in_flight": sum(d.get("in_flight", 0) for d in ds),
            "waiting": sum(d.get("waiting", 0) for d in ds),
            "latency_ms": round(sum(x * max(c, 1) for x, c in lat)
                                / sum(max(c, 1) for _, c in lat), 1) if lat else None,
            "failure_rate": round(sum(d.get("failure_rate", 0.0) * d.get("calls", 0)
                                      for d in ds) / calls, 4) if calls else None,
            "breaker": max((d.get("breaker", "closed") for d in ds),
                           key=lambda s: _BREAKER_ORDER.get(s, 0), default="closed"),
            "granted_requests": int(b["granted_requests"]),
            **_cost(ep, (usage or {}).get(name)),
        })
    return out


def _cost(ep: Any, use: tuple[int, float, float] | None) -> dict[str, Any]:
    if use is None:
        return {"tokens_in": None, "tokens_out": None, "cost_per_1k_calls": None}
    _n, tin, tout = use
    cost = ep.cost(tin * 1000, tout * 1000) if ep is not None else None
    return {"tokens_in": round(tin, 1), "tokens_out": round(tout, 1),
            "cost_per_1k_calls": None if cost is None else round(cost, 4)}


def _times(limit: float | None, b: Mapping[str, Any]) -> float | None:
    """A limit as enforced now: lowered by the share 429s took off (``rate_factor``)."""
    if limit is None:
        return None
    return limit * float(b.get("rate_factor") or 1.0)


def windows(rows: Sequence[Mapping[str, Any]], eps: Sequence[Mapping[str, Any]],
            settings: Settings, headroom: float) -> list[dict[str, Any]]:
    """Progress and projection of every window batch."""
    out = []
    for r in rows:
        counts: Mapping[str, int] = r["counts"]
        total = sum(counts.values())
        remaining = counts.get("PENDING", 0)
        now = int(r["now"])
        w = Window(int(r["window_start"]), int(r["window_end"]), r["target_per_s"])
        rate = r["recent_done"] / 30.0
        tokens = r.get("tokens_per_task") or 0.0
        pools = set(r.get("pools") or [])
        serving = [e for e in eps if e["pool"] in pools] or \
            [e for e in eps if e["pool"] is None]
        caps = [capacity_per_s(e["rpm"], e["tpm"], int(e["window_s"] * 1000), tokens,
                               headroom, settings.flow.burst, settings.flow.min_cap_ms)
                for e in serving]
        capacity = None if (not caps or any(c is None for c in caps)) else \
            sum(c for c in caps if c is not None)
        p = project(w, remaining, rate, now, capacity)
        out.append({
            "batch": r["id"], "window_start": w.start_ms, "window_end": w.end_ms,
            "open": w.start_ms <= now < w.end_ms, "total": total, "remaining": remaining,
            "target_per_s": w.target_per_s, "rate_per_s": round(rate, 2),
            "required_per_s": round(p.required_per_s, 2),
            "capacity_per_s": None if capacity is None else round(capacity, 2),
            "projected_finish": p.finish_ms, "on_time": p.on_time, "feasible": p.feasible,
            "warning": p.warning(),
        })
    return out


def report(store: Store, settings: Settings,
           workers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The flow-control part of ``lockgate status``: endpoints, then windows."""
    fs = FlowStore(store)
    eps = endpoints(fs.buckets(), workers, settings, fs.usage())
    return {"endpoints": eps,
            "windows": windows(fs.windows(), eps, settings, settings.flow.headroom)}


def trouble(workers: Iterable[Mapping[str, Any]]) -> list[str]:
    """The endpoints in trouble as the live workers report them, one phrase each (the
    progress line of ``lockgate run``): a breaker open or probing, a run of failures of
    ``TROUBLE_AFTER_S`` or more, a pause of as long. A pause in force is named with the
    breaker or the failures it comes with, with its time left (rounded up): it holds
    every call, so "next try in 0 s" (the breaker's wait over) would say calls go when
    none does; the breaker's next try is said only when it comes after the pause."""
    seen: dict[str, list[Mapping[str, Any]]] = {}
    for w in workers:
        for name, d in (w.get("endpoints") or {}).items():
            seen.setdefault(name, []).append(d)
    out = []
    for name, ds in sorted(seen.items()):
        breaker = max((d.get("breaker", "closed") for d in ds),
                      key=lambda s: _BREAKER_ORDER.get(s, 0), default="closed")
        failing = max((d["failing_s"] for d in ds if d.get("failing_s") is not None),
                      default=None)
        errors = [d["last_error"] for d in ds if d.get("last_error")]
        why = f" ({errors[0].split(':', 1)[0]})" if errors else ""
        retry = min((d["retry_in_s"] for d in ds if d.get("retry_in_s") is not None),
                    default=None)
        paused = max((d.get("paused_ms") or 0 for d in ds), default=0) / 1000
        since = f" for {failing:.0f} s" if failing is not None else ""
        pause = ""
        if paused > 0:
            reason = next((d["pause_reason"] for d in ds if d.get("pause_reason")), "paused")
            pause = f"paused ({reason}) for {math.ceil(paused)} s more"
        if breaker == "open":
            parts = [pause] if pause else []
            if retry is not None and (not pause or retry > paused):
                parts.append(f"next try in {retry:.0f} s")
            out.append(", ".join([f"endpoint {name} down{since}{why}", *parts]))
        elif breaker == "half_open":
            out.append(f"endpoint {name} down{since}{why}, {pause or 'trying it again'}")
        elif failing is not None and failing >= TROUBLE_AFTER_S:
            out.append(f"endpoint {name} failing{since}{why}" + (f", {pause}" if pause else ""))
        elif paused >= TROUBLE_AFTER_S:
            out.append(f"endpoint {name} {pause}")
    return out


#: A run of failures (or a pause) this long shows on the progress line.
TROUBLE_AFTER_S = 5.0
