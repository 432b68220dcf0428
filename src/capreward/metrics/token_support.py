"""Pure math of the hallucination penalty: which caption tokens are content, which are unsupported.

Input is EMScore's token→frame alignment (:class:`~capreward.scorers.emscore.TokenAlignment`): for each
CLIP token of a caption, the cosine similarity to its best-matching frame and its idf weight. A
*content* token is a word-piece with letters that is not a function word; it is *unsupported* when its
best visual match falls below a similarity threshold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

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
    """One caption's verdict: ``penalty`` in [-1, 0] (minus the weighted fraction of content tokens
    that are unsupported; 0 when the caption has no content token), the content ``tokens`` with their
    ``similarity`` and whether each is ``unsupported``, and ``index``: each content token's position in
    the full token list it was taken from (the alignment's ``tokens``, SOS at 0)."""

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
) -> SupportReport:
    """Penalty = -Σ_{content, sim < threshold} w / Σ_{content} w, with w the token weights (all 1 when
    ``weights`` is None; idf weights weigh rare, informative words more); ``empty_penalty`` when the
    caption has no content token (or none of positive weight). Returns a :class:`SupportReport`."""
    if not (len(tokens) == len(similarity) == len(content)) or (weights is not None and len(weights) != len(tokens)):
        raise ValueError("tokens, similarity, content (and weights) must have one entry per token")
    idx = [j for j, c in enumerate(content) if c]
    w = [1.0 if weights is None else max(float(weights[j]), 0.0) for j in idx]
    sims = [float(similarity[j]) for j in idx]
    bad = [s < threshold for s in sims]
    total = sum(w)
    penalty = -sum(wi for wi, b in zip(w, bad) if b) / total if total > 0 else float(empty_penalty)
    return SupportReport(penalty=penalty, tokens=[tokens[j] for j in idx], similarity=sims, unsupported=bad, index=idx)


def quantile_threshold(similarities: Sequence[float], quantile: float) -> float:
    """The ``quantile`` (in [0, 1]) of the given token similarities (linear interpolation). Raises
    ValueError for an empty or non-finite list."""
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile must be in [0, 1], got {quantile}")
    values = np.asarray([float(s) for s in similarities], dtype=np.float64)
    if values.size == 0:
        raise ValueError("no content tokens to calibrate on")
    if not np.isfinite(values).all():
        raise ValueError("similarities must be finite")
    q = float(np.quantile(values, quantile))
    return q if not math.isnan(q) else float(values.min())
