"""Rewards from the CLIP-based scorers: EMScore (videos, images, references) and CLIP-S / PAC-S.

Both share the scorer's :class:`~capreward.backbones.CLIPBackbone`, whose LRU cache keys visuals by
file identity (path, device, inode, size, mtime and ctime) or content hash, narrowed by the
``visual_id`` column when there is one, so the visual of a GRPO group is decoded and encoded once per
process even when its completions arrive over several calls.
"""

from __future__ import annotations

import math
from typing import Any

from ..metrics.clipscore import ref_clip_s
from ..metrics.harmonic import harmonic_mean as harmonic_mean_named
from ..scorers.results import MatchScores
from .base import GroupScores
from .hooks import RewardHooks
from .metric_reward import MetricReward

MATCH_FIELDS = ("coarse", "fine_p", "fine_r", "fine_f", "full_p", "full_r", "full_f")
EM_SUBSCORES = ("coarse", "fine_p", "fine_r", "full_f")  # logged for the video and the reference part


def _column(values) -> list[float]:
    return [float(v) for v in values.detach().float().cpu().tolist()]


class EMScoreHooks(RewardHooks):
    """EMScore's reward: the ``field`` of EMScore(X, V), EMScore(X, X*) or EMScore(X, V, X*) (the combined
    part when both are given), sub-scores ``video/<f>`` and ``reference/<f>`` for f in
    :data:`EM_SUBSCORES` and ``truncated``. Its range is the spec's, [-1, 1]: with
    ``harmonic_mean="released"`` the paper's F-measure leaves it when P and R have opposite signs
    (EMScore can then be -12 for a very long caption); such values are clipped and counted
    (``clipped``). The sign-safe mean stays inside."""

    def options(self, *, field: str = "full_f", harmonic_mean: str = "sign-safe") -> dict[str, Any]:
        if field not in MATCH_FIELDS:
            raise ValueError(f"field must be one of {MATCH_FIELDS}, got {field!r}")
        harmonic_mean_named(harmonic_mean)  # ValueError naming the choices
        return {"field": field, "harmonic_mean": harmonic_mean}

    def check(self, spec, options, scorer_options) -> None:
        if scorer_options.get("idf") == "batch":
            raise ValueError("idf='batch' makes a sample's reward depend on its batch; pass a corpus or dict")

    def metric_names(self, reward) -> tuple[str, ...]:
        """``video/<f>`` and ``reference/<f>`` for f in coarse, fine_p, fine_r, full_f, and ``truncated``."""
        return (*(f"{part}/{f}" for part in ("video", "reference") for f in EM_SUBSCORES), "truncated")

    def score_group(self, reward, captions, visuals, kind, references, visual_ids) -> GroupScores:
        result = reward.scorer.score(
            captions,
            videos=visuals if kind == "video" else None,
            images=visuals if kind == "image" else None,
            references=references,
            video_ids=visual_ids,
            harmonic_mean=reward.harmonic_mean,
        )
        main: MatchScores = result.combined or result.video or result.reference
        metrics: dict[str, list[float]] = {}
        for part in ("video", "reference"):
            scores = getattr(result, part)
            if scores is not None:
                for f in EM_SUBSCORES:
                    metrics[f"{part}/{f}"] = _column(getattr(scores, f))
        metrics["truncated"] = [float(t) for t in result.truncated]
        return GroupScores(scores=_column(getattr(main, reward.field)), metrics=metrics)


class CLIPScoreHooks(RewardHooks):
    """CLIP-S's and PAC-S's reward: CLIP-S, or RefCLIP-S with references formed by ``harmonic_mean``;
    sub-scores the reference-free score (named as the metric: ``clip_s`` / ``pac_s``),
    ``ref_similarity`` and ``truncated``."""

    def options(self, *, harmonic_mean: str = "sign-safe") -> dict[str, Any]:
        harmonic_mean_named(harmonic_mean)  # ValueError naming the choices
        return {"harmonic_mean": harmonic_mean}

    def check(self, spec, options, scorer_options) -> None:
        w = scorer_options.get("w")
        try:
            ok = w is None or (not isinstance(w, (str, bool)) and math.isfinite(float(w)) and float(w) > 0)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            # w < 0 would invert the reward (a worse caption scores higher), NaN leaves every sample unscored
            raise ValueError(f"{spec.name}: w must be a finite number > 0 (CLIP-S uses 2.5), got {w!r}")

    def value_range(self, reward) -> tuple[float, float]:
        """CLIP-S alone: [0, w]. With references and the sign-safe mean (the default): RefCLIP-S lies
        between CLIP-S and the reference cosine s in [-1, 1], so the range is [-1, max(w, 2w/(w+1))]
        ([-1, w] for w >= 1). With ``harmonic_mean="released"``: [0, w], outside which the released
        RefCLIP-S goes when s < 0; such values are clipped and counted (``clipped``)."""
        if reward._given_scorer is not None:
            w = reward._given_scorer.w
        else:
            w = reward.scorer_kwargs.get("w")
            w = self.scorer_class(reward.spec).default_w if w is None else float(w)
        lo, hi = min(0.0, w), max(0.0, w)
        if reward.use_references and reward.harmonic_mean == "sign-safe":
            lo = min(lo, -1.0)  # H(CLIP-S, s) is s when s < 0
            if w > 0:
                hi = max(hi, 2 * w / (w + 1))  # H(w, 1), above w when w < 1
        return (lo, hi)

    def metric_names(self, reward) -> tuple[str, ...]:
        """The reference-free score (``clip_s`` / ``pac_s``: the metric's name), ``ref_similarity`` (NaN
        without references) and ``truncated``."""
        return (reward.metric, "ref_similarity", "truncated")

    def score_group(self, reward, captions, visuals, kind, references, visual_ids) -> GroupScores:
        result = reward.scorer.score(
            captions,
            images=visuals if kind == "image" else None,
            videos=visuals if kind == "video" else None,
            references=references,
            image_ids=visual_ids,
        )
        metrics = {reward.metric: _column(result.clip_s), "truncated": [float(t) for t in result.truncated]}
        if result.ref_similarity is not None:
            metrics["ref_similarity"] = _column(result.ref_similarity)
            mean = harmonic_mean_named(reward.harmonic_mean)
            scores = _column(ref_clip_s(result.clip_s, result.ref_similarity, mean))
        else:
            scores = _column(result.clip_s)
        return GroupScores(scores=[None if math.isnan(s) else s for s in scores], metrics=metrics)


class EMScoreReward(MetricReward):
    """EMScore as a reward: the full F of EMScore(X, V) (with references: of EMScore(X, V, X*)), in
    [-1, 1] (cosine based; around 0.2-0.4 for real captions with a real CLIP).

    ``harmonic_mean``: how every F is formed from P and R (video, each reference, hence combined and
    full). ``"sign-safe"`` (default): `sign_safe_harmonic_mean()`,
    2PR/(P+R) when P > 0 and R > 0, else min(P, R); every field then lies in [-1, 1] without clipping
    and never decreases when P or R grows. ``"released"``: the paper's 2PR/(P+R), which leaves [-1, 1]
    (and changes sign) when P and R have opposite signs, so that a wrong caption can get the top
    reward (P -0.61, R 0.46: F 3.59); such values are clipped and counted (``rewards/<name>/clipped``).

    Constructor: ``model``, ``device``, ``idf``, ``frames``, ``batch_size``, ``cache_size``,
    ``precision``, ``backbone`` as for `EMScore` (``idf="batch"``, the released
    code's default, is refused: it makes a sample's reward depend on the rest of the batch; the default
    here is no idf, a fixed corpus or dict gives idf weights), ``field`` (which of
    `MATCH_FIELDS` is the reward, default ``"full_f"``) and the column options of
    `CaptionReward`. References alone are enough to score a sample (EMScore_ref).
    Sub-scores ``video/<field>`` and ``reference/<field>`` are logged via ``log_metric``, and
    ``truncated`` (a count: captions cut to the text context, only with ``long_captions="truncate"``;
    by default a caption longer than the context is read whole, see `capreward.backbones.windows`).

    Examples:
        >>> from capreward.testing import colour_image, trained_clip_path
        >>> clip = str(trained_clip_path())   # a tiny CLIP trained to know colour words (seconds, then cached)
        >>> red = colour_image("red")
        >>> from capreward.rewards import EMScoreReward
        >>> reward = EMScoreReward(model=clip)           # TRL logs it as rewards/emscore/...
        >>> r = reward(None, ["a red image.", "a blue image.", ""], image=[red] * 3)
        >>> r[0] > r[1], r[2]                            # an empty caption is unscored: None, reason logged
        (True, None)
    """

    __name__ = "emscore"
    metric = "emscore"


class CLIPScoreReward(MetricReward):
    """CLIP-S as a reward: ``w * max(cos(image, caption), 0)`` in [0, w] (w = 2.5 by default); with
    references RefCLIP-S, the harmonic mean of CLIP-S and the best reference cosine s.

    ``harmonic_mean``: ``"sign-safe"`` (default) uses
    `sign_safe_harmonic_mean()`: 2ab/(a+b) when CLIP-S > 0 and s > 0,
    else the smaller of the two, so RefCLIP-S lies between its parts and never decreases when either
    grows; a negative s gives s itself, so the range is [-1, w] when references are used (w >= 1).
    ``"released"``: the paper's 2ab/(a+b), unbounded when s < 0; the reward then clips to [0, w] and
    counts what it clipped (``clipped``).
    Videos are scored through their mean frame embedding. Constructor: ``model``, ``device``, ``w``,
    ``prefix``, ``batch_size``, ``cache_size``, ``precision``, ``frames``, ``backbone`` as for
    `CLIPScore`, plus the column options of `CaptionReward`.
    Sub-scores ``clip_s`` (the reference-free score) and ``ref_similarity`` are logged via ``log_metric``,
    and ``truncated`` (a count: captions cut to the text context, only with ``long_captions="truncate"``;
    by default a caption longer than the context is read whole, see `capreward.backbones.windows`).

    Examples:
        >>> from capreward.testing import colour_image, trained_clip_path
        >>> clip = str(trained_clip_path())   # a tiny CLIP trained to know colour words (seconds, then cached)
        >>> red = colour_image("red")
        >>> from capreward.rewards import CLIPScoreReward
        >>> reward = CLIPScoreReward(model=clip)
        >>> reward.__name__, reward.value_range()       # RefCLIP-S (sign-safe) reaches -1
        ('clip_s', (-1.0, 2.5))
        >>> r = reward(None, ["a red image.", "a blue image."], image=[red, red])
        >>> r[0] > r[1]
        True
    """

    __name__ = "clip_s"
    metric = "clip_s"


class PACScoreReward(CLIPScoreReward):
    """PAC-S (RefPAC-S with references) as a reward, in [0, 2] ([-1, 2] with references and the
    sign-safe mean; see `CLIPScoreReward`): ``model`` must be the PAC-S weights. Sub-scores
    ``pac_s`` (the reference-free score) and ``ref_similarity``.

    Examples:
        >>> from capreward.testing import colour_image, trained_clip_path
        >>> clip = str(trained_clip_path())   # a tiny CLIP trained to know colour words (seconds, then cached)
        >>> red = colour_image("red")
        >>> from capreward.rewards import PACScoreReward
        >>> reward = PACScoreReward(model=clip)          # the PAC-S checkpoint in practice
        >>> reward.__name__, reward.value_range()       # RefCLIP-S (sign-safe) reaches -1
        ('pac_s', (-1.0, 2.0))
        >>> r = reward(None, ["a red image.", "a blue image."], image=[red, red])
        >>> r[0] > r[1]
        True
    """

    __name__ = "pac_s"
    metric = "pac_s"
