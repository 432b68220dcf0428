"""``GoodhartLightningCallback``: the Goodhart monitor (:mod:`capreward.callbacks.goodhart`) on a Lightning
training loop (SCST and other RL loops written as a ``LightningModule``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._extras import require
from .goodhart import GoodhartMonitor

Callback: Any = require("callbacks", "lightning.pytorch", "pytorch_lightning", used_by="GoodhartLightningCallback").Callback


class GoodhartLightningCallback(Callback):
    """After each training batch, scores the captions ``training_step`` returned with the monitor's
    held-out judges, logs ``goodhart/train``, ``goodhart/<judge>`` and ``goodhart/gap/<judge>`` through
    ``pl_module.log`` and warns (through the monitor) when the training reward rises while a judge falls.

    ``training_step`` returns a dict with the loss, the sampled ``captions`` (key ``captions_key``) and
    their training rewards (key ``rewards_key``: a sequence or tensor, one value per caption); the judges
    get the batch's ``columns`` (a mapping batch's entries, e.g. ``image`` and a ground-truth ``colour``)
    repeated to match when several captions were sampled per batch item.

    Args:
        monitor: the :class:`~capreward.callbacks.goodhart.GoodhartMonitor`.
        captions_key: the key of the captions in ``training_step``'s returned dict.
        rewards_key: the key of their training rewards in that dict.
        columns: batch keys passed to the judges as keyword arguments.

    Examples:
        >>> from capreward.callbacks.goodhart import GoodhartMonitor
        >>> cb = GoodhartLightningCallback(GoodhartMonitor({"truth": lambda prompts, completions, **k: [1.0] * len(completions)}), columns=("colour",))
        >>> # lightning.Trainer(callbacks=[cb]); training_step returns {"loss": ..., "captions": [...], "rewards": [...]}
    """

    def __init__(self, monitor: GoodhartMonitor, captions_key: str = "captions", rewards_key: str = "rewards",
                 columns: Sequence[str] = ()):
        self.monitor = monitor
        self.captions_key = captions_key
        self.rewards_key = rewards_key
        self.columns = tuple(columns)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not isinstance(outputs, Mapping) or self.captions_key not in outputs or self.rewards_key not in outputs:
            raise ValueError(f"GoodhartLightningCallback: training_step must return a dict with {self.captions_key!r} "
                             f"and {self.rewards_key!r}; got {type(outputs).__name__}"
                             + (f" with keys {sorted(outputs)}" if isinstance(outputs, Mapping) else ""))
        captions = [str(c) for c in outputs[self.captions_key]]
        rewards = outputs[self.rewards_key]
        rewards = rewards.detach().flatten().tolist() if hasattr(rewards, "detach") else list(rewards)
        columns = {}
        for key in self.columns:
            if not isinstance(batch, Mapping) or key not in batch:
                raise ValueError(f"GoodhartLightningCallback: the batch has no column {key!r}")
            values = list(batch[key])
            if values and len(captions) % len(values) == 0:
                repeat = len(captions) // len(values)  # k captions sampled per item, item-major
                values = [v for v in values for _ in range(repeat)]
            columns[key] = values
        self.monitor.observe(rewards, None, captions, **columns)
        for name, value in self.monitor.flush(trainer.global_step).items():
            pl_module.log(name, value, on_step=True, on_epoch=False, batch_size=len(captions))
