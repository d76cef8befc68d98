"""Delivering alert events to webhooks from the outbox (``alert_delivery``).

A delivery row is written in the transaction of the alert change it announces, so an
event is never lost to a crash. A sender claims due rows under a fresh token for the
webhook's timeout plus a margin, posts them, and marks each DELIVERED (2xx), retries it
later with exponential back-off (5xx, 408, 429, a timeout or connection error), or marks
it FAILED (any other status, or ``max_attempts`` reached). A sender killed mid-post
leaves its rows to be claimed again once the claim has passed: delivery is at least
once, and every copy of an event carries the same ``X-Lockgate-Delivery`` id.

Each claimed delivery is posted on its own, and the sender goes on claiming while posts
are under way (at most ``batch`` at once, at most ``per_webhook`` to one webhook): while
a webhook that does not answer holds its posts for up to its timeout, the other
webhooks' deliveries go out, however many events wait for the silent one.

A sender claims only the deliveries of the webhooks its configuration names: during a
rolling change of the configuration, a delivery to a webhook this worker does not know
(renamed, or named only in the other workers' configuration) stays PENDING for a sender
that knows it, takes no place in a claim, and is reported (a WARNING per webhook, at
most every :data:`STRANGERS_EVERY_S`, with how many wait and since when).

The body is signed: ``X-Lockgate-Signature: sha256=<hex>``, the HMAC-SHA256 of the raw
body bytes with the webhook's secret (docs/quality.md shows how to check it).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from sqlalchemy.exc import DBAPIError
from yarl import URL

from lockgate.config import QualitySettings, Webhook
from lockgate.errors import StoreError
from lockgate.redact import MASK, redact_url
from lockgate.store.alerts import AlertStore
from lockgate.store.store import Store

log = logging.getLogger("lockgate.quality")

#: Added to a webhook's timeout for the claim of a delivery.
CLAIM_MARGIN_MS = 30_000
RETRIED = frozenset({408, 429})
#: Least time between two reports of the deliveries waiting for a webhook a sender does
#: not know.
STRANGERS_EVERY_S = 300.0


def signature(key: bytes, body: bytes) -> str:
    """The ``X-Lockgate-Signature`` header's value of ``body``."""
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


def verify(key: bytes, body: bytes, header: str | None) -> bool:
    """Whether ``header`` is the signature of ``body`` (constant-time comparison)."""
    return header is not None and hmac.compare_digest(signature(key, body), header)


def failure(exc: BaseException, url: str) -> str:
    """What went wrong with a post to ``url``, for the log and ``last_error``: never the
    URL's query string (a token) or user information (a password). aiohttp's
    ``ClientResponseError`` names the URL it posted to: its status and message stand
    for it; any other error's text has the URL, as written or as aiohttp spells it,
    replaced by the redacted one, and what remains of the query or password masked
    (from 4 characters: a shorter one would mask bits of the message)."""
    if isinstance(exc, aiohttp.ClientResponseError):
        text = f"{type(exc).__name__}: {exc.status}, message={exc.message!r}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    shown = redact_url(url)
    try:
        parsed = URL(url)
        spellings = {url, str(parsed), str(parsed.with_user(None)),
                     str(parsed.with_query(None)), parsed.human_repr()}
        hidden: set[str | None] = {parsed.query_string, parsed.raw_query_string,
                                   parsed.password, parsed.raw_password}
    except (ValueError, TypeError):  # not a URL yarl reads: the URL as written
        spellings, hidden = {url}, set()
    _, _, query = url.partition("?")
    hidden |= {query, query.partition("#")[0]}
    # one pass, longest first; a spelling found in the redacted URL holds no secret
    found = sorted((s for s in spellings if s not in shown), key=len, reverse=True)
    if found:
        text = re.sub("|".join(map(re.escape, found)), lambda _m: shown, text)
    secrets_left = sorted((h for h in hidden if h and len(h) >= 4), key=len, reverse=True)
    if secrets_left:
        text = re.sub("|".join(map(re.escape, secrets_left)), MASK, text)
    return text


class Sender:
    """Posts due deliveries of the outbox (any number of senders may run)."""

    def __init__(self, store: Store, settings: QualitySettings, *, batch: int = 20,
                 per_webhook: int = 4, margin_ms: int = CLAIM_MARGIN_MS) -> None:
        self.astore = AlertStore(store)
        self.q = settings
        self.batch = batch
        self.per_webhook = max(1, min(per_webhook, batch))
        #: how long a claim lasts: the longest webhook timeout plus ``margin_ms``
        self.lease_ms = int(max((w.timeout_s for w in settings.webhook), default=10.0)
                            * 1000) + margin_ms
        #: (webhook name, key) read once: a missing secret stops the worker at start
        self.keys: dict[str, bytes | None] = {w.target: w.key() for w in settings.webhook}
        #: the posts under way, one task per claimed delivery
        self._posts: set[asyncio.Task[None]] = set()
        #: posts under way per webhook (target)
        self._posting: dict[str, int] = {}
        #: set when a post ends: room for another claim (made by :meth:`run`, in its loop)
        self._ended: asyncio.Event | None = None
        #: when the deliveries waiting for unknown webhooks were last reported (monotonic)
        self._reported = float("-inf")

    async def pass_once(self) -> int:
        """Claim the due deliveries and post them concurrently; how many were tried
        (returns when their posts have ended)."""
        async with aiohttp.ClientSession() as session:
            posts = await self._claim(session)
            if posts:
                await asyncio.wait(posts)
        return len(posts)

    async def run(self, ready: Callable[[], bool], stopping: asyncio.Event,
                  poll_s: float = 1.0) -> None:
        """Post due deliveries until ``stopping`` is set, while ``ready()`` (this process
        holds the evaluator's role). A claim is made whenever fewer than ``batch`` posts
        are under way, each delivery claimed is posted on its own, so the deliveries of
        a webhook that answers go out while another's post waits for its timeout.
        Database trouble is retried at the next poll; posts cut off by the stop are
        claimed again once their claim has passed (at least once)."""
        ended = self._ended = asyncio.Event()
        async with aiohttp.ClientSession() as session:
            try:
                while not stopping.is_set():
                    n = 0
                    ended.clear()  # before the claim: a post ending from here on wakes
                    if ready():
                        try:
                            n = len(await self._claim(session))
                            if time.monotonic() - self._reported >= STRANGERS_EVERY_S:
                                self._reported = time.monotonic()
                                await asyncio.to_thread(self.report_strangers)
                        except (StoreError, DBAPIError) as exc:
                            log.warning("quality webhooks: step failed, retrying: %s", exc)
                        except Exception:  # a webhook never stops the worker
                            log.exception("quality webhooks: sending failed, retrying")
                    if not n:
                        await self._pause(stopping, poll_s)
            finally:
                posts = list(self._posts)
                for task in posts:
                    task.cancel()
                await asyncio.gather(*posts, return_exceptions=True)

    async def _claim(self, session: aiohttp.ClientSession) -> list[asyncio.Task[None]]:
        """Claim what is due, as many as there is room for, and start their posts."""
        room = self.batch - len(self._posts)
        if room <= 0:
            return []
        token = secrets.token_hex(16)
        share = {w.target: self.per_webhook - self._posting.get(w.target, 0)
                 for w in self.q.webhook}
        rows = await asyncio.to_thread(
            functools.partial(self.astore.claim_deliveries, token, self.lease_ms, room,
                              targets=list(self.keys), room=share))
        posts = []
        for row in rows:
            target = str(row["target"])
            task = asyncio.create_task(self._post(session, row, token))
            self._posts.add(task)
            self._posting[target] = self._posting.get(target, 0) + 1
            task.add_done_callback(functools.partial(self._done, target))
            posts.append(task)
        return posts

    def report_strangers(self) -> list[dict[str, Any]]:
        """Log a WARNING per webhook this sender does not know that has PENDING
        deliveries (how many, the oldest's age); returns them (``target``, ``pending``,
        ``oldest`` in ms)."""
        waiting, now = self.astore.waiting()
        strangers = [w for w in waiting if w["target"] not in self.keys]
        for w in strangers:
            log.warning("quality webhooks: %d delivery(ies) to webhook %r wait, the oldest "
                        "for %.0f s: this worker's [quality] names no such webhook, a "
                        "worker whose configuration names it sends them (docs/quality.md, "
                        "\"Webhooks\")", w["pending"], w["target"],
                        (now - w["oldest"]) / 1000)
        return strangers

    def _done(self, target: str, task: asyncio.Task[None]) -> None:
        self._posts.discard(task)
        self._posting[target] -= 1
        if self._ended is not None:
            self._ended.set()

    async def _pause(self, stopping: asyncio.Event, poll_s: float) -> None:
        """Until the next poll, or sooner: a post ended (room for a claim), or stop."""
        assert self._ended is not None
        waits = [asyncio.ensure_future(stopping.wait()),
                 asyncio.ensure_future(self._ended.wait())]
        try:
            await asyncio.wait(waits, timeout=poll_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def _post(self, session: aiohttp.ClientSession, row: dict[str, Any],
                    token: str) -> None:
        """One delivery, on its own: its failure to be recorded is logged, and the
        delivery is claimed again once its claim has passed."""
        try:
            await self._send(session, row, token)
        except (StoreError, DBAPIError) as exc:
            log.warning("quality webhooks: delivery %s to %s not recorded, it is sent "
                        "again once its claim has passed: %s", row["delivery_id"],
                        row["target"], exc)
        except Exception:  # a webhook never stops the worker
            log.exception("quality webhooks: delivery %s to %s failed, it is sent again "
                          "once its claim has passed", row["delivery_id"], row["target"])

    async def _send(self, session: aiohttp.ClientSession, row: dict[str, Any],
                    token: str) -> None:
        w = self.q.webhook_named(row["target"])
        rid = int(row["id"])
        if w is None:  # not claimed (see AlertStore.claim_deliveries): left for another
            await asyncio.to_thread(self.astore.retry_later, rid, token, 0,
                                    f"no webhook named {row['target']!r} in this "
                                    "worker's [quality]")
            return
        body = str(row["body"]).encode()
        headers = {"Content-Type": "application/json",
                   "User-Agent": "lockgate-webhook",
                   "X-Lockgate-Event": row["event"],
                   "X-Lockgate-Delivery": row["delivery_id"]}
        key = self.keys.get(w.target)
        if key is not None:
            headers["X-Lockgate-Signature"] = signature(key, body)
        try:
            async with session.post(w.url, data=body, headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=w.timeout_s),
                                    allow_redirects=False) as resp:
                # The status is the answer; the body is not read (a receiver streaming
                # without end would hold the post to its timeout, then be retried).
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            await self._again(w, row, token, failure(exc, w.url)[:500])
            return
        if 200 <= status < 300:
            await asyncio.to_thread(self.astore.delivered, rid, token)
        elif status >= 500 or status in RETRIED:
            await self._again(w, row, token, f"HTTP {status}")
        else:
            log.warning("webhook %s refused %s event of alert %s: HTTP %d (not retried)",
                        w.target, row["event"], row["alert_id"], status)
            await asyncio.to_thread(self.astore.failed, rid, token, f"HTTP {status}")

    async def _again(self, w: Webhook, row: dict[str, Any], token: str, error: str) -> None:
        attempts = int(row["attempts"])
        if attempts >= w.max_attempts:
            log.warning("webhook %s: %s event of alert %s FAILED after %d attempts: %s",
                        w.target, row["event"], row["alert_id"], attempts, error)
            await asyncio.to_thread(self.astore.failed, int(row["id"]), token, error)
            return
        delay = min(w.backoff_max_s, w.backoff_s * 2 ** (attempts - 1))
        log.info("webhook %s: %s event of alert %s not delivered (%s), retry in %.1f s",
                 w.target, row["event"], row["alert_id"], error, delay)
        await asyncio.to_thread(self.astore.retry_later, int(row["id"]), token,
                                int(delay * 1000), error)


__all__ = ["Sender", "failure", "signature", "verify"]
