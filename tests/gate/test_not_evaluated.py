"""Items the provider or the workers failed are not the candidate's errors: an outage
(quota, 5xx, timeouts) or workers that keep dying while they hold the evaluation's tasks
end the evaluation FAILED, naming how many items and which error classes, with live
unchanged; only errors the candidate causes (invalid output, a refused request, ...)
count against it (docs/gate.md, "Items that could not be evaluated")."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lockgate.errors import ErrorClass
from lockgate.gate.binding import BindingSettings, parse_threshold
from lockgate.gate.decision import decide
from lockgate.gate.metrics import Sample, compute
from lockgate.providers.base import Completion, CompletionRequest, ProviderError
from lockgate.store import Store

from .support import GOOD, Env, LocalProvider, drive, execute, run_worker

#: No retries: an error ends the item's task at once (FAILED or DEAD).
NO_RETRY = {"max_retries": 0, "base_delay_ms": 0}


class _Failing(LocalProvider):
    """The simulator's answers, except ``error`` for the inputs ``when`` picks (under a
    system prompt ``system`` picks)."""

    def __init__(self, error: ErrorClass, when: Callable[[str], bool],
                 system: Callable[[str], bool] = lambda _s: True) -> None:
        super().__init__()
        self.error, self.when, self.system = error, when, system

    async def complete(self, request: CompletionRequest) -> Completion:
        if self.when(request.messages[-1]["content"]) and \
                self.system(request.messages[0]["content"]):
            self.calls += 1
            raise ProviderError(self.error, f"{self.error} (test)", http_status=503)
        return await super().complete(request)


def _audit(env: Env) -> list[str]:
    return [a["action"] for a in env.prompts.history("p")["audit"]]


@pytest.mark.parametrize("error", [ErrorClass.QUOTA_EXHAUSTED, ErrorClass.SERVER_ERROR,
                                   ErrorClass.TIMEOUT, ErrorClass.RATE_LIMITED])
def test_a_provider_outage_fails_the_evaluation_instead_of_rejecting_it(
        env: Env, error: ErrorClass) -> None:
    # Every call refused: each item was scored ERROR and a perfect candidate ended
    # REJECTED "accuracy 0 not >= 0.9", a verdict on a prompt nobody had evaluated.
    env.setup(thresholds=["accuracy>=0.9", "error_ratio<=0.1"])
    p = env.prompts.propose("p", GOOD, retry_policy=NO_RETRY)
    assert drive(env, p.update_id, provider=_Failing(error, lambda _t: True)) == "FAILED"
    st = env.gate.status(p.update_id)
    assert env.live() == 1
    assert st["reason"].startswith(f"evaluation could not complete: p-set (candidate): "
                                   f"40 of 40 items could not be evaluated: {error} 40")
    assert "not of the candidate" in st["reason"]
    assert "`lockgate prompt propose p` with the same content (it re-uses version 2)" \
        in st["reason"]
    assert st["decision"]["outcome"] == "fail"
    ds = st["decision"]["datasets"][0]
    assert ds["checks"] == [] and ds["reason"].startswith("40 of 40 items")
    assert ds["metrics"]["counts"]["not_evaluated"] == 40
    assert ds["metrics"]["not_evaluated"] == {str(error): 40}
    assert _audit(env)[-1] == "failed"


def test_a_partial_outage_fails_rather_than_deciding_on_what_is_left(env: Env) -> None:
    # A quarter of the calls time out: the other 30 items pass every threshold, but the
    # candidate was not evaluated on the whole snapshot, so it is not activated either.
    env.setup(thresholds=["accuracy>=0.7"])
    p = env.prompts.propose("p", GOOD, retry_policy=NO_RETRY)
    provider = _Failing(ErrorClass.TIMEOUT, lambda text: "parcel" in text)
    assert drive(env, p.update_id, provider=provider) == "FAILED"
    st = env.gate.status(p.update_id)
    assert env.live() == 1
    assert "10 of 40 items could not be evaluated: timeout 10" in st["reason"]
    m = st["runs"][0]["metrics"]
    # the items that were evaluated, alone, make the metrics (shown for information)
    assert (m["accuracy"], m["error_ratio"], m["counts"]["items"]) == (1.0, 0.0, 30)
    assert st["runs"][0]["verdicts"] == {"MATCH": 30, "ERROR": 10}


def test_the_candidates_own_errors_still_count_against_it(env: Env) -> None:
    # A refused request (a prompt over the context window, say) is the candidate's doing:
    # it is an ERROR in its metrics and the candidate is judged on them.
    env.setup(thresholds=["accuracy>=0.9"])
    p = env.prompts.propose("p", GOOD, retry_policy=NO_RETRY)
    provider = _Failing(ErrorClass.CONTEXT_LENGTH_EXCEEDED, lambda text: "parcel" in text)
    assert drive(env, p.update_id, provider=provider) == "REJECTED"
    st = env.gate.status(p.update_id)
    m = st["runs"][0]["metrics"]
    assert (m["accuracy"], m["counts"]["error"], m["counts"]["not_evaluated"]) == \
        (0.75, 10, 0)
    assert st["reason"] == "p-set: accuracy 0.75 not >= 0.9"


def test_a_baseline_run_the_provider_failed_fails_the_evaluation(env: Env) -> None:
    # Non-inferiority: the live version's run (the baseline) is the one the provider
    # failed (its system prompt names no "money back"); the candidate's calls answer.
    env.setup(thresholds=["accuracy>=0.7"], non_inferiority=0.0)
    p = env.prompts.propose("p", GOOD, retry_policy=NO_RETRY)
    provider = _Failing(ErrorClass.SERVER_ERROR, lambda _t: True,
                        system=lambda text: "money back" not in text)
    assert drive(env, p.update_id, provider=provider) == "FAILED"
    st = env.gate.status(p.update_id)
    assert env.live() == 1
    assert "p-set (baseline): 40 of 40 items could not be evaluated: server_error 40" \
        in st["reason"]
    assert "p-set (candidate)" not in st["reason"]
    assert st["decision"]["datasets"][0]["reason"].startswith("baseline run: 40 of 40")


def test_workers_dying_with_the_tasks_fail_the_evaluation_not_the_candidate(
        env: Env, store: Store) -> None:
    # Workers killed while they held the evaluation's tasks: after three lost leases a
    # worker ends such a task DEAD (lease_expired) without calling it. Those items were
    # scored ERROR and the perfect candidate REJECTED; the kill -9 promise of the docs
    # (the decision an undisturbed evaluation gets) became a verdict against it.
    env.setup(thresholds=["accuracy>=0.9"])
    p = env.prompts.propose("p", GOOD, retry_policy=NO_RETRY)
    roles = env.roles()
    roles.start(p.update_id)
    roles.materialize(env.gate.gs.runs(p.update_id)[0])
    for _ in range(3):  # three workers die holding every task (claims left to expire)
        assert execute(store, crash=True) == 40
    run_worker(store, provider=LocalProvider())  # a healthy worker, gate roles included
    st = env.gate.status(p.update_id)
    assert (st["status"], env.live()) == ("FAILED", 1)
    assert "40 of 40 items could not be evaluated: lease_expired 40" in st["reason"]
    assert st["runs"][0]["tasks"] == {"DEAD": 40}
    assert _audit(env)[-1] == "failed"


@pytest.mark.parametrize("error", list(ErrorClass))
def test_every_error_class_is_either_the_candidates_or_not_evaluated(
        error: ErrorClass) -> None:
    from lockgate.gate.roles import CANDIDATE_ERRORS, unevaluated

    for status in ("FAILED", "DEAD"):
        text = f"task {status}: {error}: why"
        own = error in (ErrorClass.INVALID_OUTPUT, ErrorClass.CONTENT_FILTERED,
                        ErrorClass.INVALID_REQUEST, ErrorClass.CONTEXT_LENGTH_EXCEEDED,
                        ErrorClass.RENDER_ERROR)
        assert unevaluated(text) == (None if own else str(error)), text
        assert (error in CANDIDATE_ERRORS) == own
    # a task cancelled or deleted by hand, whatever its class: not evaluated
    assert unevaluated(f"task CANCELLED: {error}: why") == "cancelled"


def test_errors_that_name_no_class_are_classified_safely() -> None:
    from lockgate.gate.roles import unevaluated

    assert unevaluated("task missing (deleted?)") == "task_missing"
    assert unevaluated("task CANCELLED: ") == "cancelled"
    assert unevaluated("task FAILED: some message without a class") == "unclassified"
    assert unevaluated("scorer raised KeyError: 'label'") is None  # judged on the output
    assert unevaluated(None) is None


def test_the_decision_fails_on_items_not_evaluated_whatever_the_rest_says() -> None:
    settings = BindingSettings(thresholds=(parse_threshold("accuracy>=0.9"),))
    ds = [{"name": "d", "id": 1, "binding": settings.model_dump(mode="json")}]
    for rest in ("MATCH", "MISMATCH"):  # would activate / would reject
        samples = [Sample(rest)] * 30 + [Sample("ERROR", unevaluated="timeout")] * 7 + \
            [Sample("ERROR", unevaluated="server_error")] * 3
        m = compute(samples)
        assert (m["counts"]["items"], m["counts"]["not_evaluated"]) == (30, 10)
        assert m["not_evaluated"] == {"server_error": 3, "timeout": 7}
        d = decide(ds, [{"dataset_id": 1, "subject": "candidate", "status": "FINALIZED",
                         "metrics": m}], prompt="p", candidate=4)
        assert d.outcome == "fail"
        assert d.reason.startswith("evaluation could not complete: d (candidate): 10 of 40 "
                                   "items could not be evaluated: server_error 3, timeout 7")
        assert "`lockgate prompt propose p` with the same content (it re-uses version 4)" \
            in d.reason
    # every item evaluated: decided on its merits, as before
    m = compute([Sample("MATCH")] * 40)
    assert (m["counts"]["not_evaluated"], m["not_evaluated"]) == (0, {})
    assert decide(ds, [{"dataset_id": 1, "subject": "candidate", "status": "FINALIZED",
                        "metrics": m}]).outcome == "activate"
