"""The prompt runtime: pure functions from a task's config and input to a rendered
prompt, and from a model's raw text to a validated output.

This package imports nothing of lockgate but :mod:`lockgate.spec`,
:mod:`lockgate.errors` (and :mod:`lockgate.lazy`). The engine's single execution path
(production tasks and release-gate samples alike) calls :func:`render`,
:func:`check_template`, :func:`parse_output` and :func:`sampling_params`.

Modules, in the order a task meets them: :mod:`.template` (placeholders, the
three-section form), :mod:`.normalize`, :mod:`.tokens`, :mod:`.truncate`,
:mod:`.render`; then :mod:`.extract`, :mod:`.conform` (field names, types),
:mod:`.schema` (the compiled delivery rule) and :mod:`.output` (the ladder; its steps in
:mod:`.search`, :mod:`.settle` and :mod:`.unwrap`; answers cut off at ``max_tokens`` in
:mod:`.finish`).

The names below are loaded on first use (:func:`__getattr__`): a command that only
checks task files (``submit``, ``status``) does not compile the output pass's patterns.
"""

import typing

from lockgate.lazy import lazy_names as _lazy_names

# render is the name of a function and of its module: imported here, so that the
# module's import (which sets the package's attribute) cannot shadow the function.
from lockgate.runtime.render import Rendered, render

if typing.TYPE_CHECKING:
    from lockgate.runtime.normalize import normalize_text, normalize_value
    from lockgate.runtime.output import (
        USABLE,
        Parsed,
        ParseStatus,
        parse_output,
        parse_reply,
        with_prefill,
    )
    from lockgate.runtime.sampling import sampling_params
    from lockgate.runtime.schema import check_delivery_rule, check_result, model_allowed
    from lockgate.runtime.template import (
        INPUT_CLOSE,
        INPUT_OPEN,
        build_template,
        check_template,
        placeholders,
    )
    from lockgate.runtime.tokens import count_tokens, default_estimator

#: Where each public name lives (its module of this package).
_HOME = {
    "normalize_text": "normalize", "normalize_value": "normalize",
    "USABLE": "settle", "ParseStatus": "settle", "Parsed": "settle",
    "parse_output": "output", "parse_reply": "output", "with_prefill": "output",
    "sampling_params": "sampling",
    "check_delivery_rule": "schema", "check_result": "schema", "model_allowed": "schema",
    "INPUT_CLOSE": "template", "INPUT_OPEN": "template", "build_template": "template",
    "check_template": "template", "placeholders": "template",
    "count_tokens": "tokens", "default_estimator": "tokens",
}


__getattr__, __dir__ = _lazy_names(__name__, _HOME)


__all__ = [
    "INPUT_CLOSE",
    "INPUT_OPEN",
    "USABLE",
    "ParseStatus",
    "Parsed",
    "Rendered",
    "build_template",
    "check_delivery_rule",
    "check_result",
    "check_template",
    "count_tokens",
    "default_estimator",
    "model_allowed",
    "normalize_text",
    "normalize_value",
    "parse_output",
    "parse_reply",
    "placeholders",
    "render",
    "sampling_params",
    "with_prefill",
]
