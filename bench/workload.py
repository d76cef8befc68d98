"""The benchmark workload: one short JSON-labelling prompt, the same for lockgate and
the naive baseline."""

from __future__ import annotations

from typing import Any

SYSTEM = ("Label the text. Reply with JSON only, like {\"label\": \"yes\"}.\n"
          "label: one of yes, no\n"
          "- if the text mentions refund|broken then label = yes")
USER = "<input>\n{text}\n</input>"


def text(i: int) -> str:
    return f"order {i}: the parcel arrived {'broken' if i % 3 == 0 else 'on time'}"


def task_line(i: int, batch: str = "bench", tokenizer: str | None = None) -> dict[str, Any]:
    """A lockgate task (the six meta-fields); ``tokenizer`` picks its token estimator."""
    model: dict[str, Any] = {"name": "sim-bench", "max_tokens": 32, "timeout_ms": 60_000}
    if tokenizer is not None:
        model["tokenizer"] = tokenizer
    return {
        "task_id": f"{batch}-{i:08d}",
        "batch_id": batch,
        "prompt_template": [{"role": "system", "content": SYSTEM.replace("{", "{{")
                             .replace("}", "}}")},
                            {"role": "user", "content": USER}],
        "input_data": {"text": text(i)},
        "model_config": model,
        "delivery_rule": {"format": "json", "required_keys": ["label"]},
        "retry_policy": {"max_retries": 5, "base_delay_ms": 100, "cap_ms": 2000},
    }


def request_body(i: int) -> dict[str, Any]:
    """The HTTP body lockgate sends for task ``i`` (the baseline sends the same)."""
    return {"model": "sim-bench", "max_tokens": 32,
            "messages": [{"role": "system", "content": SYSTEM},
                         {"role": "user", "content": USER.format(text=text(i))}]}
