"""``RewardCaptionerModule``: a Lightning module that fine-tunes a ``transformers`` captioner with a
capreward objective (SCST or the differentiable reward loss), optionally mixed with cross-entropy, and
returns greedy captions from ``validation_step`` for :class:`capreward.callbacks.CaptionScoreCallback`.

Batches are dicts: the model's inputs under ``input_keys`` (default ``("pixel_values",)``), the visuals in
the reward's form under ``visual_key`` (default ``"image"``: paths, PIL images or arrays), optional
``"references"`` (a list of reference lists) and, for cross-entropy, ``"labels"`` (target ids padded
with -100).
"""

from __future__ import annotations

from typing import Any
from collections.abc import Sequence

import torch

from .._extras import require
from .relaxed import DifferentiableRewardLoss
from .scst import SelfCriticalStep, greedy_captions

# lightning.pytorch, or the standalone pytorch_lightning package
lp: Any = require("callbacks", "lightning.pytorch", "pytorch_lightning", used_by="capreward.training.lightning")


class RewardCaptionerModule(lp.LightningModule):
    """Fine-tune ``model`` with ``objective``.

    Args:
        model: a ``transformers`` captioner (``generate``-capable; encoder-decoder for the differentiable
            loss).
        tokenizer: its tokenizer.
        objective: a :class:`SelfCriticalStep`, a :class:`DifferentiableRewardLoss`, or None
            (cross-entropy only).
        ce_weight: weight of the cross-entropy term on ``batch["labels"]`` added to the objective's loss
            (required > 0 when ``objective`` is None).
        lr, weight_decay: AdamW settings.
        max_new_tokens: caption length at validation (greedy).
        input_keys, visual_key: where the model inputs and the visuals are in a batch.
        references_key: where each visual's reference captions are (given to the objective), or None
            for an objective that takes none (e.g. a reference-free reward).
        generation_kwargs: passed to ``generate`` at validation (e.g. ``suppress_tokens``).

    Logs ``train/loss``, ``train/ce`` and the objective's metrics as ``train/<name>`` (``train/reward``,
    ``train/reward_greedy``, sub-scores).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        objective: SelfCriticalStep | DifferentiableRewardLoss | None = None,
        *,
        ce_weight: float = 0.0,
        lr: float = 1e-4,
        weight_decay: float = 0.0,
        max_new_tokens: int = 16,
        input_keys: Sequence[str] = ("pixel_values",),
        visual_key: str = "image",
        references_key: str | None = "references",
        generation_kwargs: dict[str, Any] | None = None,
    ):
        super().__init__()
        if objective is None and ce_weight <= 0:
            raise ValueError("without an objective, ce_weight must be > 0 (cross-entropy only)")
        self.model = model
        self.tokenizer = tokenizer
        self.objective = objective
        self.ce_weight = ce_weight
        self.lr = lr
        self.weight_decay = weight_decay
        self.max_new_tokens = max_new_tokens
        self.input_keys = tuple(input_keys)
        self.visual_key = visual_key
        self.references_key = references_key
        self.generation_kwargs = dict(generation_kwargs or {})

    def model_inputs(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {k: batch[k] for k in self.input_keys}

    def cross_entropy(self, batch: dict[str, Any]) -> torch.Tensor:
        """Teacher-forced cross-entropy of ``batch["labels"]`` (the model's own loss)."""
        if "labels" not in batch:
            raise KeyError("cross-entropy needs batch['labels'] (target ids, padding = -100)")
        return self.model(**self.model_inputs(batch), labels=batch["labels"]).loss

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        n = len(batch[self.visual_key])
        loss = torch.zeros((), device=self.device)
        if self.objective is not None:
            references = batch.get(self.references_key) if self.references_key else None
            out = self.objective(self.model, self.model_inputs(batch), batch[self.visual_key], references)
            loss = loss + out.loss
            for name, value in out.metrics.items():
                if value == value:  # NaN: nothing to log
                    self.log(f"train/{name}", float(value), batch_size=n, on_step=True, on_epoch=True)
        if self.ce_weight > 0:
            ce = self.cross_entropy(batch)
            loss = loss + self.ce_weight * ce
            self.log("train/ce", ce.detach(), batch_size=n, on_step=True, on_epoch=True)
        self.log("train/loss", loss.detach(), batch_size=n, on_step=True, on_epoch=True)
        return loss

    def generate_captions(self, batch: dict[str, Any]) -> list[str]:
        """Greedy captions of a batch's visuals."""
        return greedy_captions(self.model, self.tokenizer, self.model_inputs(batch), self.max_new_tokens, **self.generation_kwargs)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, list[str]]:
        return {"captions": self.generate_captions(batch)}

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, list[str]]:
        return {"captions": self.generate_captions(batch)}

    def configure_optimizers(self):
        return torch.optim.AdamW(self.model.parameters(), lr=self.lr, weight_decay=self.weight_decay)
