"""The rollups kept flush by flush equal a from-scratch recomputation over task_attempt,
for random streams of attempts: retries, failures with fallback values, uncalled
attempts, endpoint fallbacks, write-backs whose lease was lost (discarded duplicates),
several workers (shards) and flushes of any size, spread over minutes, hours and days."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import orjson
import pytest
from ddsketch import DDSketch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from helpers import rows
from lockgate.config import Endpoint
from lockgate.quality.rollup import LATENCY_ACCURACY, SPANS, Rollup, bucket_of
from lockgate.quality.writer import RollupWriter, Written, template_key
from lockgate.spec import parse_task
from lockgate.states import TaskStatus
from lockgate.store import Finish, Store
from lockgate.store.quality import QualityStore
from lockgate.store.tx import Tx
from lockgate.store.types import AttemptRow, ClaimedTask

SCHEMA = {"type": "object", "properties": {
    "label": {"type": "string", "enum": ["yes", "no"]},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}}}}
TEMPLATE = "Label this: {text}"
ENDPOINTS = {"e1": Endpoint(name="e1", base_url="http://x", cost_input_per_1k=0.5,
                            cost_output_per_1k=1.5),
             "e2": Endpoint(name="e2", base_url="http://x")}
KEYWORDS = ("refund",)
DAY = 86_400_000
BASE = 1_800_000_000_000 - 1_800_000_000_000 % DAY  # a day's start


def _wipe(store: Store) -> None:
    with store.engine.begin() as conn:
        for table in ("task", "task_attempt", "task_config", "batch", "quality_rollup"):
            conn.execute(text(f"DELETE FROM {table}"))


def _submit(store: Store, n: int) -> None:
    store.submit([parse_task({
        "task_id": f"t{i}", "prompt_template": TEMPLATE, "input_data": {"text": str(i)},
        "model_config": {"name": "m"}, "delivery_rule": {"schema": SCHEMA},
        "retry_policy": {}})
        for i in range(n)], batch_id="b")


def _attempt(data: st.DataObject, attempt: int, kind: str) -> tuple[AttemptRow, Finish]:
    draw = data.draw
    row: AttemptRow = {
        "attempt": attempt,
        "started_at": BASE + draw(st.integers(0, 2 * DAY // 60_000)) * 60_000
        + draw(st.integers(0, 59_999)),
        "endpoint": draw(st.sampled_from(sorted(ENDPOINTS))),
        "model": draw(st.sampled_from(["m", "m-2"])),
        "prompt_version": draw(st.sampled_from([None, None, "p@1", "p@2"])),
        "routed_from": draw(st.sampled_from([None, None, "e0"])),
    }
    if kind != "uncalled":
        # halves of a ms below 10 s: MariaDB's FLOAT column gives back 6 digits
        row.update(prompt_sha256="h", latency_ms=draw(st.integers(1, 19_999)) / 2,
                   input_tokens=draw(st.one_of(st.none(), st.integers(0, 5000))),
                   estimated_tokens=draw(st.one_of(st.none(), st.integers(0, 5000))),
                   output_tokens=draw(st.integers(0, 500)))
    f = Finish(id=0, lease_token="", status=TaskStatus.PENDING, attempt=row)
    if kind == "ok":
        value: dict[str, Any] = {"label": draw(st.sampled_from(["yes", "no", "maybe"]))}
        if draw(st.booleans()):
            value["tags"] = draw(st.lists(st.sampled_from(["a", "b", "c"]), max_size=3))
        if draw(st.booleans()):
            value["note"] = draw(st.sampled_from(["a REFUND please", "fine"]))
        f.status, f.result = TaskStatus.SUCCEEDED, orjson.dumps(value).decode()
        row.update(outcome="succeeded", raw_output=f.result,
                   parse_status=draw(st.sampled_from(["valid", "repaired", "coerced",
                                                      "filled_fallback"])),
                   completeness=draw(st.sampled_from([1.0, 0.5, 0.0])))
    elif kind == "invalid":
        row.update(outcome="retry", parse_status=draw(st.sampled_from(
            ["invalid_json", "no_json_found"])), completeness=0.0,
            error_class="invalid_output")
    elif kind == "error":
        row.update(outcome="retry", error_class=draw(st.sampled_from(
            ["server_error", "timeout", "rate_limited"])))
    elif kind == "fail":
        f.status, f.result = TaskStatus.FAILED, orjson.dumps({"label": "no"}).decode()
        row.update(outcome="failed", parse_status="schema_violation", completeness=0.5,
                   error_class="invalid_output")
    else:  # uncalled
        f.status = TaskStatus.FAILED
        row.update(outcome="failed", error_class="invalid_request")
    return row, f


def _run_stream(store: Store, data: st.DataObject) -> None:
    writers = {w: RollupWriter(store, shard=w, endpoint=ENDPOINTS.get, keywords=KEYWORDS)
               for w in ("w1", "w2")}
    # w1 reads the tasks of each write-back; w2 knows the tasks it claimed, as a worker
    # does (and reads those of discarded attempts only)
    held: dict[tuple[int, str], ClaimedTask] = {}

    def w2(tx: Tx, written: list[Written]) -> None:
        writers["w2"].record(tx, written, writers["w2"].tasks(tx, written, held.get))
    observers = {"w1": writers["w1"].record, "w2": w2}
    stale: list[Finish] = []
    for _round in range(5):
        claimed = store.claim(20, lease_ms=0, worker_id="w")
        held.update(((t.id, t.lease_token), t) for t in claimed)
        batch = stale
        stale = []
        for t in claimed:
            kind = data.draw(st.sampled_from(["ok", "ok", "invalid", "error", "fail",
                                              "uncalled", "lost"]), label="kind")
            _row, f = _attempt(data, t.attempt, "ok" if kind == "lost" else kind)
            f.id, f.lease_token = t.id, t.lease_token
            (stale if kind == "lost" else batch).append(f)
        if not batch:
            if not claimed:
                break
            continue
        order = data.draw(st.permutations(batch), label="order")
        while order:
            size = data.draw(st.integers(1, len(order)), label="flush size")
            shard = data.draw(st.sampled_from(sorted(writers)), label="shard")
            store.finish(order[:size], worker_id=shard, observe=observers[shard])
            order = order[size:]


def _recompute(store: Store) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Every figure, per (resolution, bucket, prompt, model, endpoint), from task_attempt
    alone (and the task's config for the inline prompt's key)."""
    out: dict[tuple[Any, ...], dict[str, Any]] = defaultdict(lambda: {
        "attempts": 0, "tasks": 0, "calls": 0, "retries": 0, "discarded": 0,
        "fallbacks": 0, "parsed": 0, "conforming": 0, "completeness": [], "latency": [],
        "input_tokens": 0, "input_tokens_or_estimate": 0, "output_tokens": 0, "cost": None,
        "watch_n": 0,
        "watched": defaultdict(int), "parse_mix": defaultdict(int),
        "error_mix": defaultdict(int), "outcomes": defaultdict(int)})
    inline = template_key(TEMPLATE)
    for a in rows(store, "SELECT * FROM task_attempt"):
        prompt = a["prompt_version"] or inline
        for res in SPANS:
            e = out[(res, bucket_of(a["started_at"], res), prompt, a["model"] or "",
                     a["endpoint"] or "")]
            e["attempts"] += 1
            e["outcomes"][a["outcome"]] += 1
            e["tasks"] += a["outcome"] in ("succeeded", "failed", "dead", "resolved")
            e["retries"] += a["outcome"] == "retry"
            e["discarded"] += a["outcome"] == "discarded"
            e["fallbacks"] += a["routed_from"] is not None
            if a["error_class"]:
                e["error_mix"][a["error_class"]] += 1
            if a["prompt_sha256"] is None:
                continue
            e["calls"] += 1
            e["latency"].append(a["latency_ms"])
            e["input_tokens"] += a["input_tokens"] or 0
            e["input_tokens_or_estimate"] += a["input_tokens"] if a["input_tokens"] is not \
                None else a["estimated_tokens"] or 0
            e["output_tokens"] += a["output_tokens"] or 0
            ep = ENDPOINTS[a["endpoint"]]
            if ep.cost_input_per_1k or ep.cost_output_per_1k:
                e["cost"] = (e["cost"] or 0.0) + ep.cost(a["input_tokens"] or 0,
                                                         a["output_tokens"] or 0)
            if a["parse_status"] is None:
                continue
            e["parsed"] += 1
            e["parse_mix"][a["parse_status"]] += 1
            e["completeness"].append(a["completeness"])
            if a["parse_status"] in ("valid", "repaired", "coerced", "filled_fallback"):
                e["conforming"] += 1
                if a["outcome"] == "discarded":  # not delivered: its values not watched
                    continue
                value = orjson.loads(a["raw_output"])
                e["watch_n"] += 1
                if value.get("label") in ("yes", "no"):
                    e["watched"][f"label={value['label']}"] += 1
                for tag in sorted(set(value.get("tags", [])) & {"a", "b"}):
                    e["watched"][f"tags.[]={tag}"] += 1
                if "refund" in value.get("note", "").lower():
                    e["watched"]["keyword:refund"] += 1
    return out


def _stored(store: Store) -> dict[tuple[Any, ...], Rollup]:
    merged: dict[tuple[Any, ...], Rollup] = {}
    for res in SPANS:
        for r in QualityStore(store).rows(res, since=0):
            k = (r.resolution, r.bucket, r.prompt, r.model, r.endpoint)
            one = Rollup.from_row(r.values)
            merged[k] = merged[k].merge(one) if k in merged else one
    return merged


@settings(max_examples=12, deadline=None, derandomize=True,
          phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.too_slow])
@given(data=st.data())
def test_rollups_equal_a_recomputation_from_task_attempt(store: Store,
                                                         data: st.DataObject) -> None:
    _wipe(store)
    _submit(store, data.draw(st.integers(1, 8), label="tasks"))
    _run_stream(store, data)
    expected = _recompute(store)
    stored = _stored(store)
    assert sorted(stored) == sorted(expected)
    for k, e in expected.items():
        got = stored[k]
        for name in ("attempts", "tasks", "calls", "retries", "discarded", "fallbacks",
                     "parsed", "conforming", "input_tokens", "input_tokens_or_estimate",
                     "output_tokens", "watch_n"):
            assert getattr(got, name) == e[name], (k, name)
        for name in ("watched", "parse_mix", "error_mix", "outcomes"):
            assert getattr(got, name) == dict(e[name]), (k, name)
        assert got.completeness_n == len(e["completeness"])
        assert got.completeness_sum == pytest.approx(sum(e["completeness"]))
        assert got.cost == pytest.approx(e["cost"])
        assert got.latency_sum == pytest.approx(sum(e["latency"]))
        fresh = DDSketch(LATENCY_ACCURACY)
        for v in e["latency"]:
            fresh.add(v)
        for q in (0.5, 0.95, 0.99):
            if e["latency"]:
                assert got.quantile(q) == pytest.approx(fresh.get_quantile_value(q))
                exact = sorted(e["latency"])[int(q * (len(e["latency"]) - 1))]
                assert abs(got.quantile(q) - exact) <= LATENCY_ACCURACY * exact * 1.0001
            else:
                assert got.quantile(q) is None
