"""Token estimates for reservations, learned from the provider's ``usage``.

A call reserves ``prompt + expected output`` before it is made. The prompt part scales
with the size of the task's input (``tokens_per_char * chars``); the output part is the
recent mean of real completions for that task type, capped by ``max_tokens``. Both
start from a cautious guess and move towards the real figures with an exponential
average, so reservations settle close to what the provider charges and the
post-call settlement (real minus reserved) stays small. :class:`TokenModels` keeps one
model per task type and endpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

from cachetools import LRUCache

from lockgate.config import Endpoint
from lockgate.spec import TaskConfig

#: Before anything was measured: a token is about 4 Latin characters or 1 CJK one;
#: assume the dearer end so the first calls over-reserve rather than overshoot.
INITIAL_TOKENS_PER_CHAR = 0.5
DEFAULT_OUTPUT_TOKENS = 256
ALPHA = 0.05
#: Task types (per endpoint) whose token model a worker keeps, the most recently used.
#: With OpenAI-batch input every task may be a task type of its own: an unbounded map
#: would grow with every task processed.
MODELS_KEPT = 4096
#: The most a prompt can hold, per character of its text, plus the chat format's own
#: tokens: a byte-level tokenizer makes at most one token per UTF-8 byte (four per
#: character). A usage figure beyond it (or an output beyond ``MAX_OUTPUT_TOKENS``)
#: is not learned from: one answer claiming 500M tokens made every later call reserve
#: millions.
MAX_TOKENS_PER_CHAR = 4.0
FORMAT_TOKENS = 256
MAX_OUTPUT_TOKENS = 1_000_000


@dataclass(slots=True)
class TokenModel:
    """Learned token costs of one task type (config) on one endpoint."""

    fixed_chars: int
    max_tokens: int | None
    counts_max_tokens: bool = False
    tokens_per_char: float = INITIAL_TOKENS_PER_CHAR
    output_tokens: float = 0.0
    samples: int = 0

    def __post_init__(self) -> None:
        if not self.output_tokens:
            self.output_tokens = float(min(self.max_tokens or DEFAULT_OUTPUT_TOKENS,
                                           DEFAULT_OUTPUT_TOKENS))

    def estimate(self, input_chars: int) -> float:
        """Tokens to reserve for a task whose input has ``input_chars`` characters."""
        out = self.output_tokens
        if self.max_tokens is not None:
            out = float(self.max_tokens) if self.counts_max_tokens else \
                min(out, float(self.max_tokens))
        return self.tokens_per_char * (self.fixed_chars + input_chars) + out

    def learn(self, input_chars: int, prompt_tokens: int | None,
              completion_tokens: int | None) -> None:
        """Move towards one call's real usage (early samples weigh more); a figure no
        call could have used is ignored."""
        a = max(ALPHA, 1.0 / (self.samples + 1))
        chars = max(1, self.fixed_chars + input_chars)
        if prompt_tokens is not None and prompt_tokens > 0:
            if prompt_tokens > MAX_TOKENS_PER_CHAR * chars + FORMAT_TOKENS:
                return
            self.tokens_per_char += a * (prompt_tokens / chars - self.tokens_per_char)
        if completion_tokens is not None and 0 <= completion_tokens <= MAX_OUTPUT_TOKENS:
            self.output_tokens += a * (completion_tokens - self.output_tokens)
        self.samples += 1


def charged_tokens(prompt_tokens: int | None, completion_tokens: int | None,
                   max_tokens: int | None, counts_max_tokens: bool) -> int | None:
    """What the provider counts against its token limit for one answered call (None if
    the answer gave no usage). Providers that reserve ``max_tokens`` at admission
    (``counts_max_tokens``) charge it whatever the answer's length."""
    if prompt_tokens is None:
        return None
    if counts_max_tokens and max_tokens is not None:
        return prompt_tokens + max_tokens
    return prompt_tokens + (completion_tokens or 0)


class TokenModels:
    """The :class:`TokenModel` of each task type (config) on each endpoint of a worker,
    the :data:`MODELS_KEPT` most recently used (an evicted type starts cautious again)."""

    def __init__(self, maxsize: int = MODELS_KEPT) -> None:
        self._models: LRUCache[tuple[str, str], TokenModel] = LRUCache(maxsize)

    def __len__(self) -> int:
        return len(self._models)

    def get(self, ep: Endpoint, config: TaskConfig, config_hash: str) -> TokenModel:
        key = (ep.name, config_hash)
        m = self._models.get(key)
        if m is None:
            tpl = config.prompt_template
            chars = len(tpl) if isinstance(tpl, str) else sum(len(x.content) for x in tpl)
            m = self._models[key] = TokenModel(chars, config.model.max_tokens,
                                               ep.tpm_counts_max_tokens)
        return m

    def mean_estimate(self, endpoint: str) -> float:
        """The mean reservation of a call without input on ``endpoint`` (500 when no
        task type has been seen there)."""
        ms = [m.estimate(0) for (name, _h), m in self._models.items() if name == endpoint]
        return sum(ms) / len(ms) if ms else 500.0
