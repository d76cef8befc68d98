"""Keeping the rollups as attempts land: the write-back hands each flush's attempt rows
to :meth:`RollupWriter.record` inside its own transaction, so a rollup counts exactly
the attempts that were committed, never scans ``task_attempt``, and costs a flush three
statements (the flush's task configs, the rollup rows under lock, one write of the rows)
plus an insert for a new minute.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from lockgate.config import Endpoint, Settings
from lockgate.quality.rollup import (
    REVIEW_MODEL,
    SPANS,
    Key,
    Observation,
    Rollup,
    Watch,
    bucket_of,
    watch_of,
)
from lockgate.quality.tracing import CallSpan, Tracing
from lockgate.spec import RESERVED_ID_PREFIX, registry_reference, template_key
from lockgate.states import TaskStatus
from lockgate.store.quality import QualityStore, RowKey, TaskInfo
from lockgate.store.store import Store
from lockgate.store.tx import Tx
from lockgate.store.types import ClaimedTask, Finish

log = logging.getLogger("lockgate.quality")

#: A written attempt: the write-back it belongs to and its ``task_attempt`` row.
Written = tuple[Finish, Mapping[str, Any]]
#: A claim: task pk and lease token.
Claim = tuple[int, str]
#: What the writer files a task's attempts under (as read, or as claimed).
Task = TaskInfo | ClaimedTask

_KEY_LIMITS = (191, 200, 100)  # prompt, model, endpoint columns
_UNKNOWN: Any = object()


class RollupWriter:
    """Turns written attempts into rollup rows of one shard (a worker's id)."""

    def __init__(self, store: Store, *, shard: str,
                 endpoint: Callable[[str], Endpoint | None] = lambda _name: None,
                 keywords: Sequence[str] = ()) -> None:
        self.qstore = QualityStore(store)
        self.shard = shard[:64]
        self._endpoint = endpoint
        self._keywords = tuple(keywords)
        #: per config hash: (inline prompt key or None, the document)
        self._configs: dict[str, tuple[str | None, dict[str, Any]]] = {}
        #: per (config hash, prompt version): what to watch in its outputs
        self._watch: dict[tuple[str, str | None], Watch] = {}
        #: per config hash: its inline template's key (None: a registry reference)
        self._inline_keys: dict[str, str | None] = {}
        self._prices: dict[str, Endpoint | None] = {}

    def tasks(self, tx: Tx, written: Sequence[Written],
              known: Callable[[Claim], ClaimedTask | None] | None = None
              ) -> dict[int, Task]:
        """The tasks of ``written`` (their configs learnt). ``known`` gives the task a
        claim leased (the worker's own record of it), so only the tasks it does not
        know are read; a discarded attempt's task is always read (it may be gone)."""
        tasks: dict[int, Task] = {}
        unknown: list[int] = []
        for f, a in written:
            t = known((f.id, f.lease_token)) if known is not None \
                and a.get("outcome") != "discarded" else None
            if t is None:
                unknown.append(f.id)
            else:
                tasks[f.id] = t
        if unknown:
            for pk, info in self.qstore.tasks(tx, unknown).items():
                tasks.setdefault(pk, info)
        self._learn(tx, {t.config_hash for t in tasks.values()})
        return tasks

    def prompt_of(self, config_hash: str, attempt: Mapping[str, Any]) -> str:
        """The prompt key of an attempt: its registry version, else its inline
        template's key (the config must have been learnt by :meth:`tasks`)."""
        return str(attempt.get("prompt_version") or self._configs[config_hash][0] or "")

    def record(self, tx: Tx, written: Sequence[Written],
               tasks: Mapping[int, Task] | None = None) -> None:
        """Add the attempts of one write-back to the rollups, in its transaction."""
        if not written:
            return
        if tasks is None:
            tasks = self.tasks(tx, written)
        minutes: dict[RowKey, list[Observation]] = {}
        #: per (config, version, model, endpoint) of this flush: its key and watch
        seen: dict[tuple[Any, ...], tuple[Key, Watch]] = {}
        succeeded = TaskStatus.SUCCEEDED
        # The rows' updated_at: when the newest attempt counted ended, on the database
        # clock as attempts are (reading the clock would cost the flush a round trip).
        latest = 0
        for f, a in written:
            info = tasks.get(f.id)
            if info is None or info.batch_id.startswith(RESERVED_ID_PREFIX):
                # Gone (cleaned up), or a release-gate evaluation: its figures are the
                # gate's run metrics, not production's.
                continue
            outcome = a.get("outcome")
            if outcome == "review":
                # A hold for a person: no call, no model, the task not ended; the
                # person's resolution counts it (under REVIEW_MODEL).
                continue
            h = info.config_hash
            version = a.get("prompt_version")
            model = a.get("model") or (REVIEW_MODEL if outcome == "resolved" else None)
            raw = (h, version, model, a.get("endpoint"))
            known = seen.get(raw)
            if known is None:
                known = seen[raw] = (Key(*(str(v or "")[:n] for v, n in zip(
                    (self.prompt_of(h, a), raw[2], raw[3]), _KEY_LIMITS, strict=True))),
                    self._watch_for(tx, h, version))
            key, watch = known
            output = None
            # the watched values are those delivered: not a discarded duplicate's
            if watch and f.status == succeeded and f.result is not None \
                    and a.get("outcome") != "discarded":
                output = orjson.loads(f.result)
            started = int(a.get("started_at") or tx.now)
            latest = max(latest, started + int(a.get("latency_ms") or 0))
            rk = ("m", started - started % 60_000, key.prompt, key.model, key.endpoint)
            group = minutes.get(rk)
            if group is None:
                group = minutes[rk] = []
            group.append((a, output, watch, self._cost(a)))
        # Each attempt is observed once, into its minute; the minutes of the flush
        # merge into their hours and days.
        deltas: dict[RowKey, Rollup] = {}
        for rk, group in minutes.items():
            deltas[rk] = Rollup()
            deltas[rk].observe_all(group)
        for (_m, bucket, prompt, model, endpoint), d in list(deltas.items()):
            for res in SPANS:
                if res != "m":
                    rk = (res, bucket_of(bucket, res), prompt, model, endpoint)
                    deltas[rk] = deltas[rk].merge(d) if rk in deltas else Rollup().merge(d)
        if not deltas:
            return
        stored = self.qstore.locked(tx, self.shard, list(deltas))
        merged = {k: (Rollup.from_row(stored[k]).merge(d) if k in stored else d).to_row()
                  for k, d in deltas.items()}
        self.qstore.write(tx, self.shard, merged, stored.keys(), latest or tx.now)

    def configs_of(self, tx: Tx, inline_key: str) -> list[str]:
        """The hashes of the configs whose inline template has this key. The configs
        not seen before are read once, a thousand at a time, and only their keys kept
        (an import of an OpenAI batch file makes a config per line)."""
        keys = self._inline_keys
        unseen = [h for h in self.qstore.config_hashes(tx) if h not in keys]
        for i in range(0, len(unseen), 1000):
            for h, doc in self.qstore.config_documents(tx, unseen[i:i + 1000]).items():
                keys[h] = _inline_key(doc)
        return sorted(h for h, key in keys.items() if key == inline_key)

    def watch(self, tx: Tx, config_hash: str, version: str | None) -> Watch:
        """What is watched in the outputs of a task with this config and prompt version."""
        self._learn(tx, {config_hash})
        if config_hash not in self._configs:
            return Watch()
        return self._watch_for(tx, config_hash, version)

    def _learn(self, tx: Tx, hashes: set[str]) -> None:
        missing = hashes - self._configs.keys()
        if not missing:
            return
        for h, doc in self.qstore.config_documents(tx, missing).items():
            self._configs[h] = (_inline_key(doc), doc)

    def _watch_for(self, tx: Tx, config_hash: str, version: str | None) -> Watch:
        key = (config_hash, version)
        watch = self._watch.get(key)
        if watch is None:
            _inline, doc = self._configs[config_hash]
            rule = doc.get("delivery_rule")
            if rule is None and version and "@" in version:
                name, _sep, number = version.rpartition("@")
                if number.isdigit():
                    rule = self.qstore.version_rule(tx, name, int(number))
            schema = (rule or {}).get("schema") or (rule or {}).get("json_schema")
            watch = self._watch[key] = watch_of(schema, self._keywords)
        return watch

    def _cost(self, a: Mapping[str, Any]) -> float | None:
        name = a.get("endpoint")
        if not name:
            return None
        ep = self._prices.get(name, _UNKNOWN)
        if ep is _UNKNOWN:
            ep = self._endpoint(name)
            if ep is not None and not (ep.cost_input_per_1k or ep.cost_output_per_1k):
                ep = None  # not priced: no cost, asked once
            self._prices[name] = ep
        if ep is None or a.get("prompt_sha256") is None or a.get("latency_ms") is None:
            return None
        return ep.cost(a.get("input_tokens") or 0, a.get("output_tokens") or 0)


class QualityObserver:
    """What a worker's write-back hands its attempt rows to, in its transaction: the
    rollups are written there; the spans of the attempts are gathered there and emitted
    by :meth:`committed` once the transaction has committed (a transaction run again
    after a deadlock gathers them again, never twice)."""

    def __init__(self, writer: RollupWriter, *, rollups: bool = True,
                 tracing: Tracing | None = None,
                 known: Callable[[Claim], ClaimedTask | None] | None = None) -> None:
        self.writer = writer
        self.rollups = rollups
        self.tracing = tracing
        #: The task a claim leased, as the worker holds it (its task id, batch and
        #: config need not be read again); None: read them.
        self.known = known
        self._pending: list[CallSpan] = []

    def __call__(self, tx: Tx, written: Sequence[Written]) -> None:
        self._pending = []
        tasks = self.writer.tasks(tx, written, self.known)
        if self.rollups:
            self.writer.record(tx, written, tasks)
        if self.tracing is not None:
            self._pending = [
                CallSpan(info.task_id, info.batch_id,
                         self.writer.prompt_of(info.config_hash, a), a, f.model,
                         f.response, str(a.get("outcome") or ""), f.sent_at)
                for f, a in written if (info := tasks.get(f.id)) is not None]

    def committed(self) -> None:
        """The write-back whose rows were last observed has committed."""
        pending, self._pending = self._pending, []
        if pending and self.tracing is not None:
            self.tracing.emit(pending)


def _inline_key(config: Mapping[str, Any]) -> str | None:
    """The key a config's inline template is filed under (None: a registry reference)."""
    template = config.get("prompt_template")
    return None if registry_reference(template) is not None else template_key(template)


def quality_observer(store: Store, settings: Settings, shard: str,
                     tracing: Tracing | None = None,
                     known: Callable[[Claim], ClaimedTask | None] | None = None
                     ) -> QualityObserver | None:
    """A worker's observer: rollups unless ``[quality] rollups`` is off, spans when the
    ``OTEL_*`` environment asks for them (or ``tracing`` is given); None for neither.
    ``known`` is the worker's record of the tasks it holds, by claim."""
    tracing = tracing or Tracing.from_env(settings.endpoint_named)
    if not settings.quality.rollups and tracing is None:
        return None
    return QualityObserver(RollupWriter(store, shard=shard, endpoint=settings.endpoint_named,
                                        keywords=settings.quality.keywords),
                           rollups=settings.quality.rollups, tracing=tracing, known=known)
