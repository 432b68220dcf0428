"""Any metric's reward, by name, read from its spec in :mod:`capreward.registry`."""

from __future__ import annotations

from typing import Any

from .metric_reward import MetricReward


def reward_for(name: str, **options: Any) -> Any:
    """The reward of metric ``name`` (any spelling or alias) built with ``options``: its named class
    (``reward_for("clipscore", w=2.5)`` is a :class:`~capreward.rewards.CLIPScoreReward`), else the
    generic :class:`~capreward.rewards.MetricReward` fixed to it (a metric added by a plugin): the same
    reward either way (:meth:`~capreward.rewards.MetricReward.class_for`).

    Args:
        name: a metric name or alias.
        **options: the reward's keyword arguments (its signature lists them); an unknown one raises
            :class:`~capreward.registry.UnknownOption`.

    Returns:
        The reward (TRL's reward-function contract; ``__name__`` is the metric's one name).

    Raises:
        capreward.registry.UnknownMetric: no metric is called ``name`` (with the nearest names).
    """
    return MetricReward.class_for(name)(**options)


__all__ = ["reward_for"]
