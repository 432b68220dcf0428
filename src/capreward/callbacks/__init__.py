"""Validation scoring during training: a Lightning callback and a transformers ``TrainerCallback`` over the
torchmetrics Metrics of :mod:`capreward.torchmetrics`, and the Goodhart monitor.

- :class:`CaptionScoreCallback` (``lightning``): scores the captions returned by ``validation_step``
  and logs ``val/<metric>`` through ``pl_module.log`` (monitorable by ModelCheckpoint/EarlyStopping).
- :func:`sample_ids` (``sampler_ids``): the dataset indices of a Lightning evaluation batch, read from its
  ``DistributedSampler``, for exact results under DDP (``metric.update(..., ids=sample_ids(...))``).
- :class:`CaptionEvalCallback` (``transformers``): at each evaluation of a transformers/TRL trainer,
  generates captions for a held-out set on all processes, scores them and logs through the trainer.
- :class:`GoodhartMonitor`, :class:`GoodhartCallback` (``goodhart``; TRL and transformers trainers),
  :class:`GoodhartLightningCallback` (``goodhart_lightning``): score the training samples with held-out
  judges (a second reward model, ground truth) beside the training reward, and warn when the training
  reward rises while a held-out judge falls.

The Metrics themselves (``EMScoreMetric``, ...) import from :mod:`capreward.torchmetrics`. Imports are lazy
so that using one integration never imports the other framework.
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports

_LAZY = {
    "CaptionScoreCallback": "capreward.callbacks.lightning",
    "CaptionEvalCallback": "capreward.callbacks.transformers",
    "sample_ids": "capreward.callbacks.sampler_ids",
    "GoodhartMonitor": "capreward.callbacks.goodhart",
    "GoodhartCallback": "capreward.callbacks.goodhart",
    "GoodhartWarning": "capreward.callbacks.goodhart",
    "GoodhartLightningCallback": "capreward.callbacks.goodhart_lightning",
}

#: Documented in the API reference (docs/api/metrics.md).
__all__ = ["CaptionEvalCallback", "CaptionScoreCallback", "GoodhartCallback", "GoodhartLightningCallback",
           "GoodhartMonitor", "GoodhartWarning", "sample_ids"]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
