"""Adapters of capreward's rewards to other RL stacks.

- :mod:`capreward.adapters.factory`: a reward built by name with its options (:func:`build_reward`).
- :mod:`capreward.adapters.verl`: veRL custom reward functions (``compute_score``, batch variant) and
  :mod:`capreward.adapters.verl_manager`, a veRL reward-loop manager.
- :mod:`capreward.adapters.labels`: the per-sample label format both veRL and the reward server
  (:mod:`capreward.server`) use to name visuals and references.
- :mod:`capreward.adapters.paths`: which files a label may name (confinement to a media root).
- :mod:`capreward.adapters.json_limits`: bounds on a request's JSON, each refusal naming the field.
- :mod:`capreward.adapters.scoring`: a labelled batch scored by a reward (what veRL and the server share).
"""

from .factory import RewardOptions, build_reward, reward_names
from .labels import Label, LabelError, parse_label
from .paths import MediaPaths
from .scoring import ScoredBatch, score_labelled
from .verl import VerlScorer, make_compute_score

#: Documented in the API reference (docs/api/server.md). The rest imports from here too: the label format,
#: the batch scorer and :func:`reward_names`.
__all__ = ["MediaPaths", "RewardOptions", "build_reward", "make_compute_score"]
