"""The one contract between a metric and everything that consumes it: a scorer's :meth:`Scorer.scores`
returns :class:`Scores`.

A metric is its spec (:class:`~capreward.registry.MetricSpec`: facts) and its scorer (its math). Every
consumer reads the scorer's :class:`Scores` and nothing else: the one generic reward
(:class:`~capreward.rewards.MetricReward`), the one generic torchmetrics Metric
(:class:`~capreward.torchmetrics.RegisteredMetric`), the one job runner of ``capreward score``
(:func:`capreward.jobs.runners.metric_runner`) and ``capreward explain``. The sub-score keys of a
:class:`Scores` are exactly the names its spec declares for the configuration it was computed in
(:meth:`~capreward.registry.MetricSpec.sub_scores_for`: the scorer's options, the visual kind and whether
references were given); :meth:`Scores.check` says so or names the difference.

Imports nothing heavy (no torch): values are plain Python lists.

Examples:
    >>> from capreward.scorers.contract import Scores
    >>> s = Scores(score=[0.5, float("nan")], sub_scores={"words": [3, 0]}, errors=[None, "empty caption"])
    >>> s.check(("words",), "toy")
    >>> s.value("words"), len(s)
    ([3.0, 0.0], 2)
    >>> s.check(("words", "overlap"), "toy")
    Traceback (most recent call last):
    ...
    capreward.scorers.contract.ContractError: toy's scorer wrote the sub-scores ['words'] where its spec declares ['words', 'overlap'] (missing: overlap)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable
from collections.abc import Sequence

from ..errors import CaprewardError

#: The extras a consumer reads when a scorer gives them: ``truncated`` (per sample, whether the caption
#: was cut to the text context), ``alignment`` (per sample, the token -> frame alignment a job writes),
#: ``explanation`` (per sample, the judge's reasons: ``capreward explain``).
EXTRAS = ("truncated", "alignment", "explanation")


class ContractError(CaprewardError, TypeError):
    """A scorer broke the contract: its :class:`Scores` has other sub-scores than its spec declares, or
    not one entry per caption (a bug in the metric's code, named with the metric)."""


def floats(values: Any, n: int) -> list[float]:
    """``values`` (a list, tensor or array) as ``n`` floats: NaN where an entry is missing, None, a bool
    or not a number."""
    if values is None:
        return [math.nan] * n
    if hasattr(values, "tolist"):
        values = values.tolist()
    out = [float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan for v in list(values)[:n]]
    return out + [math.nan] * (n - len(out))


@dataclass
class Scores:
    """What a scorer gives for N captions: the one result type every consumer reads.

    Examples:
        >>> from capreward import Scores
        >>> s = Scores(score=[0.9, float("nan")], sub_scores={"ref": [0.8, 0.1]}, errors=[None, "no answer"])
        >>> s.value("ref"), s.reason("score", 1)
        ([0.8, 0.1], 'no answer')

    Args:
        score: the headline per caption (N floats; NaN: no score, ``errors`` says why). It lies in the
            spec's :attr:`~capreward.registry.MetricSpec.value_range` for the scorer's configuration.
        sub_scores: sub-score name -> N values, exactly the names the spec declares for the
            configuration (numbers, or text and lists for the sub-scores the spec's
            :attr:`~capreward.registry.MetricSpec.sub_score_kinds` calls ``"data"``).
        errors: per caption None, or why it has no score (a :class:`~capreward.errors.SampleError`, or a
            plain text of the spec's :attr:`~capreward.registry.MetricSpec.unscored_kind`); a scorer may
            also flag a scored caption (VisCE²'s "no integer in the answer" beside its 0).
        reasons: sub-score name -> per caption None or why that sub-score is NaN where it differs from
            ``errors`` (VisCE²'s expected score; the claims' recall without reference claims).
        extras: per-caption values that are no sub-score (see :data:`EXTRAS`: ``truncated``,
            ``alignment``, ``explanation``).
        result: the scorer's own typed result, for callers that want more than the contract (the
            claims' verdicts with their spans).
    """

    score: list[float]
    sub_scores: dict[str, list[Any]] = field(default_factory=dict)
    errors: list[Any] = field(default_factory=list)
    reasons: dict[str, list[Any]] = field(default_factory=dict)
    extras: dict[str, list[Any]] = field(default_factory=dict)
    result: Any = None

    def __post_init__(self) -> None:
        self.score = floats(self.score, len(self.score) if hasattr(self.score, "__len__") else 0)
        if not self.errors:
            self.errors = [None] * len(self.score)

    def __len__(self) -> int:
        return len(self.score)

    def value(self, name: str) -> list[float]:
        """``"score"`` (the headline) or sub-score ``name`` as floats (NaN where it is not a number or the
        scores have no such sub-score).

        Args:
            name: ``"score"`` or a sub-score.

        Returns:
            One float per caption."""
        if name == "score":
            return list(self.score)
        return floats(self.sub_scores.get(name), len(self))

    def values(self, names: Sequence[str]) -> dict[str, list[float]]:
        """:meth:`value` of each of ``names``, in one call.

        Args:
            names: ``"score"`` and sub-score names.

        Returns:
            Name -> one float per caption."""
        return {name: self.value(name) for name in names}

    def reason(self, name: str, i: int) -> Any:
        """Why caption ``i`` has no ``name`` (the headline or a sub-score): its entry in :attr:`reasons`,
        else in :attr:`errors`.

        Args:
            name: ``"score"`` or a sub-score.
            i: the caption's position.

        Returns:
            The reason, or None."""
        own = self.reasons.get(name) if name != "score" else None
        return (own[i] if own is not None else None) or self.errors[i]

    def check(self, declared: Sequence[str], metric: str) -> None:
        """Raise :class:`ContractError` unless the sub-scores are exactly ``declared`` and every list has one
        entry per caption.

        Args:
            declared: the spec's sub-scores for the configuration scored.
            metric: the metric's name, for the message.
        """
        written, wanted = list(self.sub_scores), list(declared)
        if set(written) != set(wanted):
            missing = [s for s in wanted if s not in written]
            extra = [s for s in written if s not in wanted]
            diff = "; ".join(p for p in (f"missing: {', '.join(missing)}" if missing else "",
                                         f"not declared: {', '.join(extra)}" if extra else "") if p)
            raise ContractError(f"{metric}'s scorer wrote the sub-scores {written} where its spec declares {wanted} ({diff})")
        n = len(self)
        for name, values in [("errors", self.errors), *self.sub_scores.items(), *self.extras.items()]:
            if values is not None and len(values) != n:
                raise ContractError(f"{metric}'s scorer gave {len(values)} {name} for {n} captions")


@runtime_checkable
class Scorer(Protocol):
    """What a metric's scorer provides (the class its spec's :attr:`~capreward.registry.MetricSpec.scorer`
    names). Its constructor takes the spec's options as keywords; its attributes named as the spec's
    options say its configuration.

    Optional, read when present: ``explanations(captions, *, images=, videos=, references=) -> Scores`` with
    ``extras["explanation"]`` (``capreward explain``; the spec's
    :attr:`~capreward.registry.MetricSpec.explanation` says what it is), and the class method
    ``for_explain(settings)`` building the scorer for that command (``settings``: ``judge_model``,
    ``device``, ``dtype``, ``batch_size``, ``max_new_tokens``, ``references``; default: the class with
    no argument).

    Examples:
        >>> from capreward import Scorer, Scores
        >>> class Length:
        ...     def scores(self, captions, *, images=None, videos=None, references=None, visual_ids=None):
        ...         return Scores(score=[min(len(c.split()) / 10, 1.0) for c in captions])
        >>> isinstance(Length(), Scorer), Length().scores(["a red car"]).score
        (True, [0.3])
    """

    def scores(self, captions: Sequence[str], *, images: Sequence[Any] | None = None, videos: Sequence[Any] | None = None,
               references: Sequence[Sequence[str]] | None = None, visual_ids: Sequence[str | None] | None = None,
               **inputs: Any) -> Scores:
        """Score each caption against its visual (at most one of ``images``/``videos``, of a kind the spec
        takes) and its references (only when the spec's reference mode is not ``"none"``).

        Args:
            captions: the captions (non-empty; a consumer never sends an empty one).
            images: one image per caption.
            videos: one video per caption.
            references: one list of reference captions per caption.
            visual_ids: cache keys of the visuals (None: keyed by content).
            **inputs: the spec's :attr:`~capreward.registry.MetricSpec.row_inputs`, one entry per caption
                (QA utility's ``questions``), and the reward options a scorer reads per call
                (:attr:`~capreward.registry.RewardPolicy.options` its ``scores`` names).

        Returns:
            The :class:`Scores` of the captions, one entry per caption in every list.
        """
        ...


__all__ = ["ContractError", "EXTRAS", "Scorer", "Scores", "floats"]
