"""The watched values found in an output are those a plain walk of the output finds, for
random schemas (enums and consts at top-level and nested fields, in lists) and random
outputs (values of other types that compare equal included: 1, 1.0 and True)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from lockgate.quality.rollup import _at, _texts, watch_of

SCALARS = st.sampled_from(["a", "b", "", 1, 1.0, 0, True, False, None, 2.5])
FIELDS = st.sampled_from(["x", "y", "z"])


def _schema(depth: int) -> st.SearchStrategy[dict[str, Any]]:
    leaf = st.one_of(st.builds(lambda v: {"enum": v}, st.lists(SCALARS, max_size=4)),
                     st.builds(lambda v: {"const": v}, SCALARS))
    if depth == 0:
        return leaf
    child = _schema(depth - 1)
    return st.one_of(
        leaf,
        st.builds(lambda p: {"type": "object", "properties": p},
                  st.dictionaries(FIELDS, child, max_size=3)),
        st.builds(lambda i: {"type": "array", "items": i}, child))


def _value(depth: int) -> st.SearchStrategy[Any]:
    if depth == 0:
        return st.one_of(SCALARS, st.sampled_from(["A refund", "broken"]))
    inner = _value(depth - 1)
    return st.one_of(SCALARS, st.lists(inner, max_size=3),
                     st.dictionaries(FIELDS, inner, max_size=3))


def _reference(watch: Any, output: Any) -> set[str]:
    names = {name for path, member, name in watch.members
             if any(v == member and type(v) is type(member) for v in _at(output, path))}
    text = "\n".join(_texts(output)).casefold()
    return names | {f"keyword:{w}" for w in watch.keywords if w.casefold() in text}


@settings(max_examples=400, deadline=None)
@given(_schema(3), _value(3), st.lists(st.sampled_from(["refund", "Broken", "zzz"]),
                                       max_size=2))
def test_found_values_are_what_a_walk_of_the_output_finds(
        schema: dict[str, Any], output: Any, keywords: list[str]) -> None:
    watch = watch_of(schema, keywords)
    found = list(watch.found(output))
    assert len(found) == len(set(found))  # each at most once
    assert set(found) == _reference(watch, output)
    assert bool(watch) == bool(watch.members or watch.keywords)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(FIELDS, _schema(0), max_size=3),
       st.dictionaries(FIELDS, SCALARS, max_size=3))
def test_top_level_fields_match_by_value_and_type(fields: dict[str, Any],
                                                 output: dict[str, Any]) -> None:
    watch = watch_of({"type": "object", "properties": fields})
    assert set(watch.found(output)) == _reference(watch, output)
