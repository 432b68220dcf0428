"""The hallucination penalty as a scorer: caption words the visuals do not support, from EMScore's
token→frame matching.

For each content token of the caption (see :func:`~capreward.metrics.token_support.content_mask`),
EMScore's fine-grained matching gives the cosine similarity of its CLIP token embedding to the
best-matching frame. Tokens below ``threshold`` are "unsupported"; each costs ``claim_cost`` (default
0.5): the penalty is ``-min(1, claim_cost * #unsupported)``, in [-1, 0], the same for a false word alone
or after many true ones (``claim_cost=None``: minus their (idf-)weighted fraction, an average that a long
caption dilutes). A caption with no content word gets ``empty_penalty`` (default -1: saying nothing is
worth no more than saying something false; see docs/design/reward-contract.md). The design (calibration, foils, context-free reading, generic words, the empty caption's penalty) is
described in :mod:`capreward.rewards.hallucination`, whose reward wraps this scorer.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, cast
from collections.abc import Iterable, Sequence

from ..metrics.token_support import (GENERIC_WORDS, STOP_WORDS, SupportReport, conformal_threshold, content_mask,
                                     support_report)
from .contract import Scores
from .emscore import EMScore, TokenAlignment
from .hallucination_spec import checked_claim_cost, checked_options  # noqa: F401  (the scorer's and the reward's one check; imported from here before)

#: Starting threshold on token→frame cosine similarity; uncalibrated, call ``calibrate`` on your data.
DEFAULT_THRESHOLD = 0.2
#: With an idf corpus, tokens with idf <= ln 2 (in more than about half the captions) are function words.
DEFAULT_IDF_THRESHOLD = math.log(2.0)
#: The penalty of a caption without a content word: a wrong caption's (-1), so saying nothing never
#: earns more than a guess (the reward contract, docs/design/reward-contract.md).
DEFAULT_EMPTY_PENALTY = -1.0
#: The price of one unsupported content word: two false words reach the bottom of the range.
DEFAULT_CLAIM_COST = 0.5
#: What :meth:`Hallucination.calibrate` holds at the nominal false-flag rate: known-good captions
#: (a caption is flagged when any of its content words is) or their content words.
CALIBRATION_UNITS = ("caption", "token")


class Adjusted(list):
    """Alignments with context-free similarities, keeping the scorer's per-candidate ``truncated`` and its
    own (contextual) alignments as ``contextual``."""

    truncated: list[bool]
    contextual: list


@dataclass
class HallucinationResult:
    """Per caption: ``penalty`` in [-1, 0], its :class:`~capreward.metrics.token_support.SupportReport`
    (content tokens, similarities, which are flagged, ``flagged_index``: their positions in the alignment's
    token list, SOS at 0) and the alignment it was read from (context-free similarities with
    ``context_free``; ``alignments.contextual`` holds EMScore's own)."""

    penalty: list[float]
    reports: list[SupportReport]
    alignments: Sequence[TokenAlignment]

    @property
    def truncated(self) -> list[bool]:
        return list(getattr(self.alignments, "truncated", [False] * len(self.alignments)))


class Hallucination:
    """The hallucination penalty of captions against their visuals.

    Args:
        emscore: the :class:`~capreward.scorers.emscore.EMScore` whose alignment is read (else one is built
            from ``emscore_options``: ``model``, ``device``, ``idf``, ``idf_default``, ``frames``,
            ``batch_size``, ``backbone``, ...; ``idf="batch"`` is refused: a penalty would depend on its batch).
        threshold: similarity below which a content token is unsupported (see :meth:`calibrate`).
        idf_threshold: with idf, tokens whose idf weight is at most this are function words (default ln 2);
            without idf, :data:`~capreward.metrics.token_support.STOP_WORDS` decides.
        stop_words: the function-word list used without idf.
        generic_words: words never counted as content ("image", "picture", "photo", ...).
        empty_penalty: the penalty of a caption without a content word, in [-1, 0] (default -1: no more
            than a wrong caption's).
        context_free: also judge each content word encoded alone and keep the lower similarity.
        idf_weighting: in the fraction (``claim_cost=None``), weigh tokens by their idf weight (only with
            idf); else every content token counts 1.
        claim_cost: the price of each unsupported content token (default 0.5): the penalty is
            ``-min(1, claim_cost * #unsupported)``, whatever the caption's length. None: minus the
            (idf-)weighted fraction of content tokens that are unsupported (an average: diluted by a long
            caption's true words).

    The EMScore options not named here go to :class:`~capreward.scorers.emscore.EMScore` (its signature
    lists them: :attr:`forwards_kwargs_to`).

    Examples:
        >>> from capreward.backbones import CLIPBackbone
        >>> from capreward.scorers.hallucination import Hallucination
        >>> from capreward.testing import tiny_clip_factory
        >>> import numpy as np
        >>> scorer = Hallucination(backbone=CLIPBackbone(tiny_clip_factory(seed=0)), frames=2)
        >>> res = scorer.score(["a red car"], images=[np.zeros((32, 32, 3), np.uint8)])
        >>> -1.0 <= res.penalty[0] <= 0.0
        True
    """

    #: where ``**emscore_options`` go (the options a reward or Metric built on it shows and checks)
    forwards_kwargs_to = EMScore

    def __init__(
        self,
        emscore: EMScore | None = None,
        *,
        threshold: float = DEFAULT_THRESHOLD,
        idf_threshold: float | None = None,
        stop_words: Iterable[str] = STOP_WORDS,
        generic_words: Iterable[str] = GENERIC_WORDS,
        empty_penalty: float = DEFAULT_EMPTY_PENALTY,
        context_free: bool = True,
        idf_weighting: bool = True,
        claim_cost: float | None = DEFAULT_CLAIM_COST,
        **emscore_options: Any,
    ):
        empty_penalty = checked_options(empty_penalty, emscore_options)
        self.claim_cost = checked_claim_cost(claim_cost)
        self.emscore = emscore if emscore is not None else EMScore(**emscore_options)
        self.threshold = float(threshold)
        self.idf_threshold = idf_threshold
        self.stop_words = frozenset(stop_words)
        self.generic_words = frozenset(w.lower() for w in generic_words)
        self.empty_penalty = empty_penalty
        self.context_free = bool(context_free)
        self.idf_weighting = idf_weighting

    @property
    def backbone(self) -> Any:
        """The CLIP its EMScore reads (shared with the other CLIP metrics of a composite or a job)."""
        return self.emscore.backbone

    def uses_idf(self) -> bool:
        return self.emscore.idf_table is not None

    def content(self, alignment: TokenAlignment) -> list[bool]:
        """Which tokens of ``alignment`` are content words: with idf, those of idf above the idf threshold;
        when idf leaves none (a small corpus where every word is frequent) but the word lists find
        some, the word lists' (a caption that says something is never judged as one that says nothing)."""
        lists = content_mask(alignment.tokens, None, None, self.stop_words, self.generic_words)
        if not self.uses_idf():
            return lists
        idf_threshold = self.idf_threshold if self.idf_threshold is not None else DEFAULT_IDF_THRESHOLD
        by_idf = content_mask(alignment.tokens, alignment.weight, idf_threshold, self.stop_words, self.generic_words)
        return by_idf if any(by_idf) else lists

    def report_for(self, alignment: TokenAlignment, threshold: float | None = None) -> SupportReport:
        """The :class:`SupportReport` of one caption's alignment at ``threshold`` (default: the current one)."""
        content = self.content(alignment)
        weights = alignment.weight if (self.uses_idf() and self.idf_weighting) else None
        if weights is not None and not any(float(weights[j]) > 0 for j, c in enumerate(content) if c):
            weights = None  # the word lists' content (idf found none): every word counts 1
        return support_report(
            alignment.tokens, alignment.similarity, self.threshold if threshold is None else threshold,
            content, weights, empty_penalty=self.empty_penalty, claim_cost=self.claim_cost,
        )

    def alignments(
        self, captions: Sequence[str], visuals: Sequence[Any], kind: str = "video", ids: Sequence[str | None] | None = None
    ) -> Sequence[TokenAlignment]:
        """EMScore's token→frame alignment of each caption with its visual (``kind`` "video" or "image"),
        with context-free similarities when ``context_free``."""
        if kind not in ("video", "image"):
            raise ValueError(f"kind must be 'video' or 'image', got {kind!r}")
        result = self.emscore.score(
            list(captions),
            videos=visuals if kind == "video" else None,
            images=visuals if kind == "image" else None,
            video_ids=ids,
        )
        alignment = result.alignment
        assert alignment is not None  # EMScore aligns every text caption
        if not self.context_free:
            return alignment
        adjusted = Adjusted(self._context_free(list(alignment), visuals, kind, ids))
        adjusted.truncated = list(getattr(alignment, "truncated", [False] * len(adjusted)))
        adjusted.contextual = list(alignment)  # EMScore's own alignment, for writers that show it
        return adjusted

    def _context_free(
        self, alignments: list[TokenAlignment], visuals: Sequence[Any], kind: str, ids: Sequence[str | None] | None
    ) -> list[TokenAlignment]:
        """``alignments`` with each content token's similarity lowered to its similarity when encoded
        alone (one scorer call for every distinct (word, visual) pair of the batch)."""
        pairs: dict[tuple[str, int], int] = {}
        for i, a in enumerate(alignments):
            for j, is_content in enumerate(self.content(a)):
                if is_content:
                    pairs.setdefault((a.tokens[j].strip(), i), len(pairs))
        if not pairs:
            return alignments
        order = list(pairs)
        alone = self.emscore.score(
            [word for word, _ in order],
            videos=[visuals[i] for _, i in order] if kind == "video" else None,
            images=[visuals[i] for _, i in order] if kind == "image" else None,
            video_ids=None if ids is None else [ids[i] for _, i in order],
        ).alignment
        assert alone is not None  # EMScore aligns every text caption
        single: list[float] = []
        for k in range(len(order)):
            a = alone[k]
            sims = [s for t, s in zip(a.tokens, a.similarity) if any(ch.isalpha() for ch in t) and t not in ("<sos>", "<eos>")]
            single.append(min(sims) if sims else math.inf)
        out = []
        for i, a in enumerate(alignments):
            sims = list(a.similarity)
            for j, is_content in enumerate(self.content(a)):
                if is_content:
                    sims[j] = min(float(sims[j]), single[pairs[(a.tokens[j].strip(), i)]])
            out.append(dataclasses.replace(a, similarity=sims))
        return out

    def score(
        self, captions: Sequence[str], videos: Sequence[Any] | None = None, *, images: Sequence[Any] | None = None,
        video_ids: Sequence[str | None] | None = None,
    ) -> HallucinationResult:
        """The penalty of each caption against its video (or image).

        Args:
            captions: the captions.
            videos: one video per caption, or None with ``images``.
            images: one image per caption instead of ``videos``.
            video_ids: cache ids of the visuals (None: keyed by content).

        Returns:
            A `HallucinationResult`: per caption the ``penalty`` in [-1, 0] and its ``reports`` (which
            content words the visual does not support).

        Raises:
            ValueError: both or neither of ``videos`` and ``images`` given; a bad caption or visual (naming it).
        """
        if (videos is None) == (images is None):
            raise ValueError("give videos or images (one of them)")
        kind = "video" if videos is not None else "image"
        alignments = self.alignments(captions, cast(Sequence[Any], videos if videos is not None else images), kind, video_ids)
        reports = [self.report_for(a) for a in alignments]
        return HallucinationResult([r.penalty for r in reports], reports, alignments)

    def reports(
        self, captions: Sequence[str], visuals: Sequence[Any], kind: str = "video", ids: Sequence[str | None] | None = None
    ) -> list[SupportReport]:
        """Per caption: penalty, content tokens, their similarities, which are flagged, and their positions
        in the alignment's token list (``index``, ``flagged_index``; SOS is position 0)."""
        return [self.report_for(a) for a in self.alignments(captions, visuals, kind, ids)]

    def scores(self, captions: Sequence[str], *, images=None, videos=None, references=None, visual_ids=None) -> Scores:
        """The contract (:class:`~capreward.scorers.contract.Scores`; references are not read): the
        penalty, ``flagged`` (the flagged tokens' positions), ``content_tokens``, ``unsupported_tokens``;
        the extras ``truncated`` and ``alignment`` (EMScore's own, contextual similarities)."""
        kind = "video" if videos is not None else "image"
        alignments = self.alignments(captions, videos if videos is not None else images, kind, visual_ids)
        reports = [self.report_for(a) for a in alignments]
        subs: dict[str, list[Any]] = {"flagged": [list(r.flagged_index) for r in reports],
                "content_tokens": [float(len(r.tokens)) for r in reports],
                "unsupported_tokens": [float(sum(r.unsupported)) for r in reports]}
        extras = {"truncated": list(getattr(alignments, "truncated", [False] * len(reports))),
                  "alignment": list(getattr(alignments, "contextual", alignments))}
        return Scores(score=[r.penalty for r in reports], sub_scores=subs, extras=extras,
                      result=HallucinationResult([r.penalty for r in reports], reports, alignments))

    def calibrate(
        self, captions: Sequence[str], visuals: Sequence[Any], kind: str = "video", quantile: float = 0.05,
        unit: str = "caption",
    ) -> float:
        """Set ``threshold`` so that a new known-good caption is flagged with probability at most
        ``quantile`` (:func:`~capreward.metrics.token_support.conformal_threshold` of the known-good
        scores; ``quantile=0``: their minimum, nothing known-good flagged).

        Args:
            captions: known-good descriptions of their ``visuals``.
            visuals: one visual per caption.
            kind: ``"video"`` or ``"image"``.
            quantile: the nominal false-flag rate.
            unit: ``"caption"`` (default): each caption's lowest content-word similarity is one score, so
                at most ``quantile`` of known-good captions get any penalty (what a per-word price needs);
                ``"token"``: every content word is one score (at most ``quantile`` of known-good words
                flagged; a caption of many words is then flagged more often).

        Returns:
            The new threshold.

        Raises:
            ValueError: an unknown ``unit``; no content word to calibrate on; too few known-good items for
                ``quantile`` (at least ``ceil(1 / quantile) - 1``).
        """
        if unit not in CALIBRATION_UNITS:
            raise ValueError(f"unit must be one of {CALIBRATION_UNITS}, got {unit!r}")
        scores: list[float] = []
        for alignment in self.alignments(captions, visuals, kind):
            sims = self.report_for(alignment).similarity
            if unit == "token":
                scores.extend(sims)
            elif sims:
                scores.append(min(sims))
        self.threshold = conformal_threshold(scores, quantile)
        return self.threshold
