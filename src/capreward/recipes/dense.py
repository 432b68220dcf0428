"""A dense-captioning reward configuration: claim precision, claim coverage and a length guard that
follows the target length, each its own TRL reward, normalised apart.

The 2025-26 dense-captioning recipes (BalCapRL, GDPO) reward correctness and coverage separately and
normalise each reward within its GRPO group before summing, so that a reward with a small spread is not
drowned by one with a large spread. :func:`dense_rewards` returns the three rewards and their weights;
:func:`aggregation_args` the ``GRPOConfig`` field that makes TRL normalise them apart
(``multi_objective_aggregation="normalize_then_sum"``, in TRL >= 0.27's ``GRPOConfig``; an empty dict on
a TRL without it, which then sums first: the weights still apply).

- ``claims_precision``: :class:`~capreward.rewards.claims.ClaimsReward` ``part="precision"``;
- ``claims_recall``: the same scorer, ``part="recall"`` (a second call costs no judge request: the
  verdicts are cached);
- ``length``: :class:`LengthGuardReward`, ``ceil(length_ratio * L)`` words free with L the median
  reference length (a dense caption is not penalised for being as long as its references; a sample
  without references is unscored, with the reason), repetition and truncation guards too.

Example::

    >>> from capreward.judges import LocalChatJudge
    >>> from capreward.recipes.dense import aggregation_args, dense_rewards
    >>> from capreward.testing.tiny_claim_judge import tiny_claim_judge
    >>> funcs, weights = dense_rewards(LocalChatJudge(tiny_claim_judge()), coverage="lexical")
    >>> [f.__name__ for f in funcs], weights
    (['claims_precision', 'claims_recall', 'length'], [1.0, 1.0, 0.5])
    >>> aggregation_args()
    {'multi_objective_aggregation': 'normalize_then_sum'}
"""

from __future__ import annotations

import dataclasses
from typing import Any
from collections.abc import Sequence

from ..rewards.base import RewardFunction, RewardOutput
from ..rewards.guards import LENGTH_RATIO, Guards


class LengthGuardReward(RewardFunction):
    """The guards of :class:`~capreward.rewards.guards.Guards` as a reward of their own: the sum of their
    terms (each in [-weight, 0]), with the length limit conditioned on the sample's target
    (``Guards.length_target``, default the references). Logged terms: ``guard/<term>``."""

    __name__ = "length"

    def __init__(self, guards: Guards | None = None, *, references_column: str = "references", name: str | None = None):
        super().__init__(name=name)
        self.guards = guards if guards is not None else Guards(length_target="references")
        self.references_column = references_column

    def value_range(self) -> tuple[float, float]:
        return (-sum(self.guards.weights().values()), 0.0)

    def compute(self, prompts: Sequence[Any] | None, completions: Sequence[Any], **kwargs: Any) -> RewardOutput:
        from ..rewards.inputs import completion_text

        values: list[float | None] = []
        reasons: list[str | None] = []
        metrics: dict[str, list[float]] = {}
        for i, completion in enumerate(completions):
            try:
                text = completion_text(completion, i)
                limit = self.guards.max_words_for(kwargs, i, self.references_column)
            except (TypeError, ValueError) as exc:
                values.append(None)
                reasons.append(f"completions[{i}]: {exc}")
                continue
            terms = self.guards.terms(text, max_words=limit)
            for term, value in terms.items():
                metrics.setdefault(f"guard/{term}", [float("nan")] * len(completions))[i] = value
            values.append(sum(terms.values()))
            reasons.append(None)
        return RewardOutput(values, reasons, metrics)


def dense_rewards(
    backend: Any,
    *,
    weights: tuple[float, float, float] = (1.0, 1.0, 0.5),
    length_ratio: float = LENGTH_RATIO,
    **scorer_options: Any,
) -> tuple[list[Any], list[float]]:
    """``([claims_precision, claims_recall, length], weights)`` on the chat judge ``backend``;
    ``scorer_options`` go to :class:`~capreward.scorers.claims.ClaimScorer` (``coverage``, ``max_claims``...)."""
    from ..rewards.claims import ClaimsReward
    from ..scorers.claims import ClaimScorer

    scorer = ClaimScorer(backend, **scorer_options)
    funcs = [
        ClaimsReward(scorer=scorer, part="precision", name="claims_precision"),
        ClaimsReward(scorer=scorer, part="recall", name="claims_recall"),
        LengthGuardReward(Guards(length_target="references", length_ratio=length_ratio)),
    ]
    return funcs, [float(w) for w in weights]


def aggregation_args(config_class: Any = None) -> dict[str, str]:
    """``{"multi_objective_aggregation": "normalize_then_sum"}`` when ``config_class`` (default: TRL's
    ``GRPOConfig``) has that field, else ``{}``."""
    if config_class is None:
        from .._extras import require

        config_class = require("recipes", "trl", used_by="the dense configuration's aggregation").GRPOConfig
    names = {f.name for f in dataclasses.fields(config_class)}
    return {"multi_objective_aggregation": "normalize_then_sum"} if "multi_objective_aggregation" in names else {}
