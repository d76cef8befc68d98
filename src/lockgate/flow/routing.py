"""Where a call goes: its endpoint while that is usable, else the first usable endpoint
of its fallback chain (docs/flow.md, "Circuit breaker and fallback").

An endpoint is unusable while it is out of quota, paused because it answered that it is
unavailable (a 503 or 529 with Retry-After), paused for longer than
``fallback_after_s``, or its breaker is open. With no usable fallback a call stays
with its own endpoint and waits for it.

An unavailable endpoint's short pause is no reason to wait: a call refused by it came
back (its retry) within ``fallback_after_s`` of the pause's end, waited for the endpoint,
was the one call sent when the pause ended, met the 503 again, and so on at every pause
until its task was DEAD, while the fallback served every other task.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from lockgate.config import Endpoint, FlowSettings, Settings
from lockgate.flow.endpoint import EndpointState


def fallback_chain(settings: Settings, ep: Endpoint) -> Iterator[Endpoint]:
    """The endpoints that take over ``ep``'s calls, nearest first (``ep`` itself not
    included). The settings refuse loops; a name seen twice ends the walk anyway."""
    seen = {ep.name}
    while ep.fallback is not None and ep.fallback not in seen:
        nxt = settings.endpoint_named(ep.fallback)
        if nxt is None:
            return
        seen.add(nxt.name)
        yield nxt
        ep = nxt


#: Pauses that make an endpoint unusable however short they are: out of quota, or
#: unavailable (its server errors named a wait). A rate limit's short pause is waited
#: out on the endpoint itself (up to ``fallback_after_s``).
UNUSABLE_PAUSES = frozenset({"quota", "unavailable"})


class Router:
    """The endpoints of one worker (their :class:`EndpointState`) and the choice among
    them."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.cfg: FlowSettings = settings.flow
        self.states: dict[str, EndpointState] = {}

    def state(self, ep: Endpoint) -> EndpointState:
        st = self.states.get(ep.name)
        if st is None:
            st = self.states[ep.name] = EndpointState(ep, self.cfg, time.monotonic())
        return st

    def usable(self, st: EndpointState, now: float) -> bool:
        """Not out of quota or unavailable, not paused for long, and the breaker lets
        calls through."""
        left = st.paused_until - now
        if left > 0 and (st.pause_reason in UNUSABLE_PAUSES or left > self.cfg.fallback_after_s):
            return False
        return st.breaker.available(now)

    def fallback(self, ep: Endpoint, now: float) -> EndpointState | None:
        """The first usable endpoint of ``ep``'s fallback chain, if any."""
        for nxt in fallback_chain(self.settings, ep):
            st = self.state(nxt)
            if self.usable(st, now):
                return st
        return None

    def route(self, primary: Endpoint, now: float) -> tuple[EndpointState, str | None]:
        """The endpoint to use now and, when it is a fallback, the primary's name."""
        st = self.state(primary)
        if self.usable(st, now):
            return st, None
        fb = self.fallback(primary, now)
        return (st, None) if fb is None else (fb, primary.name)
