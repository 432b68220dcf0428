"""VisCE² math: the score is the first integer of the judge's answer.

As the released code (``Silviase/VisCE2`` head, ``src/data/capeval_dataset.py``'s ``get_digit_scores``):
the first match of ``[0-9]+`` (ASCII digits only, so "٨٥" or "８５" are not numbers), read as a number,
and 0 when there is none. An integer above 100 is returned as is, as the release does, with a warning
(the prompt asks for 0..100; a reward guards its own range). The expected score over 0..100 reuses
:func:`capreward.metrics.gveval.expected_score`.
"""

from __future__ import annotations

import re

from .gveval import NUM_SCORES, alternatives_distribution, expected_score  # noqa: F401  (re-exported)

#: The release's pattern: ASCII digits only (``\d`` would also match other scripts' digits).
_INTEGER = re.compile(r"[0-9]+")


#: The structured-output constraint of a VisCE² rating (vLLM's ``structured_outputs={"regex": ...}``):
#: text without ASCII digits, then an integer 0..100 as the first integer, then anything that does not
#: continue it; every answer it admits is read by :func:`parse_visce2_answer` without a warning.
ANSWER_REGEX = "[^0-9]*(100|[1-9]?[0-9])([^0-9][\\s\\S]*)?"


def first_integer(text: str) -> tuple[int, int] | None:
    """``(value, start offset)`` of the first run of ASCII digits in ``text``, or None."""
    match = _INTEGER.search(text)
    if match is None:
        return None
    return int(match.group(0)), match.start()


def parse_visce2_answer(text: str) -> tuple[float, str | None]:
    """The VisCE² score of an answer, as the release reads it.

    Returns ``(score, None)`` for a first integer in 0..100; ``(0.0, reason)`` when the answer holds no
    ASCII integer (the release scores 0); ``(value, warning)`` when the first integer is above 100: the
    value is kept as the release keeps it, and the warning says it lies outside 0..100.
    """
    found = first_integer(text)
    if found is None:
        return 0.0, f"no integer in the answer {text[:80]!r}; scored 0 as in the paper"
    value, start = found
    if value >= NUM_SCORES:
        match = _INTEGER.match(text, start)
        assert match is not None  # first_integer found one there
        digits = match.group(0)  # float() of the digits, as the release: inf, never an error
        return float(digits), f"the first integer in the answer is {digits[:20]}, outside 0..100 (kept as the release does)"
    return float(value), None
