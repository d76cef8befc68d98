"""Provider limit headers: durations, counts, Retry-After, and junk that must be ignored."""

from __future__ import annotations

import time
from email.utils import formatdate

import pytest

from lockgate.providers.headers import (
    MAX_PAUSE_MS,
    Signals,
    parse_count,
    parse_duration_ms,
    parse_retry_after_ms,
    read_signals,
)


@pytest.mark.parametrize("raw,ms", [
    ("6m0s", 360_000), ("1m30s", 90_000), ("1.5s", 1500), ("250ms", 250), ("0s", 0),
    ("1h2m3s", 3_723_000), ("1m500ms", 60_500), ("2", 2000), ("0.25", 250), (" 20ms ", 20),
    ("20.5ms", 21),
])
def test_durations_in_every_format_providers_use(raw: str, ms: int) -> None:
    assert parse_duration_ms(raw) == ms


@pytest.mark.parametrize("raw", [None, "", "-1", "-5s", "soon", "1d", "NaN", "ms",
                                 "999999999"])
def test_unreadable_durations_are_ignored(raw: str | None) -> None:
    assert parse_duration_ms(raw) is None


@pytest.mark.parametrize("raw,value", [("60000", 60000), ("0", 0), ("12.0", 12),
                                       ("-1", None), ("x", None), (None, None)])
def test_counts(raw: str | None, value: int | None) -> None:
    assert parse_count(raw) == value


def test_retry_after_ms_wins_over_seconds() -> None:
    assert parse_retry_after_ms({"retry-after-ms": "1500", "retry-after": "9"}) == 1500
    assert parse_retry_after_ms({"retry-after": "2"}) == 2000
    assert parse_retry_after_ms({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) is None
    assert parse_retry_after_ms({"retry-after-ms": "0", "retry-after": "-1"}) is None
    assert parse_retry_after_ms({"retry-after-ms": "junk", "retry-after": "1"}) == 1000
    for junk in ("inf", "nan", "-inf", "Wed, 99 Foo 2015", ""):
        assert parse_retry_after_ms({"retry-after": junk}) is None, junk


def test_retry_after_as_an_http_date_counts_from_the_response_date() -> None:
    date = "Fri, 05 Dec 2026 10:00:00 GMT"
    assert parse_retry_after_ms({"retry-after": "Fri, 05 Dec 2026 10:00:06 GMT",
                                 "date": date}) == 6000
    assert parse_retry_after_ms({"retry-after": "Fri, 05 Dec 2026 09:59:59 GMT",
                                 "date": date}) is None  # already past: no pause
    # Without a Date header: from this machine's clock.
    soon = formatdate(time.time() + 30, usegmt=True)
    assert 28_000 <= (parse_retry_after_ms({"retry-after": soon}) or 0) <= 30_000


def test_a_retry_after_beyond_a_day_is_shortened_to_a_day() -> None:
    assert parse_retry_after_ms({"retry-after": "90000"}) == MAX_PAUSE_MS
    assert parse_retry_after_ms({"retry-after-ms": str(10 * MAX_PAUSE_MS)}) == MAX_PAUSE_MS


def test_a_full_set_of_headers() -> None:
    sig = read_signals({
        "x-ratelimit-limit-requests": "500", "x-ratelimit-remaining-requests": "499",
        "x-ratelimit-reset-requests": "120ms", "x-ratelimit-limit-tokens": "90000",
        "x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "6m0s"})
    assert (sig.limit_requests, sig.remaining_requests, sig.reset_requests_ms) == (500, 499, 120)
    assert (sig.limit_tokens, sig.remaining_tokens, sig.reset_tokens_ms) == (90000, 0, 360_000)
    assert sig.pause_ms() == 360_000  # no tokens left until the reset


@pytest.mark.parametrize("headers", [
    {},
    {"x-ratelimit-limit-requests": "-1", "x-ratelimit-remaining-requests": "-1"},
    {"x-ratelimit-limit-requests": "0", "x-ratelimit-remaining-requests": "0",
     "x-ratelimit-reset-requests": "0s"},
    {"x-ratelimit-remaining-requests": "0"},  # nothing left but no reset: contradictory
    {"x-ratelimit-remaining-tokens": "abc", "x-ratelimit-reset-tokens": "zzz"},
    {"retry-after": "-3"},
])
def test_missing_or_nonsense_headers_never_pause_or_set_a_limit(
        headers: dict[str, str]) -> None:
    sig = read_signals(headers)
    assert sig.pause_ms() is None
    assert sig.limit_requests is None and sig.limit_tokens is None


def test_the_clients_own_retry_after_is_used_without_headers() -> None:
    assert read_signals(None, 700).pause_ms() == 700
    assert read_signals({}, None).empty
    assert Signals(retry_after_ms=5, remaining_requests=0, reset_requests_ms=900
                   ).pause_ms() == 5
