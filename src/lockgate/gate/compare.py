"""Scoring one output against its expected value (pure; the scorer is user code)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lockgate.errors import ConfigError
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
            result = self._scorer(expected, actual, input)
            if isinstance(result, bool):
                return Scored(result)
            if isinstance(result, int | float):
                return Scored(float(result) >= 0.5)
            raise TypeError(f"scorer {s.scorer} returned {type(result).__name__}; "
                            "return a bool or a number")
        return Scored(same(_norm(actual, ic), _norm(expected, ic)))
