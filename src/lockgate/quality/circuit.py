"""The completeness circuit (docs/quality.md, "Completeness circuit and human review").

Per configured prompt path (``[[quality.circuit]]``), the evaluator reads the minute
rollups of the prompt's primary path (every model and endpoint, the fallback's rows left
out) and moves the circuit:

* CLOSED -> OPEN when the field completeness is under ``threshold`` in each of the last
  ``window`` minutes, each with at least ``min_calls`` calls (the current minute counts
  once it has its calls; until then the window ends with the minute before);
* OPEN -> CLOSED once the circuit has been open ``probation`` and the probes (the share
  ``probe_share`` of tasks still sent to the primary) of the last ``probation`` (whole
  minutes after the opening) are back at or over the threshold, with ``min_calls`` calls.

A move is a compare-and-swap on the circuit's row (:class:`CircuitStore`): every worker
evaluates, without a lease, and one of them moves it. Workers read the states through
:class:`CircuitRouter`, cached ``[quality] circuit_refresh_s``, on the path where a
task's prompt and endpoint are decided; whether a task probes the primary is a hash of
its id, so a retried task keeps its path while the circuit stays open.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from lockgate.config import CircuitSettings, QualitySettings
from lockgate.errors import ConfigError, StateConflict, StoreError
from lockgate.quality.report import prompt_filter
from lockgate.quality.rules import Finding, under
from lockgate.registry.api import default_actor
from lockgate.results import CircuitView, utc
from lockgate.spec import RESERVED_ID_PREFIX
from lockgate.states import CircuitState
from lockgate.store import Store
from lockgate.store.circuit import CircuitRow, CircuitStore
from lockgate.store.quality import QualityStore, StoredRollup

log = logging.getLogger("lockgate.quality")

MINUTE = 60_000
#: (calls, completeness sum, completeness n) of one minute.
Minute = tuple[int, float, int]


def probes(task_id: str, circuit: CircuitSettings) -> bool:
    """Whether this task goes to the primary while the circuit is open: the same answer
    for every attempt of the task (a hash of its id and the circuit's prompt)."""
    if circuit.probe_share <= 0:
        return False
    digest = hashlib.sha256(f"{circuit.prompt}\x00{task_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0 ** 64 < circuit.probe_share


def matches(circuit_prompt: str, prompt_key: str) -> bool:
    """Whether a task whose prompt key is ``prompt_key`` (``name@N``, ``inline:…``) is
    on the circuit's path (a bare registry name covers every version)."""
    if circuit_prompt == prompt_key:
        return True
    return "@" not in circuit_prompt and not circuit_prompt.startswith("inline:") \
        and prompt_key.rpartition("@")[0] == circuit_prompt


def circuit_for(circuits: Iterable[CircuitSettings], prompt_key: str) -> CircuitSettings | None:
    """The circuit of a prompt key: the one naming the exact version first."""
    best = None
    for c in circuits:
        if c.prompt == prompt_key:
            return c
        if best is None and matches(c.prompt, prompt_key):
            best = c
    return best


def primary_minutes(rows: Iterable[StoredRollup], circuit: CircuitSettings) -> dict[int, Minute]:
    """Per minute, the calls and completeness of the circuit's primary path: its
    prompt's rows of every model and endpoint, without the fallback's (a fallback version
    of the same prompt, a fallback endpoint)."""
    out: dict[int, Minute] = {}
    for r in rows:
        if not matches(circuit.prompt, r.prompt) or r.prompt == circuit.fallback_prompt \
                or (circuit.fallback_endpoint is not None
                    and r.endpoint == circuit.fallback_endpoint):
            continue
        v = r.values
        calls, s, n = out.get(r.bucket, (0, 0.0, 0))
        out[r.bucket] = (calls + int(v.get("calls") or 0),
                         s + float(v.get("completeness_sum") or 0.0),
                         n + int(v.get("completeness_n") or 0))
    return out


def path_minutes(qstore: QualityStore, circuit: CircuitSettings,
                 since: int) -> dict[int, Minute]:
    """The primary path's minutes from ``since`` on, read from the minute rollups."""
    exact, prefix = prompt_filter(circuit.prompt)
    return primary_minutes(qstore.rows("m", since=since, prompt=exact,
                                       prompt_prefix=prefix), circuit)


def _completeness(m: Minute) -> float | None:
    return m[1] / m[2] if m[2] else None


def fresh_from(row: CircuitRow) -> int:
    """The first minute that counts toward opening a CLOSED circuit: after a move back
    to CLOSED, the first minute that starts at or after the move. The minute under way
    at the move holds calls made before it (a rollup minute cannot tell them apart), so
    it is left out with the minutes before it. 0 for a circuit that never moved."""
    if row.version == 0:
        return 0
    return -(-row.since // MINUTE) * MINUTE


def window_buckets(minutes: Mapping[int, Minute], now: int,
                   circuit: CircuitSettings) -> list[int]:
    """The ``window`` minutes a circuit is judged on at ``now``, oldest first: the last
    ``window`` minutes, ending with the current one once it has ``min_calls`` calls
    (until then with the minute before)."""
    n = circuit.window_minutes
    current = now - now % MINUTE
    recent = [current - i * MINUTE for i in range(n + 1)]  # newest first
    if minutes.get(current, (0, 0.0, 0))[0] < circuit.min_calls:
        recent = recent[1:]  # the current minute has not got its calls yet
    return list(reversed(recent[:n]))


def window_figures(minutes: Mapping[int, Minute], now: int,
                   circuit: CircuitSettings) -> tuple[float | None, int]:
    """(completeness, calls) of the primary path over the minutes a circuit is judged
    on at ``now`` (:func:`window_buckets`): what its alert reports."""
    calls, s, k = 0, 0.0, 0
    for b in window_buckets(minutes, now, circuit):
        m = minutes.get(b, (0, 0.0, 0))
        calls, s, k = calls + m[0], s + m[1], k + m[2]
    return (s / k if k else None), calls


def should_open(minutes: Mapping[int, Minute], now: int, circuit: CircuitSettings, *,
                not_before: int = 0) -> tuple[bool, dict[str, Any]]:
    """Whether completeness stayed under the threshold in each minute of the window
    (each minute with ``min_calls`` calls, none starting before ``not_before``), and the
    figures looked at: each minute's, and the window's ``calls`` and ``completeness``
    (merged over the minutes: what the circuit's alert reports when it opens)."""
    looked = []
    ok = True
    for b in window_buckets(minutes, now, circuit):
        m = minutes.get(b, (0, 0.0, 0))
        comp = _completeness(m)
        looked.append({"minute": b, "calls": m[0], "completeness": comp})
        if b < not_before or m[0] < circuit.min_calls or comp is None \
                or not under(comp, circuit.threshold):
            ok = False
    comp, calls = window_figures(minutes, now, circuit)
    return ok, {"threshold": circuit.threshold, "min_calls": circuit.min_calls,
                "minutes": looked, "calls": calls, "completeness": comp}


def should_close(minutes: Mapping[int, Minute], now: int, since: int,
                 circuit: CircuitSettings) -> tuple[bool, dict[str, Any]]:
    """Whether an open circuit has been open ``probation`` and its probes of the last
    ``probation`` (whole minutes after it opened) are back at or over the threshold."""
    probation_ms = int(circuit.probation * 1000)
    start = now - probation_ms
    first = max(since - since % MINUTE + MINUTE, start - start % MINUTE)
    calls, s, k = 0, 0.0, 0
    for b, m in minutes.items():
        if b >= first:
            calls, s, k = calls + m[0], s + m[1], k + m[2]
    comp = s / k if k else None
    figures = {"threshold": circuit.threshold, "min_calls": circuit.min_calls,
               "probe_calls": calls, "probe_completeness": comp, "from": first}
    ok = (now - since >= probation_ms and calls >= circuit.min_calls and comp is not None
          and not under(comp, circuit.threshold))
    return ok, figures


#: The rule name of a circuit's alert: it fires while the circuit is OPEN.
CIRCUIT_RULE = "completeness_circuit"
#: The model of a finding about every model of a prompt path.
ANY_MODEL = "*"


#: Keys of an OPEN circuit's figures once it is held by hand after its evaluator opened
#: it: the version of the move that opened it (its episode) and when that was (ms).
EPISODE, OPENED_AT = "episode", "opened_at"


def episode(row: CircuitRow) -> int:
    """The episode of an open circuit: the version of the move that opened it. Holding
    an open circuit by hand is a move of its own (OPEN -> OPEN) in the same episode."""
    return int((row.figures or {}).get(EPISODE, row.version))


def opened_at(row: CircuitRow) -> int:
    """When an open circuit opened (ms): its ``since``, or, once held by hand after its
    evaluator opened it, when the evaluator did."""
    return int((row.figures or {}).get(OPENED_AT, row.since))


def decided_figures(row: CircuitRow) -> tuple[float | None, int] | None:
    """(completeness, calls) an OPEN circuit was opened on by its evaluator (kept when
    it is held by hand since), or None (opened by hand). Moves recorded before the
    window's totals were stored give them from their minutes (weighted by calls)."""
    figures = row.figures or {}
    if row.state != CircuitState.OPEN or "minutes" not in figures:
        return None
    if "calls" in figures:
        comp = figures.get("completeness")
        return (None if comp is None else float(comp)), int(figures["calls"])
    looked = [m for m in figures["minutes"] if m.get("completeness") is not None]
    calls = sum(int(m.get("calls") or 0) for m in figures["minutes"])
    weight = sum(int(m.get("calls") or 0) for m in looked)
    comp = sum(float(m["completeness"]) * int(m.get("calls") or 0) for m in looked) \
        / weight if weight else None
    return comp, calls


def circuit_findings(store: Store, quality: QualitySettings) -> list[Finding]:
    """One finding per configured circuit, fired while it is OPEN (so its switch opens
    an alert, and its closing resolves it): the primary path's completeness and calls
    over the circuit's window (the minutes :func:`should_open` judges now) against the
    threshold, the figures the circuit was opened on (``decided``: what its alert
    opens with), and the onset: the first minute of the window that opened it (when it
    opened, if opened by hand). A closed circuit's finding holds the figures of its
    window now (what a hand-closed circuit's alert resolves with).
    The model is ``*``: a circuit watches its path over every model and endpoint."""
    if not quality.circuit:
        return []
    rows, now = CircuitStore(store).rows()
    qstore = QualityStore(store)
    out = []
    for c in quality.circuit:
        row = rows.get(c.prompt)
        if row is None:
            continue
        is_open = row.state == CircuitState.OPEN
        minutes = path_minutes(qstore, c, now - now % MINUTE - c.window_minutes * MINUTE)
        comp, calls = window_figures(minutes, now, c)
        # The incident began with the first bad minute that opened it (by hand: when).
        opened = opened_at(row)
        looked = (row.figures or {}).get("minutes") or []
        onset = min((int(m["minute"]) for m in looked), default=opened)
        out.append(Finding(CIRCUIT_RULE, c.prompt, ANY_MODEL, is_open,
                           0.0 if comp is None else comp, None, c.threshold, calls,
                           subject=f"to {fallback_text(c.fallback_kind, c.fallback_target)}",
                           onset=min(onset, opened),
                           episode=episode(row) if is_open else None,
                           decided=decided_figures(row) if is_open else None))
    return out


def fallback_text(kind: str, target: str) -> str:
    """Where a circuit sends its tasks, in words: ``review``, ``prompt name@N`` or
    ``endpoint NAME`` (review named once)."""
    return "review" if kind == "review" else f"{kind} {target}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"


class CircuitEvaluator:
    """Evaluates every configured circuit and moves those whose figures say so."""

    def __init__(self, store: Store, quality: QualitySettings, *, actor: str) -> None:
        self.circuits = tuple(quality.circuit)
        self.cstore = CircuitStore(store)
        self.qstore = QualityStore(store)
        self.actor = actor
        self._ensured = False

    def tick(self, *, now: int | None = None) -> int:
        """One evaluation of every circuit; returns how many this call moved. ``now``
        (ms) is the database clock unless given (a test pins it)."""
        if not self.circuits:
            return 0
        if not self._ensured:
            self.cstore.ensure(c.prompt for c in self.circuits)
            self._ensured = True
        rows, db_now = self.cstore.rows()
        now = db_now if now is None else now
        moved = 0
        for c in self.circuits:
            row = rows.get(c.prompt)
            if row is None:  # deleted by hand: made again on the next tick
                self._ensured = False
                continue
            if row.manual:
                continue
            if row.state == CircuitState.CLOSED:
                moved += self._maybe_open(c, row, now)
            elif row.state == CircuitState.OPEN:
                moved += self._maybe_close(c, row, now)
        return moved

    def _read(self, c: CircuitSettings, since: int) -> dict[int, Minute]:
        return path_minutes(self.qstore, c, since)

    def _maybe_open(self, c: CircuitSettings, row: CircuitRow, now: int) -> int:
        current = now - now % MINUTE
        minutes = self._read(c, current - c.window_minutes * MINUTE)
        trip, figures = should_open(minutes, now, c, not_before=fresh_from(row))
        if not trip:
            return 0
        worst = max((m["completeness"] or 0.0) for m in figures["minutes"])
        reason = (f"completeness under {c.threshold:.1%} in each of the last "
                  f"{c.window_minutes} minute(s) (at most {worst:.1%})")
        moved = self.cstore.move(row, CircuitState.OPEN, actor=self.actor, reason=reason,
                                 figures=figures)
        if moved is None:
            return 0
        log.warning("completeness circuit '%s' OPEN: %s; new tasks go to %s, %s probe "
                    "the primary", c.prompt, reason,
                    fallback_text(c.fallback_kind, c.fallback_target), _pct(c.probe_share))
        return 1

    def _maybe_close(self, c: CircuitSettings, row: CircuitRow, now: int) -> int:
        if now - row.since < int(c.probation * 1000):
            return 0
        minutes = self._read(c, row.since - row.since % MINUTE)
        close, figures = should_close(minutes, now, row.since, c)
        if not close:
            return 0
        reason = (f"probes back at {_pct(figures['probe_completeness'])} (threshold "
                  f"{c.threshold:.1%}, {figures['probe_calls']} calls) after "
                  f"{(now - row.since) / 60000:.1f} min open")
        moved = self.cstore.move(row, CircuitState.CLOSED, actor=self.actor, reason=reason,
                                 figures=figures)
        if moved is None:
            return 0
        log.warning("completeness circuit '%s' CLOSED: %s", c.prompt, reason)
        return 1


class CircuitService:
    """The evaluator as a worker's side service: one tick every ``[quality]
    circuit_every_s`` on a thread of its own; database trouble is retried with back-off."""

    name = "circuit"

    def __init__(self, store: Store, quality: QualitySettings) -> None:
        self.store = store
        self.quality = quality
        self.every_s = quality.circuit_every_s
        self.ticks = 0
        self.moves = 0

    async def run(self, stopping: asyncio.Event, worker_id: str) -> None:
        evaluator = CircuitEvaluator(self.store, self.quality, actor=worker_id)
        loop = asyncio.get_running_loop()
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lockgate-circuit")
        failures = 0
        try:
            while not stopping.is_set():
                delay = self.every_s
                try:
                    self.moves += await loop.run_in_executor(pool, evaluator.tick)
                    failures = 0
                except StoreError as exc:
                    failures += 1
                    log.warning("completeness circuit evaluation failed (%d in a row), "
                                "retrying: %s", failures, exc)
                    delay = min(self.every_s, 0.1 * 2 ** failures)
                self.ticks += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), timeout=delay)
        finally:
            pool.shutdown(wait=False)

    async def busy(self) -> bool:
        """Never: a burst worker does not wait for circuits."""
        return False


@dataclass(frozen=True, slots=True)
class Detour:
    """Where an open circuit sends a task instead of its primary path."""

    circuit: CircuitSettings
    reason: str


RunDb = Callable[..., Awaitable[Any]]


class CircuitRouter:
    """A worker's view of the circuits: the states read at most every ``refresh_s``."""

    def __init__(self, store: Store, quality: QualitySettings, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.circuits = tuple(quality.circuit)
        self.cstore = CircuitStore(store)
        self.refresh_s = quality.circuit_refresh_s
        self.clock = clock
        self._states: dict[str, CircuitRow] = {}
        self._read_at = float("-inf")
        self._lock: asyncio.Lock | None = None
        self.reads = 0

    async def detour(self, prompt_key: str | None, task_id: str, batch_id: str,
                     run_db: RunDb) -> Detour | None:
        """Where an open circuit sends this task, or None for its primary path (no
        circuit, circuit closed, or the task is one of the probes). Release-gate
        evaluations always take their primary path."""
        if not self.circuits or not prompt_key or batch_id.startswith(RESERVED_ID_PREFIX):
            return None
        c = circuit_for(self.circuits, prompt_key)
        if c is None:
            return None
        states = await self._read(run_db)
        row = states.get(c.prompt)
        if row is None or row.state != CircuitState.OPEN or probes(task_id, c):
            return None
        return Detour(c, f"completeness circuit '{c.prompt}' is open: {row.reason or ''}")

    async def _read(self, run_db: RunDb) -> dict[str, CircuitRow]:
        if self.clock() - self._read_at < self.refresh_s:
            return self._states
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.clock() - self._read_at < self.refresh_s:
                return self._states
            self.reads += 1
            self._states, _now = await run_db(self.cstore.rows)
            self._read_at = self.clock()
            return self._states


# -- what operators see and do (lockgate circuit, lockgate status) --------------------

def _configured(quality: QualitySettings, prompt: str) -> CircuitSettings:
    c = quality.circuit_of(prompt)
    if c is None:
        known = ", ".join(x.prompt for x in quality.circuit) or "none"
        raise ConfigError(f"no completeness circuit for prompt '{prompt}' (configured: "
                          f"{known}); add a [[quality.circuit]] with prompt = \"{prompt}\"")
    return c


def actor_of(actor: str | None) -> str:
    """The actor of an operator's move: as given, else the login name."""
    return actor or default_actor() or "operator"


def set_circuit(store: Store, quality: QualitySettings, prompt: str, state: str, *,
                actor: str | None = None, reason: str | None = None) -> CircuitView:
    """Open (held: the evaluator leaves it until it is closed by hand) or close a
    circuit by hand, by compare-and-swap; :class:`StateConflict` when it already is so.

    Opening a circuit its evaluator opened holds it: a move OPEN -> OPEN that keeps
    the episode (its alert stays the one alert of the episode), the figures it was
    opened on and when it opened."""
    c = _configured(quality, prompt)
    cstore = CircuitStore(store)
    cstore.ensure([prompt])
    who = actor_of(actor)
    for _ in range(5):
        rows, _now = cstore.rows()
        row = rows[prompt]
        if row.state == state and (row.manual or state == CircuitState.CLOSED):
            raise StateConflict(f"circuit '{prompt}' is already {state}"
                                + (" (held by hand)" if row.manual else ""))
        figures = None
        why = reason or f"{'opened' if state == 'OPEN' else 'closed'} by hand"
        if row.state == state:  # OPEN by its evaluator: held by hand, same episode
            figures = {**(row.figures or {}), EPISODE: episode(row),
                       OPENED_AT: opened_at(row)}
            why = reason or "held open by hand"
            if row.reason:
                why = f"{why} (opened: {row.reason})"
        moved = cstore.move(row, state, actor=who, manual=state == CircuitState.OPEN,
                            reason=why, figures=figures)
        if moved is not None:
            log.warning("completeness circuit '%s' %s by %s: %s", prompt, state, who,
                        moved.reason)
            return view(c, moved)
    raise StateConflict(f"circuit '{prompt}' kept changing under this move; try again")


def view(c: CircuitSettings, row: CircuitRow | None) -> CircuitView:
    """A circuit's configuration and stored state (CLOSED when it has no row yet)."""
    return CircuitView(
        prompt=c.prompt, state=row.state if row else CircuitState.CLOSED,
        # an open circuit held by hand is open since its evaluator opened it
        since=utc(opened_at(row) if row.state == CircuitState.OPEN else row.since)
        if row and row.version else None,
        reason=row.reason if row else None, manual=bool(row and row.manual),
        changed_by=row.changed_by if row else None, fallback_kind=c.fallback_kind,
        fallback=c.fallback_target, threshold=c.threshold, window_s=c.window,
        min_calls=c.min_calls, probation_s=c.probation, probe_share=c.probe_share,
        figures=row.figures if row else None, version=row.version if row else 0)


def circuit_views(store: Store, quality: QualitySettings) -> list[CircuitView]:
    """Every configured circuit with its state now."""
    if not quality.circuit:
        return []
    rows, _now = CircuitStore(store).rows()
    return [view(c, rows.get(c.prompt)) for c in quality.circuit]
