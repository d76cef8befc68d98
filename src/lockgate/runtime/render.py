"""Rendering a task: normalise the input, fit it into the token budget, fill the
template, and record what is needed to replay the call byte for byte.

Per-template work (placeholder parsing, literal token counts, defaults) is compiled
once per config (cached by object identity, then by content), so rendering a short
input costs tens of microseconds.

Exact counting (tiktoken) is paid only where the budget needs it. A byte-level BPE
never makes more tokens than the text has UTF-8 bytes, so a prompt whose bytes (plus
the chat framing) are within ``max_input_tokens``, or that has no budget, cannot be over
it: its ``input_tokens`` is then the calibrated estimate, and ``Rendered.estimator``
says so. Only a prompt that might not fit is counted exactly, and the tokenizer's
encoding is loaded the first time one does.

Values are inserted as text: a string as it is (after normalisation), anything else as
compact JSON (``true``, not ``True``; NaN and infinities as ``NaN``/``Infinity``/
``-Infinity``, a Decimal as its digits). A placeholder inside a JSON string of the
template gets the JSON-escaped value, and is budgeted by that escaped text. A value
cannot close the input section: a closing delimiter inside a value, in any case and with
any spaces inside the tag (``</INPUT>``, ``< /input >``), is shown as ``‹/input›``, and
the opening one exactly as ``<input>`` as ``‹input›`` (code generics such as
``From<Input>`` or ``List<INPUT>`` stay as written).
Surrogate pairs (as some JSON decoders leave astral characters) are joined, nested ones
too, before normalisation; lone surrogates are replaced by ``?``. The condensation note
goes on the last user message, or without one on the last message that is not the
assistant's: an assistant message (an example, or the prefill the answer continues) is
never altered.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import orjson

from lockgate.errors import SpecError, TemplateError
from lockgate.runtime.normalize import normalize_text, normalize_value
from lockgate.runtime.template import (
    INPUT_CLOSE,
    INPUT_OPEN,
    CompiledTemplate,
    check_template,
    compile_template,
    placeholders,
)
from lockgate.runtime.tokens import (
    CALIBRATED,
    TOKENS_PER_MESSAGE,
    TOKENS_PER_REPLY,
    Estimator,
    get_estimator,
)
from lockgate.runtime.truncate import condense, hard_cut
from lockgate.spec import InputRule, TaskConfig, canonical_json, without_surrogates

__all__ = ["Rendered", "check_template", "placeholders", "render"]


@dataclass(frozen=True, slots=True)
class Rendered:
    """A rendered prompt and what is needed to replay it byte for byte.

    ``snapshot`` is the exact JSON of ``messages`` sent to the provider and ``sha256``
    its hash; ``template_sha256`` and ``input_sha256`` identify the inputs of the
    rendering. ``notes`` say what rendering did (``condensed:...``);
    ``alerts`` are events worth counting (``input_default:<name>``, ``over_budget``).
    """

    messages: list[dict[str, str]]
    snapshot: str
    sha256: str
    input_tokens: int
    estimator: str
    notes: tuple[str, ...] = ()
    alerts: tuple[str, ...] = ()
    template_sha256: str = ""
    input_sha256: str = ""
    condensed: bool = False


class _Exact:
    """The config's own token estimator and the template's fixed cost under it, made
    the first time a prompt might be over its budget (loading tiktoken's encoding takes
    a fifth of a second, which a worker whose prompts all fit never pays)."""

    __slots__ = ("_counted", "_literal", "_tokenizer")

    def __init__(self, tokenizer: str | None, literal: list[str]) -> None:
        self._tokenizer = tokenizer
        self._literal = literal
        self._counted: tuple[Estimator, int] | None = None

    def get(self) -> tuple[Estimator, int]:
        """``(estimator, fixed tokens)``: a race makes the same pair twice, harmlessly."""
        if self._counted is None:
            try:
                estimator = get_estimator(self._tokenizer)
            except SpecError:  # not available on this host: the trace names the one used
                estimator = get_estimator()
            self._counted = (estimator, _fixed(estimator, self._literal))
        return self._counted


def _fixed(estimator: Estimator, literal: list[str]) -> int:
    """Tokens of the template's literal parts and the chat framing."""
    return sum(estimator.count(t) for t in literal) + \
        TOKENS_PER_MESSAGE * len(literal) + TOKENS_PER_REPLY


@dataclass(frozen=True, slots=True)
class _Plan:
    template: CompiledTemplate
    rule: InputRule
    defaults: Mapping[str, tuple[Any, str]]
    exact: _Exact
    max_input_tokens: int | None
    #: the literal parts' UTF-8 bytes plus the chat framing: no byte-level BPE counts
    #: more tokens than this for them
    fixed_bytes: int
    #: the calibrated estimate of the literal parts and the framing
    fixed_estimate: int
    delimited: bool
    #: per placeholder: (uses as plain text, uses inside a JSON string)
    uses: Mapping[str, tuple[int, int]]
    #: placeholder uses: each joins a value to the literal text on both sides
    joins: int = 0


_MISSING: Any = object()
_SAFE_OPEN = "\u2039input\u203a"
_SAFE_CLOSE = "\u2039/input\u203a"
_NOTE = ("\n\n[Note: the input ({names}) was condensed to its key sentences, in their "
         "original order, to fit the token budget.]")


def _build_plan(config: TaskConfig) -> _Plan:
    template = compile_template(config.prompt_template)
    rule = config.delivery_rule
    defaults: dict[str, tuple[Any, str]] = {}
    for k, v in rule.fallback_values.items():
        defaults[k] = (v, "input_fallback")
    for k, v in rule.input_defaults.items():
        defaults[k] = (v, "input_default")
    literal = [t.literal for t in template.texts]
    fixed_bytes = sum(_utf8_len(t) for t in literal) + \
        TOKENS_PER_MESSAGE * len(literal) + TOKENS_PER_REPLY
    uses: dict[str, tuple[int, int]] = {}
    for t in template.texts:
        for name, quoted in zip(t.names, t.in_json_string, strict=True):
            plain, inside = uses.get(name, (0, 0))
            uses[name] = (plain, inside + 1) if quoted else (plain + 1, inside)
    return _Plan(
        template=template, rule=rule.normalize, defaults=defaults,
        exact=_Exact(config.model.tokenizer, literal),
        max_input_tokens=config.model.max_input_tokens, fixed_bytes=fixed_bytes,
        fixed_estimate=_fixed(CALIBRATED, literal),
        delimited=any(INPUT_OPEN in t or INPUT_CLOSE in t for t in literal), uses=uses,
        joins=sum(a + b for a, b in uses.values()),
    )


class _PlanCache:
    def __init__(self, size: int = 1024) -> None:
        self._by_id: dict[int, tuple[weakref.ReferenceType[Any], _Plan]] = {}
        self._by_content: dict[bytes, _Plan] = {}
        self._size = size
        self._lock = threading.Lock()

    def get(self, config: TaskConfig) -> _Plan:
        hit = self._by_id.get(id(config))
        if hit is not None and hit[0]() is config:
            return hit[1]
        key = canonical_json(config.model_dump(by_alias=True, exclude={"retry_policy"}))
        plan = self._by_content.get(key)
        if plan is None:
            plan = _build_plan(config)
        with self._lock:
            if len(self._by_content) >= self._size:
                self._by_content.clear()
            if len(self._by_id) >= self._size:
                self._by_id.clear()
            self._by_content[key] = plan
            self._by_id[id(config)] = (weakref.ref(config), plan)
        return plan


_plans = _PlanCache()


def _special(value: Any) -> bool:
    """Whether compact JSON would misrepresent ``value``: NaN and infinities (JSON has
    none; orjson writes ``null``) or a Decimal (orjson quotes it)."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, Decimal):
        return True
    if isinstance(value, Mapping):
        return any(_special(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_special(v) for v in value)
    return False


def _key_text(key: Any) -> str:
    if isinstance(key, str):
        return key
    return _as_text(key) if isinstance(key, bool | int | float | Decimal) or key is None \
        else str(key)


def _special_text(value: Any) -> str:
    """Compact JSON-like text with NaN/Infinity/-Infinity written as such and a Decimal
    as its plain digits (``1.10``), as a reader of the prompt expects."""
    if isinstance(value, Decimal):
        return format(value, "f") if value.is_finite() else str(value).replace("sNaN", "NaN")
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{_json_text(_key_text(k))}:{_special_text(v)}"
                              for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(_special_text(v) for v in value) + "]"
    return _as_text(value) if not isinstance(value, str) else _json_text(value)


def _json_text(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


class _Noted:
    """The ``default`` hook of orjson: a Decimal (which orjson would quote) is noted."""

    __slots__ = ("decimal",)

    def __init__(self) -> None:
        self.decimal = False

    def __call__(self, value: Any) -> str:
        if isinstance(value, Decimal):
            self.decimal = True
        return str(value)


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    # orjson first (the common case costs nothing more): only a noted Decimal, or a
    # ``null`` that may stand for NaN or an infinity, calls for the special text.
    noted = _Noted()
    try:
        text = orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS, default=noted).decode()
    except TypeError:  # integers beyond 64 bits, and the like
        if _special(value):
            return _special_text(value)
        return json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"))
    if noted.decimal or ("null" in text and _special(value)):
        return _special_text(value)
    return text


def _input_digest(input_data: Mapping[str, Any]) -> str:
    try:
        doc = orjson.dumps(input_data, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS,
                           default=str)
    except TypeError:
        doc = json.dumps(input_data, ensure_ascii=False, default=str, sort_keys=True,
                         separators=(",", ":")).encode(errors="replace")
    return hashlib.sha256(doc).hexdigest()


def _json_escaped(text: str) -> str:
    return orjson.dumps(text).decode()[1:-1]


#: The closing delimiter in any case and with any spacing inside the tag; the opening
#: one only as written (``Promise<Input>`` is code, and cannot end the section).
_DELIMITER = re.compile(r"<\s*(/)\s*(?i:input)\s*>|<input>")


def _guard(text: str) -> str:
    if ">" in text:
        text = _DELIMITER.sub(lambda m: _SAFE_CLOSE if m.group(1) else _SAFE_OPEN, text)
    return text


def _sendable(text: str) -> str:
    """``text`` with surrogate pairs joined (some JSON decoders leave an astral
    character as two surrogates) and lone surrogates, which cannot be sent or hashed,
    replaced by ``?``."""
    return text if text.isascii() else without_surrogates(text)


def _normalised(value: Any, rule: InputRule) -> Any:
    """:func:`normalize_value` with every string made sendable first, so a surrogate
    pair nested in a mapping or list is joined before the emoji step sees it, as at
    the top level (mapping keys are left alone, as there)."""
    if isinstance(value, str):
        return normalize_text(_sendable(value), rule)
    if isinstance(value, Mapping):
        return {k: _normalised(v, rule) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normalised(v, rule) for v in value]
    return normalize_value(value, rule)


def _resolve(plan: _Plan, input_data: Mapping[str, Any],
             alerts: list[str]) -> tuple[dict[str, str], set[str]]:
    """Normalised text per placeholder, and which of them are free text (condensable)."""
    values: dict[str, str] = {}
    prose: set[str] = set()
    rule = plan.rule
    for name in plan.template.names:
        value = input_data.get(name, _MISSING)
        # A string is normalised first, so blank is judged on the text sent: one that is
        # only a zero-width space, a BOM or a removed emoji takes its default too.
        normalised = isinstance(value, str)
        if normalised:
            value = normalize_text(_sendable(value), rule)
        if value is _MISSING or value is None or (isinstance(value, str) and not value.strip()):
            default = plan.defaults.get(name)
            if default is not None:
                value = default[0]
                normalised = False
                alerts.append(f"{default[1]}:{name}")
            elif value is _MISSING:
                raise TemplateError(
                    f"placeholder '{{{name}}}' has no value and no default; add it to "
                    "input_data or delivery_rule.input_defaults", field="input_data")
            else:
                alerts.append(f"empty_input:{name}")
                value = ""
        if isinstance(value, str):
            prose.add(name)
        text = _sendable(_as_text(value if normalised else _normalised(value, rule)))
        values[name] = _guard(text) if plan.delimited else text
    return values, prose


def _insertions(plan: _Plan, values: Mapping[str, str]) -> dict[str, str]:
    """The JSON-escaped form of each value used inside a JSON string."""
    return {n: _json_escaped(values[n]) for n, (_p, inside) in plan.uses.items() if inside}


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode(errors="surrogatepass"))


def _byte_cost(plan: _Plan, plain: Mapping[str, str], escaped: Mapping[str, str]) -> int:
    """UTF-8 bytes the placeholders add to the prompt: a bound on their BPE tokens."""
    total = 0
    for name, (n_plain, n_inside) in plan.uses.items():
        if n_plain:
            total += n_plain * _utf8_len(plain[name])
        if n_inside:
            total += n_inside * _utf8_len(escaped[name])
    return total


def _cost(count: Callable[[str], int], plan: _Plan, plain: Mapping[str, str],
          escaped: Mapping[str, str]) -> dict[str, int]:
    """Tokens each placeholder adds to the prompt, over all its occurrences."""
    costs: dict[str, int] = {}
    for name, (n_plain, n_inside) in plan.uses.items():
        cost = n_plain * count(plain[name]) if n_plain else 0
        if n_inside:
            cost += n_inside * count(escaped[name])
        costs[name] = cost
    return costs


def _water_fill(costs: Mapping[str, int], available: int) -> dict[str, int]:
    """Caps so that the largest values shrink first and small ones stay whole."""
    caps: dict[str, int] = {}
    remaining = available
    pending = sorted(costs, key=lambda n: costs[n])
    while pending:
        share = remaining // len(pending)
        name = pending[0]
        if costs[name] <= share:
            caps[name] = costs[name]
            remaining -= costs[name]
            pending.pop(0)
        else:
            for n in pending:
                caps[n] = max(0, share)
            break
    return caps


def _fit(plan: _Plan, values: dict[str, str], prose: set[str], costs: dict[str, int],
         notes: list[str], alerts: list[str], limit: int
         ) -> tuple[dict[str, str], dict[str, str], int, bool]:
    """Condense free-text values until the prompt fits ``limit`` tokens; the last item
    says whether the condensation note fits too (it is left out, not the budget
    broken, when only the template and the values fit).

    A value is measured as it is inserted: a placeholder inside a JSON string costs its
    escaped text (quotes, backslashes and newlines escaped cost more), once per use."""
    estimator, fixed_tokens = plan.exact.get()
    count = estimator.count
    shrinkable = {n: c for n, c in costs.items() if n in prose}
    note = _NOTE.format(names=", ".join(sorted(shrinkable)))
    slack = sum(plan.template.occurrences.values())  # one token per join, at the seams
    note_tokens = count(note)
    fixed = fixed_tokens + slack + sum(c for n, c in costs.items() if n not in prose)
    with_note = limit - fixed - note_tokens > 0
    available = limit - fixed - (note_tokens if with_note else 0)
    if available <= 0 or not shrinkable:
        alerts.append("over_budget")
        return values, _insertions(plan, values), fixed_tokens + sum(costs.values()), False

    def inserted_cost(name: str) -> Callable[[str], int]:
        n_plain, n_inside = plan.uses[name]
        if not n_inside:
            return count if n_plain == 1 else (lambda t: n_plain * count(t))
        return lambda t: (n_plain * count(t) if n_plain else 0) + \
            n_inside * count(_json_escaped(t))

    measure = {n: inserted_cost(n) for n in shrinkable}
    caps = _water_fill(shrinkable, available)
    out = dict(values)
    condensed_names: list[str] = []
    for _attempt in range(4):
        for name, cap in caps.items():
            if shrinkable[name] <= cap and out[name] == values[name]:
                continue
            result = condense(values[name], cap, measure[name])
            if result.condensed or result.text != values[name]:
                out[name] = result.text
                if name not in condensed_names:
                    condensed_names.append(name)
                    notes.append(f"condensed:{name}:{result.kept}/{result.total} {result.unit}")
        escaped = _insertions(plan, out)
        new_costs = _cost(count, plan, out, escaped)
        over = sum(new_costs[n] for n in shrinkable) - available
        if over <= 0:
            break
        # Joins cost more than counted: take it from the largest.
        largest = max(shrinkable, key=lambda n: new_costs[n])
        caps[largest] = max(0, new_costs[largest] - over - plan.template.occurrences[largest])
    else:
        for name in shrinkable:  # last resort: a hard cut at a safe boundary
            out[name] = hard_cut(out[name], caps[name], measure[name])
        escaped = _insertions(plan, out)
        new_costs = _cost(count, plan, out, escaped)
        if sum(new_costs[n] for n in shrinkable) > available:
            alerts.append("over_budget")
    total = fixed_tokens + sum(new_costs.values())
    if condensed_names and with_note:
        total += note_tokens
    return out, escaped, total, with_note


def _assemble(plan: _Plan, plain: Mapping[str, str], escaped: Mapping[str, str],
              notes: list[str], with_note: bool) -> list[dict[str, str]]:
    messages: list[dict[str, str]] = []
    for role, text in zip(plan.template.roles, plan.template.texts, strict=True):
        parts = text.parts
        buf = [parts[0]]
        for i, name in enumerate(text.names):
            buf.append(escaped[name] if text.in_json_string[i] else plain[name])
            buf.append(parts[i + 1])
        messages.append({"role": role, "content": "".join(buf)})
    if with_note and any(n.startswith("condensed:") for n in notes):
        names = sorted({n.split(":")[1] for n in notes if n.startswith("condensed:")})
        # On the last user message, or without one the last message that is not the
        # assistant's (the system message): an assistant message is an example or a
        # prefill of the answer, never to be altered.
        last = next((i for i in range(len(messages) - 1, -1, -1)
                     if messages[i]["role"] == "user"), None)
        if last is None:
            last = next((i for i in range(len(messages) - 1, -1, -1)
                         if messages[i]["role"] != "assistant"), None)
        if last is not None:
            messages[last]["content"] += _NOTE.format(names=", ".join(names))
    return messages


def _sent_tokens(estimator: Estimator, messages: list[dict[str, str]]) -> int:
    return sum(estimator.count(m["content"]) for m in messages) + \
        TOKENS_PER_MESSAGE * len(messages) + TOKENS_PER_REPLY


def render(config: TaskConfig, input_data: Mapping[str, Any]) -> Rendered:
    """Render a task's template with its input into chat messages."""
    plan = _plans.get(config)
    alerts: list[str] = []
    notes: list[str] = []
    values, prose = _resolve(plan, input_data, alerts)
    plain, escaped = values, _insertions(plan, values)
    limit = plan.max_input_tokens
    with_note = True
    bound = plan.fixed_bytes + _byte_cost(plan, plain, escaped)
    if limit is None or bound <= limit:
        estimator = CALIBRATED  # it cannot be over: an estimate is all the trace needs
        tokens = min(bound, plan.fixed_estimate + sum(
            _cost(CALIBRATED.count, plan, plain, escaped).values()))
    else:
        estimator, fixed_tokens = plan.exact.get()
        costs = _cost(estimator.count, plan, plain, escaped)
        tokens = fixed_tokens + sum(costs.values())
        if tokens <= limit:
            # Parts counted apart can count a token more or less where they join: a
            # prompt within that many of the limit is counted as sent (counting it all
            # again would double the exact path's cost for every prompt).
            messages = _assemble(plan, plain, escaped, notes, with_note)
            if tokens > limit - 2 * plan.joins:
                tokens = _sent_tokens(estimator, messages)
            if tokens <= limit:
                return _rendered(plan, input_data, messages, tokens, estimator, notes,
                                 alerts, False)
        if tokens > limit:
            # Fit, then count what is sent: where tokens merge across the seams, or a
            # hard cut still does not fit, fit again to a budget lowered by the excess;
            # a prompt that still does not fit says so (over_budget).
            target = limit
            for _attempt in range(3):
                notes, alerts_fit = [], list(alerts)
                plain, escaped, tokens, with_note = _fit(plan, values, prose, costs, notes,
                                                         alerts_fit, target)
                messages = _assemble(plan, plain, escaped, notes, with_note)
                tokens = _sent_tokens(estimator, messages)
                if tokens <= limit or "over_budget" in alerts_fit:
                    break
                target -= tokens - limit
            alerts = alerts_fit
            if tokens > limit and "over_budget" not in alerts:
                alerts.append("over_budget")
            condensed = any(n.startswith("condensed:") for n in notes)
            return _rendered(plan, input_data, messages, tokens, estimator, notes, alerts,
                             condensed)
    messages = _assemble(plan, plain, escaped, notes, with_note)
    condensed = any(n.startswith("condensed:") for n in notes)
    return _rendered(plan, input_data, messages, tokens, estimator, notes, alerts, condensed)


def _rendered(plan: _Plan, input_data: Mapping[str, Any], messages: list[dict[str, str]],
              tokens: int, estimator: Estimator, notes: list[str], alerts: list[str],
              condensed: bool) -> Rendered:
    snapshot = orjson.dumps(messages)
    return Rendered(
        messages=messages,
        snapshot=snapshot.decode(),
        sha256=hashlib.sha256(snapshot).hexdigest(),
        input_tokens=tokens,
        estimator=estimator.name,
        notes=tuple(notes),
        alerts=tuple(alerts),
        template_sha256=plan.template.sha256,
        input_sha256=_input_digest(input_data),
        condensed=condensed,
    )
