"""What a binding of a dataset to a prompt declares: thresholds, the comparison, the
statistical guard, non-inferiority, prices. Frozen into every evaluation's snapshot.

Threshold strings, as the command line takes them: ``accuracy>=0.9``,
``error_ratio<=0.01``, ``latency_p95_ms<2000``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from lockgate.errors import ConfigError

#: Metrics a threshold can name, and which way is better.
HIGHER_IS_BETTER = ("accuracy", "precision", "recall", "f1")
LOWER_IS_BETTER = ("error_ratio", "latency_p50_ms", "latency_p95_ms", "cost_per_item",
                   "tokens_per_item")
METRICS = HIGHER_IS_BETTER + LOWER_IS_BETTER
#: Metrics that are a share of successes k/n (the Wilson bound applies).
PROPORTIONS = ("accuracy", "precision", "recall", "error_ratio")
#: Metrics whose value lies in [0, 1] (shares, and F1, a ratio of counts): a threshold
#: outside that range can never be met.
BOUNDED = ("accuracy", "precision", "recall", "f1", "error_ratio")
#: Metrics that need a declared positive label.
NEEDS_POSITIVE = ("precision", "recall", "f1")

Metric = Literal["accuracy", "precision", "recall", "f1", "error_ratio", "latency_p50_ms",
                 "latency_p95_ms", "cost_per_item", "tokens_per_item"]
Op = Literal[">=", ">", "<=", "<", "=="]


class _Strict(BaseModel):
    # An infinite or NaN value is written to JSON as null, which no later validation of
    # the frozen snapshot takes: refused here, where the field can be named.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Threshold(_Strict):
    """``metric op value``, compared on the raw, unrounded metric."""

    metric: Metric
    op: Op
    value: float

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.value:g}"


class Comparison(_Strict):
    """How an output is scored against the expected value.

    * ``exact``: the whole output equals the expected JSON value;
    * ``label``: the output's ``field`` equals the expected label (the expected value
      is the label itself, or an object holding ``field``);
    * ``fields``: every named field of the output equals the expected object's;
    * ``scorer``: ``module:function`` called as ``f(expected, actual, input)``,
      returning a bool, or a number where >= 0.5 is a match.
    """

    kind: Literal["exact", "label", "fields", "scorer"] = "exact"
    field: str | None = None
    fields: tuple[str, ...] = ()
    scorer: str | None = None
    ignore_case: bool = False

    @model_validator(mode="after")
    def _complete(self) -> Comparison:
        if self.kind == "label" and not self.field:
            raise ValueError("a label comparison names its field (label:FIELD)")
        if self.kind == "fields" and not self.fields:
            raise ValueError("a fields comparison names at least one field")
        if self.kind == "scorer" and not self.scorer:
            raise ValueError("a scorer comparison names module:function")
        return self


class Guard(_Strict):
    """Statistical guard: for a proportion metric, the Wilson bound at ``confidence``
    (lower bound for >=/>, upper bound for <=/<) must clear the threshold (None: the
    value itself is compared), and every metric needs at least ``min_samples``
    observations of its own (items for accuracy and error_ratio, the denominators of
    precision and recall, tp + fp + fn for f1, the calls with a latency for the
    latencies, items for tokens and cost)."""

    confidence: float | None = Field(None, gt=0.5, lt=1.0)
    min_samples: int = Field(0, ge=0)


class NonInferiority(_Strict):
    """The candidate may not be worse than the live version, evaluated on the same
    snapshot, by more than ``margin`` on ``metric``."""

    metric: Metric = "accuracy"
    margin: float = Field(0.0, ge=0.0)


class Prices(_Strict):
    """Token prices, for ``cost_per_item`` (per million tokens, any currency)."""

    input_per_mtok: float = Field(ge=0.0)
    output_per_mtok: float = Field(ge=0.0)


class BindingSettings(_Strict):
    """Everything a binding declares."""

    thresholds: tuple[Threshold, ...] = Field(min_length=1)
    comparison: Comparison = Field(default_factory=Comparison)
    positive_label: Any = None
    guard: Guard | None = None
    non_inferiority: NonInferiority | None = None
    #: A metric with a zero denominator is undefined: it fails, unless this says "pass".
    undefined: Literal["fail", "pass"] = "fail"
    prices: Prices | None = None

    @model_validator(mode="after")
    def _positive_needed(self) -> BindingSettings:
        named = {t.metric for t in self.thresholds}
        if self.non_inferiority:
            named.add(self.non_inferiority.metric)
        wanting = sorted(named & set(NEEDS_POSITIVE))
        if wanting and self.positive_label is None:
            raise ValueError(f"{', '.join(wanting)} {_need(wanting)} a positive label: give "
                             "the expected value that counts as positive with --positive "
                             "(the `positive` argument in Python), e.g. --positive yes")
        if wanting and self.comparison.kind != "label":
            raise ValueError(f"{', '.join(wanting)} {_need(wanting)} a label comparison "
                             "(--compare label:FIELD)")
        if "cost_per_item" in named and self.prices is None:
            raise ValueError("cost_per_item needs prices: give the price per million input "
                             "and output tokens with --price-in and --price-out (the "
                             "`prices=(input, output)` argument in Python), e.g. "
                             "--price-in 2.5 --price-out 10")
        return self


def _need(metrics: Sequence[str]) -> str:
    return "needs" if len(metrics) == 1 else "need"


def unreachable(t: Threshold) -> str | None:
    """Why no value of a metric bounded to [0, 1] can meet ``t`` (``accuracy>=1.5``,
    ``error_ratio<0``), or None. Such a bar would reject every candidate, which reads
    as a bad candidate rather than a typo in the binding."""
    if t.metric not in BOUNDED:
        return None  # latency, tokens and cost have no upper bound
    v = t.value
    never = {">=": v > 1, ">": v >= 1, "<=": v < 0, "<": v <= 0,
             "==": not 0 <= v <= 1}[t.op]
    if not never:
        return None
    return (f"{t.metric} lies between 0 and 1, so '{t.metric} {t.op} {v:g}' can never be "
            "met: give a value in that range (e.g. 0.95 for 95%)")


def negative_bound(t: Threshold) -> str | None:
    """Why no value of a metric that is never negative (latency, tokens, cost: 0 or
    more, no upper bound) can meet ``t`` (``latency_p95_ms<=-1``), or None. Checked
    where a binding is made (:func:`settings_from`, so ``lockgate bind`` and
    ``gate.bind``), as :func:`unreachable_under_guard` is."""
    if t.metric in BOUNDED:
        return None
    v = t.value
    never = {">=": False, ">": False, "<=": v < 0, "<": v <= 0, "==": v < 0}[t.op]
    if not never:
        return None
    unit, example = ("ms", "2000") if t.metric.startswith("latency_") else \
        ("tokens", "800") if t.metric.startswith("tokens_") else \
        ("in the prices' currency", "0.01")
    return (f"{t.metric} is 0 or more ({unit}, no upper bound), so "
            f"'{t.metric} {t.op} {v:g}' can never be met: give a value in that range "
            f"(e.g. {t.metric}<={example})")


def unreachable_under_guard(t: Threshold, guard: Guard | None) -> str | None:
    """Why the statistical guard makes ``t`` impossible to meet, or None. Under
    ``confidence``, a proportion is compared through its Wilson bound, which never
    reaches 1 (lower bound: n / (n + z²) for n matches in n) nor 0 (upper bound for no
    successes), however many items: ``accuracy>=1`` or ``error_ratio<=0`` would reject
    every candidate, a perfect one included."""
    if guard is None or guard.confidence is None or t.metric not in PROPORTIONS:
        return None
    if t.op == ">=" and t.value >= 1:
        side, never = "lower", "is always below 1"
    elif t.op == "<=" and t.value <= 0:
        side, never = "upper", "is always above 0"
    else:
        return None
    example = {">=": "0.99", "<=": "0.01"}[t.op]
    return (f"'{t.metric} {t.op} {t.value:g}' can never be met with --confidence "
            f"{guard.confidence:g} (`confidence` in Python): the Wilson {side} bound of "
            f"{t.metric} {never}, so every candidate, a perfect one included, would be "
            f"rejected; give a bar the bound can clear (e.g. {t.metric}{t.op}{example}) or "
            "bind without --confidence to compare the value itself")


_THRESHOLD = re.compile(r"^\s*([a-z0-9_]+)\s*(>=|<=|==|>|<)\s*([-+0-9.eE]+)\s*$")


def parse_threshold(text: str) -> Threshold:
    """``accuracy>=0.9`` -> Threshold; ConfigError naming the problem otherwise."""
    m = _THRESHOLD.match(text)
    if not m:
        raise ConfigError(f"threshold {text!r} is not METRIC OP VALUE, e.g. accuracy>=0.9")
    metric, op, value = m.groups()
    if metric not in METRICS:
        raise ConfigError(f"unknown metric {metric!r} in threshold {text!r}; metrics: "
                          f"{', '.join(METRICS)}")
    try:
        t = Threshold(metric=metric, op=op, value=float(value))
    except ValidationError as exc:
        raise ConfigError(f"threshold {text!r}: {exc.errors()[0]['msg']}") from None
    except ValueError as exc:
        raise ConfigError(f"threshold {text!r}: {exc}") from None
    why = unreachable(t)
    if why is not None:
        raise ConfigError(f"threshold {text!r}: {why}")
    return t


def parse_comparison(text: str) -> Comparison:
    """``exact``, ``label:FIELD``, ``fields:A,B`` or ``scorer:module:function``."""
    kind, _, rest = text.partition(":")
    try:
        if kind == "exact" and not rest:
            return Comparison(kind="exact")
        if kind == "label":
            return Comparison(kind="label", field=rest)
        if kind == "fields":
            return Comparison(kind="fields",
                              fields=tuple(f.strip() for f in rest.split(",") if f.strip()))
        if kind == "scorer":
            return Comparison(kind="scorer", scorer=rest)
    except ValidationError as exc:
        raise ConfigError(f"comparison {text!r}: {exc.errors()[0]['msg']}") from None
    raise ConfigError(f"comparison {text!r}: use exact, label:FIELD, fields:A,B or "
                      "scorer:module:function")


#: The option that sets a field of the settings, in ``lockgate bind`` and in Python,
#: and the values it takes: a refused value is named by what the user typed.
_OPTIONS: dict[tuple[str, ...], tuple[str, str, str]] = {
    ("guard", "confidence"): ("--confidence", "confidence",
                              "a confidence above 0.5 and below 1, e.g. 0.95"),
    ("guard", "min_samples"): ("--min-samples", "min_samples",
                               "a whole number of observations, 0 or more, e.g. 30"),
    ("non_inferiority", "margin"): ("--non-inferiority", "non_inferiority",
                                    "a margin of 0 or more, e.g. 0.02"),
    ("non_inferiority", "metric"): ("--non-inferiority-metric", "non_inferiority['metric']",
                                    f"one of {', '.join(METRICS)}"),
    ("undefined",): ("--undefined", "undefined", "fail or pass"),
    ("prices", "input_per_mtok"): ("--price-in", "prices[0]",
                                   "a price per million input tokens, 0 or more"),
    ("prices", "output_per_mtok"): ("--price-out", "prices[1]",
                                    "a price per million output tokens, 0 or more"),
}


def _option_hint(loc: tuple[Any, ...], given: Any) -> str | None:
    """``--confidence (`confidence` in Python) takes ...; got 1.5`` for a refused value
    of a field an option sets, or None for another field."""
    known = _OPTIONS.get(tuple(str(p) for p in loc))
    if known is None:
        return None
    option, python, accepted = known
    return f"{option} (`{python}` in Python) takes {accepted}; got {given!r}"


def margin_out_of_range(ni: NonInferiority) -> str | None:
    """Why a non-inferiority margin on a metric bounded to [0, 1] is no margin (``2``
    on accuracy: live - 2 is below any value, so every candidate would pass), or None."""
    if ni.metric not in BOUNDED or ni.margin <= 1:
        return None
    return (f"--non-inferiority (`non_inferiority` in Python) takes a margin between 0 "
            f"and 1 on {ni.metric} (a metric between 0 and 1); got {ni.margin:g}, a margin "
            "every candidate would meet: give one in that range, e.g. 0.02 for two points")


def settings_from(doc: Any) -> BindingSettings:
    """Validate a settings document; ConfigError with the first problem otherwise,
    naming the option that sets a refused value and the values it takes."""
    try:
        settings = BindingSettings.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        msg = err["msg"]
        if err["type"] == "value_error":  # our own validator's words, without pydantic's
            msg = str(err.get("ctx", {}).get("error", msg))
        else:
            msg = _option_hint(tuple(err["loc"]), err.get("input")) or msg
        raise ConfigError(f"binding{' ' + where if where else ''}: {msg}") from None
    if settings.non_inferiority is not None:
        why = margin_out_of_range(settings.non_inferiority)
        if why is not None:
            raise ConfigError(f"binding non_inferiority.margin: {why}")
    # Checked here, where a binding is made, not in the model: a snapshot frozen before
    # this check must still load.
    for t in settings.thresholds:
        why = unreachable(t) or negative_bound(t) or unreachable_under_guard(t, settings.guard)
        if why is not None:
            raise ConfigError(f"binding threshold: {why}")
    return settings
