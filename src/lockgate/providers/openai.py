"""A client for any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, Ollama,
DashScope/Qwen, GLM, the built-in simulator), on aiohttp with keep-alive connections,
or on pyreqwest (the ``fast-http`` extra: connections, HTTP parsing and timeouts on a
Rust thread, less of the event loop's CPU per call)."""

from __future__ import annotations

import asyncio
import base64
import json
import re
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, Literal
from urllib.parse import unquote, urlsplit, urlunsplit

import aiohttp
import orjson

try:  # the optional fast-http extra
    from pyreqwest.client import ClientBuilder
    from pyreqwest.exceptions import DecodeError as PyreqwestDecodeError
    from pyreqwest.exceptions import PyreqwestError
except ImportError:  # pragma: no cover - checked by check_http_client
    ClientBuilder = None  # type: ignore[assignment,misc]
    PyreqwestError = OSError  # type: ignore[assignment,misc]
    PyreqwestDecodeError = OSError  # type: ignore[assignment,misc]

from lockgate.errors import ConfigError, ErrorClass
from lockgate.providers.base import Completion, CompletionRequest, ProviderError
from lockgate.providers.headers import parse_retry_after_ms, rate_headers

#: The largest response body kept as returned (for exports); beyond it only the parsed
#: answer is kept.
MAX_BODY = 1 << 20


def _lenient_json(raw: bytes) -> Any:
    """A body orjson refuses, read by the standard library, which takes what some
    providers write and orjson does not: a lone surrogate escape (``\\ud800``) in a
    model's answer, NaN. None if that fails too."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def _kept_body(raw: bytes) -> str | None:
    if not raw or len(raw) > MAX_BODY:
        return None
    try:
        text = raw.decode()
    except UnicodeDecodeError:
        return None
    return text if text.lstrip()[:1] in ("{", "[") else None


def classify_response(status: int, body: Any, headers: Mapping[str, str],
                      raw: bytes = b"") -> ProviderError:
    """Map an error response to the most specific :class:`ErrorClass`."""
    err = body.get("error") if isinstance(body, dict) else None
    code, etype, message = _error_fields(body, err)
    retry_after = parse_retry_after_ms(headers)
    if status == 402 or _QUOTA_WORDS.search(f"{code} {etype}"):
        # 402 Payment Required (an account without balance) or an OpenAI-style
        # insufficient_quota: the fallback endpoint takes over.
        cls = ErrorClass.QUOTA_EXHAUSTED
    elif status == 429:
        cls = ErrorClass.RATE_LIMITED
    elif code == "context_length_exceeded" or "maximum context length" in message:
        cls = ErrorClass.CONTEXT_LENGTH_EXCEEDED
    elif status in (401, 403):
        cls = ErrorClass.AUTH_ERROR
    elif status in (408, 504):
        cls = ErrorClass.TIMEOUT
    elif status >= 500:
        cls = ErrorClass.SERVER_ERROR
    elif code == "content_filter" or etype == "content_filter":
        cls = ErrorClass.CONTENT_FILTERED
    else:
        cls = ErrorClass.INVALID_REQUEST
    return ProviderError(cls, f"HTTP {status}: {message}", http_status=status,
                         retry_after_ms=retry_after, rate_limit=rate_headers(headers),
                         request_id=headers.get("x-request-id"), body=_kept_body(raw))


#: Error codes and types of an account out of money or quota (OpenAI, DeepSeek and
#: others).
_QUOTA_WORDS = re.compile(r"(?i)insufficient_(?:quota|balance|funds)|billing|arrears")
#: Error codes and types of a rate limit (in a body whose status does not say so).
_RATE_WORDS = re.compile(r"(?i)rate.?limit|too.?many.?requests|throttl")


def _first_choice(choices: Any) -> Any:
    """The answer asked for (``n = 1``): the choice whose ``index`` is 0 when the
    choices are numbered (a body need not list them in order), else the first."""
    if isinstance(choices, list):
        for c in choices:
            if isinstance(c, dict) and c.get("index") == 0:
                return c
    return choices[0]


def _either(usage: Mapping[str, Any], name: str, other: str) -> Any:
    value = usage.get(name)
    return usage.get(other) if value is None else value


def _error_fields(body: Any, err: Any) -> tuple[str, str, str]:
    """Code, type and message of an error body: OpenAI's ``{"error": {...}}``, a plain
    ``{"error": "text"}``, vLLM's ``{"object": "error", "message": ...}``, or any other
    text (its first 500 characters)."""
    if isinstance(err, dict):
        message = err.get("message") or err.get("msg") or orjson.dumps(err).decode()
        return str(err.get("code") or ""), str(err.get("type") or ""), str(message)[:500]
    if isinstance(body, dict):
        message = err if isinstance(err, str) and err else body.get("message") \
            or body.get("detail") or orjson.dumps(body, default=str).decode()
        return str(body.get("code") or ""), str(body.get("type") or ""), str(message)[:500]
    return "", "", str(body)[:500]


def _error_in_body(status: int, data: Any, headers: Mapping[str, str],
                   raw: bytes) -> ProviderError | None:
    """A 2xx answer that carries an error object instead of choices (gateways do so):
    classified by its code, type and message, as its status would have been; None
    when the body holds no error."""
    err = data.get("error") if isinstance(data, dict) else None
    if not err and not (isinstance(data, dict) and data.get("object") == "error"):
        return None
    code, etype, message = _error_fields(data, err)
    said = f"{code} {etype} {message}"
    inner = int(code) if code.isdigit() and 400 <= int(code) < 600 else None
    if _QUOTA_WORDS.search(said):
        as_status = 402
    elif _RATE_WORDS.search(said):
        as_status = 429
    elif inner is not None:
        as_status = inner
    elif "context_length" in said or "maximum context length" in said:
        as_status = 400
    else:
        as_status = 500  # the provider failed to answer: worth another attempt
    found = classify_response(as_status, data, headers, raw)
    return ProviderError(found.error_class, f"HTTP {status} with an error in the body: "
                         f"{message}", http_status=status,
                         retry_after_ms=found.retry_after_ms, rate_limit=found.rate_limit,
                         request_id=found.request_id, body=found.body)


def _unreadable(exc: BaseException, status: int | None = None,
                headers: Mapping[str, str] | None = None) -> ProviderError:
    """An answer whose body could not be read (a wrong Content-Encoding, a connection
    cut mid-body): a failed answer (``server_error``), not an unreachable endpoint."""
    said = f"HTTP {status}: " if status is not None else ""
    encoding = f"; Content-Encoding {headers.get('content-encoding') or 'none'}" \
        if headers is not None else ""
    return ProviderError(ErrorClass.SERVER_ERROR, f"{said}the body could not be read "
                         f"({type(exc).__name__}: {exc}{encoding})", http_status=status)


def _content(content: Any) -> str:
    """A message's content as text: a string, or a list of parts whose text parts are
    joined (``[{"type": "text", "text": ...}]``)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") if isinstance(p, dict) else
                       p if isinstance(p, str) else "" for p in content)
    return "" if content is None else str(content)


def _not_a_completion(status: int, data: Any, raw: bytes,
                      headers: Mapping[str, str]) -> str:
    """What a 2xx body that holds no completion is, for the error message."""
    kind = headers.get("content-type") or "no content type"
    start = raw[:120].decode("utf-8", "replace")
    if not raw.strip():
        return f"HTTP {status} with an empty body ({kind})"
    if raw.lstrip()[:1] not in (b"{", b"["):
        return f"HTTP {status} with a body that is not JSON ({kind}): {start!r}"
    if data is None:
        return f"HTTP {status} with a body that is not valid JSON ({len(raw)} bytes, " \
               f"cut off?): {start!r}"
    return f"HTTP {status} without choices[0].message in the body: {start!r}"


#: The largest token count taken from a provider's ``usage`` (it is stored in 32-bit
#: integer columns); anything larger, negative or not a whole number is not a count.
MAX_TOKEN_COUNT = 2**31 - 1


def token_count(value: Any) -> int | None:
    """A ``usage`` figure as the integer it should be, or None when the provider sent
    something else (a string, a fraction, a huge or negative number, a bool)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and 0 <= value <= MAX_TOKEN_COUNT:
        return value
    return None


#: The HTTP clients a worker can make its calls with.
HttpClient = Literal["aiohttp", "pyreqwest"]


def check_http_client(name: HttpClient) -> None:
    """:class:`ConfigError` if ``name`` is a client that is not installed."""
    if name == "pyreqwest" and ClientBuilder is None:
        raise ConfigError("[worker] http_client = 'pyreqwest' needs the pyreqwest package: "
                          "install lockgate[fast-http], or set http_client = 'aiohttp'")


def _credentials(name: str, base_url: str) -> tuple[str, str | None]:
    """``base_url`` without the ``user:password@`` it may carry, and those credentials
    as an HTTP Basic ``Authorization`` value (None without them). The clients are not
    left to read them from the URL: aiohttp refuses a URL with credentials beside an
    Authorization header (every call failed), pyreqwest would send them its own way."""
    parts = urlsplit(base_url)
    if "@" not in parts.netloc:
        return base_url, None
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    if not host:
        raise ConfigError(f"endpoint '{name}': base_url names no host after its "
                          "credentials (user:password@host)")
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
    return urlunsplit(parts._replace(netloc=host)), f"Basic {token}"


class OpenAICompatible:
    """Chat completions over HTTP. One instance per endpoint; one session per event loop."""

    def __init__(self, name: str, base_url: str, *, api_key: str | None = None,
                 max_connections: int = 1000, send_idempotency_key: bool = True,
                 headers: Mapping[str, str] | None = None,
                 http_client: HttpClient = "aiohttp") -> None:
        check_http_client(http_client)
        self.name = name
        self.http_client = http_client
        base_url, basic = _credentials(name, base_url)
        self.url = base_url.rstrip("/") + "/chat/completions"
        self._headers = {"Content-Type": "application/json", **(headers or {})}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        if basic is not None:
            if any(k.lower() == "authorization" for k in self._headers):
                other = "an API key (api_key_env) is set" if api_key \
                    else "its headers set Authorization"
                raise ConfigError(
                    f"endpoint '{name}': base_url carries a user and password and {other}: "
                    "a request carries one Authorization header. Remove the credentials "
                    "from base_url, or the other one")
            self._headers["Authorization"] = basic
        self._send_key = send_idempotency_key
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}
        self._reqwest: Any = None  # pyreqwest's client, made on first use
        self._durations: dict[float, timedelta] = {}

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._max_connections, limit_per_host=0,
                                             keepalive_timeout=30, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(
                connector=connector, json_serialize=lambda o: orjson.dumps(o).decode(),
                skip_auto_headers=("User-Agent",))
        return self._session

    async def complete(self, request: CompletionRequest) -> Completion:
        """POST one chat completion; every failure becomes a classified ProviderError."""
        # The fields lockgate decides come last: no parameter may replace them.
        body = {**request.params, "model": request.model, "messages": request.messages}
        body.pop("stream", None)
        headers = self._headers
        if self._send_key and request.idempotency_key:
            headers = {**headers, "Idempotency-Key": request.idempotency_key}
        if self.http_client == "pyreqwest":
            status, resp_headers, raw = await self._post_reqwest(
                orjson.dumps(body), headers, request.timeout_s)
        else:
            status, resp_headers, raw = await self._post_aiohttp(
                orjson.dumps(body), headers, request.timeout_s)
        strict = True
        try:
            data = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            data, strict = _lenient_json(raw), False
        if not 200 <= status < 300:
            raise classify_response(status, data if data is not None else raw[:300].decode(
                "utf-8", "replace"), resp_headers, raw)
        in_body = _error_in_body(status, data, resp_headers, raw)
        if in_body is not None:
            raise in_body
        answer = self._completion(data, status, resp_headers, request.model, raw)
        # A body only the lenient reader takes is not kept: exports read it back strictly.
        answer.body = _kept_body(raw) if strict else None
        return answer

    async def _post_aiohttp(self, body: bytes, headers: Mapping[str, str],
                            timeout_s: float) -> tuple[int, Mapping[str, str], bytes]:
        timeout = self._timeouts.get(timeout_s)
        if timeout is None:
            timeout = self._timeouts[timeout_s] = aiohttp.ClientTimeout(total=timeout_s)
        try:
            async with self._client().post(self.url, data=body, headers=headers,
                                           timeout=timeout) as resp:
                try:
                    return resp.status, resp.headers, await resp.read()
                except aiohttp.ClientPayloadError as exc:
                    # A status line came: the endpoint answered.
                    raise _unreadable(exc, resp.status, resp.headers) from None
        except TimeoutError:
            raise ProviderError(ErrorClass.TIMEOUT,
                                f"no answer within {timeout_s:g} s") from None
        except aiohttp.ClientError as exc:
            raise ProviderError(ErrorClass.CONNECTION_ERROR,
                                f"{type(exc).__name__}: {exc}") from None

    async def _post_reqwest(self, body: bytes, headers: Mapping[str, str],
                            timeout_s: float) -> tuple[int, Mapping[str, str], bytes]:
        """The same POST on pyreqwest. Its timeouts are TimeoutErrors; every other
        failure of the request is a PyreqwestError, a connection error here."""
        if self._reqwest is None:
            self._reqwest = (ClientBuilder().max_connections(self._max_connections)
                             .pool_idle_timeout(timedelta(seconds=30)).build())
        timeout = self._durations.get(timeout_s)
        if timeout is None:
            timeout = self._durations[timeout_s] = timedelta(seconds=timeout_s)
        try:
            resp = await (self._reqwest.post(self.url).body_bytes(body).headers(headers)
                          .timeout(timeout).build().send())
            try:
                raw = bytes(await resp.bytes())
            except PyreqwestError as exc:
                # A status line came: the endpoint answered.
                raise _unreadable(exc, int(resp.status), resp.headers) from None
        except TimeoutError:
            raise ProviderError(ErrorClass.TIMEOUT,
                                f"no answer within {timeout_s:g} s") from None
        except PyreqwestDecodeError as exc:
            # Read with the status (pyreqwest decodes the body before it answers).
            raise _unreadable(exc) from None
        except PyreqwestError as exc:
            raise ProviderError(ErrorClass.CONNECTION_ERROR,
                                f"{type(exc).__name__}: {exc}") from None
        return int(resp.status), resp.headers, raw

    @staticmethod
    def _completion(data: Any, status: int, headers: Mapping[str, str],
                    model: str, raw: bytes = b"") -> Completion:
        try:
            choice = _first_choice(data["choices"])
            content = _content(choice["message"].get("content"))
            finish = choice.get("finish_reason")
        except (TypeError, KeyError, IndexError, AttributeError):
            raise ProviderError(ErrorClass.SERVER_ERROR,
                                _not_a_completion(status, data, raw, headers),
                                http_status=status) from None
        if finish == "content_filter":
            raise ProviderError(ErrorClass.CONTENT_FILTERED, "the provider filtered the answer",
                                http_status=status)
        refusal = choice["message"].get("refusal")
        if not content.strip() and isinstance(refusal, str) and refusal.strip():
            # OpenAI's structured outputs: the model declined, saying why (not a
            # malformed answer to retry)
            raise ProviderError(ErrorClass.CONTENT_FILTERED,
                                f"the model refused: {refusal.strip()[:300]}",
                                http_status=status)
        usage = data.get("usage")
        if not isinstance(usage, dict):
            usage = {}
        answered = data.get("model")
        return Completion(
            content=content, http_status=status,
            model=answered if isinstance(answered, str) and answered else model,
            # OpenAI's names, else those some gateways pass on (Anthropic's)
            prompt_tokens=token_count(_either(usage, "prompt_tokens", "input_tokens")),
            completion_tokens=token_count(_either(usage, "completion_tokens",
                                                  "output_tokens")),
            finish_reason=finish if isinstance(finish, str) else None,
            request_id=headers.get("x-request-id"), rate_limit=rate_headers(headers))

    async def close(self) -> None:
        """Close the HTTP session (and its connections)."""
        if self._session is not None and not self._session.closed:
            await self._session.close()
            await asyncio.sleep(0)
        if self._reqwest is not None:
            client, self._reqwest = self._reqwest, None
            await client.close()
