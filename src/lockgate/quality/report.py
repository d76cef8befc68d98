"""Quality reports: rollup rows merged over a window, per prompt version, model or hour.

The window reads rows of one resolution: minutes for a window up to 6 hours, hours up
to 14 days, days beyond (``--by hour`` always reads hours). It starts at the start of
the span holding ``now - since`` (a 24 h window read from hour rows may take in up to
59 minutes more), so a report never reads more than a few hundred rows per prompt,
however many attempts the rows stand for.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any, Literal

from lockgate.config import QualitySettings
from lockgate.errors import SpecError
from lockgate.quality import BY
from lockgate.quality.rollup import SPANS, Rollup, bucket_of
from lockgate.quality.rules import WEEK_MS, Finding, evaluate
from lockgate.results import utc
from lockgate.store.quality import QualityStore
from lockgate.store.store import Store

By = Literal["version", "model", "hour"]


@dataclass(frozen=True, slots=True)
class QualityRow:
    """The quality of one prompt version (and model, or hour) over the window.

    Shares are fractions (0.97, not 97); None where nothing was measured."""

    prompt: str
    model: str | None
    hour: datetime | None
    tasks: int
    calls: int
    attempts: int
    retries: int
    discarded: int
    fallbacks: int
    completeness: float | None
    conformance: float | None
    parse_status: dict[str, int]
    errors: dict[str, int]
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    latency_p99_ms: float | None
    input_tokens: int
    output_tokens: int
    cost: float | None
    cost_per_task: float | None
    #: Share of the looked-at outputs holding each watched value.
    watched: dict[str, float]
    outputs_watched: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolution_for(since_s: float, by: str) -> str:
    """The rollup resolution a window of ``since_s`` seconds reads."""
    if by == "hour":
        return "h"
    if since_s <= 6 * 3600:
        return "m"
    return "h" if since_s <= 14 * 86400 else "d"


def _group(by: str, prompt: str, model: str, bucket: int) -> tuple[Any, ...]:
    if by == "model":
        return (prompt, model)
    if by == "hour":
        return (prompt, bucket)
    return (prompt,)


def quality_report(store: Store, prompt: str | None = None, *, since_s: float = 86400.0,
                   by: str = "version", now_ms: int | None = None) -> list[QualityRow]:
    """The quality rows of the last ``since_s`` seconds, one per prompt version (``by``
    ``version``), per version and model (``model``) or per version and hour
    (``hour``), ordered by prompt then model or hour. ``prompt`` is a registry name
    (every version), ``name@N`` or an inline key (``inline:…``)."""
    if by not in BY:
        raise SpecError(f"unknown grouping {by!r}: use one of {', '.join(BY)}", field="by")
    if since_s <= 0:
        raise SpecError("the window must be longer than zero", field="since")
    qstore = QualityStore(store)
    now = qstore.now() if now_ms is None else now_ms
    res = resolution_for(since_s, by)
    since = bucket_of(now - int(since_s * 1000), res)
    exact, prefix = prompt_filter(prompt)
    groups: dict[tuple[Any, ...], Rollup] = {}
    for r in qstore.rows(res, since=since, prompt=exact, prompt_prefix=prefix):
        g = _group(by, r.prompt, r.model, r.bucket)
        one = Rollup.from_row(r.values)
        if g in groups:
            groups[g].merge(one)
        else:
            groups[g] = one
    return [_row(by, g, groups[g]) for g in sorted(groups, key=_order)]


def prune_rollups(store: Store, settings: QualitySettings) -> int:
    """Delete minute rollups older than ``keep_minutes`` and hour rollups older than
    ``keep_hours`` (day rows stay); returns how many rows went."""
    return QualityStore(store).prune({"m": int(settings.keep_minutes * 1000),
                                      "h": int(settings.keep_hours * 1000)})


def prompt_filter(prompt: str | None) -> tuple[str | None, str | None]:
    """(exact prompt, prompt prefix) a PROMPT argument selects."""
    if prompt is None:
        return None, None
    if prompt.startswith("inline:"):
        return prompt, None
    if "@" in prompt:
        name, _, version = prompt.partition("@")
        if len(version) > 1 and version[0] in "vV" and version[1:].isdigit():
            return f"{name}@{int(version[1:])}", None  # NAME@v3 is version 3
        return prompt, None
    return None, f"{prompt}@"


def _merged(qstore: QualityStore, res: str, since: int, until: int,
            prompt: str | None) -> dict[tuple[str, str], Rollup]:
    exact, prefix = prompt_filter(prompt)
    out: dict[tuple[str, str], Rollup] = {}
    for r in qstore.rows(res, since=since, until=until, prompt=exact, prompt_prefix=prefix):
        one = Rollup.from_row(r.values)
        key = (r.prompt, r.model)
        out[key] = out[key].merge(one) if key in out else one
    return out


def _week_ago(qstore: QualityStore, res: str, since: int, until: int, now: int,
              settings: QualitySettings, prompt: str | None
              ) -> dict[tuple[str, str], Rollup]:
    """The window ``since``-``until`` a week earlier. Minute rows of a week ago outlive
    no default ``keep_minutes``: once that old, the hour rows that overlap it are read
    instead (the whole hours around it: a baseline of a little more than the window),
    whether or not a cleanup has deleted the minute rows yet, so the baseline does not
    change with it."""
    start, end = since - WEEK_MS, until - WEEK_MS
    if res != "m" or start >= now - int(settings.keep_minutes * 1000):
        return _merged(qstore, res, start, end, prompt)
    hour = SPANS["h"]
    return _merged(qstore, "h", start - start % hour, -(-end // hour) * hour, prompt)


def check_rules(store: Store, settings: QualitySettings, prompt: str | None = None, *,
                now_ms: int | None = None) -> list[Finding]:
    """The anomaly rules' findings now, per prompt version and model (docs/quality.md):
    the window ends with the span holding now (minute rows for windows up to 6 h, else
    hour rows), its baseline is the same window a week earlier if that has the calls
    (see :func:`_week_ago`), else the window before; format pollution reads the last
    whole minutes."""
    qstore = QualityStore(store)
    now = qstore.now() if now_ms is None else now_ms
    res = resolution_for(settings.window, "version")
    until = bucket_of(now, res) + SPANS[res]
    since = until - int(settings.window * 1000)
    current = _merged(qstore, res, since, until, prompt)
    week = _week_ago(qstore, res, since, until, now, settings, prompt)
    trailing = _merged(qstore, res, 2 * since - until, since, prompt)
    minute = bucket_of(now, "m")
    first = minute - settings.pollution_minutes * SPANS["m"]
    exact, prefix = prompt_filter(prompt)
    per_minute: dict[tuple[str, str], dict[int, Rollup]] = {}
    for r in qstore.rows("m", since=first, until=minute, prompt=exact, prompt_prefix=prefix):
        slot = per_minute.setdefault((r.prompt, r.model), {})
        one = Rollup.from_row(r.values)
        slot[r.bucket] = slot[r.bucket].merge(one) if r.bucket in slot else one
    findings: list[Finding] = []
    for key in sorted(current.keys() | per_minute.keys()):
        slots = per_minute.get(key, {})
        minutes = [slots.get(b, Rollup()) for b in range(first, minute, SPANS["m"])]
        findings += evaluate(key, current.get(key, Rollup()), week.get(key),
                             trailing.get(key), minutes, settings)
    return findings


def _order(g: tuple[Any, ...]) -> tuple[Any, ...]:
    name, _sep, version = g[0].rpartition("@")
    return ((name, int(version)) if version.isdigit() else (g[0], 0), *g[1:])


def _row(by: str, g: tuple[Any, ...], r: Rollup) -> QualityRow:
    return QualityRow(
        prompt=g[0], model=g[1] if by == "model" else None,
        hour=utc(g[1]) if by == "hour" else None,
        tasks=r.tasks, calls=r.calls, attempts=r.attempts, retries=r.retries,
        discarded=r.discarded, fallbacks=r.fallbacks, completeness=r.completeness,
        conformance=r.conformance, parse_status=dict(sorted(r.parse_mix.items())),
        errors=dict(sorted(r.error_mix.items())), latency_p50_ms=r.quantile(0.5),
        latency_p95_ms=r.quantile(0.95), latency_p99_ms=r.quantile(0.99),
        input_tokens=r.input_tokens, output_tokens=r.output_tokens, cost=r.cost,
        cost_per_task=r.cost_per_task,
        watched={k: v / r.watch_n for k, v in sorted(r.watched.items())} if r.watch_n
        else {}, outputs_watched=r.watch_n)


__all__ = ["BY", "SPANS", "By", "QualityRow", "check_rules", "prompt_filter", "prune_rollups",
           "quality_report", "resolution_for"]
