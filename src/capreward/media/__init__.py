"""Media: load and validate images, decode and sample videos, and key them for caching."""

from .errors import MediaError
from .files import ConfinedFile, FileRefused
from .images import ImageLike, describe, load_image, to_rgb, viewable
from .limits import DEFAULT_MAX_PIXELS, DEFAULT_MAX_VIDEO_PIXELS, MediaLimits, get_media_limits, media_limits, set_media_limits
from .keys import media_key
from .videos import DEFAULT_FRAMES, VideoLike, frames_to_pil, load_video, sample_indices

__all__ = [
    "ConfinedFile",
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
    "VideoLike",
    "describe",
    "frames_to_pil",
    "load_image",
    "load_video",
    "media_key",
    "sample_indices",
]
