"""Loading and validating images.

Accepted forms: a path (str or ``os.PathLike``), a ``PIL.Image.Image``, a uint8 array of shape
(H, W, 3), or a float tensor of shape (3, H, W) with values in [0, 1]. Everything is turned into an
RGB ``PIL.Image`` so that every form goes through the same (CLIP or VLM) preprocessing and gives
identical scores.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from .errors import MediaError

ImageLike = Any  # str | os.PathLike | PIL.Image.Image | np.ndarray | torch.Tensor


def describe(item: Any, index: int | None = None) -> str:
    """A short human-readable name for an input item, used in error messages."""
    prefix = f"item {index}" if index is not None else "input"
    if isinstance(item, (str, os.PathLike)):
        return f"{prefix} ({os.fspath(item)!r})"
    if isinstance(item, (np.ndarray, torch.Tensor)):
        return f"{prefix} ({type(item).__name__} of shape {tuple(item.shape)})"
    return f"{prefix} ({type(item).__name__})"


def array_to_pil(array: np.ndarray, name: str) -> Image.Image:
    """Validate a uint8 (H, W, 3) array and wrap it as an RGB image."""
    if array.dtype != np.uint8:
        raise MediaError(name, f"image arrays must be uint8 (H, W, 3), got dtype {array.dtype}")
    if array.ndim != 3 or array.shape[2] != 3:
        raise MediaError(name, f"image arrays must have shape (H, W, 3), got {tuple(array.shape)}")
    if array.shape[0] == 0 or array.shape[1] == 0:
        raise MediaError(name, "image is empty (zero height or width)")
    return Image.fromarray(np.ascontiguousarray(array), mode="RGB")


def tensor_to_pil(tensor: torch.Tensor, name: str) -> Image.Image:
    """Validate a float (3, H, W) tensor in [0, 1] and convert it to an RGB image."""
    if tensor.dtype == torch.uint8:
        if tensor.ndim == 3 and tensor.shape[0] == 3 and tensor.shape[2] != 3:
            return array_to_pil(tensor.permute(1, 2, 0).cpu().numpy(), name)
        return array_to_pil(tensor.cpu().numpy(), name)
    if not tensor.is_floating_point():
        raise MediaError(name, f"image tensors must be float (3, H, W) in [0, 1], got dtype {tensor.dtype}")
    if tensor.ndim != 3 or tensor.shape[0] != 3:
        raise MediaError(name, f"image tensors must have shape (3, H, W), got {tuple(tensor.shape)}")
    if tensor.shape[1] == 0 or tensor.shape[2] == 0:
        raise MediaError(name, "image is empty (zero height or width)")
    t = tensor.detach().float().cpu()
    if torch.isnan(t).any() or torch.isinf(t).any():
        raise MediaError(name, "image tensor contains NaN or infinite values")
    if t.min() < 0 or t.max() > 1:
        raise MediaError(name, f"float image values must lie in [0, 1], got [{t.min():.3g}, {t.max():.3g}]")
    array = (t * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
    return Image.fromarray(np.ascontiguousarray(array), mode="RGB")


def open_image_file(path: str | os.PathLike, name: str) -> Image.Image:
    """Read an image file as RGB, with a clear error when it is missing or unreadable."""
    p = Path(path)
    if not p.exists():
        raise MediaError(name, "file does not exist")
    if not p.is_file():
        raise MediaError(name, "path is not a file")
    try:
        with Image.open(p) as im:
            return im.convert("RGB")
    except (UnidentifiedImageError, OSError) as exc:
        raise MediaError(name, f"cannot read image: {exc}") from exc


def load_image(item: ImageLike, index: int | None = None) -> Image.Image:
    """Return ``item`` as an RGB ``PIL.Image``; raise ``MediaError`` naming the item if it is unusable."""
    name = describe(item, index)
    if isinstance(item, (str, os.PathLike)):
        return open_image_file(item, name)
    if isinstance(item, Image.Image):
        if item.width == 0 or item.height == 0:
            raise MediaError(name, "image is empty (zero height or width)")
        return item if item.mode == "RGB" else item.convert("RGB")
    if isinstance(item, np.ndarray):
        return array_to_pil(item, name)
    if isinstance(item, torch.Tensor):
        return tensor_to_pil(item, name)
    if item is None:
        raise MediaError(name, "image is missing (None)")
    raise MediaError(name, f"unsupported image type {type(item).__name__}")
