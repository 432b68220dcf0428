"""Decoding, validating and sampling videos.

Accepted forms: a path (decoded with decord), a uint8 array or tensor of shape (T, H, W, 3), or a
list of frames (PIL images or uint8 (H, W, 3) arrays). Frame sampling follows EMScore's VATEX-EVAL
protocol by default: ``frames=10`` takes the frames at ``int(linspace(0, T-1, 10))``; ``frames=None``
takes every frame; any other int k takes k frames by the same rule.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image

from .errors import MediaError
from .images import array_to_pil, describe

VideoLike = Any  # str | os.PathLike | np.ndarray | torch.Tensor | Sequence[PIL.Image | np.ndarray]

DEFAULT_FRAMES = 10


def sample_indices(num_frames: int, frames: int | None = DEFAULT_FRAMES) -> np.ndarray:
    """Indices of the frames to keep: ``int(linspace(0, T-1, k))`` for k=``frames``, all when None.

    Returns an int64 array with values in [0, num_frames - 1] (repeats when k > T).
    """
    if num_frames <= 0:
        raise ValueError("a video needs at least one frame")
    if frames is None:
        return np.arange(num_frames, dtype=np.int64)
    if frames <= 0:
        raise ValueError(f"frames must be a positive int or None, got {frames}")
    return np.linspace(0, num_frames - 1, frames).astype(np.int64)


def decode_video_file(path: str | os.PathLike, frames: int | None, name: str) -> np.ndarray:
    """Decode only the sampled frames of a video file with decord; uint8 (k, H, W, 3)."""
    p = Path(path)
    if not p.exists():
        raise MediaError(name, "file does not exist")
    if not p.is_file():
        raise MediaError(name, "path is not a file")
    try:
        import decord
    except ImportError as exc:  # pragma: no cover - decord is a hard dependency
        raise MediaError(name, "decoding video files needs the 'decord' package") from exc
    try:
        reader = decord.VideoReader(os.fspath(p), ctx=decord.cpu(0))
        total = len(reader)
    except Exception as exc:  # decord raises its own DECORDError and RuntimeError types
        raise MediaError(name, f"cannot decode video: {exc}") from exc
    if total == 0:
        raise MediaError(name, "video has zero frames")
    indices = sample_indices(total, frames)
    try:
        array = reader.get_batch(indices.tolist()).asnumpy()
    except Exception as exc:
        raise MediaError(name, f"cannot decode frames {indices.tolist()}: {exc}") from exc
    return validate_frame_array(array, name)


def validate_frame_array(array: np.ndarray, name: str) -> np.ndarray:
    """Check a (T, H, W, 3) uint8 array; return it contiguous."""
    if array.dtype != np.uint8:
        raise MediaError(name, f"video frames must be uint8 (T, H, W, 3), got dtype {array.dtype}")
    if array.ndim != 4 or array.shape[3] != 3:
        raise MediaError(name, f"video arrays must have shape (T, H, W, 3), got {tuple(array.shape)}")
    if array.shape[0] == 0:
        raise MediaError(name, "video has zero frames")
    if array.shape[1] == 0 or array.shape[2] == 0:
        raise MediaError(name, "video frames are empty (zero height or width)")
    return np.ascontiguousarray(array)


def frames_from_sequence(frames_list: Sequence[Any], name: str) -> np.ndarray:
    """Stack a list of PIL frames or uint8 arrays into (T, H, W, 3)."""
    if len(frames_list) == 0:
        raise MediaError(name, "video has zero frames (empty list)")
    arrays = []
    for i, frame in enumerate(frames_list):
        if isinstance(frame, Image.Image):
            arrays.append(np.asarray(frame.convert("RGB")))
        elif isinstance(frame, np.ndarray):
            array_to_pil(frame, f"{name} frame {i}")  # validates dtype and shape
            arrays.append(frame)
        else:
            raise MediaError(name, f"frame {i} has unsupported type {type(frame).__name__}")
    shapes = {a.shape for a in arrays}
    if len(shapes) != 1:
        raise MediaError(name, f"frames have different shapes: {sorted(shapes)}")
    return np.stack(arrays)


def load_video(item: VideoLike, frames: int | None = DEFAULT_FRAMES, index: int | None = None) -> np.ndarray:
    """Return the sampled frames of ``item`` as a uint8 array (k, H, W, 3).

    Raises ``MediaError`` naming the item when the video is missing, unreadable, empty, of the wrong
    dtype or shape.
    """
    name = describe(item, index)
    if item is None:
        raise MediaError(name, "video is missing (None)")
    if isinstance(item, (str, os.PathLike)):
        return decode_video_file(item, frames, name)
    if isinstance(item, torch.Tensor):
        if item.dtype != torch.uint8:
            raise MediaError(name, f"video tensors must be uint8 (T, H, W, 3), got dtype {item.dtype}")
        item = item.detach().cpu().numpy()
    if isinstance(item, np.ndarray):
        array = validate_frame_array(item, name)
    elif isinstance(item, (list, tuple)):
        array = validate_frame_array(frames_from_sequence(item, name), name)
    else:
        raise MediaError(name, f"unsupported video type {type(item).__name__}")
    return array[sample_indices(array.shape[0], frames)]


def frames_to_pil(array: np.ndarray) -> list[Image.Image]:
    """Split a (T, H, W, 3) uint8 array into RGB PIL images."""
    return [Image.fromarray(frame, mode="RGB") for frame in array]
