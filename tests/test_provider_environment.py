"""What the environment gives the aiohttp client, read once per endpoint: a proxy of
``HTTP_PROXY`` (tests/test_provider_review_4.py) and a login of ``.netrc``. A ``.netrc``
entry for an endpoint's host no longer breaks an endpoint that sends an API key: aiohttp
refused every such request ("Cannot combine AUTHORIZATION header with AUTH argument"),
so each call failed as lockgate's own error. It read both at every request, on two
hops to a thread (docs/benchmarks.md, "Worker CPU per task")."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Mapping
from pathlib import Path

import pytest
from aiohttp import web

from helpers import chat_server
from lockgate.providers.base import Completion, CompletionRequest, ProviderError
from lockgate.providers.openai import OpenAICompatible

OK = {"id": "c-1", "object": "chat.completion", "model": "m",
      "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
      "choices": [{"index": 0, "finish_reason": "stop",
                   "message": {"role": "assistant", "content": "{}"}}]}


def _calls(url: str, n: int, api_key: str | None) -> list[Completion | ProviderError]:
    async def main() -> list[Completion | ProviderError]:
        prov = OpenAICompatible("p", url, api_key=api_key)
        out: list[Completion | ProviderError] = []
        try:
            for i in range(n):
                try:
                    out.append(await prov.complete(CompletionRequest(
                        messages=[{"role": "user", "content": "hi"}], model="m",
                        timeout_s=10, params={}, idempotency_key=f"k-{i}")))
                except ProviderError as exc:
                    out.append(exc)
        finally:
            await prov.close()
        return out
    return asyncio.run(main())


@pytest.fixture
def netrc_for_localhost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A ``.netrc`` (``$NETRC``) with a login for 127.0.0.1; the Basic value it makes."""
    path = tmp_path / "netrc"
    path.write_text("machine 127.0.0.1 login gw-user password gw-pass\n")
    path.chmod(0o600)
    monkeypatch.setenv("NETRC", str(path))
    return "Basic " + base64.b64encode(b"gw-user:gw-pass").decode()


def _server_seen() -> tuple[list[Mapping[str, str]], object]:
    seen: list[Mapping[str, str]] = []

    async def answer(request: web.Request) -> web.Response:
        seen.append(request.headers.copy())
        return web.json_response(OK)
    return seen, answer


def test_an_api_key_is_sent_although_netrc_has_a_login_for_the_host(
        netrc_for_localhost: str) -> None:
    seen, answer = _server_seen()
    with chat_server(answer) as url:  # type: ignore[arg-type]
        got = _calls(url, 3, api_key="sk-1")
    assert all(isinstance(g, Completion) for g in got), got
    assert [h["Authorization"] for h in seen] == ["Bearer sk-1"] * 3


def test_without_a_key_the_netrc_login_is_sent(netrc_for_localhost: str) -> None:
    seen, answer = _server_seen()
    with chat_server(answer) as url:  # type: ignore[arg-type]
        got = _calls(url, 2, api_key=None)
    assert all(isinstance(g, Completion) for g in got), got
    assert [h["Authorization"] for h in seen] == [netrc_for_localhost] * 2


def test_no_netrc_no_login(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETRC", str(tmp_path / "absent"))
    seen, answer = _server_seen()
    with chat_server(answer) as url:  # type: ignore[arg-type]
        got = _calls(url, 1, api_key=None)
    assert isinstance(got[0], Completion)
    assert "Authorization" not in seen[0]
