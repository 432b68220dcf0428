"""The specs of CLIP-S and PAC-S (:mod:`capreward.registry`); imports nothing heavy. The scorers:
:mod:`.clipscore`."""

from __future__ import annotations

from typing import Any, Mapping

from ..registry import Deviation, JobFlag, MetricSpec, Option, register
from .emscore_spec import HARMONIC_MEAN_FLAG


def sub_scores(config: Mapping[str, Any]) -> tuple[str, ...]:
    """``ref`` (RefCLIP-S / RefPAC-S: the harmonic mean with the best reference similarity) with references."""
    return ("ref",) if config.get("references") else ()


def _options(w: float, model: Any) -> tuple[Option, ...]:
    return (
        Option("model", model, "the CLIP (CLIP-S) or the PAC-S checkpoint (PAC-S)"),
        Option("w", w, "the scale of the clipped cosine"),
        Option("frames", 10, "frames averaged per video (None: all)"),
        Option("batch_size", 64, "captions per text-encoder batch"),
        Option("long_captions", "windows", "'windows' reads a long caption whole; 'truncate' cuts it to the context"),
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
    reward="capreward.rewards.clip_family:CLIPScoreReward",
    torchmetric="capreward.torchmetrics.metrics:CLIPScoreMetric",
    reward_hooks="capreward.rewards.clip_family:CLIPScoreHooks",
    metric_hooks="capreward.torchmetrics.metrics:CLIPScoreHooks",
    position=10,
    job_runner="capreward.scorers.job_runners:clip_s_runner",
    job_flags=(HARMONIC_MEAN_FLAG,),
))

PAC_S = register(MetricSpec(
    name="pac_s",
    aliases=("pacscore", "pac_score"),
    title="PAC-S",
    summary="CLIP-S with the PAC-S fine-tuned checkpoint and w = 2.0; with references RefPAC-S.",
    paper="Sarto et al., Positive-Augmented Contrastive Learning for Image and Video Captioning Evaluation, "
          "CVPR 2023",
    released_code="https://github.com/aimagelab/pacscore",
    scorer="capreward.scorers.clipscore:PACScore",
    sub_scores=sub_scores,
    value_range=(0.0, 2.0),
    higher_is_better=True,
    visuals=("image", "video"),
    references="optional",
    shares=None,  # its own checkpoint: no backbone to share with the other CLIP metrics
    uses_idf=False,
    backbone="clip",
    options=_options(2.0, None),
    deviations=_DEVIATIONS,
    result_fields={"ref": "ref_pac_s"},
    reward="capreward.rewards.clip_family:PACScoreReward",
    torchmetric=None,  # CLIPScoreMetric(scorer=PACScore(...)) is named pac_s
    reward_hooks="capreward.rewards.clip_family:CLIPScoreHooks",
    metric_hooks="capreward.torchmetrics.metrics:CLIPScoreHooks",
    position=20,
    job_runner="capreward.scorers.job_runners:pac_s_runner",
    job_flags=(JobFlag("pac_model", ("--pac-model",), "PAC-S checkpoint path (for pac-s)", record="clip_model",
                       hint="pass --pac-model PATH (the PAC-S checkpoint, e.g. clip_ViT-B-32.pth)"),
               HARMONIC_MEAN_FLAG),
))
