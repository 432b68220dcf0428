"""Reading captions, visuals, references and sample ids out of batches and step outputs.

A *source* is a key (a dict key, an attribute name, or an int index into a tuple/list batch), a
callable, or None (absent). Batched tensors and arrays are split along their first dimension so that
every field becomes a list with one entry per sample.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from collections.abc import Callable

import numpy as np
import torch

Source = str | int | Callable[..., Any] | None


def read(source: Source, container: Any, what: str, *extra: Any) -> Any:
    """The value ``source`` names in ``container`` (a callable gets ``(container, *extra)``).

    Raises KeyError naming ``what`` and the available keys when the key is missing.
    """
    if source is None:
        return None
    if callable(source):
        return source(container, *extra)
    if isinstance(container, Mapping):
        if source not in container:
            raise KeyError(f"{what}: key {source!r} not found; available keys: {sorted(map(str, container))}")
        return container[source]
    if isinstance(source, int) and isinstance(container, Sequence) and not isinstance(container, str):
        if not -len(container) <= source < len(container):
            raise KeyError(f"{what}: index {source} out of range for a batch of {len(container)} fields")
        return container[source]
    if isinstance(source, str) and hasattr(container, source) and not callable(getattr(container, source)):
        return getattr(container, source)  # e.g. a dataclass or namedtuple batch (methods are not fields)
    raise KeyError(f"{what}: cannot read {source!r} from a {type(container).__name__}")


def per_sample(value: Any, n: int | None, what: str) -> list[Any]:
    """``value`` as a list with one entry per sample (tensors/arrays split along dim 0).

    Raises TypeError for a single string and ValueError when the length is not ``n``.
    """
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{what} must hold one entry per sample, got a single {type(value).__name__}")
    if isinstance(value, torch.Tensor):
        items = list(value.unbind(0)) if value.ndim else [value]
    elif isinstance(value, np.ndarray):
        items = list(value)
    elif isinstance(value, Sequence):
        items = list(value)
    else:
        raise TypeError(f"{what} must be a list, tuple, tensor or array, got {type(value).__name__}")
    if n is not None and len(items) != n:
        raise ValueError(f"{what} has {len(items)} entries for {n} captions; give one per caption")
    return items


#: Dimensions of one visual of each kind: an image (3, H, W) / (H, W, 3), a video (T, H, W, 3).
VISUAL_NDIM = {"image": 3, "video": 4}


def per_visual(value: Any, n: int | None, kind: str, what: str = "visuals") -> list[Any]:
    """``value`` as one visual per sample: a tensor or array with the dimensions of one visual of
    ``kind`` (an image (3, H, W) or (H, W, 3); a video (T, H, W, 3)) is one sample, a batched one is split
    along dim 0, a list is taken as it is (torchmetrics' CLIPScore takes images the same way).

    Raises ValueError for a tensor or array with fewer dimensions than one visual, or a length other
    than ``n``.
    """
    if isinstance(value, (torch.Tensor, np.ndarray)) and kind in VISUAL_NDIM:
        ndim = VISUAL_NDIM[kind]
        if value.ndim < ndim:
            shapes = "(3, H, W) or (H, W, 3)" if kind == "image" else "(T, H, W, 3)"
            raise ValueError(
                f"{what}: expected one {kind} of shape {shapes} or a batch of them, got a {type(value).__name__} "
                f"of shape {tuple(value.shape)}"
            )
        if value.ndim == ndim:
            value = [value]
    return per_sample(value, n, what)


def as_references(value: Any, n: int, what: str = "references") -> list[list[str]]:
    """One list of reference captions per sample (a single str per sample becomes a one-item list).

    A default ``collate_fn`` transposes lists of lists; supply a collate function that keeps each
    sample's references together (or a callable source).
    """
    out = []
    for i, refs in enumerate(per_sample(value, n, what)):
        refs = [refs] if isinstance(refs, str) else list(refs)
        for j, r in enumerate(refs):
            if not isinstance(r, str):
                raise TypeError(f"{what}[{i}][{j}] must be str, got {type(r).__name__}")
        out.append(refs)
    return out


def as_captions(value: Any, n: int | None = None, what: str = "captions") -> list[str]:
    """A list of caption strings; raises TypeError naming the first non-str item."""
    items = per_sample(value, n, what)
    for i, c in enumerate(items):
        if not isinstance(c, str):
            raise TypeError(f"{what}[{i}] must be str, got {type(c).__name__}")
    return items


def as_ids(value: Any, n: int, what: str = "ids") -> list[int]:
    """Sample ids as Python ints; raises TypeError naming the first non-integer entry."""
    out = []
    for i, v in enumerate(per_sample(value, n, what)):
        if isinstance(v, torch.Tensor):
            if v.numel() != 1 or v.is_floating_point():
                raise TypeError(f"{what}[{i}] must be an integer scalar, got a tensor of shape {tuple(v.shape)}")
            v = v.item()
        if isinstance(v, np.generic):
            v = v.item()
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{what}[{i}] must be an int, got {type(v).__name__}")
        out.append(v)
    return out
