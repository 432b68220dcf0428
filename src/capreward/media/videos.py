"""Decoding, validating and sampling videos.

Accepted forms: a path or a :class:`~capreward.media.files.ConfinedFile` (decoded with decord), a
uint8 array or tensor of shape (T, H, W, 3), or a list of frames (PIL images or uint8 (H, W, 3)
arrays). Frame sampling follows EMScore's VATEX-EVAL protocol by default: ``frames=10`` takes the
frames at ``int(linspace(0, T-1, 10))``; ``frames=None`` takes every frame; any other int k takes k
frames by the same rule.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch
from PIL import Image

from .errors import MediaError
from .files import ConfinedFile, fd_path
from .images import array_to_pil, check_size, confined_descriptor, describe, to_rgb
from .limits import MediaLimits, get_media_limits
from .probe import ProbeTimeout, header_frame_sizes

VideoLike = Any  # str | os.PathLike | ConfinedFile | np.ndarray | torch.Tensor | Sequence[PIL.Image | np.ndarray]

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


@contextlib.contextmanager
def opened_video(path: str | os.PathLike | ConfinedFile, name: str) -> Iterator[tuple[str, int | None]]:
    """``(what decord opens, descriptor or None)`` for a video file item, checked to be a non-empty
    regular file. A :class:`ConfinedFile` is opened inside its root and read through ``/proc/self/fd/N``
    (the descriptor is closed after the block); a path is read by name. MediaError naming the item
    otherwise (a refused ConfinedFile with the one text of :data:`~capreward.media.files.REFUSED`)."""
    if isinstance(path, ConfinedFile):
        fd = confined_descriptor(path, name)
        try:
            if os.fstat(fd).st_size == 0:
                raise MediaError(name, "cannot decode video: the file is empty (0 bytes)")
            through = fd_path(fd)
            # no /proc (not Linux): the checked name, confined at the check only
            yield (through, fd) if through is not None else (path.path, None)
        finally:
            os.close(fd)
        return
    p = Path(path)
    if not p.exists():
        raise MediaError(name, "file does not exist")
    if not p.is_file():
        raise MediaError(name, "path is not a file")
    if p.stat().st_size == 0:
        raise MediaError(name, "cannot decode video: the file is empty (0 bytes)")
    yield os.fspath(p), None


def _check_frame_size(width: int, height: int, count: int, name: str, limits: MediaLimits) -> None:
    """MediaError when one ``width`` x ``height`` frame is over ``max_pixels`` or ``count`` of them over
    ``max_video_pixels``."""
    if height * width > limits.max_pixels:
        raise MediaError(
            name,
            f"video frames are {width}x{height} = {width * height:,} pixels, over the limit of "
            f"{limits.max_pixels:,} (max_pixels; see capreward.media.limits)",
        )
    if count * height * width > limits.max_video_pixels:
        raise MediaError(
            name,
            f"{count} frames of {width}x{height} are {count * height * width:,} pixels, over the "
            f"limit of {limits.max_video_pixels:,} (max_video_pixels; sample fewer frames or raise the limit)",
        )


def decode_video_file(
    path: str | os.PathLike | ConfinedFile, frames: int | None, name: str, limits: MediaLimits | None = None
) -> np.ndarray:
    """Decode only the sampled frames of a video file with decord; uint8 (k, H, W, 3).

    Sizes are checked before anything is decoded in this process: the frame size every video stream
    declares in the container header (read by ffmpeg in a child process, see
    :mod:`capreward.media.probe`) against ``max_pixels``, and k x H x W against ``max_video_pixels``.
    The first decoded frame is checked again (a bitstream may differ from its header, and without an
    ffmpeg binary it is the only check) before the other sampled frames are decoded. Every decord
    failure (its DECORDError, RuntimeError, AssertionError on a zero frame count...) becomes
    :class:`MediaError` naming the item.
    """
    limits = limits or get_media_limits()
    with opened_video(path, name) as (source, fd):
        try:
            declared = header_frame_sizes(source, pass_fd=fd, max_pixels=limits.max_pixels)
        except ProbeTimeout as exc:
            raise MediaError(name, f"cannot read the video's header: {exc}") from None
        for width, height in declared or ():
            _check_frame_size(width, height, 1, name, limits)
        return _decode_frames(source, frames, name, limits, declared)


def _decode_frames(source: str, frames: int | None, name: str, limits: MediaLimits,
                   declared: list[tuple[int, int]] | None) -> np.ndarray:
    try:
        import decord
    except ImportError as exc:  # pragma: no cover - decord is a hard dependency
        raise MediaError(name, "decoding video files needs the 'decord' package") from exc
    try:
        reader = decord.VideoReader(source, ctx=decord.cpu(0))
        total = len(reader)
    except Exception as exc:  # decord raises DECORDError, RuntimeError, AssertionError (no frames)
        raise MediaError(name, f"cannot decode video: {type(exc).__name__}: {_first_line(exc)}") from exc
    try:
        if total <= 0:
            raise MediaError(name, "video has zero frames")
        indices = sample_indices(total, frames)
        for width, height in declared or ():
            _check_frame_size(width, height, len(indices), name, limits)
        try:
            first = reader.get_batch([0]).asnumpy()
        except Exception as exc:
            raise MediaError(name, f"cannot decode the first frame: {type(exc).__name__}: {_first_line(exc)}") from exc
        if first.ndim != 4 or first.shape[0] != 1:
            raise MediaError(name, f"cannot decode the first frame: decord returned shape {tuple(first.shape)}")
        _check_frame_size(first.shape[2], first.shape[1], len(indices), name, limits)
        try:
            array = first if indices.tolist() == [0] else reader.get_batch(indices.tolist()).asnumpy()
        except Exception as exc:
            raise MediaError(
                name, f"cannot decode frames {_short(indices)} of {total}: {type(exc).__name__}: {_first_line(exc)}"
            ) from exc
    finally:
        del reader  # decord closes its own handle on the file now, not at some later collection
    return validate_frame_array(array, name)


def _first_line(exc: BaseException) -> str:
    """decord's messages carry a C++ stack trace after the first line."""
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else "no message"


def _short(indices: np.ndarray) -> str:
    values = indices.tolist()
    return str(values) if len(values) <= 12 else f"[{values[0]}, {values[1]}, ..., {values[-1]}] ({len(values)} frames)"


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


def frames_from_sequence(frames_list: Sequence[Any], name: str, limits: MediaLimits | None = None) -> np.ndarray:
    """Stack a list of PIL frames (any mode, converted as :func:`capreward.media.images.to_rgb` does)
    or uint8 arrays into (T, H, W, 3)."""
    if len(frames_list) == 0:
        raise MediaError(name, "video has zero frames (empty list)")
    arrays = []
    for i, frame in enumerate(frames_list):
        if isinstance(frame, Image.Image):
            frame_name = f"{name} frame {i}"
            check_size(frame, frame_name, limits)
            arrays.append(np.asarray(to_rgb(frame, frame_name)))
        elif isinstance(frame, np.ndarray):
            array_to_pil(frame, f"{name} frame {i}")  # validates dtype and shape
            arrays.append(frame)
        else:
            raise MediaError(name, f"frame {i} has unsupported type {type(frame).__name__}")
    shapes = {a.shape for a in arrays}
    if len(shapes) != 1:
        raise MediaError(name, f"frames have different shapes: {sorted(shapes)}")
    return np.stack(arrays)


def load_video(
    item: VideoLike, frames: int | None = DEFAULT_FRAMES, index: int | None = None, limits: MediaLimits | None = None
) -> np.ndarray:
    """Return the sampled frames of ``item`` as a uint8 array (k, H, W, 3).

    Raises ``MediaError`` naming the item when the video is missing, unreadable, empty, of the wrong
    dtype or shape, or over the size limits of :mod:`capreward.media.limits` (``limits`` defaults to
    the process-wide ones; in-memory frames are checked per frame against ``max_pixels``).
    """
    name = describe(item, index)
    if item is None:
        raise MediaError(name, "video is missing (None)")
    if isinstance(item, (str, os.PathLike, ConfinedFile)):
        return decode_video_file(item, frames, name, limits)
    if isinstance(item, torch.Tensor):
        if item.dtype != torch.uint8:
            raise MediaError(name, f"video tensors must be uint8 (T, H, W, 3), got dtype {item.dtype}")
        item = item.detach().cpu().numpy()
    if isinstance(item, np.ndarray):
        array = validate_frame_array(item, name)
    elif isinstance(item, (list, tuple)):
        array = validate_frame_array(frames_from_sequence(item, name, limits), name)
    else:
        raise MediaError(name, f"unsupported video type {type(item).__name__}")
    max_pixels = (limits or get_media_limits()).max_pixels
    if array.shape[1] * array.shape[2] > max_pixels:
        raise MediaError(name, f"video frames are {array.shape[2]}x{array.shape[1]}, over the limit of {max_pixels:,} pixels")
    return array[sample_indices(array.shape[0], frames)]


def frames_to_pil(array: np.ndarray) -> list[Image.Image]:
    """Split a (T, H, W, 3) uint8 array into RGB PIL images."""
    return [Image.fromarray(frame, mode="RGB") for frame in array]
