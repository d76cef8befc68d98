"""Stored latency sketches load back as ``ddsketch``'s own decoder would load them:
same quantiles, count and merges (rollup reads decode thousands of them, so lockgate
builds the stores at once rather than bin by bin); latencies added at once make the sketch
that adding them one by one makes."""

from __future__ import annotations

import base64

import pytest
from ddsketch import DDSketch
from ddsketch.pb.ddsketch_pb2 import DDSketch as SketchMessage
from ddsketch.pb.proto import DDSketchProto
from hypothesis import given, settings
from hypothesis import strategies as st

from lockgate.quality.rollup import LATENCY_ACCURACY, add_all, dump_sketch, load_sketch

QUANTILES = [i / 50 for i in range(51)]
LATENCIES = st.lists(st.one_of(st.just(0.0), st.floats(0.001, 3_600_000.0)),
                     min_size=1, max_size=400)


def _sketch(values: list[float]) -> DDSketch:
    s = DDSketch(LATENCY_ACCURACY)
    for v in values:
        s.add(v)
    return s


def _reference(text: str) -> DDSketch:
    """What ddsketch's own decoder gives (turned into a DDSketch by a merge)."""
    s = DDSketch(LATENCY_ACCURACY)
    s.merge(DDSketchProto.from_proto(SketchMessage.FromString(base64.b64decode(text))))
    return s


def _quantiles(s: DDSketch) -> list[float | None]:
    return [s.get_quantile_value(q) for q in QUANTILES]


@settings(max_examples=150, deadline=None)
@given(LATENCIES, LATENCIES)
def test_a_loaded_sketch_is_the_one_ddsketch_decodes(values: list[float],
                                                     more: list[float]) -> None:
    text = dump_sketch(_sketch(values))
    assert text is not None
    loaded, reference = load_sketch(text), _reference(text)
    assert loaded is not None
    assert loaded.count == reference.count == len(values)
    assert _quantiles(loaded) == _quantiles(reference)
    # merging into it (as a write-back does) and merging it into another (as a report
    # does) give the same sketch too
    other = _sketch(more)
    loaded.merge(other)
    reference.merge(other)
    assert _quantiles(loaded) == _quantiles(reference)
    into, into_reference = _sketch(more), _sketch(more)
    into.merge(load_sketch(text))
    into_reference.merge(_reference(text))
    assert _quantiles(into) == _quantiles(into_reference)
    assert dump_sketch(load_sketch(dump_sketch(loaded))) == dump_sketch(loaded)


def test_empty_and_missing_sketches() -> None:
    assert dump_sketch(DDSketch(LATENCY_ACCURACY)) is None
    assert load_sketch(None) is None and load_sketch("") is None


@settings(max_examples=150, deadline=None)
@given(LATENCIES, LATENCIES)
def test_adding_latencies_at_once_is_adding_them_one_by_one(values: list[float],
                                                            before: list[float]) -> None:
    one_by_one, at_once = _sketch(before), _sketch(before)
    for v in values:
        one_by_one.add(v)
    add_all(at_once, values)
    assert at_once.count == one_by_one.count
    assert at_once._zero_count == one_by_one._zero_count
    assert at_once._min == one_by_one._min and at_once._max == one_by_one._max
    assert at_once._sum == pytest.approx(one_by_one._sum)
    assert _quantiles(at_once) == _quantiles(one_by_one)
    assert dump_sketch(load_sketch(dump_sketch(at_once))) == \
        dump_sketch(load_sketch(dump_sketch(one_by_one)))
