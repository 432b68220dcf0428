"""Media: load and validate images, decode and sample videos, and key them for caching.

Names are imported on first use, so that reading the media limits (the command line's help) imports no
decoder and no torch.
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports

_LAZY = {
    "BACKENDS": "capreward.media.backends",
    "decord_available": "capreward.media.backends",
    "get_video_backend": "capreward.media.backends",
    "resolve_backend": "capreward.media.backends",
    "set_video_backend": "capreward.media.backends",
    "video_backend": "capreward.media.backends",
    "CONTAINERS": "capreward.media.containers",
    "NOT_A_CONTAINER": "capreward.media.containers",
    "MediaError": "capreward.media.errors",
    "MediaRefused": "capreward.media.errors",
    "ConfinedFile": "capreward.media.files",
    "FileRefused": "capreward.media.files",
    "NAN_IMAGE": "capreward.media.images",
    "ImageLike": "capreward.media.images",
    "describe": "capreward.media.images",
    "load_image": "capreward.media.images",
    "to_rgb": "capreward.media.images",
    "viewable": "capreward.media.images",
    "DEFAULT_MAX_MODEL_PIXELS": "capreward.media.limits",
    "DEFAULT_MAX_PIXELS": "capreward.media.limits",
    "DEFAULT_MAX_VIDEO_FRAMES": "capreward.media.limits",
    "DEFAULT_MAX_VIDEO_PIXELS": "capreward.media.limits",
    "MediaLimits": "capreward.media.limits",
    "get_media_limits": "capreward.media.limits",
    "media_limits": "capreward.media.limits",
    "set_media_limits": "capreward.media.limits",
    "media_key": "capreward.media.keys",
    "DEFAULT_FRAMES": "capreward.media.videos",
    "VideoFrames": "capreward.media.videos",
    "VideoLike": "capreward.media.videos",
    "frames_to_pil": "capreward.media.videos",
    "load_video": "capreward.media.videos",
    "open_video": "capreward.media.videos",
    "sample_indices": "capreward.media.videos",
}

#: Documented in the API reference (docs/api/media.md); the other names of the table import from here too.
__all__ = ["MediaError", "MediaLimits", "MediaRefused", "get_media_limits", "get_video_backend", "load_image",
           "load_video", "media_limits", "set_media_limits", "set_video_backend", "video_backend"]

__getattr__, __dir__ = lazy_exports(__name__, _LAZY)
