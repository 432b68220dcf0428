"""The specs of CLIP-S and PAC-S (:mod:`capreward.registry`); imports nothing heavy. The scorers:
:mod:`.clipscore`."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any
from collections.abc import Mapping

from ..registry import Deviation, JobFlag, MetricSpec, Option, RewardPolicy, register
from ..metrics.harmonic import HARMONIC_MEANS
from .emscore_spec import HARMONIC_MEAN_FLAG, TEXT_OPTIONS


def sub_scores(config: Mapping[str, Any]) -> tuple[str, ...]:
    """With references: ``ref`` (RefCLIP-S / RefPAC-S: the harmonic mean with the best reference
    similarity) and ``ref_similarity`` (that best cosine, in [-1, 1])."""
    return ("ref", "ref_similarity") if config.get("references") else ()


def value(config: Mapping[str, Any]) -> str:
    """A reward's (and a Metric's) value: RefCLIP-S with references, else CLIP-S (the headline)."""
    return "ref" if config.get("references") else "score"


def value_range(config: Mapping[str, Any]) -> tuple[float, float]:
    """CLIP-S alone: [0, w]. With references and the sign-safe mean: RefCLIP-S lies between CLIP-S and the
    reference cosine s in [-1, 1], so [-1, max(w, 2w/(w+1))] ([-1, w] for w >= 1). With the released mean:
    [0, w], which the released RefCLIP-S leaves when s < 0 (a reward clips and counts such values)."""
    w = float(config["w"])
    lo, hi = min(0.0, w), max(0.0, w)
    if config.get("references") and config.get("harmonic_mean") == "sign-safe":
        lo = min(lo, -1.0)  # H(CLIP-S, s) is s when s < 0
        if w > 0:
            hi = max(hi, 2 * w / (w + 1))  # H(w, 1), above w when w < 1
    return (lo, hi)


def reward_check(name: str):
    """A check refusing a ``w`` that is not a finite number > 0 (w < 0 would invert the reward, NaN leave
    every sample unscored)."""

    def check(options: Mapping[str, Any]) -> None:
        w = options.get("w")
        try:
            ok = w is None or (not isinstance(w, (str, bool)) and math.isfinite(float(w)) and float(w) > 0)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"{name}: w must be a finite number > 0 (CLIP-S uses 2.5), got {w!r}")

    return check


def _reward(name: str) -> RewardPolicy:
    return RewardPolicy(
        options=(Option("harmonic_mean", "sign-safe", "how RefCLIP-S is formed: 'sign-safe' or 'released'",
                        HARMONIC_MEANS),),
        check=reward_check(name),
    )


def _options(w: float, model: Any) -> tuple[Option, ...]:
    return (
        Option("model", model, "the CLIP (CLIP-S) or the PAC-S checkpoint (PAC-S)"),
        Option("w", w, "the scale of the clipped cosine"),
        Option("frames", 10, "frames averaged per video (None: all)"),
        *TEXT_OPTIONS,
        Option("harmonic_mean", "released", "how RefCLIP-S is formed: 'released' or 'sign-safe' (the rewards' default)"),
    )


_DEVIATIONS = (
    Deviation("a caption longer than CLIP's context is read whole in windows (the released code truncates)",
              "long_captions='truncate'"),
    Deviation("videos are scored through their mean frame embedding (the paper scores images only)", None),
    Deviation("the rewards form RefCLIP-S sign-safely; the scorer keeps the released harmonic mean",
              "harmonic_mean='released'"),
)

CLIP_S = register(MetricSpec(
    name="clip_s",
    aliases=("clipscore", "clip_score"),
    title="CLIP-S",
    summary="w * max(cos(image, 'A photo depicts ' + caption), 0); with references RefCLIP-S, the harmonic "
            "mean with the caption's best reference similarity.",
    paper="Hessel et al., CLIPScore: A Reference-free Evaluation Metric for Image Captioning, EMNLP 2021",
    released_code="https://github.com/jmhessel/clipscore",
    scorer="capreward.scorers.clipscore:CLIPScore",
    sub_scores=sub_scores,
    value_range=(0.0, 2.5),
    higher_is_better=True,
    visuals=("image", "video"),
    references="optional",
    shares="clip",
    uses_idf=False,
    backbone="clip",
    options=_options(2.5, "ViT-B/32"),
    deviations=_DEVIATIONS,
    result_fields={"ref": "ref_clip_s"},
    position=10,
    value=value,
    range_for=value_range,
    reward_policy=_reward("clip_s"),
    job_flags=(HARMONIC_MEAN_FLAG,),
))

#: PAC-S: CLIP-S with its own checkpoint and w = 2.0 (and its own names, citation and reward check).
PAC_S = register(replace(
    CLIP_S,
    name="pac_s",
    aliases=("pacscore", "pac_score"),
    title="PAC-S",
    summary="CLIP-S with the PAC-S fine-tuned checkpoint and w = 2.0; with references RefPAC-S.",
    paper="Sarto et al., Positive-Augmented Contrastive Learning for Image and Video Captioning Evaluation, "
          "CVPR 2023",
    released_code="https://github.com/aimagelab/pacscore",
    scorer="capreward.scorers.clipscore:PACScore",
    value_range=(0.0, 2.0),
    shares=None,  # its own checkpoint: no backbone to share with the other CLIP metrics
    options=_options(2.0, None),
    result_fields={"ref": "ref_pac_s"},
    position=20,
    reward_policy=_reward("pac_s"),
    job_flags=(JobFlag("pac_model", ("--pac-model",), "PAC-S checkpoint path (for pac-s)", option="model", record="clip_model",
                       hint="pass --pac-model PATH (the PAC-S checkpoint, e.g. clip_ViT-B-32.pth)"),
               HARMONIC_MEAN_FLAG),
))
