"""What an evaluation freezes, and the runs it turns into (pure).

The snapshot is written once, when a candidate is proposed, as canonical JSON on the
``prompt_update`` row with its SHA-256 (``snapshot_hash``): the candidate's and the
base version's full content and content hashes, the base generation, each bound
dataset's revision with its item count and items hash, each binding's settings, the
retry policy, and the execution path (lockgate version + a hash of the runtime
settings that shape a call). Datasets, bindings and versions may change afterwards;
a running evaluation only ever reads its snapshot.
"""

from __future__ import annotations

from typing import Any

from lockgate.store.gate import RunPlan


def task_config(version: dict[str, Any], retry_policy: dict[str, Any],
                ref: str) -> dict[str, Any]:
    """The task config an evaluation item of ``version`` runs under: the version's
    template, model config and delivery rule, plus ``prompt_version`` for the trace."""
    return {"prompt_template": version["template"], "model_config": version["model_config"],
            "delivery_rule": version["delivery_rule"], "retry_policy": retry_policy,
            "prompt_version": ref}


def run_plans(snapshot: dict[str, Any]) -> list[RunPlan]:
    """One candidate run per bound dataset, plus a baseline run (the live version on the
    same snapshot) where the binding asks for non-inferiority."""
    name = snapshot["prompt"]
    cand = snapshot["candidate"]
    base = snapshot.get("base")
    plans = []
    for ds in snapshot["datasets"]:
        subjects = [("candidate", cand)]
        if base is not None and ds["binding"].get("non_inferiority"):
            subjects.append(("baseline", base))
        for subject, version in subjects:
            plans.append(RunPlan(
                dataset_id=int(ds["id"]), dataset_name=ds["name"], subject=subject,
                prompt_version=int(version["version"]),
                config_document=task_config(version, snapshot["retry_policy"],
                                            f"{name}@{version['version']}"),
                expected_items=int(ds["items"])))
    return plans
