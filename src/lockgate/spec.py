"""The task spec: the six required meta-fields of a task as pydantic models.

A task line is ``{"task_id", "prompt_template", "input_data", "model_config",
"delivery_rule", "retry_policy"}`` plus the optional ``batch_id``, ``priority`` and
``metadata``. :func:`parse_task` turns a mapping into a :class:`TaskSpec` or raises a
:class:`~lockgate.errors.SpecError` that names the offending field.

The three configuration parts (template, model config, delivery rule, retry policy)
are content-addressed by :meth:`TaskSpec.config_hash`, so many tasks that share them
store them once.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import random
import re
from typing import Annotated, Any, Literal

import orjson
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    field_validator,
)
from pydantic_core import PydanticCustomError

from lockgate.errors import RETRYABLE, ErrorClass, SpecError

MAX_TASK_ID = 191
#: Task and batch ids starting with this belong to the release gate's evaluations:
#: refused at submit, so nobody can plant a result for, or block, an evaluation.
RESERVED_ID_PREFIX = "gate:"
#: Largest ``input_data`` (as JSON) a task may carry; a database may set a lower bound
#: (MySQL's ``max_allowed_packet``), see :meth:`lockgate.store.Store.max_input_bytes`.
MAX_INPUT_BYTES = 8 << 20
#: Request fields lockgate itself sets; a task may not override them through
#: ``model_config`` (routing, rendering and truncation decide them, and the trace
#: records them).
RESERVED_REQUEST_FIELDS = frozenset({"model", "messages", "stream", "stream_options"})
#: Request parameters of OpenAI-compatible providers that a ``model_config`` may carry
#: as extra keys (they are sent as they are); a key close to one of these, or to a
#: declared field, but equal to none is taken for a misspelling and refused.
KNOWN_PROVIDER_PARAMS = frozenset({
    "frequency_penalty", "presence_penalty", "logit_bias", "logprobs", "top_logprobs",
    "stop", "user", "tools", "tool_choice", "parallel_tool_calls", "service_tier",
    "reasoning_effort", "max_completion_tokens", "modalities", "prediction", "store",
    "metadata", "audio", "web_search_options", "verbosity",
    # vLLM, Ollama, DashScope, GLM
    "repetition_penalty", "min_p", "min_tokens", "best_of", "use_beam_search",
    "ignore_eos", "skip_special_tokens", "guided_json", "guided_choice", "guided_regex",
    "chat_template_kwargs", "enable_thinking", "thinking", "enable_search",
    "result_format", "incremental_output", "do_sample", "request_id", "num_ctx",
    "keep_alive", "options", "extra_body",
})
#: The six meta-fields every task line states.
REQUIRED_FIELDS = ("task_id", "prompt_template", "input_data", "model_config",
                   "delivery_rule", "retry_policy")

#: A ``prompt_template`` of the form ``@registry:NAME`` (the live version),
#: ``@registry:NAME@LABEL`` or ``@registry:NAME@N`` (pinned version N) names a prompt of
#: the registry instead of carrying a template; the worker resolves it per attempt.
REGISTRY_PREFIX = "@registry:"
_REFERENCE = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,190}(@([1-9][0-9]*|[A-Za-z][A-Za-z0-9_.\-]{0,63}))?$")


#: The ``name`` a registry task's model-config overrides hold when they give none (the
#: version's is used; routing at submit sees no model of its own, as with no overrides).
_VERSION_MODEL = "(the prompt version's model)"


def registry_reference(template: object) -> str | None:
    """The reference (``NAME``, ``NAME@label``, ``NAME@3``) a template names, or None."""
    if isinstance(template, str) and template.startswith(REGISTRY_PREFIX):
        return template[len(REGISTRY_PREFIX):]
    return None


def _not_bool(value: Any) -> Any:
    """JSON's ``true``/``false`` where a number goes: pydantic would take them for 1 and
    0 (``"temperature": true`` ran at 1.0, ``"max_retries": true`` allowed one)."""
    if isinstance(value, bool):
        raise PydanticCustomError("not_a_number", "{value} is not a number",
                                  {"value": str(value).lower()})
    return value


#: Numbers of a task's spec: ``true`` and ``false`` are refused, not read as 1 and 0.
Whole = Annotated[int, BeforeValidator(_not_bool)]
Number = Annotated[float, BeforeValidator(_not_bool)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())


class Message(_Strict):
    """One chat message of a template; ``content`` may hold ``{placeholders}``."""

    role: Literal["system", "user", "assistant", "developer"]
    content: str


#: A template is a single user message, or a list of chat messages.
PromptTemplate = str | tuple[Message, ...]


class RetryPolicy(_Strict):
    """How failed attempts are retried (exponential back-off with jitter and a cap)."""

    max_retries: Whole = Field(3, ge=0, le=100)
    base_delay_ms: Whole = Field(1000, ge=0, le=86_400_000)
    backoff_factor: Number = Field(2.0, ge=1.0, le=10.0)
    jitter: Number = Field(0.2, ge=0.0, le=1.0, description="+/- fraction of the delay")
    cap_ms: Whole = Field(300_000, ge=0, le=86_400_000)
    stop_on: tuple[ErrorClass, ...] = ()

    def delay_ms(self, retry_number: int, rng: random.Random | None = None) -> int:
        """Back-off before retry ``retry_number`` (1-based): capped, then jittered."""
        base = self.base_delay_ms * self.backoff_factor ** max(0, retry_number - 1)
        base = min(float(self.cap_ms), base)
        if self.jitter:
            r = (rng or random).uniform(-self.jitter, self.jitter)
            base = base * (1.0 + r)
        return max(0, round(base))

    def retryable(self, error_class: ErrorClass) -> bool:
        """Whether an error of this class may be retried under this policy."""
        return error_class in RETRYABLE and error_class not in self.stop_on


class ModelConfig(BaseModel):
    """Which model to call and how. Unknown keys are passed to the provider as-is."""

    model_config = ConfigDict(extra="allow", frozen=True, protected_namespaces=())

    name: str = Field(min_length=1, max_length=200)
    endpoint: str | None = Field(None, description="endpoint name from the config file")
    temperature: Number | None = Field(None, ge=0.0, le=2.0)
    temperature_jitter: Number = Field(0.0, ge=0.0, le=1.0)
    top_p: Number | None = Field(None, ge=0.0, le=1.0)
    top_k: Whole | None = Field(None, ge=1)
    max_tokens: Whole | None = Field(None, ge=1)
    timeout_ms: Whole = Field(60_000, ge=100, le=3_600_000)
    max_input_tokens: Whole | None = Field(None, ge=16)
    response_format: Literal["json_object", "text"] | None = None
    seed: Whole | None = None
    tokenizer: str | None = Field(
        None, description="token estimator for budgets and traces: 'calibrated', or the "
                          "default (tiktoken when its encoding is on disk) when unset")
    provider_params: dict[str, Any] = Field(
        default_factory=dict,
        description="request parameters sent to the provider exactly as given (for a key "
                    "that looks like a misspelling of a known one)")

    def extra_params(self) -> dict[str, Any]:
        """Provider parameters given beyond the declared fields (``provider_params``
        last), without the request fields lockgate sets itself."""
        extra = {**(self.__pydantic_extra__ or {}), **self.provider_params}
        return {k: v for k, v in extra.items() if k not in RESERVED_REQUEST_FIELDS}


def check_model_keys(model: ModelConfig) -> None:
    """Refuse request fields a task may not set and keys that look misspelt; raise
    :class:`SpecError` naming the key and the fix."""
    declared = set(ModelConfig.model_fields)
    for where, keys in (("model_config", model.__pydantic_extra__ or {}),
                        ("model_config.provider_params", model.provider_params)):
        for key in keys:
            if key in RESERVED_REQUEST_FIELDS:
                hint = ("the model is model_config.name (or the endpoint's `model`)"
                        if key == "model" else
                        "messages come from prompt_template" if key == "messages" else
                        "lockgate reads whole answers; streaming is not supported")
                raise SpecError(f"is set by lockgate itself and may not be given in a task "
                                f"({hint})", field=f"{where}.{key}")
            if where == "model_config" and key not in KNOWN_PROVIDER_PARAMS:
                close = difflib.get_close_matches(
                    key, sorted(declared | KNOWN_PROVIDER_PARAMS), n=1, cutoff=0.8)
                if close:
                    raise SpecError(
                        f"is not a known field; did you mean '{close[0]}'? (to send "
                        f"'{key}' to the provider as it is, put it under "
                        "model_config.provider_params)", field=f"{where}.{key}")


class InputRule(_Strict):
    """How input values are normalised before rendering."""

    nfkc: bool = True
    strip_invisible: bool = True
    emoji: Literal["tag", "keep", "remove"] = "tag"


class DeliveryRule(BaseModel):
    """What a usable output is, and what to deliver when a field is missing."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=(),
                              populate_by_name=True)

    format: Literal["json", "text"] = "json"
    required_keys: tuple[str, ...] = ()
    fallback_values: dict[str, Any] = Field(default_factory=dict, alias="fallback_values")
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    pydantic_model: str | None = Field(None, description="import path module:Class")
    aliases: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    input_defaults: dict[str, Any] = Field(default_factory=dict)
    normalize: InputRule = Field(default_factory=InputRule)
    on_invalid: Literal["retry", "fallback", "fail"] = "retry"
    #: Deliver a value the output was cut off in (a string without its closing quote,
    #: a number at the very end) as the repair closes it. Off by default: a value
    #: counts only if it finished, so a cut one takes its fallback. ``None`` is off
    #: (and keeps the stored form of existing rules unchanged).
    keep_truncated: bool | None = None

    @field_validator("fallback_values", mode="before")
    @classmethod
    def _accept_none(cls, v: Any) -> Any:
        return {} if v is None else v


class TaskSpec(BaseModel):
    """A task as submitted: the six meta-fields plus batch, priority and metadata."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=(),
                              populate_by_name=True)

    task_id: str = Field(min_length=1, max_length=MAX_TASK_ID)
    prompt_template: str | tuple[Message, ...]
    input_data: dict[str, Any]
    #: Required, except with a registry reference (the prompt version supplies it;
    #: keys given here override the version's, e.g. another model for an A/B test, or
    #: only the temperature: ``name`` may then be left out).
    model: ModelConfig | None = Field(None, alias="model_config", validate_default=True)
    delivery_rule: DeliveryRule = Field(default_factory=DeliveryRule)
    retry_policy: RetryPolicy = Field(default_factory=RetryPolicy)
    batch_id: str | None = Field(None, min_length=1, max_length=MAX_TASK_ID)
    #: Seconds this task moves ahead of (or, negative, behind) others in the claim
    #: order of its queue: claims take ready tasks oldest-ready first.
    priority: Whole = Field(0, ge=-1000, le=1000)
    metadata: dict[str, Any] | None = None

    @field_validator("model", mode="wrap")
    @classmethod
    def _model_required(cls, v: Any, handler: ValidatorFunctionWrapHandler,
                        info: ValidationInfo) -> ModelConfig | None:
        reference = registry_reference(info.data.get("prompt_template")) is not None
        if v is None and not reference:
            if "prompt_template" not in info.data:
                # The template was refused (its error says why): whether it needs a
                # model config is unknown (a malformed @registry: reference needs
                # none), so a missing one is not added to the error.
                return None
            raise PydanticCustomError("missing", "Field required")
        if reference and isinstance(v, dict) and "name" not in v:
            # Overrides of the version's model config without a model name: the other
            # keys are checked as usual, and the name, left out of the fields set, is
            # not part of the stored overrides (``config_document``), so the worker's
            # merge keeps the version's.
            model: ModelConfig = handler({**v, "name": _VERSION_MODEL})
            model.__pydantic_fields_set__.discard("name")
            return model
        result: ModelConfig | None = handler(v)
        return result

    _input_json: bytes | None = PrivateAttr(None)

    @field_validator("task_id", "batch_id")
    @classmethod
    def _printable(cls, v: str | None) -> str | None:
        if v is not None and (not v.isprintable() or v != v.strip()):
            raise ValueError("must be printable with no leading or trailing whitespace")
        if v is not None and v.startswith(RESERVED_ID_PREFIX):
            raise ValueError(f"ids starting with '{RESERVED_ID_PREFIX}' are reserved for the "
                             "release gate's evaluations")
        return v

    def input_json(self) -> bytes:
        """``input_data`` as JSON (computed once; :func:`parse_task` checks it)."""
        if self._input_json is None:
            self._input_json = encode_input(self.input_data)
        return self._input_json

    @field_validator("prompt_template")
    @classmethod
    def _non_empty(cls, v: str | tuple[Message, ...]) -> str | tuple[Message, ...]:
        if isinstance(v, str) and not v.strip():
            raise ValueError("must not be empty")
        ref = registry_reference(v)
        if ref is not None and not _REFERENCE.match(ref):
            raise ValueError("a registry reference is @registry:NAME, @registry:NAME@LABEL "
                             "or @registry:NAME@N")
        if isinstance(v, tuple) and not v:
            raise ValueError("must hold at least one message")
        return v

    def config_document(self) -> dict[str, Any]:
        """The shared, content-addressed part of the task (everything but the input)."""
        tpl: Any = self.prompt_template
        if not isinstance(tpl, str):
            tpl = [m.model_dump() for m in tpl]
        if registry_reference(tpl) is not None:
            # Only what the task states itself: the prompt version supplies the rest.
            doc: dict[str, Any] = {"prompt_template": tpl,
                                   "retry_policy": self.retry_policy.model_dump(mode="json")}
            if self.model is not None:
                doc["model_config"] = self.model.model_dump(exclude_unset=True)
            if "delivery_rule" in self.model_fields_set:
                doc["delivery_rule"] = self.delivery_rule.model_dump(by_alias=True,
                                                                     exclude_none=True)
            return doc
        assert self.model is not None  # enforced by _model_required
        return {
            "prompt_template": tpl,
            "model_config": self.model.model_dump(exclude_none=True),
            "delivery_rule": self.delivery_rule.model_dump(by_alias=True, exclude_none=True),
            "retry_policy": self.retry_policy.model_dump(mode="json"),
        }


class TaskConfig(BaseModel):
    """The content-addressed configuration of a task, as stored and as executed."""

    model_config = ConfigDict(frozen=True, protected_namespaces=(), populate_by_name=True)

    prompt_template: str | tuple[Message, ...]
    model: ModelConfig = Field(alias="model_config")
    delivery_rule: DeliveryRule
    retry_policy: RetryPolicy


def canonical_json(value: Any) -> bytes:
    """Deterministic JSON bytes (sorted keys) for hashing and storage."""
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)


def template_key(template: Any) -> str:
    """The prompt key of an inline template (quality rollups, completeness circuits):
    ``inline:`` and 12 hex digits of the hash of its canonical JSON (the same template
    has the same key in every task)."""
    return "inline:" + hashlib.sha256(canonical_json(template)).hexdigest()[:12]


def config_hash(document: dict[str, Any]) -> str:
    """SHA-256 of a config document's canonical JSON."""
    return hashlib.sha256(canonical_json(document)).hexdigest()


def load_config(document: dict[str, Any]) -> TaskConfig:
    """Rebuild a :class:`TaskConfig` from its stored document."""
    return TaskConfig.model_validate(document)


def _known_fields() -> dict[tuple[str, ...], list[str]]:
    """Declared field names (by alias) of each strict model, by where it sits in a task
    line (for "did you mean")."""
    def names(model: type[BaseModel]) -> list[str]:
        return [f.alias or n for n, f in model.model_fields.items()]
    return {(): names(TaskSpec), ("model",): names(ModelConfig),
            ("delivery_rule",): names(DeliveryRule),
            ("retry_policy",): names(RetryPolicy),
            ("delivery_rule", "normalize"): names(InputRule)}


def _field_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            name = "model_config" if (i == 0 and part == "model") else str(part)
            if not name.isprintable():  # a key like "\n" must not break the one line
                name = name.encode("unicode_escape", "backslashreplace").decode("ascii")
            out += ("." if out else "") + name
    return out


#: Problems named in one error message (the first names the error's field).
MAX_PROBLEMS = 10


def _problem(err: Any) -> tuple[str, str]:
    path = _field_path(tuple(err["loc"])) or "(line)"
    msg = err["msg"]
    if err["type"] == "missing":
        msg = "is required"
    elif err["type"] == "extra_forbidden":
        known = _KNOWN_FIELDS.get(tuple(str(x) for x in err["loc"][:-1]))
        close = difflib.get_close_matches(str(err["loc"][-1]), known or [], n=1, cutoff=0.6)
        msg = (f"is not a known field; did you mean '{close[0]}'?" if close
               else "is not a known field (check its spelling)")
    elif msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    unit = _unit_hint(err)
    if unit:
        msg = f"{err['input']!r} is not a number{unit}"
    return path, msg


def _unit_hint(err: Any) -> str:
    """For a ``..._ms`` field given text (``"timeout_ms": "20s"``): that it is a
    number of milliseconds, and the number to write when the text is a duration."""
    loc = err["loc"]
    name = str(loc[-1]) if loc else ""
    if not name.endswith("_ms") or not isinstance(err.get("input"), str):
        return ""
    m = _SIMPLE_DURATION.fullmatch(err["input"].strip())
    if m is None:
        return f"; {name} is a whole number of milliseconds, e.g. 20000 for 20 s"
    ms = round(float(m.group(1)) * _MS_PER[m.group(2)])
    return f"; {name} is in milliseconds: write {ms}"


#: A duration given where milliseconds go (``"20s"``), to name the number to write.
_SIMPLE_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h)")
_MS_PER = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000}


#: How a value of the wrong JSON type is named (pydantic's error type -> words).
_KINDS = {"string_type": "a string", "tuple_type": "a list", "list_type": "a list",
          "dict_type": "an object", "int_type": "an integer", "float_type": "a number",
          "bool_type": "true or false", "model_type": "an object"}


#: Fields whose type is a union of types (pydantic names each branch of ``str |
#: tuple[Message, ...]`` in an error's location, after the field: ``str``,
#: ``tuple[Message, ...]``).
_UNIONS = frozenset({"prompt_template"})


def _branch_at(loc: tuple[Any, ...]) -> int | None:
    """Where a union's branch name is in an error's location (None: nowhere)."""
    return 1 if len(loc) > 1 and loc[0] in _UNIONS and isinstance(loc[1], str) else None


def _unbranched(errors: list[Any]) -> list[Any]:
    """The errors of a union's branches as one field's: a branch refused only for the
    value's type is dropped when another branch of that field took the value further
    (a list of messages with a bad role is not "not a valid string"); when every branch
    refused the type, one error names the types the field takes. Branch names leave
    the location."""
    out: list[Any] = []
    by_field: dict[tuple[Any, ...], list[Any]] = {}
    for e in errors:
        loc = tuple(e["loc"])
        at = _branch_at(loc)
        if at is None:
            out.append(e)
            continue
        by_field.setdefault(loc[:at], []).append({
            **e, "loc": loc[:at] + loc[at + 1:],
            "_shallow": len(loc) == at + 1 and e["type"] in _KINDS})
    for field, errs in by_field.items():
        deeper = [e for e in errs if not e["_shallow"]]
        if deeper:
            out.extend(deeper)
        else:
            kinds = list(dict.fromkeys(_KINDS[e["type"]] for e in errs))
            out.append({**errs[0], "loc": field, "type": "union_type",
                        "msg": f"must be {' or '.join(kinds)}"})
    return out


def spec_error_from(exc: ValidationError, line: int | None = None) -> SpecError:
    """Turn pydantic's error into one that names the bad fields (up to ten) and fixes."""
    problems = [_problem(e) for e in _unbranched(exc.errors())]
    (path, msg), rest = problems[0], problems[1:]
    if rest:
        shown = rest[:MAX_PROBLEMS - 1]
        msg += "; also " + "; ".join(f"'{p}' {m}" for p, m in shown)
        if len(rest) > len(shown):
            msg += f" (and {len(rest) - len(shown)} more)"
    return SpecError(msg, field=path, line=line)


def retry_policy_error(exc: ValidationError) -> SpecError:
    """A prompt's refused ``retry_policy`` (``prompt propose --retry-policy``) as a task
    line's would be: the field under ``retry_policy``, and a misspelt key's likely
    meaning (``max_retry``: did you mean 'max_retries'?)."""
    err = exc.errors()[0]
    path, msg = _problem({**err, "loc": ("retry_policy", *err["loc"])})
    return SpecError(msg, field=path)


def nonfinite_field(value: Any) -> str | None:
    """The path (``text``, ``scores[2]``) of the first NaN or infinite float in
    ``value`` ("" for ``value`` itself), or None when there is none. JSON has no such
    numbers: orjson writes them as ``null``, which would store another value than the
    one given (a file's JSON cannot hold them; a mapping built in Python can)."""
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        v, path = stack.pop()
        if isinstance(v, dict):
            stack.extend((x, f"{path}.{k}" if path else str(k))
                         for k, x in reversed(v.items()))
        elif isinstance(v, list | tuple):
            stack.extend((v[i], f"{path}[{i}]") for i in range(len(v) - 1, -1, -1))
        elif isinstance(v, float) and not math.isfinite(v):
            return path
    return None


def check_finite(value: Any, encoded: bytes, field: str) -> None:
    """:class:`SpecError` naming the field (``input_data.text``) when ``value``, which
    encoded as ``encoded``, holds a NaN or an infinity (written as ``null``: only a
    text holding ``null`` is searched)."""
    if b"null" not in encoded:
        return
    path = nonfinite_field(value)
    if path is not None:
        raise SpecError("is NaN or infinite, which JSON cannot carry (it would be stored "
                        "as null): pass a finite number, null or a string",
                        field=f"{field}.{path}" if path else field)


def without_surrogates(text: str) -> str:
    """``text`` with its surrogate pairs joined into their character (as some JSON
    decoders leave an emoji, ``"\\ud83d\\ude00"``) and lone surrogates, which no JSON
    encoding carries and no request can send, replaced by ``?``."""
    try:
        text.encode()
        return text
    except UnicodeEncodeError:
        joined = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le",
                                                                  "surrogatepass")
        return joined.encode(errors="replace").decode()


def _without_surrogates(value: Any) -> Any:
    """``value`` with :func:`without_surrogates` applied to every text, keys too (as
    rendering does)."""
    if isinstance(value, str):
        return without_surrogates(value)
    if isinstance(value, dict):
        return {_without_surrogates(k): _without_surrogates(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_without_surrogates(v) for v in value]
    return value


def encode_input(input_data: dict[str, Any], *, max_bytes: int = MAX_INPUT_BYTES) -> bytes:
    """``input_data`` as JSON bytes; :class:`SpecError` if it cannot be stored (nested
    too deep for JSON encoding, a NaN or an infinity, or larger than ``max_bytes``).
    Surrogates (a dict built in Python, a file's ``\\ud800`` escape) are joined into
    their character when paired and replaced by ``?`` when alone: only texts that
    orjson refuses are looked at."""
    try:
        raw = orjson.dumps(input_data)
    except (TypeError, orjson.JSONEncodeError) as exc:
        problem: Exception = exc
        raw = b""
        if "surrogates" in str(exc):
            try:
                raw = orjson.dumps(_without_surrogates(input_data))
            except (TypeError, orjson.JSONEncodeError, RecursionError) as again:
                problem = again
        if not raw:
            why = ("is nested too deeply (more than 250 levels)"
                   if isinstance(problem, RecursionError) or "Recursion" in str(problem)
                   else unencodable(problem))
            raise SpecError(why, field="input_data") from None
    check_finite(input_data, raw, "input_data")
    if len(raw) > max_bytes:
        raise SpecError(f"is {len(raw):,} bytes as JSON; a task's input may hold at most "
                        f"{max_bytes:,} (split it, or store it elsewhere and pass a "
                        "reference)", field="input_data")
    return raw


def unencodable(exc: Exception) -> str:
    """Why a value cannot be stored as JSON, and what to do about it."""
    text = str(exc)
    if "surrogates" in text:
        return ("holds a lone surrogate (half of a UTF-16 pair), which no JSON encoding "
                "carries: decode the text with errors='replace' or drop the character")
    if "64-bit" in text:
        return "holds an integer beyond 64 bits, which JSON cannot carry here: pass it as text"
    if "Recursion" in text:
        return "is nested too deeply (more than 250 levels)"
    return f"cannot be stored as JSON: {text}"


def check_storable(spec: TaskSpec, line: int | None = None) -> None:
    """:class:`SpecError` naming the field when a task built in Python holds a value no
    JSON encoding carries (a lone surrogate, an integer beyond 64 bits, a cycle, a NaN
    or an infinity, which orjson would write as null): what
    a file's JSON cannot hold, a dict passed to ``submit`` can."""
    parts: dict[str, Any] = {"metadata": spec.metadata, **spec.config_document()}
    for name, value in parts.items():
        if value is None:
            continue
        try:
            check_finite(value, canonical_json(value), name)
        except (TypeError, orjson.JSONEncodeError) as exc:
            raise SpecError(unencodable(exc), field=name, line=line) from None
        except SpecError as exc:
            raise exc.at_line(line) from None


def _missing_hint(name: str) -> str:
    if name == "model_config":
        return 'at least {"name": "<model>"}'
    if name in ("delivery_rule", "retry_policy"):
        return "{} takes the defaults"
    return "state it on every line"


def parse_task(data: Any, line: int | None = None, *,
               max_input_bytes: int = MAX_INPUT_BYTES) -> TaskSpec:
    """Validate one task mapping; raise :class:`SpecError` naming the field on failure.
    ``input_data`` must encode as JSON within ``max_input_bytes``."""
    if not isinstance(data, dict):
        raise SpecError(f"expected a JSON object, got {type(data).__name__}", line=line)
    if registry_reference(data.get("prompt_template")) is None:
        # All six meta-fields are stated on every line; a registry reference takes the
        # template, model config and delivery rule from the prompt version instead.
        missing = [n for n in REQUIRED_FIELDS if n not in data]
        if missing:
            also = (f"; also missing: {', '.join(missing[1:])}" if len(missing) > 1 else "")
            raise SpecError(f"is required (one of the six meta-fields: "
                            f"{_missing_hint(missing[0])}){also}", field=missing[0], line=line)
    try:
        spec = TaskSpec.model_validate(data)
    except ValidationError as exc:
        raise spec_error_from(exc, line) from None
    try:
        if spec.model is not None:
            check_model_keys(spec.model)
        spec._input_json = encode_input(spec.input_data, max_bytes=max_input_bytes)
    except SpecError as exc:
        raise exc.at_line(line) from None
    return spec


_KNOWN_FIELDS = _known_fields()
