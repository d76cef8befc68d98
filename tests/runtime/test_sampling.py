"""Sampling settings come from the model config, jittered per worker."""

from __future__ import annotations

from lockgate.runtime import sampling_params
from lockgate.runtime.sampling import worker_unit
from lockgate.spec import ModelConfig


def test_plain_settings_pass_through() -> None:
    model = ModelConfig.model_validate({
        "name": "qwen-plus", "temperature": 0.2, "top_p": 0.9, "max_tokens": 256, "seed": 7,
        "response_format": "json_object", "timeout_ms": 5000, "max_input_tokens": 900,
        "tokenizer": "calibrated", "presence_penalty": 0.1, "enable_thinking": False})
    assert sampling_params(model, "w1") == {
        "temperature": 0.2, "top_p": 0.9, "max_tokens": 256, "seed": 7,
        "response_format": {"type": "json_object"}, "presence_penalty": 0.1,
        "enable_thinking": False}


def test_top_k_only_when_set() -> None:
    assert "top_k" not in sampling_params(ModelConfig(name="m"), 1)
    assert sampling_params(ModelConfig(name="m", top_k=40), 1)["top_k"] == 40
    assert sampling_params(ModelConfig(name="m"), 1) == {}


def test_temperature_jitter_is_deterministic_and_within_band() -> None:
    model = ModelConfig(name="m", temperature=0.7, temperature_jitter=0.1)
    temps = [sampling_params(model, seed)["temperature"] for seed in range(200)]
    assert all(0.6 <= t <= 0.8 for t in temps)
    assert len(set(temps)) > 100  # workers really differ
    assert temps == [sampling_params(model, seed)["temperature"] for seed in range(200)]
    assert min(temps) < 0.62 and max(temps) > 0.78  # the band is used


def test_jitter_is_clipped_to_the_valid_range() -> None:
    low = ModelConfig(name="m", temperature=0.0, temperature_jitter=0.3)
    assert all(sampling_params(low, s)["temperature"] >= 0.0 for s in range(50))
    high = ModelConfig(name="m", temperature=2.0, temperature_jitter=0.3)
    assert all(sampling_params(high, s)["temperature"] <= 2.0 for s in range(50))


def test_worker_unit_range() -> None:
    values = [worker_unit(i) for i in range(1000)]
    assert all(-1.0 <= v <= 1.0 for v in values)
    assert worker_unit("a", "x") != worker_unit("a", "y")
