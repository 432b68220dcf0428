"""G-VEval math: reading "$N$" / Greek-letter scores and expected scores over the integers 0..100.

Pure functions on strings, dicts and arrays (no model code), shared with VisCE²'s expected score.

- Remote judges (GPT-4o, vLLM) return the top alternatives of each generated token. The released
  G-VEval code takes the token right after the first token containing "$" (ACCR: "α", "β", "ψ", "δ"),
  keeps the alternatives whose text is exactly "0".."100", renormalises them and takes Σ n·p(n):
  :func:`alternatives_distribution`, :func:`alternatives_after_marker`.
- A local judge whose tokenizer splits numbers into digits gives the exact distribution over 0..100
  from a few decode steps: :func:`digit_tree_distribution` combines them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np

from .logprobs import MalformedAnswer, listed_probabilities

#: Scores are the integers 0..100.
NUM_SCORES = 101
SCORE_STRINGS = tuple(str(n) for n in range(NUM_SCORES))
_SCORE_INDEX = {s: n for n, s in enumerate(SCORE_STRINGS)}

OVERALL_MARKER = "$"
#: ACCR dimension -> the Greek letter that wraps its score in the released prompts.
ACCR_MARKERS: dict[str, str] = {"accuracy": "α", "completeness": "β", "conciseness": "ψ", "relevance": "δ"}


def parse_marked_score(text: str, marker: str = OVERALL_MARKER) -> int | None:
    """The integer written right after the first ``marker`` in ``text`` ("... is $85$." -> 85).

    Whitespace between the marker and the digits is allowed. Returns None when the first marker is not
    followed by an integer, or the integer is outside 0..100.
    """
    at = text.find(marker)
    if at < 0:
        return None
    match = re.match(r"\s*(\d+)", text[at + len(marker) :])
    if match is None:
        return None
    value = int(match.group(1))
    return value if value < NUM_SCORES else None


#: A regular expression for the integers 0..100 as a judge writes them (no leading zeros).
SCORE_PATTERN = "(100|[1-9]?[0-9])"


def answer_regex(markers: Sequence[str]) -> str:
    """The structured-output constraint of a G-VEval answer: free text without the markers, then each
    marker, a score 0..100 and the marker again ("... $85$", ACCR "... α85α ... β70β ..."), each
    followed by free text without markers. Sent as vLLM's ``structured_outputs={"regex": ...}``; every
    answer it admits is read by :func:`parse_marked_score`."""
    free = "[^" + "".join(re.escape(m) for m in markers) + "]*"
    return free + "".join(re.escape(m) + SCORE_PATTERN + re.escape(m) + free for m in markers)


def alternatives_distribution(
    top: Mapping[str, float] | Sequence[tuple[str, float]], strip: bool = False
) -> np.ndarray | None:
    """Renormalised probabilities (101,) over 0..100 from one token's top alternatives.

    ``top`` maps token text to log-probability, or lists ``(text, log-probability)`` pairs in the
    backend's order. Only texts that are exactly "0".."100" count; when one text is listed twice the
    later entry wins, as in the released ``normalize_responses`` (a dict assignment per alternative).
    With ``strip``, texts are compared after removing surrounding whitespace and alternatives that map to
    the same number add up. Returns None when no alternative is a score or their probabilities sum to
    0. Entries sum to 1. Raises :class:`~capreward.judges.protocol.MalformedAnswer` when the listed
    log-probabilities are not a distribution's (:func:`~capreward.judges.protocol.listed_probabilities`:
    one above 0, NaN, infinite, or a total above 1).
    """
    pairs = top.items() if isinstance(top, Mapping) else top
    latest: dict[str, float] = {}
    for text, p in listed_probabilities(pairs, "the score token's alternatives"):
        latest.pop(text, None)  # re-insert: the later duplicate wins
        latest[text] = p
    probs = np.zeros(NUM_SCORES, dtype=np.float64)
    for text, p in latest.items():
        key = text.strip() if strip else text
        n = _SCORE_INDEX.get(key)
        if n is not None:
            probs[n] += p
    total = probs.sum()
    if not total > 0:
        return None
    return probs / total


def marker_token_index(token_texts: Sequence[str], marker: str) -> int | None:
    """Index of the first token whose text contains ``marker``, or None (the released search)."""
    return next((i for i, t in enumerate(token_texts) if marker in t), None)


def alternatives_after_marker(
    token_texts: Sequence[str], tops: Sequence[Mapping[str, float] | Sequence[tuple[str, float]]], marker: str
) -> tuple[np.ndarray | None, str | None]:
    """The renormalised score distribution at the token after the first token containing ``marker``.

    Returns ``(probs (101,) or None, reason or None)``; the reason says why there is no distribution
    (no marker, nothing after it, no score among the alternatives, alternatives that are no
    distribution's).
    """
    i = marker_token_index(token_texts, marker)
    if i is None:
        return None, f"no {marker!r} in the answer"
    if i + 1 >= len(tops):
        return None, f"the answer ends at {marker!r}"
    if not tops[i + 1]:
        return None, "the backend reported no alternatives (top_logprobs) for the score token"
    try:
        probs = alternatives_distribution(tops[i + 1])
    except MalformedAnswer as exc:
        return None, f"malformed answer: {exc}"
    if probs is None:
        top = tops[i + 1]
        listed = top.keys() if isinstance(top, Mapping) else [t for t, _ in top]
        shown = ", ".join(repr(t) for t in list(listed)[:5])
        return None, f"no alternative after {marker!r} is an integer 0..100 (got {shown})"
    return probs, None


def score_token_distribution(
    top: Mapping[str, float] | Sequence[tuple[str, float]],
) -> tuple[np.ndarray | None, str | None]:
    """The renormalised score distribution at a number's token found without a marker: its alternatives
    compared after stripping whitespace (:func:`alternatives_distribution` with ``strip``).

    Args:
        top: the token's alternatives (empty: none reported).

    Returns:
        ``(probs (101,) or None, reason or None)``; the reason says why there is no distribution (no
        alternative is a score, alternatives that are no distribution's).
    """
    try:
        probs = alternatives_distribution(top, strip=True) if top else None
    except MalformedAnswer as exc:
        return None, f"malformed answer: {exc}"
    return probs, None if probs is not None else "no alternative of the score token is an integer 0..100"


def expected_score(probs: np.ndarray) -> float:
    """Σ n·p(n) / Σ p(n) for a (101,) array of (possibly unnormalised) probabilities of 0..100.

    Returns a float in [0, 100]; raises ValueError when the probabilities do not sum to a positive number.
    """
    probs = np.asarray(probs, dtype=np.float64)
    if probs.shape != (NUM_SCORES,):
        raise ValueError(f"expected {NUM_SCORES} probabilities, got shape {probs.shape}")
    total = probs.sum()
    if not total > 0:
        raise ValueError("the score probabilities sum to 0")
    return float(np.dot(np.arange(NUM_SCORES), probs) / total)


def digit_tree_distribution(
    first: np.ndarray,
    end1: np.ndarray,
    second: np.ndarray,
    end2: np.ndarray,
    third_zero: float,
    end3: float,
) -> np.ndarray:
    """Exact probabilities (101,) of the answers "0".."100" written digit by digit, then ended.

    ``first[d]`` = p(d) at the score position; ``end1[d]`` = p(end | d); ``second[a, b]`` = p(b | a);
    ``end2[a, b]`` = p(end | a b); ``third_zero`` = p("0" | "10"); ``end3`` = p(end | "100"). "end" is any
    token that is not a digit. Only canonical numbers count ("05" is not 5): p(0) = first[0]·end1[0],
    p(d) = first[d]·end1[d], p(10a+b) = first[a]·second[a,b]·end2[a,b] for a ≥ 1, and
    p(100) = first[1]·second[1,0]·third_zero·end3. The entries sum to at most 1 (the rest is mass on
    non-numbers, leading zeros and numbers above 100).
    """
    first, end1 = np.asarray(first, np.float64), np.asarray(end1, np.float64)
    second, end2 = np.asarray(second, np.float64), np.asarray(end2, np.float64)
    if first.shape != (10,) or end1.shape != (10,) or second.shape != (10, 10) or end2.shape != (10, 10):
        raise ValueError("first/end1 must be (10,) and second/end2 (10, 10)")
    probs = np.zeros(NUM_SCORES, dtype=np.float64)
    probs[:10] = first * end1
    probs[10:100] = (first[1:, None] * second[1:] * end2[1:]).reshape(-1)
    probs[100] = first[1] * second[1, 0] * float(third_zero) * float(end3)
    return probs


def accr_mean(scores: Sequence[float]) -> float:
    """The ACCR overall score: the mean of the four dimension scores (NaN if any is NaN)."""
    if len(scores) != len(ACCR_MARKERS):
        raise ValueError(f"expected {len(ACCR_MARKERS)} ACCR scores, got {len(scores)}")
    return float(np.mean(np.asarray(scores, dtype=np.float64)))
