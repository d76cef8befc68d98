"""Helpers of the release-gate tests: prompts whose simulated accuracy differs, datasets,
an in-process provider (the simulator's answer function without HTTP), step-wise task
execution through the real execution path, and worker subprocesses.

Nothing here sleeps a fixed time hoping something happened: :func:`wait_for` polls a
condition against a deadline and fails naming what did not happen.
"""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import text

import helpers
from helpers import clean_env, kill_settled, rows, scalar  # noqa: F401  (re-exported)
from lockgate.config import Endpoint, Settings, WorkerSettings
from lockgate.errors import ErrorClass
from lockgate.gate.api import Gate
from lockgate.gate.roles import GateRoles
from lockgate.gate.service import GateService
from lockgate.providers.base import Completion, CompletionRequest, ProviderError
from lockgate.registry.api import Datasets, Prompts
from lockgate.simulator.responder import Responder
from lockgate.spec import load_config
from lockgate.store import Finish, Store
from lockgate.worker import Worker, WorkerStats
from lockgate.worker.execute import attempt_trace, decide, run_attempt

MODEL = {"name": "sim-small", "temperature": 0, "timeout_ms": 20_000}
DELIVERY = {"format": "json", "required_keys": ["label"]}


def yes_no(keywords: str) -> list[dict[str, str]]:
    """A yes/no prompt the simulator follows literally: texts mentioning one of the
    ``|``-separated keywords are labelled yes, all others no."""
    system = ('Reply with JSON like {{"label": "yes"}}.\n'
              "label: one of yes, no\n"
              f"If the text mentions {keywords} then label = yes\n"
              "Otherwise label = no")
    return [{"role": "system", "content": system},
            {"role": "user", "content": "<input>\n{text}\n</input>"}]


#: Three prompts of decreasing quality on :func:`items` (accuracy 1.0, 0.75, 0.25).
GOOD = yes_no("refund|money back|reimburse")
MEDIOCRE = yes_no("refund")
BAD = yes_no("parcel")

_TEXTS = ("order {i}: please refund me", "order {i}: I want my money back",
          "order {i}: where is my parcel", "order {i}: the colour is wrong")
_TRUTH = ("yes", "yes", "no", "no")


def items(n: int, prefix: str = "i") -> list[dict[str, Any]]:
    """``n`` labelled items: a quarter each of refund, money back, parcel, colour."""
    return [{"id": f"{prefix}-{i:04d}", "input": {"text": _TEXTS[i % 4].format(i=i)},
             "expected": _TRUTH[i % 4]} for i in range(n)]


def accuracy_of(template: list[dict[str, str]], n: int) -> float:
    """What the simulator scores ``template`` on :func:`items` (n divisible by 4)."""
    kws = template[0]["content"].split("mentions ")[1].split(" then")[0].split("|")
    hits = 0
    for it in items(n):
        said = "yes" if any(k in it["input"]["text"] for k in kws) else "no"
        hits += said == it["expected"]
    return hits / n


# -- the environment of one test ---------------------------------------------------------

@dataclass
class Env:
    """Registry and gate APIs on one store, and a roles runner for step-wise tests."""

    store: Store
    settings: Settings = field(default_factory=Settings)

    def __post_init__(self) -> None:
        self.prompts = Prompts(self.store, self.settings)
        self.datasets = Datasets(self.store)
        self.gate = Gate(self.store)

    def roles(self, worker_id: str = "test", **kwargs: Any) -> GateRoles:
        return GateRoles(self.store, worker_id=worker_id, **kwargs)

    def setup(self, name: str = "p", *, live: list[dict[str, str]] = MEDIOCRE,
              datasets: dict[str, int] | None = None, **bind: Any) -> None:
        """Prompt ``name`` (v1 = ``live``) with datasets bound under ``bind``."""
        self.prompts.create(name, live, model_config=MODEL, delivery_rule=DELIVERY)
        bind.setdefault("thresholds", ["accuracy>=0.9"])
        bind.setdefault("comparison", "label:label")
        for ds, n in (datasets or {f"{name}-set": 40}).items():
            self.datasets.add(ds, items(n, ds))
            self.gate.bind(name, ds, **bind)

    def live(self, name: str = "p") -> int:
        return int(self.prompts.registry.prompt(name)["live_version"])

    def status(self, update_id: int) -> str:
        return str(self.gate.status(update_id)["status"])


# -- execution -----------------------------------------------------------------------------

class LocalProvider:
    """The simulator's deterministic answers, in process (no HTTP). ``fail`` picks
    inputs answered with a non-retryable error (their tasks end FAILED)."""

    name = "default"

    def __init__(self, fail: Callable[[str], bool] | None = None) -> None:
        self.responder = Responder()
        self.fail = fail
        self.calls = 0

    async def complete(self, request: CompletionRequest) -> Completion:
        self.calls += 1
        if self.fail is not None and self.fail(request.messages[-1]["content"]):
            raise ProviderError(ErrorClass.INVALID_REQUEST, "refused (test)", http_status=400)
        ans = self.responder.answer(request.messages)
        return Completion(content=ans.content, http_status=200, model=request.model,
                          prompt_tokens=ans.prompt_tokens,
                          completion_tokens=ans.completion_tokens)

    async def close(self) -> None:
        return None


def execute(store: Store, *, limit: int = 10_000, provider: LocalProvider | None = None,
            crash: bool = False, worker_id: str = "steps") -> int:
    """Claim up to ``limit`` tasks and run them through ``run_attempt``/``decide`` (the
    one execution path), writing back fenced. With ``crash`` the claims are abandoned
    with an already-expired lease, as a worker killed mid-call leaves them."""
    claimed = store.claim(limit, lease_ms=1 if crash else 60_000, worker_id=worker_id)
    if crash or not claimed:
        if crash and claimed:
            wait_for(lambda: _expired(store, [r.id for r in claimed]), "abandoned leases expire",
                     timeout=5)
        return len(claimed)
    provider = provider or LocalProvider()
    docs = store.configs({r.config_hash for r in claimed})
    ep = Endpoint(name="default", base_url="http://unused.invalid/v1")

    async def run() -> list[Finish]:
        out = []
        for r in claimed:
            config = load_config(docs[r.config_hash])
            started = int(time.time() * 1000)
            res = await run_attempt(config, orjson.loads(r.input_data), ep, provider,
                                    idempotency_key=None, params={})
            d = decide(config, r.attempt, res, random.Random(0))
            out.append(Finish(id=r.id, lease_token=r.lease_token, status=d.status,
                              result=d.result, error_class=str(res.error_class)
                              if res.error_class else None, delay_ms=0,
                              error_message=res.error_message,
                              attempt=attempt_trace(r.attempt, started, res, d.outcome,
                                                    prompt_version=docs[r.config_hash].get(
                                                        "prompt_version"))))
        return out

    store.finish(asyncio.run(run()), worker_id=worker_id)
    return len(claimed)


def _expired(store: Store, ids: list[int]) -> bool:
    with store.engine.connect() as conn:
        now = conn.execute(text(f"SELECT {store.dialect.now}")).scalar_one()
        left = conn.execute(text("SELECT COUNT(*) FROM task WHERE visible_at > :n AND id IN "
                                 f"({','.join(str(int(i)) for i in ids)})"), {"n": now})
        return not left.scalar_one()


def drive(env: Env, update_id: int, *, provider: LocalProvider | None = None,
          max_rounds: int = 200) -> str:
    """Run role steps and task execution in turn until the update is decided."""
    roles = env.roles()
    for _ in range(max_rounds):
        status = env.status(update_id)
        if status not in ("PENDING", "EVALUATING"):
            return status
        roles.advance(update_id, status)
        execute(env.store, provider=provider)
    raise AssertionError(f"update {update_id} undecided after {max_rounds} rounds")


def run_worker(store: Store, *, gate: bool = True, provider: LocalProvider | None = None,
               timeout: float = 120.0, **overrides: Any) -> WorkerStats:
    """A burst worker in this process (gate roles included), with the local provider
    unless ``provider`` is None and ``LOCKGATE_BASE_URL`` points at the simulator."""
    ws = {"concurrency": 64, "lease_s": 10.0, **overrides}
    settings = Settings(worker=WorkerSettings(**ws))
    services = [GateService(store, lease_s=ws["lease_s"], poll_s=0.05, idle_max_s=0.2)] \
        if gate else []
    providers = {"default": provider} if provider is not None else None
    worker = Worker(store, settings, burst=True, services=services,
                    providers=providers)  # type: ignore[arg-type]

    async def main() -> WorkerStats:
        return await asyncio.wait_for(worker.run(), timeout=timeout)

    return asyncio.run(main())


# -- polling and reads ------------------------------------------------------------------------

def peek_store(store: Store) -> Store:
    """A second handle on the same database for reads while workers are frozen: on
    SQLite, lockgate's engine begins every transaction IMMEDIATE (taking the write
    lock), so this one uses a plain engine whose reads never wait for a writer."""
    if store.dialect.name != "sqlite":
        return store
    from sqlalchemy import create_engine

    return Store(engine=create_engine(store.engine.url, connect_args={"timeout": 60}))


def wait_for(predicate: Callable[[], Any], what: str, timeout: float = 60.0,
             interval: float = 0.02) -> Any:
    """:func:`helpers.wait_for` with the gate tests' longer default (role steps)."""
    return helpers.wait_for(predicate, what, timeout, interval)


def decision_figures(status: dict[str, Any]) -> dict[str, Any]:
    """The decision without timing-dependent metrics: what two runs on one snapshot
    must agree on."""
    d = status["decision"] or {}
    keep = ("accuracy", "precision", "recall", "f1", "error_ratio", "counts")
    out: dict[str, Any] = {"status": status["status"]}
    for ds in d.get("datasets", []):
        m = ds["metrics"] or {}
        counts = {k: v for k, v in (m.get("counts") or {}).items()
                  if k not in ("input_tokens", "output_tokens", "latencies")}
        out[ds["dataset"]] = {
            "passed": ds["passed"],
            "metrics": {k: (counts if k == "counts" else m.get(k)) for k in keep},
            "checks": [(c["metric"], c["op"], c["threshold"], c["value"], c["passed"])
                       for c in ds["checks"]],
        }
    return out


# -- worker processes -------------------------------------------------------------------------

@dataclass
class Proc:
    """One ``lockgate worker`` subprocess with its log file."""

    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@dataclass
class Workers:
    """Starts ``lockgate worker`` subprocesses; kills the ones left when the test ends."""

    db_url: str
    base_url: str
    log_dir: Path
    procs: list[Proc] = field(default_factory=list)

    #: Quick polling, so that tests wait on work, not on idle back-off.
    config: str = ("[worker]\npoll_max_s = 0.2\n"
                   "[gate]\npoll_s = 0.05\nidle_max_s = 0.3\n")

    def start(self, *, burst: bool = False, lease: float = 2.0, concurrency: int = 16,
              extra: Sequence[str] = ()) -> Proc:
        (self.log_dir / "lockgate.toml").write_text(self.config)
        args = [sys.executable, "-m", "lockgate.cli", "worker", "--lease", str(lease),
                "--concurrency", str(concurrency), "--grace", "5", *extra]
        if burst:
            args.append("--burst")
        log_path = self.log_dir / f"worker-{len(self.procs)}.log"
        with log_path.open("wb") as log:
            popen = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, cwd=self.log_dir,
                                     env=clean_env(LOCKGATE_DATABASE_URL=self.db_url,
                                                   LOCKGATE_BASE_URL=self.base_url))
        proc = Proc(popen, log_path)
        self.procs.append(proc)
        return proc

    def logs(self) -> str:
        return "\n".join(f"--- worker {p.pid}:\n{p.log()[-3000:]}" for p in self.procs)

    def catch(self, store: Store, victim: Callable[[], Proc | None], what: str, *,
              timeout: float = 120.0) -> Proc:
        """Freeze every live worker (SIGSTOP), look at the rows, and kill -9 the process
        ``victim()`` names, in exactly the state it was seen in; otherwise thaw them all
        (SIGCONT), let them run a few milliseconds, and look again. Returns once the
        database has closed the victim's sessions (see :func:`helpers.kill_settled`)."""
        deadline = time.monotonic() + timeout
        while True:
            live = [p for p in self.procs if p.alive()]
            for p in live:
                p.popen.send_signal(signal.SIGSTOP)
            chosen = None
            try:
                chosen = victim()
                if chosen is not None:
                    kill_settled(chosen.popen, store)
                    return chosen
            finally:
                for p in live:
                    if p is not chosen and p.alive():
                        p.popen.send_signal(signal.SIGCONT)
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout:g}s waiting for: {what}\n"
                                     + self.logs())
            time.sleep(0.004)

    def stop_all(self, timeout: float = 30.0) -> None:
        """SIGTERM every live worker and wait for it."""
        for p in self.procs:
            if p.alive():
                p.popen.terminate()
        for p in self.procs:
            try:
                p.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait()
                raise AssertionError(f"worker {p.pid} ignored SIGTERM\n{self.logs()}") \
                    from None

    def close(self) -> None:
        for p in self.procs:
            if p.alive():
                p.popen.kill()
            p.popen.wait()


class BackgroundWorker:
    """A real worker on its own event loop in a thread of this process (starts in
    milliseconds, unlike a subprocess), stopped gracefully by :meth:`stop`."""

    def __init__(self, store: Store, *, gate: bool = False,
                 endpoints: tuple[Endpoint, ...] = (), **overrides: Any) -> None:
        import threading

        ws = {"concurrency": 32, "lease_s": 10.0, "poll_max_s": 0.1, **overrides}
        services = [GateService(store, lease_s=ws["lease_s"], poll_s=0.05, idle_max_s=0.2)] \
            if gate else []
        self.worker = Worker(store, Settings(endpoint=endpoints,
                                             worker=WorkerSettings(**ws)),
                             services=services)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name="bg-worker", daemon=True)
        self._thread.start()
        self._ready.wait(10)

    def _main(self) -> None:
        async def run() -> None:
            self._loop = asyncio.get_running_loop()
            self._ready.set()
            await self.worker.run()

        try:
            asyncio.run(run())
        except BaseException as exc:  # re-raised by stop()
            self.error = exc
        finally:
            self._ready.set()

    def stop(self, timeout: float = 60.0) -> None:
        if self._loop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self.worker.request_stop)
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the worker did not stop"
        if self.error is not None:
            raise self.error
