"""Reading a judge's log-probabilities: the checks every reader of judge output shares.

A backend reports log-probabilities: of each generated token, of the alternatives listed at a position
(``top_logprobs``), of prompt tokens (``prompt_logprobs``), of asked token ids (SGLang's
``token_ids_logprob``, vLLM's ``logprob_token_ids``). Every reader (digit trees, yes/no, option letters,
FLEUR's digits, G-VEval's alternatives) turns them into probabilities through
:func:`listed_probabilities`, which refuses what no model writes: a value that is not a finite number at
most 0 (``math.exp(1000.0)`` raises ``OverflowError``; "Yes" at +5 would read as p = 148), and
alternatives at one position whose probabilities sum above 1. A refusal is a
:class:`MalformedAnswer` (a ``ValueError``): a remote backend asks the request again and never caches the
answer, a reader gives that sample no score and the reason.

Pure functions on numbers and strings (no model code).
"""

from __future__ import annotations

import math
from typing import Any
from collections.abc import Iterable

from ..errors import CaprewardError

#: The largest log-probability a backend may report: a log-softmax value is at most 0, and a server's
#: float rounding can leave a hair above it (read as 0). Anything larger ("Yes": +5) is a lie.
LOGPROB_SLACK = 1e-4
#: How far above 1 the probabilities listed at one position may sum (the rounding of each listed value).
MASS_SLACK = 1e-3
#: The most characters one token's text may hold.
MAX_TOKEN_CHARS = 1024
#: The most alternatives listed at one position.
MAX_ALTERNATIVES = 1 << 14


class MalformedAnswer(CaprewardError, ValueError):
    """A backend's answer that no reader may use: a log-probability that is not a finite number at most
    0, alternatives listed at one position whose probabilities sum above 1, or an answer larger than was
    asked. A remote backend asks such an answer again like a failed request and never caches it; a
    reader gives its sample no score, with this message as the reason.

    Examples:
        >>> from capreward.metrics.logprobs import MalformedAnswer, checked_logprob
        >>> try:
        ...     checked_logprob(1000.0, "the logprob of '9'")
        ... except MalformedAnswer as exc:
        ...     print(exc)
        the logprob of '9' is 1000.0: a log-probability is a finite number at most 0
    """


def checked_logprob(value: Any, where: str = "a log-probability") -> float:
    """``value`` as a log-probability: a finite number at most 0 (up to :data:`LOGPROB_SLACK` above 0,
    read as 0). vLLM's floor for a vanishing probability, -9999, is accepted (it reads as 0).

    Args:
        value: what the backend reported.
        where: what it is, for the error message.

    Returns:
        The log-probability, a float in [-inf, 0) ∪ {0}; never above 0.

    Raises:
        MalformedAnswer: ``value`` is not a number, is NaN or infinite, or is above 0.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MalformedAnswer(f"{where} is a {type(value).__name__}, not a number")
    number = float(value)
    if not math.isfinite(number) or number > LOGPROB_SLACK:
        raise MalformedAnswer(f"{where} is {number!r}: a log-probability is a finite number at most 0")
    return min(number, 0.0)


def listed_probabilities(pairs: Iterable[Any], where: str = "the alternatives") -> list[tuple[str, float]]:
    """The probabilities of the alternatives a backend listed at one position: the one way every reader
    turns listed ``(text, log-probability)`` pairs into probabilities.

    Each log-probability is checked (:func:`checked_logprob`), each text must be a string of at most
    :data:`MAX_TOKEN_CHARS` characters, at most :data:`MAX_ALTERNATIVES` may be listed, and the listed
    probabilities may sum to at most 1 (+ :data:`MASS_SLACK`): the entries are distinct tokens of one
    distribution, so more than 1 is a lie (three "Yes" at log-probability 0 would make P(yes) = 3).

    Args:
        pairs: ``(text, log-probability)`` pairs (a mapping's ``items()``, a ranked tuple).
        where: what is read, for the error message.

    Returns:
        ``[(text, probability), ...]`` in the order given.

    Raises:
        MalformedAnswer: naming the first entry that is not a valid alternative, or the total.

    Examples:
        >>> import math
        >>> from capreward.metrics.logprobs import listed_probabilities
        >>> [(t, round(p, 2)) for t, p in listed_probabilities([("7", math.log(0.6)), ("8", math.log(0.3))])]
        [('7', 0.6), ('8', 0.3)]
    """
    out: list[tuple[str, float]] = []
    total = 0.0
    for n, pair in enumerate(pairs):
        if n >= MAX_ALTERNATIVES:
            raise MalformedAnswer(f"{where} list more than {MAX_ALTERNATIVES} entries")
        try:
            text, logprob = pair
        except (TypeError, ValueError):
            raise MalformedAnswer(f"{where}: entry {n} is not a (text, log-probability) pair") from None
        if not isinstance(text, str):
            raise MalformedAnswer(f"{where}: entry {n} has a {type(text).__name__} for its text")
        if len(text) > MAX_TOKEN_CHARS:
            raise MalformedAnswer(f"{where}: entry {n} is a token of {len(text)} characters (at most {MAX_TOKEN_CHARS})")
        p = math.exp(checked_logprob(logprob, f"{where}: entry {n} ({text[:20]!r})"))
        total += p
        out.append((text, p))
    if total > 1.0 + MASS_SLACK:
        raise MalformedAnswer(f"{where} sum to a probability of {total:.6g}, above 1")
    return out


__all__ = ["LOGPROB_SLACK", "MASS_SLACK", "MAX_ALTERNATIVES", "MAX_TOKEN_CHARS", "MalformedAnswer", "checked_logprob",
           "listed_probabilities"]
