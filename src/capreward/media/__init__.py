"""Media: load and validate images, decode and sample videos, and key them for caching."""

from .errors import MediaError
from .images import ImageLike, describe, load_image
from .keys import media_key
from .videos import DEFAULT_FRAMES, VideoLike, frames_to_pil, load_video, sample_indices

__all__ = [
    "DEFAULT_FRAMES",
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
