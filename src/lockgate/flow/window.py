"""Time windows: when a batch may run, how fast, and whether it can finish.

A window is ``[start, end)`` in epoch ms with a target throughput (tasks/s). Its tasks
become claimable at ``start`` (their ``visible_at``); from then on the pacer aims at
``remaining / (time_left - margin)``: it speeds up when the batch fell behind and slows
down when it is ahead, and it finishes a small margin before the end rather than on it.
The endpoint's own limits still apply on top, so the pace never exceeds them.

Also here: ``HH:MM-HH:MM`` windows in local time, a five-field cron expression to
place a window's start, and the projection ``lockgate status`` prints.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from lockgate.durations import EXAMPLES, DurationRangeError, parse_duration
from lockgate.errors import SpecError
from lockgate.flow.bucket import Limits

#: Part of a window kept in reserve at its end, at most ``MAX_MARGIN_MS``.
MARGIN = 0.03
MAX_MARGIN_MS = 300_000


@dataclass(frozen=True, slots=True)
class Window:
    """A batch's window: ``[start_ms, end_ms)`` and its target tasks/s (None = total over
    length, known only with the count of tasks)."""

    start_ms: int
    end_ms: int
    target_per_s: float | None = None

    @property
    def length_ms(self) -> int:
        return self.end_ms - self.start_ms

    def margin_ms(self) -> int:
        return int(min(MAX_MARGIN_MS, self.length_ms * MARGIN))


def paced_rate(window: Window, remaining: int, now_ms: int) -> float | None:
    """Tasks/s to claim now: None before the window opens, ``inf`` once it is late (the
    end minus the margin has passed: go as fast as the endpoint allows); else what
    finishes the rest in time, and at least the window's target."""
    if now_ms < window.start_ms:
        return None
    if remaining <= 0:
        return 0.0
    left_ms = window.end_ms - window.margin_ms() - now_ms
    if left_ms <= 0:
        return math.inf
    return max(remaining * 1000.0 / left_ms, window.target_per_s or 0.0)


@dataclass(frozen=True, slots=True)
class Projection:
    """Where a window batch stands (for ``lockgate status``)."""

    remaining: int
    rate_per_s: float               # current measured rate
    finish_ms: int | None           # projected finish at that rate (None: no rate yet)
    required_per_s: float           # rate needed from now to finish in time
    capacity_per_s: float | None    # what the endpoint limits allow (None: unlimited)
    on_time: bool | None            # projected finish before the end (None: unknown)
    feasible: bool                  # the limits allow the required rate

    def warning(self) -> str | None:
        """A sentence for the operator, or None when all is well."""
        if not self.feasible:
            cap = self.capacity_per_s or 0.0
            return (f"infeasible: needs {self.required_per_s:,.1f} tasks/s, endpoint limits "
                    f"allow {cap:,.1f}/s; raise the limits, widen the window or split it")
        if self.on_time is False:
            return (f"behind: at {self.rate_per_s:,.1f} tasks/s it ends after the window; "
                    f"needs {self.required_per_s:,.1f}/s")
        return None


def project(window: Window, remaining: int, rate_per_s: float, now_ms: int,
            capacity_per_s: float | None) -> Projection:
    """Projected finish at the measured rate, and feasibility at the endpoint's limits."""
    start = max(now_ms, window.start_ms)
    left_s = max(0.0, (window.end_ms - start) / 1000.0)
    if remaining <= 0:
        required = 0.0
    elif left_s <= 0:
        required = math.inf
    else:
        required = remaining / left_s
    finish: int | None = None
    on_time: bool | None = None
    if remaining <= 0:
        finish, on_time = now_ms, True
    elif rate_per_s > 0:
        finish = start + int(remaining / rate_per_s * 1000)
        on_time = finish <= window.end_ms
    feasible = capacity_per_s is None or required <= capacity_per_s
    return Projection(remaining, rate_per_s, finish, required, capacity_per_s, on_time,
                      feasible)


def capacity_per_s(rpm: float | None, tpm: float | None, window_ms: int,
                   tokens_per_task: float, headroom: float = 0.0, burst: float = 0.01,
                   min_cap_ms: float = 0.0) -> float | None:
    """Tasks/s an endpoint's limits allow for tasks of this size (None: unlimited): the
    rate its shared bucket refills at (:meth:`Limits.rate`), so a projection never
    promises more than the bucket will grant."""
    lim = Limits(rpm, tpm, window_ms, headroom, burst, min_cap_ms)
    caps = []
    if rpm is not None:
        caps.append(lim.rate(rpm) * 1000.0)
    if tpm is not None and tokens_per_task > 0:
        caps.append(lim.rate(tpm) * 1000.0 / tokens_per_task)
    return min(caps) if caps else None


# -- parsing ---------------------------------------------------------------------------

_CLOCK = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")


def clock_window(spec: str, now: datetime) -> tuple[datetime, datetime]:
    """``"02:00-03:30"`` in ``now``'s time zone: the window in progress, else the next.

    An end before the start crosses midnight (``23:00-01:00``). A naive ``now`` is this
    machine's local time, and so are the times returned: each is placed with the
    offset of its own day (a window after a change to or from summer time is not an
    hour off, as one placed with today's fixed offset was).
    """
    m = _CLOCK.match(spec)
    if m is None:
        raise SpecError(f"{spec!r} is not HH:MM-HH:MM (e.g. 02:00-03:30)", field="window")
    h1, m1, h2, m2 = (int(g) for g in m.groups())
    if h1 > 23 or h2 > 23 or m1 > 59 or m2 > 59:
        raise SpecError(f"{spec!r} has an hour above 23 or a minute above 59",
                        field="window")
    if (h1, m1) == (h2, m2):
        raise SpecError(f"{spec!r} is empty: start and end are the same time",
                        field="window")
    for days in (-1, 0, 1):
        day = (now + timedelta(days=days)).replace(hour=0, minute=0, second=0,
                                                   microsecond=0)
        start = day.replace(hour=h1, minute=m1)
        end = day.replace(hour=h2, minute=m2)
        if end <= start:
            end += timedelta(days=1)
        if now < end:
            return start, end
    raise AssertionError("unreachable: tomorrow's window always ends after now")


_CRON_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 6))


def _cron_field(text: str, lo: int, hi: int) -> frozenset[int]:
    out: set[int] = set()
    for part in text.split(","):
        step = 1
        if "/" in part:
            part, step_s = part.split("/", 1)
            step = int(step_s)
            if step < 1:
                raise ValueError("a step must be at least 1")
        if part == "*":
            a, b = lo, hi
        elif "-" in part:
            a_s, b_s = part.split("-", 1)
            a, b = int(a_s), int(b_s)
        else:
            a = int(part)
            b = hi if step > 1 else a
        if not lo <= a <= b <= hi + (1 if hi == 6 else 0):
            raise ValueError(f"value {part!r} is outside {lo}-{hi}")
        out.update(range(a, b + 1, step))
    return frozenset(7 % 7 if v == 7 else v for v in out) if hi == 6 else frozenset(out)


def next_cron(expr: str, after: datetime) -> datetime:
    """The first minute strictly after ``after`` that matches a five-field cron
    expression (minute hour day-of-month month day-of-week; ``*``, lists, ranges and
    steps; Sunday is 0 or 7; as in cron, day-of-month and day-of-week are OR-ed when
    both are restricted)."""
    fields = expr.split()
    if len(fields) != 5:
        raise SpecError(f"{expr!r} needs five fields: minute hour day month weekday",
                        field="cron")
    try:
        minute, hour, dom, month, dow = (_cron_field(f, lo, hi)
                                         for f, (lo, hi) in zip(fields, _CRON_RANGES,
                                                                strict=True))
    except ValueError as exc:
        raise SpecError(f"{expr!r}: {exc}", field="cron") from None
    dom_any, dow_any = fields[2] == "*", fields[4] == "*"
    t = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
    try:
        return _next_match(t, minute, hour, dom, month, dow, dom_any, dow_any)
    except OverflowError:  # "0 2 30 2 *": searched to the last year a date can hold
        pass
    raise SpecError(f"{expr!r} never fires", field="cron")


def _next_match(t: datetime, minute: frozenset[int], hour: frozenset[int], dom: frozenset[int],
                month: frozenset[int], dow: frozenset[int], dom_any: bool,
                dow_any: bool) -> datetime:
    for _ in range(366 * 24 * 60 * 5):
        if t.month not in month:
            t = (t.replace(day=1, hour=0, minute=0) + timedelta(days=32)).replace(day=1)
            continue
        wd = (t.weekday() + 1) % 7  # Python: Monday 0; cron: Sunday 0
        both = not dom_any and not dow_any
        day_ok = (t.day in dom or wd in dow) if both else (t.day in dom and wd in dow)
        if not day_ok:
            t = t.replace(hour=0, minute=0) + timedelta(days=1)
            continue
        if t.hour not in hour:
            t = t.replace(minute=0) + timedelta(hours=1)
            continue
        if t.minute not in minute:
            t += timedelta(minutes=1)
            continue
        return t
    raise OverflowError("no match in five years")


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """How a submitted batch is scheduled: SLA base weight, deadline, time window."""

    base_weight: float | None = None
    deadline_ms: int | None = None
    window: Window | None = None

    def fields(self) -> dict[str, float | int | None]:
        """The ``batch`` columns this plan sets (only those it names)."""
        out: dict[str, float | int | None] = {}
        if self.base_weight is not None:
            if not (math.isfinite(self.base_weight) and self.base_weight > 0):
                raise SpecError(f"must be a positive number (got {self.base_weight})",
                                field="weight")
            out["base_weight"] = float(self.base_weight)
        if self.deadline_ms is not None:
            out["deadline_at"] = int(self.deadline_ms)
        if self.window is not None:
            if self.window.end_ms <= self.window.start_ms:
                raise SpecError("must end after it starts", field="window")
            target = self.window.target_per_s
            if target is not None and not (math.isfinite(target) and target > 0):
                raise SpecError(f"must be a positive number of tasks/s (got {target})",
                                field="target")
            out["window_start"] = self.window.start_ms
            out["window_end"] = self.window.end_ms
            out["target_per_s"] = target
            if self.deadline_ms is None:
                out["deadline_at"] = self.window.end_ms
        return out


def parse_when(spec: str, now: datetime, *, field: str = "deadline") -> datetime:
    """A point in time: ISO 8601 (local time zone when none is given), or a duration
    from now (``90m``, ``+1h30m``, ``2d``; see :mod:`lockgate.durations`)."""
    s = spec.strip()
    try:
        t = datetime.fromisoformat(s)
    except ValueError:
        try:
            seconds = parse_duration(s.removeprefix("+"), field=field, allow_zero=False)
        except DurationRangeError as exc:  # a duration, refused for its value: say why
            raise SpecError(f"{spec!r}: a {field} given as a duration from now {exc.why}; "
                            "or give a time (ISO 8601, e.g. 2026-03-10T03:30)",
                            field=field) from None
        except SpecError as exc:
            if exc.reason.startswith(f"{s.removeprefix('+')!r} is not a duration; "):
                raise SpecError(f"{spec!r} is neither a time (ISO 8601, e.g. "
                                f"2026-03-10T03:30) nor a duration from now ({EXAMPLES})",
                                field=field) from None
            # A duration with a mistake the duration grammar names (1M, PT5M): say it
            raise SpecError(f"{exc.reason}; or give a time (ISO 8601, e.g. "
                            "2026-03-10T03:30)", field=field) from None
        if now.tzinfo is None:  # local wall time: the duration is elapsed time
            return datetime.fromtimestamp(now.timestamp() + seconds)
        return now + timedelta(seconds=seconds)
    return t if t.tzinfo is not None else t.replace(tzinfo=now.tzinfo)


def plan_from_options(*, window: str | None = None, cron: str | None = None,
                      duration: str | None = None, weight: float | None = None,
                      deadline: str | None = None, target: float | None = None,
                      now: datetime) -> BatchPlan | None:
    """The :class:`BatchPlan` of ``lockgate submit``'s options (None if none given).

    ``window`` is ``HH:MM-HH:MM`` in ``now``'s time zone; ``cron`` places the start at the
    expression's next time and ``duration`` (``90m``) gives the length.
    """
    if window and cron:
        raise SpecError("goes with a window or a cron start, not both", field="cron")
    if target is not None and not (math.isfinite(target) and target > 0):
        raise SpecError(f"must be a positive number of tasks/s (got {target})", field="target")
    if weight is not None and not (math.isfinite(weight) and weight > 0):
        raise SpecError(f"must be a positive number (got {weight})", field="weight")
    if cron and not duration:
        raise SpecError("is needed with a cron start (e.g. 90m)", field="duration")
    if duration and not cron:
        raise SpecError("goes with a cron start", field="duration")
    w: Window | None = None
    if window:
        start, end = clock_window(window, now)
        w = Window(_ms(start), _ms(end), target)
    elif cron:
        start = next_cron(cron, now)
        end = start + timedelta(seconds=parse_duration(duration or "", field="duration",
                                                       allow_zero=False))
        w = Window(_ms(start), _ms(end), target)
    elif target is not None:
        raise SpecError("goes with a window or a cron start", field="target")
    dl = _ms(parse_when(deadline, now)) if deadline else None
    if w is None and weight is None and dl is None:
        return None
    return BatchPlan(base_weight=weight, deadline_ms=dl, window=w)


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)
