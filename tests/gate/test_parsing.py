"""Pure parts of the registry and gate: comparisons and scorers, binding settings,
references, the spec's reference form, dataset files, template files, version content."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lockgate.errors import ConfigError, SpecError
from lockgate.gate.binding import (
    BindingSettings,
    Comparison,
    parse_comparison,
    parse_threshold,
    settings_from,
)
from lockgate.gate.compare import Comparator, load_scorer
from lockgate.gate.metrics import Sample, compute
from lockgate.registry.content import diff, make_content, read_json_option, read_template
from lockgate.registry.datasets import read_items
from lockgate.registry.refs import PromptRef, check_label, parse_ref
from lockgate.spec import parse_task

from .support import DELIVERY, MODEL


def scorer_len_match(expected: Any, actual: Any, input: Any) -> bool:
    """A user scorer: the answer's text has the expected length."""
    return len(actual["text"]) == expected


def scorer_score(expected: Any, actual: Any, input: Any) -> float:
    return 0.5 if actual == expected else 0.49


def scorer_bad(expected: Any, actual: Any, input: Any) -> str:
    return "yes"


# -- comparisons -----------------------------------------------------------------------------

def test_exact_label_and_fields_comparisons() -> None:
    exact = Comparator(Comparison())
    assert exact({"a": 1, "b": [2]}, {"b": [2], "a": 1}).match
    assert not exact({"a": 1}, {"a": 1, "b": 2}).match
    label = Comparator(Comparison(kind="label", field="label"))
    s = label("yes", {"label": "yes", "why": "x"})
    assert (s.match, s.predicted, s.truth) == (True, "yes", "yes")
    assert label({"label": "no"}, {"label": "no"}).truth == "no"
    assert not label("yes", {"other": "yes"}).match
    assert not Comparator(Comparison(kind="label", field="label"))("Yes", {"label": "yes"}).match
    assert Comparator(Comparison(kind="label", field="label", ignore_case=True))(
        "Yes", {"label": "yes"}).match
    fields = Comparator(Comparison(kind="fields", fields=("category", "emotion")))
    assert fields({"category": "refund", "emotion": 3},
                  {"category": "refund", "emotion": 3, "summary": "…"}).match
    assert not fields({"category": "refund", "emotion": 3},
                      {"category": "refund", "emotion": "3"}).match
    assert not fields("refund", {"category": "refund"}).match


def test_ignore_case_folds_text_at_any_depth() -> None:
    # Only a top-level string was folded: exact and fields comparisons of objects stayed
    # case-sensitive under --ignore-case.
    for spec in (Comparison(ignore_case=True),
                 Comparison(kind="fields", fields=("answer", "tags"), ignore_case=True)):
        c = Comparator(spec)
        assert c({"answer": "b", "tags": ["X", {"k": "Yes"}]},
                 {"answer": "B", "tags": ["x", {"k": "yes"}]}).match
        assert not c({"answer": "b", "tags": []}, {"answer": "c", "tags": []}).match
    # Keys are names: {"A": 1} is not {"a": 1}.
    assert not Comparator(Comparison(ignore_case=True))({"A": 1}, {"a": 1}).match
    assert not Comparator(Comparison())({"answer": "b"}, {"answer": "B"}).match


@pytest.mark.parametrize(("expected", "actual"), [
    ({"ok": True}, {"ok": 1}), ({"ok": False}, {"ok": 0}), (True, 1), ([0, 1], [False, True]),
    ({"a": {"b": [True]}}, {"a": {"b": [1.0]}}),
])
def test_a_boolean_is_never_a_number(expected: Any, actual: Any) -> None:
    # Python's == took true for 1: an answer of 1 where true was expected scored a match.
    for kind in ("exact", "label"):
        spec = Comparison(kind="label", field="ok") if kind == "label" else Comparison()
        got = actual if kind == "exact" else {"ok": actual}
        assert not Comparator(spec)(expected, got).match
    assert Comparator(Comparison())({"n": 1}, {"n": 1.0}).match  # one JSON number


def test_a_boolean_positive_label_counts_booleans_only() -> None:
    samples = [Sample("MATCH", predicted=True, truth=True),
               Sample("MISMATCH", predicted=1, truth=False)]
    m = compute(samples, positive=True)
    assert (m["counts"]["tp"], m["counts"]["fp"]) == (1, 0)


def test_scorers_are_imported_by_path_and_must_return_bool_or_number() -> None:
    here = __name__
    c = Comparator(Comparison(kind="scorer", scorer=f"{here}:scorer_len_match"))
    assert c(3, {"text": "abc"}).match and not c(2, {"text": "abc"}).match
    num = Comparator(Comparison(kind="scorer", scorer=f"{here}.scorer_score"))
    assert num(1, 1).match and not num(1, 2).match
    with pytest.raises(TypeError, match="return a bool"):
        Comparator(Comparison(kind="scorer", scorer=f"{here}:scorer_bad"))(1, 1)
    for bad in ("nope_module_x:f", f"{here}:missing", "justonename", f"{here}:MODEL"):
        with pytest.raises(ConfigError):
            load_scorer(bad)


# -- binding settings --------------------------------------------------------------------------

def test_threshold_and_comparison_strings() -> None:
    t = parse_threshold(" latency_p95_ms < 2000 ")
    assert (t.metric, t.op, t.value) == ("latency_p95_ms", "<", 2000.0)
    for bad in ("accuracy", "acc>=0.9", "accuracy=>0.9", "accuracy>=x"):
        with pytest.raises(ConfigError):
            parse_threshold(bad)
    assert parse_comparison("fields:a, b").fields == ("a", "b")
    assert parse_comparison("label:answer").field == "answer"
    for bad in ("label", "label:", "fields:", "fuzzy", "exact:x"):
        with pytest.raises(ConfigError):
            parse_comparison(bad)


def test_binding_settings_refuse_what_cannot_be_computed() -> None:
    with pytest.raises(ConfigError, match="positive label"):
        settings_from({"thresholds": [{"metric": "recall", "op": ">=", "value": 0.5}],
                       "comparison": {"kind": "label", "field": "l"}})
    with pytest.raises(ConfigError, match="label comparison"):
        settings_from({"thresholds": [{"metric": "f1", "op": ">=", "value": 0.5}],
                       "positive_label": "yes"})
    with pytest.raises(ConfigError, match="prices"):
        settings_from({"thresholds": [{"metric": "cost_per_item", "op": "<=", "value": 1}]})
    with pytest.raises(ConfigError, match="thresholds"):
        settings_from({"thresholds": []})
    ok = settings_from({"thresholds": [{"metric": "f1", "op": ">=", "value": 0.5}],
                        "positive_label": "yes",
                        "comparison": {"kind": "label", "field": "l"}})
    assert BindingSettings.model_validate(ok.model_dump(mode="json")) == ok


def test_non_finite_values_are_refused_where_they_are_given() -> None:
    # An infinite threshold was stored as null in the binding, and every worker that
    # ran the gate then failed on the frozen snapshot.
    with pytest.raises(ConfigError, match="finite"):
        parse_threshold("latency_p95_ms<1e999")
    base = {"thresholds": [{"metric": "accuracy", "op": ">=", "value": 0.9}]}
    for bad, where in [
            ({"thresholds": [{"metric": "accuracy", "op": ">=", "value": float("nan")}]},
             "thresholds.0.value"),
            ({**base, "non_inferiority": {"margin": float("inf")}}, "non_inferiority.margin"),
            ({**base, "prices": {"input_per_mtok": float("inf"), "output_per_mtok": 1}},
             "prices.input_per_mtok")]:
        with pytest.raises(ConfigError, match=where.replace(".", r"\.")):
            settings_from(bad)


# -- references ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "ref"), [
    ("complaints", PromptRef("complaints")),
    ("complaints@3", PromptRef("complaints", version=3)),
    ("complaints@canary", PromptRef("complaints", label="canary")),
    ("a.b-c_d@production", PromptRef("a.b-c_d", label="production")),
])
def test_references(text: str, ref: PromptRef) -> None:
    assert parse_ref(text) == ref
    assert str(parse_ref(text)) == text
    assert ref.pointer is None if ref.label in (None, "production") else ref.label


def test_a_v_and_a_number_is_a_version_never_a_label() -> None:
    # A label "v3" meant version 1 (its target) to the workers and version 3 to the
    # API and the command line: it is refused, and NAME@v3 is version 3 everywhere.
    assert parse_ref("complaints@v3") == PromptRef("complaints", version=3)
    assert parse_ref("complaints@V12") == PromptRef("complaints", version=12)
    for label in ("v3", "V3", "v03"):
        with pytest.raises(SpecError, match="reads as a version"):
            check_label(label)
    assert check_label("v3a") == "v3a" and check_label("vnext") == "vnext"


@pytest.mark.parametrize("bad", ["", "@x", "a@", "a@0", "a@03", "a@-x", "a b", "a@b@c",
                                 "a@v0"])
def test_bad_references_are_refused(bad: str) -> None:
    with pytest.raises(SpecError):
        parse_ref(bad)


def test_a_task_may_name_a_registry_prompt_instead_of_a_template() -> None:
    spec = parse_task({"task_id": "t1", "prompt_template": "@registry:complaints@canary",
                       "input_data": {"text": "x"}})
    assert spec.model is None
    doc = spec.config_document()
    assert set(doc) == {"prompt_template", "retry_policy"}
    over = parse_task({"task_id": "t1", "prompt_template": "@registry:complaints",
                       "input_data": {"text": "x"}, "model_config": {"name": "m2"},
                       "delivery_rule": {"required_keys": ["label"]}})
    assert over.config_document()["model_config"] == {"name": "m2"}
    assert over.config_document()["delivery_rule"]["required_keys"] == ("label",)
    with pytest.raises(SpecError, match="field 'model_config': is required"):
        parse_task({"task_id": "t1", "prompt_template": "hello {text}",
                    "input_data": {"text": "x"}})
    with pytest.raises(SpecError, match="registry reference"):
        parse_task({"task_id": "t1", "prompt_template": "@registry:bad name",
                    "input_data": {"text": "x"}})


# -- dataset files -----------------------------------------------------------------------------

def test_jsonl_datasets(tmp_path: Path) -> None:
    p = tmp_path / "d.jsonl"
    p.write_text("\n".join([
        json.dumps({"id": "a", "input": {"text": "x"}, "expected": {"l": "yes"}}),
        "",
        json.dumps({"id": 7, "text": "y", "label": "no"}),
        json.dumps({"text": "z", "expected": [1, 2]}),
    ]))
    items = read_items(p)
    assert [(i.key, i.input, i.expected) for i in items[:2]] == [
        ("a", {"text": "x"}, {"l": "yes"}), ("7", {"text": "y"}, "no")]
    assert len(items[2].key) == 16 and items[2].expected == [1, 2]
    assert items[0].content_hash != items[1].content_hash
    for line, msg in (('{"id": "a", "input": {"t": 1}}', "expected"),
                      ('{"id": "a", "expected": 1}', "input"),
                      ('{"id": true, "t": 1, "expected": 1}', "id"),
                      ('[1]', "JSON object"), ("{", "not valid JSON")):
        (tmp_path / "bad.jsonl").write_text('{"t": 1, "expected": 0}\n' + line)
        with pytest.raises(SpecError, match="line 2") as exc:
            read_items(tmp_path / "bad.jsonl")
        assert msg in str(exc.value)


def test_csv_datasets(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    p.write_text("id,text,lang,label\nr1,refund please,en,yes\nr2,\"where, is it\",en,no\n"
                 ",3 items,en,3\n", encoding="utf-8")
    items = read_items(p)
    assert [(i.key, i.input, i.expected) for i in items[:2]] == [
        ("r1", {"text": "refund please", "lang": "en"}, "yes"),
        ("r2", {"text": "where, is it", "lang": "en"}, "no")]
    assert items[2].expected == 3
    q = tmp_path / "e.csv"
    q.write_text("text,expected.category,expected.emotion\nbroken,quality,4\n")
    (item,) = read_items(q)
    assert item.expected == {"category": "quality", "emotion": 4}
    assert read_items(p, expected_column="lang")[0].expected == "en"
    (tmp_path / "none.csv").write_text("text\nx\n")
    with pytest.raises(SpecError, match="expected"):
        read_items(tmp_path / "none.csv")
    with pytest.raises(SpecError, match="does not exist"):
        read_items(tmp_path / "missing.csv")


# -- templates and version content ---------------------------------------------------------------

def test_template_files(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("[system]\nYou label.\n\n[user]\n<input>\n{text}\n</input>\n")
    assert read_template(tmp_path / "a.txt") == [
        {"role": "system", "content": "You label."},
        {"role": "user", "content": "<input>\n{text}\n</input>"}]
    (tmp_path / "b.txt").write_text("Label this: {text}\n")
    assert read_template(tmp_path / "b.txt") == "Label this: {text}"
    (tmp_path / "c.json").write_text(json.dumps([{"role": "user", "content": "{text}"}]))
    assert read_template(tmp_path / "c.json") == [{"role": "user", "content": "{text}"}]
    (tmp_path / "d.txt").write_text("oops\n[user]\n{text}\n")
    with pytest.raises(SpecError, match="before the first"):
        read_template(tmp_path / "d.txt")
    with pytest.raises(SpecError, match="cannot read"):
        read_template(tmp_path / "missing.txt")


def test_version_content_is_validated_and_content_addressed() -> None:
    a = make_content("Label: {text}", MODEL, DELIVERY)
    b = make_content("Label: {text}", dict(reversed(list(MODEL.items()))), DELIVERY)
    assert a.content_hash == b.content_hash and len(a.content_hash) == 64
    assert make_content("Label: {text}!", MODEL, DELIVERY).content_hash != a.content_hash
    for args, field in ((("", MODEL, DELIVERY), "template"),
                        (("x {a.b}", MODEL, DELIVERY), "prompt_template"),
                        (("@registry:p", MODEL, DELIVERY), "template"),
                        (("x", None, DELIVERY), "model_config"),
                        (("x", {"temperature": 1}, DELIVERY), "model_config"),
                        (("x", MODEL, {"format": "xml"}), "delivery_rule")):
        with pytest.raises(SpecError) as exc:
            make_content(*args)  # type: ignore[arg-type]
        assert exc.value.field is not None and exc.value.field.startswith(field), \
            (args, exc.value.field)


def test_diff_and_json_options(tmp_path: Path) -> None:
    text = diff(("p@1", "a {text}", MODEL, DELIVERY), ("p@2", "b {text}", MODEL, DELIVERY))
    assert "--- p@1" in text and "-a {text}" in text and "+b {text}" in text
    (tmp_path / "m.json").write_text('{"name": "x"}')
    assert read_json_option(f"@{tmp_path / 'm.json'}", "m") == {"name": "x"}
    assert read_json_option(None, "m") is None
    for bad in ("[1]", "{", "@/nonexistent/file"):
        with pytest.raises(SpecError):
            read_json_option(bad, "m")
