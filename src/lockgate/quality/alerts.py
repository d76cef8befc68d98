"""Quality alerts: the evaluator that turns the anomaly rules' findings into alerts, and
what reads them.

One evaluator runs at a time across every worker process and machine: it holds the
``quality_evaluator`` role lease (:class:`~lockgate.store.alerts.AlertStore`) and every
transaction it writes renews that lease first, so an evaluator whose lease was taken
over writes nothing. An alert opens once per incident (rule, prompt version, model and,
for a drift, the watched value; a unique key allows one OPEN alert per incident), is
updated while the rule fires, resolves when it stops firing, and the same incident
cannot open again before ``[quality] cooldown`` has passed. Each change that is
announced writes its webhook deliveries (the outbox) in the same transaction.

Workers may run different configurations (a rolling change), so an evaluator resolves
only the alerts it can judge (:meth:`Evaluator.apply`): a circuit's alert resolves when
the circuit's recorded state is no longer the OPEN episode it was opened for, whatever
the holder's configuration; a rule's alert when the holder's rule, with the window and
bound the alert was opened with, no longer fires on it. An event goes to the webhooks
of the holder's configuration and to those the alert's earlier events went to.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

import orjson
from sqlalchemy import func, select

from lockgate.config import CircuitSettings, Settings
from lockgate.quality.circuit import (
    ANY_MODEL,
    CIRCUIT_RULE,
    circuit_findings,
    decided_figures,
    episode,
    fallback_text,
    opened_at,
)
from lockgate.quality.report import check_rules, prompt_filter, resolution_for
from lockgate.quality.rollup import SPANS, bucket_of
from lockgate.quality.rules import RULES, Finding
from lockgate.redact import MASK
from lockgate.results import plain, utc
from lockgate.states import CircuitState
from lockgate.store import schema
from lockgate.store.alerts import AlertStore, LeaseLost
from lockgate.store.circuit import CircuitEvent, CircuitRow, CircuitStore
from lockgate.store.quality import QualityStore, StoredRollup
from lockgate.store.store import Store
from lockgate.store.tx import Tx

log = logging.getLogger("lockgate.quality")

ROLE = "quality_evaluator"
#: Attempts a rule picks its samples from (newest first, one index range).
CANDIDATES = 2000
#: Attempts the batches touched since onset are counted over (newest first).
TOUCHED = 5000


@dataclass(frozen=True, slots=True)
class AlertSample:
    """A failing attempt kept with an alert: its rendered prompt and raw output (any
    secret masked)."""

    attempt_id: int
    task_id: str
    batch_id: str
    started_at: datetime | None
    latency_ms: float | None
    endpoint: str | None
    parse_status: str | None
    completeness: float | None
    error_class: str | None
    error_message: str | None
    prompt: str | None
    raw_output: str | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: times in ISO-8601 UTC with milliseconds and ``Z``."""
        return {f.name: plain(getattr(self, f.name)) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class Alert:
    """One incident of an anomaly rule on a prompt version and model (and watched value).

    ``value``, ``baseline`` and ``threshold`` are the rule's figures (shares as
    fractions, latency in ms); ``calls`` the calls of the rule's window; ``tasks`` and
    ``batches`` the volume touched since ``onset`` (``batches_exact`` False when the
    count stopped at its bound: "at least")."""

    id: int
    rule: str
    prompt: str
    model: str
    subject: str | None
    status: str
    window_s: float
    #: None when the window held no call (a circuit opened by hand before any traffic).
    value: float | None
    baseline: float | None
    threshold: float
    calls: int
    tasks: int
    batches: int
    batches_exact: bool
    onset: datetime | None
    opened_at: datetime | None
    updated_at: datetime | None
    resolved_at: datetime | None
    acked_at: datetime | None
    acked_by: str | None
    ack_reason: str | None
    samples: tuple[AlertSample, ...] = ()
    deliveries: tuple[dict[str, Any], ...] = ()

    @property
    def acked(self) -> bool:
        return self.acked_at is not None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, as ``lockgate alerts show --json`` prints it and a webhook body
        holds it: times in ISO-8601 UTC with milliseconds and ``Z``."""
        return {f.name: plain(getattr(self, f.name)) for f in fields(self)}


def alert_of(row: Mapping[str, Any], samples: Iterable[Mapping[str, Any]] = (),
             deliveries: Iterable[Mapping[str, Any]] = ()) -> Alert:
    """The :class:`Alert` of a stored row."""
    return Alert(
        id=int(row["id"]), rule=row["rule"], prompt=row["prompt"], model=row["model"],
        subject=row["subject"], status=row["status"], window_s=float(row["window_s"]),
        value=float(row["value"]) if int(row["calls"]) else None,
        baseline=None if row["baseline"] is None else float(row["baseline"]),
        threshold=float(row["threshold"]), calls=int(row["calls"]), tasks=int(row["tasks"]),
        batches=int(row["batches"]), batches_exact=bool(row["batches_exact"]),
        onset=utc(row["onset_at"]), opened_at=utc(row["opened_at"]),
        updated_at=utc(row["updated_at"]), resolved_at=utc(row["resolved_at"]),
        acked_at=utc(row["acked_at"]), acked_by=row["acked_by"],
        ack_reason=row["ack_reason"],
        samples=tuple(AlertSample(
            attempt_id=int(s["attempt_id"]), task_id=s["task_id"], batch_id=s["batch_id"],
            started_at=utc(s["started_at"]), latency_ms=s["latency_ms"],
            endpoint=s["endpoint"], parse_status=s["parse_status"],
            completeness=s["completeness"], error_class=s["error_class"],
            error_message=s["error_message"], prompt=s["prompt_snapshot"],
            raw_output=s["raw_output"]) for s in samples),
        deliveries=tuple(dict(d) for d in deliveries))


def alert_key(rule: str, prompt: str, model: str, subject: str | None,
              episode: int | None = None) -> str:
    """The incident key of an alert (sha256 hex of its rule, prompt, model, subject and,
    where the finding tells, its episode)."""
    parts: list[Any] = [rule, prompt, model, subject or ""]
    if episode is not None:
        parts.append(episode)
    return hashlib.sha256(orjson.dumps(parts)).hexdigest()


def _key_of(f: Finding) -> str:
    return alert_key(f.rule, f.prompt, f.model, f.subject, f.episode)


# -- secrets never stored ---------------------------------------------------------------

_URL_AUTH = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s/@:]*):[^\s/@]+@")
_BEARER = re.compile(r"(?i)(bearer\s+|api[_-]?key[\"']?\s*[:=]\s*[\"']?)[A-Za-z0-9._~+/=-]{8,}")


def known_secrets(settings: Settings) -> tuple[str, ...]:
    """The secrets the configuration names and the environment holds: endpoint API keys
    and webhook secrets."""
    found: list[str] = []
    for ep in settings.endpoints():
        if ep.api_key_env and os.environ.get(ep.api_key_env):
            found.append(os.environ[ep.api_key_env])
    for w in settings.quality.webhook:
        if w.secret:
            found.append(w.secret)
        elif w.secret_env and os.environ.get(w.secret_env):
            found.append(os.environ[w.secret_env])
    return tuple(sorted({s for s in found if len(s) >= 4}, key=len, reverse=True))


def scrub(text: str | None, known: Sequence[str]) -> str | None:
    """``text`` with known secrets, URL passwords and bearer tokens masked."""
    if text is None:
        return None
    for s in known:
        text = text.replace(s, MASK)
    text = _URL_AUTH.sub(lambda m: f"{m.group(1)}:{MASK}@", text)
    return _BEARER.sub(lambda m: f"{m.group(1)}{MASK}", text)


# -- the evaluator ----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Event:
    """An announced change: ``open``, ``update`` or ``resolve`` of an alert."""

    event: str
    alert: Alert
    deliveries: tuple[str, ...]


class Evaluator:
    """The evaluator role of one process (sync; the worker runs :meth:`tick` in a
    thread)."""

    def __init__(self, store: Store, settings: Settings, *, worker_id: str,
                 token: str | None = None) -> None:
        self.store = store
        self.settings = settings
        self.q = settings.quality
        self.astore = AlertStore(store)
        self.worker_id = worker_id
        self.token = token or secrets.token_hex(16)
        self.lease_ms = int(self.q.evaluator_lease_s * 1000)
        self.holding = False
        self.targets = tuple(w.target for w in self.q.webhook)
        self._secrets = known_secrets(settings)
        from lockgate.quality.writer import RollupWriter  # deferred: OpenTelemetry SDK

        self._writer = RollupWriter(store, shard="evaluator", keywords=self.q.keywords)

    # -- the role ---------------------------------------------------------------------

    def claim(self) -> bool:
        """Take or renew the role; whether this process holds it now."""
        was = self.holding
        self.holding = self.astore.claim_role(ROLE, self.worker_id, self.token,
                                              self.lease_ms)
        if self.holding and not was:
            log.info("quality evaluator: %s holds the role", self.worker_id)
        return self.holding

    def release(self) -> None:
        """Give the role up (a stopping worker hands it over at once)."""
        if self.holding:
            self.astore.release_role(ROLE, self.token)
            self.holding = False

    def tick(self) -> list[Event]:
        """Evaluate the rules and bring the alerts in line, if this process holds the
        role (else nothing); the events announced."""
        if not self.claim():
            return []
        findings = check_rules(self.store, self.q) + circuit_findings(self.store, self.q)
        try:
            events = self.store.transaction(lambda tx: self.apply(tx, findings))
        except LeaseLost:
            self.holding = False
            log.warning("quality evaluator: %s lost the role before writing; nothing "
                        "written", self.worker_id)
            return []
        for e in events:
            self._log(e)
        return events

    def apply(self, tx: Tx, findings: Sequence[Finding]) -> list[Event]:
        """One fenced transaction: renew the role, then open, update and resolve.

        Only what this holder can judge is resolved (another worker may hold the role
        next with another configuration, during a rolling change):

        * a circuit's alert (rule ``completeness_circuit``) resolves when the circuit's
          recorded state is no longer the OPEN episode the alert was opened in (closed,
          or closed and opened again since), read here whether or not this holder's
          configuration has the circuit; while that episode lasts it is the one alert
          of it (updated by a holder that has the circuit, left as it is by one that
          has not);
        * a rule's alert resolves when the rule no longer fires on it, judged by a
          holder whose settings give the alert's window and bound (its threshold
          against its baseline); a holder with other settings updates it (and judges
          it from then on) while its own rule fires on it, and leaves it as it is
          otherwise, until it has gone a whole ``[quality] window`` without an update:
          then the settings that opened it are nowhere any more, and it is judged as
          any other."""
        AlertStore.fence(tx, ROLE, self.token, self.lease_ms)
        judged = {_key_of(f): f for f in findings}
        fired = {k: f for k, f in judged.items() if f.fired}
        circuits = CircuitStore.rows_in(tx)
        # a circuit finding counts only for the episode the circuit is in now
        fired = {k: f for k, f in fired.items() if f.rule != CIRCUIT_RULE
                 or _in_episode(circuits.get(f.prompt), f.episode)}
        on_circuit = {f.prompt: k for k, f in fired.items() if f.rule == CIRCUIT_RULE}
        circuit_now = {f.prompt: f for f in findings if f.rule == CIRCUIT_RULE}
        events: list[Event] = []
        seen: set[str] = set()
        for row in AlertStore.open_alerts(tx):
            key = row["alert_key"]
            seen.add(key)
            alert_id = int(row["id"])
            if row["rule"] == CIRCUIT_RULE:
                if not _episode_lasts(circuits.get(row["prompt"]), int(row["opened_at"])):
                    cleared = self._circuit_cleared(tx, row, circuits.get(row["prompt"]),
                                                    circuit_now.get(row["prompt"]))
                    if AlertStore.resolve_alert(tx, alert_id, cleared):
                        events.append(self._announce(tx, alert_id, "resolve"))
                    continue
                # the episode's alert, whatever subject another configuration gave it
                key = on_circuit.get(row["prompt"], key)
                seen.add(key)
            f = fired.get(key)
            if f is None:
                # a circuit's alert of the episode under way, or a rule's this holder
                # does not judge, is left as it is
                if row["rule"] != CIRCUIT_RULE and self._judges(tx, row) \
                        and AlertStore.resolve_alert(tx, alert_id,
                                                     self._cleared(judged.get(key))):
                    events.append(self._announce(tx, alert_id, "resolve"))
                continue
            figures = self._figures(tx, f, int(row["onset_at"]))
            notify = bool(self.q.update_every) and \
                tx.now - int(row["notified_at"]) >= self.q.update_every * 1000
            AlertStore.update_alert(tx, alert_id, figures,
                                    tx.now if notify else int(row["notified_at"]))
            self._sample(tx, alert_id, f)
            if notify:
                events.append(self._announce(tx, alert_id, "update"))
        # circuit episodes that began and ended unseen (between two evaluations, or
        # while the role was vacant): announced now, opened and resolved at once
        events.extend(self._past_episodes(tx, circuits))
        for key, f in sorted(fired.items()):
            if key in seen:
                continue
            last = AlertStore.last_resolved(tx, key)
            if last is not None and f.rule != CIRCUIT_RULE \
                    and tx.now < last + int(self.q.cooldown * 1000):
                continue  # cooling down: the same incident does not open again yet
            events.append(self._announce(tx, self._open(tx, key, f), "open"))
        return events

    def _open(self, tx: Tx, key: str, f: Finding) -> int:
        """Insert the OPEN alert of a finding (its figures and samples); its id."""
        onset = self._onset(tx, f)
        figures = self._figures(tx, f, onset)
        if f.decided is not None:  # a circuit opens with what it was opened on
            value, calls = f.decided
            figures.update(value=0.0 if value is None else value,
                           calls=calls if value is not None else 0)
        alert_id = AlertStore.insert_alert(tx, {
            "alert_key": key, "rule": f.rule, "prompt": f.prompt, "model": f.model,
            "subject": None if f.subject is None else f.subject[:191],
            "window_s": self._window_s(f), "onset_at": onset, **figures})
        self._sample(tx, alert_id, f)
        return alert_id

    def _past_episodes(self, tx: Tx, circuits: Mapping[str, CircuitRow]) -> list[Event]:
        """Announce each episode of a configured circuit (a move to OPEN from CLOSED,
        up to the move that closed it) that is over and has no alert: it opened and
        closed between two evaluations, or while no worker held the role. Its alert is
        opened with the figures the circuit was opened on and resolved with those it
        closed on, in this transaction: two events, each to the webhooks. Bounded: only
        moves after the newest circuit alert of the prompt was opened (every episode
        before it was seen by then) and within ``[quality] window``, so neither a first
        deployment nor a cleanup replays the history."""
        events: list[Event] = []
        for c in self.q.circuit:
            if c.prompt not in circuits:
                continue
            after = tx.now - int(self.q.window * 1000)
            newest = AlertStore.newest_opened(tx, CIRCUIT_RULE, c.prompt)
            if newest is not None:
                after = max(after, newest)
            moves = CircuitStore.moves_after(tx, c.prompt, after)
            subject = f"to {fallback_text(c.fallback_kind, c.fallback_target)}"
            for i, move in enumerate(moves):
                if move.to_state != CircuitState.OPEN or move.from_state == CircuitState.OPEN:
                    continue
                close = next((m for m in moves[i + 1:]
                              if m.to_state == CircuitState.CLOSED), None)
                if close is None:
                    continue  # the episode under way: its finding opens its alert
                key = alert_key(CIRCUIT_RULE, c.prompt, ANY_MODEL, subject, move.version)
                if AlertStore.has_key(tx, key):
                    continue
                opened = CircuitRow(c.prompt, CircuitState.OPEN, move.at, move.reason,
                                    move.figures, False, move.version, move.actor, move.at)
                decided = decided_figures(opened)
                looked = (move.figures or {}).get("minutes") or []
                onset = min((int(m["minute"]) for m in looked), default=move.at)
                value, calls = decided if decided is not None else (None, 0)
                f = Finding(CIRCUIT_RULE, c.prompt, ANY_MODEL, True,
                            0.0 if value is None else value, None, c.threshold, calls,
                            subject=subject, onset=min(onset, move.at),
                            episode=move.version, decided=decided)
                alert_id = self._open(tx, key, f)
                events.append(self._announce(tx, alert_id, "open"))
                if AlertStore.resolve_alert(tx, alert_id,
                                            self._closed_on(close, c.threshold, c)):
                    events.append(self._announce(tx, alert_id, "resolve"))
        return events

    @staticmethod
    def _closed_on(close: CircuitEvent, threshold: float,
                   c: CircuitSettings | None) -> dict[str, Any] | None:
        """The figures a circuit's alert resolves with when its evaluator closed it
        (``close``: the move): the probes' completeness and calls over the probation.
        None (closed by hand: the figures stay) otherwise."""
        figures = close.figures
        if figures is None or "probe_calls" not in figures:
            return None
        comp = figures.get("probe_completeness")
        start = int(figures.get("from") or close.at)
        return {"value": 0.0 if comp is None else float(comp),
                "calls": int(figures["probe_calls"]) if comp is not None else 0,
                "baseline": None, "threshold": float(figures.get("threshold", threshold)),
                "window_s": c.probation if c is not None
                else max(0.0, (close.at - start) / 1000)}

    def _cleared(self, f: Finding | None) -> dict[str, Any]:
        """The figures a rule's alert resolves with: those of the evaluation that
        cleared it (its value back inside the bound, unless the rule cleared on its
        other condition: a latency whose input size left the band, a drift no longer
        expected often enough), or, when the rule no longer has the calls to compare
        (no finding; a finding not :attr:`~Finding.measured`: a minute short of
        ``min_calls_minute`` parsed outputs, an empty one included), none measured
        (``calls`` 0: the value reads ``-``)."""
        if f is None or not f.measured:
            return {"value": 0.0, "calls": 0}
        return {"value": f.value, "baseline": f.baseline, "threshold": f.threshold,
                "calls": f.calls, "window_s": self._window_s(f)}

    def _circuit_cleared(self, tx: Tx, alert: Mapping[str, Any], row: CircuitRow | None,
                         now: Finding | None) -> dict[str, Any] | None:
        """The figures a circuit's alert resolves with. Closed by its evaluator: the
        probes it closed on (completeness and calls over the probation, against the
        threshold). Closed by hand: the primary path's figures over the circuit's
        window now (this holder's configuration), if this holder has the circuit.
        None (the figures stay) when neither is known."""
        if row is None:
            return None
        close: dict[str, Any] | None
        if row.state == CircuitState.CLOSED:
            close, at = row.figures, row.since
        else:  # closed and opened again since: the move that closed the episode
            event = CircuitStore.last_move_in(tx, row.prompt, CircuitState.CLOSED)
            if event is None or event.at < int(alert["opened_at"]):
                return None
            close, at = event.figures, event.at
        c = self.q.circuit_of(row.prompt)
        if close is not None and "probe_calls" in close:
            return self._closed_on(
                CircuitEvent(row.prompt, row.version, CircuitState.OPEN,
                             CircuitState.CLOSED, at, "", None, close),
                float(alert["threshold"]), c)
        if now is None or c is None or row.state != CircuitState.CLOSED:
            return None
        return {"value": now.value, "calls": now.calls, "baseline": None,
                "threshold": now.threshold, "window_s": c.window}

    def _judges(self, tx: Tx, row: Mapping[str, Any]) -> bool:
        """Whether this holder judges a rule's alert: its settings give the alert's
        window and bound, or the alert has gone a whole ``window`` without an update
        (the settings that opened it are gone)."""
        if tx.now - int(row["updated_at"]) >= int(self.q.window * 1000):
            return True
        rule = str(row["rule"])
        if rule not in RULES:
            return False  # a rule this version does not evaluate
        q = self.q
        window = q.pollution_minutes * 60.0 if rule == "format_pollution" else q.window
        if not math.isclose(float(row["window_s"]), window, rel_tol=1e-9):
            return False
        if rule == "format_pollution":
            bound = q.invalid_json_share
        elif row["baseline"] is None:
            return True
        else:
            base = float(row["baseline"])
            bound = base * (1 + q.latency_rise) if rule == "performance_degradation" \
                else base * (1 - (q.drift_drop if rule == "semantic_drift"
                                  else q.completeness_drop))
        return math.isclose(float(row["threshold"]), bound, rel_tol=1e-6, abs_tol=1e-12)

    # -- figures ------------------------------------------------------------------------

    def _window_s(self, f: Finding) -> float:
        if f.rule == CIRCUIT_RULE:
            c = self.q.circuit_of(f.prompt)
            return self.q.window if c is None else c.window
        return self.q.pollution_minutes * 60.0 if f.rule == "format_pollution" \
            else self.q.window

    def _onset(self, tx: Tx, f: Finding) -> int:
        """Since when the incident counts: the first polluted minute for format
        pollution, else the start of the window the rule judged (a rule on a window's
        mean cannot tell when in the window it began); a circuit's: when it opened."""
        if f.onset is not None:
            return f.onset
        if f.rule == "format_pollution":
            return bucket_of(tx.now, "m") - self.q.pollution_minutes * SPANS["m"]
        res = resolution_for(self.q.window, "version")
        return bucket_of(tx.now, res) + SPANS[res] - int(self.q.window * 1000)

    def _figures(self, tx: Tx, f: Finding, onset: int) -> dict[str, Any]:
        tasks = self._tasks_since(tx, f, onset)
        batches, exact = self._batches_since(tx, f, onset)
        return {"value": f.value, "baseline": f.baseline, "threshold": f.threshold,
                "calls": f.calls, "tasks": tasks, "batches": batches,
                "batches_exact": int(exact)}

    def _rollups_since(self, f: Finding, since: int, now: int) -> list[StoredRollup]:
        """The finding's prompt's rollup rows since ``since``: minute rows up to 6 h
        back, else hour rows from the hour holding it."""
        res = "m" if now - since <= 6 * 3_600_000 else "h"
        exact, prefix = prompt_filter(f.prompt)
        return QualityStore(self.store).rows(res, since=bucket_of(since, res),
                                             prompt=exact, prompt_prefix=prefix)

    def _tasks_since(self, tx: Tx, f: Finding, onset: int) -> int:
        """Tasks ended since the onset itself (for a circuit on a registry name, those
        of every version of it but its fallback version, as :meth:`_versions`): the
        rollups from the first whole minute at or after the onset (minute rows while it
        is at most 6 h back; beyond, minute rows up to the next whole hour and hour rows
        from there), and, for an onset inside a minute (a circuit opened by hand), that
        minute's tasks ended after it, counted from its attempts (a minute at most)."""
        now = tx.now
        c = self.q.circuit_of(f.prompt) if f.rule == CIRCUIT_RULE else None
        fallback = None if c is None else c.fallback_prompt
        exact, prefix = prompt_filter(f.prompt)
        qstore = QualityStore(self.store)
        minute, hour = SPANS["m"], SPANS["h"]
        first = -(-onset // minute) * minute  # the first whole minute from the onset
        if now - first <= 6 * hour:
            rows = qstore.rows("m", since=first, prompt=exact, prompt_prefix=prefix)
        else:
            first_hour = -(-first // hour) * hour
            rows = qstore.rows("m", since=first, until=first_hour, prompt=exact,
                               prompt_prefix=prefix) \
                + qstore.rows("h", since=first_hour, prompt=exact, prompt_prefix=prefix)
        tasks = sum(int(r.values["tasks"]) for r in rows
                    if f.model in (ANY_MODEL, r.model) and r.prompt != fallback)
        if first > onset:
            model = None if f.model == ANY_MODEL else f.model
            configs = self._inline_configs(tx, f)
            for version in self._versions(f, onset, now):
                tasks += AlertStore.ended(tx, version, model, onset, first,
                                          configs=configs if version is None else None)
        return tasks

    @staticmethod
    def _version(prompt: str) -> str | None:
        return None if prompt.startswith("inline:") else prompt

    def _versions(self, f: Finding, since: int, now: int) -> list[str | None]:
        """The registry versions a finding's attempts are filed under (None: inline
        prompts): its own, or for a circuit on a registry name every version of it the
        rollups saw since ``since``, its fallback version left out."""
        if prompt_filter(f.prompt)[0] is not None:
            return [self._version(f.prompt)]
        c = self.q.circuit_of(f.prompt)
        seen = {r.prompt for r in self._rollups_since(f, since, now)}
        if c is not None and c.fallback_prompt is not None:
            seen.discard(c.fallback_prompt)
        return list(sorted(seen))

    def _batches_since(self, tx: Tx, f: Finding, onset: int) -> tuple[int, bool]:
        model = None if f.model == ANY_MODEL else f.model
        batches: set[str] = set()
        exact = True
        configs = self._inline_configs(tx, f)
        for version in self._versions(f, onset, tx.now):
            rows = AlertStore.touched(tx, version, model, onset, TOUCHED,
                                      configs=configs if version is None else None)
            exact = exact and len(rows) < TOUCHED
            batches.update(r["batch_id"] for r in rows)
        return len(batches), exact

    # -- samples ------------------------------------------------------------------------

    def _sample(self, tx: Tx, alert_id: int, f: Finding) -> None:
        """Keep up to ``[quality] samples`` failing attempts of the rule."""
        have = AlertStore.sampled(tx, alert_id)
        room = self.q.samples - len(have)
        if room <= 0:
            return
        since = tx.now - int(self._window_s(f) * 1000) - SPANS["m"]
        model = None if f.model == ANY_MODEL else f.model
        configs = self._inline_configs(tx, f)
        rows = [r for version in self._versions(f, since, tx.now)
                for r in AlertStore.candidates(
                    tx, version, model, since, tx.now + SPANS["m"], CANDIDATES,
                    with_result=f.rule == "semantic_drift",
                    configs=configs if version is None else None)]
        rows = [r for r in rows if int(r["id"]) not in have and self._failing(tx, f, r)]
        if f.rule == "performance_degradation":
            rows.sort(key=lambda r: -float(r["latency_ms"]))
        chosen = [int(r["id"]) for r in rows[:room]]
        AlertStore.add_samples(tx, alert_id, (self._kept(a) for a in
                                              AlertStore.attempts(tx, chosen)))

    def _inline_configs(self, tx: Tx, f: Finding) -> list[str] | None:
        """For a finding on an inline prompt, the configs of its tasks: its attempts
        are read among theirs, not among every inline prompt's (a busier one on the
        same model would fill the newest rows read). None for a registry prompt."""
        if not f.prompt.startswith("inline:"):
            return None
        return self._writer.configs_of(tx, f.prompt)

    def _failing(self, tx: Tx, f: Finding, r: Mapping[str, Any]) -> bool:
        """Whether an attempt shows what the rule saw."""
        if f.rule == "format_pollution":
            return r["parse_status"] == "invalid_json"
        if f.rule in ("completeness_collapse", CIRCUIT_RULE):
            return r["completeness"] is not None and float(r["completeness"]) < 1.0
        if f.rule == "performance_degradation":
            return r["latency_ms"] is not None
        if f.rule == "semantic_drift":
            if r["outcome"] != "succeeded" or r["result"] is None:
                return False
            watch = self._writer.watch(tx, r["config_hash"], r["prompt_version"])
            try:
                output = orjson.loads(r["result"])
            except orjson.JSONDecodeError:
                return False
            return f.subject not in set(watch.found(output))
        return False

    def _kept(self, a: Mapping[str, Any]) -> dict[str, Any]:
        known = self._secrets
        return {"attempt_id": int(a["id"]), "task_id": a["task_id"],
                "batch_id": a["batch_id"], "started_at": int(a["started_at"]),
                "latency_ms": a["latency_ms"], "endpoint": a["endpoint"],
                "parse_status": a["parse_status"], "completeness": a["completeness"],
                "error_class": a["error_class"],
                "error_message": scrub(a["error_message"], known),
                "prompt_snapshot": scrub(a["prompt_snapshot"], known),
                "raw_output": scrub(a["raw_output"], known)}

    # -- announcing -----------------------------------------------------------------------

    def _announce(self, tx: Tx, alert_id: int, event: str) -> Event:
        """Queue the event to the webhooks the alert's earlier events went to and to
        this holder's: a holder whose configuration lacks a webhook (a rolling change)
        still queues the event to it, and a sender that knows it posts it."""
        alert = alert_of(AlertStore.alert_row(tx, alert_id))
        to = list(dict.fromkeys([*announced_to(tx, alert_id), *self.targets]))
        ids = AlertStore.enqueue(tx, alert_id, event, to,
                                 body_of=lambda did: event_body(event, did, alert))
        return Event(event, alert, tuple(ids))

    def _log(self, e: Event) -> None:
        a = e.alert
        what = f"{a.rule}{f' ({a.subject})' if a.subject else ''} on {a.prompt} / {a.model}"
        if e.event == "open":
            log.warning("quality alert %d OPEN: %s: %s vs baseline %s (threshold %s, %d "
                        "calls)", a.id, what, _fig(a.rule, a.value), _fig(a.rule, a.baseline),
                        _fig(a.rule, a.threshold), a.calls)
        elif e.event == "resolve":
            log.info("quality alert %d RESOLVED: %s: %s (threshold %s, %d calls)", a.id,
                     what, _fig(a.rule, a.value), _fig(a.rule, a.threshold), a.calls)
        else:
            log.info("quality alert %d still open: %s: %s (%d tasks, %d batches since "
                     "onset)", a.id, what, _fig(a.rule, a.value), a.tasks, a.batches)


def _in_episode(row: CircuitRow | None, ep: int | None) -> bool:
    """Whether a circuit's recorded state is OPEN in episode ``ep``."""
    return row is not None and row.state == CircuitState.OPEN and episode(row) == ep


def _episode_lasts(row: CircuitRow | None, alert_opened: int) -> bool:
    """Whether the OPEN episode a circuit's alert was opened in lasts: the circuit is
    recorded OPEN since (at the latest) the alert's opening."""
    return row is not None and row.state == CircuitState.OPEN \
        and opened_at(row) <= alert_opened


def _fig(rule: str, v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f} ms" if rule == "performance_degradation" else f"{v * 100:.2f}%"


def event_body(event: str, delivery_id: str, alert: Alert) -> bytes:
    """The JSON body of a webhook delivery: the alert as ``lockgate alerts show --json``
    prints it (:meth:`Alert.to_dict`), without its samples and deliveries."""
    doc = alert.to_dict()
    doc.pop("samples", None)
    doc.pop("deliveries", None)
    return orjson.dumps({"event": event, "delivery": delivery_id, "alert": doc},
                        option=orjson.OPT_SORT_KEYS)


# -- reading --------------------------------------------------------------------------------

def list_alerts(store: Store, *, everything: bool = False, limit: int = 1000) -> list[Alert]:
    """The newest ``limit`` open alerts, oldest first; with ``everything`` the newest
    ``limit`` alerts, resolved ones too, newest first."""
    return [alert_of(r) for r in AlertStore(store).alerts(everything=everything,
                                                          limit=limit)]


def get_alert(store: Store, alert_id: int) -> Alert:
    """An alert with its samples (newest first) and deliveries."""
    row, samples, deliveries = AlertStore(store).alert(alert_id)
    return alert_of(row, samples, deliveries)


def announced_to(tx: Tx, alert_id: int) -> list[str]:
    """The webhooks (targets) the alert's events were queued to, in the order first
    queued: what the evaluator's configuration named when it announced them."""
    d = schema.alert_delivery
    q = select(d.c.target).where(d.c.alert_id == alert_id).group_by(d.c.target) \
        .order_by(func.min(d.c.id))
    return [str(r[0]) for r in tx.execute(q)]


def ack_alert(store: Store, alert_id: int, *, actor: str | None = None,
              reason: str | None = None, targets: Sequence[str] = ()) -> Alert:
    """Acknowledge an alert (kept as it is if already acknowledged); it keeps being
    updated and resolves as before. The first ack is announced (event ``ack``), in the
    ack's transaction, to the webhooks the alert's earlier events were queued to and
    to those named in ``targets`` (the caller's configuration): an ack made without a
    configuration listing the webhooks still reaches those that heard of the alert."""
    def announce(tx: Tx) -> None:
        alert = alert_of(AlertStore.alert_row(tx, alert_id))
        to = list(dict.fromkeys([*announced_to(tx, alert_id), *targets]))
        AlertStore.enqueue(tx, alert_id, "ack", to,
                           body_of=lambda did: event_body("ack", did, alert))
    AlertStore(store).ack(alert_id, actor, reason, announce)
    return get_alert(store, alert_id)


def waiting_deliveries(store: Store) -> list[dict[str, Any]]:
    """Per webhook (target) with PENDING deliveries: ``target``, ``pending`` (how many)
    and ``oldest_s`` (the oldest's age, seconds). A webhook that no worker's
    configuration names any more keeps its deliveries PENDING here."""
    waiting, now = AlertStore(store).waiting()
    return [{"target": w["target"], "pending": w["pending"],
             "oldest_s": (now - w["oldest"]) / 1000} for w in waiting]


def prune_deliveries(store: Store, older_than_ms: int) -> int:
    """Delete webhook deliveries done (DELIVERED or FAILED) before ``older_than_ms`` ago
    of resolved alerts; alerts and their samples stay. Those of an alert not resolved
    stay however old: they tell :func:`announced_to` which webhooks heard of it, so its
    next event (an update, its resolve, its ack) reaches them."""
    return AlertStore(store).prune_deliveries(older_than_ms)


def prune_alerts(store: Store, older_than_ms: int) -> tuple[int, int]:
    """Delete alerts resolved before ``older_than_ms`` ago (none with a webhook delivery
    pending), with their samples and deliveries; returns (alerts, samples) deleted."""
    return AlertStore(store).prune_alerts(older_than_ms)


__all__ = ["CANDIDATES", "ROLE", "TOUCHED", "Alert", "AlertSample", "Evaluator", "Event",
           "ack_alert", "alert_key", "alert_of", "announced_to", "event_body", "get_alert",
           "known_secrets", "list_alerts", "prune_alerts", "prune_deliveries", "scrub",
           "waiting_deliveries"]
