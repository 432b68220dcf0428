"""Adapters of capreward's rewards to other RL stacks.

- :mod:`capreward.adapters.factory`: a reward built by name with its options (:func:`build_reward`).
- :mod:`capreward.adapters.verl`: veRL custom reward functions (``compute_score``, batch variant) and
  :mod:`capreward.adapters.verl_manager`, a veRL reward-loop manager.
- :mod:`capreward.adapters.easyr1`: an EasyR1 reward function file (``compute_score``, batch and
  sequential forms; :class:`~capreward.adapters.easyr1.EasyR1Scorer`).
- :mod:`capreward.adapters.labels`: the per-sample label format both veRL and the reward server
  (:mod:`capreward.server`) use to name visuals and references.
- :mod:`capreward.adapters.paths`: which files a label may name (confinement to a media root).
- :mod:`capreward.adapters.scoring`: a labelled batch scored by a reward (what veRL and the server share).


Names are imported on first use, so that reading a reward's name (the command line's help) imports no
model code.
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports

_LAZY = {
    "RewardOptions": "capreward.adapters.factory",
    "build_reward": "capreward.adapters.factory",
    "reward_names": "capreward.adapters.factory",
    "Label": "capreward.adapters.labels",
    "LabelError": "capreward.adapters.labels",
    "parse_label": "capreward.adapters.labels",
    "MediaPaths": "capreward.adapters.paths",
    "ScoredBatch": "capreward.adapters.scoring",
    "score_labelled": "capreward.adapters.scoring",
    "VerlScorer": "capreward.adapters.verl",
    "EasyR1Scorer": "capreward.adapters.easyr1",
    "make_compute_score": "capreward.adapters.verl",
}

#: Documented in the API reference (docs/api/server.md). The rest imports from here too: the label format,
#: the batch scorer and :func:`reward_names`.
__all__ = ["EasyR1Scorer", "MediaPaths", "RewardOptions", "build_reward", "make_compute_score"]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
