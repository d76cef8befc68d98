"""Scoring one output against its expected value (pure; the scorer is user code)."""

from __future__ import annotations

import contextlib
import importlib
import itertools
import math
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from lockgate.errors import ConfigError, SpecError
from lockgate.gate.binding import Comparison

Scorer = Callable[[Any, Any, Any], Any]


@dataclass(frozen=True, slots=True)
class Scored:
    """Whether the output matched, and the labels a label comparison compared."""

    match: bool
    predicted: Any = None
    truth: Any = None


def load_scorer(path: str) -> Scorer:
    """Import ``module:function`` (or ``module.function``); ConfigError if impossible."""
    module, sep, attr = path.partition(":")
    if not sep:
        module, _, attr = path.rpartition(".")
    if not module or not attr:
        raise ConfigError(f"scorer {path!r} is not module:function")
    try:
        fn = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot import scorer {path!r}: {exc}") from None
    if not callable(fn):
        raise ConfigError(f"scorer {path!r} is not callable")
    return fn


def _norm(value: Any, ignore_case: bool) -> Any:
    """``value`` with its strings case-folded at any depth when ``ignore_case`` (object
    keys are names, not text: kept)."""
    if not ignore_case:
        return value
    if isinstance(value, str):
        return value.casefold()
    if isinstance(value, dict):
        return {k: _norm(v, True) for k, v in value.items()}
    if isinstance(value, list):
        return [_norm(v, True) for v in value]
    return value


def same(a: Any, b: Any) -> bool:
    """JSON equality: as Python's ``==`` (``1 == 1.0``), except that a boolean is never
    a number (``true`` is not ``1``, ``false`` not ``0``), at any depth."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(v, b[k]) for k, v in a.items())
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _get(value: Any, field: str) -> Any:
    return value.get(field) if isinstance(value, dict) else None


class Comparator:
    """A compiled :class:`Comparison` (the scorer imported once)."""

    def __init__(self, spec: Comparison) -> None:
        self.spec = spec
        self._scorer = load_scorer(spec.scorer) if spec.kind == "scorer" and spec.scorer \
            else None

    def truth(self, expected: Any) -> Any:
        """The expected label of a label comparison (the value itself, or its field)."""
        f = self.spec.field
        if f and isinstance(expected, dict) and f in expected:
            return expected[f]
        return expected

    def __call__(self, expected: Any, actual: Any, input: Any = None) -> Scored:
        s = self.spec
        ic = s.ignore_case
        if s.kind == "label":
            assert s.field is not None
            truth = self.truth(expected)
            predicted = _get(actual, s.field) if isinstance(actual, dict) else actual
            return Scored(same(_norm(predicted, ic), _norm(truth, ic)), predicted, truth)
        if s.kind == "fields":
            ok = isinstance(expected, dict) and isinstance(actual, dict) and all(
                same(_norm(actual.get(f), ic), _norm(expected.get(f), ic)) for f in s.fields)
            return Scored(ok)
        if s.kind == "scorer":
            assert self._scorer is not None
            return Scored(scored_match(s.scorer, self._scorer(expected, actual, input)))
        return Scored(same(_norm(actual, ic), _norm(expected, ic)))


def scored_match(scorer: str | None, result: Any) -> bool:
    """Whether a scorer's ``result`` is a match: a bool by its truth value, a number
    when it is 0.5 or more. A number is whatever ``float()`` takes without reading text
    (an int, float, Decimal or Fraction, numpy's scalars: ``numpy.bool_`` is 1 or 0);
    integers are compared exactly, at any size. NaN is no score, so it is refused like
    ``None`` is: a scorer that cannot score an output should say so, not pass a value
    that silently counts as a mismatch."""
    kind = type(result)
    if isinstance(result, bool):
        return result
    if hasattr(kind, "__index__"):
        with contextlib.suppress(TypeError):  # a 0-d array of floats has one, refusing
            return operator.index(result) >= 1
    if hasattr(kind, "__float__"):
        try:
            value = float(result)
        except (TypeError, ValueError, OverflowError) as exc:
            raise TypeError(f"scorer {scorer} returned {type_name(result)} {result!r:.80}, "
                            f"which float() cannot read ({exc}); return a bool or a number"
                            ) from None
        if math.isnan(value):
            raise ValueError(f"scorer {scorer} returned NaN, which is no score; return a "
                             "bool or a number, or raise to say why the output cannot be "
                             "scored")
        return value >= 0.5
    raise TypeError(f"scorer {scorer} returned {type_name(result)}; return a bool or a "
                    "number")


def type_name(value: Any) -> str:
    """The type of ``value`` as its module names it (``numpy.bool``, ``decimal.Decimal``;
    a builtin by its name alone), so that no two types read alike."""
    kind = type(value)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


#: How many of a dataset's labels a refusal lists.
_SHOWN_LABELS = 20

#: What :func:`check_labels` reads from a dataset without items.
_NOTHING = object()


def check_labels(spec: Comparison, positive: Any, dataset: str,
                 expected_values: Iterable[Any]) -> None:
    """SpecError when a label comparison cannot work on a dataset's expected values:
    expected objects of which none holds the compared ``field`` (each item's label would
    be the whole object, which no output field equals), or a ``positive`` label that no
    item has (every precision and recall would be undefined, and every candidate
    rejected). The labels the dataset holds are named. A label or fields comparison is
    refused on an empty dataset, as what it reads cannot be checked there (and a
    candidate evaluated on no item is rejected anyway); ``exact`` and ``scorer`` read
    nothing bind could check."""
    if spec.kind not in ("label", "fields"):
        return
    values = iter(expected_values)
    first = next(values, _NOTHING)
    if first is _NOTHING:
        named = spec.field if spec.kind == "label" else ",".join(spec.fields)
        raise SpecError(f"dataset '{dataset}' is empty: the comparison {spec.kind}:{named} "
                        "cannot be checked against its expected values, and a candidate "
                        "evaluated on no item is rejected; add its items first "
                        f"(`lockgate dataset add {dataset} FILE`), then bind")
    expected_values = itertools.chain([first], values)
    if spec.kind != "label" or spec.field is None:
        return
    comp = Comparator(spec)
    fold = spec.ignore_case
    wanted = fold_label(positive) if fold else positive
    found = positive is None
    objects = holding = False
    fields: set[str] = set()
    labels: dict[bytes, Any] = {}  # while the positive label is not found, by JSON text
    for expected in expected_values:
        if isinstance(expected, dict):
            objects = True
            holding = holding or spec.field in expected
            fields.update(expected)
        if not found:
            truth = comp.truth(expected)
            found = same(fold_label(truth) if fold else truth, wanted)
            if len(labels) <= _SHOWN_LABELS:
                labels.setdefault(orjson.dumps(truth, option=orjson.OPT_SORT_KEYS), truth)
        if found and holding:
            return
    if objects and not holding:
        held = ", ".join(sorted(fields)[:_SHOWN_LABELS])
        raise SpecError(f"comparison: no expected value of dataset '{dataset}' holds field "
                        f"'{spec.field}' (fields held: {held}); name the field that holds "
                        "the label after label:")
    if found or not labels:
        return
    shown = ", ".join(t.decode() for t in sorted(labels)[:_SHOWN_LABELS])
    if len(labels) > _SHOWN_LABELS:
        shown += ", …"
    hint = ""
    if not fold and any(same(fold_label(v), fold_label(positive)) for v in labels.values()):
        hint = ", or compare with --ignore-case"
    raise SpecError(f"positive: no expected value of dataset '{dataset}' has the label "
                    f"{orjson.dumps(positive).decode()} (labels held: {shown}); give one of "
                    f"them with --positive (the `positive` argument in Python){hint}")


def fold_label(value: Any) -> Any:
    """A label as ``ignore_case`` compares it: text case-folded (the metrics count a
    positive label, and bind looks for it, the same way)."""
    return value.casefold() if isinstance(value, str) else value
