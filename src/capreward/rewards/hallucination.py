"""A penalty for caption words the visuals do not support, from EMScore's token→frame matching.

For each content token of the caption (see :func:`~capreward.metrics.token_support.content_mask`), EMScore's
fine-grained matching gives the cosine similarity of its CLIP token embedding to the best-matching
frame. Tokens below ``threshold`` are "unsupported"; each costs ``claim_cost`` (default 0.5): the penalty
is ``-min(1, claim_cost * #unsupported)``, in [-1, 0], 0 when every content word finds a matching frame,
and the same for one false word alone or after many true ones (``claim_cost=None``: minus their
(idf-)weighted fraction, an average that a long caption dilutes).

Calibration: per-token similarities depend on the CLIP model (and on frame sampling), so the threshold
should be set from data with :meth:`HallucinationPenalty.calibrate`: it takes captions known to be
correct for their visuals and sets the threshold so that at most 5% (``quantile``) of correct captions
get any word flagged (a conformal order statistic of each caption's lowest content-word similarity;
``unit="token"``: of correct content words), which needs at least 19 known-good captions at 5%. The default threshold
(:data:`DEFAULT_THRESHOLD`) is only a starting point for OpenAI ViT-B/32-sized models, not a
measured value.

Behaviour on foils (one object word swapped, e.g. "a red image" -> "a blue image"): the swapped word
has no matching frame, so its similarity drops below the threshold and it is flagged. CLIP's text tower
is causal, so the tokens *after* the swap see it too and usually drop as well ("image" in "a blue
image" on a red clip): the penalty moves by the swapped word's share of the content weight or more.
CLIP's causal text tower also lets earlier words carry a later one: after "a red red red red red", the
token "blue" has seen five reds and matches a red frame. So each content word is also judged alone
(``context_free``, default on: the word encoded as a caption of its own) and its similarity is the lower
of the two, so a wrong word is flagged wherever it stands.

What is never content: function words (:data:`~capreward.metrics.token_support.STOP_WORDS`, or low idf) and
generic words that name the medium or nothing (:data:`~capreward.metrics.token_support.GENERIC_WORDS`:
"image", "picture", "photo", "something"), which no visual supports or contradicts. A caption with no
content word at all ("a", "image", "a picture.") says nothing the visual supports: it gets
``empty_penalty`` (default -1, a wrong caption's value), so saying nothing never earns more than an
honest guess (the reward contract: docs/design/reward-contract.md). Content is decided by idf when an
idf corpus is given; a caption whose words idf finds all frequent but the word lists call content (a
small corpus) has its list words judged, never the empty penalty.

A CLIP only knows the words it was trained on: with the random-weight tiny CLIP of the tests the
similarities carry no meaning; with :mod:`capreward.testing.trained_clip` (a tiny CLIP trained on
colour words) only colour words are meaningful. tests/test_hallucination.py measures the foil
behaviour with the latter on colour-tinted frames of the sample clips.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from ..metrics.token_support import GENERIC_WORDS, STOP_WORDS, SupportReport
from ..scorers.emscore import TokenAlignment
from ..scorers.hallucination import (DEFAULT_CLAIM_COST, DEFAULT_EMPTY_PENALTY, DEFAULT_IDF_THRESHOLD,  # noqa: F401
                                    DEFAULT_THRESHOLD, Hallucination, checked_claim_cost, checked_options)
from ..scorers.hallucination import Adjusted as _Adjusted  # noqa: F401  (its name before the scorer existed)
from .base import GroupScores
from .hooks import RewardHooks
from .metric_reward import MetricReward


class HallucinationHooks(RewardHooks):
    """The hallucination penalty: builds the EMScore it reads token alignments from; the value is the
    :class:`~capreward.scorers.hallucination.Hallucination` penalty at the reward's settings; sub-scores
    ``content_tokens``, ``unsupported_tokens`` and ``truncated``. References are never used."""

    scorer = "capreward.scorers.emscore:EMScore"
    fixed = {"use_references": False}
    #: the sub-scores a composite reads as this reward's verdict on a caption's claims (how many content
    #: words, how many unsupported): see CompositeReward's ``verifier``
    verdict_metrics = ("content_tokens", "unsupported_tokens")

    def options(
        self,
        *,
        threshold: float = DEFAULT_THRESHOLD,
        idf_threshold: float | None = None,
        stop_words: Iterable[str] = STOP_WORDS,
        generic_words: Iterable[str] = GENERIC_WORDS,
        empty_penalty: float = DEFAULT_EMPTY_PENALTY,
        context_free: bool = True,
        idf_weighting: bool = True,
        claim_cost: float | None = DEFAULT_CLAIM_COST,
    ) -> dict[str, Any]:
        return {"threshold": float(threshold), "idf_threshold": idf_threshold, "stop_words": frozenset(stop_words),
                "generic_words": frozenset(w.lower() for w in generic_words), "empty_penalty": empty_penalty,
                "context_free": bool(context_free), "idf_weighting": idf_weighting, "claim_cost": claim_cost}

    def check(self, spec, options, scorer_options) -> None:
        options["empty_penalty"] = checked_options(options["empty_penalty"], scorer_options)
        options["claim_cost"] = checked_claim_cost(options["claim_cost"])

    def analysis(self, reward) -> Hallucination:
        """The :class:`~capreward.scorers.hallucination.Hallucination` scorer on the reward's EMScore, with
        its current settings (``threshold`` ...)."""
        return Hallucination(
            reward.scorer, threshold=reward.threshold, idf_threshold=reward.idf_threshold,
            stop_words=reward.stop_words, generic_words=reward.generic_words, empty_penalty=reward.empty_penalty,
            context_free=reward.context_free, idf_weighting=reward.idf_weighting, claim_cost=reward.claim_cost,
        )

    def metric_names(self, reward) -> tuple[str, ...]:
        """``content_tokens``, ``unsupported_tokens`` and ``truncated``."""
        return ("content_tokens", "unsupported_tokens", "truncated")

    def score_group(self, reward, captions, visuals, kind, references, visual_ids) -> GroupScores:
        analysis = self.analysis(reward)
        alignments = analysis.alignments(captions, visuals, kind, visual_ids)
        reports = [analysis.report_for(a) for a in alignments]
        return GroupScores(
            scores=[r.penalty for r in reports],
            metrics={
                "content_tokens": [float(len(r.tokens)) for r in reports],
                "unsupported_tokens": [float(sum(r.unsupported)) for r in reports],
                "truncated": [float(t) for t in alignments.truncated],
            },
        )


class HallucinationPenalty(MetricReward):
    """Reward in [-1, 0]: ``-min(1, claim_cost * n)`` with n the number of content tokens whose best frame
    similarity is below ``threshold`` (the same for a false word alone or after many true ones).

    Args:
        threshold: similarity below which a content token is unsupported (see `calibrate()`).
        idf_threshold: with ``idf`` given, tokens whose idf weight is at most this are function words
            (default ln 2); without idf, `STOP_WORDS` decides.
        stop_words: the function-word list used without idf.
        generic_words: words never counted as content (default
            `GENERIC_WORDS`: "image", "picture", "photo", ...).
        empty_penalty: the penalty of a caption without a content word, in [-1, 0] (default -1: no more
            than a wrong caption's, so saying nothing never pays more than a guess).
        context_free: also judge each content word encoded alone and keep the lower similarity, so words
            before it cannot carry a wrong word ("a red red red blue image"); costs one more text-encoder
            batch (the visuals' embeddings are cached). False: only the word in its caption.
        idf_weighting: in the fraction (``claim_cost=None``), weigh tokens by their idf weight (only
            with ``idf``); else every content token counts 1.
        claim_cost: the price of each unsupported content token, in (0, 1] (default 0.5). None: minus the
            (idf-)weighted fraction of content tokens that are unsupported (an average that a long
            caption dilutes: one false word after 40 true ones costs 1/41).

    The EMScore options (``model``, ``device``, ``idf``, ``frames``, ``backbone``, ...) and the column options
    of `CaptionReward` are keywords too (the signature lists them); references are not used.

    Logs ``content_tokens`` and ``unsupported_tokens`` (batch means) as sub-scores; a
    `CompositeReward` reads them as its verifier's verdict (``verdict_metrics``).

    Examples:
        >>> from capreward.testing import colour_image, trained_clip_path
        >>> clip = str(trained_clip_path())   # a tiny CLIP trained to know colour words (seconds, then cached)
        >>> red = colour_image("red")
        >>> from capreward.rewards import HallucinationPenalty
        >>> penalty = HallucinationPenalty(model=clip)
        >>> penalty(None, ["a red image.", "a blue image.", "a blue green image.", "an image."], image=[red] * 4)
        [0.0, -0.5, -1.0, -1.0]
    """

    __name__ = "hallucination"
    metric = "hallucination"

    # ------------------------------------------------------------------ analysis
    def analysis(self) -> Hallucination:
        """The `Hallucination` scorer on this reward's EMScore, with
        its current settings (``threshold`` ...)."""
        return self.hooks.analysis(self)

    def _uses_idf(self) -> bool:
        return self.scorer.idf_table is not None

    def report_for(self, alignment: TokenAlignment, threshold: float | None = None) -> SupportReport:
        """The `SupportReport` of one caption's alignment at ``threshold`` (default: the current one).

        Args:
            alignment: the caption's alignment (:meth:`alignments`).
            threshold: the similarity below which a content token is unsupported (None: :attr:`threshold`).

        Returns:
            The caption's `SupportReport`.
        """
        return self.analysis().report_for(alignment, threshold)

    def _content(self, alignment: TokenAlignment) -> list[bool]:
        return self.analysis().content(alignment)

    def alignments(
        self, captions: Sequence[str], visuals: Sequence[Any], kind: str = "video", ids: Sequence[str | None] | None = None
    ) -> list[TokenAlignment]:
        """EMScore's token→frame alignment of each caption with its visual (``kind`` "video" or "image")."""
        return self.analysis().alignments(captions, visuals, kind, ids)

    def reports(
        self, captions: Sequence[str], visuals: Sequence[Any], kind: str = "video", ids: Sequence[str | None] | None = None
    ) -> list[SupportReport]:
        """Per caption: penalty, content tokens, their similarities, which are flagged, and their positions
        in the alignment's token list (``index``, ``flagged_index``; SOS is position 0)."""
        return [self.report_for(a) for a in self.alignments(captions, visuals, kind, ids)]

    def calibrate(
        self, captions: Sequence[str], visuals: Sequence[Any], kind: str = "video", quantile: float = 0.05,
        unit: str = "caption",
    ) -> float:
        """Set ``threshold`` so that at most ``quantile`` of known-good captions (``unit="caption"``) or of
        their content words (``unit="token"``) are flagged
        (`Hallucination.calibrate`).

        Args:
            captions: known-good captions (at least ``ceil(1 / quantile) - 1`` with a content word).
            visuals: their visuals (one per caption).
            kind: ``"video"`` or ``"image"``.
            quantile: the nominal false-flag rate.
            unit: ``"caption"`` or ``"token"``.

        Returns:
            The new threshold.

        Raises:
            ValueError: too few known-good items for ``quantile``, or an unknown ``unit``.
        """
        self.threshold = self.analysis().calibrate(captions, visuals, kind, quantile, unit)
        return self.threshold
