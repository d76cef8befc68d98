"""A client for any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM, Ollama,
DashScope/Qwen, GLM, the built-in simulator), on aiohttp with keep-alive connections,
or on pyreqwest (the ``fast-http`` extra: connections, HTTP parsing and timeouts on a
Rust thread, less of the event loop's CPU per call)."""

from __future__ import annotations

import asyncio
import base64
import codecs
import contextlib
import errno
import html
import http
import json
import logging
import re
import time
import zlib
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from types import SimpleNamespace
from typing import Any, Literal
from urllib.parse import parse_qsl, unquote, urljoin, urlsplit, urlunsplit

import aiohttp
import orjson
from aiohttp.helpers import basicauth_from_netrc, netrc_from_env, strip_auth_from_url
from yarl import URL

try:  # the optional fast-http extra
    from pyreqwest.client import ClientBuilder
    from pyreqwest.exceptions import BodyDecodeError as PyreqwestBodyDecodeError
    from pyreqwest.exceptions import ConnectError as PyreqwestConnectError
    from pyreqwest.exceptions import DecodeError as PyreqwestDecodeError
    from pyreqwest.exceptions import PyreqwestError
except ImportError:  # pragma: no cover - checked by check_http_client
    ClientBuilder = None  # type: ignore[assignment,misc]
    PyreqwestError = OSError  # type: ignore[assignment,misc]
    PyreqwestDecodeError = OSError  # type: ignore[assignment,misc]
    PyreqwestBodyDecodeError = OSError  # type: ignore[assignment,misc]
    PyreqwestConnectError = OSError  # type: ignore[assignment,misc]

from lockgate.errors import ConfigError, ErrorClass
from lockgate.providers.base import Completion, CompletionRequest, ProviderError
from lockgate.providers.environment import proxy_for
from lockgate.providers.headers import parse_retry_after_ms, rate_headers
from lockgate.redact import Secrets, redact_url

log = logging.getLogger("lockgate.providers")

#: The largest response body kept as returned (for exports); beyond it only the parsed
#: answer is kept.
MAX_BODY = 1 << 20
#: The longest ``x-request-id`` and answered ``model`` kept: the columns that store
#: them hold 128 and 200 characters, and PostgreSQL and MariaDB refuse a longer value
#: (the write-back of the attempt failed, and its task was called again).
MAX_REQUEST_ID = 128
MAX_MODEL = 200
#: The longest status or header line aiohttp reads (its default, 8190 bytes, refused
#: answers with a long Set-Cookie that pyreqwest takes: hyper bounds only the whole
#: head, at about 400 KB).
MAX_HEADER_LINE = 256 * 1024


async def _on_reuse(_session: aiohttp.ClientSession, ctx: SimpleNamespace,
                    _params: Any) -> None:
    """aiohttp's trace of a request sent on a pooled keep-alive connection."""
    request_ctx = ctx.trace_request_ctx
    if request_ctx is not None:
        request_ctx.reused = True


#: Tells each request whether it went on a pooled connection (its trace_request_ctx).
_REUSE_TRACE = aiohttp.TraceConfig()
_REUSE_TRACE.on_connection_reuseconn.append(_on_reuse)
_REUSE_TRACE.freeze()


def _request_id(headers: Mapping[str, str]) -> str | None:
    """The provider's ``x-request-id``, cut to what the database stores."""
    value = headers.get("x-request-id")
    return value[:MAX_REQUEST_ID] if value else None


def _charset(headers: Mapping[str, str]) -> str | None:
    """The charset a Content-Type declares (``application/json; charset=gbk``)."""
    found = re.search(r'(?i)charset\s*=\s*"?([\w.:-]+)', headers.get("content-type") or "")
    return found.group(1) if found else None


def _is_utf8(raw: bytes) -> bool:
    """Whether a body is UTF-8 text: valid UTF-8 without a NUL (UTF-16 and UTF-32 text
    is valid UTF-8 byte by byte, with NULs between its ASCII characters)."""
    if b"\x00" in raw:
        return False
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _as_utf8(status: int, raw: bytes, headers: Mapping[str, str]) -> bytes:
    """The body in UTF-8, which everything after reads. JSON is UTF-8 (RFC 8259), and
    gateways label it with a default charset they never encoded it in (Tomcat's and
    Spring's ``charset=ISO-8859-1``): a body that is valid UTF-8 is taken as UTF-8
    whatever its Content-Type says. Only one that is not is decoded with the charset
    its Content-Type declares (GBK, ISO-8859-1, UTF-16...). Without a charset, or with
    one Python does not know, the body is left as it came (read as UTF-8, leniently).
    A 2xx body that is not valid in its declared charset is a failed answer that says
    so; an error body is classified by its status anyway."""
    name = _charset(headers)
    if name is None or not raw:
        return raw
    try:
        codec = codecs.lookup(name).name
    except LookupError:
        return raw
    if codec == "utf-8" or _is_utf8(raw):
        return raw
    try:
        return raw.decode(codec).encode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:
        if not 200 <= status < 300:
            return raw
        raise ProviderError(ErrorClass.SERVER_ERROR, f"HTTP {status} with a body that is "
                            f"not valid {name}, the charset its Content-Type declares "
                            f"({exc.reason} at byte {exc.start}): "
                            f"{raw[:120]!r}", http_status=status,
                            request_id=_request_id(headers)) from None


def _inflated(raw: bytes, headers: Mapping[str, str]) -> bytes:
    """A body pyreqwest was told not to decode (so that a failure names its status
    and encoding, as aiohttp's does), decoded here: gzip, or deflate with or without
    its zlib header (aiohttp takes both; reqwest took only the first)."""
    encoding = (headers.get("content-encoding") or "").strip().lower()
    if encoding in ("", "identity"):
        return raw
    try:
        if encoding in ("gzip", "x-gzip"):
            return zlib.decompress(raw, wbits=16 + zlib.MAX_WBITS)
        if encoding == "deflate":
            try:
                return zlib.decompress(raw)
            except zlib.error:
                return zlib.decompress(raw, wbits=-zlib.MAX_WBITS)
    except zlib.error as exc:
        raise ValueError(f"not valid {encoding} data ({exc})") from None
    raise ValueError(f"an encoding lockgate does not decode: {encoding!r}")


def _lenient_json(raw: bytes) -> Any:
    """A body orjson refuses, read by the standard library, which takes what some
    providers write and orjson does not: a lone surrogate escape (``\\ud800``) in a
    model's answer, NaN, a byte order mark, whitespace or NULs after the JSON. None if
    that fails too, or if more follows the JSON (:func:`_json_prefix`)."""
    data, extra_at = _json_prefix(raw)
    return None if extra_at is not None else data


#: What may follow a JSON body and still leave it whole (NULs: a buffer padded).
_JSON_TAIL = " \t\r\n\x00"


def _json_prefix(raw: bytes) -> tuple[Any, int | None]:
    """The JSON value a body begins with, read by the standard library (see
    :func:`_lenient_json`), and the byte at which something other than whitespace or
    NULs follows it (a second object, a chunked-encoding trailer ``0\\r\\n`` leaked
    into the body by a proxy), None when nothing does. (None, None) when the body
    does not begin with a JSON value, or begins with a number or a string followed by
    more (text such as ``404: Not Found``)."""
    try:
        codec = json.detect_encoding(raw)
        text = raw.decode(codec, "surrogatepass")
        start = len(text) - len(text.lstrip(_JSON_TAIL))
        data, end = json.JSONDecoder().raw_decode(text, start)
    except (ValueError, RecursionError):
        return None, None
    if not text[end:].strip(_JSON_TAIL):
        return data, None
    if not isinstance(data, dict | list):  # "404: Not Found" is text, not the JSON 404
        return None, None
    rest = end + len(text[end:]) - len(text[end:].lstrip(_JSON_TAIL))
    return data, len(text[:rest].encode(codec, "surrogatepass"))


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
    body = _unwrapped(body)
    err = body.get("error") if isinstance(body, dict) else None
    code, etype, message = _error_fields(body, err)
    return _answered_error(_error_class(status, code, etype, message, _reasons(err),
                                        moderated=_moderated(err, message)),
                           f"HTTP {status}: {message}", status, headers, raw)


def _unwrapped(body: Any) -> Any:
    """An error body as one object: Gemini wraps its error in a list of one,
    ``[{"error": {...}}]``."""
    if isinstance(body, list) and len(body) == 1 and isinstance(body[0], dict):
        return body[0]
    return body


def _reasons(err: Any) -> str:
    """The ``reason`` of each entry of an error's ``details`` (Google's ErrorInfo:
    ``API_KEY_INVALID``), space-separated."""
    details = err.get("details") if isinstance(err, dict) else None
    if not isinstance(details, list):
        return ""
    return " ".join(str(d["reason"]) for d in details
                    if isinstance(d, dict) and d.get("reason"))[:500]


def _answered_error(cls: ErrorClass, text: str, status: int, headers: Mapping[str, str],
                    raw: bytes) -> ProviderError:
    """An error the endpoint answered with (a status, headers, a body): with what the
    answer tells beside the class: when to try again, the rate-limit headers, the
    request id and the body (kept when small)."""
    return ProviderError(cls, text, http_status=status,
                         retry_after_ms=parse_retry_after_ms(headers),
                         rate_limit=rate_headers(headers), request_id=_request_id(headers),
                         body=_kept_body(raw))


def _error_class(status: int, code: str, etype: str, message: str,
                 reasons: str = "", *, moderated: bool = False) -> ErrorClass:
    """The class of an error answer, from its status and what its body says. What the
    body names beats the status where providers disagree on statuses: an exhausted
    balance comes as 400, 402, 403 or 429, a context length as 400 or 413, a filtered
    prompt as 400, 403 (OpenRouter's moderation) or 500, a refused key as 400
    (Gemini), 401 or 403. (A 5xx is the server failing: its message is not taken for
    an exhausted balance, a refused key or a moderation verdict, only its code.)
    ``moderated``: the error's message or metadata says a moderation flagged the
    prompt or the answer (:func:`_moderated`)."""
    if status == 402 or is_quota(code, etype, message if status < 500 else ""):
        return ErrorClass.QUOTA_EXHAUSTED
    if status == 429:
        return ErrorClass.RATE_LIMITED
    if is_context_length(code, etype, message):
        return ErrorClass.CONTEXT_LENGTH_EXCEEDED
    if moderated and status < 500:
        # before the refused key: OpenRouter's moderation answers 403 (the prompt's,
        # never the key's: the endpoint serves every other prompt)
        return ErrorClass.CONTENT_FILTERED
    if status in (401, 403) or is_key_refused(code, etype, message if status < 500 else "",
                                              reasons):
        return ErrorClass.AUTH_ERROR
    if status in (408, 504):
        return ErrorClass.TIMEOUT
    if is_filtered(code, etype):
        # before the 5xx: a filter is the prompt's, another attempt meets it again
        return ErrorClass.CONTENT_FILTERED
    if status >= 500 or status in RETRIED_4XX:
        return ErrorClass.SERVER_ERROR
    return ErrorClass.INVALID_REQUEST


#: 4xx statuses that say "not now" rather than "not this request": 409 Conflict (a
#: request with the same Idempotency-Key still in progress, a resource busy) and 425
#: Too Early (RFC 8470: retry). openai-python and Anthropic's SDK retry 409; they are
#: ``server_error`` here (retried under the task's policy; a lone one does not open
#: the breaker, a run of them does, as of 5xx). 408 is ``timeout``, 429 ``rate_limited``.
RETRIED_4XX = frozenset({409, 425})

#: Codes, types and ``details`` reasons of a refused key (Google's API_KEY_INVALID,
#: API_KEY_EXPIRED; OpenAI's invalid_api_key).
_KEY_CODES = re.compile(r"(?i)api.?key.?(?:invalid|expired|not.?valid|service.?blocked)"
                        r"|(?:invalid|incorrect|expired).?api.?key")
#: Messages that say so (Gemini's 400 "API key not valid. Please pass a valid API key.",
#: "API key expired. Please renew the API key.").
_KEY_MESSAGE = re.compile(
    r"(?i)\bapi[ _-]?key\b.{0,30}?\b(?:not valid|invalid|expired|revoked|incorrect"
    r"|(?:is )?(?:missing|required))\b|\b(?:invalid|incorrect|expired|revoked|missing)"
    r" api[ _-]?key\b")
#: Messages of Google's PERMISSION_DENIED that speak of the key or the caller.
_KEY_PERMISSION = re.compile(r"(?i)api[ _-]?key|unregistered callers|consumer")


def is_key_refused(code: str, etype: str, message: str, reasons: str = "") -> bool:
    """Whether an error says the API key was refused (wrong, expired, blocked), in a
    status that does not say so (Gemini answers a wrong key with 400)."""
    if _KEY_CODES.search(f"{code} {etype} {reasons}") or _KEY_MESSAGE.search(message):
        return True
    return etype.upper() == "PERMISSION_DENIED" and bool(_KEY_PERMISSION.search(message))


#: Codes and types that name an account out of money or quota whatever the message
#: says (OpenAI's insufficient_quota, DashScope's Arrearage, Moonshot's
#: exceeded_current_quota_error, DeepSeek's and others' balance...). A bare "quota" is
#: not one: DashScope's rate limit is ``Throttling.RateQuota``.
_QUOTA_CODES = re.compile(
    r"(?i)insufficient.?(?:quota|balance|funds|credits?)|arrear|billing|payment.?required"
    r"|exceeded.?current.?quota|quota.?exhausted|out.?of.?credits?|not.?enough.?balance"
    r"|credit.?balance")
#: Messages that say so. Checked only when the message does not speak of a rate
#: (:data:`_RATE_MESSAGE`): OpenAI's rate limit for a free account invites to "add a
#: payment method ... /account/billing", Gemini's per-minute one says "You exceeded your
#: current quota ... Please retry in 43s".
_QUOTA_MESSAGE = re.compile(
    r"(?i)arrear|good standing|insufficient.?(?:quota|balance|funds|credits?)"
    r"|(?:balance|credits?|funds)\b.{0,20}\b(?:too low|insufficient|not enough|exhausted"
    r"|depleted|run out|ran out)|out of (?:credits?|balance|funds)"
    r"|exceeded your (?:current )?quota|quota (?:has been |is )?(?:exhausted|used up)"
    r"|billing (?:details|hard limit|limit|account|is not active|not active)"
    r"|plans? (?:&|and) billing|payment required|(?:add|purchase|buy) (?:more )?credits"
    r"|余额不足|欠费|充值")
#: Words of a rate limit: it passes by itself, where an exhausted quota does not.
_RATE_MESSAGE = re.compile(
    r"(?i)rate.?limit|too many requests|throttl|per (?:second|minute|min)\b"
    r"|\b(?:rpm|tpm|rps|tps)\b|(?:try again|retry) (?:in|after) \d|并发|频繁|限流")
#: Error codes and types of a rate limit (in a body whose status does not say so).
_RATE_WORDS = re.compile(r"(?i)rate.?limit|too.?many.?requests|throttl")
#: Codes and types of a prompt or answer the provider's filter stopped.
_FILTER_WORDS = re.compile(r"(?i)content.?filter|content.?policy|data_inspection_failed")
#: Numeric error codes that name a filtered prompt or answer: Zhipu's (GLM) 1301,
#: "the input or the answer may hold unsafe or sensitive content".
_FILTER_CODES = frozenset({"1301"})


#: Messages of a moderation that flagged the prompt or the answer (OpenRouter's 403
#: "Input flagged by moderation", "... requires moderation on OpenAI. Your input was
#: flagged for "violence""; "blocked by moderation", "violates our usage policies",
#: "rejected as a result of our safety system").
_MODERATION_MESSAGE = re.compile(
    r"(?i)\bflagged\b|\bmoderation\b.{0,40}\b(?:block|reject|refus|violat)"
    r"|\b(?:blocked|rejected|refused|stopped) by (?:the |our |a )?(?:content )?"
    r"(?:moderation|safety (?:system|filter))|\bsafety system\b"
    r"|\bviolates? (?:our |the )?(?:usage|content|acceptable use) polic")
#: "flagged" of an account, an organization, a key or a payment: not a moderation of
#: the prompt (the account's condition).
_FLAGGED_ACCOUNT = re.compile(
    r"(?i)\b(?:account|organi[sz]ation|api[ _-]?key|billing|payment|card)"
    r"\b.{0,40}\bflagged\b|\bflagged\b.{0,20}\b(?:account|organi[sz]ation|api[ _-]?key"
    r"|billing|payment)\b")


def _moderated(err: Any, message: str) -> bool:
    """Whether an error says a moderation flagged the prompt or the answer: by its
    message (:data:`_MODERATION_MESSAGE`), or by OpenRouter's moderation metadata
    (``metadata.flagged_input``)."""
    metadata = err.get("metadata") if isinstance(err, dict) else None
    if isinstance(metadata, dict) and "flagged_input" in metadata:
        return True
    return bool(_MODERATION_MESSAGE.search(message)) \
        and not _FLAGGED_ACCOUNT.search(message)


def is_filtered(code: str, etype: str) -> bool:
    """Whether an error's code or type says the provider's filter stopped the prompt or
    the answer."""
    return code.strip() in _FILTER_CODES or bool(_FILTER_WORDS.search(f"{code} {etype}"))


def is_quota(code: str, etype: str, message: str) -> bool:
    """Whether an error says the account is out of money or quota (not a rate limit,
    which passes by itself): by its code or type, else by its message unless the
    message speaks of a rate."""
    if _QUOTA_CODES.search(f"{code} {etype}"):
        return True
    return not _RATE_MESSAGE.search(message) and bool(_QUOTA_MESSAGE.search(message))


#: Codes, types and messages of a prompt longer than the model's context, in the
#: words of OpenAI, vLLM, Anthropic, llama.cpp, TGI, Gemini, Mistral, DashScope,
#: Bedrock... (Anthropic's "input length and `max_tokens` exceed context limit", vLLM
#: V1's "is longer than the maximum model length of 4096", "is too long to fit into the
#: model"). A parameter out of range ("max_tokens must be <= 4096", "max_tokens is too
#: large: ... This model supports at most 4096 completion tokens") is not one.
_CONTEXT_WORDS = re.compile(
    r"(?i)context.?length.?exceeded|exceeds?.?(?:the )?(?:available |model'?s? )?context"
    r".?(?:size|window|length|limit)|context.?window.?exceeded|maximum context length"
    r"|prompt is too long|input token count.{0,40}exceeds"
    r"|inputs?`? tokens.{0,60}must be <=|range of input length"
    r"|too (?:long|large) for (?:the |this |requested )?model"
    r"|too (?:long|large) to fit (?:in|into|within) (?:the |this )?(?:model|context)\b"
    r"|(?:longer|larger|more) than (?:the |this )?(?:model'?s? )?(?:maximum |max )?"
    r"(?:context(?:.?(?:length|window|size|limit))?|model.?len(?:gth)?)\b")


def is_context_length(code: str, etype: str, message: str) -> bool:
    """Whether an error says the prompt does not fit the model's context."""
    return bool(_CONTEXT_WORDS.search(f"{code} {etype} {message}"))


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
    """Code, type and message of an error body: OpenAI's ``{"error": {...}}`` (Gemini's
    ``status`` taken as its type), a plain ``{"error": "text"}`` (TGI's ``error_type``
    as its type), vLLM's ``{"object": "error", "message": ...}``, or any other text
    (its first 500 characters)."""
    if isinstance(err, dict):
        message = err.get("message") or err.get("msg") or err.get("detail") \
            or orjson.dumps(err, default=str).decode()
        etype = err.get("type") or err.get("status") or ""
        return str(err.get("code") or ""), str(etype), _said(message)[:500]
    if isinstance(body, dict):
        message = err if isinstance(err, str) and err else body.get("message") \
            or body.get("detail") or orjson.dumps(body, default=str).decode()
        etype = body.get("type") or body.get("error_type") or ""
        return str(body.get("code") or ""), str(etype), _said(message)[:500]
    return "", "", str(body)[:500]


def _said(message: Any) -> str:
    """An error's message as text: a string as it is; the entries of a validation
    error's ``detail`` (FastAPI's and pydantic's, Mistral's 422 ``{"detail": [{"loc":
    ["body", "logit_bias"], "msg": "Extra inputs are not permitted"}]}``) as
    ``body.logit_bias: Extra inputs are not permitted``, joined with ``; ``; anything
    else as its JSON (never a Python repr)."""
    if isinstance(message, str):
        return message
    if isinstance(message, dict):
        if isinstance(message.get("message"), str):
            return message["message"]
        detail = message.get("detail")
        if isinstance(detail, str):
            return detail
        if isinstance(detail, list):
            message = detail
    if isinstance(message, list):
        said = [_validation_entry(d) for d in message]
        if said and all(said):
            return "; ".join(str(s) for s in said)
    return orjson.dumps(message, default=str).decode()


def _validation_entry(entry: Any) -> str | None:
    """One entry of a validation error: ``loc.path: msg``, or None when it is not one."""
    if isinstance(entry, str):
        return entry
    if not isinstance(entry, dict) or not isinstance(entry.get("msg"), str):
        return None
    loc = entry.get("loc")
    where = ".".join(str(p) for p in loc) if isinstance(loc, list) and loc else ""
    return f"{where}: {entry['msg']}" if where else entry["msg"]


#: Codes and types of a key the provider refused, and of a request it refused as such.
_AUTH_WORDS = re.compile(r"(?i)authenticat|invalid.?api.?key|unauthori[sz]ed|permission"
                         r"|forbidden|access.?denied")
_INVALID_WORDS = re.compile(r"(?i)invalid.?request|not.?found|invalid.?(?:value|param"
                            r"|argument)|bad.?request|validation|unsupported")


def _inner_status(code: str) -> int | None:
    """The HTTP status an error object's code is (``"code": 403``), or None."""
    code = code.strip()
    return int(code) if code.isdigit() and 400 <= int(code) < 600 else None


def _class_in_body(code: str, etype: str, message: str, reasons: str = "", *,
                   moderated: bool = False) -> ErrorClass:
    """The class of an error object in a 2xx answer, which has no status of its own to
    go by: what its code, type and message name, else the HTTP status its code may be
    (``"code": 503``), else ``server_error`` (the provider failed to answer: worth
    another attempt). A moderation verdict (``moderated``, :func:`_moderated`) is
    ``content_filtered`` whatever its code (OpenRouter's is 403), unless that code is
    a 5xx."""
    kind = f"{code} {etype} {reasons}"
    inner = _inner_status(code)
    if is_quota(code, etype, message) or inner == 402:
        return ErrorClass.QUOTA_EXHAUSTED
    if _RATE_WORDS.search(kind) or _RATE_MESSAGE.search(message) or inner == 429:
        return ErrorClass.RATE_LIMITED
    if is_context_length(code, etype, message):
        return ErrorClass.CONTEXT_LENGTH_EXCEEDED
    if moderated and (inner is None or inner < 500):
        return ErrorClass.CONTENT_FILTERED
    if _AUTH_WORDS.search(kind) or is_key_refused(code, etype, message, reasons):
        return ErrorClass.AUTH_ERROR
    if is_filtered(code, etype) or _FILTER_WORDS.search(kind):
        return ErrorClass.CONTENT_FILTERED
    if _INVALID_WORDS.search(kind):
        return ErrorClass.INVALID_REQUEST
    if inner is not None:
        return _error_class(inner, code, etype, message, reasons)
    return ErrorClass.SERVER_ERROR


def _error_in_body(status: int, data: Any, headers: Mapping[str, str],
                   raw: bytes, where: str = "the body") -> ProviderError | None:
    """A 2xx answer that carries an error object instead of choices (gateways do so):
    classified by its code, type and message, as its status would have been; None
    when the body holds no error."""
    data = _unwrapped(data)
    err = data.get("error") if isinstance(data, dict) else None
    if not err and not (isinstance(data, dict) and data.get("object") == "error"):
        return None
    code, etype, message = _error_fields(data, err)
    found = _answered_error(_class_in_body(code, etype, message, _reasons(err),
                                           moderated=_moderated(err, message)),
                            f"HTTP {status} with an error in {where}: {message}",
                            status, headers, raw)
    # the status the error names, which flow control reads as it reads a status (an
    # auth error "code": 403 is not a refused key, as a 403 is not)
    found.inner_status = _inner_status(code)
    return found


def _unreadable(exc: BaseException, status: int | None = None,
                headers: Mapping[str, str] | None = None) -> ProviderError:
    """An answer whose body could not be read (a wrong Content-Encoding, a connection
    cut mid-body): a failed answer (``server_error``), not an unreachable endpoint."""
    said = f"HTTP {status}: " if status is not None else ""
    encoding = f"; Content-Encoding {headers.get('content-encoding') or 'none'}" \
        if headers is not None else ""
    return ProviderError(ErrorClass.SERVER_ERROR, f"{said}the body could not be read "
                         f"({type(exc).__name__}: {exc}{encoding})", http_status=status)


class _StaleConnection(Exception):
    """A request failed on a pooled keep-alive connection closed or reset before any
    answer came (see :func:`_after_send_aiohttp`): sent again once on a new one."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.exc = exc


#: What an error says of a TLS certificate the client does not trust (OpenSSL's and
#: rustls' words).
_CERT_WORDS = re.compile(r"(?i)certificate.?verify.?failed|invalid peer certificate"
                         r"|unknown.?issuer|self.?signed|local issuer|certificate has "
                         r"expired|hostname mismatch|not ?valid ?for ?name|CaUsedAsEndEntity")
#: What an error says of a TLS handshake met by something that is not TLS (a port
#: that speaks plain HTTP answers the ClientHello with an HTTP error).
_NOT_TLS_WORDS = re.compile(r"(?i)wrong.?version.?number|record.?layer.?failure"
                            r"|packet.?length.?too.?long|http.?request|invalid.?content.?type"
                            r"|corrupt message|unexpected eof while reading|tls handshake eof")
#: What an error says of a TLS handshake that failed otherwise.
_TLS_WORDS = re.compile(r"(?i)\[SSL|SSLError|\btls\b|handshake")


def tls_fix(text: str) -> str | None:
    """What to do about a TLS failure an error's text describes, or None when it
    describes none: a certificate not trusted (a private CA, a self-signed one), or a
    port that does not speak TLS (``https://`` to a plain-HTTP port)."""
    if _CERT_WORDS.search(text):
        return ("the endpoint's TLS certificate is not trusted: if it is signed by a "
                "private CA or self-signed, point SSL_CERT_FILE at that CA's certificate "
                "(PEM) or add it to the system's trust store; if it names another host, "
                "fix base_url's host")
    if _NOT_TLS_WORDS.search(text):
        return ("the port does not speak TLS (it answers as plain HTTP?): use http:// in "
                "base_url, or the port that serves https")
    if _TLS_WORDS.search(text):
        return "the TLS handshake failed: check base_url's scheme (http:// or https://) and port"
    return None


def _connection_error(exc: BaseException, detail: str | None = None) -> ProviderError:
    """A request that reached no server (none could be connected to):
    ``connection_error``; a TLS failure names its fix."""
    said = f"{type(exc).__name__}: {detail or exc}"
    fix = tls_fix(said)
    return ProviderError(ErrorClass.CONNECTION_ERROR, f"{fix} ({said})" if fix else said)


def _dropped(exc: BaseException, detail: str | None = None, *,
             status: int | None = None) -> ProviderError:
    """A request sent on a connection that then ended (closed or reset) before a
    complete answer came: the server took it, and failed to answer (``server_error``:
    an attempt spent, retried under the task's policy, as an answer that is not valid
    HTTP), not an endpoint that could not be reached."""
    what = f"after the status line of an HTTP {status} answer, before its headers ended" \
        if status is not None else "before an answer came"
    return ProviderError(ErrorClass.SERVER_ERROR,
                         f"the connection was closed after the request was sent, {what} "
                         f"({type(exc).__name__}: {detail or exc})")


def _tool_names(calls: Any) -> str:
    """The functions a model called, for the error message."""
    items = calls if isinstance(calls, list) else [calls]
    names = [str((c.get("function") or c).get("name") or "?") if isinstance(c, dict)
             else "?" for c in items]
    return ", ".join(names)[:200] or "?"


#: Words of an error about the model (a model not found is not a wrong path).
_MODEL_WORDS = re.compile(r"(?i)model")


def _with_usage(exc: ProviderError, data: Any) -> ProviderError:
    """``exc``, raised for a 2xx answer, with the usage and the model that answer
    names: the provider billed it although it is an error here (a refusal, a filtered
    answer, tool calls, no choices), and the attempt records them as a completion's."""
    if not isinstance(data, dict):
        return exc
    usage = data.get("usage")
    if isinstance(usage, dict):
        if exc.prompt_tokens is None:
            exc.prompt_tokens = token_count(_either(usage, "prompt_tokens", "input_tokens"))
        if exc.completion_tokens is None:
            exc.completion_tokens = token_count(_either(usage, "completion_tokens",
                                                        "output_tokens"))
    answered = data.get("model")
    if exc.model is None and isinstance(answered, str) and answered:
        exc.model = answered[:MAX_MODEL]
    return exc


def _resent(exc: ProviderError) -> ProviderError:
    """``exc``, marked as the outcome of a request sent twice."""
    exc.resent = True
    return exc


def _body_timeout(status: int, timeout_s: float,
                  headers: Mapping[str, str]) -> ProviderError:
    """A timeout after the answer's status and headers came, while its body did not
    finish."""
    return ProviderError(ErrorClass.TIMEOUT, f"the answer (HTTP {status}) did not finish "
                         f"within {timeout_s:g} s: its status and headers came, its body "
                         "stalled", http_status=status, request_id=_request_id(headers))


def _not_http(detail: str) -> ProviderError:
    """An answer the HTTP client could not parse (a bad status line, a bad
    Content-Length, both Content-Length and Transfer-Encoding): the endpoint answered,
    wrongly. A failed answer (``server_error``: an attempt spent, retried), not an
    unreachable endpoint that tasks would wait for."""
    return ProviderError(ErrorClass.SERVER_ERROR,
                         f"the endpoint's answer was not valid HTTP: {detail}")


def _last_cause(exc: BaseException) -> str:
    """The innermost cause pyreqwest names (``invalid HTTP status-code parsed``)."""
    details = getattr(exc, "details", None)
    causes = details.get("causes") if isinstance(details, dict) else None
    if isinstance(causes, list) and causes and isinstance(causes[-1], dict):
        return str(causes[-1].get("message") or exc)
    return str(exc)


#: The errors of a socket the server closed or reset.
_RESET_ERRNOS = frozenset({errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED})
#: Their exceptions, as the cause of an aiohttp error that carries no errno itself.
_RESET_CAUSES = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


def _after_send_aiohttp(exc: BaseException) -> bool:
    """Whether aiohttp failed a request on a connection it had (the server closed or
    reset it as the request went out or after, before a complete answer): not a connection
    that could not be opened (refused, a name that does not resolve, TLS: a
    ClientConnectorError), not a timeout."""
    if isinstance(exc, aiohttp.ClientConnectorError | TimeoutError):
        return False
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientConnectionResetError):
        return True
    if not isinstance(exc, aiohttp.ClientOSError):
        return False
    # "Can not write request body" has no errno: the reset is its cause (a transport
    # the server closed as the request was written, "Cannot write to closing transport")
    return exc.errno in _RESET_ERRNOS or isinstance(exc.__cause__, _RESET_CAUSES)


def _begun_status(exc: BaseException) -> int | None:
    """The status of an answer whose status line came before aiohttp's connection was
    closed (its ServerDisconnectedError carries that response, not a text)."""
    message = getattr(exc, "message", None)
    if isinstance(exc, aiohttp.ServerDisconnectedError) and not isinstance(message, str):
        code = getattr(message, "code", None)
        return code if isinstance(code, int) else 0
    return None


def _reqwest_causes(exc: BaseException) -> str:
    details = getattr(exc, "details", None)
    causes = details.get("causes") if isinstance(details, dict) else None
    return " | ".join(str(c.get("message")) for c in causes or [] if isinstance(c, dict))


#: What hyper says of a request it could not open a connection for: hyper-util's
#: "client error (Connect)" (a refused connection, a name that does not resolve, a TLS
#: handshake that failed), where a connection that ended after the request was sent
#: is "client error (SendRequest)".
_REQWEST_CONNECT = re.compile(r"(?i)client error \(connect\)|tcp connect|dns error")
#: What hyper-util says of a proxy that refused a CONNECT ("tunnel error: proxy
#: authorization required", "tunnel error: unsuccessful"), and of a 407.
_REQWEST_TUNNEL = re.compile(r"(?i)tunnel error:?\s*([^|]*)")
_REQWEST_PROXY_AUTH = re.compile(r"(?i)proxy auth")


def _after_send_reqwest(exc: BaseException) -> bool:
    """:func:`_after_send_aiohttp` for pyreqwest: a request hyper sent on a connection
    that then ended before a response head came, not one it found no connection for."""
    if not isinstance(exc, PyreqwestError) or isinstance(exc, TimeoutError):
        return False
    return not _REQWEST_CONNECT.search(_reqwest_causes(exc))


class _IdleConnections:
    """Whether a pyreqwest request goes on a pooled keep-alive connection: pyreqwest
    does not say, so its pool is followed here. A connection is idle in the pool from
    the end of an answer read whole that did not close it, until it is taken by a
    request or ``idle_s`` passes; a request that finds none idle opens a new one."""

    def __init__(self, idle_s: float) -> None:
        self._idle_s = idle_s
        self._since: deque[float] = deque()

    def take(self) -> bool:
        """Whether the next request goes on a connection already used."""
        now = time.monotonic()
        while self._since and now - self._since[0] >= self._idle_s:
            self._since.popleft()
        if not self._since:
            return False
        self._since.pop()
        return True

    def give(self, headers: Mapping[str, str]) -> None:
        """An answer was read whole: its connection goes back to the pool, unless the
        server closes it."""
        if "close" not in (headers.get("connection") or "").lower():
            self._since.append(time.monotonic())


#: The types of a content part that is the answer's text (Chat Completions' ``text``,
#: the Responses API's ``output_text``); a part without a type is taken as text too.
_TEXT_PARTS = frozenset({"text", "output_text"})


def _content(content: Any) -> tuple[str, str]:
    """A message's content as (text, refusal): a string; or parts
    (``[{"type": "text", "text": ...}]``, one part object given alone counting as a
    list of one) whose text parts (typed ``text`` or ``output_text``, or untyped) are
    joined, the others (``reasoning``, ``thinking``, images...) left out, and whose
    ``refusal`` parts (``{"type": "refusal", "refusal": ...}``) are the refusal. Any
    other object is its JSON text (never a Python repr)."""
    if isinstance(content, str):
        return content, ""
    if content is None:
        return "", ""
    if isinstance(content, dict) and not _is_part(content):
        return orjson.dumps(content, default=str).decode(), ""
    parts = [content] if isinstance(content, dict) else content
    if not isinstance(parts, list):
        return str(content), ""
    text: list[str] = []
    refusal: list[str] = []
    for p in parts:
        if isinstance(p, str):
            text.append(p)
        elif isinstance(p, dict):
            kind = p.get("type")
            if kind == "refusal":
                said = p.get("refusal") or p.get("text")
                refusal.append(said if isinstance(said, str) else "")
            elif kind is None or kind in _TEXT_PARTS:
                text.append(_part_text(p.get("text")))
    return "".join(text), "".join(refusal)


def _is_part(value: dict[str, Any]) -> bool:
    """Whether an object is a content part (it has a ``type``, or a ``text``)."""
    return isinstance(value.get("type"), str) or isinstance(value.get("text"), str)


def _part_text(value: Any) -> str:
    """A text part's ``text``: a string, or the Assistants API's ``{"value": ...}``."""
    if isinstance(value, dict):
        value = value.get("value")
    return value if isinstance(value, str) else ""


#: The fields of a message that carry the model's reasoning apart from its answer
#: (vLLM's and DeepSeek's ``reasoning_content``, OpenRouter's and Ollama's
#: ``reasoning``, others' ``thinking``).
_REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")


def _reasoning(message: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first reasoning field of a message that holds text, as (its name, the
    text), or None."""
    for name in _REASONING_FIELDS:
        value = message.get(name)
        if isinstance(value, str) and value.strip():
            return name, value
    return None


def _reasoning_only(reasoning: tuple[str, str], data: Any, finish: Any) -> str:
    """The message of an answer with no content whose text is all in a reasoning
    field: a reasoning model cut off while thinking, or a server's reasoning parser
    that took the whole answer for reasoning (a model that never closed its
    ``<think>``)."""
    name, text = reasoning
    usage = data.get("usage") if isinstance(data, dict) else None
    details = usage.get("completion_tokens_details") if isinstance(usage, dict) else None
    tokens = token_count(details.get("reasoning_tokens")) if isinstance(details, dict) \
        else None
    size = f"{tokens} reasoning tokens" if tokens is not None \
        else f"{len(text)} characters of reasoning"
    said = f"the model answered only in {name} ({size}), with no content"
    if finish == "length":
        return f"{said}: it was cut off at max_tokens while reasoning: raise max_tokens"
    return f"{said}: raise max_tokens or check the server's reasoning parser"


#: An HTML page's title, else its first heading.
_HTML_TITLE = re.compile(rb"(?is)<title[^>]*>(.*?)</title\s*>")
_HTML_H1 = re.compile(rb"(?is)<h1[^>]*>(.*?)</h1\s*>")
_HTML_TAG = re.compile(r"(?s)<[^>]*>")


def _media_type(headers: Mapping[str, str]) -> str:
    """The media type of a Content-Type (``text/html``), without its parameters."""
    return (headers.get("content-type") or "no content type").split(";")[0].strip() \
        or "no content type"


def _html_title(status: int, raw: bytes, headers: Mapping[str, str]) -> str | None:
    """What an HTML body (a proxy's or CDN's error page: Cloudflare's 520-524, nginx's
    502) says in its ``<title>``, else in its first ``<h1>``, as one line: its markup
    and entities resolved, the site name and status it may begin with left out
    (``example.com | 524: A timeout occurred`` -> ``A timeout occurred``). None for a
    body that is not HTML or says nothing there."""
    head = raw[:64 * 1024]
    if "html" not in _media_type(headers).lower() \
            and head.removeprefix(_BOM).lstrip()[:1] != b"<":
        return None
    for pattern in (_HTML_TITLE, _HTML_H1):
        found = pattern.search(head)
        if found is None:
            continue
        text = html.unescape(_HTML_TAG.sub(" ", found.group(1).decode("utf-8", "replace")))
        text = " ".join(text.split())
        said = re.match(rf"(?:.*?[|:\-–—]\s*)?(?:error\s*)?{status}\b\s*[:\-–—]?\s*(.+)",
                        text, re.I)
        text = said.group(1) if said else text
        if text:
            return text[:200]
    return None


def _not_a_completion(status: int, data: Any, raw: bytes,
                      headers: Mapping[str, str]) -> str:
    """What a 2xx body that holds no completion is, for the error message."""
    kind = headers.get("content-type") or "no content type"
    start = raw[:120].decode("utf-8", "replace")
    if not raw.strip():
        return f"HTTP {status} with an empty body ({kind})"
    title = _html_title(status, raw, headers) if data is None else None
    if title is not None:
        return f'HTTP {status} with an HTML page, not JSON ({kind}): "{title}"'
    if raw.lstrip()[:1] not in (b"{", b"["):
        return f"HTTP {status} with a body that is not JSON ({kind}): {start!r}"
    if data is None:
        return f"HTTP {status} with a body that is not valid JSON ({len(raw)} bytes, " \
               f"{_why_not_json(raw)}): {start!r}"
    return f"HTTP {status} without choices[0].message in the body: {start!r}"


def _why_not_json(raw: bytes) -> str:
    """Why a body that starts as JSON is not: bytes that are no UTF-8 (a charset
    other than the one declared, none declared), or an end that never comes."""
    try:
        raw.decode()
    except UnicodeDecodeError as exc:
        if exc.reason != "unexpected end of data":
            return f"not valid UTF-8 at byte {exc.start}: a charset its Content-Type " \
                   "does not declare?"
    return "cut off?"


#: How an event stream begins when no Content-Type says so: a field line (``data:``,
#: ``event:``, ``id:``, ``retry:``) or a comment (``: keep-alive``).
_SSE_START = re.compile(rb"\A(?:\xef\xbb\xbf)?\s*(?:(?:data|event|id|retry)[ \t]*:|:)")
#: What ends a line of an event stream (WHATWG).
_SSE_LINES = re.compile(r"\r\n|\r|\n")
#: The UTF-8 byte order mark a body may begin with.
_BOM = b"\xef\xbb\xbf"


def _is_event_stream(raw: bytes, headers: Mapping[str, str]) -> bool:
    """Whether a body is Server-Sent Events (what a streamed completion is): by its
    Content-Type, else by how it begins (a JSON body never begins so)."""
    start = raw[:64].removeprefix(_BOM)
    if start.lstrip()[:1] in (b"{", b"["):  # JSON, whatever its Content-Type says
        return False
    kind = (headers.get("content-type") or "").lower()
    return "text/event-stream" in kind or bool(_SSE_START.match(start))


def _sse_events(raw: bytes) -> list[tuple[str, str]]:
    """The events of a Server-Sent Events body, as (event type, data): the ``data``
    lines of each event joined with newlines (the WHATWG rules: a blank line ends an
    event, a line starting with ``:`` is a comment, one space after the colon is not
    part of the value; one byte order mark at the start of the stream is dropped)."""
    events: list[tuple[str, str]] = []
    kind, data = "", list[str]()
    # lines end at CR, LF or CRLF only (str.splitlines also splits at U+2028, U+0085...,
    # which a chunk's JSON may hold unescaped)
    for line in _SSE_LINES.split(raw.removeprefix(_BOM).decode("utf-8", "replace")):
        if not line:
            if data:
                events.append((kind, "\n".join(data)))
            kind, data = "", []
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        elif name == "event":
            kind = value
    if data:
        events.append((kind, "\n".join(data)))
    return events


def _event_chunk(status: int, kind: str, text: str, headers: Mapping[str, str],
                 raw: bytes) -> dict[str, Any]:
    """One event of a stream as the chunk it carries; an error event raised as the
    error it says (classified as an error body would be)."""
    try:
        chunk = orjson.loads(text)
    except orjson.JSONDecodeError:
        chunk = _lenient_json(text.encode("utf-8", "surrogatepass"))
    if kind == "error" and not (isinstance(chunk, dict) and "error" in chunk):
        chunk = {"error": chunk if isinstance(chunk, dict) else {"message": text[:500]}}
    found = _error_in_body(status, chunk, headers, raw, where="the event stream")
    if found is not None:
        raise found
    if not isinstance(chunk, dict):
        raise ProviderError(ErrorClass.SERVER_ERROR, f"HTTP {status} with an event "
                            f"stream whose data is not a JSON object: {text[:120]!r}",
                            http_status=status, request_id=_request_id(headers))
    return chunk


class _Assembled:
    """The first choice of a streamed completion, put together chunk by chunk."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.refusal: list[str] = []
        self.reasoning: dict[str, list[str]] = {}
        self.calls: list[Any] = []
        self.first: dict[str, Any] = {}
        self.usage: Any = None
        self.finish: Any = None
        self.error: Any = None
        self.seen = False

    def add(self, chunk: dict[str, Any]) -> None:
        for key in ("id", "model", "created", "system_fingerprint"):
            if key not in self.first and chunk.get(key) is not None:
                self.first[key] = chunk[key]
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choices = chunk.get("choices")
        for c in choices if isinstance(choices, list) else []:
            if isinstance(c, dict) and c.get("index", 0) == 0:
                self._choice(c)

    def _choice(self, c: dict[str, Any]) -> None:
        self.seen = True
        delta: Any = c.get("delta")
        if not isinstance(delta, dict):
            delta = c.get("message")
            if not isinstance(delta, dict):
                delta = {}
        if delta.get("content") is not None:
            text, refusal = _content(delta["content"])
            self.content.append(text)
            if refusal:
                self.refusal.append(refusal)
        if isinstance(delta.get("refusal"), str):
            self.refusal.append(delta["refusal"])
        for name in _REASONING_FIELDS:
            if isinstance(delta.get(name), str):
                self.reasoning.setdefault(name, []).append(delta[name])
        for name in ("tool_calls", "function_call"):
            more = delta.get(name)
            if more:
                self.calls.extend(more if isinstance(more, list) else [more])
        if c.get("finish_reason") is not None:
            self.finish = c["finish_reason"]
        if c.get("error"):  # an object, or a text
            self.error = c["error"]

    def completion(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.content)}
        if self.refusal:
            message["refusal"] = "".join(self.refusal)
        for name, pieces in self.reasoning.items():
            message[name] = "".join(pieces)
        if self.calls:
            message["tool_calls"] = self.calls
        choice: dict[str, Any] = {"index": 0, "message": message,
                                  "finish_reason": self.finish}
        if self.error is not None:
            choice["error"] = self.error
        return {"id": None, "object": "chat.completion", **self.first,
                "choices": [choice], "usage": self.usage}


def _from_event_stream(status: int, raw: bytes, headers: Mapping[str, str]) -> Any:
    """The completion an event stream carries, as the JSON body of a non-streamed
    answer would have carried it: a server or gateway that streams although lockgate
    asked for no stream (``stream`` is never sent). The text of the chunks'
    ``choices[0].delta.content`` joined, ``finish_reason`` from the last chunk that has
    one, ``usage`` from the chunk that carries it, ``id`` and ``model`` from the first.
    An error event is classified as an error body; a stream without a completion, or
    cut before its answer ended (no ``finish_reason`` and no ``[DONE]``), is
    ``server_error``."""
    got = _Assembled()
    done = False
    events = _sse_events(raw)
    for kind, text in events:
        if text.strip() == "[DONE]":
            done = True
        else:
            got.add(_event_chunk(status, kind, text, headers, raw))
    start = raw[:120].decode("utf-8", "replace")
    if not got.seen:
        raise ProviderError(ErrorClass.SERVER_ERROR, f"HTTP {status} with an event stream "
                            f"without a completion ({len(events)} events): {start!r}",
                            http_status=status, request_id=_request_id(headers))
    if got.finish is None and not done and got.error is None:
        raise ProviderError(ErrorClass.SERVER_ERROR, f"HTTP {status} with an event stream "
                            "that ended before its answer did (no finish_reason, no "
                            f"[DONE]; {len(events)} events): {start!r}",
                            http_status=status, request_id=_request_id(headers))
    return got.completion()


def _first_event(raw: bytes) -> Any:
    """The first event of an event stream that is JSON (an error answer sent as one),
    or None."""
    for _kind, text in _sse_events(raw)[:8]:
        found = _lenient_json(text.encode("utf-8", "surrogatepass"))
        if found is not None:
            return found
    return None


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


#: Seconds pyreqwest keeps an idle connection in its pool.
REQWEST_IDLE_S = 30.0


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


def chat_url(base_url: str) -> str:
    """The chat-completions URL of a ``base_url``: ``/chat/completions`` added to its
    path, its query string kept (Azure OpenAI's
    ``.../openai/deployments/NAME?api-version=2024-10-21`` is POSTed to
    ``.../openai/deployments/NAME/chat/completions?api-version=2024-10-21``); a
    fragment, which is never sent, dropped."""
    parts = urlsplit(base_url)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/chat/completions",
                                     fragment=""))


#: An Azure OpenAI deployment's path (``/openai/deployments/NAME``).
_AZURE_DEPLOYMENT = re.compile(r"(?i)/openai/deployments/[^/]+")


@dataclass(frozen=True)
class _Environment:
    """What the environment says for one endpoint URL: the proxy to send through, with
    its login, and the endpoint's login from ``~/.netrc``."""

    proxy: URL | None = None
    proxy_auth: aiohttp.BasicAuth | None = None
    auth: aiohttp.BasicAuth | None = None


def _environment(url: str, *, authorized: bool) -> _Environment:
    """For ``url``, what the environment says: the proxy of ``HTTP_PROXY``/
    ``HTTPS_PROXY`` unless ``NO_PROXY`` names the host (:func:`proxy_for`, as the start
    check reads it), its login from the proxy URL or ``.netrc``, and, for a request
    that carries no Authorization of its own, the host's login from ``.netrc``
    (``$NETRC``). Read once per endpoint: aiohttp's ``trust_env`` read them at every
    request, on two hops to a thread (a third of a worker's CPU at a 0 ms model), took
    a proxy written without a scheme for a URL with the host as its scheme (every call
    failed) and ignored an https:// proxy. Its Authorization would also clash with an
    API key's: aiohttp refuses both on one request."""
    target = URL(url)
    proxy = proxy_auth = auth = None
    named = proxy_for(url)
    if named is not None:
        proxy, proxy_auth = strip_auth_from_url(URL(named))
        if proxy_auth is None and proxy.host:
            with contextlib.suppress(LookupError):
                proxy_auth = basicauth_from_netrc(netrc_from_env(), proxy.host)
    if not authorized and target.host:
        with contextlib.suppress(LookupError):
            auth = basicauth_from_netrc(netrc_from_env(), target.host)
    return _Environment(proxy, proxy_auth, auth)


#: Query parameters of a base_url that are no secret, left unmasked in errors (Azure
#: OpenAI's ``api-version``, which its errors name).
_PUBLIC_QUERY = frozenset({"api-version"})


def _secrets(base_url: str, url: str, api_key: str | None,
             headers: Mapping[str, str] | None, env: _Environment) -> Secrets:
    """What an endpoint sends that is secret, to mask in its errors: the API key, the
    values of its ``headers``, the user and password of ``base_url`` and their Basic
    value, the values of its query string (but :data:`_PUBLIC_QUERY`'s), the proxy's
    login and the ``.netrc`` one; and the chat ``url`` replaced by its
    :func:`redact_url` where it is named whole."""
    values: list[str | None] = [api_key, *(headers or {}).values()]
    parts = urlsplit(base_url)
    if "@" in parts.netloc:
        user, _, password = parts.netloc.rpartition("@")[0].partition(":")
        values += [user, password, unquote(user), unquote(password),
                   base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()]
    for pair in parts.query.split("&"):
        key, _, value = pair.partition("=")
        if unquote(key).lower() not in _PUBLIC_QUERY:
            values.append(value)
    values += [v for k, v in parse_qsl(parts.query) if k.lower() not in _PUBLIC_QUERY]
    for auth in (env.proxy_auth, env.auth):
        if auth is not None:
            values += [auth.login, auth.password, auth.encode().removeprefix("Basic ")]
    return Secrets(values, shown={url: redact_url(url)})


class OpenAICompatible:
    """Chat completions over HTTP. One instance per endpoint; one session per event loop."""

    def __init__(self, name: str, base_url: str, *, api_key: str | None = None,
                 api_key_header: str | None = None, max_connections: int = 1000,
                 send_idempotency_key: bool = True,
                 headers: Mapping[str, str] | None = None,
                 http_client: HttpClient = "aiohttp") -> None:
        check_http_client(http_client)
        self.name = name
        self.http_client = http_client
        given = base_url
        base_url, basic = _credentials(name, base_url)
        self.url = chat_url(base_url)
        self._headers = {"Content-Type": "application/json", **(headers or {})}
        bearer = bool(api_key) and (api_key_header or "authorization").lower() == "authorization"
        if bearer:
            self._headers["Authorization"] = f"Bearer {api_key}"
        elif api_key and api_key_header:
            self._headers[api_key_header] = api_key  # (Azure's api-key: the key alone)
        if basic is not None:
            if any(k.lower() == "authorization" for k in self._headers):
                other = "an API key (api_key_env) is set" if bearer \
                    else "its headers set Authorization"
                raise ConfigError(
                    f"endpoint '{name}': base_url carries a user and password and {other}: "
                    "a request carries one Authorization header. Remove the credentials "
                    "from base_url, or the other one")
            self._headers["Authorization"] = basic
        if http_client == "pyreqwest" and not any(k.lower() == "accept-encoding"
                                                  for k in self._headers):
            # What aiohttp asks for; pyreqwest leaves the decoding to _inflated
            self._headers["Accept-Encoding"] = "gzip, deflate"
        self._send_key = send_idempotency_key
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._fresh_session: aiohttp.ClientSession | None = None
        self._reqwest_fresh: Any = None  # the same, for the resend of a stale request
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}
        self._reqwest: Any = None  # pyreqwest's client, made on first use
        self._durations: dict[float, timedelta] = {}
        self._idle = _IdleConnections(REQWEST_IDLE_S)  # pyreqwest's pooled connections
        self._warned_redirect = False
        self._warned_path = False
        #: What the environment says for this URL (:func:`_environment`), read once.
        self._env = _environment(self.url, authorized=any(
            k.lower() == "authorization" for k in self._headers))
        if self._env.auth is not None:
            self._headers["Authorization"] = self._env.auth.encode()
        # The proxy's login as a header (aiohttp deprecates its proxy_auth argument: a
        # DeprecationWarning at every request through a proxy with a login): on the
        # CONNECT of an https:// request, else on the request the proxy relays
        self._proxy_headers: dict[str, str] | None = None
        if self._env.proxy_auth is not None and http_client == "aiohttp":
            login = {"Proxy-Authorization": self._env.proxy_auth.encode()}
            if urlsplit(self.url).scheme == "https":
                self._proxy_headers = login
            else:
                self._headers.update(login)
        #: What this endpoint sends that is secret, masked in its errors (:meth:`_masked`).
        self._secrets = _secrets(given, self.url, api_key, headers, self._env)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = self._new_session(force_close=False)
        return self._session

    def _fresh_client(self) -> aiohttp.ClientSession:
        """A session whose every request goes on a new connection (closed after it):
        for the one resend of a request whose pooled connection was stale."""
        if self._fresh_session is None or self._fresh_session.closed:
            self._fresh_session = self._new_session(force_close=True)
        return self._fresh_session

    def _new_session(self, *, force_close: bool) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=self._max_connections, limit_per_host=0, force_close=force_close,
            keepalive_timeout=None if force_close else 30, ttl_dns_cache=300)
        # max_line_size, max_field_size: a header line as long as pyreqwest (hyper)
        # takes (aiohttp's own 8190 bytes refused a 9 KB Set-Cookie as not valid HTTP).
        # No trust_env: the environment's proxy and .netrc login are read once
        # (self._env), not at every request.
        return aiohttp.ClientSession(
            connector=connector, json_serialize=lambda o: orjson.dumps(o).decode(),
            skip_auto_headers=("User-Agent",),
            max_line_size=MAX_HEADER_LINE, max_field_size=MAX_HEADER_LINE,
            trace_configs=None if force_close else [_REUSE_TRACE])

    async def complete(self, request: CompletionRequest) -> Completion:
        """POST one chat completion; every failure becomes a classified ProviderError."""
        # The fields lockgate decides come last: no parameter may replace them.
        body = {**request.params, "model": request.model, "messages": request.messages}
        body.pop("stream", None)
        headers = self._headers
        if self._send_key and request.idempotency_key:
            headers = {**headers, "Idempotency-Key": request.idempotency_key}
        resent = False
        try:
            if self.http_client == "pyreqwest":
                status, resp_headers, raw, resent = await self._post_reqwest(
                    orjson.dumps(body), headers, request.timeout_s)
            else:
                status, resp_headers, raw, resent = await self._post_aiohttp(
                    orjson.dumps(body), headers, request.timeout_s)
            answer = self._answer(status, resp_headers, raw, request.model)
        except ProviderError as exc:
            exc.resent = exc.resent or resent
            self._masked(exc)
            raise
        answer.resent = resent
        return answer

    def _masked(self, exc: ProviderError) -> None:
        """``exc`` with the endpoint's secrets masked in all it tells (:func:`_secrets`):
        an error is stored on the task and its attempts, exported and logged, and the
        client's own text may hold the URL with its query string (pyreqwest's "error
        sending request for url (...?api-key=...)")."""
        mask = self._secrets
        if not mask:
            return
        exc.message = mask.text(exc.message)
        exc.args = (f"{exc.error_class}: {exc.message}",)
        if exc.body is not None:
            exc.body = mask.text(exc.body)
        if exc.request_id is not None:
            exc.request_id = mask.text(exc.request_id)
        if exc.model is not None:
            exc.model = mask.text(exc.model)
        exc.rate_limit = {k: mask.text(v) for k, v in exc.rate_limit.items()}

    def _answer(self, status: int, resp_headers: Mapping[str, str], raw: bytes,
                model: str) -> Completion:
        """The completion an answer carries, or the classified error it is. An error
        is read from the answer with the endpoint's secrets masked (:func:`_secrets`):
        a provider that repeats the key, a header or the query string in its error
        ("Incorrect API key provided: sk-...") has them masked in the message and in
        the body kept, before either is cut to length. A 2xx answer is read as it came
        (the success path pays nothing), and again masked if it turns out an error."""
        if 300 <= status < 400:
            raise self._redirected(status, resp_headers)
        if status == 407:  # a proxy that would not relay a plain-HTTP request: its login
            raise self._proxy_refused(status, http.HTTPStatus(status).phrase)
        if not 200 <= status < 300:
            return self._read(status, resp_headers, self._secrets.data(raw), model)
        try:
            return self._read(status, resp_headers, raw, model)
        except ProviderError:
            masked = self._secrets.data(raw)
            if masked is raw:
                raise
        return self._read(status, resp_headers, masked, model)  # the same error, masked

    def _read(self, status: int, resp_headers: Mapping[str, str], raw: bytes,
              model: str) -> Completion:
        """The completion a (non-redirect) answer carries, or the classified error it is."""
        raw = _as_utf8(status, raw, resp_headers)
        if raw and _is_event_stream(raw, resp_headers):
            return self._streamed(status, raw, resp_headers, model)
        strict, extra_at = True, None
        try:
            data = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            (data, extra_at), strict = _json_prefix(raw), False
        if not 200 <= status < 300:
            title = _html_title(status, raw, resp_headers) if data is None else None
            if title is not None:  # a proxy's or CDN's error page (Cloudflare's 52x)
                error = _answered_error(_error_class(status, "", "", title),
                                        f'HTTP {status} ({_media_type(resp_headers)}): '
                                        f'"{title}"', status, resp_headers, raw)
            else:
                error = classify_response(status, data if data is not None else raw[
                    :300].decode("utf-8", "replace"), resp_headers, raw)
            if status in (404, 405) and not _MODEL_WORDS.search(
                    raw[:4000].decode("utf-8", "replace")):
                raise self._wrong_path(error)
            raise error
        try:
            in_body = _error_in_body(status, data, resp_headers, raw)
            if in_body is not None:
                raise in_body
            if extra_at is not None:
                # A whole JSON answer and then more: what is it? (another answer, a
                # proxy's framing). Not taken; its usage is recorded (it was billed).
                raise ProviderError(
                    ErrorClass.SERVER_ERROR,
                    f"HTTP {status} with extra data after the JSON at byte {extra_at} "
                    f"(of {len(raw)}): {raw[extra_at:extra_at + 60]!r}",
                    http_status=status, request_id=_request_id(resp_headers))
            answer = self._completion(data, status, resp_headers, model, raw)
        except ProviderError as exc:
            raise _with_usage(exc, data) from None
        # A body only the lenient reader takes is not kept: exports read it back strictly.
        answer.body = _kept_body(raw) if strict else None
        return answer

    def _wrong_path(self, error: ProviderError) -> ProviderError:
        """A 404 or 405 that names no model: the URL has no chat-completions API (most
        often base_url without its ``/v1``). The endpoint's configuration, the same for
        every call: said once in the log and in each task's error."""
        parts = urlsplit(self.url)
        if _AZURE_DEPLOYMENT.search(parts.path):
            # Azure OpenAI: no /v1 under a deployment; a 404 there is a deployment name
            # that does not exist, or an api-version missing or not served
            version = "its api-version" if re.search(r"(?i)(?:^|&)api-version=",
                                                      parts.query) \
                else "add the api-version it lacks"
            hint = ("an Azure OpenAI deployment: check the deployment name and "
                    f"{version}, as in https://RESOURCE.openai.azure.com/openai/"
                    "deployments/DEPLOYMENT?api-version=2024-10-21, or use the v1 API: "
                    "https://RESOURCE.openai.azure.com/openai/v1")
        else:
            hint = ("OpenAI-compatible servers usually serve it under /v1: "
                    "https://host/v1")
        error.message = (f"{error.message} (POST {redact_url(self.url)}): the endpoint "
                         "has no chat-completions API at that URL; base_url's path is "
                         f"probably wrong: set endpoint '{self.name}' base_url to the "
                         f"address its documentation gives ({hint})")
        error.args = (f"{error.error_class}: {error.message}",)
        if not self._warned_path:
            self._warned_path = True
            log.warning("endpoint '%s' (%s): %s", self.name, redact_url(self.url),
                        error.message)
        return error

    def _streamed(self, status: int, raw: bytes, headers: Mapping[str, str],
                  model: str) -> Completion:
        """An answer sent as an event stream (:func:`_from_event_stream`): the same
        completion, or the same classified error, as the JSON body would have given.
        The body kept for exports is the completion as JSON."""
        if not 200 <= status < 300:
            found = _first_event(raw)
            raise classify_response(status, found if found is not None else raw[:300].decode(
                "utf-8", "replace"), headers, raw)
        data = _from_event_stream(status, raw, headers)
        try:
            answer = self._completion(data, status, headers, model, raw)
        except ProviderError as exc:
            raise _with_usage(exc, data) from None
        try:
            kept = orjson.dumps(data)
        except orjson.JSONEncodeError:  # a lone surrogate the lenient reader took
            return answer
        answer.body = kept.decode() if len(kept) <= MAX_BODY else None
        return answer

    def _redirected(self, status: int, headers: Mapping[str, str]) -> ProviderError:
        """A 3xx: never followed (a redirected POST comes back as a GET without its
        body, or is sent again elsewhere with the same Idempotency-Key). It is the
        endpoint's configuration, the same for every call: said once in the log and
        in each task's error, which fails at once (fix base_url, then retry them)."""
        location = headers.get("location")
        where = f"to {redact_url(urljoin(self.url, location))}" if location \
            else "without a Location"
        message = (f"HTTP {status}: the endpoint redirects {where}; lockgate does not "
                   f"follow redirects: set endpoint '{self.name}' base_url to the address "
                   "it redirects to (typically https:// instead of http://)")
        if not self._warned_redirect:
            self._warned_redirect = True
            log.warning("endpoint '%s' (%s): %s", self.name, redact_url(self.url), message)
        return ProviderError(ErrorClass.INVALID_REQUEST, message, http_status=status,
                             request_id=_request_id(headers))

    def _proxy_refused(self, status: int | None, said: str) -> ProviderError:
        """The proxy of the environment refused the request (a 407: its login is
        missing or wrong; another status: it would not reach the endpoint's host). The
        endpoint cannot be reached: ``connection_error``, which its tasks wait out
        without spending an attempt (not ``server_error``: every attempt was spent on
        the proxy's refusal). The proxy is named without its login."""
        name = "HTTPS_PROXY" if urlsplit(self.url).scheme == "https" else "HTTP_PROXY"
        proxy = f"the proxy of {name} ({redact_url(str(self._env.proxy))})" \
            if self._env.proxy is not None else "a proxy on the way"
        answer = f"HTTP {status} {said}" if status is not None else said
        if status == 407:
            fix = f"check the proxy login (the user:password in {name}, or .netrc)"
        else:
            fix = f"check {name} and that its proxy may reach the endpoint's host"
        return ProviderError(ErrorClass.CONNECTION_ERROR,
                             f"{proxy} refused the request ({answer}): {fix}",
                             http_status=status)

    def _stale(self, exc: BaseException, deadline: float) -> float | None:
        """The time left for the one resend of a request whose pooled keep-alive
        connection was stale, or None when it is not resent."""
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            return None
        log.debug("endpoint '%s': the pooled keep-alive connection was closed before an "
                  "answer came (%s: %s); sent again on a new connection", self.name,
                  type(exc).__name__, self._secrets.text(str(exc)))
        return left

    async def _post_aiohttp(self, body: bytes, headers: Mapping[str, str],
                            timeout_s: float) -> tuple[int, Mapping[str, str], bytes, bool]:
        """POST on aiohttp's pooled connections; with whether it was sent twice. A
        request sent on a pooled keep-alive connection that turns out stale (closed or
        reset before any answer: the server let it go as the request came) is sent
        again at once, once, on a new connection, within what is left of its timeout:
        it spends no attempt. Never one sent on a new connection: a server that took
        the request and closed without answering may have run (and billed) it."""
        timeout = self._timeouts.get(timeout_s)
        if timeout is None:
            timeout = self._timeouts[timeout_s] = aiohttp.ClientTimeout(total=timeout_s)
        deadline = asyncio.get_running_loop().time() + timeout_s
        try:
            return (*await self._post_aiohttp_on(self._client(), body, headers, timeout,
                                                 timeout_s), False)
        except _StaleConnection as stale:
            left = self._stale(stale.exc, deadline)
            if left is None:
                raise _dropped(stale.exc) from None
        try:
            return (*await self._post_aiohttp_on(
                self._fresh_client(), body, headers, aiohttp.ClientTimeout(total=left),
                timeout_s), True)
        except _StaleConnection as again:  # (cannot be: a new connection)
            raise _resent(_dropped(again.exc)) from None
        except ProviderError as exc:
            raise _resent(exc) from None

    async def _post_aiohttp_on(self, session: aiohttp.ClientSession, body: bytes,
                               headers: Mapping[str, str], timeout: aiohttp.ClientTimeout,
                               timeout_s: float) -> tuple[int, Mapping[str, str], bytes]:
        sent = SimpleNamespace(reused=False)
        try:
            async with session.post(self.url, data=body, headers=headers,
                                    timeout=timeout, allow_redirects=False,
                                    proxy=self._env.proxy, proxy_headers=self._proxy_headers,
                                    trace_request_ctx=sent) as resp:
                try:
                    return resp.status, resp.headers, await resp.read()
                except TimeoutError:
                    raise _body_timeout(resp.status, timeout_s, resp.headers) from None
                except aiohttp.ClientPayloadError as exc:
                    # A status line came: the endpoint answered.
                    raise _unreadable(exc, resp.status, resp.headers) from None
                except aiohttp.ClientError as exc:
                    # Answered, then lost: never sent again (the model may have run)
                    raise _unreadable(exc, resp.status, resp.headers) from None
        except TimeoutError:
            raise ProviderError(ErrorClass.TIMEOUT,
                                f"no answer within {timeout_s:g} s") from None
        except aiohttp.ClientHttpProxyError as exc:
            # Before ClientResponseError, its base: the proxy answered the CONNECT of an
            # https:// request with other than 200 (a 407 for its login). No answer of
            # the endpoint's: it could not be reached.
            raise self._proxy_refused(exc.status, str(exc.message)) from None
        except aiohttp.ClientResponseError as exc:
            # Before ClientError: its subclass for an answer aiohttp could not parse
            # (a bad status line or Content-Length...), its status the 400 aiohttp
            # gives it. The endpoint answered: a failed answer, not an unreachable one.
            raise _not_http(" ".join(str(exc.message).split()).rstrip(" ^")) from None
        except aiohttp.ClientPayloadError as exc:
            raise _unreadable(exc) from None
        except aiohttp.ClientError as exc:
            if not _after_send_aiohttp(exc):  # no connection could be opened
                raise _connection_error(exc) from None
            status = _begun_status(exc)
            if status is not None:  # part of an answer came: never sent again
                raise _dropped(exc, "Server disconnected", status=status or None) from None
            if sent.reused:
                raise _StaleConnection(exc) from None
            raise _dropped(exc) from None

    def _reqwest_client(self, *, fresh: bool = False) -> Any:
        """pyreqwest's client; with ``fresh``, one that keeps no idle connection (each
        request on a new one), for the resend of a stale request."""
        client = self._reqwest_fresh if fresh else self._reqwest
        if client is None:
            # Bodies are decoded here, not by reqwest (_inflated), and redirects are
            # not followed (_redirected).
            builder = (ClientBuilder().max_connections(self._max_connections)
                       .follow_redirects(False).gzip(False).deflate(False)
                       .brotli(False).zstd(False))
            if fresh:
                client = self._reqwest_fresh = builder.pool_max_idle_per_host(0).build()
            else:
                client = self._reqwest = (builder.pool_idle_timeout(
                    timedelta(seconds=REQWEST_IDLE_S)).build())
        return client

    async def _post_reqwest(self, body: bytes, headers: Mapping[str, str],
                            timeout_s: float) -> tuple[int, Mapping[str, str], bytes, bool]:
        """The same POST on pyreqwest, with the same one resend of a request whose
        pooled keep-alive connection was stale (:class:`_IdleConnections` tells
        whether it went on one)."""
        timeout = self._durations.get(timeout_s)
        if timeout is None:
            timeout = self._durations[timeout_s] = timedelta(seconds=timeout_s)
        deadline = asyncio.get_running_loop().time() + timeout_s
        try:
            return (*await self._post_reqwest_on(self._reqwest_client(), body, headers,
                                                 timeout, timeout_s, self._idle), False)
        except _StaleConnection as stale:
            left = self._stale(stale.exc, deadline)
            if left is None:
                raise _dropped(stale.exc, _last_cause(stale.exc)) from None
        try:
            return (*await self._post_reqwest_on(self._reqwest_client(fresh=True), body,
                                                 headers, timedelta(seconds=left),
                                                 timeout_s, None), True)
        except _StaleConnection as again:  # (cannot be: a new connection)
            raise _resent(_dropped(again.exc, _last_cause(again.exc))) from None
        except ProviderError as exc:
            raise _resent(exc) from None

    async def _post_reqwest_on(self, client: Any, body: bytes, headers: Mapping[str, str],
                               timeout: timedelta, timeout_s: float,
                               idle: _IdleConnections | None
                               ) -> tuple[int, Mapping[str, str], bytes]:
        """One POST on pyreqwest. Its timeouts are TimeoutErrors; a DecodeError is an
        answer it could not parse (not valid HTTP); every other failure of the request
        is a PyreqwestError, a connection error here. The response is streamed (with
        no body read ahead) so that a body that fails is known to follow a status line,
        which it names, as on aiohttp."""
        reused = idle is not None and idle.take()
        try:
            request = (client.post(self.url).body_bytes(body).headers(headers)
                       .timeout(timeout).streamed_read_buffer_limit(0).build_streamed())
            async with request as resp:
                status = int(resp.status)
                try:
                    read = bytes(await resp.bytes())
                except TimeoutError:
                    raise _body_timeout(status, timeout_s, resp.headers) from None
                except PyreqwestError as exc:
                    # A status line came: the endpoint answered.
                    raise _unreadable(exc, status, resp.headers) from None
                resp_headers = resp.headers
            if idle is not None:
                idle.give(resp_headers)
            try:
                raw = _inflated(read, resp_headers)
            except ValueError as exc:
                raise _unreadable(exc, status, resp_headers) from None
        except TimeoutError:
            raise ProviderError(ErrorClass.TIMEOUT,
                                f"no answer within {timeout_s:g} s") from None
        except PyreqwestBodyDecodeError as exc:
            raise _unreadable(exc) from None
        except PyreqwestDecodeError as exc:
            # Not the body's: the status line or the headers hyper could not parse.
            raise _not_http(_last_cause(exc)) from None
        except PyreqwestError as exc:
            causes = _reqwest_causes(exc)
            tunnel = _REQWEST_TUNNEL.search(causes)
            if tunnel is not None:  # the proxy refused the CONNECT of an https:// request
                refused = tunnel.group(1).strip()
                if _REQWEST_PROXY_AUTH.search(refused):
                    raise self._proxy_refused(407, http.HTTPStatus(407).phrase) from None
                raise self._proxy_refused(None, refused) from None
            if not _after_send_reqwest(exc):  # no connection could be opened
                raise _connection_error(exc, causes) from None
            if reused:
                raise _StaleConnection(exc) from None
            raise _dropped(exc, _last_cause(exc)) from None
        return status, resp_headers, raw

    @staticmethod
    def _completion(data: Any, status: int, headers: Mapping[str, str],
                    model: str, raw: bytes = b"") -> Completion:
        try:
            choice = _first_choice(data["choices"])
            message = choice["message"]
            content, part_refusal = _content(message.get("content"))
            finish = choice.get("finish_reason")
        except (TypeError, KeyError, IndexError, AttributeError):
            raise ProviderError(ErrorClass.SERVER_ERROR,
                                _not_a_completion(status, data, raw, headers),
                                http_status=status) from None
        if finish == "error" or choice.get("error"):
            # OpenRouter: the upstream provider failed, said in the choice
            found = _error_in_body(status, {"error": choice.get("error") or {}}, headers,
                                   raw, where="choices[0]")
            if found is not None:
                raise found
            if finish == "error":
                # no error object to say why: the provider failed mid-answer, and what
                # it wrote so far is not the answer (another attempt may finish it)
                raise ProviderError(
                    ErrorClass.SERVER_ERROR,
                    f'HTTP {status} with finish_reason "error" in choices[0] and no error '
                    "object: the provider failed while answering (its partial answer, "
                    f"{len(content)} characters, is not taken)", http_status=status,
                    request_id=_request_id(headers), body=_kept_body(raw))
        if finish == "content_filter":
            raise ProviderError(ErrorClass.CONTENT_FILTERED, "the provider filtered the answer",
                                http_status=status)
        refusal = message.get("refusal")
        if not (isinstance(refusal, str) and refusal.strip()):
            refusal = part_refusal  # a content part {"type": "refusal", "refusal": ...}
        if not content.strip() and refusal.strip():
            # OpenAI's structured outputs: the model declined, saying why (not a
            # malformed answer to retry)
            raise ProviderError(ErrorClass.CONTENT_FILTERED,
                                f"the model refused: {refusal.strip()[:300]}",
                                http_status=status)
        calls = message.get("tool_calls") or message.get("function_call")
        if not content.strip() and calls:
            # Not an answer to retry as "not JSON": the model called a tool instead of
            # writing text (a prompt or endpoint that offers tools)
            raise ProviderError(ErrorClass.INVALID_OUTPUT,
                                "the model answered with tool_calls, not text: "
                                f"{_tool_names(calls)}", http_status=status,
                                request_id=_request_id(headers), body=_kept_body(raw))
        if not content.strip():
            reasoning = _reasoning(message)
            if reasoning is not None:
                raise ProviderError(ErrorClass.INVALID_OUTPUT,
                                    _reasoning_only(reasoning, data, finish),
                                    http_status=status, request_id=_request_id(headers),
                                    body=_kept_body(raw))
        usage = data.get("usage")
        if not isinstance(usage, dict):
            usage = {}
        answered = data.get("model")
        return Completion(
            content=content, http_status=status,
            model=answered[:MAX_MODEL] if isinstance(answered, str) and answered else model,
            # OpenAI's names, else those some gateways pass on (Anthropic's)
            prompt_tokens=token_count(_either(usage, "prompt_tokens", "input_tokens")),
            completion_tokens=token_count(_either(usage, "completion_tokens",
                                                  "output_tokens")),
            finish_reason=finish if isinstance(finish, str) else None,
            request_id=_request_id(headers), rate_limit=rate_headers(headers))

    async def close(self) -> None:
        """Close the HTTP sessions (and their connections)."""
        for session in (self._session, self._fresh_session):
            if session is not None and not session.closed:
                await session.close()
                await asyncio.sleep(0)
        for client in (self._reqwest, self._reqwest_fresh):
            if client is not None:
                await client.close()
        self._reqwest = self._reqwest_fresh = None
