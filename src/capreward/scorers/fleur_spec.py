"""FLEUR's spec (:mod:`capreward.registry`); imports nothing heavy. The scorers: :mod:`.fleur` (a local
LLaVA) and :mod:`.fleur_remote` (an OpenAI-compatible server)."""

from __future__ import annotations

from typing import Any
from collections.abc import Mapping

from ..registry import Deviation, MetricSpec, Option, register

#: The kinds of a judge's answer sub-scores (FLEUR, G-VEval): ``raw``, the answer's text, and ``parsed``, the
#: number read from it.
ANSWER_KINDS = {"raw": "data", "parsed": "number"}


def sub_scores(config: Mapping[str, Any]) -> tuple[str, ...]:
    """``raw``: the judge's greedy answer (text); ``parsed``: that answer read as a number (the paper's
    raw-score ablation; NaN when it reads as no number in [0, 1])."""
    return ("raw", "parsed")


SPEC = register(MetricSpec(
    name="fleur",
    aliases=(),
    title="FLEUR",
    summary="An LLaVA judge's expected rating of the caption on 0.0-1.0, read from its digit probabilities "
            "(RefFLEUR with references).",
    paper="Lee et al., FLEUR: An Explainable Reference-Free Evaluation Metric for Image Captioning Using a "
          "Large Multimodal Model, ACL 2024",
    released_code="https://github.com/Yebin46/FLEUR",
    scorer="capreward.scorers.fleur:FLEUR",
    sub_scores=sub_scores,
    value_range=(0.0, 1.0),
    higher_is_better=True,
    visuals=("image", "video"),
    references="optional",
    shares="chat_judge",
    uses_idf=False,
    backbone="chat_judge",
    options=(
        Option("model", "llava-hf/llava-1.5-13b-hf", "the LLaVA judge (hub name, directory, or a LocalJudge)"),
        Option("batch_size", 32, "captions per forward pass"),
        Option("max_new_tokens", 512, "budget of the greedy answer (an unfinished answer has no score)"),
        Option("digit_search", "step", "'step' reads each decimal at the step that wrote it; 'release' searches "
                                      "the tokens as the released code does"),
        Option("pad_to_square", True, "pad the image to a square as LLaVA-1.5 does"),
    ),
    deviations=(
        Deviation("each decimal is read at the step that wrote it", "digit_search='release'"),
        Deviation("an answer that does not parse as a number in [0, 1] gives no score (None with a reason), "
                  "never a silent 0", None),
        Deviation("videos are judged on G-VEval's three-frame composite (the paper scores images only)", None),
    ),
    unscored_kind="judge_unreadable",
    remote_scorer="capreward.scorers.fleur_remote:RemoteFLEUR",
    position=30,
    sub_score_kinds=ANSWER_KINDS,
    explanation='FLEUR, or RefFLEUR with --references: the score, then the follow-up question "Why? Tell me the '
                'reason."',
))
