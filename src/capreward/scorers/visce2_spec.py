"""VisCE²'s spec (:mod:`capreward.registry`); imports nothing heavy. The scorer: :mod:`.visce2`."""

from __future__ import annotations

from typing import Any
from collections.abc import Mapping

from ..registry import Deviation, MetricSpec, Option, RewardPolicy, register
from .gveval_spec import SCALE_OPTION, TREE_TOP_LOGPROBS_OPTION


def sub_scores(config: Mapping[str, Any]) -> tuple[str, ...]:
    """``raw`` (the rating answer), ``context`` (the visual context), ``parsed`` (the integer the answer
    wrote, NaN when it wrote none: the score is then 0, as in the paper); ``expected`` with ``expected=True``."""
    return ("raw", "context", "parsed") + (("expected",) if config.get("expected") else ())


def value(config: Mapping[str, Any]) -> str:
    """A reward's value: the written score, or with ``use_expected=True`` the expected one."""
    return "expected" if config.get("use_expected") else "score"


def implies(options: Mapping[str, Any]) -> Mapping[str, Any]:
    """``use_expected=True`` needs the scorer's expected scores."""
    return {"expected": True} if options.get("use_expected") else {}


SPEC = register(MetricSpec(
    name="visce2",
    aliases=("visce_2", "visce²"),
    title="VisCE²",
    summary="A VLM writes a structured visual context of the image once, then rates the caption 0-100 given "
            "the image, the context and the caption.",
    paper="Maeda et al., Vision Language Model-based Caption Evaluation Method Leveraging Visual Context "
          "Extraction, 2024",
    released_code="https://github.com/Silviase/VisCE2",
    scorer="capreward.scorers.visce2:VisCE2",
    sub_scores=sub_scores,
    value_range=(0.0, 100.0),
    higher_is_better=True,
    visuals=("image",),  # its visual context describes one image
    references="none",
    shares="chat_judge",
    uses_idf=False,
    backbone="chat_judge",
    judge_backend=True,
    options=(
        Option("expected", False, "also compute the expected score from the token distribution"),
        TREE_TOP_LOGPROBS_OPTION,
        Option("temperature", 0.0, "0 decodes greedily (the release samples at 0.2: VisCE2.released)"),
        Option("prompt", "visce_2", "the rating prompt variant: 'visce_2' (the released head's) or 'visce'"),
        Option("context_max_tokens", 1024, "generation budget of the visual context"),
        Option("max_tokens", 1024, "generation budget of the rating"),
        Option("structured", False, "constrain the rating to start with an integer 0..100 (vLLM)"),
    ),
    deviations=(
        Deviation("greedy decoding (temperature 0), so a reward is deterministic; the release samples at 0.2",
                  "temperature=0.2 (VisCE2.released())"),
    ),
    unscored_kind="judge_unreadable",
    position=50,
    sub_score_kinds={"raw": "data", "context": "data", "parsed": "number"},
    value=value,
    reward_policy=RewardPolicy(
        options=(SCALE_OPTION,
                 Option("use_expected", False, "the reward is the expected score (needs expected=True, set by default)")),
        scale="scale",
        implies=implies,
    ),
))
