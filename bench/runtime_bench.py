"""Prompt-runtime benchmark: parse/repair per output, render+normalise, estimator error.

Run: ``.venv/bin/python bench/runtime_bench.py [--rounds N]``

Prints the corpus figures (usable share, statuses; the second part's classes one by
one), the time per output of ``parse_output`` over the whole corpus (median, p90, p99,
max), the time of ``parse_output`` on hostile outputs (10 MB, 100,000-deep nesting,
surrogates), the time of
``render`` on a short input and on 2 KB inputs (English, Chinese) with each token
estimator, the time to condense a long input, and the calibrated estimator's error
against tiktoken. Timings are per call, single thread, after a warm-up; each table is
the best of three passes (by median), since other processes only slow a pass down.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from lockgate.runtime import build_template, parse_output, render
from lockgate.runtime.tokens import CALIBRATED, default_estimator
from lockgate.runtime.truncate import condense
from lockgate.spec import DeliveryRule, TaskConfig

ROOT = Path(__file__).resolve().parent.parent
#: Each timing table is measured this many times; the pass with the lowest median is
#: shown (other processes on a shared machine only ever make a pass slower).
PASSES = 3
DATA = ROOT / "tests" / "runtime" / "data"


def _load() -> tuple[list[dict[str, Any]], dict[str, DeliveryRule], dict[str, list[str]]]:
    cases: list[dict[str, Any]] = []
    for name in ("corpus.jsonl", "handwritten.jsonl"):
        with (DATA / name).open(encoding="utf-8") as f:
            cases += [json.loads(line) for line in f if line.strip()]
    rules = {k: DeliveryRule.model_validate(v)
             for k, v in json.loads((DATA / "rules.json").read_text("utf-8")).items()}
    texts = json.loads((DATA / "texts.json").read_text("utf-8"))
    return cases, rules, texts


def _quantiles(samples_ns: list[int]) -> dict[str, float]:
    s = sorted(samples_ns)

    def q(p: float) -> float:
        return s[min(len(s) - 1, int(p * len(s)))] / 1000.0

    return {"median": statistics.median(s) / 1000.0, "p90": q(0.90), "p99": q(0.99),
            "max": s[-1] / 1000.0}


def _time_each(fn: Callable[[], Any], rounds: int) -> list[int]:
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        fn()
        out.append(time.perf_counter_ns() - t0)
    return out


#: The corpus's second part: its rules, its classes by kind prefix
#: (tests/runtime/test_corpus.py).
PART_TWO = ("complaint_zh", "log_zh", "verdict", "verdict_keep_cut", "yes_no")
GAP_CLASSES = ("fallback_", "nothing_", "wrapped_", "fullwidth_", "several_", "cut_")


def _corpus_figures(cases: list[dict[str, Any]], rules: dict[str, DeliveryRule]) -> None:
    statuses: Counter[str] = Counter()
    repairable = usable_ok = unusable = unusable_ok = 0
    by_class: dict[str, list[int]] = {}
    for c in cases:
        p = parse_output(c["raw"], rules[c["rule"]])
        statuses[p.status.value] += 1
        e = c["expect"]
        right = p.usable == e["usable"] and p.status.value in e["status"]
        if right and "value" in e:
            right = p.value == e["value"]
        if e["usable"]:
            repairable += 1
            usable_ok += right
        else:
            unusable += 1
            unusable_ok += right
        cls = "part one" if c["rule"] not in PART_TWO else \
            next(g for g in GAP_CLASSES if c["kind"].startswith(g))
        by_class.setdefault(cls, [0, 0])[0] += right
        by_class[cls][1] += 1
    print(f"corpus: {len(cases)} outputs, {repairable} repairable, {unusable} not")
    print(f"  usable and correct after the ladder: {usable_ok}/{repairable} "
          f"= {100.0 * usable_ok / repairable:.2f} %")
    print(f"  unusable with the right status:      {unusable_ok}/{unusable}")
    print("  statuses: " + ", ".join(f"{k} {v}" for k, v in statuses.most_common()))
    print("  agreement by class: " + ", ".join(
        f"{k.rstrip('_')} {ok}/{n}" for k, (ok, n) in by_class.items()))


def _hostile() -> dict[str, str]:
    big = 10 << 20
    return {
        "10 MB chatter": "lorem ipsum " * (big // 12),
        "10 MB valid JSON": '{"answer": "yes", "note": "' + "x" * big + '"}',
        "10 MB cut string": '{"answer": "yes", "note": "' + "x" * big,
        "10 MB of {": "{" * big,
        "100k-deep array": "[" * 100_000 + "]" * 100_000,
        "100k-deep cut objects": '{"a":' * 100_000,
        "400 KB of commas": '{"answer": "yes"' + ", " * (200 << 10),
        "120 KB to repair": "{answer: yes, note: '" + "x, " * (40 << 10) + "'}",
        "surrogates and NUL": '\x00{"answer": "yes", "note": "\ud800\\udc00"}\ud800' * 100,
    }


def _hostile_timing() -> None:
    rule = DeliveryRule.model_validate({
        "schema": {"type": "object", "required": ["answer", "note"],
                   "properties": {"answer": {"enum": ["yes", "no"]},
                                  "note": {"type": "string"}}},
        "fallback_values": {"note": ""}})
    print(f"\nparse_output on hostile outputs (ms, best of {PASSES})")
    for name, raw in _hostile().items():
        times = []
        for _ in range(PASSES):
            t0 = time.perf_counter_ns()
            p = parse_output(raw, rule)
            times.append(time.perf_counter_ns() - t0)
        print(f"  {name:24} {min(times) / 1e6:9.1f}  {p.status.value}")


def _parse_timing(cases: list[dict[str, Any]], rules: dict[str, DeliveryRule],
                  rounds: int) -> None:
    for c in cases:  # warm-up: compile every rule, import json_repair
        parse_output(c["raw"], rules[c["rule"]])
    passes = []
    for _ in range(PASSES):
        samples: list[int] = []
        valid: list[int] = []
        for c in cases:
            rule = rules[c["rule"]]
            raw = c["raw"]
            times = _time_each(lambda raw=raw, rule=rule: parse_output(raw, rule), rounds)
            samples += times
            if c["kind"] == "clean":
                valid += times
        passes.append((_quantiles(samples), _quantiles(valid)))
    all_q, valid_q = min(passes, key=lambda p: p[0]["median"])
    print(f"\nparse_output per output (us), {len(cases)} outputs x {rounds} rounds, "
          f"best of {PASSES} passes")
    print(f"  {'':18} {'median':>8} {'p90':>8} {'p99':>8} {'max':>8}")
    for label, q in (("whole corpus", all_q), ("valid (fast path)", valid_q)):
        print(f"  {label:18} {q['median']:8.1f} {q['p90']:8.1f} {q['p99']:8.1f} {q['max']:8.1f}")


def _config(tokenizer: str | None, max_input_tokens: int | None = None) -> TaskConfig:
    tpl = build_template(
        system="You are a careful analyst of customer feedback.",
        instruction="Classify the sentiment of the review and list its key phrases.",
        output_schema={"sentiment": "positive|negative|neutral", "score": 0.0,
                       "keywords": ["..."]},
        input_fields=["review", "product"])
    model: dict[str, Any] = {"name": "bench", "temperature": 0.2}
    if tokenizer:
        model["tokenizer"] = tokenizer
    if max_input_tokens:
        model["max_input_tokens"] = max_input_tokens
    return TaskConfig.model_validate({
        "prompt_template": [m.model_dump() for m in tpl], "model_config": model,
        "delivery_rule": {"required_keys": ["sentiment"]}, "retry_policy": {}})


def _two_kb(paragraphs: list[str], joiner: str) -> str:
    text = joiner.join(paragraphs * 4)
    return text.encode()[:2048].decode(errors="ignore")


def _variants(base: str, n: int, sentences: list[str]) -> list[str]:
    """``n`` distinct inputs of about ``base``'s size (no cache can help)."""
    out = []
    for i in range(n):
        s = sentences[i % len(sentences)]
        out.append(f"{i} {s} {base}"[: max(len(base), 1)])
    return out


def _render_timing(texts: dict[str, list[str]], rounds: int) -> None:
    en = [s + "." for p in texts["en"] for s in p.split(". ") if s]
    zh = [s + "。" for p in texts["zh"] for s in p.split("。") if s]
    inputs = {
        "short (80 B)": _variants("Great shoes, arrived two days early and fit well! 👍", rounds,
                                  en),
        "2 KB English": _variants(_two_kb(texts["en"], " "), rounds, en),
        "2 KB Chinese": _variants(_two_kb(texts["zh"], ""), rounds, zh),
    }
    print(f"\nrender (normalise + fill + count + hash) per call (us), {rounds} distinct "
          f"inputs, best of {PASSES} passes")
    # A prompt within its budget by bytes (or with none) is estimated; one whose bytes
    # are over it is counted with the default estimator (tiktoken when installed):
    # these budgets are below each prompt's bytes and above its tokens.
    exact_budget = {"short (80 B)": 200, "2 KB English": 1200, "2 KB Chinese": 1200}
    print(f"  {'input':14} {'budget':28} {'estimator used':24} {'median':>8} {'p99':>8}")
    for mode in ("none", "below its bytes", "calibrated"):
        for name, reviews in inputs.items():
            cfg = _config("calibrated" if mode == "calibrated" else None,
                          exact_budget[name] if mode == "below its bytes" else None)
            used = render(cfg, {"review": reviews[0], "product": "Runner 2"}).estimator
            passes = []
            for _ in range(PASSES):
                samples = []
                for review in reviews:
                    data = {"review": review, "product": "Runner 2"}
                    t0 = time.perf_counter_ns()
                    render(cfg, data)
                    samples.append(time.perf_counter_ns() - t0)
                passes.append(_quantiles(samples))
            q = min(passes, key=lambda p: p["median"])
            label = "none (tokenizer calibrated)" if mode == "calibrated" else mode
            print(f"  {name:14} {label:28} {used:24} {q['median']:8.1f} {q['p99']:8.1f}")
    long_text = " ".join(texts["en"] * 3)
    cfg = _config(None, max_input_tokens=400)
    render(cfg, {"review": long_text, "product": "X"})
    q = _quantiles(_time_each(lambda: render(cfg, {"review": long_text, "product": "X"}), 20))
    print(f"  condense {len(long_text.encode()) // 1024} KB English to a 400-token prompt: "
          f"median {q['median'] / 1000:.2f} ms")
    zh = "".join(texts["zh"] * 3)
    q = _quantiles(_time_each(lambda: condense(zh, 300, default_estimator().count), 20))
    print(f"  condense {len(zh.encode()) // 1024} KB Chinese to 300 tokens: "
          f"median {q['median'] / 1000:.2f} ms")


def _estimator_error(cases: list[dict[str, Any]], texts: dict[str, list[str]]) -> None:
    exact = default_estimator()
    if not exact.exact:
        print("\nestimator error: no tiktoken encoding on disk; cannot measure")
        return
    print(f"\ncalibrated estimator vs {exact.name} (relative error per text)")
    groups = {**texts, "model outputs": [c["raw"] for c in cases if len(c["raw"]) > 40]}
    print(f"  {'texts':14} {'n':>4} {'mean':>7} {'mean |e|':>9} {'max |e|':>8}")
    for name, items in groups.items():
        errors = [(CALIBRATED.count(t) - exact.count(t)) / exact.count(t) for t in items]
        print(f"  {name:14} {len(errors):4d} {100 * statistics.mean(errors):6.1f}% "
              f"{100 * statistics.mean(abs(e) for e in errors):8.1f}% "
              f"{100 * max(abs(e) for e in errors):7.1f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=100)
    args = ap.parse_args()
    cases, rules, texts = _load()
    print(f"python {sys.version.split()[0]} on {platform.machine()}, "
          f"{platform.processor() or 'cpu'}; orjson {orjson.__version__}; "
          f"token estimator {default_estimator().name}\n")
    _corpus_figures(cases, rules)
    _parse_timing(cases, rules, max(5, args.rounds // 10))
    _hostile_timing()
    _render_timing(texts, args.rounds * 5)
    _estimator_error(cases, texts)


if __name__ == "__main__":
    main()
