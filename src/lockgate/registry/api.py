"""The Python API of the prompt registry and datasets: ``lg.prompts`` and ``lg.datasets``.

Example::

    lg = lockgate.connect()
    lg.prompts.create("complaints", read_template("prompt_v1.txt"),
                      model_config={"name": "gpt-4o-mini", "temperature": 0.2})
    lg.datasets.add("regular", "regular.jsonl")
    lg.gate.bind("complaints", "regular", thresholds=["accuracy>=0.95"],
                 comparison="fields:category,emotion")
    p = lg.prompts.propose("complaints", read_template("prompt_v2.txt"))
    print(lg.gate.wait(p.update_id)["status"])      # with workers running
    lg.prompts.rollback("complaints", reason="bad labels in prod")
    lg.prompts.start_experiment("complaints", 3, share="5%", duration="72h")  # A/B test
    lg.prompts.conclude_experiment("complaints")    # promote only if the rule holds
"""

from __future__ import annotations

import builtins
import getpass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from lockgate.config import Settings
from lockgate.durations import parse_duration
from lockgate.errors import LockgateError, NotFound, SpecError, StateConflict
from lockgate.registry.callpath import execution_path
from lockgate.registry.content import diff, make_content, render_text
from lockgate.registry.datasets import check_key, item_from, read_items
from lockgate.registry.experiments import (
    DEFAULT_FOR,
    DEFAULT_SHARE,
    MIN_GAIN,
    MIN_TASKS,
    Judge,
    check_rule,
    parse_share,
    split_state,
)
from lockgate.registry.refs import (
    PRODUCTION,
    check_name,
    check_new_label,
    check_tag,
    parse_ref,
    reads_as_version,
)
from lockgate.runtime import placeholders
from lockgate.spec import Message, RetryPolicy, retry_policy_error
from lockgate.store import Store
from lockgate.store.experiments import ExperimentStatus, ExperimentStore, control_moved
from lockgate.store.gate import GateStore, Proposal
from lockgate.store.registry import DatasetItem, RegistryStore, VersionRow


def default_actor() -> str | None:
    """Who is acting, for the audit trail (the login name)."""
    try:
        return getpass.getuser()
    except Exception:  # no login name in some containers
        return None


class Prompts:
    """Prompts and their immutable versions, labels, rollback and audit trail."""

    def __init__(self, store: Store, settings: Settings, *,
                 judge: Judge | None = None) -> None:
        self.registry = RegistryStore(store)
        self.gates = GateStore(store)
        self.experiments_store = ExperimentStore(store)
        self.settings = settings
        #: The quality loop's figures and verdict of an A/B test (a layer above this
        #: one: :mod:`lockgate.app` wires it in).
        self.judge = judge

    def create(self, name: str, template: Any, *, model_config: dict[str, Any],
               delivery_rule: dict[str, Any] | None = None, tag: str | None = None,
               author: str | None = None, note: str | None = None,
               description: str | None = None) -> VersionRow:
        """A new prompt; its version 1 is live at once (the first version has nothing to
        be compared against). Every later change goes through :meth:`propose`."""
        check_name(name)
        check_tag(tag)
        content = make_content(template, model_config, delivery_rule,
                               model_modules=self.settings.runtime.model_modules)
        return self.registry.create_prompt(name, content, tag=tag,
                                           author=author or default_actor(), note=note,
                                           description=description)

    def propose(self, name: str, template: Any = None, *,
                model_config: dict[str, Any] | None = None,
                delivery_rule: dict[str, Any] | None = None, tag: str | None = None,
                author: str | None = None, note: str | None = None,
                retry_policy: dict[str, Any] | None = None) -> Proposal:
        """Submit a candidate to the release gate; returns at once with the tracking id
        (``update_id``). Parts not given are the live version's. Evaluation runs in the
        workers; a newer proposal for the same prompt cancels this one."""
        check_tag(tag)
        live = self.version(name)
        content = make_content(live.template if template is None else template,
                               live.model_config if model_config is None else model_config,
                               live.delivery_rule if delivery_rule is None else delivery_rule,
                               model_modules=self.settings.runtime.model_modules)
        try:
            policy = RetryPolicy.model_validate(retry_policy or {}).model_dump(mode="json")
        except ValidationError as exc:
            raise retry_policy_error(exc) from None
        self._check_inputs(name, content.template,
                           set(content.delivery_rule.get("input_defaults") or {}))
        return self.gates.propose(name, content, tag=tag, author=author or default_actor(),
                                  note=note, retry_policy=policy,
                                  execution_path=execution_path(self.settings))

    def _check_inputs(self, name: str, template: Any, defaults: set[str]) -> None:
        """Refuse a template whose placeholders a bound dataset cannot fill."""
        tpl = template if isinstance(template, str) else tuple(
            Message.model_validate(m) for m in template)
        wanted = placeholders(tpl) - defaults
        for b in self.gates.bindings(name):
            missing = sorted(wanted - set(b["input_keys"]))
            if missing and b["items"]:
                raise SpecError(f"placeholder(s) {missing} have no value in dataset "
                                f"'{b['dataset']}' (its input fields: {b['input_keys']})",
                                field="template")

    def version(self, name: str, selector: int | str | None = None) -> VersionRow:
        """A version by number (3, "3", "v3"), tag, label, or the live one (None)."""
        if selector is None or selector == PRODUCTION:
            live = self.registry.prompt(name)["live_version"]
            if live is None:
                raise NotFound(f"prompt '{name}' has no live version")
            return self.registry.version(name, int(live))
        if isinstance(selector, int):
            return self.registry.version(name, selector)
        text = selector.strip()
        if reads_as_version(text):
            return self.registry.version(name, int(text.lstrip("vV")))
        labels = self.registry.prompt(name)["labels"]
        if text in labels:
            return self.registry.version(name, labels[text])
        try:
            return self.registry.version_by_tag(name, text)
        except NotFound:
            raise NotFound(f"prompt '{name}' has no label or tag '{text}' "
                           f"({_labels_of(labels)}; `lockgate prompt history {name}` "
                           "lists the versions and their tags)") from None

    def resolve(self, ref: str) -> VersionRow:
        """What a reference (``NAME``, ``NAME@canary``, ``NAME@3``) names now. After
        ``@`` comes a version number or a label, never a tag: a worker follows labels
        only (:mod:`.resolver`), so a reference is checked the way it will run."""
        r = parse_ref(ref)
        if r.pointer is None:
            return self.version(r.name, r.version)
        labels = self.registry.prompt(r.name)["labels"]
        if r.pointer in labels:
            return self.registry.version(r.name, labels[r.pointer])
        try:
            tagged = self.registry.version_by_tag(r.name, r.pointer)
        except NotFound:
            hint = f"`lockgate prompt label {r.name} {r.pointer} VERSION` sets it"
        else:
            hint = (f"'{r.pointer}' is the tag of version {tagged.version}: pin it as "
                    f"{r.name}@{tagged.version}")
        raise NotFound(f"prompt '{r.name}' has no label '{r.pointer}' "
                       f"({_labels_of(labels)}); {hint}")

    def show(self, name: str, selector: int | str | None = None) -> dict[str, Any]:
        """The prompt (live version, generation, labels) and one version's content."""
        info = self.registry.prompt(name)
        v = self.version(name, selector)
        info["version"] = v
        info["text"] = "\n".join(render_text(v.template, v.model_config, v.delivery_rule))
        return info

    def list(self) -> list[dict[str, Any]]:
        """Every prompt with its live version."""
        return self.registry.prompts()

    def history(self, name: str) -> dict[str, Any]:
        """Every version, and the audit trail (its actions: create, propose, activate,
        rejected, failed, stale, cancel, rollback, label, and an A/B test's experiment,
        promote, experiment-keep, experiment-stop; who, when, from, to, why)."""
        return {"prompt": self.registry.prompt(name), "versions": self.registry.versions(name),
                "audit": self.registry.audit_trail(name)}

    def diff(self, name: str, a: int | str, b: int | str | None = None) -> str:
        """Unified diff between two versions (``b`` defaults to the live one)."""
        va, vb = self.version(name, a), self.version(name, b)
        return diff((f"{va.ref}", va.template, va.model_config, va.delivery_rule),
                    (f"{vb.ref}", vb.template, vb.model_config, vb.delivery_rule))

    def rollback(self, name: str, to: int | str | None = None, *, actor: str | None = None,
                 reason: str | None = None) -> dict[str, Any]:
        """Compare-and-swap the live version back to one that was live before (default:
        the one before the last change). No re-evaluation; audited; workers use it
        within their refresh interval (1 s by default)."""
        target = None if to is None else self.version(name, to).version
        return self.registry.rollback(name, target, actor=actor or default_actor(),
                                      reason=reason)

    def label(self, name: str, label: str, version: int | str, *, actor: str | None = None,
              reason: str | None = None) -> int | None:
        """Point a custom label (``canary``, …) at a version; returns the previous one."""
        check_new_label(label)
        v = self.version(name, version)
        return self.registry.set_label(name, label, v.version, actor=actor or default_actor(),
                                       reason=reason)

    # -- A/B tests (docs/quality.md "A/B tests") -------------------------------------------

    def start_experiment(self, name: str, version: int | str, *,
                         share: str | float = DEFAULT_SHARE,
                         duration: str | float = DEFAULT_FOR, actor: str | None = None,
                         reason: str | None = None) -> dict[str, Any]:
        """Give a version (number, ``v3``, tag or label) ``share`` of the traffic that
        follows the live version (``5%`` or ``0.05``, at most 50 %) for ``duration``
        (default 72 h); the live version is the control. Audited; workers split within
        their refresh interval."""
        share_bp = parse_share(share)
        seconds = parse_duration(duration, field="for", allow_zero=False)
        v = self.version(name, version)
        return self._with_split(self.experiments_store.start(
            name, v.version, share_bp, round(seconds * 1000), actor=actor or default_actor(),
            reason=reason))

    def experiment_status(self, name: str, *, min_gain: float = MIN_GAIN,
                          min_tasks: int = MIN_TASKS) -> dict[str, Any]:
        """The prompt's newest A/B test with, per arm, its figures since it started and
        the verdict the rule gives now (an ended one: as recorded when it ended), and
        whether workers split the traffic for it now (``splitting``; if not, why:
        ``split_reason``): a running test stops splitting once its time is up or the
        live version is no longer its control."""
        check_rule(min_gain, min_tasks)
        e = self._with_split(self.experiments_store.latest(name))
        if e["status"] == ExperimentStatus.RUNNING or not e["decision"]:
            e["decision"] = self._judge()(e, min_gain, min_tasks)
        return e

    def conclude_experiment(self, name: str, *, min_gain: float = MIN_GAIN,
                            min_tasks: int = MIN_TASKS, stop: bool = False,
                            actor: str | None = None,
                            reason: str | None = None) -> dict[str, Any]:
        """Apply the promotion rule to the running A/B test: PROMOTED (the live pointer
        moves to the candidate, generation + 1, audited: ``rollback`` undoes it) or KEPT
        (the live version stays). Once the live version is no longer the control it
        refuses (the comparison no longer holds), unless ``stop``. With too few tasks
        in an arm it refuses, naming the counts, unless ``stop`` (then STOPPED). The
        figures and verdict are stored."""
        check_rule(min_gain, min_tasks)
        e = self._with_split(self.experiments_store.running(name))
        moved = e["live_version"] != e["control_version"]
        if moved and not stop:  # before the counts: no wait would make it decidable
            raise StateConflict(f"A/B test of '{name}' not concluded: "
                                + control_moved(name, e["live_version"],
                                                int(e["control_version"])))
        decision = self._judge()(e, min_gain, min_tasks)
        status = {"promote": ExperimentStatus.PROMOTED,
                  "keep": ExperimentStatus.KEPT}.get(decision["verdict"])
        if moved:  # stopped: the arms no longer compare a change against what is live
            decision = {**decision, "verdict": "undecided",
                        "why": f"the live version is v{e['live_version']}, not the control "
                               f"v{e['control_version']}"}
            status = ExperimentStatus.STOPPED
        elif status is None:
            if not stop:
                wait = ("let it run longer, " if e["splitting"] else
                        "its time (--for) is up, so no more tasks reach the candidate: ")
                raise StateConflict(f"A/B test of '{name}' not concluded: {decision['why']}; "
                                    f"{wait}lower --min-tasks, or end it undecided with "
                                    "--stop")
            status = ExperimentStatus.STOPPED
        return self._with_split(self.experiments_store.end(
            name, int(e["id"]), status, decision, actor=actor or default_actor(),
            reason=reason or decision["why"]))

    def stop_experiment(self, name: str, *, actor: str | None = None,
                        reason: str | None = None) -> dict[str, Any]:
        """End the running A/B test without a decision (STOPPED); live stays."""
        e = self.experiments_store.running(name)
        return self._with_split(self.experiments_store.end(
            name, int(e["id"]), ExperimentStatus.STOPPED, {}, actor=actor or default_actor(),
            reason=reason))

    def experiments(self, name: str | None = None) -> builtins.list[dict[str, Any]]:
        """Every A/B test (of one prompt), by prompt and age, each with ``splitting``
        and ``split_reason`` as :meth:`experiment_status` gives them."""
        rows = self.experiments_store.list(name)
        now = self.experiments_store.now() if rows else 0
        return [self._with_split(e, now) for e in rows]

    def _with_split(self, e: dict[str, Any], now: int | None = None) -> dict[str, Any]:
        """``e`` with ``splitting`` and ``split_reason`` (see :func:`split_state`) at
        ``now`` (default: the database's clock now, read for a running test only)."""
        if now is None:
            running = e["status"] == ExperimentStatus.RUNNING
            now = self.experiments_store.now() if running else int(e["concluded_at"] or 0)
        e["splitting"], e["split_reason"] = split_state(e, now)
        return e

    def _judge(self) -> Judge:
        if self.judge is None:
            raise LockgateError("an A/B test's figures come from the quality rollups: "
                                "open the database with lockgate.connect()")
        return self.judge


def _labels_of(labels: dict[str, int]) -> str:
    """The labels a prompt has, for a message about one it lacks."""
    return "its labels: " + ", ".join(sorted(labels)) if labels else "it has no labels"


def _given(item: DatasetItem, place: int) -> DatasetItem:
    """A :class:`DatasetItem` built in Python, its id checked as a file's would be."""
    if not item.derived_key:
        check_key(item.key, item.line if item.line is not None else place)
    return item


class Datasets:
    """Labelled datasets: items are immutable; every change is a new revision."""

    def __init__(self, store: Store) -> None:
        self.registry = RegistryStore(store)

    def add(self, name: str, source: str | Path | list[DatasetItem] | list[dict[str, Any]], *,
            replace: bool = False, expected_column: str | None = None,
            description: str | None = None) -> dict[str, Any]:
        """Add items from a JSONL/CSV file or a list; ``replace`` makes the dataset hold
        exactly these items. Returns counts (added, changed, retired, unchanged) and
        ``ignored_keys``: keys beside ``input`` that were not stored, with the number of
        items that had each."""
        check_name(name, "dataset")
        if isinstance(source, str | Path):
            items = read_items(source, expected_column=expected_column)
            origin: str | None = str(source)
        else:
            items = [_given(i, n) if isinstance(i, DatasetItem) else item_from(i, n)
                     for n, i in enumerate(source, start=1)]
            origin = None
        report = self.registry.add_items(name, items, replace=replace, source=origin,
                                         description=description)
        ignored: dict[str, int] = {}
        for item in items:
            for k in item.ignored:
                ignored[k] = ignored.get(k, 0) + 1
        report["ignored_keys"] = ignored
        return report

    def show(self, name: str, *, limit: int = 5) -> dict[str, Any]:
        """The dataset (revision, size, items hash, input fields) and its first items."""
        info = self.registry.dataset(name)
        info["sample"] = self.registry.items(name, limit=limit)
        return info

    def items(self, name: str, *, revision: int | None = None) -> list[dict[str, Any]]:
        """Every item of a revision (default: the current one)."""
        return self.registry.items(name, revision=revision)

    def list(self) -> list[dict[str, Any]]:
        """Every dataset with its revision and size."""
        return self.registry.datasets()
