"""A penalty for caption words the visuals do not support, from EMScore's token→frame matching.

For each content token of the caption (see :func:`~capreward.rewards.support.content_mask`), EMScore's
fine-grained matching gives the cosine similarity of its CLIP token embedding to the best-matching
frame. Tokens below ``threshold`` are "unsupported"; the penalty is minus their (idf-)weighted
fraction, in [-1, 0]: 0 when every content word finds a matching frame, -1 when none does.

Calibration: per-token similarities depend on the CLIP model (and on frame sampling), so the threshold
should be set from data with :meth:`HallucinationPenalty.calibrate`: it takes captions known to be
correct for their visuals and sets the threshold to a low quantile (default 5%) of their content
tokens' similarities, i.e. about 5% of correct content words get flagged. The default threshold
(:data:`DEFAULT_THRESHOLD`) is only a starting point for OpenAI ViT-B/32-sized models, not a
measured value.

Behaviour on foils (one object word swapped, e.g. "a red image" -> "a blue image"): the swapped word
has no matching frame, so its similarity drops below the threshold and it is flagged. CLIP's text tower
is causal, so the tokens *after* the swap see it too and usually drop as well ("image" in "a blue
image" on a red clip): the penalty moves by the swapped word's share of the content weight or more.
A CLIP only knows the words it was trained on: with the random-weight tiny CLIP of the tests the
similarities carry no meaning; with :mod:`capreward.testing.trained_clip` (a tiny CLIP trained on
colour words) only colour words are meaningful. tests/test_hallucination.py measures the foil
behaviour with the latter on colour-tinted frames of the sample clips.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

from ..scorers.emscore import EMScore, TokenAlignment
from .base import CaptionReward, GroupScores
from .support import STOP_WORDS, SupportReport, content_mask, quantile_threshold, support_report

#: Starting threshold on token→frame cosine similarity; uncalibrated, call ``calibrate`` on your data.
DEFAULT_THRESHOLD = 0.2
#: With an idf corpus, tokens with idf <= ln 2 (in more than about half the captions) are function words.
DEFAULT_IDF_THRESHOLD = math.log(2.0)


class HallucinationPenalty(CaptionReward):
    """Reward in [-1, 0]: minus the weighted fraction of content tokens whose best frame similarity is
    below ``threshold``.

    Args:
        threshold: similarity below which a content token is unsupported (see :meth:`calibrate`).
        idf_threshold: with ``idf`` given, tokens whose idf weight is at most this are function words
            (default ln 2); without idf, :data:`~capreward.rewards.support.STOP_WORDS` decides.
        stop_words: the function-word list used without idf.
        idf_weighting: weigh tokens by their idf weight (only with ``idf``); else every content token
            counts 1.
        EMScore arguments (``model``, ``device``, ``idf``, ``frames``, ``backbone``, ...) and the column
        options of :class:`CaptionReward`; references are not used.

    Logs ``content_tokens`` and ``unsupported_tokens`` (batch means) as sub-scores.
    """

    __name__ = "hallucination"

    def __init__(
        self,
        *,
        threshold: float = DEFAULT_THRESHOLD,
        idf_threshold: float | None = None,
        stop_words: Iterable[str] = STOP_WORDS,
        idf_weighting: bool = True,
        **kwargs: Any,
    ):
        if kwargs.get("idf") == "batch":
            raise ValueError("idf='batch' makes a sample's penalty depend on its batch; pass a corpus or dict")
        kwargs["use_references"] = False
        super().__init__(**kwargs)
        self.threshold = float(threshold)
        self.idf_threshold = idf_threshold
        self.stop_words = frozenset(stop_words)
        self.idf_weighting = idf_weighting

    def _build(self) -> EMScore:
        return EMScore(**self.scorer_kwargs)

    def value_range(self) -> tuple[float, float]:
        """[-1, 0]."""
        return (-1.0, 0.0)

    # ------------------------------------------------------------------ analysis
    def _uses_idf(self) -> bool:
        return self.scorer.idf_table is not None

    def report_for(self, alignment: TokenAlignment, threshold: float | None = None) -> SupportReport:
        """The :class:`SupportReport` of one caption's alignment at ``threshold`` (default: the current one)."""
        use_idf = self._uses_idf()
        idf_threshold = (self.idf_threshold if self.idf_threshold is not None else DEFAULT_IDF_THRESHOLD) if use_idf else None
        content = content_mask(alignment.tokens, alignment.weight, idf_threshold, self.stop_words)
        weights = alignment.weight if (use_idf and self.idf_weighting) else None
        return support_report(
            alignment.tokens, alignment.similarity, self.threshold if threshold is None else threshold, content, weights
        )

    def alignments(
        self, captions: Sequence[str], visuals: Sequence[Any], kind: str = "video", ids: Sequence[str | None] | None = None
    ) -> list[TokenAlignment]:
        """EMScore's token→frame alignment of each caption with its visual (``kind`` "video" or "image")."""
        if kind not in ("video", "image"):
            raise ValueError(f"kind must be 'video' or 'image', got {kind!r}")
        result = self.scorer.score(
            list(captions),
            videos=visuals if kind == "video" else None,
            images=visuals if kind == "image" else None,
            video_ids=ids,
        )
        return result.alignment

    def reports(
        self, captions: Sequence[str], visuals: Sequence[Any], kind: str = "video", ids: Sequence[str | None] | None = None
    ) -> list[SupportReport]:
        """Per caption: penalty, content tokens, their similarities, which are flagged, and their positions
        in the alignment's token list (``index``, ``flagged_index``; SOS is position 0)."""
        return [self.report_for(a) for a in self.alignments(captions, visuals, kind, ids)]

    def calibrate(
        self, captions: Sequence[str], visuals: Sequence[Any], kind: str = "video", quantile: float = 0.05
    ) -> float:
        """Set ``threshold`` to the ``quantile`` of the content-token similarities of ``captions``, which
        must be known-good descriptions of their ``visuals`` (so about that fraction of correct content
        words will be flagged). Returns the new threshold."""
        sims: list[float] = []
        for alignment in self.alignments(captions, visuals, kind):
            sims.extend(self.report_for(alignment).similarity)
        self.threshold = quantile_threshold(sims, quantile)
        return self.threshold

    # ------------------------------------------------------------------- reward
    def metric_names(self) -> tuple[str, ...]:
        """``content_tokens``, ``unsupported_tokens``, ``truncated`` and ``clipped``."""
        return ("content_tokens", "unsupported_tokens", "truncated", *super().metric_names())

    def score_group(self, captions, visuals, kind, references, visual_ids) -> GroupScores:
        alignments = self.alignments(captions, visuals, kind, visual_ids)
        reports = [self.report_for(a) for a in alignments]
        return GroupScores(
            scores=[r.penalty for r in reports],
            metrics={
                "content_tokens": [float(len(r.tokens)) for r in reports],
                "unsupported_tokens": [float(sum(r.unsupported)) for r in reports],
                "truncated": [float(t) for t in alignments.truncated],
            },
        )
