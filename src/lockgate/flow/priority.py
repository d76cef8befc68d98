"""SLA weights of batches and weighted fair sharing of claims among them.

``weight = base_weight * (1 + urgency) * (1 - failure_rate)``: urgency is 0 while a
batch's deadline is further away than the horizon and grows as ``horizon / time_left
- 1`` (1 at half the horizon, 3 at a quarter) up to ``max_urgency``; failure_rate is the
recent failure rate of the batch's task type from the traces.

:class:`FairShare` splits each claim among the batches with claimable work by deficit
round robin **in tokens**: every round a batch earns credit in proportion to its weight,
and each task it claims costs its estimated tokens. A batch of long prompts therefore
gets fewer tasks for the same weight, a light batch is never starved by a heavy one,
and a batch with nothing to claim keeps no credit (so it cannot burst when it returns).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

#: Share of its weight a batch keeps however often its tasks fail: a failing batch is
#: slowed, not parked for good (it could never show that it recovered).
MIN_HEALTH = 0.05


def urgency(deadline_ms: int | None, now_ms: int, *, horizon_ms: int = 3_600_000,
            max_urgency: float = 9.0) -> float:
    """0 far from the deadline, rising as it nears; ``max_urgency`` at or past it."""
    if deadline_ms is None:
        return 0.0
    left = deadline_ms - now_ms
    if left <= 0:
        return max_urgency
    return max(0.0, min(max_urgency, horizon_ms / left - 1.0))


def weight(base_weight: float, urgency_factor: float, failure_rate: float) -> float:
    """The SLA weight (docs/flow.md): ``base_weight * (1 + urgency) * (1 -
    failure_rate)`` (health floored)."""
    health = max(MIN_HEALTH, 1.0 - min(1.0, max(0.0, failure_rate)))
    return max(0.0, base_weight) * (1.0 + max(0.0, urgency_factor)) * health


@dataclass(frozen=True, slots=True)
class Demand:
    """A batch (lane) that may be claimed from: its weight, the tokens one of its tasks
    is expected to cost, and an optional cap (a window's pacing allowance)."""

    key: Hashable
    weight: float
    tokens_per_task: float
    cap: int | None = None


class FairShare:
    """Deficit round robin in tokens across lanes; one instance per worker."""

    def __init__(self, *, max_credit_rounds: float = 2.0) -> None:
        self._deficit: dict[Hashable, float] = {}
        self.max_credit_rounds = max_credit_rounds

    def plan(self, room: int, lanes: Sequence[Demand]) -> dict[Hashable, int]:
        """How many tasks to claim from each lane, ``room`` in total at most."""
        live = [d for d in lanes if d.weight > 0 and (d.cap is None or d.cap > 0)]
        if room <= 0 or not live:
            return {}
        if len(live) == 1:
            d = live[0]
            return {d.key: room if d.cap is None else min(room, d.cap)}
        total_w = sum(d.weight for d in live)
        mean_tok = sum(max(1.0, d.tokens_per_task) for d in live) / len(live)
        quantum = room * mean_tok  # the tokens this round hands out
        ceiling = max(quantum * self.max_credit_rounds,
                      2.0 * max(d.tokens_per_task for d in live))
        for d in live:
            earned = self._deficit.get(d.key, 0.0) + quantum * d.weight / total_w
            self._deficit[d.key] = min(earned, ceiling)
        # Hand out the room one task at a time to the lane with the most token credit
        # left (a heap): token-fair within the round, and every place is used.
        out: dict[Hashable, int] = {}
        heap = [(-self._deficit[d.key], i) for i, d in enumerate(live)]
        heapq.heapify(heap)
        left = room
        while left > 0 and heap:
            neg, i = heapq.heappop(heap)
            d = live[i]
            have = out.get(d.key, 0)
            if d.cap is not None and have >= d.cap:
                continue
            out[d.key] = have + 1
            left -= 1
            heapq.heappush(heap, (neg + max(1.0, d.tokens_per_task), i))
        return out

    def settle(self, lanes: Sequence[Demand], asked: dict[Hashable, int],
               got: dict[Hashable, int]) -> None:
        """Charge what each lane really claimed; a lane that had fewer tasks than asked
        is empty for now and keeps no credit."""
        by_key = {d.key: d for d in lanes}
        for key, n in asked.items():
            d = by_key.get(key)
            if d is None:
                continue
            g = got.get(key, 0)
            cost = g * max(1.0, d.tokens_per_task)
            left = self._deficit.get(key, 0.0) - cost
            if g < n:
                left = min(left, 0.0)
            self._deficit[key] = left

    def forget(self, keep: set[Hashable]) -> None:
        """Drop the state of lanes that are gone."""
        for key in list(self._deficit):
            if key not in keep:
                del self._deficit[key]
