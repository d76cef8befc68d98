"""Shared helpers for the runtime tests: sample texts, corpus rules, config builders."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from lockgate.spec import DeliveryRule, TaskConfig

DATA = Path(__file__).parent / "data"


@cache
def texts() -> dict[str, list[str]]:
    """English, Chinese and mixed paragraphs (tests/runtime/data/texts.json)."""
    data: dict[str, list[str]] = json.loads((DATA / "texts.json").read_text("utf-8"))
    return data


@cache
def corpus_rules() -> dict[str, DeliveryRule]:
    """The delivery rules the output corpus is written against."""
    raw = json.loads((DATA / "rules.json").read_text("utf-8"))
    return {name: DeliveryRule.model_validate(doc) for name, doc in raw.items()}


def load_cases(name: str) -> list[dict[str, Any]]:
    """One JSONL file of the output corpus."""
    with (DATA / name).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def make_config(template: Any, *, model: dict[str, Any] | None = None,
                rule: dict[str, Any] | None = None) -> TaskConfig:
    """A TaskConfig from plain documents (as the store would rebuild one)."""
    if isinstance(template, tuple | list):
        template = [m if isinstance(m, dict) else m.model_dump() for m in template]
    return TaskConfig.model_validate({
        "prompt_template": template,
        "model_config": {"name": "test-model", **(model or {})},
        "delivery_rule": rule or {},
        "retry_policy": {},
    })


@pytest.fixture
def sample_texts() -> dict[str, list[str]]:
    return texts()
