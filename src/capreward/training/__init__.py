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

#: Documented in the API reference (docs/api/training.md); the other names above still import from here.
__all__ = ["DifferentiableRewardLoss", "SelfCriticalStep", "UnsupportedVocabularyError", "VocabularyBridge", "reinforce_loss",
           "scst_advantages"]
