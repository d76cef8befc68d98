"""Delivering alert events to webhooks from the outbox (``alert_delivery``).

A delivery row is written in the transaction of the alert change it announces, so an
event is never lost to a crash. A sender claims due rows under a fresh token for the
webhook's timeout plus a margin, posts them, and marks each DELIVERED (2xx), retries it
later with exponential back-off (5xx, 408, 429, a timeout or connection error), or marks
it FAILED (any other status, or ``max_attempts`` reached). A sender killed mid-post
leaves its rows to be claimed again once the claim has passed: delivery is at least
once, and every copy of an event carries the same ``X-Lockgate-Delivery`` id.

The body is signed: ``X-Lockgate-Signature: sha256=<hex>``, the HMAC-SHA256 of the raw
body bytes with the webhook's secret (docs/quality.md shows how to check it).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets
from typing import Any

import aiohttp

from lockgate.config import QualitySettings, Webhook
from lockgate.store.alerts import AlertStore
from lockgate.store.store import Store

log = logging.getLogger("lockgate.quality")

#: Added to a webhook's timeout for the claim of a delivery.
CLAIM_MARGIN_MS = 30_000
RETRIED = frozenset({408, 429})


def signature(key: bytes, body: bytes) -> str:
    """The ``X-Lockgate-Signature`` header's value of ``body``."""
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()


def verify(key: bytes, body: bytes, header: str | None) -> bool:
    """Whether ``header`` is the signature of ``body`` (constant-time comparison)."""
    return header is not None and hmac.compare_digest(signature(key, body), header)


class Sender:
    """Posts due deliveries of the outbox (any number of senders may run)."""

    def __init__(self, store: Store, settings: QualitySettings, *, batch: int = 20,
                 margin_ms: int = CLAIM_MARGIN_MS) -> None:
        self.astore = AlertStore(store)
        self.q = settings
        self.batch = batch
        #: how long a claim lasts: the longest webhook timeout plus ``margin_ms``
        self.lease_ms = int(max((w.timeout_s for w in settings.webhook), default=10.0)
                            * 1000) + margin_ms
        #: (webhook name, key) read once: a missing secret stops the worker at start
        self.keys: dict[str, bytes | None] = {w.target: w.key() for w in settings.webhook}

    async def pass_once(self) -> int:
        """Claim the due deliveries and post them concurrently; how many were tried."""
        token = secrets.token_hex(16)
        rows = await asyncio.to_thread(self.astore.claim_deliveries, token, self.lease_ms,
                                       self.batch)
        if not rows:
            return 0
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(self._send(session, r, token) for r in rows))
        return len(rows)

    async def _send(self, session: aiohttp.ClientSession, row: dict[str, Any],
                    token: str) -> None:
        w = self.q.webhook_named(row["target"])
        rid = int(row["id"])
        if w is None:
            await asyncio.to_thread(self.astore.failed, rid, token,
                                    f"no webhook named {row['target']!r} in [quality]")
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
                status = resp.status
                await resp.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            await self._again(w, row, token, f"{type(exc).__name__}: {exc}"[:500])
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


__all__ = ["Sender", "signature", "verify"]
