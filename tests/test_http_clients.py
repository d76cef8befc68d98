"""Both HTTP clients of a worker's calls (aiohttp, and pyreqwest from the fast-http
extra) against the real simulator: the same answer, the same classified errors, the same
headers read."""

from __future__ import annotations

import base64
import socket
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from helpers import calls_through, chat_server
from lockgate import Lockgate
from lockgate.config import Settings, WorkerSettings
from lockgate.errors import ConfigError, ErrorClass
from lockgate.providers.base import Completion, ProviderError
from lockgate.providers.openai import OpenAICompatible
from lockgate.simulator.testing import SimulatorProcess
from lockgate.worker.loop import run_async

CLIENTS = ["aiohttp", "pyreqwest"]
PROMPT = [{"role": "user", "content": 'Reply with JSON like {"label": "x"}: a broken parcel'}]


def _call(url: str, client: str, *, timeout_s: float = 10, key: str = "k-1",
          n: int = 1) -> list[Completion | ProviderError]:
    return calls_through(url, client, n, model="sim-small", timeout_s=timeout_s,
                         messages=PROMPT, params={"max_tokens": 16}, key=key, pause_s=0)


@pytest.mark.parametrize("client", CLIENTS)
def test_an_answer_is_read_the_same_by_both_clients(
        simulator: SimulatorProcess, client: str) -> None:
    (got,) = _call(simulator.url, client, key="this")
    (ref,) = _call(simulator.url, "aiohttp", key="reference")
    assert isinstance(got, Completion) and isinstance(ref, Completion)
    assert (got.content, got.model, got.prompt_tokens, got.completion_tokens,
            got.http_status) == (ref.content, ref.model, ref.prompt_tokens,
                                 ref.completion_tokens, ref.http_status)
    assert got.request_id and got.body and '"choices"' in got.body
    assert got.rate_limit.keys() == ref.rate_limit.keys()
    stats = simulator.stats()
    assert stats["requests"] == 2 and stats["idempotency_keys"] == 2


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(("fault", "want"), [
    ({"rate_429": 1.0, "retry_after_ms": 1500}, ErrorClass.RATE_LIMITED),
    ({"rate_500": 1.0}, ErrorClass.SERVER_ERROR),
    ({"rate_503": 1.0}, ErrorClass.SERVER_ERROR),
])
def test_an_error_answer_is_classified_the_same(
        simulator: SimulatorProcess, client: str, fault: dict[str, Any],
        want: ErrorClass) -> None:
    simulator.configure(**fault)
    (err,) = _call(simulator.url, client)
    assert isinstance(err, ProviderError), err
    assert err.error_class is want
    if want is ErrorClass.RATE_LIMITED:
        assert err.retry_after_ms == 1500 and err.http_status == 429


@pytest.mark.parametrize("client", CLIENTS)
def test_no_answer_in_time_is_a_timeout(simulator: SimulatorProcess, client: str) -> None:
    simulator.configure(latency={"kind": "fixed", "mean_ms": 2000})
    (err,) = _call(simulator.url, client, timeout_s=0.3)
    assert isinstance(err, ProviderError) and err.error_class is ErrorClass.TIMEOUT


@pytest.mark.parametrize("client", CLIENTS)
def test_nobody_listening_is_a_connection_error(client: str) -> None:
    with socket.socket() as s:  # a port that was free a moment ago
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (err,) = _call(f"http://127.0.0.1:{port}/v1", client)
    assert isinstance(err, ProviderError) and err.error_class is ErrorClass.CONNECTION_ERROR


def test_a_worker_takes_its_client_from_the_settings() -> None:
    assert Settings().worker.http_client == "aiohttp"
    assert WorkerSettings(http_client="pyreqwest").http_client == "pyreqwest"


def test_a_worker_on_pyreqwest_runs_a_batch_to_the_end(
        simulator: SimulatorProcess, tmp_path: Path) -> None:
    with Lockgate(f"sqlite:///{tmp_path / 'w.db'}") as lg:
        lg.submit([{"task_id": f"t-{i}",
                    "prompt_template": 'Reply with JSON like {{"label": "x"}}: {text}',
                    "input_data": {"text": f"parcel {i} broken"},
                    "model_config": {"name": "sim-small"},
                    "delivery_rule": {"format": "json", "required_keys": ["label"]},
                    "retry_policy": {}} for i in range(50)], batch_id="b")
        worker = lg.worker(burst=True, gate=False, http_client="pyreqwest")
        stats = run_async(worker.run())
        providers = worker._providers.values()
        assert {getattr(p, "http_client", None) for p in providers} == {"pyreqwest"}
        assert stats.succeeded == 50
        assert lg.status().batches["b"] == {"SUCCEEDED": 50}
    assert simulator.stats()["requests"] == 50


@pytest.mark.parametrize("client", CLIENTS)
def test_credentials_in_the_base_url_are_sent_as_basic_auth(client: str) -> None:
    # aiohttp refused every call of an endpoint whose base_url carried user:password@
    # beside an API key ("Cannot combine AUTHORIZATION header with AUTH argument or
    # credentials encoded in URL"): each task failed as an internal error.
    seen: list[dict[str, str]] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.json_response({
            "id": "c-1", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "{}"}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})

    with chat_server(answer) as url:
        host = url.split("//", 1)[1].removesuffix("/v1")
        (got,) = _call(f"http://gw%40user:p%3Ass@{host}/v1", client)
    assert isinstance(got, Completion), got
    assert seen[0]["Authorization"] == "Basic " + base64.b64encode(b"gw@user:p:ss").decode()
    with pytest.raises(ConfigError, match="base_url carries a user and password and an API "
                                          "key"):
        OpenAICompatible("sim", f"http://u:p@{host}/v1", api_key="sk-1")
