"""The video decoders: decord where it is installed, PyAV everywhere, chosen at run time.

decord has wheels only for x86-64 (Linux, Windows, older macOS) and no source distribution, so it is
an optional dependency; PyAV (``av``, FFmpeg's libraries in a wheel for Linux and macOS on x86-64 and
ARM, and Windows) is always installed, and it also reads every header (:mod:`capreward.media.probe`).

Choice: ``"auto"`` (the default) decodes with decord when it can be imported, else with PyAV;
``"decord"`` or ``"pyav"`` pick one (:func:`set_video_backend`, the ``with video_backend(...)`` block,
the ``CAPREWARD_VIDEO_BACKEND`` environment variable, or ``backend=`` of
:func:`capreward.media.load_video`). Files decord decodes wrongly always go to PyAV: rotated videos
(decord applies the display matrix itself, and returns frames of the wrong shape for quarter turns),
frames narrower than 32 pixels, and any file whose first frame decord returns at another size than
PyAV's (its RGB row alignment garbles some widths, 48 px among them).

Both read the same frame indices: decord indexes one frame per packet of the stream, sorted by
presentation time; PyAV counts the same packets and decodes in presentation order, frame ``i`` being
the ``i``-th frame out of the decoder. On the sample clips the two give identical pixels
(``benchmarks/video_backends.py`` prints the differences and their effect on EMScore).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator, Sequence

import numpy as np

from ..errors import CaprewardError

BACKENDS = ("auto", "decord", "pyav")

#: decord garbles frames narrower than this (its RGB rows are aligned to 32 pixels).
DECORD_MIN_WIDTH = 32


def _from_env() -> str:
    name = os.environ.get("CAPREWARD_VIDEO_BACKEND", "auto").strip().lower() or "auto"
    if name not in BACKENDS:
        raise ValueError(f"CAPREWARD_VIDEO_BACKEND must be one of {', '.join(BACKENDS)}, got {name!r}")
    return name


_backend = _from_env()


def decord_available() -> bool:
    """Whether decord can be imported here."""
    return importlib.util.find_spec("decord") is not None


def get_video_backend() -> str:
    """The configured video decoder.

    Returns:
        ``"auto"``, ``"decord"`` or ``"pyav"``.
    """
    return _backend


def set_video_backend(name: str) -> str:
    """Set the process-wide video decoder.

    Args:
        name: ``"auto"``, ``"decord"`` (needs decord installed) or ``"pyav"``.

    Returns:
        The previous choice.
    """
    global _backend
    name = check_backend(name)
    previous, _backend = _backend, name
    return previous


@contextlib.contextmanager
def video_backend(name: str) -> Iterator[str]:
    """``with video_backend("pyav"):`` the choice inside the block, restored after it.

    Args:
        name: ``"auto"``, ``"decord"`` or ``"pyav"``.

    Yields:
        The choice in force inside the block.
    """
    previous = set_video_backend(name)
    try:
        yield name
    finally:
        set_video_backend(previous)


def check_backend(name: str) -> str:
    """``name`` if it is a backend that can run here; ValueError naming the choices otherwise."""
    if name not in BACKENDS:
        raise ValueError(f"video backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    if name == "decord" and not decord_available():
        raise ValueError("the 'decord' video backend is not installed (it has no wheel for this platform); "
                         "use 'pyav' or 'auto'")
    return name


def resolve_backend(name: str | None = None) -> str:
    """The backend that decodes: ``name`` (default: the configured choice), with ``"auto"`` resolved to
    ``"decord"`` when it is importable, else ``"pyav"``."""
    name = check_backend(name or _backend)
    if name == "auto":
        return "decord" if decord_available() else "pyav"
    return name


class DecordMismatch(CaprewardError):
    """decord decoded the first frame at another size than the header's (its row-alignment bug)."""


class DecordReader:
    """decord's reader on ``source`` (a path, ``/proc/self/fd/N`` for a confined file); ``count``: its
    frame index's length."""

    name = "decord"

    def __init__(self, source: str):
        import decord

        self._reader = decord.VideoReader(source, ctx=decord.cpu(0))
        self.count = len(self._reader)

    def check_first(self, size: tuple[int, int]) -> None:
        """Decode the first frame; :class:`DecordMismatch` unless it is ``size`` (width, height), the size
        PyAV decoded it at (decord garbles some frame widths, e.g. 48 px: the caller decodes with PyAV)."""
        try:
            first = self._reader.get_batch([0]).asnumpy()
        except Exception as exc:  # its size check fails inside: "The size must exactly match"
            raise DecordMismatch(str(exc).strip().splitlines()[0][:300] if str(exc).strip() else "") from None
        if first.shape != (1, size[1], size[0], 3):
            raise DecordMismatch(f"decord returned {tuple(first.shape)}")

    def frames(self, indices: Sequence[int] | np.ndarray, chunk: int) -> Iterator[np.ndarray]:
        """uint8 (n, H, W, 3) arrays of the frames at ``indices`` (in their order), ``chunk`` at a time."""
        for start in range(0, len(indices), chunk):
            yield self._reader.get_batch(list(indices[start:start + chunk])).asnumpy()

    def close(self) -> None:
        self._reader = None  # decord closes its handle on the file now, not at some later collection


class PyAVReader:
    """PyAV decoding of the stream ``stream`` of the ``container`` file open at ``fd``.

    ``count``: packets of the stream (decord's frame count), counted by demuxing and never past
    ``max_frames + 1``. Frames are decoded in order from the start, and only the sampled ones are
    converted to RGB.
    """

    name = "pyav"

    def __init__(self, fd: int, container: str, stream: int, max_frames: int, max_pixels: int | None):
        from .probe import count_packets, open_container

        self._fd, self._container, self._stream, self._max_pixels = fd, container, stream, max_pixels
        with open_container(fd, container, max_pixels) as c:
            self.count = count_packets(c, c.streams[stream], max_frames)

    def frames(self, indices: Sequence[int] | np.ndarray, chunk: int) -> Iterator[np.ndarray]:
        """uint8 (n, H, W, 3) arrays of the frames at ``indices`` (non-decreasing, repeats allowed),
        ``chunk`` at a time, decoded in one pass from the first frame."""
        from .probe import bound_decoder, open_container

        wanted = [int(i) for i in indices]
        if any(b < a for a, b in zip(wanted, wanted[1:])):
            raise ValueError("PyAV reads frame indices in increasing order")
        if not wanted:
            return
        buffer: list[np.ndarray] = []
        p = 0
        with open_container(self._fd, self._container, self._max_pixels) as c:
            stream = c.streams[self._stream]
            bound_decoder(stream, self._max_pixels)
            for i, frame in enumerate(c.decode(stream)):
                if wanted[p] == i:
                    rgb = frame.to_ndarray(format="rgb24")
                    while p < len(wanted) and wanted[p] == i:
                        buffer.append(rgb)
                        p += 1
                        if len(buffer) == chunk:
                            yield np.stack(buffer)
                            buffer = []
                if p == len(wanted):
                    break
        if buffer:
            yield np.stack(buffer)
        if p < len(wanted):
            raise DecodeError(f"frames {_short(sorted(set(wanted[p:])))} could not be decoded (the stream ended first)")

    def close(self) -> None:
        pass


class DecodeError(CaprewardError):
    """A backend could not decode the requested frames (its message says which)."""


def _short(values: list[int]) -> str:
    return str(values) if len(values) <= 12 else f"[{values[0]}, {values[1]}, ..., {values[-1]}] ({len(values)} frames)"


__all__ = ["BACKENDS", "DECORD_MIN_WIDTH", "DecodeError", "DecordMismatch", "DecordReader", "PyAVReader", "check_backend",
           "decord_available", "get_video_backend", "resolve_backend", "set_video_backend", "video_backend"]
