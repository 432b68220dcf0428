"""torchmetrics Metrics of caption quality (DDP-synced per-sample states), for Lightning and any loop.

- :class:`RegisteredMetric`: any registered metric's Metric, read from its spec (``RegisteredMetric("emscore",
  clip)``); the per-metric classes below are it fixed to one metric.
- :mod:`capreward.torchmetrics.metrics`: :class:`CaptionMetric`, :class:`EMScoreMetric`,
  :class:`CLIPScoreMetric`, :class:`FLEURMetric`.
- :mod:`capreward.torchmetrics.judges`: :class:`VisCE2Metric`, :class:`GVEvalMetric`.
- :mod:`capreward.torchmetrics.summary`: :class:`CaptionScores`, a Metric's per-sample scores after
  synchronisation (ids deduplicated and ordered); :mod:`capreward.torchmetrics.sources` reads captions,
  visuals and ids out of batches; :mod:`capreward.torchmetrics.distributed` gathers small objects.

The callbacks of :mod:`capreward.callbacks` read these Metrics; nothing here imports the callbacks. Names
are imported on first use (torchmetrics is the ``callbacks`` extra).
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports

_LAZY = {
    "CaptionMetric": "capreward.torchmetrics.metrics",
    "EMScoreMetric": "capreward.torchmetrics.metrics",
    "CLIPScoreMetric": "capreward.torchmetrics.metrics",
    "FLEURMetric": "capreward.torchmetrics.metrics",
    "RegisteredMetric": "capreward.torchmetrics.metrics",
    "VisCE2Metric": "capreward.torchmetrics.judges",
    "GVEvalMetric": "capreward.torchmetrics.judges",
    "CaptionScores": "capreward.torchmetrics.summary",
}

__all__ = sorted([*(n for n in _LAZY if n != "CaptionScores"), "metric_for"])


def metric_for(name: str, *args, **options):
    """The torchmetrics Metric of metric ``name`` (any spelling or alias) built with ``options``: its named
    class (``EMScoreMetric``), else :class:`RegisteredMetric` reading its spec (PAC-S, the claims, a metric
    added by a plugin): the same Metric either way.

    Args:
        name: a metric name or alias (:func:`capreward.registry.names`).
        *args: the Metric's positional arguments (its backbone or judge).
        **options: the Metric's options.

    Returns:
        The torchmetrics Metric.

    Raises:
        capreward.registry.UnknownMetric: no metric is called ``name``.
        capreward.registry.UnknownOption: an option the Metric does not take.
    """
    from . import judges, metrics  # noqa: F401  (the named classes)

    return metrics.RegisteredMetric.class_for(name)(*args, **options)


__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
