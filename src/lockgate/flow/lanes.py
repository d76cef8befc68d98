"""Claims by lane: which (pool, batch) a worker claims from, in what shares, and at
what pace for window batches (docs/flow.md, "Claims: pools, fair share, windows").

Lanes are discovered every ``lanes_refresh_s``; each gets its SLA weight from its
deadline and its task types' recent failure rate. A claim's room is split among them
by deficit round robin in tokens (:class:`~lockgate.flow.priority.FairShare`); a window
batch is also held to the pace its shared pacing bucket grants. A worker that serves
one batch without a window and no pool makes the engine's plain claim.
"""

from __future__ import annotations

import logging
import math
import secrets
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Protocol

from cachetools import LRUCache

from lockgate.config import FlowSettings
from lockgate.errors import StoreError, Streak
from lockgate.flow.bucket import Ask
from lockgate.flow.leasing import DbCall, LeaseRequest, LeaseResult
from lockgate.flow.priority import Demand, FairShare, urgency, weight
from lockgate.flow.window import Window, paced_rate
from lockgate.store.flow import Lane, window_bucket
from lockgate.store.types import ClaimedTask

log = logging.getLogger("lockgate.flow")

#: A window's pacing bucket holds 250 ms of its pace.
PACER_BURST = 0.25
#: Tokens a task of a batch is taken to cost before any answer of it was measured.
DEFAULT_TASK_TOKENS = 500.0
#: Batches whose tokens per task a worker keeps, the most recently answered.
BATCHES_KEPT = 1024

PaceFn = Callable[[int, int], float | None]


class LaneRows(Protocol):
    """The store's side of claims by lane (:class:`lockgate.store.flow.FlowStore`)."""

    def lanes(self, pool: str | None = None) -> tuple[list[Lane], int]: ...

    def pace(self, batch_id: str, *, opens_at: int, every_ms: int, rate: PaceFn) -> bool: ...

    def failure_rates(self, *, since_ms: int) -> dict[str, float]: ...

    def claim(self, n: int, *, lease_ms: int, worker_id: str) -> list[ClaimedTask]: ...

    def claim_lanes(self, plan: Mapping[tuple[str, str], int], *, lease_ms: int,
                    token: str, worker_id: str
                    ) -> dict[tuple[str, str], list[ClaimedTask]]: ...


def window_of(lane: Lane) -> Window | None:
    """The lane's batch window, if it has one."""
    if lane.window_start is None or lane.window_end is None:
        return None
    return Window(lane.window_start, lane.window_end, lane.target_per_s)


def pace_of(window: Window) -> PaceFn:
    """What the pacing bucket of ``window`` stores for ``(remaining, now)``: tasks/s,
    0 before the window opens, None once it is late (only the endpoint's limits)."""
    def rate(remaining: int, now_ms: int) -> float | None:
        r = paced_rate(window, remaining, now_ms)
        if r is None:
            return 0.0
        return None if math.isinf(r) else r
    return rate


@dataclass(slots=True)
class LaneState:
    lane: Lane
    window: Window | None
    weight: float = 1.0
    pace_budget: float = 0.0
    pace_rate: float | None = None  # tasks/s from the shared row; inf = only endpoint limits
    wanted: bool = False


class Lanes:
    """The lanes of one worker and its claims from them (see the module docstring)."""

    def __init__(self, cfg: FlowSettings, pool: str | None, rows: LaneRows, *,
                 db: DbCall) -> None:
        self.cfg = cfg
        self.pool = pool
        self.rows = rows
        self._db = db
        self._refreshes = Streak()  # failed refreshes in a row
        self._lanes: dict[tuple[str, str], LaneState] = {}
        #: Per batch: tokens per task, a moving average.
        self.tokens: LRUCache[str, float] = LRUCache(BATCHES_KEPT)
        self._failure_rates: dict[str, float] = {}
        self._fair = FairShare()
        self.lane_claims = 0
        self.plain_claims = 0
        #: Whether a discovery ran (a claim before any would not know the windows
        #: and weights: it would be a plain claim).
        self.refreshed = False

    # -- what the answers teach ---------------------------------------------------------

    def learn_tokens(self, batch_id: str, charged: float) -> None:
        """One answered call of the batch cost ``charged`` tokens."""
        old = self.tokens.get(batch_id)
        self.tokens[batch_id] = charged if old is None else old + 0.05 * (charged - old)

    # -- pacing buckets --------------------------------------------------------------

    def windows_busy(self) -> bool:
        """Whether a window batch waits for its pace (the flow loop then leases often)."""
        return any(ls.wanted and ls.window is not None for ls in self._lanes.values())

    def pace_requests(self, interval: float) -> list[LeaseRequest]:
        """The pacing buckets' part of a lease: about two lease intervals of the pace."""
        reqs = []
        for key, ls in self._lanes.items():
            if ls.window is None or not ls.wanted:
                continue
            rate = ls.pace_rate or 0.0
            want = 0
            if rate > 0 and not math.isinf(rate):
                want = max(0, math.ceil(max(1.0, rate * interval * 2) - ls.pace_budget))
            reqs.append(LeaseRequest(window_bucket(key[1]), Ask(requests=want), 0.0,
                                     PACER_BURST, self.cfg.min_cap_ms, sliding=False))
        return reqs

    def paced(self, res: LeaseResult) -> None:
        """A pacing bucket's lease result: its grant and the pace in force."""
        for ls in self._lanes.values():
            if window_bucket(ls.lane.batch_id) == res.name:
                ls.pace_budget += res.grant.requests
                ls.pace_rate = math.inf if res.rpm is None else res.rpm

    # -- discovery ---------------------------------------------------------------------

    async def refresh_failures(self) -> None:
        try:
            self._failure_rates = await self._db(
                self.rows.failure_rates, since_ms=int(self.cfg.failure_window_s * 1000))
        except StoreError as exc:
            log.warning("failure-rate query failed; keeping the last figures: %s", exc)
        except Exception:
            log.exception("failure-rate query failed; keeping the last figures")

    async def refresh(self) -> None:
        """Find the lanes, weigh them, and recompute the pace of window batches."""
        self.refreshed = True
        try:
            lanes, now_ms = await self._db(self.rows.lanes, self.pool)
            self._refreshes.ok()
        except StoreError as exc:
            log.log(self._refreshes.failed(), "lane discovery failed (%d in a row); "
                    "keeping the last list: %s", self._refreshes.failures, exc)
            return
        except Exception:
            log.exception("lane discovery failed; keeping the last list")
            return
        fresh: dict[tuple[str, str], LaneState] = {}
        for lane in lanes:
            key = (lane.pool, lane.batch_id)
            ls = self._lanes.get(key) or LaneState(lane, window_of(lane))
            ls.lane, ls.window = lane, window_of(lane)
            u = urgency(lane.deadline_at, now_ms,
                        horizon_ms=int(self.cfg.urgency_horizon_s * 1000),
                        max_urgency=self.cfg.max_urgency)
            ls.weight = weight(lane.base_weight, u, self._failure_rates.get(lane.batch_id, 0.0))
            fresh[key] = ls
            w = ls.window
            if w is not None and w.start_ms <= now_ms + 5000:
                try:
                    await self._db(self.rows.pace, lane.batch_id, opens_at=w.start_ms,
                                   every_ms=int(self.cfg.pace_every_s * 1000),
                                   rate=pace_of(w))
                except StoreError as exc:
                    log.warning("pacing window %s failed: %s", lane.batch_id, exc)
                except Exception:
                    log.exception("pacing window %s failed", lane.batch_id)
                ls.wanted = True
        self._lanes = fresh
        self._fair.forget(set(fresh))

    # -- claims --------------------------------------------------------------------------

    def _fair_needed(self) -> bool:
        if self.pool is not None:
            return True
        if not self.cfg.fair_share:
            return False
        lanes = list(self._lanes.values())
        return len(lanes) > 1 or any(ls.window is not None for ls in lanes)

    def _demands(self) -> list[Demand]:
        demands = []
        for key, ls in self._lanes.items():
            cap = None
            if ls.window is not None:
                ls.wanted = True
                if ls.pace_rate is None:
                    cap = 0  # pace not known yet (next lease)
                elif not math.isinf(ls.pace_rate):
                    cap = int(ls.pace_budget + 1e-9)
            demands.append(Demand(key, ls.weight,
                                  self.tokens.get(key[1], DEFAULT_TASK_TOKENS), cap))
        return demands

    async def claim(self, room: int, *, lease_ms: int, worker_id: str) -> list[ClaimedTask]:
        """Claim up to ``room`` tasks: shared fairly among batches (by weight, in tokens)
        and within window paces; a plain claim when there is one batch to serve."""
        if room <= 0:
            return []
        if not self.refreshed:  # the lanes first: windows and weights apply from here
            await self.refresh()
        if not self._fair_needed():
            self.plain_claims += 1
            rows: list[ClaimedTask] = await self._db(self.rows.claim, room,
                                                     lease_ms=lease_ms, worker_id=worker_id)
            return rows
        demands = self._demands()
        plan = self._fair.plan(room, demands)
        if not plan:
            return []
        got = await self._db(self.rows.claim_lanes, plan, lease_ms=lease_ms,
                             token=secrets.token_hex(16), worker_id=worker_id)
        self.lane_claims += 1
        counts: dict[Hashable, int] = {k: len(v) for k, v in got.items()}
        self._fair.settle(demands, dict(plan), counts)
        out: list[ClaimedTask] = []
        for key, claimed in got.items():
            ls = self._lanes.get(key)
            if ls is not None and ls.window is not None:
                ls.pace_budget -= len(claimed)
            out.extend(claimed)
        return out
