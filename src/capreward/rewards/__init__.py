"""Caption-quality rewards for RL fine-tuning (TRL's reward-function contract).

``MetricReward(metric, ...)`` is any registered metric as a reward, read from its spec;
``EMScoreReward``, ``CLIPScoreReward``/``PACScoreReward`` and ``FLEURReward``, ``VisCE2Reward`` and ``GVEvalReward``
are it fixed to one metric; ``ClaimsReward`` (claim-level precision/recall of dense captions) and
``QAUtilityReward`` (CapRL's QA utility) score claims and answers;
``HallucinationPenalty`` penalises caption words the visuals do not support; ``SpecificityReward`` pays a
caption for fitting its own visual better than the other visuals of its batch (an image-blind caption earns 0); ``CompositeReward`` sums
weighted rewards with guards against reward hacking (repetition, truncation, over-length, prompt
injection). The LLM-judge rewards floor captions that forge the judge's prompt (the injection guard).
"""

from .by_name import reward_for
from .base import AsyncReward, CaptionReward, GroupScores, RewardFunction, RewardOutput
from .claims import ClaimsReward
from .clip_family import CLIPScoreReward, EMScoreReward, PACScoreReward
from .composite import CompositeReward
from .fleur import FLEURReward
from .guards import Guards, injection_penalty, length_penalty, repetition_penalty, truncation_penalty
from .hallucination import DEFAULT_THRESHOLD, HallucinationPenalty
from .metric_reward import MetricReward
from .judges import GVEvalReward, VisCE2Reward
from .qa_utility import QAUtilityReward
from .specificity import SpecificityReward
from .inputs import Columns, collect_inputs, completion_text, prompt_images

#: Documented in the API reference (docs/api/rewards.md); the other names above (``AsyncReward``, ``Columns``,
#: ``GroupScores``, ``collect_inputs``...) still import from here.
__all__ = ["CLIPScoreReward", "CaptionReward", "ClaimsReward", "CompositeReward", "EMScoreReward", "FLEURReward", "GVEvalReward", "Guards",
           "HallucinationPenalty", "MetricReward", "PACScoreReward", "QAUtilityReward", "RewardFunction", "RewardOutput", "SpecificityReward", "VisCE2Reward",
           "injection_penalty", "length_penalty", "repetition_penalty", "reward_for", "truncation_penalty"]
