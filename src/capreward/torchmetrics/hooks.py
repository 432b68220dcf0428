"""What one metric's torchmetrics Metric does that the generic
:class:`~capreward.torchmetrics.RegisteredMetric` cannot read from the metric's spec: a
:class:`MetricHooks` subclass per metric, named by :attr:`~capreward.registry.MetricSpec.metric_hooks`.

The spec gives the name, the range (the plot bounds), the default visual kind, whether a sample needs a
visual and whether a language model reads the caption. The hooks give the per-caption columns and how
the scorer's result fills them. Hooks keep no state: the Metric holds everything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from .registered import RegisteredMetric


class MetricHooks:
    """The per-metric part of :class:`~capreward.torchmetrics.RegisteredMetric` (every method takes the
    Metric). Subclasses implement :meth:`columns` and :meth:`score_rows`."""

    #: scorer options that cannot come with a built ``scorer=`` (``"give either scorer= or X=, not both"``)
    exclusive: tuple[str, ...] = ()
    #: a scorer option that must be given when ``scorer=`` is not (the judges' ``backend``), or None
    required: str | None = None
    #: the one visual kind the Metric takes whatever ``visual=`` says (VisCE²: images), or None
    fixed_visual: str | None = None

    def check(self, metric: "RegisteredMetric", scorer: Any, visual: str | None) -> None:
        """Refuse a configuration before the Metric is set up (ValueError)."""

    def name(self, metric: "RegisteredMetric", scorer: Any) -> str:
        """The default log name: the metric's one name."""
        return metric.spec.name

    def columns(self, metric: "RegisteredMetric", scorer: Any) -> tuple[str, ...]:
        """The per-caption columns, ``"score"`` first and ``"empty"`` second."""
        raise NotImplementedError

    def plot_bounds(self, metric: "RegisteredMetric") -> tuple[float, float]:
        """The plot's bounds: the spec's :attr:`~capreward.registry.MetricSpec.value_range`."""
        return tuple(metric.spec.value_range)  # type: ignore[return-value]

    def check_mode(self, metric: "RegisteredMetric", has_visuals: bool, has_refs: bool) -> None:
        """Refuse an update without the inputs the metric needs (ValueError naming them)."""

    def score_rows(self, metric: "RegisteredMetric", candidates: list[str], visuals, references,
                   visual_ids) -> "torch.Tensor":
        """Rows [n, len(columns)] for non-empty captions (see :meth:`CaptionMetric._score_rows`)."""
        raise NotImplementedError

    def parts(self, metric: "RegisteredMetric", has_visuals: bool, has_refs: bool) -> list[str]:
        """The columns an empty caption gets ``empty_score`` in."""
        return [c for c in metric.columns if c not in ("empty", "truncated", "parsed")]

    def __reduce__(self):  # stateless: pickled and copied by class
        return (type(self), ())


class ScoreMetricHooks(MetricHooks):
    """The Metric of a metric whose spec names no hooks: columns ``score``, ``empty`` and every sub-score
    of its spec (:func:`capreward.rewards.hooks.all_sub_scores`); the scorer is called as its spec says
    (``score(captions, images=/videos=, references=)``) and ``result.score`` and ``result.<sub-score>``
    (``/`` read as ``_``) fill them (NaN where the result has none)."""

    def columns(self, metric: "RegisteredMetric", scorer: Any) -> tuple[str, ...]:
        from ..rewards.hooks import all_sub_scores

        config = {o.name: getattr(scorer, o.name) for o in metric.spec.options if hasattr(scorer, o.name)}
        return ("score", "empty", *all_sub_scores(metric.spec, config))

    def score_rows(self, metric: "RegisteredMetric", candidates: list[str], visuals, references,
                   visual_ids) -> "torch.Tensor":
        import torch

        from ..rewards.hooks import result_column

        kwargs: dict[str, Any] = {}
        if visuals is not None:
            kwargs[f"{metric.visual}s"] = visuals
        if references is not None and metric.spec.references != "none":
            kwargs["references"] = references
        result = metric.scorer.score(candidates, **kwargs)
        n = len(candidates)
        cols = {c: torch.tensor(result_column(result, c, n), dtype=torch.float32)
                for c in metric.columns if c != "empty"}
        return metric._row_tensor(cols, n)


__all__ = ["MetricHooks", "ScoreMetricHooks"]
