"""Templates: ``{name}`` placeholders, their checks, and the three-section form.

Rules:

* A placeholder is ``{name}`` where ``name`` is an identifier (Chinese names such as
  ``{文本}`` are identifiers too). Positional (``{}``, ``{0}``), attribute (``{a.b}``),
  index (``{a[0]}``), conversion (``{a!r}``) and format-spec (``{a:>8}``) fields are
  refused: a template is not code.
* ``{{`` and ``}}`` are literal braces, so a JSON example is written ``{{"label": ...}}``.
* A template is compiled once (cached by its text) into literal parts and names; a
  value is never parsed as a template, so braces inside values are inert.
* A placeholder that sits inside a double-quoted string on its line (``"{text}"``, as
  in a JSON example) is marked *in a JSON string*: its value is JSON-escaped there, so
  quotes and newlines in the value cannot break the example. It sits inside one when an
  odd number of unescaped double quotes precede it on its line *and* one follows it
  there: a lone quote earlier on a prose line (``Phone with 6" screen. Review:
  {text}``) leaves the value as written.
"""

from __future__ import annotations

import functools
import hashlib
import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from lockgate.errors import TemplateError
from lockgate.runtime.names import closest
from lockgate.spec import Message

#: The fixed delimiters around the input section of the three-section form.
INPUT_OPEN = "<input>"
INPUT_CLOSE = "</input>"

_FORMATTER = string.Formatter()
_BRACE_HINT = "write '{{' and '}}' for literal braces"


@dataclass(frozen=True, slots=True)
class CompiledText:
    """One message body split at its placeholders: ``parts[i] name[i] parts[i+1]``."""

    parts: tuple[str, ...]
    names: tuple[str, ...]
    in_json_string: tuple[bool, ...]

    @property
    def literal(self) -> str:
        """The text with every placeholder removed (what the template itself costs)."""
        return "".join(self.parts)


@dataclass(frozen=True, slots=True)
class CompiledTemplate:
    """A template parsed once: roles, compiled bodies, and the names it uses."""

    roles: tuple[str, ...]
    texts: tuple[CompiledText, ...]
    names: tuple[str, ...]
    occurrences: Mapping[str, int]
    sha256: str


def _compile_text(text: str, where: str) -> CompiledText:
    try:
        parsed = list(_FORMATTER.parse(text))
    except ValueError as exc:
        raise TemplateError(f"{where}: {exc}; {_BRACE_HINT}", field="prompt_template") from None
    parts: list[str] = []
    names: list[str] = []
    in_string: list[bool] = []
    literal = ""
    line_quotes = 0
    closes = _closing_quotes(parsed)
    for i, (lit, name, spec, conv) in enumerate(parsed):
        literal += lit
        # Count unescaped double quotes since the last newline: odd means "inside".
        tail = lit.rsplit("\n", 1)
        if len(tail) == 2:
            line_quotes = 0
        line_quotes += _unescaped_quotes(tail[-1])
        if name is None:
            continue
        if not name.isidentifier() or spec or conv:
            shown = "{" + name + ("!" + conv if conv else "") + (":" + spec if spec else "") + "}"
            raise TemplateError(
                f"{where}: '{shown}' is not a plain {{name}} placeholder; {_BRACE_HINT}",
                field="prompt_template")
        parts.append(literal)
        literal = ""
        names.append(name)
        in_string.append(line_quotes % 2 == 1 and closes[i])
    parts.append(literal)
    return CompiledText(tuple(parts), tuple(names), tuple(in_string))


def _closing_quotes(parsed: list[tuple[str, str | None, str | None, str | None]]
                    ) -> list[bool]:
    """Per parsed field: whether an unescaped double quote follows its placeholder on
    the same line (in the literal text after it, up to the next newline), so that a
    quote before it is an opening one and not an inch mark or a lone quote in prose."""
    closes = [False] * len(parsed)
    ahead = False  # whether the rest of the line after the current field has a quote
    for i in range(len(parsed) - 1, -1, -1):
        closes[i] = ahead
        lit = parsed[i][0]
        head, newline, _tail = lit.partition("\n")
        if newline:
            ahead = _unescaped_quotes(head) > 0
        elif _unescaped_quotes(lit):
            ahead = True
    return closes


#: A quote after an even number of backslashes (none included): not escaped.
_UNESCAPED_QUOTE = re.compile(r'(?<!\\)(?:\\\\)*"')


def _unescaped_quotes(text: str) -> int:
    if '"' not in text:
        return 0
    if "\\" not in text:
        return text.count('"')
    return len(_UNESCAPED_QUOTE.findall(text))


def _texts(template: str | tuple[Message, ...]) -> list[tuple[str, str]]:
    if isinstance(template, str):
        return [("user", template)]
    return [(m.role, m.content) for m in template]


@functools.lru_cache(maxsize=4096)
def compile_template(template: str | tuple[Message, ...]) -> CompiledTemplate:
    """Parse a template once; raise :class:`TemplateError` on bad placeholder syntax."""
    pairs = _texts(template)
    texts = tuple(
        _compile_text(body, "prompt_template" if len(pairs) == 1 else f"message {i + 1}")
        for i, (_role, body) in enumerate(pairs))
    occurrences: dict[str, int] = {}
    for t in texts:
        for n in t.names:
            occurrences[n] = occurrences.get(n, 0) + 1
    doc: Any = template if isinstance(template, str) else [m.model_dump() for m in template]
    return CompiledTemplate(
        roles=tuple(role for role, _ in pairs),
        texts=texts,
        names=tuple(occurrences),
        occurrences=occurrences,
        sha256=hashlib.sha256(orjson.dumps(doc)).hexdigest(),
    )


def placeholders(template: str | tuple[Message, ...]) -> set[str]:
    """The placeholder names a template uses; raises TemplateError on bad syntax."""
    return set(compile_template(template).names)


def _did_you_mean(name: str, candidates: Iterable[str]) -> str:
    match = closest(name, list(candidates))
    return f" (did you mean '{match}'?)" if match else ""


def check_template(template: str | tuple[Message, ...], input_keys: set[str] | None,
                   defaults: Mapping[str, Any] | None = None) -> set[str]:
    """Check placeholders against the input's keys (and declared defaults).

    Every placeholder needs a value in ``input_keys`` or ``defaults``, and every input
    key must be used by the template. Called when a task is submitted or a template
    registered, so that a mismatch is refused there and never fails at run time.
    """
    names = placeholders(template)
    if input_keys is None:
        return names
    known = set(input_keys) | set(defaults or {})
    missing = sorted(names - known)
    if missing:
        hint = _did_you_mean(missing[0], set(input_keys) - names)
        raise TemplateError(
            f"placeholder(s) {missing} have no value in input_data{hint}; add them to "
            "input_data or to delivery_rule.input_defaults", field="input_data")
    unused = sorted(set(input_keys) - names)
    if unused:
        hint = _did_you_mean(unused[0], names)
        raise TemplateError(
            f"input key(s) {unused} are not used by the template{hint}; remove them or "
            "add placeholders for them", field="input_data")
    return names


def escape_braces(text: str) -> str:
    """Make ``text`` literal inside a template (``{`` -> ``{{``, ``}`` -> ``}}``)."""
    return text.replace("{", "{{").replace("}", "}}")


def build_template(*, system: str, instruction: str,
                   output_schema: Mapping[str, Any] | str | None = None,
                   input_fields: Iterable[str] = ("input",)) -> tuple[Message, ...]:
    """The three-section template (system, instruction, delimited input), as chat messages.

    * system message: ``system`` (the context: role, domain, rules);
    * user message: ``instruction``, then the output schema (a mapping is shown as
      indented JSON; braces are escaped for you), then the input between the fixed
      delimiters ``<input>`` and ``</input>``, one ``name: {name}`` line per field
      (a single field is placed alone).

    ``system`` and ``instruction`` are template text: they may use placeholders and
    must escape literal braces themselves.
    """
    fields = list(input_fields)
    if not fields:
        raise TemplateError("build_template needs at least one input field",
                            field="prompt_template")
    for f in fields:
        if not f.isidentifier():
            raise TemplateError(f"input field {f!r} is not a valid placeholder name",
                                field="prompt_template")
    user = instruction.rstrip()
    if output_schema is not None:
        schema_text = output_schema if isinstance(output_schema, str) else \
            orjson.dumps(output_schema, option=orjson.OPT_INDENT_2).decode()
        user += "\n\nReply with JSON only, matching this schema:\n" + escape_braces(schema_text)
    one = len(fields) == 1
    body = "{" + fields[0] + "}" if one else "\n".join(f"{f}: {{{f}}}" for f in fields)
    user += f"\n\n{INPUT_OPEN}\n{body}\n{INPUT_CLOSE}"
    messages = (Message(role="system", content=system.strip()), Message(role="user", content=user))
    compile_template(messages)  # fail here, not at first render
    return messages
