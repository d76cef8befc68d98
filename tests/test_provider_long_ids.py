"""An answer whose ``x-request-id`` or ``model`` is longer than the columns that keep
them (128 and 200 characters) is stored, on every backend: PostgreSQL and MariaDB
refused the write-back of the attempt ("value too long for type character
varying(128)"), and its task was called again."""

from __future__ import annotations

from aiohttp import web
from sqlalchemy import text

from helpers import chat_server
from lockgate import Lockgate
from lockgate.config import Endpoint, Settings
from lockgate.worker.loop import run_async


async def _long_ids(request: web.Request) -> web.Response:
    return web.json_response({
        "id": "c-1", "object": "chat.completion", "model": "m" * 300,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": '{"label": "x"}'}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}},
        headers={"x-request-id": "r" * 300})


def test_a_long_request_id_and_model_are_stored(db_url: str) -> None:
    with chat_server(_long_ids) as url:
        settings = Settings(endpoint=(Endpoint(name="p", base_url=url),),
                            default_endpoint="p")
        with Lockgate(db_url, settings=settings) as lg:
            lg.submit([{"task_id": "t-1", "prompt_template": "Reply: {text}",
                        "input_data": {"text": "hi"}, "model_config": {"name": "m-1"},
                        "delivery_rule": {"format": "json", "required_keys": ["label"]},
                        "retry_policy": {"max_retries": 0}}], batch_id="b")
            stats = run_async(lg.worker(burst=True, gate=False).run())
            assert stats.succeeded == 1
            assert lg.status().batches["b"] == {"SUCCEEDED": 1}
            with lg.store.engine.connect() as conn:
                row = conn.execute(text("SELECT request_id, model FROM task "
                                        "WHERE task_id = 't-1'")).one()
    assert tuple(row) == ("r" * 128, "m" * 200)
