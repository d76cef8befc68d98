"""What the registry refuses from its users, and how it says so: dataset files (ids,
encodings, CSV headers, sizes), tags, labels, thresholds and references; each refusal
is one line naming the file, line, field or flag, and the fix."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner

from lockgate.app import Lockgate
from lockgate.cli import app
from lockgate.errors import ConfigError, NotFound, SpecError, StateConflict
from lockgate.gate.binding import BindingSettings, parse_threshold, settings_from
from lockgate.providers.base import Completion, CompletionRequest
from lockgate.registry.content import make_content, read_template
from lockgate.registry.datasets import read_items
from lockgate.registry.resolver import PromptResolver, load
from lockgate.spec import parse_task
from lockgate.store import Store
from lockgate.store.registry import DatasetItem

from .support import (
    BAD,
    DELIVERY,
    GOOD,
    MEDIOCRE,
    MODEL,
    Env,
    LocalProvider,
    items,
    rows,
    run_worker,
)


def _jsonl(path: Path, lines: list[dict[str, Any]]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    return path


# -- dataset files --------------------------------------------------------------------------

def test_a_repeated_item_id_is_named_with_its_lines(env: Env, tmp_path: Path) -> None:
    lines = items(6)
    lines[4]["id"] = lines[1]["id"]  # file lines 2 and 5
    with pytest.raises(StateConflict, match=r"item id 'i-0001' appears twice in the input "
                                            r"\(lines 2 and 5\): item ids must be unique"):
        env.datasets.add("d", _jsonl(tmp_path / "d.jsonl", lines))
    # without an id column the id is derived from the input: said so, with the lines
    csv = tmp_path / "noid.csv"
    csv.write_text("text,expected\nfirst,yes\nsame,yes\nother,no\nsame,no\n")
    with pytest.raises(StateConflict, match=r"appears twice in the input \(lines 3 and 5\): "
                                            r"the id is derived from the input"):
        env.datasets.add("d", csv)
    with pytest.raises(NotFound):  # nothing was written
        env.datasets.show("d")


def test_a_csv_header_naming_a_column_twice_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "dup.csv"
    f.write_text("id,text,text,expected\na,first,second,y\n")
    with pytest.raises(SpecError, match=r"dup\.csv: column 'text' appears twice in the "
                                        r"header \(line 1\); rename"):
        read_items(f)


def test_expected_column_is_refused_for_a_jsonl_file(tmp_path: Path) -> None:
    f = _jsonl(tmp_path / "d.jsonl", [{"id": "a", "text": "x", "answer": "y", "label": "z"}])
    with pytest.raises(SpecError, match="--expected-column applies to CSV files only"):
        read_items(f, expected_column="answer")
    csv = tmp_path / "d.csv"
    csv.write_text("id,text,answer\na,x,y\n")
    assert [i.expected for i in read_items(csv, expected_column="answer")] == ["y"]


def test_an_item_over_the_database_input_bound_is_refused_before_anything_is_written(
        env: Env, tmp_path: Path) -> None:
    limit = env.store.max_input_bytes()
    # four times the bound: on MariaDB past max_allowed_packet itself (the bound is a
    # quarter of it), where the insert used to fail as if the server were down
    big = {"id": "big", "input": {"text": "x" * (4 * limit + 1024)}, "expected": 1}
    f = _jsonl(tmp_path / "d.jsonl", [*items(1), big])
    with pytest.raises(SpecError, match=rf"^line 2: item 'big' is [0-9,]+ bytes as JSON "
                                        rf".*at most {limit:,} bytes per item"):
        env.datasets.add("d", f)
    with pytest.raises(NotFound):
        env.datasets.show("d")


def _nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def test_a_value_nested_too_deeply_is_refused_naming_line_and_field(
        env: Env, tmp_path: Path) -> None:
    # JSON files may nest 1,024 levels; the encoder that stores an item goes to about 250
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"id": "a", "input": {"text": "x"}, "expected": "y"}\n'
                    '{"id": "b", "input": {"text": "x"}, "expected": ' + _nested(300) + "}\n")
    with pytest.raises(SpecError, match=r"^line 2, field 'expected': item 'b' is nested too "
                                        r"deeply \(more than 250 levels\): flatten it"):
        env.datasets.add("d", deep)
    deep.write_text('{"id": "a", "input": {"text": ' + _nested(260) + '}, "expected": "y"}\n')
    with pytest.raises(SpecError, match=r"^line 1, field 'input': item 'a' is nested too "
                                        r"deeply"):
        env.datasets.add("d", deep)
    nested: Any = []
    for _ in range(299):
        nested = [nested]
    with pytest.raises(SpecError, match=r"^line 2, field 'expected': item 'b' is nested"):
        env.datasets.add("d", [items(1)[0], {"id": "b", "text": "x", "expected": nested}])
    with pytest.raises(NotFound):  # nothing was written
        env.datasets.show("d")
    # up to the limit an item is kept, content hash and all
    deep.write_text('{"id": "a", "input": {"text": "x"}, "expected": ' + _nested(253) + "}\n")
    assert env.datasets.add("d", deep)["added"] == 1
    assert env.datasets.items("d")[0]["expected"] == orjson.loads(_nested(253))


def test_a_value_nested_too_deeply_is_one_error_line_from_the_cli(
        cli: CliRunner, tmp_path: Path) -> None:
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"id": "a", "input": {"text": "x"}, "expected": ' + _nested(300) + "}\n")
    out = _refused(cli, "dataset", "add", "d", str(deep))
    assert "line 1, field 'expected': item 'a' is nested too deeply (more than 250 " \
           "levels)" in out


@pytest.mark.parametrize("key", ["a ", " a", "  a  "])
def test_an_item_id_with_leading_or_trailing_whitespace_is_refused_on_every_backend(
        env: Env, tmp_path: Path, key: str) -> None:
    # MariaDB compares 'a ' and 'a' as one id (a raw duplicate-key error), the others
    # as two
    f = _jsonl(tmp_path / "d.jsonl", [{"id": "a", "text": "x", "expected": "y"},
                                      {"id": key, "text": "x", "expected": "n"}])
    refusal = rf"^line {{}}, field 'id': {re.escape(repr(key))} has leading or trailing " \
              r"whitespace, which some databases ignore when they compare ids: remove it"
    with pytest.raises(SpecError, match=refusal.format(2)):
        env.datasets.add("d", f)
    csv = tmp_path / "d.csv"
    csv.write_text(f"id,text,expected\na,x,y\n{key},x,n\n")
    with pytest.raises(SpecError, match=refusal.format(3)):  # under the header line
        env.datasets.add("d", csv)
    with pytest.raises(SpecError, match=refusal.format(2)):  # the second item
        env.datasets.add("d", [DatasetItem("a", {"text": "x"}, "y"),
                               DatasetItem(key, {"text": "x"}, "n")])
    with pytest.raises(NotFound):
        env.datasets.show("d")
    assert env.datasets.add("d", [{"id": "a", "text": "x", "expected": "y"},
                                  {"id": "a b", "text": "x", "expected": "n"}])["added"] == 2


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    monkeypatch.setenv("LOCKGATE_DATABASE_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    return CliRunner()


def _refused(runner: CliRunner, *args: str) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code == 2, f"{args}: exit {res.exit_code} ({res.exception!r})\n{res.output}"
    assert "Traceback" not in res.output and res.output.count("\n") == 1, res.output
    return res.output


def test_keys_beside_input_are_named_as_not_stored(cli: CliRunner, tmp_path: Path) -> None:
    """They were dropped without a word: a field meant for the template (``context``)
    was missing only when the gate rendered it."""
    path = _jsonl(tmp_path / "d.jsonl", [
        {"id": "a", "input": {"text": "x"}, "expected": "y", "context": "c", "note": "n"},
        {"id": "b", "input": {"text": "z"}, "expected": "y", "context": "d"},
        {"id": "c", "text": "w", "expected": "n"}])
    res = cli.invoke(app, ["dataset", "add", "d", str(path)])
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    assert "not stored, beside 'input': 'context' (2 items), 'note' (1 item)" in said, said
    shown = cli.invoke(app, ["dataset", "show", "d", "--json"])
    assert "context" not in shown.output and '"w"' in shown.output, shown.output
    # a file with nothing beside 'input' gets no note
    clean = _jsonl(tmp_path / "e.jsonl", [{"id": "a", "input": {"text": "x"},
                                           "expected": "y"}])
    res = cli.invoke(app, ["dataset", "add", "e", str(clean)])
    assert res.exit_code == 0 and "not stored" not in res.output, res.output


def test_files_that_are_not_utf8_are_one_error_line_naming_file_and_byte(
        cli: CliRunner, tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_bytes(b"id,text,expected\na,caf\xe9,y\n")
    out = _refused(cli, "dataset", "add", "d", str(tmp_path / "d.csv"))
    assert "d.csv: line 2: not UTF-8 text (byte 0xe9 at byte offset 22): save the file " \
           "as UTF-8 (from Latin-1 or Windows-1252: iconv -f cp1252 -t utf-8)" in out
    (tmp_path / "d.jsonl").write_bytes(b'{"id":"a","input":{"text":"x"},"expected":"y"}\n'
                                       b'{"id":"b","input":{"text":"caf\xe9"},"expected":"y"}\n')
    out = _refused(cli, "dataset", "add", "d", str(tmp_path / "d.jsonl"))
    assert "d.jsonl: line 2: not UTF-8 text (byte 0xe9 at byte offset 77)" in out
    tpl = tmp_path / "t.txt"
    tpl.write_bytes(b"[user]\ncaf\xe9 {text}\n")
    out = _refused(cli, "prompt", "create", "p", "-f", str(tpl), "--model-config",
                   json.dumps(MODEL))
    assert "t.txt: line 2: not UTF-8 text (byte 0xe9 at byte offset 10)" in out
    good = tmp_path / "good.txt"
    good.write_text("[user]\n{text}\n", encoding="utf-8")
    res = cli.invoke(app, ["prompt", "create", "p", "-f", str(good), "--model-config",
                           json.dumps(MODEL)])
    assert res.exit_code == 0, res.output
    out = _refused(cli, "prompt", "propose", "p", "-f", str(tpl))
    assert "t.txt: line 2: not UTF-8 text" in out


# -- prompt versions: templates, tags, labels ---------------------------------------------

def test_a_message_with_an_unknown_role_names_the_role_field_and_the_roles(
        tmp_path: Path) -> None:
    f = tmp_path / "t.json"
    f.write_text('[{"role": "bot", "content": "x"}]')
    with pytest.raises(SpecError, match=r"field 'template\.0\.role': Input should be "
                                        r"'system', 'user', 'assistant' or 'developer'"):
        make_content(read_template(f), MODEL, None)
    with pytest.raises(SpecError, match="must be text or a list of"):
        make_content({"role": "user", "content": "x"}, MODEL, None)


@pytest.mark.parametrize("tag", ["7", "v7", "V12", "production"])
def test_a_tag_that_selects_something_else_is_refused(tag: str) -> None:
    from lockgate.registry.refs import check_tag

    with pytest.raises(SpecError, match=rf"--tag '{tag}' reads as"):
        check_tag(tag)


def test_tags_are_checked_up_front_on_every_backend(env: Env) -> None:
    with pytest.raises(SpecError, match="--tag '7' reads as a version number"):
        env.prompts.create("p", MEDIOCRE, model_config=MODEL, tag="7")
    # the column holds 100 characters: one more is refused before any database sees it
    with pytest.raises(SpecError, match="--tag is 101 characters; a tag may have at most 100"):
        env.prompts.create("p", MEDIOCRE, model_config=MODEL, tag="t" * 101)
    v1 = env.prompts.create("p", MEDIOCRE, model_config=MODEL, delivery_rule=DELIVERY,
                            tag="t" * 100)
    assert env.prompts.version("p", "t" * 100).version == v1.version == 1
    with pytest.raises(SpecError, match="--tag 'v2' reads as a version number"):
        env.prompts.propose("p", GOOD, tag="v2")
    with pytest.raises(SpecError, match="--tag is 150 characters"):
        env.prompts.propose("p", GOOD, tag="u" * 150)
    assert [v.version for v in env.prompts.history("p")["versions"]] == [1]


@pytest.mark.parametrize("label", ["Production", "PRODUCTION", "producTion"])
def test_a_label_that_is_production_in_other_case_is_refused(env: Env, label: str) -> None:
    env.prompts.create("p", MEDIOCRE, model_config=MODEL, delivery_rule=DELIVERY)
    with pytest.raises(SpecError, match=rf"label '{label}' differs from the reserved "
                                        r"'production' only by case"):
        env.prompts.label("p", label, 1)
    assert env.prompts.label("p", "Canary", 1) is None  # case-sensitive, not reserved
    assert env.prompts.registry.prompt("p")["labels"] == {"Canary": 1}


def test_a_tag_named_like_a_label_is_refused(env: Env) -> None:
    # A selector reads a label first: `prompt show p --version stable` showed the
    # label's version 1, never version 2 tagged 'stable'.
    env.setup("p", datasets={"d": 4}, thresholds=["accuracy>=0"])
    env.prompts.label("p", "stable", 1)
    with pytest.raises(StateConflict, match=r"^--tag 'stable' is the name of a label "
                                            r"\(pointing at version 1\), which a version "
                                            r"selector reads first, so this tag could never "
                                            r"select its version: choose another tag$"):
        env.prompts.propose("p", GOOD, tag="stable")
    assert [v.version for v in env.prompts.history("p")["versions"]] == [1]
    assert env.gate.list("p") == []
    # tagging content that is already a version, untagged, is checked too
    env.prompts.propose("p", BAD)
    with pytest.raises(StateConflict, match="--tag 'stable' is the name of a label"):
        env.prompts.propose("p", BAD, tag="stable")
    assert env.prompts.version("p", 2).tag is None
    assert env.prompts.version("p", "stable").version == 1


def test_a_label_named_like_a_tag_is_refused(env: Env) -> None:
    env.setup("p", datasets={"d": 4}, thresholds=["accuracy>=0"])
    proposed = env.prompts.propose("p", GOOD, tag="rc-1")
    with pytest.raises(StateConflict, match=r"^label 'rc-1' is the tag of version 2 of 'p', "
                                            r"which a version selector would no longer find "
                                            r"by its tag: choose another label name$"):
        env.prompts.label("p", "rc-1", 1)
    with pytest.raises(StateConflict, match="label 'rc-1' is the tag of version 2"):
        env.prompts.label("p", "rc-1", proposed.version)  # even pointing at it: labels move
    assert env.prompts.registry.prompt("p")["labels"] == {}
    assert env.prompts.version("p", "rc-1").version == 2


# -- references -----------------------------------------------------------------------------

def test_a_reference_to_a_missing_label_says_label_and_lists_the_labels(
        env: Env, db_url: str) -> None:
    env.prompts.create("p", MEDIOCRE, model_config=MODEL, delivery_rule=DELIVERY,
                       tag="rel-1")
    with pytest.raises(NotFound, match=r"prompt 'p' has no label 'canary' \(it has no "
                                       r"labels\); `lockgate prompt label p canary VERSION`"):
        env.prompts.resolve("p@canary")
    env.prompts.label("p", "beta", 1)
    env.prompts.label("p", "alpha", 1)
    with pytest.raises(NotFound, match=r"no label 'canary' \(its labels: alpha, beta\)"):
        env.prompts.resolve("p@canary")
    # a tag is no label: the worker would not find it, so submit must not accept it
    with pytest.raises(NotFound, match=r"no label 'rel-1' .*'rel-1' is the tag of version "
                                       r"1: pin it as p@1"):
        env.prompts.resolve("p@rel-1")
    missing = r"field 'prompt_template': @registry:p@canary: prompt 'p' has no label 'canary'"
    with Lockgate(db_url, migrate=False) as lg, pytest.raises(SpecError, match=missing):
        lg.submit([{"task_id": "t1", "prompt_template": "@registry:p@canary",
                    "input_data": {"text": "hi"}}])
    assert env.prompts.resolve("p@beta").version == 1


class _Recording(LocalProvider):
    """The local provider, keeping the model and temperature each call was sent with."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, Any]] = []

    async def complete(self, request: CompletionRequest) -> Completion:
        self.sent.append((request.model, request.params.get("temperature")))
        return await super().complete(request)


def test_a_task_may_override_only_the_temperature_of_a_registry_version(
        env: Env, db_url: str, store: Store) -> None:
    env.prompts.create("p", GOOD, model_config={**MODEL, "temperature": 0.2},
                       delivery_rule=DELIVERY)
    task = {"task_id": "t1", "prompt_template": "@registry:p",
            "input_data": {"text": "please refund me"}, "model_config": {"temperature": 0.9}}
    with Lockgate(db_url, migrate=False) as lg:
        lg.submit([task])
    (doc,) = store.configs({rows(store, "SELECT config_hash FROM task")[0]["config_hash"]}
                           ).values()
    assert doc["model_config"] == {"temperature": 0.9}  # the override alone is stored
    config, version = asyncio.run(PromptResolver(store).resolve(load("h", doc)))
    assert (config.model.name, config.model.temperature, version) == ("sim-small", 0.9, "p@1")
    provider = _Recording()
    run_worker(store, gate=False, provider=provider)
    assert provider.sent == [("sim-small", 0.9)]
    (t,) = rows(store, "SELECT t.status, a.model FROM task t JOIN task_attempt a "
                       "ON a.task_pk = t.id")
    assert (t["status"], t["model"]) == ("SUCCEEDED", "sim-small")
    # a bad override value is still refused, naming its field
    bad = r"field 'model_config\.temperature'"
    with Lockgate(db_url, migrate=False) as lg, pytest.raises(SpecError, match=bad):
        lg.submit([{**task, "task_id": "t2", "model_config": {"temperature": 9}}])


# -- thresholds and the positive label ------------------------------------------------------

@pytest.mark.parametrize("text", ["accuracy>=1.5", "accuracy>1", "f1>=1.01", "recall==1.2",
                                  "precision==-0.1", "error_ratio<0", "error_ratio<=-0.5",
                                  "accuracy<=-1"])
def test_a_threshold_no_value_in_0_1_can_meet_is_refused(text: str) -> None:
    with pytest.raises(ConfigError, match=r"lies between 0 and 1, so .* can never be met"):
        parse_threshold(text)


@pytest.mark.parametrize("text", ["accuracy>=1", "accuracy>=0", "error_ratio<=0",
                                  "error_ratio<1.5", "f1==1", "latency_p95_ms<=-5",
                                  "latency_p50_ms>=100000", "cost_per_item>=2",
                                  "tokens_per_item<0"])
def test_reachable_and_unbounded_thresholds_are_kept(text: str) -> None:
    assert parse_threshold(text).metric == text.split("<")[0].split(">")[0].split("=")[0]


def test_a_binding_given_as_objects_is_checked_too_but_a_frozen_one_still_loads(
        env: Env) -> None:
    env.setup(thresholds=["accuracy>=0.5"])
    with pytest.raises(ConfigError, match=r"binding threshold: accuracy lies between 0 and 1"):
        env.gate.bind("p", "p-set", thresholds=[{"metric": "accuracy", "op": ">=",
                                                  "value": 1.5}])
    # a snapshot frozen before the check existed is read back as it was
    frozen = {"thresholds": [{"metric": "accuracy", "op": ">=", "value": 2.0}]}
    assert BindingSettings.model_validate(frozen).thresholds[0].value == 2.0


def test_precision_without_a_positive_label_names_the_option(cli: CliRunner,
                                                             tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        settings_from({"thresholds": [parse_threshold("precision>=0.9")],
                       "comparison": {"kind": "label", "field": "answer"}})
    assert "Value error" not in str(err.value)
    assert "precision needs a positive label" in str(err.value)
    assert "--positive" in str(err.value) and "`positive` argument" in str(err.value)
    tpl = tmp_path / "t.txt"
    tpl.write_text("[user]\n{text}\n")
    data = _jsonl(tmp_path / "d.jsonl", items(4))
    for args in (["prompt", "create", "p", "-f", str(tpl), "--model-config",
                  json.dumps(MODEL)], ["dataset", "add", "d", str(data)]):
        assert cli.invoke(app, args).exit_code == 0
    out = _refused(cli, "bind", "p", "d", "-t", "precision>=0.9", "-t", "recall>=0.9",
                   "--compare", "label:answer")
    assert "precision, recall need a positive label: give the expected value that counts " \
           "as positive with --positive" in out


def test_long_names_of_who_acted_and_long_sources_are_kept_cut_on_every_backend(
        env: Env, store: Store) -> None:
    # PostgreSQL refused an author or actor over 200 characters, and a source path over
    # 1,000 ("value too long for type character varying"), after SQLite took them.
    who = "a" * 300
    env.prompts.create("p", MEDIOCRE, model_config=MODEL, delivery_rule=DELIVERY,
                       author=who)
    env.prompts.label("p", "canary", 1, actor=who, reason="long name")
    trail = env.prompts.registry.audit_trail("p")
    assert {r["actor"] for r in trail if r["actor"]} == {who[:200]}
    source = "/" + "d" * 1200 + "/tasks.jsonl"
    store.submit([parse_task({"task_id": "t1", "prompt_template": "@registry:p",
                              "input_data": {"text": "x"}})], batch_id="b", source=source)
    (b,) = rows(store, "SELECT source, complete FROM batch WHERE id = 'b'")
    assert (b["source"], b["complete"]) == (source[-1000:], 1)
