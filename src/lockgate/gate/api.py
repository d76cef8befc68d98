"""The Python API of the release gate: ``lg.gate`` (bind, status, wait, cancel, list).

Candidates are submitted with ``lg.prompts.propose``; the evaluation runs in the
workers (``lockgate worker``, or ``lg.run_worker(burst=True)``), and this object reads
and waits for its progress and decision.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from lockgate.durations import parse_duration
from lockgate.gate.binding import (
    BindingSettings,
    Comparison,
    Threshold,
    parse_comparison,
    parse_threshold,
    settings_from,
)
from lockgate.gate.compare import check_labels, load_scorer
from lockgate.registry.api import default_actor
from lockgate.states import TERMINAL_UPDATES
from lockgate.store import Store
from lockgate.store.gate import GateStore


class Gate:
    """Bindings and candidate evaluations."""

    def __init__(self, store: Store) -> None:
        self.gs = GateStore(store)

    def bind(self, prompt: str, dataset: str, *,
             thresholds: Sequence[str | Threshold | dict[str, Any]],
             comparison: str | Comparison | dict[str, Any] = "exact",
             positive: Any = None, confidence: float | None = None, min_samples: int = 0,
             non_inferiority: float | dict[str, Any] | None = None,
             undefined: str = "fail",
             prices: tuple[float, float] | None = None) -> BindingSettings:
        """Bind a dataset to a prompt with per-metric thresholds (replaces an earlier
        binding of the pair; running evaluations keep the settings they froze).

        ``confidence`` turns on the Wilson guard; ``non_inferiority`` is a margin on
        accuracy (or a dict with ``metric`` and ``margin``) against the live version.
        What the comparison reads must be in the dataset: ``fields:`` names and a
        ``label:`` field some expected object holds, a ``positive`` label some item has
        (:func:`.compare.check_labels`); otherwise every candidate would fail alike.
        """
        comp = parse_comparison(comparison) if isinstance(comparison, str) else comparison
        guard = None
        if confidence is not None or min_samples:
            guard = {"confidence": confidence, "min_samples": min_samples}
        ni: Any = non_inferiority
        if isinstance(non_inferiority, int | float) and not isinstance(non_inferiority, bool):
            ni = {"margin": non_inferiority}
        doc = {
            "thresholds": [parse_threshold(t) if isinstance(t, str) else t
                           for t in thresholds],
            "comparison": comp, "positive_label": positive, "guard": guard,
            "non_inferiority": ni, "undefined": undefined,
            "prices": {"input_per_mtok": prices[0], "output_per_mtok": prices[1]}
            if prices else None,
        }
        settings = settings_from(doc)
        if settings.comparison.kind == "scorer":
            assert settings.comparison.scorer is not None
            load_scorer(settings.comparison.scorer)  # refuse an unimportable scorer now
        self.gs.bind(prompt, dataset, settings.model_dump(mode="json"),
                     expected_fields=settings.comparison.fields
                     if settings.comparison.kind == "fields" else (),
                     check_expected=partial(check_labels, settings.comparison,
                                            settings.positive_label))
        return settings

    def unbind(self, prompt: str, dataset: str) -> bool:
        """Remove a binding (True when there was one; False when the dataset exists but
        is not bound). NotFound for a prompt or dataset that does not exist."""
        if self.gs.unbind(prompt, dataset):
            return True
        self.gs.registry.dataset(dataset)  # NotFound "no dataset ...", as bind says
        return False

    def bindings(self, prompt: str) -> list[dict[str, Any]]:
        """The datasets bound to a prompt and their settings."""
        return self.gs.bindings(prompt)

    def status(self, update_id: int) -> dict[str, Any]:
        """An update with per-run progress (materialised items, task states, verdicts)
        and, once decided, the decision with each metric against its threshold."""
        u = self.gs.update(update_id)
        runs = self.gs.runs(update_id)
        tasks = self.gs.task_counts([r["batch_id"] for r in runs])
        verdicts = self.gs.verdict_counts([int(r["id"]) for r in runs])
        u["runs"] = [{
            "id": r["id"], "dataset": r["dataset_name"], "subject": r["subject"],
            "version": r["prompt_version"], "status": r["status"], "reason": r["reason"],
            "expected_items": r["expected_items"], "materialized": r["materialized"],
            "tasks": tasks.get(r["batch_id"], {}), "verdicts": verdicts.get(int(r["id"]), {}),
            "metrics": r["metrics"], "batch_id": r["batch_id"],
        } for r in runs]
        u["terminal"] = u["status"] in TERMINAL_UPDATES
        return u

    def wait(self, update_id: int, *, timeout: float | str | None = None, poll_s: float = 0.5,
             on_progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        """Poll :meth:`status` until the update is decided (needs running workers);
        ``timeout`` in seconds or as a duration (``"10m"``, see :mod:`lockgate.durations`).
        """
        if timeout is not None:  # (the CLI's --timeout grammar: "10m" rather than a TypeError)
            timeout = parse_duration(timeout, field="timeout")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            st = self.status(update_id)
            if on_progress is not None:
                on_progress(st)
            if st["terminal"]:
                return st
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"update {update_id} is still {st['status']} after "
                                   f"{timeout:g}s; are workers running (`lockgate worker`)?")
            time.sleep(poll_s)

    def cancel(self, update_id: int, *, reason: str = "withdrawn",
               actor: str | None = None) -> bool:
        """Withdraw a candidate still PENDING or EVALUATING (False if already decided)."""
        return self.gs.cancel(update_id, reason, actor=actor or default_actor())

    def list(self, prompt: str | None = None, *, limit: int = 20) -> list[dict[str, Any]]:
        """Recent candidates, newest first."""
        return self.gs.updates(prompt, limit=limit)
