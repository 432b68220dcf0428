"""What one metric's reward does that the generic :class:`~capreward.rewards.MetricReward` cannot read
from the metric's spec: a :class:`RewardHooks` subclass per metric, named by the spec's
:attr:`~capreward.registry.MetricSpec.reward_hooks`.

The spec holds the facts (the scorer, the range, whether a sample needs a visual, whether a language
model reads the caption and so the injection guard is on, the kind of an unscored sample's reason).
The hooks hold the code: the reward's own options (the keyword parameters of :meth:`RewardHooks.options`,
which the reward's signature shows), how the scorer is called on a group of samples and how its result
becomes the value and the logged sub-scores. Hooks keep no state (the reward holds its options as
attributes), so a reward pickles with them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from ..registry import import_path

if TYPE_CHECKING:  # pragma: no cover
    from .base import GroupScores, RewardOutput
    from .inputs import RewardInputs
    from .metric_reward import MetricReward


class RewardHooks:
    """The per-metric part of :class:`~capreward.rewards.MetricReward` (every method takes the reward).

    Subclasses implement :meth:`score_group` and :meth:`metric_names`, and override the rest where the
    metric differs.
    """

    #: ``"module:attr"`` of the class the reward builds when it differs from the spec's scorer
    #: (the hallucination penalty builds the EMScore it reads alignments from)
    scorer: str | None = None
    #: the default of the reward's ``use_references``
    use_references: bool = True
    #: reward options the reward fixes whatever is passed (the hallucination penalty takes no references)
    fixed: dict[str, Any] = {}

    def scorer_class(self, spec: Any) -> type:
        """The class built from the reward's scorer options."""
        return import_path(self.scorer or spec.scorer)

    def options(self) -> dict[str, Any]:
        """The reward's own options, validated: a subclass declares them as keyword parameters with their
        defaults (they appear in the reward's signature) and returns them by name; each becomes an
        attribute of the reward. Raises ValueError for a bad value."""
        return {}

    def check(self, spec: Any, options: dict[str, Any], scorer_options: dict[str, Any]) -> None:
        """Refuse scorer options the reward cannot use (ValueError), before anything is built."""

    def configure(self, reward: "MetricReward") -> None:
        """Adjust the reward once its base is initialised (``needs_visual``, ``use_references`` ...)."""

    def build(self, reward: "MetricReward") -> Any:
        """The scorer, built from ``reward.scorer_kwargs`` (on first use)."""
        return self.scorer_class(reward.spec)(**reward.scorer_kwargs)

    def value_range(self, reward: "MetricReward") -> tuple[float, float]:
        """The reward's range: the spec's :attr:`~capreward.registry.MetricSpec.value_range`."""
        return tuple(reward.spec.value_range)  # type: ignore[return-value]

    def metric_names(self, reward: "MetricReward") -> tuple[str, ...]:
        """The metric's own sub-scores (logged before the base's ``clipped`` and ``injection``)."""
        return ()

    def score_group(self, reward: "MetricReward", captions: list[str], visuals: list[Any] | None, kind: str | None,
                    references: list[list[str]] | None, visual_ids: list[str | None] | None) -> "GroupScores":
        """Score k valid samples sharing a visual kind (see :meth:`CaptionReward.score_group`)."""
        raise NotImplementedError

    # the base's steps, which a metric may wrap (QA utility reads its questions column)
    def compute(self, reward: "MetricReward", prompts: Sequence[Any] | None, completions: Sequence[Any],
                kwargs: dict[str, Any]) -> "RewardOutput":
        from .base import CaptionReward

        return CaptionReward.compute(reward, prompts, completions, **kwargs)

    def score_inputs(self, reward: "MetricReward", inputs: "RewardInputs") -> "RewardOutput":
        from .base import CaptionReward

        return CaptionReward.score_inputs(reward, inputs)

    def call_group(self, reward: "MetricReward", samples, rows, kind, with_refs) -> "GroupScores":
        from .base import CaptionReward

        return CaptionReward._call_group(reward, samples, rows, kind, with_refs)

    def __reduce__(self):  # stateless: pickled by class
        return (type(self), ())


__all__ = ["RewardHooks"]
