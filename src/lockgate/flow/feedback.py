"""What a finished call teaches: health figures, the adaptive limit's samples, the
breaker's verdict, the settlement of reserved tokens, and the limits and pauses the
provider's answer names (docs/flow.md, "Learning from the provider").

A 429 for the rate pauses the endpoint and cuts the shared rate; ``insufficient_quota``
pauses it for ``quota_pause_s``; a remaining of 0 with a reset pauses it for the time
one call frees (``reset / limit``), or until the reset when a call sent after such a
pause is refused again. A Retry-After replaces a pause only inferred from headers.
Pauses are published to the shared row with the next lease.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable

from lockgate.config import FlowSettings
from lockgate.errors import ErrorClass
from lockgate.flow.admission import Admission, Ticket
from lockgate.flow.breaker import BreakerState
from lockgate.flow.bucket import CUT, SPORADIC_CUT
from lockgate.flow.endpoint import EndpointState
from lockgate.flow.estimate import charged_tokens
from lockgate.providers.base import CallOutcome
from lockgate.providers.headers import Signals, read_signals
from lockgate.redact import redact_url

log = logging.getLogger("lockgate.flow")

#: Failures that are the endpoint's own (they feed the breaker); a refused key too
#: (:func:`endpoint_failure`).
ENDPOINT_FAILURES = frozenset({ErrorClass.SERVER_ERROR, ErrorClass.TIMEOUT,
                               ErrorClass.CONNECTION_ERROR})


#: What a 403 says when it refuses the key itself, not one model, a resource or a
#: region: OpenAI's ``invalid_api_key`` "Incorrect API key provided", Google's
#: ``API_KEY_INVALID`` and PERMISSION_DENIED "Your API key was reported as leaked", a
#: key revoked, expired, disabled. Sought in the error's message and in its body (the
#: code, the status, the ``details`` reasons). Words about the key with a model in
#: between ("API key ... model X is invalid") or a permission it lacks ("Your API key
#: does not have permission to use the specified resource") are not one.
_KEY_403 = re.compile(
    r"(?i)invalid.?api.?key|api.?key.?(?:invalid|expired|service.?blocked)"
    r"|\b(?:invalid|incorrect|expired|revoked|leaked|disabled|deactivated|suspended"
    r"|deleted|compromised) (?:x-)?api[ _-]?key\b"
    r"|\bapi[ _-]?key\b(?:(?!\bmodels?\b|\bbut\b)[^.;]){0,40}?\b(?:not valid|invalid"
    r"|incorrect|expired|revoked|leaked|disabled|deactivated|suspended|blocked|deleted"
    r"|compromised)\b")


def key_refused(out: CallOutcome | None) -> bool:
    """Whether the endpoint refused the key (an auth error: a 401, a key refused in
    another 4xx such as Gemini's 400 ``API_KEY_INVALID``, or no status): every call to
    it meets that until the key is fixed. A 403 counts only when it says the key itself
    is refused (:data:`_KEY_403`: invalid, leaked, revoked, expired): some providers
    give a 403 for one model not enabled, or a region, and the endpoint serves others.
    An error object inside a 200 answer counts by the status its code names
    (``"code": 401`` is a refused key, ``"code": 403`` only in those words), as that
    status would have."""
    err = out.error if out is not None else None
    if err is None or err.error_class is not ErrorClass.AUTH_ERROR:
        return False
    return err.status != 403 or bool(_KEY_403.search(err.message)) \
        or (err.body is not None and bool(_KEY_403.search(err.body)))


def endpoint_failure(out: CallOutcome) -> bool:
    """Whether a call's failure is the endpoint's own (it feeds the breaker)."""
    return out.error_class in ENDPOINT_FAILURES or key_refused(out)


def down_error(out: CallOutcome | None) -> bool:
    """Whether a failure spares the task's attempts while its endpoint counts as down:
    the call never reached a server that could answer it, or its key was refused."""
    return (out is not None and out.error_class is ErrorClass.CONNECTION_ERROR) \
        or key_refused(out)
def resent(out: CallOutcome) -> bool:
    """Whether a call's request was sent twice (its pooled connection was stale)."""
    found = out.completion if out.completion is not None else out.error
    return bool(getattr(found, "resent", False))


#: Refusals for the rate or the quota (they pause instead).
THROTTLED = frozenset({ErrorClass.RATE_LIMITED, ErrorClass.QUOTA_EXHAUSTED})


class Feedback:
    """Accounts for the calls of one worker as they end."""

    def __init__(self, cfg: FlowSettings, admission: Admission, worker_id: str, *,
                 learn_tokens: Callable[[str, float], None],
                 wake: Callable[[], None]) -> None:
        self.cfg = cfg
        self.admission = admission
        self.worker_id = worker_id
        self._learn_tokens = learn_tokens
        self._wake = wake

    def unsent(self, t: Ticket) -> None:
        """A call that had passage was never sent (rendering failed, or it was handed
        back to routing): the budget goes back, the breaker's probe place is free."""
        if t.run_probe:
            t.state.probe_done()
        t.state.breaker.unjudged(t.probe)
        self.admission.cold.done(t.cold, None)
        self.admission.undo(t.state, t.tokens, budgeted=t.budgeted)

    def abandoned(self, t: Ticket) -> None:
        """A call was cancelled or crashed while it was being sent: its budget counts
        as spent (the provider may have counted it); it says nothing of the endpoint's
        health, so a half-open breaker's probe place is free again."""
        t.state.in_flight -= 1
        if t.run_probe:
            t.state.probe_done()
        t.state.breaker.unjudged(t.probe)
        self.admission.cold.done(t.cold, None)
        self.admission.dispatch(t.state)

    def release(self, t: Ticket, out: CallOutcome) -> None:
        """Account for a call the provider answered (or failed): settle tokens, learn
        limits and pauses, feed the concurrency policy and the breaker, and let the next
        call go."""
        st = t.state
        st.in_flight -= 1
        if t.run_probe:
            st.probe_done()
        now = time.monotonic()
        ec = out.error_class
        throttled = ec in THROTTLED
        failed = endpoint_failure(out)
        self._count(t, out, failed=failed, throttled=throttled, now=now)
        completion = out.completion
        if completion is not None:  # the provider took the call
            st.run_ended(now - out.latency_ms / 1000.0, now)
            if st.pace is not None:
                if st.waiters:  # the pace holds calls back, and no 429 came
                    st.pace.rise(now)
            elif not st.req_limited:
                st.answered.append(now - out.latency_ms / 1000.0)  # when it was sent
        self._charge(t, throttled, now - out.latency_ms / 1000.0)
        if throttled:
            st.breaker.unjudged(t.probe)
        else:
            was = st.breaker.state
            st.breaker.record(now, failed=failed, probe=t.probe)
            if st.breaker.state is not was:
                if st.breaker.state is BreakerState.CLOSED:
                    st.health.failing_since = None
                self._breaker_changed(st, was, now)
            self._settle(t, out)
        self.admission.cold.done(t.cold, t.model, refused=throttled)
        t.in_run = self._learn(st, out, now, t.tokens)
        self.admission.dispatch(st)

    @staticmethod
    def _count(t: Ticket, out: CallOutcome, *, failed: bool, throttled: bool,
               now: float) -> None:
        """The health figures and the adaptive limit's sample of a call that ended."""
        st = t.state
        ec = out.error_class
        completion = out.completion
        h = st.health
        h.calls += 2 if resent(out) else 1  # a request sent twice is two calls
        if failed or throttled:
            h.failures += 1
        if throttled:
            h.throttled += 1
            if ec is ErrorClass.RATE_LIMITED:
                st.refusing = True
        if t.routed_from:
            h.rerouted += 1
        st.adaptive.record(0.0 if throttled else out.latency_ms, ok=not failed,
                           dropped=throttled or ec is ErrorClass.TIMEOUT,
                           output_tokens=completion.completion_tokens if completion else None,
                           in_flight=st.in_flight + 1)
        if not throttled:
            lat = out.latency_ms
            h.latency_ewma = lat if h.latency_ewma is None else \
                h.latency_ewma + 0.05 * (lat - h.latency_ewma)
        h.failure_ewma += 0.02 * ((1.0 if (failed or throttled) else 0.0) - h.failure_ewma)
        if failed:
            h.last_error = _describe(out)
            if h.failing_since is None:
                h.failing_since = now
        else:  # an answer, whatever it says: the endpoint is reachable
            h.last_answer = now
            if st.breaker.state is BreakerState.CLOSED:
                # (a breaker open or half-open: the failure goes on until it closes; a
                # probe answered beside others failing does not restart its count)
                h.failing_since = None
            st.heard = True

    @staticmethod
    def _charge(t: Ticket, throttled: bool, sent: float) -> None:
        """The request a call (sent at ``sent``) costs in the shared bucket: a refused
        one (429) was not counted by the provider, an answered one was."""
        st = t.state
        if throttled:
            if st.limited:  # the provider did not count it: the reservation goes back
                if t.budgeted:  # (sent before the limit was known: never charged)
                    st.ledger.refund(t.tokens)
            else:  # nor is it charged once a limit is learned
                st.refused_recent.append(sent)
        elif st.req_limited and not t.budgeted:
            # Sent before the limit was learned, in flight then (not charged with the
            # calls already answered): in the provider's window now.
            st.ledger.debt_req += 1.0

    def _breaker_changed(self, st: EndpointState, was: BreakerState, now: float) -> None:
        """Say so when an endpoint's breaker opens (WARNING: its calls stop) and when it
        closes again (INFO)."""
        h = st.health
        b = st.breaker
        url = redact_url(st.ep.base_url)
        if b.state is BreakerState.OPEN:
            down = now - h.failing_since if h.failing_since is not None else 0.0
            if was is BreakerState.CLOSED:
                log.warning("endpoint '%s' (%s) is failing: %s; its calls wait %.3g s, "
                            "then try again", st.name, url, h.last_error or "errors",
                            b.open_until - now)
            else:
                log.warning("endpoint '%s' (%s) still failing after %.0f s: %s; next try in "
                            "%.3g s", st.name, url, down, h.last_error or "errors",
                            b.open_until - now)
        elif b.state is BreakerState.CLOSED and was is not BreakerState.CLOSED:
            log.info("endpoint '%s' (%s) answers again; its calls resume", st.name, url)

    def down(self, st: EndpointState, now: float) -> bool:
        """Whether ``st`` counts as down for a connection error just recorded: it has
        answered nothing for a breaker window (or its breaker is open), and it has not
        been failing for longer than ``endpoint_down_max_s``. Its tasks then wait
        without spending an attempt (docs/flow.md, "When an endpoint is down")."""
        h = st.health
        if h.failing_since is None or now - h.failing_since >= self.cfg.endpoint_down_max_s:
            return False
        silent = h.last_answer is None or now - h.last_answer >= self.cfg.breaker_window_s
        return silent or st.breaker.state is not BreakerState.CLOSED

    def _settle(self, t: Ticket, out: CallOutcome) -> None:
        """Teach the token estimate, and carry real minus reserved tokens to the next
        lease (the usage unknown: the reservation stands). The usage is the answer's,
        or that of an answer the provider billed that is an error here (a refusal, a
        filtered answer, tool calls)."""
        found = out.completion if out.completion is not None else out.error
        prompt_tokens = getattr(found, "prompt_tokens", None)
        completion_tokens = getattr(found, "completion_tokens", None)
        if prompt_tokens is None and out.completion is None:
            return  # no answer, no usage: the reservation stands
        st = t.state
        m = t.model
        if m is not None:
            m.learn(t.input_chars, prompt_tokens, completion_tokens)
        charged = charged_tokens(prompt_tokens, completion_tokens,
                                 m.max_tokens if m else None, st.ep.tpm_counts_max_tokens)
        if charged is None:
            return
        if st.tok_limited:
            st.ledger.debt_tok += charged - t.tokens
        self._learn_tokens(t.batch_id, float(charged))

    def _learn(self, st: EndpointState, out: CallOutcome, now: float,
               tokens: float | None = None) -> bool:
        """Learn limits and pauses from an answer; returns whether it is a 429 of a run
        of refusals naming nothing (:meth:`_refused`), which spends no attempt."""
        headers = out.rate_limit
        ec = out.error_class
        if out.completion is not None or ec is ErrorClass.RATE_LIMITED:
            st.note_answer(now, refused=out.completion is None)
        if ec is None:
            # A success: read the headers fully only when something is exhausted, and
            # every 32nd answer to learn the limits (parsing costs more than the rest
            # of the accounting together); every answer while no limit is known.
            st.health.answers += 1
            if not headers or (headers.get("x-ratelimit-remaining-requests") != "0"
                               and headers.get("x-ratelimit-remaining-tokens") != "0"
                               and st.health.answers % 32 and st.limited):
                return False
        sig = read_signals(headers, out.retry_after_ms)
        led = st.ledger
        # A limit whose reset (the time until it is full again) is well beyond the
        # window (twice: a reset given as a time in whole seconds may pass it a little)
        # is not per window (Groq's requests limit is per day: 14,400 with a reset of
        # 2m59.56s): it is not learned as one; its pauses still come from remaining
        # and reset.
        window_ms = 2 * st.ep.limit_window_s * 1000.0
        if sig.limit_requests is not None and sig.limit_requests != led.sent_rpm \
                and (sig.reset_requests_ms or 0) <= window_ms:
            led.learned_rpm = float(sig.limit_requests)
        if sig.limit_tokens is not None and sig.limit_tokens != led.sent_tpm \
                and (sig.reset_tokens_ms or 0) <= window_ms:
            led.learned_tpm = float(sig.limit_tokens)
        if not st.limited and (led.learned_rpm or led.learned_tpm):
            # The first limit this endpoint names: from now on calls wait for budget
            # (the next lease, at once), the calls sent before are charged to it.
            st.learned(led.learned_rpm, led.learned_tpm, now)
            self._wake()
        if ec is ErrorClass.QUOTA_EXHAUSTED:
            self._pause(st, int(self.cfg.quota_pause_s * 1000), "quota", now)
        elif ec is ErrorClass.RATE_LIMITED:
            if st.sporadic(now) and sig.remaining_requests != 0 \
                    and sig.remaining_tokens != 0:
                # Now and then, not a limit reached: only this call waits. But calls
                # waiting for the bucket's budget mean it paces at the limit, and a
                # provider enforcing the limit over a shorter period than it names
                # refuses what bunched up on the way: the rate goes down a small step
                # (at most one a CUT_GAP_MS, climbing back without 429s), unpaused.
                if st.limited and st.waiters:
                    led.cut = min(led.cut, SPORADIC_CUT)
                return False
            sent = now - out.latency_ms / 1000.0
            if st.limited:  # over the limit: every worker's rate goes down a step
                led.cut = min(led.cut, CUT)
            if not st.req_limited:  # refused for the rate, with no limit known
                self._pace(st, sent, now)
            return self._refused(st, sig, sent, now, tokens)
        elif ec is not None and sig.explicit and sig.remaining_requests != 0 \
                and sig.remaining_tokens != 0:
            # A Retry-After on another error (a 503): the server is unavailable for
            # that long, no limit is spent (before, its pause read "exhausted").
            self._pause(st, sig.pause_ms() or 0, "unavailable", now, explicit=True)
        else:
            ms = self._exhausted_ms(st, sig, None, now, tokens)
            if ms:
                self._pause(st, ms, "exhausted", now)
        return False

    def _refused(self, st: EndpointState, sig: Signals, sent: float, now: float,
                 tokens: float | None) -> bool:
        """Pause after a 429 for the rate: for its Retry-After; else, its headers saying
        nothing remains, as :meth:`_exhausted_ms` says; else, a 429 naming nothing, for
        ``default_pause_s``, doubled for each pause of a run of such refusals (the
        provider accepting nothing in between: a window's limit reached) up to the
        endpoint's ``limit_window_s`` (:meth:`~lockgate.flow.endpoint.EndpointState.
        run_pause_ms`), one call probing after each, when the provider accepted a call
        within two windows (:meth:`~lockgate.flow.endpoint.EndpointState.at_limit`).
        Returns whether it is a 429 of such a run: the provider is at its limit, the
        task spends no attempt."""
        if sig.explicit:
            self._pause(st, sig.pause_ms() or 0, "rate_limited", now, explicit=True)
        elif (ms := self._exhausted_ms(st, sig, sent, now, tokens)) is not None:
            self._pause(st, ms, "exhausted", now)
        elif st.at_limit(now):
            ms = st.run_pause_ms(self.cfg.default_pause_s * 1000.0, sent, now)
            self._pause(st, ms, "rate_limited", now)
            st.run_from = max(st.run_from, st.paused_until)
            return True
        else:
            self._pause(st, int(self.cfg.default_pause_s * 1000), "rate_limited", now)
        return False

    @staticmethod
    def _exhausted_ms(st: EndpointState, sig: Signals, refused_sent: float | None,
                      now: float, tokens: float | None) -> int | None:
        """The pause for a limit the headers say has nothing remaining (no Retry-After):
        the time one call frees, ``reset / limit`` (a reset is the time until the limit
        is full again), unless this is a 429 for a call sent after such a pause ended
        (``refused_sent``), before the reset that pause was inferred from: the limit is a
        fixed window then, and the pause this answer's reset."""
        ms = sig.pause_ms(tokens)
        if ms is None:
            return None
        full = sig.reset_ms() or ms
        if refused_sent is not None and st.short_until <= refused_sent < st.short_reset:
            st.short_until = st.short_reset = 0.0  # the next time: a short pause again
            return full
        if ms < full:
            st.short_until = max(st.short_until, now + ms / 1000.0)
            st.short_reset = max(st.short_reset, now + full / 1000.0)
        return ms

    def _pace(self, st: EndpointState, sent: float, now: float) -> None:
        """A 429 for the rate (of a call sent at ``sent``) from an endpoint that names no
        request limit: note when, for a pace to be inferred when the pause ends
        (:meth:`~lockgate.flow.endpoint.EndpointState.infer_pace`), or slow the pace
        down (:class:`~lockgate.flow.endpoint.Pace`)."""
        if st.pace is None:
            if st.refused is None:
                st.refused = sent
        elif st.pace.cut(now, sent, accepted=st.accepted(now)):
            log.debug("worker %s: endpoint %s paced at %.3g a second after a 429",
                      self.worker_id, st.name, st.pace.rate)

    def _pause(self, st: EndpointState, ms: int, reason: str, now: float, *,
               explicit: bool = False) -> None:
        """Pause ``st`` for ``ms``: never shortening a pause in force, except that a
        pause the provider named (``explicit``: Retry-After) replaces one only inferred
        (from its headers, or the default), longer or shorter."""
        until = now + ms / 1000.0
        replace = explicit and st.pause_inferred and st.paused(now)
        if until > st.paused_until or replace:
            if st.paused_until <= now:
                log.info("worker %s: endpoint %s paused for %d ms (%s)", self.worker_id,
                         st.name, ms, reason)
                if st.limited:
                    st.ledger.give_up()
            st.paused_until = until
            st.pause_reason = reason
            if reason == "quota":  # when it ends, one call probes the endpoint
                st.quota_probe, st.probe_out = True, False
            if st.pace is not None:
                st.pace.hold(until)
            st.pause_inferred = not explicit and reason != "quota"
        st.ledger.publish_pause(ms, reason, explicit=explicit, replace=replace)
        self._wake()  # publish at once: other workers learn it on their next lease


def _describe(out: CallOutcome) -> str:
    """One line for an endpoint failure: its class and message."""
    exc = out.error
    if exc is None:
        return "failed"
    msg = " ".join(str(exc).split())[:200]
    ec = str(exc.error_class)
    if not msg:
        return ec
    return msg if msg.startswith(ec) else f"{ec}: {msg}"
