"""Loading a model without moving the caller's random streams.

Building a model draws from torch's global generators (its layers are initialised before the checkpoint
overwrites them). A reward builds its scorer on its first call, which in a trainer is inside the first
training step: without care, attaching a reward, a held-out judge or a monitor, or finding a model
already loaded, would change every later sample the trainer draws. :func:`keeps_random_state` restores
the CPU generator, and the CUDA generators when CUDA is in use, after the block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def keeps_random_state() -> Iterator[None]:
    """Run the block, then put torch's CPU generator (and every CUDA generator, once CUDA is initialised)
    back as they were before it. The generators are process-wide: a thread that draws from them while the
    block runs has its draws undone too (a trainer waits for its rewards, so none does).

    Yields:
        None.

    Examples:
        >>> import torch
        >>> from capreward.random_state import keeps_random_state
        >>> _ = torch.manual_seed(0); first = torch.rand(3)
        >>> _ = torch.manual_seed(0)
        >>> with keeps_random_state():
        ...     _ = torch.nn.Linear(64, 64)             # draws its initial weights
        >>> torch.equal(torch.rand(3), first)            # the stream goes on as if nothing was built
        True
    """
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices):
        yield


__all__ = ["keeps_random_state"]
