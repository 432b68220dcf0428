"""Rewards from the CLIP-based scorers: EMScore (videos, images, references) and CLIP-S / PAC-S.

Both share the scorer's :class:`~capreward.backbones.CLIPBackbone`, whose LRU cache keys visuals by
path (+size, mtime) or content hash, so the visual of a GRPO group is decoded and encoded once per
process even when its completions arrive over several calls.
"""

from __future__ import annotations

import math
from typing import Any

from ..scorers.clipscore import CLIPScore, PACScore
from ..scorers.emscore import EMScore
from ..scorers.results import MatchScores
from .base import CaptionReward, GroupScores

MATCH_FIELDS = ("coarse", "fine_p", "fine_r", "fine_f", "full_p", "full_r", "full_f")


def _column(values) -> list[float]:
    return [float(v) for v in values.detach().float().cpu().tolist()]


class EMScoreReward(CaptionReward):
    """EMScore as a reward: the full F of EMScore(X, V) (with references: of EMScore(X, V, X*)), in
    [-1, 1] (cosine based; around 0.2-0.4 for real captions with a real CLIP). The paper's F leaves
    [-1, 1] when P and R have opposite signs; the reward clips such values and counts them
    (``rewards/<name>/clipped``).

    Constructor: ``model``, ``device``, ``idf``, ``frames``, ``batch_size``, ``cache_size``,
    ``precision``, ``backbone`` as for :class:`~capreward.scorers.EMScore` (``idf="batch"``, the released
    code's default, is refused: it makes a sample's reward depend on the rest of the batch; the default
    here is no idf, a fixed corpus or dict gives idf weights), ``field`` (which of
    :data:`MATCH_FIELDS` is the reward, default ``"full_f"``) and the column options of
    :class:`CaptionReward`. References alone are enough to score a sample (EMScore_ref).
    Sub-scores ``video/<field>`` and ``reference/<field>`` are logged via ``log_metric``.
    """

    __name__ = "emscore"
    needs_visual = False

    def __init__(self, *, field: str = "full_f", **kwargs: Any):
        if field not in MATCH_FIELDS:
            raise ValueError(f"field must be one of {MATCH_FIELDS}, got {field!r}")
        if kwargs.get("idf") == "batch":
            raise ValueError("idf='batch' makes a sample's reward depend on its batch; pass a corpus or dict")
        self.field = field
        super().__init__(**kwargs)

    def _build(self) -> EMScore:
        return EMScore(**self.scorer_kwargs)

    def value_range(self) -> tuple[float, float]:
        """[-1, 1]. The paper's F-measure leaves it when P and R have opposite signs (EMScore can then
        be -12 for a very long caption); such values are clipped and counted (``clipped``)."""
        return (-1.0, 1.0)

    def score_group(self, captions, visuals, kind, references, visual_ids) -> GroupScores:
        scorer = self.scorer
        result = scorer.score(
            captions,
            videos=visuals if kind == "video" else None,
            images=visuals if kind == "image" else None,
            references=references,
            video_ids=visual_ids,
        )
        main: MatchScores = result.combined or result.video or result.reference
        metrics: dict[str, list[float]] = {}
        for part in ("video", "reference"):
            scores = getattr(result, part)
            if scores is not None:
                for f in ("coarse", "fine_p", "fine_r", "full_f"):
                    metrics[f"{part}/{f}"] = _column(getattr(scores, f))
        return GroupScores(scores=_column(getattr(main, self.field)), metrics=metrics)


class CLIPScoreReward(CaptionReward):
    """CLIP-S as a reward: ``w * max(cos(image, caption), 0)`` in [0, w] (w = 2.5 by default); with
    references RefCLIP-S (harmonic mean of CLIP-S and the best reference cosine, clipped to [0, w]:
    the harmonic mean is unbounded when that cosine is negative; clipped values are counted as
    ``clipped``).
    Videos are scored through their mean frame embedding. Constructor: ``model``, ``device``, ``w``,
    ``prefix``, ``batch_size``, ``cache_size``, ``precision``, ``frames``, ``backbone`` as for
    :class:`~capreward.scorers.CLIPScore`, plus the column options of :class:`CaptionReward`.
    Sub-scores ``clip_s`` (the reference-free score) and ``ref_similarity`` are logged via ``log_metric``.
    """

    __name__ = "clip_s"
    scorer_class = CLIPScore
    #: the sub-score holding the reference-free score (the metric's one name: ``clip_s`` / ``pac_s``)
    free_field = "clip_s"

    def _build(self) -> CLIPScore:
        return self.scorer_class(**self.scorer_kwargs)

    def value_range(self) -> tuple[float, float]:
        """[0, w]. RefCLIP-S (a harmonic mean with an unclipped reference cosine) leaves it when the
        best reference cosine is negative; such values are clipped and counted (``clipped``)."""
        if self._given_scorer is not None:
            w = self._given_scorer.w
        else:
            w = self.scorer_kwargs.get("w")
            w = self.scorer_class.default_w if w is None else float(w)
        return (min(0.0, w), max(0.0, w))

    def score_group(self, captions, visuals, kind, references, visual_ids) -> GroupScores:
        result = self.scorer.score(
            captions,
            images=visuals if kind == "image" else None,
            videos=visuals if kind == "video" else None,
            references=references,
            image_ids=visual_ids,
        )
        metrics = {self.free_field: _column(result.clip_s)}
        if result.ref_similarity is not None:
            metrics["ref_similarity"] = _column(result.ref_similarity)
        scores = _column(result.score)
        return GroupScores(scores=[None if math.isnan(s) else s for s in scores], metrics=metrics)


class PACScoreReward(CLIPScoreReward):
    """PAC-S (RefPAC-S with references) as a reward, in [0, 2]: ``model`` must be the PAC-S weights.
    Sub-scores ``pac_s`` (the reference-free score) and ``ref_similarity``."""

    __name__ = "pac_s"
    scorer_class = PACScore
    free_field = "pac_s"
