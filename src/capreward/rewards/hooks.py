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

import math
from typing import TYPE_CHECKING, Any, Sequence

from ..errors import SampleError
from ..registry import import_path, scorer_values

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


def all_sub_scores(spec: Any, config: dict[str, Any] | None = None) -> tuple[str, ...]:
    """Every sub-score ``spec`` writes with ``config`` for any visual kind it takes, with and without
    references (as its reference mode allows), in the order the spec names them."""
    config = spec.configured(config)
    refs = {"none": (False,), "required": (True,)}.get(spec.references_for(config), (False, True))
    out: list[str] = []
    for visual in spec.visual_kinds(config) or (None,):
        for with_refs in refs:
            for sub in spec.sub_scores_for({**config, "visual": visual, "references": with_refs}):
                if sub not in out:
                    out.append(sub)
    return tuple(out)


def result_column(result: Any, sub: str, n: int) -> list[float]:
    """Sub-score ``sub`` of a scorer's ``result`` (attribute ``sub`` with ``/`` read as ``_``) as k floats,
    NaN where it is missing or not a number (the whole column when the result has none)."""
    values = scorer_values(result, sub)
    if values is None:
        return [math.nan] * n
    if hasattr(values, "tolist"):
        values = values.tolist()
    out = []
    for v in list(values)[:n]:
        out.append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan)
    return out + [math.nan] * (n - len(out))


class ScoreHooks(RewardHooks):
    """The reward of a metric whose spec names no hooks: the scorer is called as its spec says
    (``score(captions, images=/videos=, references=)``, references only where its reference mode is not
    ``"none"``); the value is ``result.score``, each sub-score of the spec
    (:meth:`~capreward.registry.MetricSpec.sub_scores_for`) is logged from ``result.<sub-score>`` (``/``
    read as ``_``; NaN where the result has none), and ``result.error``, when the result has it, is the
    reason of a sample without a score. A new metric therefore needs no reward code: its spec and its
    scorer are enough.
    """

    def metric_names(self, reward: "MetricReward") -> tuple[str, ...]:
        return all_sub_scores(reward.spec, reward.scorer_kwargs)

    def score_group(self, reward: "MetricReward", captions: list[str], visuals: list[Any] | None, kind: str | None,
                    references: list[list[str]] | None, visual_ids: list[str | None] | None) -> "GroupScores":
        from .base import GroupScores

        spec = reward.spec
        config = spec.configured(reward.scorer_kwargs)
        kwargs: dict[str, Any] = {}
        if kind in ("image", "video") and visuals is not None:
            if kind not in spec.visual_kinds(config):
                reason = SampleError(None, "input", "", f"{spec.title} scores {' and '.join(spec.visual_kinds(config))} only, "
                                                        f"got a {kind}")
                return GroupScores(scores=[None] * len(captions), reasons=[reason] * len(captions))
            kwargs[f"{kind}s"] = visuals
        if spec.references_for(config) != "none" and references is not None:
            kwargs["references"] = references
        result = reward.scorer.score(captions, **kwargs)
        n = len(captions)
        scores = [None if math.isnan(v) else v for v in result_column(result, "score", n)]
        errors = list(getattr(result, "error", None) or [None] * n)
        reasons = [None if s is not None else (e or None) for s, e in zip(scores, errors)]
        metrics = {sub: result_column(result, sub, n) for sub in self.metric_names(reward)}
        return GroupScores(scores=scores, reasons=reasons, metrics=metrics)


__all__ = ["RewardHooks", "ScoreHooks"]
