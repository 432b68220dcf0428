"""G-VEval's spec (:mod:`capreward.registry`); imports nothing heavy. The scorer: :mod:`.gveval`."""

from __future__ import annotations

from typing import Any
from collections.abc import Mapping

from ..registry import Deviation, JobFlag, MetricSpec, Option, RewardPolicy, register
from .fleur_spec import ANSWER_KINDS

#: The four ACCR dimensions, in the released prompts' order.
ACCR = ("accuracy", "completeness", "conciseness", "relevance")
#: The modes: what the judge is shown besides the caption.
MODES = ("ref-free", "ref-only", "combined")
#: The options G-VEval and VisCE² share: the exact digit tree of a 0..100 score read from a server, and a
#: reward's scale of that score.
TREE_TOP_LOGPROBS_OPTION = Option("tree_top_logprobs", 20, "alternatives each node of the exact digit tree asks a "
                                  "server for (at least 10)")
SCALE_OPTION = Option("scale", 0.01, "the reward is the 0..100 score times this (0.01: rewards in [0, 1])")


def sub_scores(config: Mapping[str, Any]) -> tuple[str, ...]:
    """``raw`` (the judge's answer), ``parsed`` (the integer written after the score marker; ACCR: the mean
    of the four; NaN when there is none) and, with ``accr=True``, the four :data:`ACCR` dimensions."""
    return ("raw", "parsed") + (ACCR if config.get("accr") else ())


def reference_mode(config: Mapping[str, Any]) -> str:
    """``ref-free``: none; ``ref-only`` and ``combined``: required."""
    return "none" if config.get("mode", "ref-free") == "ref-free" else "required"


def visuals_for(config: Mapping[str, Any]) -> tuple[str, ...]:
    """ACCR's prompts are for videos only."""
    return ("video",) if config.get("accr") else ("image", "video")


def needs_visual(config: Mapping[str, Any]) -> bool:
    """``ref-only`` judges the caption against the references alone."""
    return config.get("mode", "ref-free") != "ref-only"


SPEC = register(MetricSpec(
    name="gveval",
    aliases=("g_veval",),
    title="G-VEval",
    summary="A chat VLM reasons about the caption and writes a 0-100 score; the expected score is read from "
            "the distribution of the score's tokens (ACCR: four dimensions).",
    paper="Tong et al., G-VEval: A Versatile Metric for Evaluating Image and Video Captions Using GPT-4o, 2024",
    released_code="https://github.com/ztangaj/gveval",
    scorer="capreward.scorers.gveval:GVEval",
    sub_scores=sub_scores,
    value_range=(0.0, 100.0),
    higher_is_better=True,
    visuals=("image", "video"),
    references="optional",
    shares="chat_judge",
    uses_idf=False,
    backbone="chat_judge",
    judge_backend=True,
    options=(
        Option("mode", "ref-free", "'ref-free', 'ref-only' (needs references) or 'combined' (needs references)"),
        Option("accr", False, "the four ACCR dimensions (videos only)"),
        TREE_TOP_LOGPROBS_OPTION,
        Option("expected", True, "the expected score from the token distribution (False: the written number)"),
        Option("temperature", 0.0, "0 decodes greedily (the release: 1)"),
        Option("top_logprobs", 5, "alternatives asked of a server (the release: 5)"),
        Option("requery", 2, "how many more times an unreadable answer is asked again"),
        Option("fallback", "nan", "what an answer that stays unreadable gets: 'nan' or 'parsed'"),
        Option("structured", False, "constrain the answer to the released format (vLLM)"),
        Option("video_input", "auto", "how a video reaches the judge: 'auto' (frames as a video to a local judge "
                                      "that takes video, else the composite), 'composite' or 'frames'"),
    ),
    deviations=(
        Deviation("greedy decoding (temperature 0); the release samples at temperature 1", "temperature=1.0"),
        Deviation("an answer that stays unreadable keeps its place with NaN and the reason (the release drops "
                  "the sample)", None),
        Deviation("a local judge that takes video (Qwen2-VL, Qwen2.5-VL, LLaVA-OneVision) gets the composite's "
                  "three frames as a video (the release sends GPT-4o the composite image)", "video_input='composite'"),
        Deviation("on a judge that writes numbers digit by digit, the exact distribution over 0..100 from a "
                  "digit tree (the release keeps the top-5 whole-number alternatives)", None),
    ),
    reference_mode=reference_mode,
    visuals_for=visuals_for,
    needs_visual=needs_visual,
    unscored_kind="judge_unreadable",
    position=60,
    sub_score_kinds=ANSWER_KINDS,
    explanation="G-VEval: the judge writes its reasoning before the score; that reasoning is the explanation",
    reward_policy=RewardPolicy(
        options=(SCALE_OPTION,),
        scale="scale",
    ),
    job_flags=(
        JobFlag("gveval_mode", ("--gveval-mode",), "G-VEval inputs: visual only, references (+ visual), or both; "
                "ref-only/combined need references on every row", option="mode", choices=MODES, adapters=True),
        JobFlag("gveval_accr", ("--gveval-accr",), "G-VEval's four ACCR scores (accuracy, completeness, conciseness, "
                "relevance; videos only)", option="accr", type="flag", record="bool"),
    ),
))
