"""The hallucination penalty's spec (:mod:`capreward.registry`); imports nothing heavy."""

from __future__ import annotations

from typing import Any, Mapping

from ..registry import JobFlag, MetricSpec, Option, register


def sub_scores(config: Mapping[str, Any]) -> tuple[str, ...]:
    """``flagged``: the positions of the flagged tokens in the caption's token list (SOS at 0)."""
    return ("flagged",)


SPEC = register(MetricSpec(
    name="hallucination",
    aliases=("hallucination_penalty",),
    title="Hallucination penalty",
    summary="Minus a price per content word whose best frame similarity is below a threshold, "
            "-min(1, claim_cost * n) (0: every content word is supported by a frame).",
    paper="capreward (on EMScore's token-to-frame alignment, Shi et al., CVPR 2022, Figure 7)",
    released_code=None,
    scorer="capreward.scorers.hallucination:Hallucination",
    sub_scores=sub_scores,
    value_range=(-1.0, 0.0),
    higher_is_better=True,
    visuals=("image", "video"),
    references="none",
    shares="clip",
    uses_idf=True,
    backbone="clip",
    options=(
        Option("threshold", 0.2, "similarity below which a content token is unsupported"),
        Option("idf", False, "a corpus or a dict token id -> weight ('batch' is refused)"),
        Option("idf_threshold", None, "with idf, tokens of idf at most this are function words (default ln 2)"),
        Option("empty_penalty", -1.0, "the penalty of a caption without a content word (a wrong caption's)"),
        Option("claim_cost", 0.5, "the price of each unsupported content word: -min(1, claim_cost * n); None: "
               "the weighted fraction of content words (an average a long caption dilutes)"),
        Option("context_free", True, "also judge each content word encoded alone and keep the lower similarity"),
        Option("frames", 10, "frames sampled per video (None: all)"),
    ),
    deviations=(),
    reward="capreward.rewards.hallucination:HallucinationPenalty",
    reward_hooks="capreward.rewards.hallucination:HallucinationHooks",
    metric_hooks="capreward.torchmetrics.metrics:HallucinationHooks",
    position=40,
    job_runner="capreward.scorers.job_runners:hallucination_runner",
    job_flags=(JobFlag("hallucination_threshold", ("--hallucination-threshold",),
                       "token->frame similarity below which a content word is flagged (an uncalibrated starting "
                       "point; set it from HallucinationPenalty.calibrate on known-good captions)",
                       option="threshold", type="float", record="float"),),
    writes_alignment=True,
    flagged_tokens="flagged",
))
