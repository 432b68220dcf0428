"""Model backbones: CLIP towers (open_clip) for the matching metrics."""

from .cache import LRUCache
from .clip import CLIPBackbone, TextEmbeddings, TokenBatch
from .clip_loading import DEFAULT_CLIP, ModelLoadError, load_clip

__all__ = ["CLIPBackbone", "DEFAULT_CLIP", "LRUCache", "ModelLoadError", "TextEmbeddings", "TokenBatch", "load_clip"]
