"""The four anomaly rules, evaluated on rollups: pure comparisons of a window
against its baseline, per prompt version and model.

* completeness collapse: field completeness (before fallbacks) down more than
  ``completeness_drop`` (relative) over ``window`` against the baseline;
* semantic drift: a watched value's share down more than ``drift_drop`` (relative);
* format pollution: ``invalid_json`` above ``invalid_json_share`` of the parsed outputs in
  each of the last ``pollution_minutes`` whole minutes;
* performance degradation: latency p50 up more than ``latency_rise`` while input tokens
  per call stay within ``tokens_band`` (as estimated where the endpoint reports no
  usage).

The baseline is the same window a week earlier when it holds enough of what the rule
compares (``min_calls`` calls, parsed outputs or watched outputs), else the window just
before. A comparison needs ``min_calls`` of them on both sides (a minute of pollution
needs ``min_calls_minute``): no rule fires on three calls. A watched value's drift also
needs the value to be expected ``drift_min_expected`` times in the window at its
baseline share: 3 of 150 falling to 1 of 150 is noise, not a drift.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from lockgate.config import QualitySettings
from lockgate.quality.rollup import Rollup

RULES = ("completeness_collapse", "semantic_drift", "format_pollution",
         "performance_degradation")
WEEK_MS = 7 * 86_400_000


def under(value: float, bound: float) -> bool:
    """``value`` below ``bound`` by more than the rounding of the sums it was computed
    from: a mean of 150 completenesses of 0.85 is 0.8499999999999976, which is at a
    bound of 0.85, not under it."""
    return value < bound and not math.isclose(value, bound, rel_tol=1e-9, abs_tol=1e-12)


def over(value: float, bound: float) -> bool:
    """``value`` above ``bound`` by more than rounding (see :func:`under`)."""
    return value > bound and not math.isclose(value, bound, rel_tol=1e-9, abs_tol=1e-12)


@dataclass(frozen=True, slots=True)
class Finding:
    """One rule's verdict on one prompt version and model. ``value`` and ``baseline``
    are the compared figures (a share, or ms), ``threshold`` the bound ``value`` was held
    against; ``subject`` names the watched value of a drift."""

    rule: str
    prompt: str
    model: str
    fired: bool
    value: float
    baseline: float | None
    threshold: float
    calls: int
    subject: str | None = None
    #: When the incident began, if the finding knows (a circuit: when it opened).
    onset: int | None = None
    #: Which episode of its subject the finding is about, if it can tell (a circuit:
    #: the version of the move that opened it): a new episode is a new incident, even
    #: when the previous one ended and this one began between two evaluations.
    episode: int | None = None
    #: (value, calls) the incident was decided on, if the finding knows (a circuit its
    #: evaluator opened: the window of the move that opened it): its alert opens with
    #: them. ``value`` None: nothing was measured.
    decided: tuple[float | None, int] | None = None
    #: Whether the rule had the calls to compare in full (format pollution: every minute
    #: had ``min_calls_minute`` parsed outputs). False: the value tells nothing (an
    #: empty minute's share reads 0), and an alert it clears shows none (``calls`` 0).
    measured: bool = True


def completeness_collapse(now: Rollup, base: Rollup, s: QualitySettings,
                          key: tuple[str, str]) -> Finding | None:
    if min(now.completeness_n, base.completeness_n) < s.min_calls:
        return None
    value, before = now.completeness, base.completeness
    assert value is not None and before is not None
    bound = before * (1 - s.completeness_drop)
    return Finding("completeness_collapse", *key, under(value, bound), value, before, bound,
                   now.calls)


def semantic_drift(now: Rollup, base: Rollup, s: QualitySettings,
                   key: tuple[str, str]) -> list[Finding]:
    if min(now.watch_n, base.watch_n) < s.min_calls:
        return []
    out = []
    for name in sorted(base.watched):
        before = base.watched[name] / base.watch_n
        value = now.watched.get(name, 0) / now.watch_n
        bound = before * (1 - s.drift_drop)
        enough = before * now.watch_n >= s.drift_min_expected
        out.append(Finding("semantic_drift", *key, enough and under(value, bound), value,
                           before, bound, now.calls, name))
    return out


def format_pollution(minutes: Sequence[Rollup], s: QualitySettings,
                     key: tuple[str, str]) -> Finding | None:
    """``minutes``: the last whole minutes, oldest first (empty ones included)."""
    if len(minutes) < s.pollution_minutes:
        return None
    last = minutes[-s.pollution_minutes:]
    shares = [m.parse_mix.get("invalid_json", 0) / m.parsed if m.parsed else 0.0
              for m in last]
    enough = all(m.parsed >= s.min_calls_minute for m in last)
    return Finding("format_pollution", *key,
                   enough and all(over(x, s.invalid_json_share) for x in shares),
                   min(shares), None, s.invalid_json_share, sum(m.calls for m in last),
                   measured=enough)


def performance_degradation(now: Rollup, base: Rollup, s: QualitySettings,
                            key: tuple[str, str]) -> Finding | None:
    if min(now.calls, base.calls) < s.min_calls:
        return None
    value, before = now.quantile(0.5), base.quantile(0.5)
    if value is None or before is None or before <= 0:
        return None
    # Per call, the provider's counts where it reported usage and lockgate's estimates
    # where it did not (a failed call, an endpoint that never reports usage), on both
    # sides alike: calls that failed (no usage) do not make the input look smaller.
    # Rows written before the estimates were kept hold none (0): then the reported
    # counts alone, as before.
    if _has_estimates(now) and _has_estimates(base):
        sum_now, sum_before = now.input_tokens_or_estimate, base.input_tokens_or_estimate
    else:
        sum_now, sum_before = now.input_tokens, base.input_tokens
    tokens_now, tokens_before = sum_now / now.calls, sum_before / base.calls
    same_input = tokens_before > 0 and not over(abs(tokens_now / tokens_before - 1),
                                                s.tokens_band)
    bound = before * (1 + s.latency_rise)
    return Finding("performance_degradation", *key, same_input and over(value, bound), value,
                   before, bound, now.calls)


def _has_estimates(r: Rollup) -> bool:
    """Whether a window's rows all kept the input size of every call (reported or
    estimated): their sum is at least the reported counts, and not 0."""
    return r.input_tokens_or_estimate > 0 \
        and r.input_tokens_or_estimate >= r.input_tokens


def baseline(week: Rollup | None, trailing: Rollup | None, enough: Callable[[Rollup], bool]
             ) -> Rollup | None:
    """The week-old window when it has enough of what a rule compares, else the window
    just before: a week-old outage (calls, but no outputs) must not mute a rule."""
    return week if week is not None and enough(week) else trailing


def evaluate(key: tuple[str, str], now: Rollup, week: Rollup | None,
             trailing: Rollup | None, minutes: Sequence[Rollup],
             s: QualitySettings) -> list[Finding]:
    """Every rule's finding for one prompt version and model (rules without enough
    calls give none), each against its own baseline (:func:`baseline`)."""
    found: list[Finding | None] = [format_pollution(minutes, s, key)]
    drift: Iterable[Finding] = ()
    base = baseline(week, trailing, lambda r: r.completeness_n >= s.min_calls)
    if base is not None:
        found.append(completeness_collapse(now, base, s, key))
    base = baseline(week, trailing, lambda r: r.calls >= s.min_calls)
    if base is not None:
        found.append(performance_degradation(now, base, s, key))
    base = baseline(week, trailing, lambda r: r.watch_n >= s.min_calls)
    if base is not None:
        drift = semantic_drift(now, base, s, key)
    return [f for f in (*found, *drift) if f is not None]

