"""Pure math of the hallucination penalty: which caption tokens are content, which are unsupported,
what the unsupported ones cost and where the threshold goes.

Input is EMScore's token→frame alignment (:class:`~capreward.scorers.emscore.TokenAlignment`): for each
CLIP token of a caption, the cosine similarity to its best-matching frame and its idf weight. A
*content* token is a word-piece with letters that is not a function word; it is *unsupported* when its
best visual match falls below a similarity threshold.

Pricing (:func:`support_report`): with a ``claim_cost`` c (the penalty's default, 0.5) every unsupported
content token costs c, whatever else the caption says::

    penalty = -min(1, c * #unsupported)

so a false word after 80 true sentences costs what it costs alone, and restating true words buys nothing
back. Without a ``claim_cost`` the penalty is the (idf-)weighted *fraction* of content tokens that are
unsupported, an average that a long caption dilutes (one false word in 40 costs 1/40).

Calibration (:func:`conformal_threshold`): the threshold is an order statistic of known-good
similarities chosen so that a new known-good caption (or token) is flagged with probability at most the
nominal rate, by exchangeability, however few calibration items there are; too few to reach the rate is
an error, not a silently higher rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from collections.abc import Iterable, Sequence

import numpy as np

#: English function words (articles, pronouns, auxiliaries, prepositions, conjunctions, fillers) that
#: carry no visual content; used when no idf corpus says which tokens are frequent.
STOP_WORDS = frozenset(
    """
    a an the this that these those there here some any each every all both either neither no not
    i me my mine we us our ours you your yours he him his she her hers it its they them their theirs
    one ones someone something somebody anyone anything other another such own same
    am is are was were be been being have has had having do does did doing will would shall should
    can could may might must
    of in on at to from by with without into onto upon over under above below between among through
    during before after about against along around across behind beside near off out up down toward
    towards while within
    and or but nor so yet if then than as because since until unless although though whether
    also just very too quite rather really only still even again more most much many few less least
    what which who whom whose when where why how
    s t d ll m o re ve y
    """.split()
)

#: Words that name the medium or nothing in particular ("a picture of ...", "something"): a caption that
#: says only these says nothing a visual could support or contradict, so they are never content.
GENERIC_WORDS = frozenset(
    """
    image images picture pictures pic pics photo photos photograph photographs photography video videos
    clip clips footage frame frames scene scenes view views shot shots snapshot screenshot illustration
    thing things something stuff depict depicts depicted depicting show shows showing shown
    """.split()
)

SPECIAL_TOKENS = frozenset({"<sos>", "<eos>"})


def _word(token: str) -> str:
    return "".join(ch for ch in token.lower() if ch.isalpha())


def content_mask(
    tokens: Sequence[str],
    weights: Sequence[float] | None = None,
    idf_threshold: float | None = None,
    stop_words: Iterable[str] = STOP_WORDS,
    generic_words: Iterable[str] = (),
) -> list[bool]:
    """For each token, whether it is content.

    Special tokens, tokens without letters (punctuation, numbers) and ``generic_words`` (e.g.
    :data:`GENERIC_WORDS`: "image", "photo") never are. With ``idf_threshold`` (and idf ``weights``) a
    token is content iff its idf weight exceeds the threshold, so frequent tokens (function words in any
    language) are ignored; otherwise iff it is not in ``stop_words``.
    """
    stop = frozenset(stop_words)
    generic = frozenset(generic_words)
    out = []
    for j, tok in enumerate(tokens):
        word = _word(tok)
        if tok in SPECIAL_TOKENS or not word or word in generic:
            out.append(False)
        elif idf_threshold is not None and weights is not None:
            out.append(float(weights[j]) > idf_threshold)
        else:
            out.append(word not in stop)
    return out


@dataclass
class SupportReport:
    """One caption's verdict: ``penalty`` in [-1, 0] (see :func:`support_report`), the content ``tokens``
    with their ``similarity`` and whether each is ``unsupported``, and ``index``: each content token's
    position in the full token list it was taken from (the alignment's ``tokens``, SOS at 0)."""

    penalty: float
    tokens: list[str]
    similarity: list[float]
    unsupported: list[bool]
    index: list[int] = field(default_factory=list)

    @property
    def flagged(self) -> list[str]:
        return [t for t, u in zip(self.tokens, self.unsupported) if u]

    @property
    def flagged_index(self) -> list[int]:
        """Positions of the flagged tokens in the full token list (what ``hallucination.flagged`` holds
        in ``capreward score`` results, indexing ``alignment.tokens``)."""
        return [j for j, u in zip(self.index, self.unsupported) if u]


def support_report(
    tokens: Sequence[str],
    similarity: Sequence[float],
    threshold: float,
    content: Sequence[bool],
    weights: Sequence[float] | None = None,
    empty_penalty: float = 0.0,
    claim_cost: float | None = None,
) -> SupportReport:
    """One caption's :class:`SupportReport`: its content tokens (``content``), which of them are
    unsupported (similarity strictly below ``threshold``) and the penalty.

    Args:
        tokens: the caption's tokens (the alignment's, SOS first).
        similarity: per token, the similarity to its best-matching frame.
        threshold: similarity below which a content token is unsupported.
        content: per token, whether it is content (:func:`content_mask`).
        weights: per token, its weight in the fraction (idf); None: every token 1. Unused with a
            ``claim_cost``.
        empty_penalty: the penalty of a caption with no content token (or none of positive weight).
        claim_cost: the price of one unsupported content token: penalty ``-min(1, claim_cost *
            #unsupported)``, whatever the caption's length. None: minus the weighted fraction of content
            tokens that are unsupported (``-Σ_unsupported w / Σ_content w``, an average).

    Returns:
        The caption's :class:`SupportReport`.

    Raises:
        ValueError: the lists differ in length, or ``claim_cost`` is not a number in (0, 1].

    Examples:
        >>> tokens, sims = ["<sos>", "a", "red", "dog", "<eos>"], [0.9, 0.1, 0.30, 0.15, 0.9]
        >>> content = content_mask(tokens)
        >>> support_report(tokens, sims, 0.2, content).penalty             # one of two content tokens
        -0.5
        >>> support_report(tokens, sims, 0.2, content, claim_cost=0.5).penalty
        -0.5
        >>> long = ["<sos>"] + ["red"] * 40 + ["dog", "<eos>"]
        >>> long_sims = [0.9] + [0.3] * 40 + [0.15, 0.9]
        >>> support_report(long, long_sims, 0.2, content_mask(long)).penalty   # diluted by 40 true words
        -0.024390243902439025
        >>> support_report(long, long_sims, 0.2, content_mask(long), claim_cost=0.5).penalty
        -0.5
    """
    if not (len(tokens) == len(similarity) == len(content)) or (weights is not None and len(weights) != len(tokens)):
        raise ValueError("tokens, similarity, content (and weights) must have one entry per token")
    if claim_cost is not None and not (isinstance(claim_cost, (int, float)) and 0.0 < float(claim_cost) <= 1.0):
        raise ValueError(f"claim_cost must be a number in (0, 1] or None, got {claim_cost!r}")
    idx = [j for j, c in enumerate(content) if c]
    w = [1.0 if weights is None or claim_cost is not None else max(float(weights[j]), 0.0) for j in idx]
    sims = [float(similarity[j]) for j in idx]
    bad = [s < threshold for s in sims]
    total = sum(w)
    if total <= 0:
        penalty = float(empty_penalty)
    elif claim_cost is not None:
        penalty = 0.0 - min(1.0, float(claim_cost) * sum(bad))
    else:
        penalty = -sum(wi for wi, b in zip(w, bad) if b) / total
    return SupportReport(penalty=penalty, tokens=[tokens[j] for j in idx], similarity=sims, unsupported=bad, index=idx)


def conformal_threshold(scores: Sequence[float], rate: float) -> float:
    """The threshold t such that a new item exchangeable with ``scores`` (the similarities of known-good
    captions, or of their content tokens) falls strictly below t with probability at most ``rate``: the
    k-th smallest score with ``k = floor(rate * (n + 1))`` (a new item is below it iff its rank among the
    n + 1 is at most k: probability k / (n + 1) <= rate; exactly ``rate`` when ``rate * (n + 1)`` is a
    whole number). ``rate=0`` gives the smallest score (nothing known-good below it).

    Args:
        scores: the known-good items' scores.
        rate: the nominal false-flag rate, in [0, 1).

    Returns:
        The threshold.

    Raises:
        ValueError: ``rate`` outside [0, 1), no or non-finite scores, or too few scores to reach ``rate``
            (``k = 0``: at least ``ceil(1 / rate) - 1`` are needed).

    Examples:
        >>> conformal_threshold([0.5, 0.1, 0.4, 0.3, 0.2] * 4, 0.1)   # n = 20, k = floor(2.1) = 2
        0.1
        >>> conformal_threshold(list(range(100)), 0.05)                   # k = floor(5.05) = 5: the 5th smallest
        4.0
    """
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"rate must be in [0, 1), got {rate}")
    values = np.sort(np.asarray([float(s) for s in scores], dtype=np.float64))
    if values.size == 0:
        raise ValueError("no content tokens to calibrate on")
    if not np.isfinite(values).all():
        raise ValueError("similarities must be finite")
    if rate == 0.0:
        return float(values[0])
    k = math.floor(rate * (values.size + 1))
    if k < 1:
        need = math.ceil(1.0 / rate) - 1
        raise ValueError(
            f"calibrating at a false-flag rate of {rate:g} needs at least {need} known-good items, got {values.size}: "
            f"give more known-good captions (or a higher rate)"
        )
    return float(values[k - 1])
