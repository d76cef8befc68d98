"""Resolving registry references in a worker (a change reaches workers within
5 seconds, without a restart).

A task whose template is ``@registry:REF`` runs under a prompt version chosen at each
attempt. A pinned reference (``NAME@3``) is read once and cached forever (versions are
immutable). A moving one (``NAME``, ``NAME@canary``) is re-checked at most every
``refresh_s`` seconds (default 1 s) with one indexed read of the pointer and the
prompt's generation; only when it changed is the new version's content read, once.
So an activation or a rollback is seen by every worker within ``refresh_s`` plus one
claim, and the attempt's trace names the exact version (``task_attempt.prompt_version``).

A reference to the live version (``NAME``, ``NAME@production``) reads, in the same
statement, the prompt's running A/B test (:mod:`lockgate.registry.experiments`): while
it runs (until its end, on the database's clock, and while the live version is still
its control), a task whose hash falls under the share runs the candidate instead. The
choice is per task, so retries keep their arm; a task with no test costs nothing more.

The version supplies the template, model config and delivery rule. The task's own
``model_config`` keys, if any, override the version's (an A/B test of another model);
its ``delivery_rule``, if given, replaces the version's; its retry policy is
always its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from cachetools import LRUCache

from lockgate.errors import NotFound
from lockgate.registry.experiments import in_candidate_arm
from lockgate.registry.refs import PromptRef, parse_ref
from lockgate.spec import TaskConfig, load_config, registry_reference, template_key
from lockgate.store import Store
from lockgate.store.experiments import ExperimentStore, Split
from lockgate.store.registry import RegistryStore, VersionRow

T = TypeVar("T")
RunDb = Callable[..., Awaitable[Any]]

#: Versions and merged configs kept per process. Every entry can be read again from the
#: database, so these bound memory (a file in the OpenAI batch format gives every task a
#: config of its own), not correctness.
CACHE_SIZE = 4096


@dataclass(frozen=True, slots=True)
class Fixed:
    """A config that is run as stored; ``version`` names the registry version it was
    made from (release-gate items), else None."""

    config: TaskConfig
    version: str | None = None
    #: The quality key of an inline template (``inline:<hex>``), when no version.
    inline_key: str | None = None

    @property
    def prompt_key(self) -> str | None:
        """What the quality rollups and completeness circuits file it under."""
        return self.version or self.inline_key


@dataclass(frozen=True, slots=True)
class RegistryRef:
    """A task config that names a registry prompt instead of carrying a template."""

    ref: PromptRef
    document: dict[str, Any]
    config_hash: str


#: What a worker keeps for a stored config document.
Entry = Fixed | RegistryRef


@dataclass(frozen=True, slots=True)
class _Pointer:
    """A pointer as read at ``at`` (the resolver's clock); ``split`` is the running A/B
    test on it, applied until ``split_until`` on the same clock."""

    version: int
    at: float
    split: Split | None = None
    split_until: float = 0.0

    def version_for(self, task_id: str | None, clock: Callable[[], float]) -> int:
        """The version a task runs: the candidate for a task in its arm while the test
        runs, else the pointer's (without a test, not even the clock is read)."""
        s = self.split
        if s is None or task_id is None or clock() >= self.split_until:
            return self.version
        return s.candidate if in_candidate_arm(s.experiment, task_id, s.share_bp) \
            else self.version


def merge(document: dict[str, Any], version: VersionRow) -> TaskConfig:
    """The config an attempt runs under: the version, with the task's overrides."""
    return load_config({
        "prompt_template": version.template,
        "model_config": {**version.model_config, **document.get("model_config", {})},
        "delivery_rule": document.get("delivery_rule", version.delivery_rule),
        "retry_policy": document["retry_policy"],
    })


async def _to_thread(fn: Callable[..., T], *args: Any) -> T:
    return await asyncio.to_thread(fn, *args)


def load(config_hash: str, document: dict[str, Any]) -> Entry:
    """A stored config document as a worker runs it: fixed, or a registry reference
    resolved per attempt."""
    ref = registry_reference(document.get("prompt_template"))
    if ref is None:
        pinned = document.get("prompt_version")
        if isinstance(pinned, str):
            return Fixed(load_config(document), pinned)
        return Fixed(load_config(document), None,
                     template_key(document.get("prompt_template")))
    return RegistryRef(parse_ref(ref), document, config_hash)


class PromptResolver:
    """Per-process cache of pointers and versions, refreshed at most every ``refresh_s``."""

    def __init__(self, store: Store, *, refresh_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic,
                 cache_size: int = CACHE_SIZE) -> None:
        self.registry = RegistryStore(store)
        self.experiments = ExperimentStore(store)
        self.refresh_s = refresh_s
        self.clock = clock
        self.checks = 0
        self._pointers: LRUCache[tuple[str, str | None], _Pointer] = LRUCache(cache_size)
        self._versions: LRUCache[tuple[str, int], VersionRow] = LRUCache(cache_size)
        self._merged: LRUCache[tuple[str, int], TaskConfig] = LRUCache(cache_size)
        self._locks: LRUCache[tuple[str, str | None], asyncio.Lock] = LRUCache(cache_size)

    async def resolve(self, entry: Entry, run_db: RunDb = _to_thread,
                      task_id: str | None = None) -> tuple[TaskConfig, str | None]:
        """(config to run, ``name@N`` for the trace). ``task_id`` places the task in an
        arm of the prompt's running A/B test, if any (none given: never split). Raises
        NotFound for a reference to a prompt, label or version that does not exist."""
        if isinstance(entry, Fixed):
            return entry.config, entry.version
        ref = entry.ref
        number = ref.version if ref.version is not None else \
            (await self._pointer(ref, run_db)).version_for(task_id, self.clock)
        key = (entry.config_hash, number)
        config = self._merged.get(key)
        if config is None:
            version = self._versions.get((ref.name, number))
            if version is None:
                version = await run_db(self.registry.version, ref.name, number)
                self._versions[(ref.name, number)] = version
            config = merge(entry.document, version)
            self._merged[key] = config
        return config, f"{ref.name}@{number}"

    async def _pointer(self, ref: PromptRef, run_db: RunDb) -> _Pointer:
        key = (ref.name, ref.pointer)
        cached = self._pointers.get(key)
        if cached is not None and self.clock() - cached.at < self.refresh_s:
            return cached
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        async with lock:
            cached = self._pointers.get(key)  # another attempt may have refreshed it
            if cached is not None and self.clock() - cached.at < self.refresh_s:
                return cached
            self.checks += 1
            asked = self.clock()  # before the read: a test's end is never seen late
            split = None
            if ref.pointer is None:  # the live version: with its A/B test, in one read
                number, _generation, split = await run_db(self.experiments.live_split,
                                                          ref.name)
            else:
                number, _generation = await run_db(self.registry.pointer, ref.name,
                                                   ref.pointer)
            if number is None:
                raise NotFound(f"prompt '{ref.name}' has no live version")
            if split is not None and split.control != number:
                split = None  # the live pointer moved since it started: no split
            pointer = _Pointer(number, self.clock(), split,
                               asked + split.left_ms / 1000 if split else 0.0)
            self._pointers[key] = pointer
            return pointer
