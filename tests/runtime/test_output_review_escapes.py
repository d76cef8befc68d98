"""Markdown's escaped underscore (review of 2026-12-06, group L).

``\\_`` is no JSON escape; models trained on Markdown write it (``"is\\_spam"``), and
it means an underscore (in LaTeX too). A text holding one is not strict JSON; its
repair reads ``\\_`` as ``_`` in keys and values, never keeping the backslash. An
escaped backslash before an underscore (``\\\\_``) stays a backslash.
"""

from __future__ import annotations

import pytest

from lockgate.runtime import parse_output
from lockgate.spec import DeliveryRule

SPAM = DeliveryRule.model_validate({"schema": {
    "type": "object", "required": ["is_spam", "spam_type"],
    "properties": {"is_spam": {"type": "boolean"},
                   "spam_type": {"enum": ["phishing", "ad_spam", "none"]},
                   "reason": {"type": "string"}}}})


@pytest.mark.parametrize("raw, value", [
    (r'{"is\_spam": true, "spam\_type": "ad\_spam"}', {"is_spam": True, "spam_type": "ad_spam"}),
    (r'{"is_spam": false, "spam_type": "none", "reason": "the user\_id is empty"}',
     {"is_spam": False, "spam_type": "none", "reason": "the user_id is empty"}),
    (r"{'is_spam': True, 'spam_type': 'none', 'reason': 'user\_id'}",
     {"is_spam": True, "spam_type": "none", "reason": "user_id"}),
    (r'{"is_spam": true, "spam_type": "none", "reason": "C:\\_tmp \_x"}',
     {"is_spam": True, "spam_type": "none", "reason": "C:\\_tmp _x"}),
])
def test_a_markdown_escaped_underscore_is_an_underscore(raw: str, value: object) -> None:
    parsed = parse_output(raw, SPAM)
    assert parsed.usable and parsed.value == value
