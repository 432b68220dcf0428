"""VisCE²'s spec (:mod:`capreward.registry`); imports nothing heavy. The scorer: :mod:`.visce2`."""

from __future__ import annotations

from typing import Any, Mapping

from ..registry import Deviation, MetricSpec, Option, register


def sub_scores(config: Mapping[str, Any]) -> tuple[str, ...]:
    """``raw`` (the rating answer) and ``context`` (the visual context); ``expected`` with ``expected=True``."""
    return ("raw", "context") + (("expected",) if config.get("expected") else ())


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
        Option("tree_top_logprobs", 20, "alternatives each node of the exact digit tree asks a server for (at least 10)"),
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
    reward="capreward.rewards.judges:VisCE2Reward",
    torchmetric="capreward.torchmetrics.judges:VisCE2Metric",
    reward_hooks="capreward.rewards.judges:VisCE2Hooks",
    metric_hooks="capreward.torchmetrics.judges:VisCE2Hooks",
    unscored_kind="judge_unreadable",
    tiny_judge="capreward.testing.tiny_vlm_judges:tiny_vlm_judge",
    position=50,
    job_runner="capreward.scorers.job_runners:visce2_runner",
))
