"""Model backbones: CLIP-family towers (open_clip CLIP and CustomTextCLIP, Long-CLIP checkpoints,
transformers CLIPModel / SiglipModel / Siglip2Model) for the matching metrics."""

from .cache import LRUCache
from .clip import CLIPBackbone, TextEmbeddings, TokenBatch
from ..default_models import DEFAULT_CLIP
from .clip_loading import ModelLoadError, load_clip
from .hf_clip import TransformersBackbone
from .open_clip_text import CustomTextBackbone
from .windows import split_windows

#: Documented in the API reference (docs/api/backbones.md); the other names above still import from here.
__all__ = ["CLIPBackbone", "DEFAULT_CLIP", "ModelLoadError", "TransformersBackbone", "load_clip"]
