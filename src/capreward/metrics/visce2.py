"""VisCE² math: the score is the first integer of the judge's answer.

The released code (``Silviase/VisCE2``) takes the first integer of the generated text and scores 0
when there is none; we do the same and say why in the error. An integer above 100 is also scored 0
with a reason (the prompt asks for 0..100). The expected score over 0..100 reuses
:func:`capreward.metrics.gveval.expected_score`.
"""

from __future__ import annotations

import re

from .gveval import NUM_SCORES, alternatives_distribution, expected_score  # noqa: F401  (re-exported)

_INTEGER = re.compile(r"\d+")


def first_integer(text: str) -> tuple[int, int] | None:
    """``(value, start offset)`` of the first run of ASCII digits in ``text``, or None."""
    match = _INTEGER.search(text)
    if match is None:
        return None
    return int(match.group(0)), match.start()


def parse_visce2_answer(text: str) -> tuple[float, str | None]:
    """The VisCE² score of an answer: ``(score in [0, 100], None)``, or ``(0.0, reason)`` when the answer
    holds no integer or its first integer is above 100."""
    found = first_integer(text)
    if found is None:
        return 0.0, f"no integer in the answer {text[:80]!r}; scored 0 as in the paper"
    value, _ = found
    if value >= NUM_SCORES:
        return 0.0, f"the first integer in the answer is {value}, outside 0..100; scored 0"
    return float(value), None
