"""Quality rollups: what the attempts of one prompt version, model and endpoint did in one
span of time, in a form that adds up.

A :class:`Rollup` is a set of counters, sums, maps of counts and a latency sketch; two
rollups of the same key merge into the rollup of both spans (or both workers), so the
per-minute rows written as attempts land add up to hour and day rows, and a report over
any window merges rows without ever reading ``task_attempt``. Latency quantiles come from
a DDSketch (relative accuracy :data:`LATENCY_ACCURACY`): mergeable, a few hundred bytes,
where a sorted list of latencies would grow with the calls.

What counts (one attempt row = one observation, :meth:`Rollup.observe`):

* ``attempts``: every attempt row written, including discarded duplicates (a call whose
  write-back lost its lease) and attempts that made no call;
* ``tasks``: attempts that ended their task (succeeded, failed, dead, or resolved by a
  person after a review hold) and were not discarded: each task counts once, where its
  last attempt ran (a person's resolution under the model :data:`REVIEW_MODEL`; the
  writer leaves review holds out: no call, no model, no end);
* ``calls``: attempts that rendered a prompt and sent it (a trace with the prompt's hash
  and a latency), discarded ones included: they cost tokens too;
* completeness is the output's field completeness *before* fallback values were filled,
  over calls whose output was parsed; conformance is the share of parsed outputs that
  were usable (valid, repaired, coerced or filled from fallbacks);
* watched values: for each usable output of a call that delivered it (not a discarded
  duplicate's), which members of the output schema's enums it holds, and which declared
  keywords appear in its texts;
  ``watch_n`` is the number of outputs looked at (the share's denominator);
* cost: the configured price of each call's tokens (None while no call was priced).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from ddsketch import DDSketch
from ddsketch.store import DenseStore

from lockgate.runtime import USABLE

#: Relative accuracy of the latency quantiles (2%: a p99 of 1,000 ms reads 980-1,020).
LATENCY_ACCURACY = 0.02
#: Outcomes that end a task.
TERMINAL = frozenset({"succeeded", "failed", "dead", "resolved"})
#: The model a person's resolution of a task held for review is filed under: it ends
#: the task, and no model answered it. (The hold itself is in no rollup: no call was
#: made and nothing ended.)
REVIEW_MODEL = "(review)"
#: Spans kept, by resolution code: a minute, an hour, a day (ms).
SPANS: dict[str, int] = {"m": 60_000, "h": 3_600_000, "d": 86_400_000}

_USABLE = frozenset(str(s) for s in USABLE)
_ABSENT = object()


#: One attempt as :meth:`Rollup.observe_all` takes it: its row, the output it delivered
#: (or None), what to watch in that output, the call's price (or None).
Observation = tuple[Mapping[str, Any], Any, "Watch | None", "float | None"]


@dataclass(frozen=True, slots=True)
class Key:
    """What a rollup row is about: a prompt, the model and endpoint that answered."""

    prompt: str
    model: str
    endpoint: str


def _new_sketch() -> DDSketch:
    return DDSketch(LATENCY_ACCURACY)


def add_all(sketch: DDSketch, values: Sequence[float]) -> None:
    """Add non-negative ``values`` to ``sketch``: the same bins, counts and summary as
    adding them one by one, with one store update per distinct bin."""
    mapping = sketch._mapping
    key, smallest = mapping.key, mapping.min_possible
    bins: dict[int, int] = {}
    zeros = 0
    for v in values:
        if v > smallest:
            k = key(v)
            bins[k] = bins.get(k, 0) + 1
        else:
            zeros += 1
    store = sketch._store
    for k, n in bins.items():  # in order of first arrival: the store grows as it would
        store.add(k, float(n))
    sketch._zero_count += zeros
    sketch._count += len(values)
    sketch._sum += math.fsum(values)
    sketch._min = min(sketch._min, min(values))
    sketch._max = max(sketch._max, max(values))


def dump_sketch(sketch: DDSketch | None) -> str | None:
    """A sketch as stored: its protobuf form, base64 (None for an empty sketch)."""
    if sketch is None or sketch.count == 0:
        return None
    from ddsketch.pb.proto import DDSketchProto  # deferred: protobuf, start-up time

    return base64.b64encode(DDSketchProto.to_proto(sketch).SerializeToString()).decode()


def _dense_store(counts: Sequence[float], offset: int) -> DenseStore:
    """The store ``ddsketch``'s own decoder builds from stored bins, built at once.

    Its decoder adds the bins one by one, re-centring its list as it grows: quadratic in
    the number of bins, about a millisecond for a sketch of a few hundred latencies, and
    a report or a check decodes thousands. Same bins, offset and count; the key range
    spans the non-empty bins only (the decoder's spans the zero padding too), so a merge,
    which walks the range bin by bin, walks no empty ones."""
    store = DenseStore()
    used = [i for i, c in enumerate(counts) if c]
    if used:
        store.bins = list(counts)
        store.offset = offset
        store.min_key = offset + used[0]
        store.max_key = offset + used[-1]
        store.count = math.fsum(counts)
    return store


def load_sketch(text: str | None) -> DDSketch | None:
    """The sketch :func:`dump_sketch` wrote (None stays None)."""
    if not text:
        return None
    from ddsketch.pb.ddsketch_pb2 import DDSketch as SketchMessage  # deferred: protobuf,
    from ddsketch.pb.proto import DDSketchProto  # start-up time

    message = SketchMessage.FromString(base64.b64decode(text))
    sketch = _new_sketch()
    mapping = message.mapping
    if (mapping.gamma != sketch._mapping.gamma or mapping.indexOffset != 0.0
            or mapping.interpolation != 0):  # another sketch's layout: the slow decoder
        sketch.merge(DDSketchProto.from_proto(message))
        return sketch
    pos, neg = message.positiveValues, message.negativeValues
    sketch._store = _dense_store(pos.contiguousBinCounts, pos.contiguousBinIndexOffset)
    sketch._negative_store = _dense_store(neg.contiguousBinCounts,
                                          neg.contiguousBinIndexOffset)
    sketch._zero_count = message.zeroCount
    sketch._count = sketch._store.count + sketch._negative_store.count + message.zeroCount
    return sketch


def _add_counts(into: dict[str, int], more: Mapping[str, int]) -> None:
    for k, v in more.items():
        into[k] = into.get(k, 0) + v


@dataclass(slots=True)
class Rollup:
    """The figures of one key over one span (see the module docstring)."""

    attempts: int = 0
    tasks: int = 0
    calls: int = 0
    retries: int = 0
    discarded: int = 0
    fallbacks: int = 0
    parsed: int = 0
    conforming: int = 0
    completeness_sum: float = 0.0
    completeness_n: int = 0
    latency_sum: float = 0.0
    latency: DDSketch | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float | None = None
    watch_n: int = 0
    watched: dict[str, int] = field(default_factory=dict)
    parse_mix: dict[str, int] = field(default_factory=dict)
    error_mix: dict[str, int] = field(default_factory=dict)
    outcomes: dict[str, int] = field(default_factory=dict)
    #: Input tokens of the calls as reported, or as lockgate estimated them where the
    #: provider reported no usage: what the performance rule compares the input size by
    #: when an endpoint never reports usage.
    input_tokens_or_estimate: int = 0

    # -- building ---------------------------------------------------------------------

    def observe(self, attempt: Mapping[str, Any], *, output: Any = None,
                watch: Watch | None = None, cost: float | None = None) -> None:
        """Add one attempt row. ``output`` is the value the call delivered (None if it
        delivered none), ``watch`` what to look for in it, ``cost`` the call's price."""
        self.observe_all(((attempt, output, watch, cost),))

    def observe_all(self, observations: Iterable[Observation]) -> None:
        """Add attempt rows, each with its output, watch and cost (as :meth:`observe`
        takes them): the counters are summed in local variables and the latencies enter
        the sketch bin by bin, so a write-back's few hundred attempts cost a few
        microseconds each."""
        self._observe_calls(self._observe_attempts(observations))

    def _observe_attempts(self, observations: Iterable[Observation]) -> list[Observation]:
        """Count every attempt; return those that made a call."""
        attempts = tasks = retries = discarded = fallbacks = 0
        outcomes, error_mix = self.outcomes, self.error_mix
        calls: list[Observation] = []
        for o in observations:
            get = o[0].get
            outcome = get("outcome") or ""
            attempts += 1
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            if outcome in TERMINAL:
                tasks += 1
            elif outcome == "retry":
                retries += 1
            elif outcome == "discarded":
                discarded += 1
            if get("routed_from"):
                fallbacks += 1
            error = get("error_class")
            if error:
                error_mix[error] = error_mix.get(error, 0) + 1
            if get("latency_ms") is not None and get("prompt_sha256") is not None:
                calls.append(o)
        self.attempts += attempts
        self.tasks += tasks
        self.retries += retries
        self.discarded += discarded
        self.fallbacks += fallbacks
        return calls

    def _observe_calls(self, calls: list[Observation]) -> None:
        """Count attempts that made a call: latency, tokens, cost, the parsed output."""
        if not calls:
            return
        parsed = conforming = completeness_n = input_tokens = output_tokens = watch_n = 0
        or_estimate = 0
        completeness_sum = latency_sum = 0.0
        cost_sum: float | None = None
        latencies: list[float] = []
        parse_mix, watched = self.parse_mix, self.watched
        for attempt, output, watch, cost in calls:
            get = attempt.get
            latency = float(get("latency_ms") or 0.0)
            latency_sum += latency
            latencies.append(latency if latency > 0.0 else 0.0)
            reported = get("input_tokens")
            input_tokens += reported or 0
            or_estimate += reported if reported is not None else \
                get("estimated_tokens") or 0
            output_tokens += get("output_tokens") or 0
            if cost is not None:
                cost_sum = (cost_sum or 0.0) + cost
            status = get("parse_status")
            if status is None:
                continue
            parse_mix[status] = parse_mix.get(status, 0) + 1
            parsed += 1
            completeness = get("completeness")
            if completeness is not None:
                completeness_sum += completeness
                completeness_n += 1
            if status in _USABLE:
                conforming += 1
                if output is not None and watch:
                    watch_n += 1
                    for name in watch.found(output):
                        watched[name] = watched.get(name, 0) + 1
        self.calls += len(calls)
        self.latency_sum += latency_sum
        self.input_tokens += input_tokens
        self.input_tokens_or_estimate += or_estimate
        self.output_tokens += output_tokens
        if cost_sum is not None:
            self.cost = (self.cost or 0.0) + cost_sum
        self.parsed += parsed
        self.conforming += conforming
        self.completeness_sum += completeness_sum
        self.completeness_n += completeness_n
        self.watch_n += watch_n
        if self.latency is None:
            self.latency = _new_sketch()
        add_all(self.latency, latencies)

    def merge(self, other: Rollup) -> Rollup:
        """Add ``other`` into this rollup (and return it)."""
        for name in ("attempts", "tasks", "calls", "retries", "discarded", "fallbacks",
                     "parsed", "conforming", "completeness_n", "input_tokens",
                     "input_tokens_or_estimate", "output_tokens", "watch_n"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.completeness_sum += other.completeness_sum
        self.latency_sum += other.latency_sum
        if other.cost is not None:
            self.cost = (self.cost or 0.0) + other.cost
        if other.latency is not None and other.latency.count:
            if self.latency is None:
                self.latency = _new_sketch()
            self.latency.merge(other.latency)
        _add_counts(self.watched, other.watched)
        _add_counts(self.parse_mix, other.parse_mix)
        _add_counts(self.error_mix, other.error_mix)
        _add_counts(self.outcomes, other.outcomes)
        return self

    # -- reading ----------------------------------------------------------------------

    @property
    def completeness(self) -> float | None:
        """Mean field completeness before fallbacks, over parsed outputs."""
        return self.completeness_sum / self.completeness_n if self.completeness_n else None

    @property
    def conformance(self) -> float | None:
        """Share of parsed outputs that were usable."""
        return self.conforming / self.parsed if self.parsed else None

    def quantile(self, q: float) -> float | None:
        """The latency at quantile ``q`` (ms), within :data:`LATENCY_ACCURACY`."""
        if self.latency is None or self.latency.count == 0:
            return None
        value = self.latency.get_quantile_value(q)
        return None if value is None or math.isnan(value) else float(value)

    @property
    def cost_per_task(self) -> float | None:
        """Every call's cost (retries and discarded duplicates included) per task."""
        return None if self.cost is None or not self.tasks else self.cost / self.tasks

    # -- stored form ------------------------------------------------------------------

    def to_row(self) -> dict[str, Any]:
        """The columns of a ``quality_rollup`` row (without its key and time)."""
        return {
            "attempts": self.attempts, "tasks": self.tasks, "calls": self.calls,
            "retries": self.retries, "discarded": self.discarded,
            "fallbacks": self.fallbacks, "parsed": self.parsed,
            "conforming": self.conforming, "completeness_sum": self.completeness_sum,
            "completeness_n": self.completeness_n, "latency_sum": self.latency_sum,
            "latency_sketch": dump_sketch(self.latency),
            "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
            "cost": self.cost, "watch_n": self.watch_n,
            "watched": _dump_map(self.watched), "parse_mix": _dump_map(self.parse_mix),
            "error_mix": _dump_map(self.error_mix), "outcomes": _dump_map(self.outcomes),
            "input_tokens_or_estimate": self.input_tokens_or_estimate,
        }

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Rollup:
        """The rollup a ``quality_rollup`` row holds."""
        return cls(
            attempts=int(row["attempts"]), tasks=int(row["tasks"]), calls=int(row["calls"]),
            retries=int(row["retries"]), discarded=int(row["discarded"]),
            fallbacks=int(row["fallbacks"]), parsed=int(row["parsed"]),
            conforming=int(row["conforming"]),
            completeness_sum=float(row["completeness_sum"]),
            completeness_n=int(row["completeness_n"]),
            latency_sum=float(row["latency_sum"]),
            latency=load_sketch(row["latency_sketch"]),
            input_tokens=int(row["input_tokens"]), output_tokens=int(row["output_tokens"]),
            cost=None if row["cost"] is None else float(row["cost"]),
            watch_n=int(row["watch_n"]), watched=_load_map(row["watched"]),
            parse_mix=_load_map(row["parse_mix"]), error_mix=_load_map(row["error_mix"]),
            outcomes=_load_map(row["outcomes"]),
            input_tokens_or_estimate=int(row.get("input_tokens_or_estimate") or 0))


def _dump_map(counts: dict[str, int]) -> str | None:
    return orjson.dumps(counts, option=orjson.OPT_SORT_KEYS).decode() if counts else None


def _load_map(text: str | None) -> dict[str, int]:
    return {str(k): int(v) for k, v in orjson.loads(text).items()} if text else {}


def bucket_of(at_ms: int, resolution: str) -> int:
    """The start (ms) of the span of ``resolution`` holding ``at_ms``."""
    span = SPANS[resolution]
    return at_ms - at_ms % span


# -- watched values -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Watch:
    """What to look for in an output: each member of the output schema's enums, at its
    field (``label=positive``, nested fields dotted, ``[]`` for list items), and keywords
    (``keyword:refund``, found case-blind in any text of the output)."""

    members: tuple[tuple[tuple[str, ...], Any, str], ...] = ()
    keywords: tuple[str, ...] = ()
    #: The members at top-level fields, by field: (value's type, value) -> name.
    _top: tuple[tuple[str, dict[tuple[type, Any], str]], ...] = field(
        init=False, repr=False, compare=False)
    #: The members deeper in the output (a walk each).
    _deep: tuple[tuple[tuple[str, ...], Any, str], ...] = field(
        init=False, repr=False, compare=False)
    _any: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        top: dict[str, dict[tuple[type, Any], str]] = {}
        deep = []
        for path, member, name in self.members:
            if len(path) == 1 and path[0] != "[]":
                top.setdefault(path[0], {}).setdefault((type(member), member), name)
            else:
                deep.append((path, member, name))
        object.__setattr__(self, "_top", tuple(top.items()))
        object.__setattr__(self, "_deep", tuple(deep))
        object.__setattr__(self, "_any", bool(self.members or self.keywords))

    def __bool__(self) -> bool:
        return self._any

    def found(self, output: Any) -> Iterator[str]:
        """The names of the watched values ``output`` holds (each at most once)."""
        if self._top and isinstance(output, dict):
            for name_, table in self._top:  # a top-level field: a lookup, no walk
                v = output.get(name_, _ABSENT)
                if isinstance(v, _SCALARS):
                    hit = table.get((type(v), v))
                    if hit is not None:
                        yield hit
        seen: set[str] = set()
        for path, member, name in self._deep:
            if name not in seen and any(v == member and type(v) is type(member)
                                        for v in _at(output, path)):
                seen.add(name)
                yield name
        if self.keywords:
            text = "\n".join(_texts(output)).casefold()
            for word in self.keywords:
                if word.casefold() in text:
                    yield f"keyword:{word}"


_SCALARS = (str, int, float, bool, type(None))


def watch_of(schema: Mapping[str, Any] | None, keywords: Iterable[str] = ()) -> Watch:
    """The watched values of an output JSON schema plus declared keywords."""
    members: list[tuple[tuple[str, ...], Any, str]] = []
    if isinstance(schema, Mapping):
        _enums(schema, (), members)
    return Watch(tuple(members), tuple(dict.fromkeys(k for k in keywords if k)))


def _enums(node: Mapping[str, Any], path: tuple[str, ...],
           out: list[tuple[tuple[str, ...], Any, str]]) -> None:
    values = node.get("enum")
    if not isinstance(values, list) and "const" in node:
        values = [node["const"]]
    if isinstance(values, list):
        where = ".".join(path) or "$"
        for v in values:
            if isinstance(v, str | int | float | bool) or v is None:
                out.append((path, v, f"{where}={_plain(v)}"))
    props = node.get("properties")
    if isinstance(props, Mapping):
        for name, child in props.items():
            if isinstance(child, Mapping):
                _enums(child, (*path, str(name)), out)
    items = node.get("items")
    if isinstance(items, Mapping):
        _enums(items, (*path, "[]"), out)


def _plain(v: Any) -> str:
    return v if isinstance(v, str) else orjson.dumps(v).decode()


def _at(value: Any, path: tuple[str, ...]) -> Iterator[Any]:
    if not path:
        yield value
        return
    head, rest = path[0], path[1:]
    if head == "[]":
        if isinstance(value, list):
            for v in value:
                yield from _at(v, rest)
    elif isinstance(value, dict) and head in value:
        yield from _at(value[head], rest)


def _texts(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _texts(v)
    elif isinstance(value, list):
        for v in value:
            yield from _texts(v)
