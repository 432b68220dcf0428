"""Decoding, validating and sampling videos.

Accepted forms: a path or a :class:`~capreward.media.files.ConfinedFile` (decoded by decord or PyAV,
see :mod:`capreward.media.backends`), a uint8 array or tensor of shape (T, H, W, 3), or a list of frames
(PIL images or uint8 (H, W, 3) arrays). Frame sampling follows EMScore's VATEX-EVAL protocol by default:
``frames=10`` takes the frames at ``int(linspace(0, T-1, 10))``; ``frames=None`` takes every frame; any
other int k takes k frames by the same rule.

A video file goes through, in order: the open (a confined file inside its root), the container check
from its first bytes (:mod:`capreward.media.containers`: playlists and concat lists are refused before
any decoder sees them), the header (:mod:`capreward.media.probe`: declared frame sizes against
``max_pixels``, declared frame count against ``max_video_frames``, then the first frame and its
display matrix), the frame count and the sampled frames' pixels against ``max_video_pixels``, and only
then the decode of the sampled frames, a bounded chunk at a time (:func:`open_video`), each frame turned
upright.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch
from PIL import Image

from .backends import DECORD_MIN_WIDTH, DecodeError, DecordMismatch, DecordReader, PyAVReader, resolve_backend
from .containers import NOT_A_CONTAINER, identify_container, read_head
from .errors import MediaError
from .files import ConfinedFile, fd_path
from .images import NAN_IMAGE, array_to_pil, check_size, confined_descriptor, describe, to_rgb
from .limits import MediaLimits, get_media_limits
from .probe import ProbeError, count_packets, open_container, probe_video

VideoLike = Any  # str | os.PathLike | ConfinedFile | np.ndarray | torch.Tensor | Sequence[PIL.Image | np.ndarray]

logger = logging.getLogger(__name__)

DEFAULT_FRAMES = 10

#: Decoded pixels held at once while a video is read chunk by chunk (2**24: 48 MB of RGB, 8 frames of 1080p).
DECODE_CHUNK_PIXELS = 2**24


def sample_indices(num_frames: int, frames: int | None = DEFAULT_FRAMES) -> np.ndarray:
    """Indices of the frames to keep: ``int(linspace(0, T-1, k))`` for k=``frames``, all when None.

    Returns an int64 array with values in [0, num_frames - 1]. When k > T some frames repeat (the
    protocol's rule, kept for parity); a warning says so, once per process for each (T, k), naming
    ``frames=None`` (every frame once) as the way to score each frame once.
    """
    if num_frames <= 0:
        raise ValueError("a video needs at least one frame")
    if frames is None:
        return np.arange(num_frames, dtype=np.int64)
    if frames <= 0:
        raise ValueError(f"frames must be a positive int or None, got {frames}")
    if frames > num_frames and (num_frames, frames) not in _WARNED_REPEATS:
        _WARNED_REPEATS.add((num_frames, frames))
        logger.warning(
            "a video of %d frames is sampled to frames=%d: %d of the %d samples repeat a frame (EMScore's "
            "linspace rule); pass frames=None to use every frame once (or --frames 0 on the command line)",
            num_frames, frames, frames - num_frames, frames,
        )
    return np.linspace(0, num_frames - 1, frames).astype(np.int64)


_WARNED_REPEATS: set[tuple[int, int]] = set()


@contextlib.contextmanager
def opened_video(path: str | os.PathLike | ConfinedFile, name: str) -> Iterator[tuple[str, int]]:
    """``(what decord opens, descriptor)`` for a video file item, checked to be a non-empty regular file;
    the descriptor is closed after the block. A :class:`ConfinedFile` is opened inside its root; every
    file is read through its descriptor (decord through ``/proc/self/fd/N``, or the checked name where
    there is no ``/proc``). MediaError naming the item otherwise (a refused ConfinedFile with the one
    text of :data:`~capreward.media.files.REFUSED`)."""
    if isinstance(path, ConfinedFile):
        fd = confined_descriptor(path, name)
        checked = path.path
    else:
        p = Path(path)
        if not p.exists():
            raise MediaError(name, "file does not exist")
        if not p.is_file():
            raise MediaError(name, "path is not a file")
        try:
            fd = os.open(p, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0))
        except OSError as exc:
            raise MediaError(name, f"cannot read video: {exc.strerror}") from None
        checked = os.fspath(p)
    try:
        if os.fstat(fd).st_size == 0:
            raise MediaError(name, "cannot decode video: the file is empty (0 bytes)")
        yield fd_path(fd) or checked, fd
    finally:
        os.close(fd)


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


def _check_frame_count(count: int, name: str, limits: MediaLimits, declared: bool) -> None:
    if count > limits.max_video_frames:
        what = "its header declares" if declared else "it holds more than"
        shown = count if declared else limits.max_video_frames
        raise MediaError(
            name,
            f"video has too many frames: {what} {shown:,}, over the limit of {limits.max_video_frames:,} "
            "(max_video_frames; see capreward.media.limits)",
        )


@dataclass
class VideoFrames:
    """The sampled frames of one video, decoded on demand.

    ``count``: frames sampled (k); ``width`` x ``height``: a frame's size once upright; ``total``: frames
    in the video (T); ``backend``: the decoder (``"decord"``, ``"pyav"``; None for in-memory frames).
    :meth:`chunks` decodes them in order, at most ``max_frames`` (and :data:`DECODE_CHUNK_PIXELS`) at a
    time; :meth:`read` all at once.
    """

    name: str
    count: int
    width: int
    height: int
    total: int
    backend: str | None
    _chunks: Callable[[int], Iterator[np.ndarray]]

    def chunks(self, max_frames: int = 64) -> Iterator[np.ndarray]:
        """uint8 (n, H, W, 3) arrays of the sampled frames, in order, n <= ``max_frames``."""
        size = max(1, min(int(max_frames), DECODE_CHUNK_PIXELS // max(1, self.width * self.height)))
        yield from self._chunks(size)

    def read(self) -> np.ndarray:
        """Every sampled frame, uint8 (k, H, W, 3) (filled chunk by chunk: one copy of the frames)."""
        out = np.empty((self.count, self.height, self.width, 3), np.uint8)
        done = 0
        for part in self.chunks(self.count):
            out[done:done + len(part)] = part
            done += len(part)
        if done != self.count:  # pragma: no cover - the readers raise when frames are missing
            raise MediaError(self.name, f"cannot decode video: {done} of {self.count} frames decoded")
        return out


def _identity(fd: int) -> tuple[int, ...]:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


@contextlib.contextmanager
def open_video_file(
    path: str | os.PathLike | ConfinedFile, frames: int | None, name: str, limits: MediaLimits | None = None,
    backend: str | None = None,
) -> Iterator[VideoFrames]:
    """The sampled frames of a video file, checked (see the module's docstring) before any is decoded
    for scoring; decoded while the block reads :meth:`VideoFrames.chunks`. Every decoder failure becomes
    :class:`MediaError` naming the item."""
    limits = limits or get_media_limits()
    with opened_video(path, name) as (source, fd):
        before = _identity(fd)
        container = identify_container(read_head(fd))
        if container is None:
            raise MediaError(name, NOT_A_CONTAINER)

        def check_header(sizes: tuple[tuple[int, int], ...], declared: int | None) -> None:
            for width, height in sizes:
                _check_frame_size(width, height, 1, name, limits)
            if declared is not None:
                _check_frame_count(declared, name, limits, declared=True)

        try:
            header = probe_video(fd, container, limits.max_pixels, check_header)
        except ProbeError as exc:
            raise MediaError(name, f"cannot decode video: {exc}") from None
        # the first decoded frame again: a bitstream may differ from its header
        _check_frame_size(header.width, header.height, 1, name, limits)
        chosen = resolve_backend(backend)
        if chosen == "decord" and (not header.orientation.identity or header.width < DECORD_MIN_WIDTH):
            chosen = "pyav"  # decord decodes rotated and narrow frames wrongly (see capreward.media.backends)
        if chosen == "decord" and header.declared_frames is None:
            # no count in the header: count the packets (bounded) before decord indexes the whole file
            try:
                with open_container(fd, container, limits.max_pixels) as c:
                    _check_frame_count(count_packets(c, c.streams[header.stream], limits.max_video_frames),
                                       name, limits, declared=False)
            except ProbeError as exc:
                raise MediaError(name, f"cannot decode video: {exc}") from None

        def pyav_reader() -> PyAVReader:
            try:
                return PyAVReader(fd, container, header.stream, limits.max_video_frames, limits.max_pixels)
            except ProbeError as exc:
                raise MediaError(name, f"cannot decode video: {exc}") from None

        reader: DecordReader | PyAVReader
        if chosen == "decord":
            try:
                reader = DecordReader(source)
            except Exception as exc:  # decord raises DECORDError, RuntimeError, AssertionError (no frames)
                raise MediaError(name, f"cannot decode video: {type(exc).__name__}: {_first_line(exc)}") from None
        else:
            reader = pyav_reader()
        try:
            total = reader.count
            if total <= 0:
                raise MediaError(name, "video has zero frames")
            _check_frame_count(total, name, limits, declared=False)
            indices = sample_indices(total, frames)
            width, height = header.displayed_size
            _check_frame_size(width, height, len(indices), name, limits)
            stored = (header.height, header.width)
            if isinstance(reader, DecordReader):
                try:
                    reader.check_first((header.width, header.height))
                except DecordMismatch:  # decord garbles this frame size: PyAV decodes the file
                    reader.close()
                    reader, chosen = pyav_reader(), "pyav"
                    if reader.count != total:
                        raise MediaError(name, f"cannot decode video: decord counts {total} frames, PyAV "
                                               f"{reader.count}") from None

            def chunks(size: int) -> Iterator[np.ndarray]:
                done = 0
                try:
                    for array in reader.frames(indices, size):
                        if array.dtype != np.uint8 or array.ndim != 4 or array.shape[1:] != (*stored, 3):
                            raise MediaError(name, f"frame {int(indices[done])} is {_shape(array)}, not the "
                                                   f"{stored[1]}x{stored[0]} of the first frame")
                        done += array.shape[0]
                        yield header.orientation.apply(array)
                except MediaError:
                    raise
                except Exception as exc:
                    detail = str(exc) if isinstance(exc, DecodeError) else f"{type(exc).__name__}: {_first_line(exc)}"
                    raise MediaError(name, f"cannot decode frames {_short(indices)} of {total}: {detail}") from None
                if chosen == "decord" and _identity(fd) != before:
                    # decord opened the file by its name again: what it read must be what was checked
                    raise MediaError(name, "cannot decode video: the file changed while it was read")

            yield VideoFrames(name, len(indices), width, height, total, chosen, chunks)
        finally:
            reader.close()


def _shape(array: np.ndarray) -> str:
    return f"{array.shape[2]}x{array.shape[1]}" if array.ndim == 4 else f"an array of shape {tuple(array.shape)}"


def decode_video_file(
    path: str | os.PathLike | ConfinedFile, frames: int | None, name: str, limits: MediaLimits | None = None,
    backend: str | None = None,
) -> np.ndarray:
    """Decode only the sampled frames of a video file, upright; uint8 (k, H, W, 3) (see
    :func:`open_video_file` for the checks before decoding)."""
    with open_video_file(path, frames, name, limits, backend) as video:
        return validate_frame_array(video.read(), name)


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


def _in_memory_array(item: Any, name: str, limits: MediaLimits | None) -> np.ndarray:
    """The validated (T, H, W, 3) uint8 frames of an in-memory video (tensor, array, list of frames)."""
    if isinstance(item, torch.Tensor):
        if item.dtype != torch.uint8:
            if item.is_floating_point() and not bool(torch.isfinite(item.detach()).all()):
                raise MediaError(name, NAN_IMAGE)
            raise MediaError(name, f"video tensors must be uint8 (T, H, W, 3), got dtype {item.dtype}")
        item = item.detach().cpu().numpy()
    if isinstance(item, np.ndarray):
        if item.dtype != np.uint8 and np.issubdtype(item.dtype, np.floating) and not np.isfinite(item).all():
            raise MediaError(name, NAN_IMAGE)
        array = validate_frame_array(item, name)
    elif isinstance(item, (list, tuple)):
        array = validate_frame_array(frames_from_sequence(item, name, limits), name)
    else:
        raise MediaError(name, f"unsupported video type {type(item).__name__}")
    max_pixels = (limits or get_media_limits()).max_pixels
    if array.shape[1] * array.shape[2] > max_pixels:
        raise MediaError(name, f"video frames are {array.shape[2]}x{array.shape[1]}, over the limit of {max_pixels:,} pixels")
    return array


@contextlib.contextmanager
def open_video(
    item: VideoLike, frames: int | None = DEFAULT_FRAMES, index: int | None = None, limits: MediaLimits | None = None,
    backend: str | None = None,
) -> Iterator[VideoFrames]:
    """``with open_video(item) as video:`` the sampled frames of ``item`` as :class:`VideoFrames`: their
    count and size known, every check of :func:`load_video` done, the frames decoded only as
    ``video.chunks(n)`` is read (files: a bounded chunk at a time; the file stays open in the block).

    ``backend``: ``"auto"``, ``"decord"`` or ``"pyav"`` (default: the configured choice, see
    :mod:`capreward.media.backends`). Raises ``MediaError`` naming the item.
    """
    name = describe(item, index)
    if item is None:
        raise MediaError(name, "video is missing (None)")
    if isinstance(item, (str, os.PathLike, ConfinedFile)):
        with open_video_file(item, frames, name, limits, backend) as video:
            yield video
        return
    array = _in_memory_array(item, name, limits)
    indices = sample_indices(array.shape[0], frames)

    def chunks(size: int) -> Iterator[np.ndarray]:
        for start in range(0, len(indices), size):
            yield array[indices[start:start + size]]

    yield VideoFrames(name, len(indices), array.shape[2], array.shape[1], array.shape[0], None, chunks)


def load_video(
    item: VideoLike, frames: int | None = DEFAULT_FRAMES, index: int | None = None, limits: MediaLimits | None = None,
    backend: str | None = None,
) -> np.ndarray:
    """Sample frames of a video.

    Args:
        item: a path, uint8 (T, H, W, 3) frames or a list of frames.
        frames: frames to sample, evenly spaced (None: every frame).
        index: its position in the caller's list, for the error message.
        limits: the media limits (default: the process-wide ones; in-memory frames are checked per frame
            against ``max_pixels``).
        backend: the decoder (see :func:`open_video`; None: the process-wide choice).

    Returns:
        The sampled frames as a uint8 array (k, H, W, 3), upright.

    Raises:
        MediaError: naming the item, when the video is missing, unreadable, not a self-contained
            container (playlists, concat lists), empty, of the wrong dtype or shape, or over the limits
            of :mod:`capreward.media.limits`.
    """
    name = describe(item, index)
    if item is None:
        raise MediaError(name, "video is missing (None)")
    if isinstance(item, (str, os.PathLike, ConfinedFile)):
        return decode_video_file(item, frames, name, limits, backend)
    array = _in_memory_array(item, name, limits)
    return array[sample_indices(array.shape[0], frames)]


def frames_to_pil(array: np.ndarray) -> list[Image.Image]:
    """Split a (T, H, W, 3) uint8 array into RGB PIL images."""
    return [Image.fromarray(frame, mode="RGB") for frame in array]
