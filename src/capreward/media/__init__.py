"""Media: load and validate images, decode and sample videos, and key them for caching."""

from .backends import BACKENDS, decord_available, get_video_backend, resolve_backend, set_video_backend, video_backend
from .containers import CONTAINERS, NOT_A_CONTAINER
from .errors import MediaError, MediaRefused
from .files import ConfinedFile, FileRefused
from .images import NAN_IMAGE, ImageLike, describe, load_image, to_rgb, viewable
from .limits import (DEFAULT_MAX_MODEL_PIXELS, DEFAULT_MAX_PIXELS, DEFAULT_MAX_VIDEO_FRAMES, DEFAULT_MAX_VIDEO_PIXELS,
                     MediaLimits, get_media_limits, media_limits, set_media_limits)
from .keys import media_key
from .videos import DEFAULT_FRAMES, VideoFrames, VideoLike, frames_to_pil, load_video, open_video, sample_indices

__all__ = [
    "BACKENDS",
    "CONTAINERS",
    "ConfinedFile",
    "DEFAULT_MAX_MODEL_PIXELS",
    "DEFAULT_MAX_VIDEO_FRAMES",
    "NAN_IMAGE",
    "NOT_A_CONTAINER",
    "VideoFrames",
    "decord_available",
    "get_video_backend",
    "open_video",
    "resolve_backend",
    "set_video_backend",
    "video_backend",
    "DEFAULT_FRAMES",
    "DEFAULT_MAX_PIXELS",
    "DEFAULT_MAX_VIDEO_PIXELS",
    "FileRefused",
    "MediaLimits",
    "get_media_limits",
    "media_limits",
    "set_media_limits",
    "to_rgb",
    "viewable",
    "ImageLike",
    "MediaError",
    "MediaRefused",
    "VideoLike",
    "describe",
    "frames_to_pil",
    "load_image",
    "load_video",
    "media_key",
    "sample_indices",
]
