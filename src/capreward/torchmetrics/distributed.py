"""Gathering small Python objects (captions, references) from every process."""

from __future__ import annotations

from typing import Any

import torch


def is_distributed() -> bool:
    """True inside an initialised ``torch.distributed`` process group with more than one process."""
    return (
        torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_world_size() > 1
    )


def gather_objects(obj: Any) -> list[Any]:
    """Every process's ``obj``, in rank order, on every process (``[obj]`` when not distributed).

    A collective: every process must call it.
    """
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, obj)
    return out
