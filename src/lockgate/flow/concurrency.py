"""Adaptive concurrency per endpoint per worker: how many calls may be in flight.

Two policies behind one interface, both pure (time is passed in):

* :class:`RulePolicy`, the default rule (docs/flow.md): halve when mean latency is above
  2 s *and* the failure rate above 5 %; grow by x1.2 when latency is below 800 ms *and* failures
  below 0.5 %; otherwise hold. Always within [min, max].
* :class:`GradientPolicy`, after Netflix's Gradient2: compare a short-term latency with
  a long-term baseline; ``gradient = clamp(tolerance * long / short, 0.5, 1)``;
  ``new = limit * gradient + queue``. Unlike Gradient2, only increases are smoothed: a
  decrease applies at once, so a spike halves the limit within a few decisions instead
  of dozens. Latency is taken **per output token**
  (``latency / (overhead + output_tokens)``) so that a batch of long answers is not
  mistaken for congestion. Drops (429s, timeouts) back off multiplicatively.

:class:`Adaptive` collects call samples and asks the policy for a new limit at most once
per interval, and only when enough calls finished since the last change (calls started
under the old limit must not judge the new one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from lockgate.errors import ConfigError


@dataclass(frozen=True, slots=True)
class WindowStats:
    """Calls that finished since the last decision."""

    calls: int
    mean_latency_ms: float
    failure_rate: float      # failures + drops over calls
    drop_rate: float         # 429s and timeouts over calls
    mean_norm_latency: float  # latency per (overhead + output) token, successful calls
    peak_in_flight: int


class Policy(Protocol):
    """Turns one window of samples into the next limit."""

    name: str

    def next_limit(self, limit: float, w: WindowStats) -> float: ...


@dataclass(slots=True)
class RulePolicy:
    """The halve/grow rule (docs/flow.md): x0.5 when slow and failing, x1.2 when fast and clean."""

    min_limit: float
    max_limit: float
    slow_ms: float = 2000.0  # slow and failing: x decrease
    failing: float = 0.05
    decrease: float = 0.5
    fast_ms: float = 800.0  # fast and clean (at least half the slots used): x increase
    clean: float = 0.005
    increase: float = 1.2
    name: str = "rule"

    def next_limit(self, limit: float, w: WindowStats) -> float:
        if w.mean_latency_ms > self.slow_ms and w.failure_rate > self.failing:
            limit = limit * self.decrease
        elif (w.mean_latency_ms < self.fast_ms and w.failure_rate < self.clean
              and w.peak_in_flight >= limit * 0.5):
            # (Growing is pointless while the limit is not what holds calls back.)
            limit = max(limit * self.increase, limit + 1)
        return min(self.max_limit, max(self.min_limit, limit))


@dataclass(slots=True)
class GradientPolicy:
    """Gradient2-style control on latency per output token, drops as back-off."""

    min_limit: float
    max_limit: float
    tolerance: float = 1.5  # short-term latency may be this much above the baseline
    smoothing: float = 0.5  # of increases only; a decrease applies at once
    long_windows: int = 20  # the baseline's averaging length, in decisions
    #: A window with more than ``drop_threshold`` drops multiplies by ``drop_backoff``.
    drop_backoff: float = 0.9
    drop_threshold: float = 0.01
    name: str = "gradient"
    long_latency: float | None = None

    def next_limit(self, limit: float, w: WindowStats) -> float:
        short = w.mean_norm_latency
        if short > 0:
            if self.long_latency is None:
                self.long_latency = short
            else:
                a = 1.0 / self.long_windows
                self.long_latency = self.long_latency * (1 - a) + short * a
                if self.long_latency / short > 2.0:
                    # The baseline is stale after a long spike: let it fall faster.
                    self.long_latency *= 0.95
        if w.drop_rate > self.drop_threshold:
            return max(self.min_limit, limit * self.drop_backoff)
        if short <= 0 or self.long_latency is None:
            return limit
        gradient = max(0.5, min(1.0, self.tolerance * self.long_latency / short))
        queue = max(math.sqrt(limit), 0.1 * limit)
        target = limit * gradient + queue
        if target > limit:
            if w.peak_in_flight < limit * 0.5:
                return limit  # application-limited: no evidence the endpoint can take more
            target = limit * (1 - self.smoothing) + target * self.smoothing
        return min(self.max_limit, max(self.min_limit, target))


class FixedPolicy:
    """No adaptation: the limit stays where it was configured."""

    name = "fixed"

    def next_limit(self, limit: float, w: WindowStats) -> float:
        return limit


def make_policy(kind: str, min_limit: float, max_limit: float) -> Policy:
    """``rule`` (docs/flow.md), ``gradient`` or ``fixed``."""
    if kind == "rule":
        return RulePolicy(min_limit, max_limit)
    if kind == "gradient":
        return GradientPolicy(min_limit, max_limit)
    if kind == "fixed":
        return FixedPolicy()
    raise ConfigError(f"unknown concurrency policy {kind!r}: use rule, gradient or fixed")


class Adaptive:
    """Samples in, a concurrency limit out. ``now`` is seconds on any monotonic clock."""

    __slots__ = (
        "_drops",
        "_failures",
        "_last",
        "_lat_n",
        "_lat_sum",
        "_n",
        "_norm_n",
        "_norm_sum",
        "_peak",
        "interval_s",
        "last_stats",
        "limit",
        "max_limit",
        "min_limit",
        "min_samples",
        "norm_overhead",
        "policy",
    )

    def __init__(self, policy: Policy, *, initial: float, min_limit: float,
                 max_limit: float, interval_s: float = 1.0, min_samples: int = 20,
                 norm_overhead: float = 20.0, now: float = 0.0) -> None:
        self.policy = policy
        self.min_limit = float(min_limit)
        self.max_limit = float(max_limit)
        self.limit = min(self.max_limit, max(self.min_limit, float(initial)))
        self.interval_s = interval_s
        self.min_samples = min_samples
        self.norm_overhead = norm_overhead
        self.last_stats: WindowStats | None = None
        self._last = now
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._failures = 0
        self._drops = 0
        self._lat_sum = 0.0
        self._lat_n = 0
        self._norm_sum = 0.0
        self._norm_n = 0
        self._peak = 0

    @property
    def slots(self) -> int:
        """Calls allowed in flight now."""
        return max(1, int(self.limit))

    def record(self, latency_ms: float, *, ok: bool, dropped: bool = False,
               output_tokens: int | None = None, in_flight: int = 0) -> None:
        """One finished call. ``ok`` False counts a failure; ``dropped`` a 429/timeout."""
        self._n += 1
        if in_flight > self._peak:
            self._peak = in_flight
        if dropped:
            self._drops += 1
        if not ok or dropped:
            self._failures += 1
        if latency_ms > 0:
            self._lat_sum += latency_ms
            self._lat_n += 1
            if ok and not dropped:
                self._norm_sum += latency_ms / (self.norm_overhead + (output_tokens or 0))
                self._norm_n += 1

    def note_in_flight(self, in_flight: int) -> None:
        """Track the peak of calls in flight between decisions."""
        if in_flight > self._peak:
            self._peak = in_flight

    def maybe_adjust(self, now: float) -> bool:
        """Apply the policy if an interval passed with enough samples; True if changed."""
        if now - self._last < self.interval_s or self._n < self.min_samples:
            return False
        w = WindowStats(
            calls=self._n,
            mean_latency_ms=self._lat_sum / self._lat_n if self._lat_n else 0.0,
            failure_rate=self._failures / self._n,
            drop_rate=self._drops / self._n,
            mean_norm_latency=self._norm_sum / self._norm_n if self._norm_n else 0.0,
            peak_in_flight=self._peak)
        self.last_stats = w
        self._last = now
        self._reset()
        new = min(self.max_limit, max(self.min_limit, self.policy.next_limit(self.limit, w)))
        changed = new != self.limit
        self.limit = new
        return changed
