"""Adapters of capreward's rewards to other RL stacks.

- :mod:`capreward.adapters.verl`: veRL custom reward functions (``compute_score``, batch variant).
- :mod:`capreward.server`: the OpenRLHF-compatible HTTP reward server (``capreward serve``; it was
  ``capreward.adapters.openrlhf``, ``.batching`` and ``.connections``, which still import).
- :mod:`capreward.adapters.labels`: the per-sample label format both use to name visuals and references.
- :mod:`capreward.adapters.paths`: which files a label may name (confinement to a media root).
- :mod:`capreward.adapters.json_limits`: bounds on a request's JSON, each refusal naming the field.
- :mod:`capreward.adapters.ray_serve`: the server as Ray Serve replicas (``capreward[serve]``).
"""

from .factory import RewardOptions, build_reward, reward_names
from .labels import Label, LabelError, parse_label
from .paths import MediaPaths
from .scoring import ScoredBatch, score_labelled
from .verl import VerlScorer, make_compute_score


#: The server's names, exported here before it had its own package (imported on first use).
_SERVER = {"DynamicBatcher": "capreward.server.batching", "RewardHTTPServer": "capreward.server.http",
           "RewardService": "capreward.server.http", "ServerLimits": "capreward.server.http",
           "make_server": "capreward.server.http"}


def __getattr__(name: str):
    if name == "REWARD_NAMES":  # read from the registry (capreward.adapters.factory.reward_names)
        return reward_names()
    if name in _SERVER:
        import importlib

        return getattr(importlib.import_module(_SERVER[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Documented in the API reference (docs/api/server.md). The rest still imports from here: the server's
#: classes (now in :mod:`capreward.server`), ``REWARD_NAMES``, the label format and the batch scorer.
__all__ = ["MediaPaths", "RewardOptions", "build_reward", "make_compute_score"]
