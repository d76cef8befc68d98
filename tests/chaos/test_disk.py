"""SQLite on a disk that fills up or turns read-only (a small tmpfs of the test's own,
remounted): one clear line (a LockgateError, exit code 2, no traceback), nothing
corrupted (``PRAGMA integrity_check``), and the work goes on once space returns or
the disk is writable again."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

import lockgate
from engine.support import (
    WorkerPool,
    expected_label,
    lockgate_cmd,
    rows,
    scalar,
    status_counts,
    task,
    tasks,
    text_for,
    wait_for,
    write_jsonl,
)
from helpers import clean_env
from lockgate.errors import StoreError
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task
from lockgate.store import Store

from .servers import unavailable

pytestmark = [pytest.mark.chaos, pytest.mark.slow]


class Disk:
    """A tmpfs mounted for one test."""

    def __init__(self, path: Path, size: str) -> None:
        if os.geteuid() != 0:
            unavailable("the disk scenarios mount a tmpfs: they need root")
        path.mkdir()
        self.path = path
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       check=True, capture_output=True)

    def remount(self, *options: str) -> None:
        subprocess.run(["mount", "-o", ",".join(["remount", *options]), str(self.path)],
                       check=True, capture_output=True)

    def fill(self) -> Path:
        """Take every free byte with a file (returned, to delete later)."""
        filler = self.path / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * 65536):
                    pass
        finally:
            os.close(fd)
        return filler

    def close(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], check=False, capture_output=True)


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Disk]:
    d = Disk(tmp_path / "disk", "1m")
    try:
        yield d
    finally:
        d.close()


def integrity(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
    finally:
        conn.close()


def cli(db: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(lockgate_cmd(*args), capture_output=True, text=True, cwd=cwd,
                          env=clean_env(LOCKGATE_DATABASE_URL=db), timeout=120, check=False)


def assert_one_clear_line(done: subprocess.CompletedProcess[str], *words: str) -> str:
    out = (done.stdout + done.stderr).strip().splitlines()
    errors = [line for line in out if line.startswith("error: ")]
    assert done.returncode == 2, out
    assert len(errors) == 1 and "Traceback" not in done.stderr, out
    for w in words:
        assert w in errors[0], errors[0]
    return errors[0]


def test_a_submit_that_fills_the_disk_says_so_and_completes_when_space_returns(
        disk: Disk, tmp_path: Path) -> None:
    path = disk.path / "lockgate.db"
    db = f"sqlite:///{path}"
    _migrate(db)
    # 300 tasks of ~5 KB: more than the 1 MB disk holds.
    file = write_jsonl(tmp_path / "tasks.jsonl", [
        task(f"t-{i:05d}", text_for(i) + " " + "x" * 5000) for i in range(300)])
    done = cli(db, "submit", str(file), "--batch", "b", cwd=tmp_path)
    assert_one_clear_line(done, "disk is full", "Free space",
                          "run the same command again: it completes the batch")
    assert integrity(path) == "ok"
    disk.remount("size=64m")
    with lockgate.connect(db) as lg:  # the same submit again completes the batch
        lg.submit_file(file, batch_id="b")
        assert status_counts(lg.store) == {"PENDING": 300}
        assert scalar(lg.store, "SELECT complete FROM batch WHERE id = 'b'") == 1
    assert integrity(path) == "ok"


def _migrate(db: str) -> None:
    store = Store(db)
    try:
        store.migrate()
    finally:
        store.close()


def test_a_worker_waits_out_a_full_disk_and_finishes(
        disk: Disk, tmp_path: Path, simulator: SimulatorProcess) -> None:
    disk.remount("size=8m")
    path = disk.path / "lockgate.db"
    store = Store(f"sqlite:///{path}")
    store.migrate()
    n = 200
    try:
        store.submit([parse_task(t) for t in tasks(n)], batch_id="b")
        simulator.configure(latency={"kind": "fixed", "mean_ms": 20})
        (tmp_path / "w").mkdir()
        pool = WorkerPool(f"sqlite:///{path}", simulator.url, tmp_path / "w")
        try:
            worker = pool.start(concurrency=8, lease=30.0, log_level="WARNING")
            wait_for(lambda: scalar(store, "SELECT COUNT(*) FROM task WHERE status <> "
                                           "'PENDING'") >= 50, "50 tasks done", timeout=60)
            filler = disk.fill()
            wait_for(lambda: "disk is full" in worker.log(), "the worker to hit the full disk",
                     timeout=60)
            time.sleep(2.5)  # past the flow controller's report period (2 s)
            assert worker.alive(), worker.log()
            filler.unlink()
            assert worker.wait(120) == 0, worker.log()
        finally:
            pool.close()
        log = worker.log()
        assert "Traceback" not in log, log
        assert status_counts(store) == {"SUCCEEDED": n}
        for r in rows(store, "SELECT task_id, result FROM task"):
            i = int(r["task_id"].split("-")[1])
            assert orjson.loads(r["result"]) == {"label": expected_label(text_for(i))}
    finally:
        store.close()
    assert integrity(path) == "ok"


def test_a_read_only_database_is_one_clear_error(disk: Disk, tmp_path: Path) -> None:
    disk.remount("size=8m")
    path = disk.path / "lockgate.db"
    db = f"sqlite:///{path}"
    file = write_jsonl(tmp_path / "tasks.jsonl", tasks(20))
    with lockgate.connect(db) as lg:
        lg.submit_file(file, batch_id="b")
    disk.remount("ro")
    for args in (("submit", str(file), "--batch", "c"), ("status",)):
        assert_one_clear_line(cli(db, *args, cwd=tmp_path), "read-only", "remount")
    store = Store(db)
    try:
        with pytest.raises(StoreError, match="read-only") as caught:
            store.claim(5, lease_ms=1000, worker_id="w")
        assert "\n" not in str(caught.value)
    finally:
        store.close()
    disk.remount("rw")
    with lockgate.connect(db) as lg:
        lg.submit_file(file, batch_id="c")
        assert status_counts(lg.store) == {"PENDING": 20}
    assert integrity(path) == "ok"
