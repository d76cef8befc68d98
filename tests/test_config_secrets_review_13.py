"""Secrets in the configuration and in what lockgate says about it (review 13): a key
variable holding a line break (an env file with Windows line ends) or a configured
header value with one is refused at start, naming the variable or the header and never
the value, before a task spends an attempt; a refused ``api_key_header`` is not shown
(a key pasted in its place); an empty key variable is called empty; a webhook URL's
token and password stay out of the delivery's error (log, ``alert_delivery``); a MySQL
URL's unknown charset is one line, not a traceback."""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from helpers import RawServer, config_refused, raw_server, rows
from lockgate import Lockgate
from lockgate.cli import app
from lockgate.config import Endpoint, Settings
from lockgate.errors import ConfigError
from lockgate.quality.alerts import Evaluator
from lockgate.quality.webhooks import Sender
from lockgate.store import Store
from lockgate.worker.loop import run_async
from quality.alerting import collapse, settings

KEY_VAR = "LOCKGATE_TEST_REVIEW13_KEY"


def _config(tmp_path: Path, extra: str = "") -> Path:
    cfg = tmp_path / "lockgate.toml"
    cfg.write_text(f'[[endpoint]]\nname = "ep"\nbase_url = "http://127.0.0.1:19150/v1"\n'
                   f'api_key_env = "{KEY_VAR}"\n{extra}\n')
    return cfg


def _task(i: int) -> dict[str, object]:
    return {"task_id": f"t{i}", "prompt_template": "Label: {text}",
            "input_data": {"text": "x"}, "model_config": {"name": "m"},
            "delivery_rule": {"format": "json"}, "retry_policy": {"max_retries": 2}}


@pytest.mark.parametrize("client", ["aiohttp", "pyreqwest"])
@pytest.mark.parametrize("end", ["\r", "\n", "\r\n", "\x1b"])
def test_a_key_with_a_line_break_stops_the_worker_before_any_attempt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, client: str, end: str) -> None:
    monkeypatch.setenv(KEY_VAR, f"sk-NLKEY123{end}")
    cfg = _config(tmp_path, f'[worker]\nhttp_client = "{client}"')
    with Lockgate(f"sqlite:///{tmp_path / 'lg.db'}", config=cfg) as lg:
        lg.submit([_task(0)], batch_id="b")
        with pytest.raises(ConfigError) as err:
            run_async(lg.worker(burst=True, gate=False).run())
        assert lg.status().batches["b"] == {"PENDING": 1}  # no attempt was spent
    message = str(err.value)
    assert f"${KEY_VAR} holds a line break or another control character" in message
    assert "remove it" in message
    assert "NLKEY123" not in message


def test_the_worker_command_names_the_variable_and_not_the_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_VAR, "sk-NLKEY123\r")
    cfg = _config(tmp_path)
    result = CliRunner().invoke(app, ["worker", "--db", f"sqlite:///{tmp_path / 'lg.db'}",
                                      "--config", str(cfg), "--burst"],
                                catch_exceptions=False)
    assert result.exit_code == 2
    err = " ".join(result.stderr.split())
    assert f"${KEY_VAR} holds a line break or another control character" in err
    assert "NLKEY123" not in result.output and "Traceback" not in result.output


def test_spaces_around_a_key_are_kept_as_they_were(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_VAR, " sk-SPACE1 ")
    ep = Endpoint(name="ep", base_url="http://127.0.0.1:19150/v1", api_key_env=KEY_VAR)
    assert ep.api_key() == " sk-SPACE1 "  # not changed silently
    monkeypatch.setenv(KEY_VAR, "sk-TAB\t1")  # a tab is a valid header character
    assert ep.api_key() == "sk-TAB\t1"


def test_an_empty_key_variable_is_called_empty_not_unset(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ep = Endpoint(name="ep", base_url="http://127.0.0.1:19150/v1", api_key_env=KEY_VAR)
    monkeypatch.setenv(KEY_VAR, "")
    with pytest.raises(ConfigError) as err:
        ep.api_key()
    assert f"${KEY_VAR}, which is set but empty" in str(err.value)
    assert "not set" not in str(err.value)
    monkeypatch.delenv(KEY_VAR)
    with pytest.raises(ConfigError, match=f"\\${KEY_VAR}, which is not set"):
        ep.api_key()


@pytest.mark.parametrize("value", ["HDRSECRET5\r\n", "HDRSECRET5\n", "HDR\rSECRET5"])
def test_a_header_value_with_a_line_break_is_refused_at_start(
        tmp_path: Path, value: str) -> None:
    cfg = tmp_path / "lockgate.toml"
    escaped = value.replace("\r", "\\r").replace("\n", "\\n")
    cfg.write_text('[[endpoint]]\nname = "ep"\nbase_url = "http://127.0.0.1:19150/v1"\n'
                   f'headers = {{"x-api-key" = "{escaped}"}}\n')
    with pytest.raises(ConfigError) as err:
        Lockgate(f"sqlite:///{tmp_path / 'lg.db'}", config=cfg)
    message = str(err.value)
    assert "[[endpoint]] 'ep'" in message
    assert "header 'x-api-key' holds a line break or another control character" in message
    assert "HDR" not in message
    result = CliRunner().invoke(app, ["worker", "--db", f"sqlite:///{tmp_path / 'lg.db'}",
                                      "--config", str(cfg), "--burst"],
                                catch_exceptions=False)
    assert result.exit_code == 2
    assert "HDR" not in result.output and "Traceback" not in result.output


def test_a_header_name_with_a_line_break_is_refused(tmp_path: Path) -> None:
    message = config_refused(
        tmp_path, '[[endpoint]]\nname = "ep"\nbase_url = "http://127.0.0.1:19150/v1"\n'
                  'headers = {"x-key\\r\\nX-Secret: HDRSECRET6" = "v"}\n')
    assert "[[endpoint]] 'ep'" in message
    assert "a header name in headers holds a line break" in message
    assert "HDRSECRET6" not in message


@pytest.mark.parametrize("value", ["sk-LITERAL KEY999", "api-key: sk-LITERALKEY999"])
def test_a_refused_api_key_header_is_not_shown(tmp_path: Path, value: str) -> None:
    cfg = tmp_path / "lockgate.toml"
    cfg.write_text('[[endpoint]]\nname = "az"\nbase_url = "http://127.0.0.1:19150/v1"\n'
                   f'api_key_env = "K"\napi_key_header = "{value}"\n')
    with pytest.raises(ConfigError) as err:
        Lockgate(f"sqlite:///{tmp_path / 'lg.db'}", config=cfg)
    message = str(err.value)
    assert "'api_key_header'" in message and "is not an HTTP header name" in message
    assert "e.g. api-key" in message
    assert "LITERAL" not in message


class _BadContentLength(RawServer):
    """Answers every request with a Content-Length that is not a number."""

    async def _handle(self, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        self.writers.add(writer)
        await self.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n")
        await writer.drain()
        writer.close()


def test_a_webhook_urls_token_stays_out_of_the_delivery_error(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    with raw_server(_BadContentLength()) as srv:
        url = (f"http://hookuser:HOOKPASS1@127.0.0.1:{srv.port}/badcl/hook"
               "?token=HOOKTOKEN1")
        s = settings(webhook=({"name": "ops", "url": url, "max_attempts": 2,
                               "backoff_s": 0.01},))
        collapse(store)
        Evaluator(store, s, worker_id="w1").tick()
        sender = Sender(store, s.quality)
        with caplog.at_level(logging.INFO, logger="lockgate.quality"):
            for _ in range(50):
                asyncio.run(sender.pass_once())
                [d] = rows(store, "SELECT status, last_error FROM alert_delivery")
                if d["status"] == "FAILED":
                    break
                asyncio.run(asyncio.sleep(0.05))
    assert d["status"] == "FAILED"
    assert "ClientResponseError: 400" in d["last_error"]
    assert "Content-Length" in d["last_error"]  # what was wrong stays
    logged = caplog.text
    assert "FAILED after 2 attempts" in logged
    for text in (d["last_error"], logged):
        assert "HOOKTOKEN1" not in text and "HOOKPASS1" not in text


@pytest.mark.parametrize("args", [["status"], ["init"]])
def test_an_unknown_mysql_charset_is_one_line(args: list[str]) -> None:
    url = "mysql://root:DBPASS123@127.0.0.1:3306/lockgate?charset=bogus"
    result = CliRunner().invoke(app, [*args, "--db", url], catch_exceptions=False)
    assert result.exit_code == 2
    err = " ".join(result.stderr.split())
    assert "charset 'bogus'" in err and "mysql://root:***@127.0.0.1:3306/" in err
    assert "DBPASS123" not in result.output and "Traceback" not in result.output


def test_an_unknown_mysql_charset_is_a_config_error_in_the_api() -> None:
    import lockgate

    with pytest.raises(ConfigError, match="charset 'bogus'") as err:
        lockgate.connect("mysql://root:DBPASS123@127.0.0.1:3306/lockgate"
                         "?charset=bogus").status()
    assert "DBPASS123" not in str(err.value)


def test_a_known_mysql_charset_is_taken() -> None:
    from lockgate.store.engine import create

    for charset in ("utf8mb4", "UTF8", "latin1"):
        engine = create(f"mysql://root@127.0.0.1:3306/lockgate?charset={charset}")
        engine.dispose()


def test_settings_from_the_environment_keep_working() -> None:
    assert os.environ.get(KEY_VAR) is None
    assert Settings().endpoints()[0].api_key() is None
