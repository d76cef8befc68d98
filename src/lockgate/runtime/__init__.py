"""The prompt runtime: pure functions from a task's config and input to a rendered
prompt, and from a model's raw text to a validated output.

This package imports nothing of lockgate but :mod:`lockgate.spec` and
:mod:`lockgate.errors`. The engine calls only :func:`render`, :func:`check_template`
and :func:`parse_output`; production tasks and release-gate samples share them.
"""

from lockgate.runtime.output import ParseStatus, Parsed, parse_output
from lockgate.runtime.render import Rendered, check_template, placeholders, render

__all__ = [
    "ParseStatus",
    "Parsed",
    "Rendered",
    "check_template",
    "parse_output",
    "placeholders",
    "render",
]
