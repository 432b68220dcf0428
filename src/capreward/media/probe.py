"""A video's header through PyAV: its container, frame size, frame count and display orientation, read
before any frame is decoded for scoring.

The file has already been identified as an accepted container (:mod:`capreward.media.containers`);
:func:`open_container` opens it with that demuxer only (no probing for another one), with no nested
opens (``protocol_whitelist=none``: a demuxer cannot open another file or URL), no QuickTime data
references, and FFmpeg's decoder limit ``max_pixels`` on every codec opened while the streams are
analysed. :func:`probe_video` then reads what the header declares (the size of every video stream, the
frame count or the duration x frame rate) so that the loader can refuse a video over the limits before
anything is decoded at full size, and decodes the first frame (under the same ``max_pixels``) for its
real size and its display matrix (:mod:`capreward.media.orientation`).

The same library decodes the frames when PyAV is the backend (:mod:`capreward.media.backends`);
with decord, decord decodes what this probe has accepted.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Iterator

from ..errors import CaprewardError
from .containers import CONTAINERS
from .orientation import Orientation, orientation_from_matrix

#: Seconds PyAV may take to open a file and read its header.
PROBE_TIMEOUT = 60.0


class ProbeError(CaprewardError):
    """The header cannot be read (PyAV's error, first line)."""


@dataclass(frozen=True)
class VideoHeader:
    """What a video file's header says, for the loaders' checks.

    ``container``: a key of :data:`~capreward.media.containers.CONTAINERS`; ``stream``: index of the
    video stream decoded (FFmpeg's best video stream, as decord picks it); ``width`` x ``height``: its
    stored frame size (from the first decoded frame); ``declared_sizes``: (width, height) of every video
    stream as the header declares it; ``declared_frames``: the frame count the header gives (or its
    duration x frame rate, rounded up), None when it gives neither; ``orientation``: the display
    matrix's transform to upright.
    """

    container: str
    stream: int
    width: int
    height: int
    declared_sizes: tuple[tuple[int, int], ...]
    declared_frames: int | None
    orientation: Orientation

    @property
    def displayed_size(self) -> tuple[int, int]:
        """(width, height) of a frame once upright."""
        return self.orientation.displayed_size(self.width, self.height)


def decoder_pixels(max_pixels: int | None) -> dict[str, str]:
    """FFmpeg decoder options bounding one frame's allocation for a ``max_pixels`` limit. FFmpeg checks
    its padded buffer (width aligned up to 64, rows padded), so it gets twice the limit plus a margin:
    the exact limit is the loader's own check of the declared and decoded sizes; this one keeps a
    bitstream that lies about its size from allocating more than about twice the limit."""
    return {} if max_pixels is None else {"max_pixels": str(2 * max_pixels + 2**10)}


def _options(container: str, max_pixels: int | None) -> tuple[dict[str, str], dict[str, str]]:
    """(options for the format and every codec, options for the format only)."""
    codec = decoder_pixels(max_pixels)
    fmt = {"format_whitelist": CONTAINERS[container], "protocol_whitelist": "none"}
    if container == "mp4":
        fmt.update(enable_drefs="0", use_absolute_path="0")
    return codec, fmt


@contextlib.contextmanager
def open_container(fd: int, container: str, max_pixels: int | None = None) -> Iterator[Any]:
    """A PyAV input container reading the file open at ``fd`` from its start (through a duplicate
    descriptor, closed after the block) with the demuxer of ``container`` only. Raises
    :class:`ProbeError`."""
    import av

    codec, fmt = _options(container, max_pixels)
    with os.fdopen(os.dup(fd), "rb") as f:
        f.seek(0)  # a duplicate shares the offset, which an earlier container moved
        try:
            c = av.open(f, "r", format=CONTAINERS[container], options=codec, container_options=fmt,
                        timeout=(PROBE_TIMEOUT, None))
        except Exception as exc:  # av.error.* (InvalidDataError...), ValueError, OSError
            raise ProbeError(_message(exc)) from None
        try:
            yield c
        finally:
            c.close()


def video_stream(c: Any) -> Any:
    """The stream decoded: FFmpeg's best video stream (``av_find_best_stream``, decord's choice)."""
    try:
        return c.streams.best("video")
    except Exception:  # noqa: BLE001 - older PyAV: the first video stream
        return c.streams.video[0] if c.streams.video else None


def declared_frame_count(c: Any, stream: Any) -> int | None:
    """The stream's frame count from the header (``nb_frames``), else its duration (the stream's or
    the container's) x its average frame rate, rounded up; None when the header gives neither."""
    if stream.frames and stream.frames > 0:
        return int(stream.frames)
    rate = stream.average_rate or stream.guessed_rate
    if not rate or rate <= 0:
        return None
    seconds = None
    if stream.duration and stream.time_base:
        seconds = float(stream.duration * stream.time_base)
    elif c.duration:
        seconds = c.duration / 1_000_000  # AV_TIME_BASE
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        return None
    return math.ceil(seconds * float(rate))


def frame_orientation(frame: Any) -> Orientation:
    """The display orientation carried by a decoded PyAV frame (its DISPLAYMATRIX side data)."""
    from av.sidedata.sidedata import Type

    try:
        side = frame.side_data.get(Type.DISPLAYMATRIX)
    except Exception:  # noqa: BLE001 - no side data API
        side = None
    if side is None:
        return Orientation()
    import numpy as np

    data = bytes(side)
    if len(data) < 36:
        return Orientation()
    return orientation_from_matrix(np.frombuffer(data[:36], dtype="<i4").tolist())


def probe_video(fd: int, container: str, max_pixels: int | None = None,
                before_decode: Callable[[tuple[tuple[int, int], ...], int | None], None] | None = None) -> VideoHeader:
    """The header of the ``container`` file open at ``fd``, with its first frame's size and orientation.

    ``before_decode(declared_sizes, declared_frames)`` is called with what the header declares before
    the first frame is decoded (the loader's limits: it raises to refuse the video). Raises
    :class:`ProbeError` when the file cannot be opened, has no video stream or no decodable first frame.
    """
    with open_container(fd, container, max_pixels) as c:
        stream = video_stream(c)
        if stream is None:
            raise ProbeError("the file has no video stream")
        sizes = tuple((int(s.width), int(s.height)) for s in c.streams.video if s.width and s.height)
        declared = declared_frame_count(c, stream)
        if before_decode is not None:
            before_decode(sizes, declared)
        bound_decoder(stream, max_pixels)
        try:
            first = next(iter(c.decode(stream)), None)
        except Exception as exc:
            raise ProbeError(f"cannot decode the first frame: {_message(exc)}") from None
        if first is None:
            raise ProbeError("cannot decode the first frame: the stream has no decodable frame")
        return VideoHeader(container, stream.index, first.width, first.height, sizes, declared,
                           frame_orientation(first))


def bound_decoder(stream: Any, max_pixels: int | None) -> None:
    """Set FFmpeg's ``max_pixels`` on the stream's decoder (a larger frame fails to allocate) and let it
    use threads; before its first decode."""
    ctx = stream.codec_context
    ctx.options = decoder_pixels(max_pixels)
    with contextlib.suppress(Exception):
        ctx.thread_type = "AUTO"


def count_packets(c: Any, stream: Any, limit: int) -> int:
    """Packets of ``stream`` in the file (decord's frame count: one per packet), counted by demuxing
    only; stops at ``limit + 1``."""
    n = 0
    for packet in c.demux(stream):
        if packet.size > 0 or packet.dts is not None:  # not PyAV's final empty flush packet
            n += 1
            if n > limit:
                break
    return n


def _message(exc: BaseException) -> str:
    """``Type: first line`` of PyAV's error, without the file name it appends (a descriptor here)."""
    text = (getattr(exc, "strerror", None) or str(exc)).strip()
    line = text.splitlines()[0][:300] if text else "no message"
    return f"{type(exc).__name__}: {line}"


__all__ = ["PROBE_TIMEOUT", "ProbeError", "VideoHeader", "bound_decoder", "count_packets", "declared_frame_count", "decoder_pixels",
           "frame_orientation", "open_container", "probe_video", "video_stream"]
