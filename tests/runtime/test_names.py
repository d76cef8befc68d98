"""Field-name folding and close-misspelling matching."""

from __future__ import annotations

import pytest

from lockgate.runtime.names import closest, distance, fold


@pytest.mark.parametrize("name", ["userName", "user_name", "User-Name", "USER NAME",
                                  "ｕｓｅｒ＿ｎａｍｅ"])
def test_fold_styles(name: str) -> None:
    assert fold(name) == "username"


@pytest.mark.parametrize("a, b, d", [
    ("score", "score", 0), ("scroe", "score", 1), ("sore", "score", 1),
    ("keywrods", "keywords", 1), ("kywrds", "keywords", 2), ("abc", "xyz", 3)])
def test_distance(a: str, b: str, d: int) -> None:
    assert distance(a, b, 3) == d


def test_distance_stops_early() -> None:
    assert distance("a" * 30, "b" * 30, 2) == 3


@pytest.mark.parametrize("name, expected", [
    ("sentimnet", "sentiment"), ("Sentiment", "sentiment"), ("scroe", "score"),
    ("summery", "summary"), ("置信", "置信度"), ("商品名", "商品名称"),
    ("id", None), ("sc", None), ("价", None), ("completely_else", None)])
def test_closest(name: str, expected: str | None) -> None:
    candidates = ["sentiment", "score", "summary", "置信度", "商品名称", "ids", "价格"]
    assert closest(name, candidates) == expected


def test_closest_refuses_ties() -> None:
    assert closest("carx", ["cart", "card"]) is None
