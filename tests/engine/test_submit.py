"""Submitting task files (idempotent, all-or-nothing, precise refusals) and exporting
results in every format, through the ``lockgate`` command line."""

from __future__ import annotations

import contextlib
import csv
import io
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from typer.testing import CliRunner, Result

import lockgate.app as app_module
from helpers import check_openai_batch_line, wait_for
from lockgate.app import Lockgate
from lockgate.cli import app
from lockgate.errors import SpecError, StoreError
from lockgate.results import TaskResult
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import TaskSpec, parse_task
from lockgate.store import Store, SubmitReport
from lockgate.store.store import new_task

from .support import (
    PROSE_TEMPLATE,
    SYSTEM,
    clean_env,
    expected_label,
    lockgate_cmd,
    read_jsonl,
    rows,
    run_worker,
    scalar,
    status_counts,
    task,
    tasks,
    text_for,
    write_jsonl,
)


def lockgate(*args: str | Path) -> Result:
    """Run the ``lockgate`` command in this process."""
    return CliRunner().invoke(app, [str(a) for a in args], catch_exceptions=False)


def submitted(result: Result) -> tuple[int, int]:
    """(submitted, already present) from the submit command's summary line."""
    m = re.search(r"([\d,]+) submitted, ([\d,]+) already present", result.stderr)
    assert m, result.stderr
    return int(m[1].replace(",", "")), int(m[2].replace(",", ""))


def task_count(store: Store) -> int:
    return int(scalar(store, "SELECT COUNT(*) FROM task"))


# -- idempotency ------------------------------------------------------------------------

def test_submitting_a_file_twice_inserts_nothing_the_second_time(
        db_url: str, store: Store, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "claims.jsonl", tasks(40))
    first = lockgate("submit", path, "--db", db_url)
    assert first.exit_code == 0, first.output
    assert submitted(first) == (40, 0)
    before = rows(store, "SELECT id, task_id, version, updated_at FROM task ORDER BY id")
    second = lockgate("submit", path, "--db", db_url)
    assert second.exit_code == 0, second.output
    assert submitted(second) == (0, 40)
    assert rows(store, "SELECT id, task_id, version, updated_at FROM task ORDER BY id") == before
    assert {r["batch_id"] for r in rows(store, "SELECT DISTINCT batch_id FROM task")} == {
        "claims"}, "the batch id defaults to the file's stem"


def test_a_repeated_task_id_inside_one_file_is_inserted_once(
        db_url: str, store: Store, tmp_path: Path) -> None:
    """A line repeated as it is: one task. The same id with another task is refused
    (tests/engine/test_intake_review_3.py): the second line's input was dropped."""
    lines = [task("dup", "first"), task("other"), task("dup", "first")]
    result = lockgate("submit", write_jsonl(tmp_path / "f.jsonl", lines), "--db", db_url)
    assert result.exit_code == 0, result.output
    assert submitted(result) == (2, 1)
    (dup,) = rows(store, "SELECT input_data FROM task WHERE task_id = 'dup'")
    assert orjson.loads(dup["input_data"]) == {"text": "first"}


def test_concurrent_submits_in_threads_insert_each_task_once(
        db_url: str, store: Store, tmp_path: Path) -> None:
    n, k = 1200, 4
    path = write_jsonl(tmp_path / "same.jsonl", tasks(n))
    barrier = threading.Barrier(k)
    inserted: list[int] = []
    errors: list[BaseException] = []

    def submit() -> None:
        lg = Lockgate(db_url, migrate=False)
        try:
            barrier.wait(timeout=30)
            inserted.append(lg.submit_file(path).inserted)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            lg.close()

    threads = [threading.Thread(target=submit) for _ in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert sum(inserted) == n
    assert task_count(store) == n


@pytest.mark.slow
def test_two_processes_submitting_one_file_insert_each_task_once(
        db_url: str, store: Store, tmp_path: Path) -> None:
    n = 1500
    path = write_jsonl(tmp_path / "big.jsonl", tasks(n))
    procs = [subprocess.Popen(lockgate_cmd("submit", str(path)), cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=clean_env(LOCKGATE_DATABASE_URL=db_url))
             for _ in range(2)]
    outs = [p.communicate(timeout=180) for p in procs]
    errs = [e.decode(errors="replace") for _o, e in outs]
    assert [p.returncode for p in procs] == [0, 0], errs
    counts = [re.search(r"([\d,]+) submitted, ([\d,]+) already present", e) for e in errs]
    assert all(counts), errs
    ins = [int(m[1].replace(",", "")) for m in counts if m]
    dup = [int(m[2].replace(",", "")) for m in counts if m]
    assert sum(ins) == n and [i + d for i, d in zip(ins, dup, strict=True)] == [n, n]
    assert task_count(store) == n
    assert scalar(store, "SELECT COUNT(DISTINCT task_id) FROM task") == n


# -- refusals ---------------------------------------------------------------------------


BAD_LINES: list[tuple[Any, str, str]] = [
    # (line content, field named, words of the reason)
    (task("t-bad-temp", model={"temperature": 5}), "model_config.temperature",
     "less than or equal to 2"),
    ({k: v for k, v in task("t-no-model").items() if k != "model_config"}, "model_config",
     "is required"),
    ({**task("t-typo"), "retry_polcy": {}}, "retry_polcy", "not a known field"),
    (task("t-extra-input") | {"input_data": {"text": "x", "y": 1}},
     "input_data", "not used by the template"),
    ({**task("t-neg"), "retry_policy": {"max_retries": -1}}, "retry_policy.max_retries",
     "greater than or equal to 0"),
    ({**task("t-stop"), "retry_policy": {"stop_on": ["bogus"]}}, "retry_policy.stop_on[0]",
     "rate_limited"),
    ("{not json", "", "not valid JSON"),
    (orjson.dumps(task("t-deep") | {"input_data": {"text": "x", "deep": "DEEP"}}).decode()
     .replace('"DEEP"', "[" * 300 + "1" + "]" * 300), "input_data", "nested too deeply"),
    (task("t-model", model={"model": "other"}), "model_config.model",
     "set by lockgate itself"),
    (task("t-stream", model={"stream": True}), "model_config.stream",
     "streaming is not supported"),
    (task("t-misspelt", model={"temprature": 0.1}), "model_config.temprature",
     "did you mean 'temperature'"),
    (task("gate:u1:d1:candidate:7"), "task_id", "reserved for the release gate"),
    (task("t-planted", batch_id="gate:u1:d1:candidate"), "batch_id",
     "reserved for the release gate"),
    (task("t-huge") | {"input_data": {"text": "x" * (9 << 20)}}, "input_data",
     "a task's input may hold at most"),
]
BAD_IDS = ["range", "missing", "unknown", "placeholder", "negative", "stop-on", "json",
           "deep", "reserved-model", "reserved-stream", "misspelt", "gate-task-id",
           "gate-batch-id", "huge"]

for _missing in ("delivery_rule", "retry_policy"):  # all six meta-fields are required
    BAD_LINES.append(({k: v for k, v in task("t-no-" + _missing).items() if k != _missing},
                      _missing, "is required"))
    BAD_IDS.append(f"missing-{_missing}")


@pytest.mark.parametrize("bad,field,reason", BAD_LINES, ids=BAD_IDS)
def test_a_bad_line_is_refused_with_line_field_and_reason(
        db_url: str, store: Store, tmp_path: Path, bad: Any, field: str, reason: str) -> None:
    lines = [*tasks(2), bad, *tasks(2, prefix="u")]
    result = lockgate("submit", write_jsonl(tmp_path / "f.jsonl", lines), "--db", db_url)
    assert result.exit_code == 2, result.output
    err = " ".join(result.stderr.split())
    assert "line 3" in err
    if field:
        assert f"field '{field}'" in err
    assert reason in err
    assert "nothing was submitted" in err
    assert task_count(store) == 0, "a file with a bad line must submit nothing"


def test_skip_invalid_submits_the_good_lines_and_writes_rejects(
        db_url: str, store: Store, tmp_path: Path) -> None:
    good = tasks(5)
    lines: list[Any] = [good[0], task("bad-1", model={"temperature": 9}), good[1], good[2],
                        "[1, 2]", good[3], good[4]]
    path = write_jsonl(tmp_path / "mixed.jsonl", lines)
    result = lockgate("submit", path, "--db", db_url, "--skip-invalid")
    assert result.exit_code == 0, result.output
    assert submitted(result) == (5, 0)
    assert {r["task_id"] for r in rows(store, "SELECT task_id FROM task")} == {
        t["task_id"] for t in good}
    rejects = read_jsonl(tmp_path / "mixed.rejects.jsonl")
    assert [(r["line"], r["field"]) for r in rejects] == [
        (2, "model_config.temperature"), (5, None)]
    assert "less than or equal to 2" in rejects[0]["error"]
    assert "expected a JSON object" in rejects[1]["error"]
    assert orjson.loads(rejects[0]["raw"])["task_id"] == "bad-1"

    own = tmp_path / "elsewhere.jsonl"
    again = lockgate("submit", path, "--db", db_url, "--skip-invalid", "--rejects", own)
    assert again.exit_code == 0, again.output
    assert submitted(again) == (0, 5)
    assert len(read_jsonl(own)) == 2


def test_a_batch_named_in_the_task_lines_can_be_exported(
        db_url: str, store: Store, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "file.jsonl", [t | {"batch_id": "custom"} for t in tasks(3)])
    assert lockgate("submit", path, "--db", db_url).exit_code == 0
    assert set(store.status().batches) == {"custom"}
    result = lockgate("export", "custom", "--db", db_url)
    assert result.exit_code == 0, result.stderr
    assert [r["task_id"] for r in map(orjson.loads, result.stdout.splitlines())] == [
        t["task_id"] for t in tasks(3)]


# -- OpenAI batch format in and out -------------------------------------------------------

def openai_line(custom_id: str, text: str, *, json_mode: bool = True) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "sim-small", "temperature": 0, "messages": [
        {"role": "system", "content": SYSTEM.replace("{{", "{").replace("}}", "}")},
        {"role": "user", "content": f"<input>\n{text}\n</input>"}]}
    if json_mode:
        body["response_format"] = {"type": "json_object"}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": body}


def test_openai_batch_format_in_and_out(db_url: str, store: Store, simulator: SimulatorProcess,
                                        tmp_path: Path) -> None:
    lines = [openai_line(f"req-{i}", text_for(i)) for i in range(6)]
    lines.append(openai_line("req-text", "please refund", json_mode=False))
    path = write_jsonl(tmp_path / "requests.jsonl", lines)
    result = lockgate("submit", path, "--db", db_url, "--input-format", "openai-batch",
                      "--batch", "oa")
    assert result.exit_code == 0, result.output
    assert submitted(result) == (7, 0)
    run_worker(store, concurrency=8)
    assert status_counts(store) == {"SUCCEEDED": 7}

    out = tmp_path / "out.jsonl"
    exported = lockgate("export", "oa", "--db", db_url, "--format", "openai-batch", "-o", out)
    assert exported.exit_code == 0, exported.output
    by_id = {r["custom_id"]: r for r in read_jsonl(out)}
    assert set(by_id) == {line["custom_id"] for line in lines}
    for i in range(6):
        line = by_id[f"req-{i}"]
        check_openai_batch_line(line)
        assert line["error"] is None
        resp = line["response"]
        assert resp["status_code"] == 200
        content = resp["body"]["choices"][0]["message"]["content"]
        assert orjson.loads(content) == {"label": expected_label(text_for(i))}
        usage = resp["body"]["usage"]
        assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    text_reply = by_id["req-text"]["response"]["body"]["choices"][0]["message"]["content"]
    assert orjson.loads(text_reply) == {"label": "yes"}, "text mode returns the reply as is"
    # Braces in OpenAI messages are literal text, not placeholders.
    snap = scalar(store, "SELECT prompt_snapshot FROM task_attempt LIMIT 1")
    assert '{\\"label\\": \\"yes\\"}' in snap


def test_openai_batch_bad_line_names_its_field(db_url: str, store: Store,
                                               tmp_path: Path) -> None:
    bad = openai_line("req-1", "x") | {"method": "GET"}
    path = write_jsonl(tmp_path / "r.jsonl", [openai_line("req-0", "y"), bad])
    result = lockgate("submit", path, "--db", db_url, "--input-format", "openai-batch")
    assert result.exit_code == 2
    err = " ".join(result.stderr.split())
    assert "line 2, field 'method'" in err and "must be POST" in err
    assert task_count(store) == 0


# -- export with precise errors -------------------------------------------------------------

def _mixed_outcomes(db_url: str, store: Store, simulator: SimulatorProcess,
                    tmp_path: Path) -> None:
    simulator.configure(strict_models=True)
    lines = [
        task("ok-refund", "please refund"),
        task("ok-parcel", "where is my parcel"),
        task("fail-model", "x", model={"name": "no-such-model"}),
        task("fail-prose", "some text", template=PROSE_TEMPLATE,
             delivery={"on_invalid": "fail"}),
        task("dead-prose", "more text", template=PROSE_TEMPLATE,
             retry={"max_retries": 1, "base_delay_ms": 0, "jitter": 0}),
    ]
    result = lockgate("submit", write_jsonl(tmp_path / "mixed.jsonl", lines), "--db", db_url)
    assert result.exit_code == 0, result.output
    run_worker(store, concurrency=8)
    assert status_counts(store) == {"SUCCEEDED": 2, "FAILED": 2, "DEAD": 1}


def test_export_jsonl_and_csv_give_the_precise_error_of_each_task(
        db_url: str, store: Store, simulator: SimulatorProcess, tmp_path: Path) -> None:
    _mixed_outcomes(db_url, store, simulator, tmp_path)
    out = tmp_path / "results.jsonl"
    result = lockgate("export", "mixed", "--db", db_url, "-o", out)
    assert result.exit_code == 0, result.output
    assert "exported 5 task(s)" in result.stderr
    by_id = {r["task_id"]: r for r in read_jsonl(out)}
    assert by_id["ok-refund"]["result"] == {"label": "yes"}
    assert by_id["ok-parcel"]["result"] == {"label": "no"}
    assert by_id["ok-refund"]["error"] is None
    model_err = by_id["fail-model"]["error"]
    assert by_id["fail-model"]["status"] == "FAILED"
    assert model_err["class"] == "invalid_request"
    assert "HTTP 404" in model_err["message"] and "no-such-model" in model_err["message"]
    prose = by_id["fail-prose"]
    assert (prose["status"], prose["error"]["class"]) == ("FAILED", "invalid_output")
    assert "no_json_found" in prose["error"]["message"]
    assert prose["attempts"] == 1, "on_invalid=fail does not retry"
    dead = by_id["dead-prose"]
    assert (dead["status"], dead["error"]["class"], dead["attempts"]) == (
        "DEAD", "invalid_output", 2)

    result = lockgate("export", "mixed", "--db", db_url, "--format", "csv")
    assert result.exit_code == 0, result.output
    table = {r["task_id"]: r for r in csv.DictReader(io.StringIO(result.stdout))}
    assert set(table) == set(by_id)
    assert table["fail-model"]["error_class"] == "invalid_request"
    assert "HTTP 404" in table["fail-model"]["error_message"]
    assert table["dead-prose"]["status"] == "DEAD"
    assert orjson.loads(table["ok-refund"]["result"]) == {"label": "yes"}
    assert table["ok-refund"]["error_class"] == ""

    result = lockgate("export", "mixed", "--db", db_url, "--format", "openai-batch")
    assert result.exit_code == 0, result.output
    lines = [orjson.loads(x) for x in result.stdout.splitlines()]
    for line in lines:
        check_openai_batch_line(line)
    assert len({line["id"] for line in lines}) == len(lines)
    oa = {r["custom_id"]: r for r in lines}
    # an HTTP error is written as OpenAI writes it: the status and the provider's error
    # body in the response, no lockgate error
    model = oa["fail-model"]
    assert model["error"] is None and model["response"]["status_code"] == 404
    assert model["response"]["body"]["error"]["code"] == "model_not_found"
    assert model["response"]["request_id"].startswith("req_")
    ok = oa["ok-refund"]["response"]
    assert ok["status_code"] == 200 and ok["request_id"].startswith("req_")
    body = ok["body"]  # as the provider returned it
    assert body["id"].startswith("chatcmpl-") and isinstance(body["created"], int)
    assert body["system_fingerprint"] == "fp_lockgate_sim"
    assert body["choices"][0]["logprobs"] is None
    assert orjson.loads(body["choices"][0]["message"]["content"]) == {"label": "yes"}
    assert oa["dead-prose"]["response"]["status_code"] == 200  # what the model said


def test_an_export_cut_off_leaves_the_previous_file_whole(
        db_url: str, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``export -o FILE`` wrote into FILE as it read: cut off (Ctrl-C, the database
    lost), it left a shorter file ending on a whole line, a complete export to look
    at, over the previous one."""
    store.submit([parse_task(t) for t in tasks(50)], batch_id="b")
    out = tmp_path / "b.jsonl"
    assert lockgate("export", "b", "--db", db_url, "-o", out).exit_code == 0
    before = out.read_bytes()
    assert before.count(b"\n") == 50
    results = Lockgate.results

    def cut_off(self: Lockgate, batch_id: str | None = None) -> Iterator[TaskResult]:
        rows = results(self, batch_id)
        with contextlib.closing(rows):  # type: ignore[type-var]
            for i, r in enumerate(rows):
                if i == 20:
                    raise StoreError("the database went away", transient=True)
                yield r
    monkeypatch.setattr(Lockgate, "results", cut_off)
    result = lockgate("export", "b", "--db", db_url, "-o", out)
    assert result.exit_code == 2 and "went away" in result.stderr
    assert out.read_bytes() == before
    assert not list(tmp_path.glob("*.part"))  # nothing left over


def test_an_export_over_a_file_keeps_its_mode_and_writes_through_a_link(
        db_url: str, store: Store, tmp_path: Path) -> None:
    """The export is renamed over the file: the file's mode stays (results kept 0600
    stay private), and a link to the file stays a link to the new export."""
    store.submit([parse_task(t) for t in tasks(5)], batch_id="b")
    out = tmp_path / "private.jsonl"
    out.write_text("old\n")
    out.chmod(0o600)
    link = tmp_path / "latest.jsonl"
    link.symlink_to(out)
    assert lockgate("export", "b", "--db", db_url, "-o", out).exit_code == 0
    assert out.stat().st_mode & 0o777 == 0o600 and out.read_text().count("\n") == 5
    assert lockgate("export", "b", "--db", db_url, "-o", link).exit_code == 0
    assert link.is_symlink() and link.resolve() == out
    assert out.stat().st_mode & 0o777 == 0o600 and out.read_text().count("\n") == 5


def test_export_of_an_unknown_batch_or_format_is_refused(db_url: str) -> None:
    result = lockgate("export", "nope", "--db", db_url)
    assert result.exit_code == 2
    assert "no batch 'nope'" in result.stderr
    result = lockgate("export", "nope", "--db", db_url, "--format", "xml")
    assert result.exit_code == 2
    assert "--format must be one of" in result.stderr


def test_concurrent_submits_sharing_configs_in_crossing_order_both_succeed(
        db_url: str, store: Store) -> None:
    """Two submissions of different tasks that use the same two configs (prompt
    templates) in opposite orders. The generators meet at a barrier after each one's
    first config is inserted, which forces the crossing every time (on SQLite the
    second submission waits for the first, so the barrier just times out)."""
    x, y = {"temperature": 0.1}, {"temperature": 0.9}
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []
    reports: list[SubmitReport] = []

    def specs(first: dict[str, Any], second: dict[str, Any], name: str) -> Iterator[TaskSpec]:
        yield parse_task(task(f"{name}-1", model=first))
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=1.5)
        yield parse_task(task(f"{name}-2", model=second))
        yield parse_task(task(f"{name}-3", model=first))

    def submit(first: dict[str, Any], second: dict[str, Any], name: str) -> None:
        s = Store(db_url, pool_size=1)
        try:
            reports.append(s.submit(specs(first, second, name), batch_id=name))
        except BaseException as exc:  # re-raised below
            errors.append(exc)
        finally:
            s.close()

    threads = [threading.Thread(target=submit, args=(x, y, "a")),
               threading.Thread(target=submit, args=(y, x, "b"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    assert sorted(r.inserted for r in reports) == [3, 3]
    assert task_count(store) == 6
    assert scalar(store, "SELECT COUNT(*) FROM task_config") == 2


def test_a_line_over_what_the_database_can_store_is_refused_at_submit(
        db_url: str, store: Store, tmp_path: Path) -> None:
    """MySQL/MariaDB bound a statement by ``max_allowed_packet``: an input that could not
    be written back with its trace is refused at submit, naming the line, not found out
    at the first write-back."""
    limit = store.max_input_bytes()
    big = task("t-big") | {"input_data": {"text": "y" * (limit - 100)}}
    over = task("t-over") | {"input_data": {"text": "y" * (limit + 1)}}
    ok = lockgate("submit", write_jsonl(tmp_path / "ok.jsonl", [big]), "--db", db_url)
    assert ok.exit_code == 0, ok.output
    bad = lockgate("submit", write_jsonl(tmp_path / "over.jsonl", [*tasks(2), over]),
                   "--db", db_url)
    assert bad.exit_code == 2
    assert "line 3, field 'input_data'" in " ".join(bad.stderr.split())
    assert task_count(store) == 1


def test_a_submit_commits_as_it_goes_and_an_interrupted_one_is_completed_by_a_rerun(
        db_url: str, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tasks become claimable chunk by chunk while a submit runs (workers need not wait
    for a whole file); a submit that dies half-way leaves its batch marked incomplete,
    and running it again completes it without duplicates."""
    monkeypatch.setattr("lockgate.store.store.SUBMIT_FIRST_CHUNK_ROWS", 10)
    monkeypatch.setattr(store.dialect, "submit_chunk_rows", 10)
    seen_mid_submit: list[int] = []

    def specs(fail_at: int | None) -> Iterator[TaskSpec]:
        for i, t in enumerate(tasks(35)):
            if i == 25:  # two chunks are in: another session sees them, claimable
                seen_mid_submit.append(len(store.claim(100, lease_ms=1, worker_id="peek")))
            if i == fail_at:
                raise KeyboardInterrupt  # the submitting process is stopped
            yield parse_task(t)

    with pytest.raises(KeyboardInterrupt):
        store.submit(specs(fail_at=30), batch_id="b")
    # The first chunk at least; the second may still be being written then.
    assert seen_mid_submit in ([10], [20])
    assert task_count(store) == 30
    assert scalar(store, "SELECT complete FROM batch WHERE id = 'b'") == 0
    report = store.submit(specs(fail_at=None), batch_id="b")
    assert (report.inserted, report.duplicates) == (5, 30)
    assert task_count(store) == 35
    assert scalar(store, "SELECT complete FROM batch WHERE id = 'b'") == 1


def test_an_interrupted_submit_says_how_to_complete_its_batch(
        db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C during ``lockgate submit`` said only ``interrupted``."""
    def stopped(*args: object, progress: Any = None, **kwargs: object) -> SubmitReport:
        progress(2)  # a chunk is in (interrupted before one: "nothing was submitted")
        raise KeyboardInterrupt
    monkeypatch.setattr(Lockgate, "submit_file", stopped)
    result = lockgate("submit", write_jsonl(tmp_path / "f.jsonl", tasks(3)), "--db", db_url)
    assert result.exit_code == 130
    assert "run the same command again to complete it" in " ".join(result.stderr.split())


def test_resubmitting_under_another_batch_names_where_the_tasks_are(
        db_url: str, store: Store, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "f.jsonl", tasks(3))
    assert lockgate("submit", path, "--db", db_url, "--batch", "first").exit_code == 0
    again = lockgate("submit", path, "--db", db_url, "--batch", "second",
                     "--window", "02:00-03:30")
    assert again.exit_code == 0, again.output
    err = " ".join(again.stderr.split())
    assert "0 submitted, 3 already present" in err
    assert "3 task id(s) already belong to another batch (3 in batch 'first')" in err
    assert "batch 'second' was not created" in err
    assert [r["id"] for r in rows(store, "SELECT id FROM batch")] == ["first"]


# -- when tasks become claimable ---------------------------------------------------------

def _peeking(monkeypatch: pytest.MonkeyPatch, store: Store, at: int,
             seen: list[int]) -> None:
    """Count, while the file is being read, the tasks another session could claim."""
    read = app_module.read_tasks

    def peek(*args: Any, **kwargs: Any) -> Iterator[Any]:
        for i, row in enumerate(read(*args, **kwargs)):
            if i == at:
                seen.append(len(store.claim(100, lease_ms=1, worker_id="peek")))
            yield row

    monkeypatch.setattr(app_module, "read_tasks", peek)


def _small_chunks(monkeypatch: pytest.MonkeyPatch, store: Store, lg: Lockgate) -> None:
    monkeypatch.setattr("lockgate.store.store.SUBMIT_FIRST_CHUNK_ROWS", 10)
    monkeypatch.setattr(store.dialect, "submit_chunk_rows", 10)
    monkeypatch.setattr(lg.store.dialect, "submit_chunk_rows", 10)


@pytest.mark.parametrize("on_bad_line", ["keep", "cancel"])
def test_a_streamed_submit_stopped_by_a_bad_line_names_the_batches_its_lines_went_to(
        db_url: str, store: Store, tmp_path: Path, on_bad_line: str) -> None:
    """Without a batch named, lines that name their own batches: the message named the
    file's default batch, which got no task, and with ``cancel`` told to retry it."""
    good = [{**t, "batch_id": "alpha" if i % 2 else "beta"} for i, t in enumerate(tasks(6))]
    bad = task("t-bad", model={"temperature": 9})
    path = write_jsonl(tmp_path / "mixed.jsonl", [*good, bad])
    with Lockgate(db_url, migrate=False) as lg:
        with pytest.raises(SpecError) as refused:
            lg.submit_file(path, stream=True,
                           on_bad_line=on_bad_line)  # type: ignore[arg-type]
        message = " ".join(str(refused.value).split())
        assert "batches 'alpha', 'beta' are marked incomplete" in message, message
        assert "'mixed'" not in message, message
        if on_bad_line == "cancel":
            assert "tasks retry --batch alpha --status CANCELLED" in message, message
        assert {"alpha", "beta"} <= set(lg.status().incomplete_batches)


def test_a_streamed_submit_makes_tasks_claimable_as_it_reads_and_a_bad_line_stops_it(
        db_url: str, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``stream``: chunks are claimable before the file is read to its end; a bad line
    stops the submit with the tasks before it kept and the batch incomplete, and the
    file, fixed, submitted again completes the batch, every task once."""
    good = tasks(35)
    bad = task("t-bad", model={"temperature": 9})
    path = write_jsonl(tmp_path / "f.jsonl", [*good[:30], bad, *good[30:]])
    with Lockgate(db_url, migrate=False) as lg:
        _small_chunks(monkeypatch, store, lg)
        seen: list[int] = []
        _peeking(monkeypatch, store, 25, seen)
        with pytest.raises(SpecError) as refused:
            lg.submit_file(path, batch_id="b", stream=True)
        assert seen and seen[0] >= 10, seen
        message = " ".join(str(refused.value).split())
        assert "line 31" in message and "model_config.temperature" in message
        assert "the 30 task(s) before it are submitted" in message
        assert "batch 'b' is marked incomplete" in message
        assert task_count(store) == 30
        assert lg.status().incomplete_batches == ["b"]
        path = write_jsonl(tmp_path / "f.jsonl", good)
        report = lg.submit_file(path, batch_id="b", stream=True)
        assert (report.inserted, report.duplicates) == (5, 30)
        assert lg.status().incomplete_batches == []
    assert scalar(store, "SELECT COUNT(DISTINCT task_id) FROM task") == task_count(store) == 35


@pytest.mark.parametrize("existing", [False, True], ids=["new-batch", "existing-batch"])
def test_without_stream_a_bad_line_late_in_a_file_leaves_the_batch_as_it_was(
        db_url: str, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        existing: bool) -> None:
    """Past several chunks' worth of good lines, a bad line still refuses the file: no
    task of it is written, and the batch is left as it was (or not made)."""
    with Lockgate(db_url, migrate=False) as lg:
        if existing:
            lg.submit_file(write_jsonl(tmp_path / "first.jsonl", tasks(3, prefix="e")),
                           batch_id="b")
        _small_chunks(monkeypatch, store, lg)
        bad = task("t-bad", model={"temperature": 9})
        path = write_jsonl(tmp_path / "f.jsonl", [*tasks(30), bad, *tasks(5, prefix="u")])
        with pytest.raises(SpecError, match=r"1 bad line.*nothing was submitted"):
            lg.submit_file(path, batch_id="b")
        assert task_count(store) == (3 if existing else 0)
        assert [r["id"] for r in rows(store, "SELECT id FROM batch")] == (
            ["b"] if existing else [])
        assert lg.status().incomplete_batches == []
        report = lg.submit_file(write_jsonl(tmp_path / "f.jsonl", tasks(35)), batch_id="b")
        assert (report.inserted, report.duplicates) == (35, 0)


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_submit_killed_mid_file_is_completed_by_a_rerun_every_task_once(
        db_url: str, store: Store, tmp_path: Path, stream: bool) -> None:
    """``kill -9`` of a submitting process half-way: its batch is marked incomplete in
    ``status``; the same command run again completes it, every task exactly once."""
    n = 60_000
    path = write_jsonl(tmp_path / "big.jsonl", tasks(n))
    cmd = lockgate_cmd("submit", str(path), "--batch", "big",
                       *(["--stream"] if stream else []))
    env = clean_env(LOCKGATE_DATABASE_URL=db_url)
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)
    try:
        # Whole: the batch row is committed (incomplete) when writing starts; stream:
        # tasks are committed as they are read.
        started = ("SELECT COUNT(*) FROM task" if stream
                   else "SELECT COUNT(*) FROM batch WHERE id = 'big' AND complete = 0")
        wait_for(lambda: scalar(store, started) or proc.poll() is not None,
                 "the submit to start writing", timeout=120, interval=0.005)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -9, "the submit finished before it could be killed"
    assert scalar(store, "SELECT complete FROM batch WHERE id = 'big'") == 0
    with Lockgate(db_url, migrate=False) as lg:
        assert lg.status().incomplete_batches == ["big"]
    before = task_count(store)
    assert before < n
    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, env=env, timeout=300)
    assert again.returncode == 0, again.stderr.decode(errors="replace")
    m = re.search(r"([\d,]+) submitted, ([\d,]+) already present", again.stderr.decode())
    assert m, again.stderr
    assert int(m[1].replace(",", "")) + int(m[2].replace(",", "")) == n
    assert int(m[2].replace(",", "")) == before
    assert task_count(store) == n
    assert scalar(store, "SELECT COUNT(DISTINCT task_id) FROM task") == n
    assert scalar(store, "SELECT complete FROM batch WHERE id = 'big'") == 1


def test_a_streamed_submit_stopped_by_a_bad_line_can_cancel_what_it_wrote(
        db_url: str, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--on-bad-line cancel``: the tasks the stopped submit wrote are cancelled; the
    batch's tasks from an earlier submit are not touched."""
    with Lockgate(db_url, migrate=False) as lg:
        lg.submit_file(write_jsonl(tmp_path / "first.jsonl", tasks(3, prefix="e")),
                       batch_id="b")
        time.sleep(0.01)  # the earlier tasks are older than the streamed submit
        _small_chunks(monkeypatch, store, lg)
        bad = task("t-bad", model={"temperature": 9})
        path = write_jsonl(tmp_path / "f.jsonl", [*tasks(30), bad, *tasks(5, prefix="u")])
        result = lockgate("submit", path, "--db", db_url, "--batch", "b", "--stream",
                          "--on-bad-line", "cancel")
        assert result.exit_code == 2, result.output
        err = " ".join(result.stderr.split())
        assert "line 31" in err and "30 task(s) it had submitted" in err, err
        assert status_counts(store) == {"PENDING": 3, "CANCELLED": 30}
        assert all(r["task_id"].startswith("e-") for r in rows(
            store, "SELECT task_id FROM task WHERE status = 'PENDING'"))
        assert lg.status().incomplete_batches == ["b"]
    refused = lockgate("submit", path, "--db", db_url, "--on-bad-line", "cancel")
    assert refused.exit_code == 2 and "--on-bad-line goes with --stream" in refused.stderr


def test_inputs_ids_and_metadata_with_copy_s_special_characters_are_stored_as_given(
        db_url: str, store: Store, tmp_path: Path) -> None:
    """PostgreSQL's COPY text format gives backslash, tab, newline and carriage return a
    meaning: every value must come back as it was submitted, on every backend, on the
    first submit and on one that meets existing ids."""
    odd = "a\\b\tc\nd\re \\N \\. é😀 \\\\t"
    lines = [task(f"id\\{i}\\N", f"{odd}{i}", metadata={"note": odd, "n": i},
                  priority=i % 3) for i in range(5)]
    path = write_jsonl(tmp_path / "odd.jsonl", lines[:3])
    with Lockgate(db_url, migrate=False) as lg:
        lg.submit_file(path, batch_id="odd\\b")
        report = lg.submit_file(write_jsonl(path, lines), batch_id="odd\\b")
        assert (report.inserted, report.duplicates) == (2, 3)
        got = {r["task_id"]: r for r in rows(
            store, "SELECT task_id, batch_id, input_data, metadata, priority FROM task")}
    assert sorted(got) == sorted(t["task_id"] for t in lines)
    for t in lines:
        row = got[t["task_id"]]
        assert orjson.loads(row["input_data"]) == t["input_data"]
        assert orjson.loads(row["metadata"]) == t["metadata"]
        assert (row["batch_id"], row["priority"]) == ("odd\\b", t["priority"])


def _stopped_after(specs: list[TaskSpec], n: int) -> Iterator[TaskSpec]:
    """``specs`` until ``n`` are given, then the error a bad line raises (the submit
    stops there, as one killed would, its chunks before committed)."""
    yield from specs[:n]
    raise SpecError("stopped (test)")


def test_an_interrupted_submit_keeps_its_batch_incomplete_whatever_else_completes(
        db_url: str, store: Store, tmp_path: Path) -> None:
    """Shards of one batch from several files (or machines): one interrupted, another
    finished. The finished one marked the batch complete, hiding the 29,000 tasks the
    other never wrote; each submit is tracked on its own now."""
    a, b = str(tmp_path / "shard-a.jsonl"), str(tmp_path / "shard-b.jsonl")
    shard_a = [parse_task(t) for t in tasks(40, prefix="a")]
    with pytest.raises(SpecError):
        store.submit(_stopped_after(shard_a, 15), batch_id="nightly", source=a)
    report = store.submit([parse_task(t) for t in tasks(10, prefix="b")],
                          batch_id="nightly", source=b)
    assert report.inserted == 10
    with Lockgate(db_url, migrate=False) as lg:
        st = lg.status()
        assert st.incomplete_batches == ["nightly"]
        (where,) = st.unfinished_submits["nightly"]
        assert where.startswith(f"{a} on ")
        # The same submit run again (here the file finished) completes the batch.
        again = store.submit(shard_a, batch_id="nightly", source=a)
        assert (again.inserted, again.duplicates) == (40 - 15, 15)
        st = lg.status()
        assert (st.incomplete_batches, st.unfinished_submits) == ([], {})


def test_batches_the_lines_name_stay_incomplete_while_their_submit_is_unfinished(
        db_url: str, store: Store, tmp_path: Path) -> None:
    """Lines naming their own batch, submitted without one: an interrupted submit left
    the batch holding the tasks marked complete (only the file's batch was tracked)."""
    lines = [parse_task({**t, "batch_id": "nightly"}) for t in tasks(20)]
    source = str(tmp_path / "lines.jsonl")
    with pytest.raises(SpecError):
        store.submit(_stopped_after(lines, 5), batch_id="lines", source=source)
    with Lockgate(db_url, migrate=False) as lg:
        assert "nightly" in lg.status().incomplete_batches
        store.submit(lines, batch_id="lines", source=source)
        assert lg.status().incomplete_batches == []


def test_a_submit_is_told_only_the_ids_it_inserted(
        store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a streamed submit cancels when a bad line stops it is the ids it was told it
    wrote, at the ``created_at`` of its chunks. It was told every id of a chunk, those
    another submit had written included; when that submit wrote them in the same
    millisecond as one of its chunks (seen under load), it cancelled the other's task."""
    store.submit([parse_task(t) for t in tasks(3, prefix="b")], batch_id="b")
    told: list[tuple[list[str], int]] = []
    mine = [new_task(parse_task(t)) for t in [*tasks(2, prefix="a"), *tasks(3, prefix="b")]]
    store.submit_rows(iter(mine), batch_id="a",
                      written=lambda ids, at: told.append((ids, at)))
    assert sorted(i for ids, _at in told for i in ids) == ["a-00000", "a-00001"]


def test_a_stopped_streamed_submit_cancels_only_the_tasks_it_wrote(
        db_url: str, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--on-bad-line cancel`` while another submit writes to the same batch: the
    stopped submit cancelled every task of the batch created since it started, the
    other submit's included; it cancels the tasks it inserted, and no others."""
    fifo = tmp_path / "a.jsonl"
    os.mkfifo(fifo)
    mine = tasks(30, prefix="a")
    theirs = [parse_task(t) for t in tasks(10, prefix="b")]
    # The same id as one of this file's lines, written first by the other submit.
    theirs.append(parse_task(tasks(31, prefix="a")[30]))
    mine.append(tasks(31, prefix="a")[30])

    def feed() -> None:
        with fifo.open("wb") as f:
            for t in mine[:20]:
                f.write(orjson.dumps(t) + b"\n")
            f.flush()
            # The first chunk (10 rows here) is committed alone, at once.
            wait_for(lambda: scalar(store, "SELECT COUNT(*) FROM task") >= 10,
                     "the first chunk committed", timeout=60)
            store.submit(theirs, batch_id="b", source=str(tmp_path / "b.jsonl"))
            for t in [*mine[20:], task("t-bad", model={"temperature": 9})]:
                f.write(orjson.dumps(t) + b"\n")

    with Lockgate(db_url, migrate=False) as lg:
        _small_chunks(monkeypatch, store, lg)
        writer = threading.Thread(target=feed)
        writer.start()
        result = lockgate("submit", fifo, "--db", db_url, "--batch", "b", "--stream",
                          "--on-bad-line", "cancel")
        writer.join(60)
    assert result.exit_code == 2, result.output
    assert "30 task(s) it had submitted" in " ".join(result.stderr.split())
    pending = {r["task_id"] for r in rows(
        store, "SELECT task_id FROM task WHERE status = 'PENDING'")}
    assert pending == {t.task_id for t in theirs}
    assert status_counts(store) == {"PENDING": 11, "CANCELLED": 30}
