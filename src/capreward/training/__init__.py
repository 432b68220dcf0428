"""Training captioners with capreward rewards: self-critical sequence training (SCST) for any
``generate``-capable ``transformers`` captioner, and a differentiable loss that backpropagates a
CLIP-based reward through relaxed (straight-through Gumbel-softmax) captions."""

from .relaxed import (
    DifferentiableRewardLoss,
    RelaxedCaptions,
    RelaxedRewardOutput,
    UnsupportedVocabularyError,
    VocabularyBridge,
    clip_soft_captions,
    gumbel_softmax_st,
    relaxed_decode,
)
from .scst import SCSTOutput, SelfCriticalStep, generated_mask, greedy_captions, repeat_inputs, score_captions
from .scst_math import BASELINES, reinforce_loss, scst_advantages, sequence_log_probs

__all__ = [
    "BASELINES",
    "DifferentiableRewardLoss",
    "RelaxedCaptions",
    "RelaxedRewardOutput",
    "SCSTOutput",
    "SelfCriticalStep",
    "UnsupportedVocabularyError",
    "VocabularyBridge",
    "clip_soft_captions",
    "generated_mask",
    "greedy_captions",
    "gumbel_softmax_st",
    "reinforce_loss",
    "relaxed_decode",
    "repeat_inputs",
    "score_captions",
    "scst_advantages",
    "sequence_log_probs",
]
