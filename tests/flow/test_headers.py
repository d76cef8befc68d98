"""Provider limit headers: durations, counts, Retry-After, and junk that must be ignored."""

from __future__ import annotations

import time
from email.utils import formatdate

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lockgate.providers.headers import (
    MAX_PAUSE_MS,
    RATE_HEADERS,
    Signals,
    parse_count,
    parse_duration_ms,
    parse_retry_after_ms,
    rate_headers,
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


def test_a_retry_after_beyond_a_day_is_junk_not_a_day_long_pause() -> None:
    # One "retry-after: 9999999999999999999999" paused the endpoint for a day, for every
    # worker; a reset beyond a day was already junk.
    assert parse_retry_after_ms({"retry-after": str(MAX_PAUSE_MS // 1000)}) == MAX_PAUSE_MS
    for junk in ("90000", "9999999999999999999999", "1e308"):
        assert parse_retry_after_ms({"retry-after": junk}) is None, junk
    assert parse_retry_after_ms({"retry-after-ms": str(10 * MAX_PAUSE_MS),
                                 "retry-after": "2"}) == 2000


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


DATE = "Sun, 06 Dec 2026 10:00:00 GMT"


@pytest.mark.parametrize(("headers", "want"), [
    # IETF, drafts 6-7: one dictionary, the window from the policy
    ({"ratelimit": "limit=3000, remaining=0, reset=5", "ratelimit-policy": "3000;w=60"},
     {"x-ratelimit-limit-requests": "3000", "x-ratelimit-remaining-requests": "0",
      "x-ratelimit-reset-requests": "5000ms"}),
    # IETF, draft 8 on: named policies; 50 in any second is 3,000 a minute
    ({"ratelimit": '"default";r=7;t=1', "ratelimit-policy": '"default";q=50;w=1'},
     {"x-ratelimit-limit-requests": "3000", "x-ratelimit-remaining-requests": "7",
      "x-ratelimit-reset-requests": "1000ms"}),
    # several policies: the one with the fewest remaining
    ({"ratelimit": '"minute";r=10;t=30, "hour";r=0;t=600',
      "ratelimit-policy": '"minute";q=100;w=60, "hour";q=600;w=3600'},
     {"x-ratelimit-limit-requests": "10", "x-ratelimit-remaining-requests": "0",
      "x-ratelimit-reset-requests": "600000ms"}),
    # a policy named for tokens counts tokens
    ({"ratelimit": '"requests";r=40;t=1, "tokens";r=0;t=2',
      "ratelimit-policy": '"requests";q=50;w=60, "tokens";q=9000;w=60'},
     {"x-ratelimit-limit-requests": "50", "x-ratelimit-remaining-requests": "40",
      "x-ratelimit-reset-requests": "1000ms", "x-ratelimit-limit-tokens": "9000",
      "x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "2000ms"}),
    # the older triple whose limit names its window
    ({"ratelimit-limit": "50, 50;w=1", "ratelimit-remaining": "3", "ratelimit-reset": "1"},
     {"x-ratelimit-limit-requests": "3000", "x-ratelimit-remaining-requests": "3",
      "x-ratelimit-reset-requests": "1000ms"}),
    # the older triple, and a limit without its window: remaining and reset only
    ({"ratelimit-limit": "100", "ratelimit-remaining": "0", "ratelimit-reset": "7"},
     {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "7000ms"}),
    ({"ratelimit": "limit=100, remaining=3, reset=2"},
     {"x-ratelimit-remaining-requests": "3", "x-ratelimit-reset-requests": "2000ms"}),
    # Anthropic: per minute, the reset an RFC 3339 time counted from the Date header
    ({"anthropic-ratelimit-requests-limit": "50", "anthropic-ratelimit-requests-remaining": "0",
      "anthropic-ratelimit-requests-reset": "2026-12-06T10:00:05Z",
      "anthropic-ratelimit-tokens-limit": "40000",
      "anthropic-ratelimit-tokens-remaining": "39000",
      "anthropic-ratelimit-tokens-reset": "2026-12-06T10:00:00.500+00:00", "date": DATE},
     {"x-ratelimit-limit-requests": "50", "x-ratelimit-remaining-requests": "0",
      "x-ratelimit-reset-requests": "5000ms", "x-ratelimit-limit-tokens": "40000",
      "x-ratelimit-remaining-tokens": "39000", "x-ratelimit-reset-tokens": "500ms"}),
    # OpenAI's own are kept as sent, whatever else is there
    ({"x-ratelimit-remaining-requests": "4", "ratelimit": "limit=1, remaining=0, reset=9"},
     {"x-ratelimit-remaining-requests": "4"}),
    # junk is left out, never guessed
    ({"ratelimit": "garbage;;,,=", "ratelimit-policy": "=;w=abc"}, {}),
    ({"ratelimit": '"d";r=-1;t=x', "ratelimit-policy": '"d";q=0;w=0'}, {}),
    ({"anthropic-ratelimit-requests-remaining": "0",
      "anthropic-ratelimit-requests-reset": "tomorrow"},
     {"x-ratelimit-remaining-requests": "0"}),
    ({"anthropic-ratelimit-requests-remaining": "1",
      "anthropic-ratelimit-requests-reset": "2026-12-09T10:00:00Z", "date": DATE},
     {"x-ratelimit-remaining-requests": "1"}),  # beyond a day
])
def test_the_ietf_and_anthropic_limit_headers_read_as_openai_s(
        headers: dict[str, str], want: dict[str, str]) -> None:
    assert rate_headers(headers) == want


_NAMES = [*RATE_HEADERS, "ratelimit", "ratelimit-policy", "ratelimit-limit",
          "ratelimit-remaining", "ratelimit-reset", "date", "retry-after",
          *(f"anthropic-ratelimit-{k}-{p}" for k in ("requests", "tokens")
            for p in ("limit", "remaining", "reset"))]
_VALUES = st.one_of(
    st.text(max_size=40),
    st.from_regex(r'\A("[a-z]{1,5}";)?[a-z]{1,9}=-?[0-9.e]{0,6}([;,] ?[a-z]{1,9}='
                  r'-?[0-9.e]{0,6}){0,4}\Z'),
    st.from_regex(r"\A20[0-9]{2}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-5][0-9]"
                  r"(\.[0-9]{1,6})?(Z|[+-][01][0-9]:[0-5][0-9])?\Z"))


@given(st.dictionaries(st.sampled_from(_NAMES), _VALUES, max_size=8))
def test_no_limit_header_can_crash_a_worker_or_pause_beyond_a_day(
        headers: dict[str, str]) -> None:
    out = rate_headers(headers)
    assert set(out) <= set(RATE_HEADERS)
    sig = read_signals(out)
    assert (sig.pause_ms() or 0) <= MAX_PAUSE_MS
    assert all(v is None or v >= 0 for v in (sig.limit_requests, sig.remaining_requests,
                                             sig.limit_tokens, sig.remaining_tokens))
