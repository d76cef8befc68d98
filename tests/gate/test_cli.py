"""The registry and gate commands, end to end on a SQLite file."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from lockgate.cli import app
from lockgate.cli.registry import NOT_ACTIVATED
from lockgate.store import Store

from .support import BAD, DELIVERY, GOOD, MEDIOCRE, MODEL, LocalProvider, items, run_worker


def _template_file(path: Path, template: list[dict[str, str]]) -> Path:
    path.write_text("".join(f"[{m['role']}]\n{m['content']}\n" for m in template),
                    encoding="utf-8")
    return path


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[CliRunner, str]:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("LOCKGATE_DATABASE_URL", url)
    return CliRunner(), url


def _ok(runner: CliRunner, *args: str, code: int = 0) -> str:
    res = runner.invoke(app, list(args))
    assert res.exit_code == code, f"{args}: exit {res.exit_code}\n{res.output}"
    return res.output


def test_prompt_dataset_bind_propose_status_rollback(cli: tuple[CliRunner, str],
                                                     tmp_path: Path) -> None:
    runner, url = cli
    v1 = _template_file(tmp_path / "v1.txt", MEDIOCRE)
    v2 = _template_file(tmp_path / "v2.txt", GOOD)
    v3 = _template_file(tmp_path / "v3.txt", BAD)
    out = _ok(runner, "prompt", "create", "p", "--file", str(v1), "--model-config",
              json.dumps(MODEL), "--delivery-rule", json.dumps(DELIVERY), "--tag", "v1.0")
    assert "version 1 is live" in out
    data = tmp_path / "d.jsonl"
    data.write_bytes(b"".join(orjson.dumps(i) + b"\n" for i in items(20)))
    assert "20 items" in _ok(runner, "dataset", "add", "d", str(data))
    csv = tmp_path / "e.csv"
    csv.write_text("id,text,label\n" + "".join(
        f"{i['id']},{i['input']['text']},{i['expected']}\n" for i in items(40, "e")))
    _ok(runner, "dataset", "add", "e", str(csv))
    assert '"e-0000"' in _ok(runner, "dataset", "show", "e", "--json")
    _ok(runner, "bind", "p", "d", "-t", "accuracy>=0.9", "--compare", "label:label")
    _ok(runner, "bind", "p", "e", "-t", "accuracy>=0.9", "-t", "recall>=0.9",
        "--compare", "label:label", "--positive", "yes", "--confidence", "0.8")
    bad = runner.invoke(app, ["bind", "p", "e", "-t", "recall>=0.9"])
    assert bad.exit_code == 2 and "positive label" in bad.output

    good_id = int(_ok(runner, "prompt", "propose", "p", "--file", str(v2)).split()[-1])
    run_worker(Store(url), provider=LocalProvider())
    out = _ok(runner, "gate", "status", str(good_id), "--wait")
    assert "ACTIVATED" in out and "recall" in out
    status = orjson.loads(_ok(runner, "gate", "status", str(good_id), "--json"))
    assert status["status"] == "ACTIVATED"
    assert {r["dataset"]: r["metrics"]["accuracy"] for r in status["runs"]} == \
        {"d": 1.0, "e": 1.0}

    bad_id = int(_ok(runner, "prompt", "propose", "p", "--file", str(v3), "--note",
                     "try").split()[-1])
    run_worker(Store(url), provider=LocalProvider())
    out = _ok(runner, "gate", "status", str(bad_id), "--wait", code=NOT_ACTIVATED)
    assert "REJECTED" in out and "FAIL" in out
    # the same exit status with --json (a CI job gates on it)
    out = _ok(runner, "gate", "status", str(bad_id), "--wait", "--json", code=NOT_ACTIVATED)
    assert orjson.loads(out)["status"] == "REJECTED"
    assert "REJECTED" in _ok(runner, "gate", "list")

    show = _ok(runner, "prompt", "show", "p")
    assert "live v2" in show and "refund|money back|reimburse" in show
    assert "-If the text mentions parcel" in _ok(runner, "prompt", "diff", "p", "3", "2")
    _ok(runner, "prompt", "label", "p", "canary", "3")
    out = _ok(runner, "prompt", "rollback", "p", "--reason", "incident", "--actor", "ops")
    assert "live v2 -> v1" in out
    hist = orjson.loads(_ok(runner, "prompt", "history", "p", "--json"))
    assert [a["action"] for a in hist["audit"]] == [
        "create", "propose", "activate", "propose", "rejected", "label", "rollback"]
    assert hist["audit"][-1]["actor"] == "ops"
    table = _ok(runner, "prompt", "history", "p")
    assert "rollback" in table and "incident" in table
    listed = orjson.loads(_ok(runner, "prompt", "list", "--json"))
    assert [(r["name"], r["live_version"], r["generation"]) for r in listed] == [("p", 1, 3)]
    assert "generation" in _ok(runner, "prompt", "list")
    assert _ok(runner, "dataset", "list").count("revision") == 1


def test_errors_are_short_and_say_what_to_do(cli: tuple[CliRunner, str],
                                             tmp_path: Path) -> None:
    runner, _url = cli
    tpl = _template_file(tmp_path / "t.txt", GOOD)
    res = runner.invoke(app, ["prompt", "create", "p", "--file", str(tpl)])
    assert res.exit_code == 2 and "--model-config is required" in res.output
    _ok(runner, "prompt", "create", "p", "--file", str(tpl), "--model-config",
        json.dumps(MODEL))
    res = runner.invoke(app, ["prompt", "propose", "p", "--file",
                              str(_template_file(tmp_path / "u.txt", BAD))])
    assert res.exit_code == 2 and "lockgate bind p DATASET" in res.output
    res = runner.invoke(app, ["gate", "status", "99"])
    assert res.exit_code == 2 and "no release-gate update 99" in res.output
    res = runner.invoke(app, ["prompt", "rollback", "p"])
    assert res.exit_code == 2 and "no earlier live version" in res.output
    res = runner.invoke(app, ["gate", "cancel", "99"])
    assert res.exit_code == 2
    # every bad value of a binding or a proposal is one line naming it, no traceback
    data = tmp_path / "d.jsonl"
    data.write_bytes(b"".join(orjson.dumps(i) + b"\n" for i in items(5)))
    _ok(runner, "dataset", "add", "d", str(data))
    base = ["bind", "p", "d", "-t", "accuracy>=0.9"]
    for extra, said in [
            (["-t", "accuracy>=1e999"], "finite"), (["--confidence", "1.5"], "confidence"),
            (["--confidence", "0"], "confidence"), (["--min-samples", "-3"], "min_samples"),
            (["--non-inferiority", "-0.1"], "margin"),
            (["--non-inferiority", "0.1", "--non-inferiority-metric", "bogus"], "metric"),
            (["--price-in", "-1"], "input_per_mtok")]:
        res = runner.invoke(app, base + extra)
        assert res.exit_code == 2 and said in res.output, (extra, res.output)
        assert "Traceback" not in res.output and res.output.count("\n") <= 2, res.output
    res = runner.invoke(app, ["prompt", "propose", "p", "--file", str(tpl),
                              "--retry-policy", '{"max_retries": -1}'])
    assert res.exit_code == 2 and "retry_policy.max_retries" in res.output, res.output
