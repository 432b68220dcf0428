"""The hallucination penalty's spec (:mod:`capreward.registry`); imports nothing heavy."""

from __future__ import annotations

from typing import Any
from collections.abc import Mapping

from ..registry import JobFlag, MetricSpec, Option, RewardPolicy, register
from .emscore_spec import FRAMES_OPTION


def sub_scores(config: Mapping[str, Any]) -> tuple[str, ...]:
    """``flagged``: the positions of the flagged tokens in the caption's token list (SOS at 0);
    ``content_tokens``: how many content tokens the caption has; ``unsupported_tokens``: how many of them
    no frame supports."""
    return ("flagged", "content_tokens", "unsupported_tokens")


def checked_claim_cost(claim_cost: Any) -> float | None:
    """``claim_cost`` as a float in (0, 1], or None (the weighted fraction).

    Raises:
        ValueError: anything else.
    """
    if claim_cost is None:
        return None
    if isinstance(claim_cost, bool) or not isinstance(claim_cost, (int, float)) or not 0.0 < float(claim_cost) <= 1.0:
        raise ValueError(f"claim_cost must be a number in (0, 1] or None, got {claim_cost!r}")
    return float(claim_cost)


def checked_options(empty_penalty: float, emscore_options: Mapping[str, Any]) -> float:
    """``empty_penalty`` as a float, validated with the EMScore options (the scorer's and the reward's one check).

    Raises:
        ValueError: ``idf="batch"`` (a sample's penalty would depend on its batch) or ``empty_penalty``
            outside [-1, 0].
    """
    if emscore_options.get("idf") == "batch":
        raise ValueError("idf='batch' makes a sample's penalty depend on its batch; pass a corpus or dict")
    empty_penalty = float(empty_penalty)
    if not -1.0 <= empty_penalty <= 0.0:
        raise ValueError(f"empty_penalty must be in [-1, 0], got {empty_penalty!r}")
    return empty_penalty


def reward_check(options: Mapping[str, Any]) -> None:
    """The scorer's own checks, before anything is built (:func:`checked_options`, :func:`checked_claim_cost`)."""
    checked_options(options.get("empty_penalty", -1.0), options)
    checked_claim_cost(options.get("claim_cost", 0.5))


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
        FRAMES_OPTION,
    ),
    deviations=(),
    position=40,
    sub_score_kinds={"flagged": "data", "content_tokens": "number", "unsupported_tokens": "number"},
    reward_policy=RewardPolicy(check=reward_check, verdict=("content_tokens", "unsupported_tokens")),
    job_flags=(JobFlag("hallucination_threshold", ("--hallucination-threshold",),
                       "token->frame similarity below which a content word is flagged (an uncalibrated starting "
                       "point; set it from HallucinationPenalty.calibrate on known-good captions)",
                       option="threshold", type="float", record="float"),),
    writes_alignment=True,
    flagged_tokens="flagged",
    wraps="emscore",
))
