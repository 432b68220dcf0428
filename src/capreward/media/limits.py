"""Size limits on decoded media: what one image or one video may cost in memory.

Every image and video reaches the scorers through :func:`capreward.media.load_image` and
:func:`capreward.media.load_video`, which read the size from the file's header (images; videos through
the container header read by PyAV, see :mod:`capreward.media.probe`, then again from the first decoded
frame) and refuse what exceeds the limits with a :class:`~capreward.media.MediaError` naming the item,
before decoding (the rest).

Defaults (see :class:`MediaLimits`):

- ``max_pixels = 2**25`` (33.5 MP, e.g. 8192x4096): every photo a 12/24/33 MP camera writes, 8K video
  frames (33.2 MP) and 5K scans fit; one decode at the limit peaks at 257 MB (an 8192x4096 RGBA PNG,
  161 MB greyscale, measured in a fresh process). PIL's own guard warns at 89 MP and refuses only at 179 MP, where a
  single decode costs 0.5-1.9 GB. Larger JPEG and JPEG 2000 files are not refused: they are decoded at a
  reduced scale (1/2, 1/4 or 1/8, by the codec, so the full-size pixels never exist) that fits the
  limit. Formats without reduced decoding (PNG, WebP, TIFF, GIF...) above the limit are refused.
- ``max_video_pixels = 2**28`` (268 MP): the sampled frames of one video together (10 frames of up to
  26 MP, or every frame of a 129-frame 1080p clip), about 800 MB as uint8 if held at once (the encoders
  decode and encode them in bounded chunks, so it bounds decoding work, not memory). Raise it, or sample
  fewer frames (``frames=k``), for longer clips.
- ``max_video_frames = 2**18`` (262,144 frames: 2.4 hours at 30 fps): the frames one video may hold,
  checked from the container header (declared count, or duration x frame rate) before the decoder
  indexes the file. A playlist repeating one segment is refused as a playlist
  (:mod:`capreward.media.containers`); this bounds a container that declares millions of frames.
- ``max_model_pixels = 2**28``: the frame budget of one video in model-input pixels, frames x the
  encoder's input size squared (5,350 frames at 224 px, 2,378 at 336 px, 262,144 at the tiny CLIP's 32
  px), checked before decoding. What the encoder sees, not what the file holds, is what costs: 19,000
  decoded 16x16 frames are 14.6 MB, but 19,000 CLIP inputs at 224 px are 11 GB of float pixels. The
  frames are encoded in chunks (see :meth:`capreward.backbones.CLIPBackbone.visual_embeddings`), so
  memory stays bounded whatever the budget; the budget bounds the work of ``frames=None`` (``--frames 0``).

The limits are process-wide: :func:`set_media_limits` changes them, the ``with media_limits(...)``
context manager changes them temporarily, and the environment variables ``CAPREWARD_MAX_PIXELS``,
``CAPREWARD_MAX_VIDEO_PIXELS``, ``CAPREWARD_MAX_VIDEO_FRAMES`` and ``CAPREWARD_MAX_MODEL_PIXELS`` set them at import (so reward servers, scoring jobs and Ray workers pick
them up without code), and the ``--max-pixels`` / ``--max-video-pixels`` options of ``capreward score``,
``serve`` and ``explain`` set them for the command (the Ray engine's actors get the driver's limits). PIL's own ``Image.MAX_IMAGE_PIXELS`` guard still applies above our limit.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar, cast
from collections.abc import Callable, Iterator, Sequence

DEFAULT_MAX_PIXELS = 2**25
DEFAULT_MAX_VIDEO_PIXELS = 2**28
DEFAULT_MAX_VIDEO_FRAMES = 2**18
DEFAULT_MAX_MODEL_PIXELS = 2**28

_FIELDS = (
    ("max_pixels", "CAPREWARD_MAX_PIXELS"),
    ("max_video_pixels", "CAPREWARD_MAX_VIDEO_PIXELS"),
    ("max_video_frames", "CAPREWARD_MAX_VIDEO_FRAMES"),
    ("max_model_pixels", "CAPREWARD_MAX_MODEL_PIXELS"),
)


@dataclass(frozen=True)
class MediaLimits:
    """Bounds on what one visual may cost to decode and encode (a larger one is a
    :class:`~capreward.media.MediaError` naming the limit). All must be positive.

    Args:
        max_pixels: width x height of one image or one video frame.
        max_video_pixels: total pixels of the frames sampled from one video.
        max_video_frames: frames one video file may hold (from its header).
        max_model_pixels: frames encoded from one video x the encoder's input pixels.

    Raises:
        ValueError: a limit that is not a positive int.

    Examples:
        >>> from capreward.media import MediaLimits, get_media_limits, media_limits
        >>> MediaLimits(max_pixels=64 * 64).max_pixels
        4096
        >>> with media_limits(max_pixels=64 * 64) as limits:
        ...     get_media_limits() == limits
        True
    """

    max_pixels: int = DEFAULT_MAX_PIXELS
    max_video_pixels: int = DEFAULT_MAX_VIDEO_PIXELS
    max_video_frames: int = DEFAULT_MAX_VIDEO_FRAMES
    max_model_pixels: int = DEFAULT_MAX_MODEL_PIXELS

    def __post_init__(self) -> None:
        check_positive_ints(self, _FIELDS)


def check_positive_ints(settings: Any, fields: Sequence[tuple[str, str]]) -> None:
    """Raise ValueError naming the first of ``fields`` (``(field, environment variable)`` pairs) whose
    value on ``settings`` (a dataclass of limits) is not a positive int."""
    for field, _ in fields:
        value = getattr(settings, field)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{field} must be a positive int, got {value!r}")


def whole_numbers_from_env(fields: Sequence[tuple[str, str]]) -> dict[str, int]:
    """``{field: value}`` of the environment variables of ``fields`` (``(field, variable)`` pairs) that are
    set and not blank, read as whole numbers (``_`` separators allowed); ValueError naming a variable that
    is not one."""
    values = {}
    for field, var in fields:
        raw = (os.environ.get(var) or "").strip()
        if raw:
            try:
                values[field] = int(raw.replace("_", ""))
            except ValueError:
                raise ValueError(f"{var} must be a whole number, got {raw[:40]!r}") from None
    return values


_S = TypeVar("_S")  # a frozen dataclass of whole-number settings


class ProcessWide(Generic[_S]):
    """One process-wide settings dataclass (:class:`MediaLimits`, the caption budget): built at import from
    the environment variables of ``fields`` (:func:`whole_numbers_from_env`), changed by :meth:`set`, and
    for a block by :meth:`within`. ``current`` is the settings in force."""

    def __init__(self, settings_type: Callable[..., _S], fields: Sequence[tuple[str, str]]):
        self.current: _S = settings_type(**whole_numbers_from_env(fields))

    def set(self, **changes: int | None) -> _S:
        """Replace the fields of ``changes`` that are not None (the dataclass validates them; nothing changes
        when it refuses one). Returns the previous settings."""
        previous = self.current
        self.current = replace(cast(Any, self.current), **{k: v for k, v in changes.items() if v is not None})
        return previous

    @contextlib.contextmanager
    def within(self, **changes: int | None) -> Iterator[_S]:
        """``with setting.within(...):`` the settings changed as by :meth:`set` inside the block, restored after it."""
        previous = self.set(**changes)
        try:
            yield self.current
        finally:
            self.current = previous


_limits: ProcessWide[MediaLimits] = ProcessWide(MediaLimits, _FIELDS)


def get_media_limits() -> MediaLimits:
    """The limits in force.

    Returns:
        The process-wide :class:`MediaLimits` (from the ``CAPREWARD_MAX_*`` environment variables, or
        as :func:`set_media_limits` left them).
    """
    return _limits.current


def set_media_limits(max_pixels: int | None = None, max_video_pixels: int | None = None,
                     max_video_frames: int | None = None, max_model_pixels: int | None = None) -> MediaLimits:
    """Change the process-wide limits.

    Args:
        max_pixels: width x height of one image or video frame.
        max_video_pixels: total pixels of the frames sampled from one video.
        max_video_frames: frames one video file may hold.
        max_model_pixels: frames encoded from one video x the encoder's input pixels.

    (None keeps a limit as it is.)

    Returns:
        The previous :class:`MediaLimits`.

    Raises:
        ValueError: a limit that is not a positive int.
    """
    return _limits.set(max_pixels=max_pixels, max_video_pixels=max_video_pixels, max_video_frames=max_video_frames,
                       max_model_pixels=max_model_pixels)


@contextlib.contextmanager
def media_limits(max_pixels: int | None = None, max_video_pixels: int | None = None,
                 max_video_frames: int | None = None, max_model_pixels: int | None = None) -> Iterator[MediaLimits]:
    """``with media_limits(max_pixels=...):`` the limits inside the block, restored after it.

    Args:
        max_pixels: width x height of one image or video frame.
        max_video_pixels: total pixels of the frames sampled from one video.
        max_video_frames: frames one video file may hold.
        max_model_pixels: frames encoded from one video x the encoder's input pixels.

    (None keeps a limit as it is.)

    Yields:
        The :class:`MediaLimits` in force inside the block.
    """
    with _limits.within(max_pixels=max_pixels, max_video_pixels=max_video_pixels, max_video_frames=max_video_frames,
                        max_model_pixels=max_model_pixels) as limits:
        yield limits
