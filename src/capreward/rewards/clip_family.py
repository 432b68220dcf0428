"""Rewards from the CLIP-based scorers: EMScore (videos, images, references) and CLIP-S / PAC-S: the one
generic :class:`~capreward.rewards.MetricReward` fixed to each (no code of their own).

Both share the scorer's :class:`~capreward.backbones.CLIPBackbone`, whose LRU cache keys visuals by
file identity (path, device, inode, size, mtime and ctime) or content hash, narrowed by the
``visual_id`` column when there is one, so the visual of a GRPO group is decoded and encoded once per
process even when its completions arrive over several calls.
"""

from __future__ import annotations

from .metric_reward import MetricReward


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
    Sub-scores ``<part>/<component>`` (part: video, reference, combined; every component) are logged via
    ``log_metric``, and
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
    Sub-scores ``clip_s`` (the reference-free score), ``ref`` (RefCLIP-S) and ``ref_similarity`` are logged
    via ``log_metric``,
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


class PACScoreReward(MetricReward):
    """PAC-S (RefPAC-S with references) as a reward, in [0, 2] ([-1, 2] with references and the
    sign-safe mean; see `CLIPScoreReward`): ``model`` must be the PAC-S weights. Sub-scores
    ``pac_s`` (the reference-free score), ``ref`` (RefPAC-S) and ``ref_similarity``.

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
