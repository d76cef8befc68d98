"""The simulator over real HTTP: protocol, faults, rate limits, stats and prompt-driven answers.

Most tests talk to the session's simulator subprocess (``simulator`` fixture: defaults
restored and stats zeroed before each test) through a keep-alive ``http.client``
connection. Pure parts (prompt grammar, sliding window arithmetic) are tested directly
with an explicit clock so they need no sleeping.
"""

from __future__ import annotations

import asyncio
import http.client
import importlib.util
import math
import socket
import subprocess
import sys
import time
import unicodedata
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from lockgate.simulator import SimulatorConfig, start
from lockgate.simulator.prompt import ENUM, INT, TEXT, parse_instructions
from lockgate.simulator.ratelimit import RateLimiter, format_duration, scaled_limit
from lockgate.simulator.responder import Responder, split_prompt
from lockgate.simulator.stats import task_of
from lockgate.simulator.testing import SimulatorProcess
from lockgate.spec import parse_task

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "complaints"

SYSTEM = """Label the complaint. Reply with JSON only:
{"category": "...", "emotion": 1, "summary": "..."}
- category: one of logistics, quality, refund, service, other
- emotion: integer 1-5
- summary: at most 12 characters
- if the text mentions 快递|物流 then category = logistics
- 如果文本提到 退款、退钱 则 category = refund
- 坏了 → category = quality
- otherwise category = other
"""


def messages(text: str, system: str = SYSTEM) -> list[dict[str, str]]:
    return [{"role": "system", "content": system},
            {"role": "user", "content": f"Complaint:\n<input>\n{text}\n</input>"}]


class Client:
    """A keep-alive HTTP client for one simulator (sync: tests stay simple)."""

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        parts = urllib.parse.urlsplit(base_url)
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 80
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def request(self, method: str, path: str, body: Any = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        data = orjson.dumps(body) if body is not None and not isinstance(body, bytes) else body
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        self.conn.request(method, path, body=data, headers=hdrs)
        resp = self.conn.getresponse()
        raw = resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, raw

    def chat(self, msgs: list[dict[str, str]], key: str = "test-key", idem: str | None = None,
             **extra: Any) -> tuple[int, dict[str, str], dict[str, Any]]:
        headers = {"Authorization": f"Bearer {key}"}
        if idem is not None:
            headers["Idempotency-Key"] = idem
        status, hdrs, raw = self.request("POST", "/v1/chat/completions",
                                         {"model": "sim-complaints", "messages": msgs, **extra},
                                         headers)
        return status, hdrs, orjson.loads(raw)

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def client(simulator: SimulatorProcess) -> Iterator[Client]:
    c = Client(simulator.base_url)
    try:
        yield c
    finally:
        c.close()


def content(doc: dict[str, Any]) -> str:
    text: str = doc["choices"][0]["message"]["content"]
    return text


# ------------------------------------------------------------------------ protocol

def test_chat_completion_shape(client: Client, simulator: SimulatorProcess) -> None:
    status, headers, doc = client.chat(messages("快递三天还没到"), max_tokens=200)
    assert status == 200
    assert headers["x-request-id"].startswith("req_")
    assert headers["content-type"].startswith("application/json")
    assert doc["object"] == "chat.completion"
    assert doc["id"].startswith("chatcmpl-")
    assert isinstance(doc["created"], int)
    assert doc["model"] == "sim-complaints"
    choice = doc["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "stop"
    usage = doc["usage"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert orjson.loads(content(doc))["category"] == "logistics"
    # the path without /v1 is accepted too
    status, _h, raw = client.request("POST", "/chat/completions",
                                     {"model": "m", "messages": messages("x")})
    assert status == 200 and orjson.loads(raw)["object"] == "chat.completion"


def test_models_and_errors(client: Client) -> None:
    status, _h, raw = client.request("GET", "/v1/models")
    doc = orjson.loads(raw)
    assert status == 200 and doc["object"] == "list"
    assert "sim-complaints" in [m["id"] for m in doc["data"]]
    status, _h, raw = client.request("POST", "/v1/chat/completions", b"{not json")
    err = orjson.loads(raw)["error"]
    assert status == 400 and set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error"
    status, _h, raw = client.request("POST", "/v1/chat/completions", {"model": "m"})
    assert status == 400 and orjson.loads(raw)["error"]["param"] == "messages"
    status, _h, raw = client.request("GET", "/v1/nothing-here")
    assert status == 404 and orjson.loads(raw)["error"]["code"] == "unknown_url"


def test_context_window_and_max_tokens(client: Client, simulator: SimulatorProcess) -> None:
    simulator.configure(context_window=50)
    status, _h, doc = client.chat(messages("长" * 200))
    assert status == 400
    assert doc["error"]["code"] == "context_length_exceeded"
    simulator.configure(context_window=None)
    status, _h, doc = client.chat(messages("快递没到"), max_tokens=3)
    assert status == 200 and doc["choices"][0]["finish_reason"] == "length"
    assert doc["usage"]["completion_tokens"] <= 3


# ------------------------------------------------------------------------ latency

def test_fixed_latency_is_honoured(client: Client, simulator: SimulatorProcess) -> None:
    simulator.configure(latency={"kind": "fixed", "mean_ms": 150})
    t0 = time.perf_counter()
    for _ in range(3):
        assert client.chat(messages("x"))[0] == 200
    per_call = (time.perf_counter() - t0) / 3
    assert 0.15 <= per_call < 1.0
    simulator.configure(latency={"mean_ms": 0})
    t0 = time.perf_counter()
    assert client.chat(messages("x"))[0] == 200
    assert time.perf_counter() - t0 < 0.15


def test_lognormal_latency_mean() -> None:
    cfg = SimulatorConfig(latency={"kind": "lognormal", "mean_ms": 200, "sigma": 0.8})
    lat = cfg.latency
    import random
    rng = random.Random(1)
    samples = [rng.lognormvariate(lat.mu, lat.sigma) for _ in range(20000)]
    assert abs(sum(samples) / len(samples) - 200) < 10


# ------------------------------------------------------------------------ rate limits

def test_rpm_429_headers_and_window_admits_again(client: Client,
                                                 simulator: SimulatorProcess) -> None:
    simulator.configure(rpm=3, window_s=1.0)
    first = time.monotonic()
    for i in range(3):
        status, headers, _doc = client.chat(messages(f"q{i}"))
        assert status == 200
        assert headers["x-ratelimit-limit-requests"] == "3"
        assert headers["x-ratelimit-remaining-requests"] == str(2 - i)
        assert "x-ratelimit-reset-requests" in headers
        assert "x-ratelimit-limit-tokens" not in headers  # no TPM configured
    status, headers, doc = client.chat(messages("q3"))
    assert status == 429
    assert doc["error"]["code"] == "rate_limit_exceeded"
    assert doc["error"]["type"] == "requests"
    wait_ms = int(headers["retry-after-ms"])
    assert headers["retry-after"] == str(math.ceil(wait_ms / 1000))
    assert headers["x-ratelimit-remaining-requests"] == "0"
    elapsed_ms = (time.monotonic() - first) * 1000
    assert 0 < wait_ms <= 1000 and wait_ms >= 1000 - elapsed_ms - 50
    # another API key has its own window
    assert client.chat(messages("other"), key="other-key")[0] == 200
    # rejected requests consumed nothing: after the named wait exactly one is admitted
    time.sleep(wait_ms / 1000)
    assert client.chat(messages("q4"))[0] == 200
    stats = simulator.stats()
    assert stats["by_outcome"]["rate_limited"] == 1
    assert stats["by_key"] == {"test-key": 5, "other-key": 1}


def test_short_window_and_header_styles_over_http(client: Client,
                                                  simulator: SimulatorProcess) -> None:
    """Configured at run time: 2 per 60 s enforced as 1 in any 30 s, in each header style
    (the second request always comes well within 30 s of the first)."""
    new = simulator.configure(rpm=2, window_s=60, enforce_s=30, header_style="gateway")
    assert (new["enforce_s"], new["header_style"], new["retry_hint"]) == (30, "gateway", "both")
    status, headers, _doc = client.chat(messages("a"), key="gw")
    assert status == 200
    assert headers["x-ratelimit-limit-requests"] == "2"
    assert headers["x-ratelimit-remaining-requests"] == "1"
    assert not any(h.startswith("x-ratelimit-reset") for h in headers)
    status, headers, doc = client.chat(messages("b"), key="gw")
    assert status == 429 and doc["error"]["type"] == "requests"
    assert "per 30s: limit 1" in doc["error"]["message"]
    assert headers["x-ratelimit-remaining-requests"] == "1"  # the minute still has room
    assert 29_000 < int(headers["retry-after-ms"]) <= 30_000
    assert headers["retry-after"] == "30"
    simulator.configure(retry_hint="seconds")
    status, headers, _doc = client.chat(messages("b"), key="gw")
    assert status == 429 and headers["retry-after"] == "30" and "retry-after-ms" not in headers
    simulator.configure(retry_hint="none")
    status, headers, _doc = client.chat(messages("b"), key="gw")
    assert status == 429 and "retry-after" not in headers and "retry-after-ms" not in headers
    assert headers["x-ratelimit-limit-requests"] == "2"
    simulator.configure(header_style="none", retry_hint="both")
    status, headers, _doc = client.chat(messages("c"), key="none")
    assert status == 200 and not any(h.startswith("x-ratelimit") for h in headers)
    status, headers, _doc = client.chat(messages("d"), key="none")
    assert status == 429
    assert not any(h.startswith(("x-ratelimit", "retry-after")) for h in headers)
    simulator.configure(header_style="openai")
    status, headers, _doc = client.chat(messages("e"), key="openai")
    assert status == 200 and headers["x-ratelimit-reset-requests"] == "1m0s"
    stats = simulator.stats()
    assert stats["limited_by"] == {"requests": 4}
    # injected 429s follow the style too
    simulator.configure(rpm=None, rate_429=1.0, header_style="none")
    status, headers, _doc = client.chat(messages("f"))
    assert status == 429 and "retry-after" not in headers
    # a short window longer than the advertised one is refused
    status, _h, raw = client.request("POST", "/_sim/config", {"enforce_s": 61})
    assert status == 400 and b"enforce_s" in raw


def test_tpm_limit(client: Client, simulator: SimulatorProcess) -> None:
    simulator.configure(tpm=1000, window_s=30)
    status, headers, doc = client.chat(messages("a"), max_tokens=500)
    assert status == 200
    assert headers["x-ratelimit-limit-tokens"] == "1000"
    used = 1000 - int(headers["x-ratelimit-remaining-tokens"])
    assert used == doc["usage"]["prompt_tokens"] + 500  # prompt estimate + max_tokens
    status, headers, doc = client.chat(messages("b"), max_tokens=1000 - used + 1)
    assert status == 429 and doc["error"]["type"] == "tokens"
    assert 29_000 < int(headers["retry-after-ms"]) <= 30_000
    # a request that can never fit gets no retry-after
    status, headers, doc = client.chat(messages("c"), max_tokens=2000)
    assert status == 429 and "retry-after-ms" not in headers
    assert "too large" in doc["error"]["message"]
    assert client.chat(messages("d"), max_tokens=10)[0] == 200


def test_sliding_window_arithmetic() -> None:
    rl = RateLimiter()
    for t in (0.0, 10.0, 20.0):
        assert rl.admit("k", 100, t, rpm=3, tpm=None, window=60).admitted
    d = rl.admit("k", 100, 30.0, rpm=3, tpm=None, window=60)
    assert not d.admitted and d.wait_s == pytest.approx(30.0)
    assert not rl.admit("k", 100, 59.999, rpm=3, tpm=None, window=60).admitted
    assert rl.admit("k", 100, 60.0, rpm=3, tpm=None, window=60).admitted
    # tokens: needs the two oldest charges to expire
    rl.reset()
    for t, tokens in ((0.0, 300), (5.0, 300), (10.0, 300)):
        assert rl.admit("k", tokens, t, rpm=None, tpm=1000, window=60).admitted
    d = rl.admit("k", 600, 20.0, rpm=None, tpm=1000, window=60)
    assert not d.admitted and d.limited_by == "tokens" and d.wait_s == pytest.approx(45.0)
    assert rl.admit("k", 600, 65.0, rpm=None, tpm=1000, window=60).admitted
    # many admissions: compaction keeps answers exact
    rl.reset()
    for i in range(20_000):  # times in halves: exact in binary floating point
        assert rl.admit("k", 1, i * 0.5, rpm=120, tpm=None, window=60).admitted
    assert not rl.admit("k", 1, 9999.75, rpm=120, tpm=None, window=60).admitted


def test_a_minute_limit_enforced_per_second() -> None:
    """60,000 per 60 s enforced as 1,000 in any 1 s: the headers still advertise the
    minute (plenty remaining) when the second refuses."""
    rl = RateLimiter()
    for i in range(1000):  # times in 2048ths of a second: exact in floating point
        assert rl.admit("k", 1, i / 2048, rpm=60_000, tpm=None, window=60, enforce=1).admitted
    d = rl.admit("k", 1, 0.5, rpm=60_000, tpm=None, window=60, enforce=1)
    assert not d.admitted and d.limited_by == "requests"
    assert (d.wait_s, d.per_s, d.limit) == (0.5, 1, 1000)
    assert d.headers == {"x-ratelimit-limit-requests": "60000",
                         "x-ratelimit-remaining-requests": "59000",
                         "x-ratelimit-reset-requests": "59.5s"}
    # the first admission leaves the second at 1.0: exactly one more fits
    assert rl.admit("k", 1, 1.0, rpm=60_000, tpm=None, window=60, enforce=1).admitted
    assert not rl.admit("k", 1, 1.0, rpm=60_000, tpm=None, window=60, enforce=1).admitted
    # without the short window the same traffic is admitted
    rl.reset()
    for i in range(1001):
        assert rl.admit("k", 1, i / 2048, rpm=60_000, tpm=None, window=60).admitted


def test_short_window_tokens_and_the_long_window_still_binds() -> None:
    assert scaled_limit(600_000, 1, 60) == 10_000
    assert scaled_limit(3, 1, 60) == 1  # never below one
    assert scaled_limit(100, 0.6, 60) == 1
    rl = RateLimiter()
    assert rl.admit("k", 6000, 0.0, rpm=None, tpm=600_000, window=60, enforce=1).admitted
    d = rl.admit("k", 5000, 0.5, rpm=None, tpm=600_000, window=60, enforce=1)
    assert not d.admitted and d.limited_by == "tokens" and d.wait_s == 0.5
    assert d.headers["x-ratelimit-remaining-tokens"] == "594000"
    # a charge above the per-second share can never be admitted, though it fits the minute
    d = rl.admit("k", 10_001, 5.0, rpm=None, tpm=600_000, window=60, enforce=1)
    assert not d.admitted and d.too_large and (d.per_s, d.limit) == (1, 10_000)
    # 4 per 6 s enforced as 2 per 3 s: at 6.25 the 3 s window has room, the 6 s one not
    rl.reset()
    for t in (0.0, 0.5, 3.0, 3.5):
        assert rl.admit("k", 1, t, rpm=4, tpm=None, window=6, enforce=3).admitted
    assert not rl.admit("k", 1, 4.0, rpm=4, tpm=None, window=6, enforce=3).admitted
    assert rl.admit("k", 1, 6.0, rpm=4, tpm=None, window=6, enforce=3).admitted
    d = rl.admit("k", 1, 6.25, rpm=4, tpm=None, window=6, enforce=3)
    assert not d.admitted and (d.wait_s, d.per_s, d.limit) == (0.25, 6, 4)


def test_header_styles() -> None:
    rl = RateLimiter()
    kw: dict[str, Any] = {"rpm": 10, "tpm": 1000, "window": 60}
    assert rl.admit("k", 100, 0.0, **kw).headers == {
        "x-ratelimit-limit-requests": "10", "x-ratelimit-remaining-requests": "9",
        "x-ratelimit-reset-requests": "1m0s", "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "900", "x-ratelimit-reset-tokens": "1m0s"}
    assert rl.admit("k", 100, 15.0, style="gateway", **kw).headers == {
        "x-ratelimit-limit-requests": "10", "x-ratelimit-remaining-requests": "8",
        "x-ratelimit-limit-tokens": "1000", "x-ratelimit-remaining-tokens": "800"}
    assert rl.admit("k", 100, 30.0, style="none", **kw).headers == {}
    assert rl.peek("k", 30.0, style="gateway", **kw)["x-ratelimit-remaining-requests"] == "7"


def test_format_duration() -> None:
    assert format_duration(0) == "0s"
    assert format_duration(0.25) == "250ms"
    assert format_duration(1.0) == "1s"
    assert format_duration(1.5) == "1.5s"
    assert format_duration(360.0) == "6m0s"
    assert format_duration(90.25) == "1m30.25s"
    # A wait a hair under a minute is a minute, as OpenAI writes it (never "60s").
    assert format_duration(59.9996) == "1m0s"
    assert format_duration(119.9999) == "2m0s"


@given(st.floats(min_value=1.0, max_value=86_400.0))
def test_format_duration_seconds_part_below_a_minute(seconds: float) -> None:
    text = format_duration(seconds)
    minutes, _, secs = text[:-1].rpartition("m")
    assert 0 <= float(secs) < 60
    assert abs((int(minutes or 0) * 60 + float(secs)) - seconds) <= 0.0005 + 1e-9


def test_insufficient_quota(client: Client, simulator: SimulatorProcess) -> None:
    simulator.configure(quota_exhausted=True)
    status, headers, doc = client.chat(messages("x"))
    assert status == 429
    assert doc["error"]["type"] == "insufficient_quota"
    assert doc["error"]["code"] == "insufficient_quota"
    assert "retry-after" not in headers and "retry-after-ms" not in headers
    simulator.configure(quota_exhausted=False)
    assert client.chat(messages("x"))[0] == 200


# ------------------------------------------------------------------------ faults

def _outcomes(client: Client, n: int) -> list[str]:
    out = []
    for i in range(n):
        status, _h, raw = client.request("POST", "/v1/chat/completions",
                                         {"model": "m", "messages": messages(f"快递{i}")},
                                         {"Authorization": "Bearer f"})
        if status != 200:
            out.append(str(status))
            continue
        text = content(orjson.loads(raw))
        if text.startswith("Sure!"):
            assert "```json\n{" in text
            body = text.split("```json\n", 1)[1].split("\n```", 1)[0]
            assert orjson.loads(body)["category"] == "logistics"
            out.append("chatty")
        else:
            try:
                orjson.loads(text)
                out.append("ok")
            except orjson.JSONDecodeError:
                out.append("malformed")
    return out


def test_fault_rates_with_seed(client: Client, simulator: SimulatorProcess) -> None:
    rates = {"rate_500": 0.15, "rate_503": 0.1, "rate_malformed": 0.1, "rate_chatty": 0.1,
             "rate_429": 0.05}
    simulator.configure(seed=7, retry_after_ms=250, **rates)
    n = 600
    seen = _outcomes(client, n)
    counts = Counter(seen)
    expected = {"500": rates["rate_500"], "503": rates["rate_503"],
                "malformed": rates["rate_malformed"], "chatty": rates["rate_chatty"],
                "429": rates["rate_429"]}
    for outcome, p in expected.items():
        sd = math.sqrt(n * p * (1 - p))
        assert abs(counts[outcome] - n * p) < 4 * sd, (outcome, counts)
    stats = simulator.stats()
    assert stats["by_status"]["500"] == counts["500"]
    assert stats["by_outcome"]["malformed"] == counts["malformed"]
    # same seed after a reset: the very same sequence
    simulator.reset()
    assert _outcomes(client, n) == seen


def test_injected_429_headers(client: Client, simulator: SimulatorProcess) -> None:
    simulator.configure(rate_429=1.0, retry_after_ms=1500)
    status, headers, doc = client.chat(messages("x"))
    assert status == 429 and doc["error"]["code"] == "rate_limit_exceeded"
    assert headers["retry-after-ms"] == "1500" and headers["retry-after"] == "2"


def test_broken_body(client: Client, simulator: SimulatorProcess) -> None:
    simulator.configure(rate_broken_body=1.0)
    status, _h, raw = client.request("POST", "/v1/chat/completions",
                                     {"model": "m", "messages": messages("x")})
    assert status == 200
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(raw)


def test_timeout_mode_never_answers(simulator: SimulatorProcess) -> None:
    simulator.configure(rate_timeout=1.0, hang_s=30)
    c = Client(simulator.base_url, timeout=0.4)
    t0 = time.perf_counter()
    try:
        with pytest.raises(TimeoutError):
            c.chat(messages("x"))
    finally:
        c.close()
    assert time.perf_counter() - t0 >= 0.4
    stats = simulator.stats()
    assert stats["by_outcome"] == {"timeout": 1}
    assert stats["by_status"] == {}
    # with a short hang the server drops the connection without any response
    simulator.configure(hang_s=0.2)
    c = Client(simulator.base_url, timeout=5)
    try:
        with pytest.raises((http.client.RemoteDisconnected, ConnectionError)):
            c.chat(messages("y"))
    finally:
        c.close()


def test_runtime_config_update(client: Client, simulator: SimulatorProcess) -> None:
    assert client.chat(messages("x"))[0] == 200
    new = simulator.configure(rate_500=1.0)
    assert new["rate_500"] == 1.0 and new["latency"]["mean_ms"] == 0
    assert client.chat(messages("x"))[0] == 500
    simulator.configure(rate_500=0.0, rate_503=1.0)
    status, _h, doc = client.chat(messages("x"))
    assert status == 503 and doc["error"]["type"] == "server_error"
    status, _h, raw = client.request("POST", "/_sim/config", {"rate_500": 0.9, "rate_503": 0.9})
    assert status == 400  # rates add up to more than 1: refused, old config kept
    assert client.chat(messages("x"))[0] == 503
    status, _h, raw = client.request("POST", "/_sim/config", {"no_such_knob": 1})
    assert status == 400
    status, _h, raw = client.request("GET", "/_sim/config")
    assert orjson.loads(raw)["rate_503"] == 1.0
    status, _h, raw = client.request("GET", "/_sim/health")
    assert status == 200 and orjson.loads(raw)["ok"] is True


# ------------------------------------------------------------------------ stats

def test_stats_count_duplicates(client: Client, simulator: SimulatorProcess) -> None:
    for idem in ("t1:1", "t1:1", "t1:2", "t2:1", None):
        assert client.chat(messages("快递"), idem=idem)[0] == 200
    simulator.configure(rate_malformed=1.0)
    assert client.chat(messages("快递"), idem="t2:2")[0] == 200  # unusable: not a success
    stats = simulator.stats()
    assert stats["requests"] == 6
    assert stats["no_key"] == 1
    assert stats["idempotency_keys"] == 4
    assert stats["duplicate_keys"] == 1
    assert stats["successes"] == 5
    assert stats["tasks_succeeded"] == 2
    assert stats["duplicate_successes"] == 2  # t1 succeeded three times
    assert stats["by_model"] == {"sim-complaints": 6}
    assert stats["tokens"]["total"] == stats["tokens"]["prompt"] + stats["tokens"]["completion"]
    assert "task_successes" not in stats
    detail = simulator.stats(detail=True)
    assert detail["task_successes"] == {"t1": 3, "t2": 1}
    assert detail["duplicate_key_counts"] == {"t1:1": 2}
    simulator.reset()
    assert simulator.stats()["requests"] == 0


def test_stats_give_the_span_from_the_first_request_to_the_last(
        client: Client, simulator: SimulatorProcess) -> None:
    """A client's throughput is measured over this span, to the request."""
    simulator.reset()
    idle = simulator.stats()
    assert idle["first_request_s"] is None and idle["last_request_s"] is None
    assert client.chat(messages("x"))[0] == 200
    one = simulator.stats()
    assert one["first_request_s"] == one["last_request_s"] >= 0
    time.sleep(0.2)
    assert client.chat(messages("x"))[0] == 200
    two = simulator.stats()
    assert two["first_request_s"] == one["first_request_s"]
    assert two["last_request_s"] - two["first_request_s"] >= 0.2
    simulator.reset()
    assert simulator.stats()["first_request_s"] is None


def test_a_task_is_its_key_without_the_claim_and_attempt() -> None:
    """lockgate's workers send ``{task_id}:{claim}:{attempt}``; task ids may hold colons
    (release-gate items do); other clients send ``{task_id}:{attempt}``."""
    assert task_of("t1:0123456789abcdef:2") == "t1"
    assert task_of("gate:u1:d2:cand:7:0123456789abcdef:1") == "gate:u1:d2:cand:7"
    assert task_of("t1:1") == "t1"
    assert task_of("naive-3:1") == "naive-3"
    assert task_of("plain") == "plain"


# ------------------------------------------------------------------------ answers

def test_content_is_deterministic(client: Client) -> None:
    a = content(client.chat(messages("物流太慢了，气死了"))[2])
    b = content(client.chat(messages("物流太慢了，气死了"))[2])
    c = content(client.chat(messages("物流太慢了，有点失望"))[2])
    assert a == b
    assert a != c
    assert Responder().answer(messages("物流太慢了，气死了")).content == a


def test_rules_and_guesses(client: Client) -> None:
    cases = {"快递三天没到": "logistics", "我要退款！": "refund", "用一次就坏了": "quality",
             "开发票失败": "other", "ＡＢＣ物流": "logistics"}
    emotions = set()
    for text, category in cases.items():
        answer = orjson.loads(content(client.chat(messages(text))[2]))
        assert list(answer) == ["category", "emotion", "summary"]
        assert answer["category"] == category
        assert answer["emotion"] in range(1, 6)  # no emotion rule: a guess in range
        emotions.add(answer["emotion"])
        assert answer["summary"] == text.split("！")[0][:12]  # first sentence, capped
    # without rules every category is a hash-chosen guess among the allowed values
    bare = SYSTEM.split("- if the text")[0]
    guesses = Counter(orjson.loads(content(client.chat(messages(f"快递{i}", bare))[2]))
                      ["category"] for i in range(100))
    assert set(guesses) == {"logistics", "quality", "refund", "service", "other"}
    assert guesses["logistics"] < 50


def test_accuracy_noise_flips_a_share(client: Client, simulator: SimulatorProcess) -> None:
    simulator.configure(accuracy_noise=0.3)
    labels = [orjson.loads(content(client.chat(messages(f"快递 {i}"))[2]))["category"]
              for i in range(300)]
    flipped = sum(label != "logistics" for label in labels)
    assert 50 < flipped < 130
    assert all(label in ("quality", "refund", "service", "other") for label in labels
               if label != "logistics")


def test_yes_no_classification(client: Client) -> None:
    system = ("Decide whether the customer asks for money back.\n"
              'Answer as JSON: {"refund_request": "yes|no"}\n'
              "Rules:\n- if the text mentions refund, money back, 退款 then refund_request = yes\n"
              "- otherwise refund_request = no\n")
    for text, expected in (("I want a REFUND now", "yes"), ("请给我退款", "yes"),
                           ("The box was dented", "no")):
        answer = orjson.loads(content(client.chat(messages(text, system))[2]))
        assert answer == {"refund_request": expected}


def test_plain_text_answer_without_schema(client: Client) -> None:
    msgs = [{"role": "user", "content": "Tell me a story about a cat. It purrs."}]
    first = content(client.chat(msgs)[2])
    assert first.startswith("Simulated reply ") and "Tell me a story about a cat" in first
    assert content(client.chat(msgs)[2]) == first
    json_mode = content(client.chat(msgs, response_format={"type": "json_object"})[2])
    assert "answer" in orjson.loads(json_mode)


# ------------------------------------------------------------------------ prompt grammar

def test_prompt_grammar_variants() -> None:
    spec = parse_instructions(
        "Return JSON.\n"
        '{"type": "object", "properties": {"label": {"enum": ["a", "b"]}, '
        '"score": {"type": "integer", "minimum": 0, "maximum": 3}, "note": {"type": "string"}}}\n'
        "1. label：取值 a、b\n"
        "* note: text, at most 5 characters\n"
        "- when the input contains 'alpha' or \"阿尔法\", then label = a and score = 3\n"
        "- β|gamma => label: b\n"
        "- 若出现 德尔塔 就 score 为 1\n"
        "- default: label = b\n")
    fields = {f.name: f for f in spec.fields}
    assert fields["label"].kind == ENUM and fields["label"].choices == ("a", "b")
    assert (fields["score"].kind, fields["score"].lo, fields["score"].hi) == (INT, 0, 3)
    assert fields["note"].kind == TEXT and fields["note"].max_chars == 5
    assert [r.keywords for r in spec.rules] == [("alpha", "阿尔法"), ("β", "gamma"), ("德尔塔",),
                                                 ()]
    assert spec.rules[0].assignments == (("label", "a"), ("score", 3))
    assert spec.rules[2].assignments == (("score", 1),)
    r = Responder()
    system = "Return JSON.\n" + "\n".join(
        line for line in ["label: one of a, b", "score: integer 0-3",
                          "if the text mentions alpha then label = a, score = 3",
                          "otherwise label = b"])
    answer = orjson.loads(r.answer(messages("ALPHA!", system)).content)
    assert answer == {"label": "a", "score": 3}


def test_split_prompt_without_delimiters() -> None:
    msgs = [{"role": "system", "content": "rules"}, {"role": "user", "content": "the input"}]
    assert split_prompt(msgs) == ("rules", "the input")
    msgs = [{"role": "user", "content": "see <input> below\n<input>\nx\n</input>\nthanks"}]
    instructions, text = split_prompt(msgs)
    assert text == "x" and "thanks" in instructions and "see <input> below" in instructions


# ------------------------------------------------------------------------ in-process API

def test_start_in_process() -> None:
    async def main() -> None:
        import aiohttp
        handle = await start(SimulatorConfig(rpm=100), port=0)
        try:
            async with aiohttp.ClientSession() as session, session.post(
                    f"{handle.url}/chat/completions",
                    json={"model": "m", "messages": messages("退款")}) as resp:
                assert resp.status == 200
                assert resp.headers["x-ratelimit-remaining-requests"] == "99"
            assert handle.simulator.stats.requests == 1
        finally:
            await handle.close()

    asyncio.run(main())


def test_start_takes_a_mapping_of_settings_and_names_a_bad_one() -> None:
    """``start()`` takes the settings as a mapping, as ``SimulatorProcess`` and
    ``configure`` do, and refuses a bad one by name."""
    async def main() -> None:
        handle = await start({"rpm": 100, "latency": {"mean_ms": 0}}, port=0)
        try:
            assert handle.simulator.config.rpm == 100
        finally:
            await handle.close()
        with pytest.raises(ValidationError, match="rpm"):
            await start({"rpm": -1}, port=0)

    asyncio.run(main())


def test_simulator_process_cleans_up() -> None:
    with SimulatorProcess({"latency": 5}) as sim:
        proc = sim.proc
        assert proc is not None and proc.poll() is None
        assert sim.health()["ok"] is True
        assert sim.url.endswith("/v1")
    assert proc.poll() is not None


# ------------------------------------------------------------------------ example data

def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"complaints_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_complaint_tasks_are_valid_and_deterministic() -> None:
    gen = _load("generate")
    prompt = gen.load_prompt(EXAMPLES / "prompt_v1.txt")
    lines = list(gen.tasks(50, 3, prompt, "20261201", "b1", 0.2))
    assert lines == list(gen.tasks(50, 3, prompt, "20261201", "b1", 0.2))
    assert lines[0]["task_id"] == "20261201_cs_000001"
    from lockgate.runtime.render import render
    from lockgate.spec import TaskConfig
    for line in lines:
        task = parse_task(line)
        config = TaskConfig.model_validate(task.config_document())
        rendered = render(config, task.input_data)
        text = unicodedata.normalize("NFKC", line["input_data"]["text"])
        assert f"<input>\n{text[:10]}" in rendered.messages[-1]["content"]
        assert '{"category": "...", "emotion": 3' in rendered.messages[0]["content"]


def test_prompt_versions_rank_by_accuracy() -> None:
    gen = _load("generate")
    responder = Responder()
    acc: dict[tuple[str, str], float] = {}
    for version in ("v1", "v2", "v3"):
        prompt = gen.load_prompt(EXAMPLES / f"prompt_{version}.txt")
        for kind in ("regular", "hard"):
            items = list(gen.dataset(kind, 200, 11))
            hits = 0
            for item in items:
                msgs = [{"role": m["role"], "content": m["content"].format(
                    text=item["input"]["text"])} for m in prompt]
                answer = orjson.loads(responder.answer(msgs).content)
                hits += answer["category"] == item["expected"]["category"]
            acc[version, kind] = hits / len(items)
    assert acc["v1", "regular"] >= 0.95
    assert acc["v3", "regular"] <= 0.6
    assert acc["v2", "hard"] >= acc["v1", "hard"] + 0.4
    assert acc["v1", "hard"] < acc["v1", "regular"]


# ------------------------------------------------------------------------ properties, flags

@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 400)), min_size=1, max_size=80),
       st.integers(1, 6), st.integers(400, 1500), st.sampled_from([None, 10, 5, 2.5, 1]))
def test_window_matches_reference_model(steps: list[tuple[int, int]], rpm: int,
                                        tpm: int, enforce: float | None) -> None:
    """Decisions and waits equal a brute-force sliding window (times in quarter seconds),
    with and without a shorter enforcement window."""
    rl = RateLimiter()
    admitted: list[tuple[float, int]] = []
    now = 0.0
    window = 10.0
    # (length, request limit, token limit) of every window that applies
    windows = [(window, rpm, tpm)]
    if enforce is not None and enforce < window:
        windows.append((enforce, scaled_limit(rpm, enforce, window),
                        scaled_limit(tpm, enforce, window)))

    def fits(at: float, tokens: int) -> bool:
        return all(len([1 for t, _n in admitted if t > at - length]) + 1 <= r
                   and sum(n for t, n in admitted if t > at - length) + tokens <= k
                   for length, r, k in windows)

    for gap, tokens in steps:
        now += gap / 4
        ok = fits(now, tokens)
        d = rl.admit("k", tokens, now, rpm=rpm, tpm=tpm, window=window, enforce=enforce)
        assert d.admitted == ok
        if ok:
            admitted.append((now, tokens))
        elif d.too_large:
            assert any(tokens > k for _length, _r, k in windows)
        else:
            # the earliest later time at which the reference admits the request
            later = sorted({t + length for t, _n in admitted for length, _r, _k in windows
                            if t + length > now})
            expect = next(at for at in later if fits(at, tokens))
            assert d.wait_s == pytest.approx(expect - now)


def test_flags_override_config_file(tmp_path: Path) -> None:
    from lockgate.simulator.cli import build_parser, config_from_args
    path = tmp_path / "sim.json"
    path.write_bytes(orjson.dumps({"rpm": 10, "latency": {"kind": "lognormal", "mean_ms": 50},
                                   "rate_500": 0.1}))
    args = build_parser().parse_args(["--config", str(path), "--config-json", '{"rpm": 20}',
                                      "--latency-ms", "80", "--rate-503", "0.2",
                                      "--quota-exhausted"])
    cfg = config_from_args(args)
    assert cfg.rpm == 20 and cfg.rate_500 == 0.1 and cfg.rate_503 == 0.2
    assert cfg.latency.kind == "lognormal" and cfg.latency.mean_ms == 80
    assert cfg.quota_exhausted is True and cfg.tpm is None
    assert (cfg.enforce_s, cfg.header_style, cfg.retry_hint) == (None, "openai", "both")
    args = build_parser().parse_args(["--rpm", "60000", "--enforce-s", "1", "--header-style",
                                      "gateway", "--retry-hint", "seconds"])
    cfg = config_from_args(args)
    assert (cfg.rpm, cfg.window_s, cfg.enforce_s) == (60000, 60, 1)
    assert (cfg.header_style, cfg.retry_hint) == ("gateway", "seconds")
    with pytest.raises(ValueError, match="must not exceed window_s"):
        cfg.patched({"window_s": 0.5})
    with pytest.raises(ValueError, match="at most 1"):
        cfg.patched({"rate_429": 0.5, "rate_503": 0.6})


def test_a_port_in_use_is_one_line_naming_the_fix() -> None:
    """``lockgate simulate --port N`` with N taken printed its own prefix and exited 1;
    it says ``error: ...`` and how to get a free port, with the CLI's exit code 2."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = subprocess.run([sys.executable, "-m", "lockgate.simulator", "--port",
                              str(port)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip() == (
        f"error: the simulator cannot listen on 127.0.0.1:{port}: something listens there "
        "already; stop it, or pass --port 0 for any free port")
