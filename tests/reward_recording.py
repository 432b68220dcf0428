"""A reward wrapper for trainer tests: what each call of the reward returned, and the mean TRL logs."""

from __future__ import annotations

import math


class Recording:
    """Wraps a reward, keeping what each call returned (a picklable plain callable, same TRL name)."""

    def __init__(self, reward):
        self.reward = reward
        self.__name__ = reward.__name__
        self.calls: list[dict] = []

    def __call__(self, prompts, completions, completion_ids=None, **kwargs):
        values = self.reward(prompts, completions, completion_ids, **kwargs)
        from capreward.rewards import completion_text

        texts = [completion_text(c) for c in completions]
        self.calls.append({"n": len(completions), "values": list(values), "video": kwargs.get("video"), "texts": texts})
        return values


def nanmean(values) -> float:
    """The mean of the values that are not None (TRL's nanmean of a reward's column); NaN when none is."""
    finite = [v for v in values if v is not None]
    return sum(finite) / len(finite) if finite else math.nan
