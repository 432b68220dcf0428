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

#: Documented in the API reference (docs/api/media.md); the other names above still import from here.
__all__ = ["MediaError", "MediaLimits", "MediaRefused", "get_media_limits", "get_video_backend", "load_image",
           "load_video", "media_limits", "set_media_limits", "set_video_backend", "video_backend"]
