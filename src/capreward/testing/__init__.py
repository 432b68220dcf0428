"""Offline, deterministic fixtures (tiny models) for tests and demos of code that uses capreward."""

from .tiny_clip import (
    TINY_CLIP_CONFIG,
    build_tiny_clip,
    openai_state_dict,
    save_tiny_clip_openai,
    tiny_clip_factory,
)

__all__ = [
    "TINY_CLIP_CONFIG",
    "build_tiny_clip",
    "openai_state_dict",
    "save_tiny_clip_openai",
    "tiny_clip_factory",
]
