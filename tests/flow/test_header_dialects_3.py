"""The unsuffixed ``x-ratelimit-{limit,remaining,reset}`` (Together, OpenRouter, many
gateways), and what a reset means: the time until the limit is full again (OpenAI:
"resets to its initial state"), not the time until the next call may go."""

from __future__ import annotations

import time
from email.utils import formatdate, parsedate_to_datetime

import pytest

from lockgate.providers.headers import Signals, rate_headers, read_signals

DATE = "Sun, 06 Dec 2026 10:00:00 GMT"
EPOCH_S = int(parsedate_to_datetime(DATE).timestamp())


@pytest.mark.parametrize(("reset", "ms"), [
    ("8", 8000),  # Together: seconds until the reset
    ("0.5", 500),
    ("6m0s", 360_000),
    (str(EPOCH_S * 1000 + 8000), 8000),  # OpenRouter: epoch milliseconds
    (str(EPOCH_S + 8), 8000),  # epoch seconds
])
def test_the_unsuffixed_headers_read_as_the_requests_ones(reset: str, ms: int) -> None:
    """A 429 with ``x-ratelimit-limit: 60``, ``-remaining: 0``, ``-reset: 8``: they were
    ignored, every 429 got the 1 s default pause and 4 tasks were DEAD ``rate_limited``
    after 4 attempts in 5-6 s, with the limit clearing after 8 s."""
    out = rate_headers({"x-ratelimit-limit": "60", "x-ratelimit-remaining": "0",
                        "x-ratelimit-reset": reset, "date": DATE})
    assert out == {"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "0",
                   "x-ratelimit-reset-requests": f"{ms}ms"}
    sig = read_signals(out)
    assert (sig.limit_requests, sig.remaining_requests, sig.reset_requests_ms) == (60, 0, ms)
    assert sig.reset_ms() == ms


def test_an_epoch_reset_counts_from_this_clock_without_a_date() -> None:
    from lockgate.providers.headers import parse_reset_ms

    soon = int(time.time() * 1000) + 8000
    out = rate_headers({"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(soon)})
    ms = int(out["x-ratelimit-reset-requests"].removesuffix("ms"))
    assert 7000 < ms <= 8000
    assert parse_reset_ms(formatdate(time.time() + 8, usegmt=True)) is None  # not a number


@pytest.mark.parametrize("reset", [
    str(EPOCH_S - 5),  # already past
    str((EPOCH_S - 5) * 1000),
    str((EPOCH_S + 3 * 86400) * 1000),  # beyond a day
    "5000000",  # 58 days as seconds: no duration, no time
    "-1", "soon", "nan", "inf", "",
])
def test_a_reset_that_is_no_reset_is_left_out(reset: str) -> None:
    out = rate_headers({"x-ratelimit-limit": "60", "x-ratelimit-remaining": "0",
                        "x-ratelimit-reset": reset, "date": DATE})
    assert out == {"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "0"}


def test_the_suffixed_requests_form_wins_and_a_tokens_form_goes_along() -> None:
    # OpenAI's own: the unsuffixed ones (whatever they are) are not mixed in.
    assert rate_headers({"x-ratelimit-remaining-requests": "4", "x-ratelimit-remaining": "0",
                         "x-ratelimit-reset": "9"}) == {"x-ratelimit-remaining-requests": "4"}
    # Together: requests unsuffixed, tokens suffixed.
    assert rate_headers({"x-ratelimit-limit": "600", "x-ratelimit-remaining": "599",
                         "x-ratelimit-reset": "1", "x-ratelimit-limit-tokens": "180000",
                         "x-ratelimit-remaining-tokens": "179000"}) == {
        "x-ratelimit-limit-requests": "600", "x-ratelimit-remaining-requests": "599",
        "x-ratelimit-reset-requests": "1000ms", "x-ratelimit-limit-tokens": "180000",
        "x-ratelimit-remaining-tokens": "179000"}
    # Junk counts are left out.
    assert rate_headers({"x-ratelimit-limit": "-1", "x-ratelimit-remaining": "many"}) == {}


def test_a_reset_to_full_pauses_for_the_time_one_call_frees() -> None:
    """OpenAI: 'the time until the rate limit resets to its initial state'. 120 a
    minute with nothing left and a reset of 60 s frees one call every 0.5 s; the
    endpoint was paused for the whole 60 s (12 tasks took 64 s instead of ~5 s).
    Groq's per-day limit (14,400, reset 2m59.56s with 30 used) paused up to a day."""
    assert Signals(limit_requests=120, remaining_requests=0,
                   reset_requests_ms=60_000).pause_ms() == 500
    assert Signals(limit_requests=14_400, remaining_requests=0,
                   reset_requests_ms=179_560).pause_ms() == 13
    # Never more than the reset, never nothing.
    assert Signals(limit_requests=1, remaining_requests=0,
                   reset_requests_ms=900).pause_ms() == 900
    assert Signals(limit_requests=10**9, remaining_requests=0,
                   reset_requests_ms=900).pause_ms() == 1
    # Tokens: the time the call's tokens free; the call unknown, the reset.
    tok = Signals(limit_tokens=90_000, remaining_tokens=0, reset_tokens_ms=360_000)
    assert tok.pause_ms(900) == 3600
    assert tok.pause_ms() == 360_000
    # No limit known: the reset; a Retry-After: that.
    assert Signals(remaining_requests=0, reset_requests_ms=7000).pause_ms() == 7000
    assert Signals(retry_after_ms=250, limit_requests=120, remaining_requests=0,
                   reset_requests_ms=60_000).pause_ms() == 250
    assert Signals(limit_requests=120, remaining_requests=0,
                   reset_requests_ms=60_000).reset_ms() == 60_000
