"""Names and references: ``NAME``, ``NAME@LABEL``, ``NAME@N`` (pure).

A task names a registry prompt with ``prompt_template: "@registry:REF"``
(:data:`lockgate.spec.REGISTRY_PREFIX`). ``NAME`` and ``NAME@production`` are the live
version; ``NAME@canary`` (any custom label) the version the label points at;
``NAME@3`` version 3, pinned.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lockgate.errors import SpecError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,190}$")
LABEL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]{0,63}$")
PRODUCTION = "production"
#: The longest tag (``prompt_version.tag`` is VARCHAR(100): PostgreSQL and MariaDB refuse
#: a longer one, SQLite would keep it).
MAX_TAG = 100
#: ``v3``: a version, wherever a version or a label may stand; never a label.
_VERSION_LIKE = re.compile(r"^[vV][0-9]+$")


@dataclass(frozen=True, slots=True)
class PromptRef:
    """A parsed reference: exactly one of ``label``/``version`` may be set."""

    name: str
    label: str | None = None
    version: int | None = None

    @property
    def pinned(self) -> bool:
        """A pinned version never changes: resolved once, cached forever."""
        return self.version is not None

    @property
    def pointer(self) -> str | None:
        """The label to follow (None = the live version)."""
        return None if self.label in (None, PRODUCTION) else self.label

    def __str__(self) -> str:
        if self.version is not None:
            return f"{self.name}@{self.version}"
        return f"{self.name}@{self.label}" if self.label else self.name


def check_name(name: str, what: str = "prompt") -> str:
    """A valid prompt or dataset name, or SpecError saying what is allowed."""
    if not NAME_RE.match(name or ""):
        raise SpecError(f"{what} name {name!r} must be 1-191 characters of letters, digits, "
                        "'_', '.', '-', starting with a letter or digit")
    return name


def reads_as_version(text: str) -> bool:
    """Whether a selector (``prompt show --version``, ``prompt diff``) reads ``text`` as a
    version number: ``3``, ``v3``, ``V3``; such a text never names a tag or a label."""
    text = text.strip()
    digits = text[1:] if text[:1] in ("v", "V") else text
    return digits.isdecimal()  # what int() takes: "²" is a digit, not a number


def check_tag(tag: str | None) -> str | None:
    """A tag a selector can find again and every database can store, or SpecError
    naming ``--tag`` and the fix."""
    if tag is None:
        return None
    if len(tag) > MAX_TAG:
        raise SpecError(f"--tag is {len(tag)} characters; a tag may have at most {MAX_TAG}")
    if not tag or not tag.isprintable() or tag != tag.strip():
        raise SpecError(f"--tag {tag!r}: a tag is printable text without leading or "
                        "trailing spaces, e.g. prompt-v1.2.3")
    if reads_as_version(tag) or tag == PRODUCTION:
        what = "the live version" if tag == PRODUCTION else "a version number"
        raise SpecError(f"--tag {tag!r} reads as {what} wherever a version is selected, so "
                        "it could never select this one: choose a tag with a letter in "
                        "it, e.g. prompt-v1.2.3")
    return tag


def check_label(label: str) -> str:
    """A valid label, or SpecError."""
    if not LABEL_RE.match(label or ""):
        raise SpecError(f"label {label!r} must start with a letter and hold letters, "
                        "digits, '_', '.', '-' (at most 64)")
    if _VERSION_LIKE.match(label):
        raise SpecError(f"label {label!r} reads as a version number (NAME@{label} is "
                        f"version {int(label[1:])}): choose another name")
    return label


def check_new_label(label: str) -> str:
    """A label that may be set: valid (:func:`check_label`) and not the reserved
    ``production`` in other letter case. Labels are case-sensitive (``canary`` and
    ``Canary`` are two labels), so ``NAME@Production`` would not be the live version
    that it reads as."""
    check_label(label)
    if label != PRODUCTION and label.lower() == PRODUCTION:
        raise SpecError(f"label {label!r} differs from the reserved '{PRODUCTION}' only by "
                        f"case; labels are case-sensitive, so NAME@{label} would not be the "
                        "live version: choose another name")
    return label


def parse_ref(text: str) -> PromptRef:
    """``NAME``, ``NAME@LABEL`` or ``NAME@N`` -> PromptRef; SpecError otherwise."""
    name, sep, rest = text.partition("@")
    check_name(name)
    if not sep:
        return PromptRef(name)
    digits = rest[1:] if _VERSION_LIKE.match(rest) else rest
    if digits.isdigit() and not digits.startswith("0"):
        return PromptRef(name, version=int(digits))
    if not rest:
        raise SpecError(f"reference {text!r} ends with '@': add a label or a version number",
                        field="prompt_template")
    try:
        return PromptRef(name, label=check_label(rest))
    except SpecError:
        raise SpecError(f"reference {text!r}: after '@' comes a version number (3) or a "
                        "label (canary)", field="prompt_template") from None
