"""Sample ids (dataset indices) of a Lightning evaluation batch, read from its ``DistributedSampler``.

Under DDP Lightning puts a ``DistributedSampler`` on every validation and test loader. To give each
process the same number of batches it pads the last round with samples from the start of the dataset,
so without ids those samples are scored twice (a 13-sample set on 2 processes is scored as 14). The
sampler's order is a function of its seed and epoch alone, so iterating the loader's batch sampler
again gives, batch by batch, the dataset indices that the loader is feeding: passing them as ``ids``
lets the metrics count every sample once and order them as a single process would.

Other samplers (a ``RandomSampler`` draws a new order per iteration, an ``IterableDataset`` has no
indices) give None: the caller then has no ids, and the metrics warn under DDP.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from torch.utils.data.distributed import DistributedSampler

# batch sampler -> (sampler epoch, the index lists of its batches), recomputed when the epoch changes
_BATCHES: weakref.WeakKeyDictionary[Any, tuple[int, list[list[int]]]] = weakref.WeakKeyDictionary()


def loader_batch_ids(loader: Any, batch_idx: int) -> list[int] | None:
    """The dataset indices of batch ``batch_idx`` of ``loader`` when its sampler is a
    ``DistributedSampler`` (then iterating it again is deterministic); None otherwise or when the loader
    has fewer batches."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    sampler = getattr(batch_sampler, "sampler", None)
    if not isinstance(sampler, DistributedSampler):
        return None
    epoch = int(getattr(sampler, "epoch", 0))
    cached = _BATCHES.get(batch_sampler)
    if cached is None or cached[0] != epoch:
        assert batch_sampler is not None  # it holds the sampler
        cached = (epoch, [[int(i) for i in batch] for batch in batch_sampler])
        _BATCHES[batch_sampler] = cached
    batches = cached[1]
    return list(batches[batch_idx]) if 0 <= batch_idx < len(batches) else None


def eval_loaders(trainer: Any) -> list[Any]:
    """The running evaluation loop's dataloaders, in ``dataloader_idx`` order."""
    loop = None
    try:
        loop = trainer._evaluation_loop  # the loop that is running: fit's validation, validate or test
    except (AttributeError, RuntimeError):
        pass
    combined = getattr(loop, "_combined_loader", None)
    if combined is not None and hasattr(combined, "flattened"):
        return list(combined.flattened)
    loaders = trainer.test_dataloaders if getattr(trainer, "testing", False) else trainer.val_dataloaders
    if loaders is None:
        return []
    if isinstance(loaders, Mapping):
        return list(loaders.values())
    if isinstance(loaders, Sequence):
        return list(loaders)
    return [loaders]


def sample_ids(trainer: Any, batch_idx: int, dataloader_idx: int = 0) -> list[int] | None:
    """The dataset indices of the current evaluation batch, for ``metric.update(..., ids=...)``.

    Call it in ``validation_step``/``test_step``.

    Args:
        trainer: the Lightning trainer (``self.trainer``).
        batch_idx: the step's ``batch_idx``.
        dataloader_idx: the step's ``dataloader_idx`` (with several loaders).

    Returns:
        A list of ints (one per sample of the batch) when the loader's sampler is a
        ``DistributedSampler`` (what Lightning uses under DDP), else None, which ``update`` reads as
        "no ids" (single-process runs need none).
    """
    loaders = eval_loaders(trainer)
    if not 0 <= dataloader_idx < len(loaders):
        return None
    return loader_batch_ids(loaders[dataloader_idx], batch_idx)
