"""An answer the provider cut off at max_tokens (``finish_reason`` "length") is never
delivered as if complete: the attempt fails ``invalid_output`` with parse status
``truncated``, the delivery rule (retry, fallback, fail) applies as for any invalid
output, and the trace, the export and the quality views show it.

The first tests run :func:`run_attempt` and :func:`decide` on a provider that answers
with a given finish reason; the last one runs a worker against the simulator (which
shortens an answer to ``max_tokens`` and says "length") on a real database.
"""

from __future__ import annotations

import asyncio
import csv
import io
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner, Result

from lockgate.cli import app
from lockgate.config import Endpoint
from lockgate.errors import ErrorClass
from lockgate.gate.roles import CANDIDATE_ERRORS
from lockgate.providers.base import Completion, CompletionRequest
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import TaskConfig, load_config, parse_task
from lockgate.states import TaskStatus
from lockgate.store import Store
from lockgate.worker.execute import AttemptResult, attempt_trace, decide, run_attempt

from .support import PROSE_TEMPLATE, attempts_of, run_worker, task, task_row

CUT_OFF_HINT = 'at max_tokens (finish_reason "length"): raise model_config.max_tokens'


class Answering:
    """A provider that answers every call with ``content`` and ``finish_reason``."""

    name = "answering"

    def __init__(self, content: str, finish_reason: str | None) -> None:
        self.content, self.finish_reason = content, finish_reason

    async def complete(self, request: CompletionRequest) -> Completion:
        return Completion(self.content, 200, request.model, prompt_tokens=5,
                          completion_tokens=8, finish_reason=self.finish_reason)

    async def close(self) -> None:
        return None


def config_of(delivery: dict[str, Any], retry: dict[str, Any] | None = None) -> TaskConfig:
    return load_config(parse_task({
        "task_id": "t", "prompt_template": "Answer {x}", "input_data": {"x": 1},
        "model_config": {"name": "m", "max_tokens": 8}, "delivery_rule": delivery,
        "retry_policy": {"max_retries": 2, "base_delay_ms": 0, "jitter": 0.0,
                         **(retry or {})}}).config_document())


def attempt(config: TaskConfig, content: str, finish_reason: str | None) -> AttemptResult:
    return asyncio.run(run_attempt(config, {"x": 1}, Endpoint(name="e", base_url="http://h/v1"),
                                   Answering(content, finish_reason), idempotency_key=None,
                                   params={}))


TEXT = {"format": "text"}
JSON = {"required_keys": ["label", "reason"], "fallback_values": {"reason": "unknown"}}


@pytest.mark.parametrize("reason", ["length", "max_tokens"])
def test_a_cut_text_answer_fails_as_invalid_output_and_is_retried(reason: str) -> None:
    config = config_of(TEXT)
    res = attempt(config, "The answer is cut off in the mid", reason)
    assert res.error_class is ErrorClass.INVALID_OUTPUT
    assert res.error_message == (
        f'truncated: the answer was cut off at max_tokens (finish_reason "{reason}"): '
        "raise model_config.max_tokens or ask for a shorter answer")
    decision = decide(config, 1, res)
    assert (decision.status, decision.outcome, decision.result) == (
        TaskStatus.PENDING, "retry", None)
    row = attempt_trace(1, 0, res, decision.outcome)
    assert (row["parse_status"], row["error_class"]) == ("truncated", "invalid_output")
    assert row["fixes"] == f"truncated,finish_reason:{reason}"
    assert row["raw_output"] == "The answer is cut off in the mid", "kept for the trace"
    assert row["completeness"] == 0.0


def test_the_last_attempt_of_a_cut_answer_ends_dead_or_with_the_fallback() -> None:
    res = attempt(config_of(TEXT), "cut mid", "length")
    assert decide(config_of(TEXT), 3, res).status is TaskStatus.DEAD
    fallback = config_of({**JSON, "on_invalid": "fallback",
                          "fallback_values": {"label": "no", "reason": "unknown"}})
    cut = attempt(fallback, '{"label": "yes", "reason": "the customer wan', "length")
    decision = decide(fallback, 3, cut)
    assert decision.status is TaskStatus.FAILED, "delivered from the fallback, saying why"
    assert orjson.loads(decision.result or "") == {"label": "no", "reason": "unknown"}
    fail = config_of({**JSON, "on_invalid": "fail"})
    assert decide(fail, 1, attempt(fail, "{\"label\": \"ye", "length")).status \
        is TaskStatus.FAILED


def test_json_the_repair_would_close_is_not_delivered() -> None:
    config = config_of(JSON)
    raw = '{"label": "yes", "reason": "the customer wan'
    assert attempt(config, raw, None).ok, "without the report the repair delivers it"
    res = attempt(config, raw, "length")
    assert res.error_class is ErrorClass.INVALID_OUTPUT and res.parsed is not None
    assert res.parsed.status == "truncated"
    assert res.error_message is not None and CUT_OFF_HINT in res.error_message
    assert decide(config, 1, res).outcome == "retry"


def test_json_complete_before_the_cut_is_delivered() -> None:
    config = config_of(JSON)
    res = attempt(config, '{"label": "yes", "reason": "late"}\nThe reason is that th',
                  "length")
    assert res.ok
    decision = decide(config, 1, res)
    assert decision.status is TaskStatus.SUCCEEDED
    assert orjson.loads(decision.result or "") == {"label": "yes", "reason": "late"}
    row = attempt_trace(1, 0, res, decision.outcome)
    assert row["parse_status"] == "repaired"
    assert row["fixes"] == "extracted:chatter,finish_reason:length"


@pytest.mark.parametrize("reason", ["stop", None])
def test_a_finished_answer_is_untouched(reason: str | None) -> None:
    text = attempt(config_of(TEXT), "The answer is cut off in the mid", reason)
    assert text.ok and text.parsed is not None and text.parsed.fixes == ()
    assert decide(config_of(TEXT), 1, text).result == '"The answer is cut off in the mid"'
    res = attempt(config_of(JSON), '{"label": "yes", "reason": "late"}', reason)
    assert res.ok and res.parsed is not None and res.parsed.status == "valid"


def test_the_release_gate_counts_a_cut_answer_against_the_candidate() -> None:
    # invalid_output is the candidate's own error (its prompt asked for too long an
    # answer for its max_tokens), not an infrastructure failure.
    assert ErrorClass.INVALID_OUTPUT in CANDIDATE_ERRORS


# -- end to end: the simulator cuts answers at max_tokens ------------------------------------

#: The simulator answers ``{"label":"yes","summary":"<the input>"}``; at max_tokens 10 it
#: stops inside the summary, after the label: the repair would deliver the label and
#: the summary's fallback.
SUMMARY_TEMPLATE = [
    {"role": "system", "content": ('Reply with JSON like {{"label": "yes", "summary": "..."}}.'
                                   "\nlabel: one of yes, no\n"
                                   "summary: text, at most 120 characters\n"
                                   "If the text mentions refund then label = yes\n"
                                   "Otherwise label = no")},
    {"role": "user", "content": "<input>\n{text}\n</input>"},
]
SUMMARY_RULE = {"required_keys": ["label", "summary"], "fallback_values": {"summary": ""}}
LONG_INPUT = "order 3: please refund me, the parcel arrived broken and late"


def lockgate(*args: str) -> Result:
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def test_cut_answers_end_to_end_are_never_delivered_as_complete(
        db_url: str, store: Store, simulator: SimulatorProcess) -> None:
    once = {"max_retries": 1, "base_delay_ms": 0, "jitter": 0.0}
    lines = [
        task("text-cut", template=PROSE_TEMPLATE, model={"max_tokens": 6},
             delivery={"format": "text", "required_keys": []}, retry=once),
        task("text-whole", template=PROSE_TEMPLATE, model={"max_tokens": 200},
             delivery={"format": "text", "required_keys": []}, retry=once),
        task("json-cut", LONG_INPUT, template=SUMMARY_TEMPLATE, model={"max_tokens": 10},
             delivery=SUMMARY_RULE, retry=once),
        task("json-cut-fallback", LONG_INPUT, template=SUMMARY_TEMPLATE,
             model={"max_tokens": 10}, retry={**once, "max_retries": 0},
             delivery={"required_keys": ["label", "summary"], "on_invalid": "fallback",
                       "fallback_values": {"label": "no", "summary": ""}}),
        task("json-whole", LONG_INPUT, template=SUMMARY_TEMPLATE, model={"max_tokens": 200},
             delivery=SUMMARY_RULE, retry=once),
    ]
    store.submit([parse_task(x) for x in lines], batch_id="cut")
    run_worker(store, concurrency=4)

    for task_id in ("text-cut", "json-cut"):
        row = task_row(store, task_id)
        assert (row["status"], row["attempts"], row["error_class"], row["result"]) == (
            "DEAD", 2, "invalid_output", None), task_id
        assert CUT_OFF_HINT in row["error_message"]
        trace = attempts_of(store, task_id)
        assert [(a["outcome"], a["parse_status"], a["error_class"]) for a in trace] == [
            ("retry", "truncated", "invalid_output"), ("dead", "truncated", "invalid_output")]
        assert all("finish_reason:length" in a["fixes"].split(",") for a in trace)
    assert [a["raw_output"] for a in attempts_of(store, "json-cut")] == [
        '{"label":"yes","summary":"order 3: ple'] * 2, "the cut answer stays in the trace"

    fallback = task_row(store, "json-cut-fallback")
    assert (fallback["status"], fallback["error_class"]) == ("FAILED", "invalid_output")
    assert orjson.loads(fallback["result"]) == {"label": "no", "summary": ""}

    assert task_row(store, "text-whole")["status"] == "SUCCEEDED"
    whole = task_row(store, "json-whole")
    assert whole["status"] == "SUCCEEDED" and orjson.loads(whole["result"]) == {
        "label": "yes", "summary": LONG_INPUT}

    exported = lockgate("export", "cut", "--db", db_url, "--format", "csv")
    assert exported.exit_code == 0, exported.output
    table = {r["task_id"]: r for r in csv.DictReader(io.StringIO(exported.stdout))}
    assert (table["text-cut"]["status"], table["text-cut"]["error_class"]) == (
        "DEAD", "invalid_output")
    assert "truncated: the answer was cut off" in table["text-cut"]["error_message"]
    assert table["text-cut"]["parse_status"] == table["json-cut"]["parse_status"] == "truncated"
    assert table["text-cut"]["result"] == ""

    views = orjson.loads(lockgate("quality", "--db", db_url, "--json").stdout)
    mix: dict[str, int] = {}
    for view in views:
        for status, n in view["parse_status"].items():
            mix[status] = mix.get(status, 0) + n
    assert mix.get("truncated") == 5, mix  # 2 + 2 + 1 cut calls, none counted usable
    assert sum(view["tasks"] for view in views) == len(lines)
