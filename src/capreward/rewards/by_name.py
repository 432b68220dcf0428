"""Any metric's reward, by name, read from its spec in :mod:`capreward.registry`."""

from __future__ import annotations

from typing import Any

from .. import registry


def reward_for(name: str, **options: Any) -> Any:
    """The reward of metric ``name`` (any spelling or alias) built with ``options``: the class its spec
    names (:attr:`~capreward.registry.MetricSpec.reward`), so ``reward_for("clipscore", w=2.5)`` is a
    :class:`~capreward.rewards.CLIPScoreReward` (a :class:`~capreward.rewards.MetricReward` fixed to
    CLIP-S); a metric whose spec names hooks but no class gets :class:`~capreward.rewards.MetricReward`.

    Args:
        name: a metric name or alias.
        **options: the reward's keyword arguments (its signature lists them); an unknown one raises
            :class:`~capreward.registry.UnknownOption`.

    Returns:
        The reward (TRL's reward-function contract; ``__name__`` is the metric's one name).

    Raises:
        capreward.registry.UnknownMetric: no metric is called ``name`` (with the nearest names).
    """
    spec = registry.get(name)
    return spec.load_reward()(**options)


__all__ = ["reward_for"]
