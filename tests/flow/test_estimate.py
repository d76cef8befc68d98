"""Token reservations learned from usage."""

from __future__ import annotations

import pytest

from lockgate.flow.estimate import TokenModel, charged_tokens


def test_estimates_start_cautious_and_learn_the_real_usage() -> None:
    m = TokenModel(fixed_chars=400, max_tokens=None)
    first = m.estimate(100)
    assert first == pytest.approx(0.5 * 500 + 256)
    for _ in range(200):
        m.learn(100, prompt_tokens=125, completion_tokens=20)
    assert m.estimate(100) == pytest.approx(125 + 20, rel=0.02)
    assert m.estimate(300) > m.estimate(100)  # longer input, more prompt tokens


def test_max_tokens_caps_the_output_part_and_can_be_what_the_provider_charges() -> None:
    assert TokenModel(0, max_tokens=32).estimate(0) == 32
    m = TokenModel(0, max_tokens=64, counts_max_tokens=True)
    m.learn(0, 10, 5)
    assert m.estimate(0) >= 64
    assert charged_tokens(100, 5, 64, counts_max_tokens=True) == 164
    assert charged_tokens(100, 5, 64, counts_max_tokens=False) == 105
    assert charged_tokens(None, 5, 64, counts_max_tokens=False) is None


def test_a_usage_no_call_could_have_is_not_learned() -> None:
    """One answer claiming 500M prompt tokens (or a billion output tokens) for a
    500-character prompt made every later call reserve millions of tokens."""
    m = TokenModel(fixed_chars=400, max_tokens=None)
    for _ in range(50):
        m.learn(100, prompt_tokens=125, completion_tokens=20)
    before = m.estimate(100)
    m.learn(100, prompt_tokens=500_000_000, completion_tokens=20)
    m.learn(100, prompt_tokens=125, completion_tokens=1_000_000_000)
    assert m.estimate(100) == pytest.approx(before, rel=0.01)
    # A tiny prompt's chat format still counts: 3 characters, 40 tokens, learned.
    small = TokenModel(fixed_chars=0, max_tokens=None)
    small.learn(3, prompt_tokens=40, completion_tokens=1)
    assert small.tokens_per_char > 1
