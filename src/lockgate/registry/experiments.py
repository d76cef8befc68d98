"""A/B tests of prompt versions: the share a candidate takes and which tasks take it
(pure; docs/quality.md "A/B tests").

A task is in the candidate's arm when the first 8 bytes of SHA-256 over (experiment id,
task id), read as an integer, fall under ``share * 2**64``: a stable choice, so a task's
retries (and its re-reads when a call waits for admission) keep its arm, and the arms
of two experiments are drawn independently. The comparison is integer arithmetic on
the share in basis points, so the split is exact on every machine.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable
from typing import Any

from lockgate.errors import SpecError
from lockgate.store.experiments import ExperimentStatus, control_moved

#: The largest share a candidate may take (50 %): beyond it the "candidate" would be
#: the main path, which is a release (``prompt propose``), not a test.
MAX_SHARE_BP = 5_000
#: The default length of a test (SPEC F3: 5 % for 72 h).
DEFAULT_FOR = "72h"
DEFAULT_SHARE = "5%"
#: Promotion rule defaults: completeness must rise by 2 share points (0.02, absolute),
#: with at least 100 finished tasks in each arm.
MIN_GAIN = 0.02
MIN_TASKS = 100

_SHARE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*(%?)\s*$")
_HASH_SPACE = 2 ** 64

#: What ``lg.prompts`` asks the quality loop for an experiment's figures and verdict
#: (:func:`lockgate.quality.experiments.judge`, wired by :mod:`lockgate.app`): the
#: experiment row, min_gain, min_tasks -> figures per arm and the verdict.
Judge = Callable[[dict[str, Any], float, int], dict[str, Any]]


def parse_share(value: str | float) -> int:
    """A share as basis points: ``5%``, ``0.5%`` or a fraction ``0.05``; SpecError
    naming ``share`` for anything outside 0 < share <= 50 % or finer than 0.01 %."""
    if isinstance(value, bool):
        raise SpecError(f"{value!r} is not a share; write e.g. 5% or 0.05", field="share")
    if isinstance(value, int | float):
        fraction = float(value)
    else:
        m = _SHARE.match(value)
        if m is None:
            raise SpecError(f"{value!r} is not a share; write a percentage (5%) or a "
                            "fraction (0.05)", field="share")
        fraction = float(m[1]) / (100 if m[2] else 1)
    bp = fraction * 10_000
    if not math.isfinite(bp) or bp <= 0 or bp > MAX_SHARE_BP:
        raise SpecError(f"{value!r}: the candidate's share must be above 0 and at most "
                        "50% (0.5) of the traffic; a larger share is a release: "
                        "`lockgate prompt propose`", field="share")
    if abs(bp - round(bp)) > 1e-6:
        raise SpecError(f"{value!r}: a share is kept to 0.01% (a basis point); write e.g. "
                        f"{round(bp) / 100:g}%", field="share")
    return round(bp)


def share_text(share_bp: int) -> str:
    """Basis points as a percentage: 500 -> ``5%``, 25 -> ``0.25%``."""
    return f"{share_bp / 100:g}%"


def in_candidate_arm(experiment_id: int, task_id: str, share_bp: int) -> bool:
    """Whether the task runs the candidate (see the module docstring)."""
    digest = hashlib.sha256(f"{experiment_id}:{task_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") * 10_000 < share_bp * _HASH_SPACE


def split_state(experiment: dict[str, Any], now_ms: int) -> tuple[bool, str | None]:
    """Whether workers split the traffic for ``experiment`` (a row with its prompt's
    ``live_version``) at ``now_ms`` on the database's clock, and if not, why: it ended,
    the live version is no longer the control, or its time (``--for``) is up."""
    name, control = experiment["prompt"], int(experiment["control_version"])
    if experiment["status"] != ExperimentStatus.RUNNING:
        return False, f"it ended {experiment['status']}"
    if experiment["live_version"] != control:
        return False, control_moved(name, experiment["live_version"], control)
    if now_ms >= experiment["ends_at"]:
        return False, (f"its time (--for) is up: every task runs the control v{control} "
                       f"again, so no more tasks reach the candidate; conclude it "
                       f"(`lockgate prompt experiment conclude {name}`) or stop it")
    return True, None


def check_rule(min_gain: float, min_tasks: int) -> None:
    """SpecError for promotion-rule parameters that cannot mean anything."""
    if not math.isfinite(min_gain) or not 0 <= min_gain < 1:
        raise SpecError(f"--min-gain {min_gain!r}: the rise in completeness the candidate "
                        "needs, in share points (0.02 = 2 points), from 0 to below 1",
                        field="min_gain")
    if min_tasks < 1:
        raise SpecError(f"--min-tasks {min_tasks!r}: each arm needs at least 1 finished "
                        "task to be compared", field="min_tasks")
