"""What a command that runs no worker and calls no endpoint loads: a fresh interpreter
runs it through the ``lockgate`` entry point and lists its modules. The worker, the
HTTP client (aiohttp), the OpenTelemetry SDK, protobuf and the output pass are left out
of ``submit``, ``status``, ``alerts list`` and ``cleanup``: every command pays its
imports at start, and a streamed submit's first tasks should be claimable within a
second of it starting. alembic is loaded only to migrate a database that is not at the
newest revision."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from lockgate.app import Lockgate

#: Modules only the commands that run workers or make HTTP calls use.
UNUSED = ("aiohttp", "opentelemetry.sdk", "opentelemetry.exporter", "google.protobuf",
          "lockgate.worker", "lockgate.providers", "lockgate.flow.control",
          "lockgate.gate.service", "lockgate.quality.service", "lockgate.quality.webhooks",
          "lockgate.quality.tracing", "lockgate.quality.writer", "multiprocessing",
          # the output pass: dozens of patterns compiled at import, for replies only
          "lockgate.runtime.output", "lockgate.runtime.search")

#: Runs ``lockgate ARGS...`` as the command does, then prints its exit code and modules.
SCRIPT = """\
import sys
import orjson
import lockgate.cli
sys.argv = ["lockgate", *sys.argv[1:]]
code = 0
try:
    lockgate.cli.main()
except SystemExit as exc:
    code = exc.code
print(orjson.dumps({"code": code, "modules": sorted(sys.modules)}).decode())
"""


def _modules(args: list[str], cwd: Path) -> list[str]:
    run = subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True,
                         text=True, timeout=120, cwd=cwd)
    assert run.returncode == 0, run.stderr
    report = orjson.loads(run.stdout.splitlines()[-1])
    assert report["code"] in (0, None), run.stderr
    modules: list[str] = report["modules"]
    return modules


def _loaded(modules: list[str]) -> list[str]:
    return [m for m in modules
            if any(m == u or m.startswith(u + ".") for u in UNUSED)]


@pytest.fixture
def submitted(tmp_path: Path) -> tuple[str, list[str]]:
    """A SQLite database a fresh ``lockgate submit`` wrote 3 tasks into, and the
    modules that submit loaded."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b"".join(orjson.dumps({
        "task_id": f"t{i}", "prompt_template": "{x}", "input_data": {"x": str(i)},
        "model_config": {"name": "m"}, "delivery_rule": {}, "retry_policy": {}}) + b"\n"
        for i in range(3)))
    db = f"sqlite:///{tmp_path / 'lg.db'}"
    return db, _modules(["submit", str(tasks), "--db", db], tmp_path)


def test_submit_loads_no_worker_http_client_or_tracing_sdk(
        submitted: tuple[str, list[str]]) -> None:
    db, modules = submitted
    assert "lockgate.cli" in modules and "lockgate.store" in modules
    assert _loaded(modules) == []
    with Lockgate(db, create=False, migrate=False) as lg:  # the submit did its work
        assert lg.status().batches == {"tasks": {"PENDING": 3}}


@pytest.mark.parametrize("command", [["status"], ["alerts", "list"],
                                     ["cleanup", "--older-than", "1d"]])
def test_commands_without_workers_load_none_of_them_either(
        submitted: tuple[str, list[str]], tmp_path: Path, command: list[str]) -> None:
    db, _ = submitted
    modules = _modules([*command, "--db", db], tmp_path)
    assert _loaded(modules) == []
    # The database is at the newest schema revision already: no migration tool either.
    assert [m for m in modules if m == "alembic" or m.startswith("alembic.")] == []
