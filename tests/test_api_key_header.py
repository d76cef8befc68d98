"""``api_key_header``: an endpoint whose provider takes its key in a header of its own
(Azure OpenAI's deployment API: ``api-key: KEY``) reads the key from ``api_key_env``,
as every other endpoint does, instead of having it written into the config file's
``headers``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
from aiohttp import web

from helpers import app_server
from lockgate import Lockgate
from lockgate.errors import ConfigError
from lockgate.providers.openai import OpenAICompatible
from lockgate.worker.loop import run_async

ANSWER = {"id": "c-1", "object": "chat.completion", "model": "gpt-4o",
          "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
          "choices": [{"index": 0, "finish_reason": "stop",
                       "message": {"role": "assistant", "content": '{"label": "ok"}'}}]}


@pytest.fixture
def deployment() -> Iterator[tuple[str, list[Mapping[str, str]]]]:
    """An Azure OpenAI deployment: 401 unless ``api-key`` holds the key; yields its
    root URL and the headers of every request."""
    seen: list[Mapping[str, str]] = []  # (case-insensitive, as HTTP's names are)

    async def handle(request: web.Request) -> web.Response:
        seen.append(request.headers.copy())
        if request.headers.get("api-key") != "AZ-SECRET":
            return web.json_response({"error": {"code": "401", "message": "Access denied "
                                                "due to invalid subscription key"}}, status=401)
        return web.json_response(ANSWER)

    def routes(app: web.Application) -> None:
        app.router.add_post("/openai/deployments/{name}/chat/completions", handle)

    with app_server(routes) as root:
        yield root, seen


@pytest.mark.parametrize("client", ["aiohttp", "pyreqwest"])
def test_the_key_goes_in_the_named_header_from_the_environment(
        deployment: tuple[str, list[Mapping[str, str]]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, client: str) -> None:
    root, seen = deployment
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", "AZ-SECRET")
    config = tmp_path / "lockgate.toml"
    config.write_text(f"""
[worker]
http_client = "{client}"

[[endpoint]]
name = "azure"
base_url = "{root}/openai/deployments/gpt4o?api-version=2024-10-21"
api_key_env = "AZURE_OPENAI_API_KEY"
api_key_header = "api-key"
models = ["gpt-4o"]
""")
    assert "AZ-SECRET" not in config.read_text()
    with Lockgate(f"sqlite:///{tmp_path / 'lg.db'}", config=config) as lg:
        lg.submit([{"task_id": f"t{i}", "prompt_template": "Label: {text}",
                    "input_data": {"text": f"item {i}"}, "model_config": {"name": "gpt-4o"},
                    "delivery_rule": {"format": "json", "required_keys": ["label"]},
                    "retry_policy": {"max_retries": 0}} for i in range(3)], batch_id="b")
        stats = run_async(lg.worker(burst=True, gate=False).run())
        assert stats.succeeded == 3
        assert lg.status().batches["b"] == {"SUCCEEDED": 3}
    assert len(seen) == 3
    for headers in seen:
        assert headers["api-key"] == "AZ-SECRET"
        assert "Authorization" not in headers  # the key is not also sent as a Bearer token


def test_without_a_header_named_the_key_is_a_bearer_token() -> None:
    prov = OpenAICompatible("ep", "http://127.0.0.1:9/v1", api_key="sk-1")
    assert prov._headers["Authorization"] == "Bearer sk-1"
    named = OpenAICompatible("ep", "http://127.0.0.1:9/v1", api_key="sk-1",
                             api_key_header="Authorization")
    assert named._headers["Authorization"] == "Bearer sk-1"
    # Basic credentials in base_url go with a key sent in a header of its own
    basic = OpenAICompatible("ep", "http://u:p@127.0.0.1:9/v1", api_key="sk-1",
                             api_key_header="x-api-key")
    assert basic._headers["x-api-key"] == "sk-1"
    assert basic._headers["Authorization"].startswith("Basic ")


@pytest.mark.parametrize(("lines", "says"), [
    ('api_key_header = "api-key"',
     "api_key_header = 'api-key' names the header of the key read from api_key_env, "
     "which is not set"),
    ('api_key_env = "K"\napi_key_header = "Api Key"',
     "'api_key_header': the value given is not an HTTP header name"),
    ('api_key_env = "K"\napi_key_header = "api-key:"', "is not an HTTP header name"),
    ('api_key_env = "K"\napi_key_header = "api-key"\nheaders = {"API-Key" = "x"}',
     "the header 'api-key' is both api_key_header and in headers"),
])
def test_mistakes_are_named(tmp_path: Path, lines: str, says: str) -> None:
    config = tmp_path / "lockgate.toml"
    config.write_text(f'[[endpoint]]\nname = "az"\nbase_url = "http://127.0.0.1:9/v1"\n'
                      f"{lines}\n")
    with pytest.raises(ConfigError, match="endpoint") as err:
        Lockgate(f"sqlite:///{tmp_path / 'lg.db'}", config=config)
    assert says in str(err.value)
