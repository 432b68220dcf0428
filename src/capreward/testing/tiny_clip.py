"""A tiny CLIP built locally and deterministically, for offline tests and demos.

It has the real OpenAI CLIP architecture (ViT image tower, causal text transformer, QuickGELU, the
49,408-token BPE vocabulary and 77-token context) at a toy width, with weights drawn from a seeded
generator. ``save_tiny_clip_openai`` writes it as an OpenAI-format state dict, the same layout as
``ViT-B-32.pt``, so the production loading path is exercised.
"""

from __future__ import annotations

import os
from pathlib import Path
from collections.abc import Callable
from typing import Any

import torch

# Widths are multiples of 64 because OpenAI-format loading infers heads = width // 64.
TINY_CLIP_CONFIG: dict[str, Any] = {
    "embed_dim": 32,
    "vision": {"image_size": 32, "patch_size": 8, "width": 64, "layers": 2},
    "text": {"context_length": 77, "vocab_size": 49408, "width": 64, "layers": 2},
}


def build_tiny_clip(seed: int = 0, config: dict | None = None) -> torch.nn.Module:
    """A tiny open_clip ``CLIP`` in eval mode with seeded random weights.

    Args:
        seed: the weights' seed (same seed, same weights, on any machine).
        config: the open_clip model config (default :data:`TINY_CLIP_CONFIG`).

    Returns:
        The model.

    Every floating-point parameter is rounded to fp16 precision (kept in fp32), as OpenAI's released
    checkpoints are, so saving and reloading through the OpenAI-format loader is lossless.
    """
    from open_clip.model import CLIP, CLIPTextCfg, CLIPVisionCfg

    cfg = config or TINY_CLIP_CONFIG
    v, t = cfg["vision"], cfg["text"]
    devices: list[int] | None = [] if not torch.cuda.is_available() else None
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        model = CLIP(
            cfg["embed_dim"],
            vision_cfg=CLIPVisionCfg(
                layers=v["layers"], width=v["width"], patch_size=v["patch_size"], image_size=v["image_size"],
                head_width=64,
            ),
            text_cfg=CLIPTextCfg(
                context_length=t["context_length"], vocab_size=t["vocab_size"], width=t["width"],
                heads=t["width"] // 64, layers=t["layers"],
            ),
            quick_gelu=True,
        )
        # open_clip initialises some tensors (class/positional embeddings) at a tiny scale; widen them so
        # the toy model's outputs vary visibly with the input, as a trained model's do.
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dtype.is_floating_point and "ln" not in name and p.ndim >= 2:
                    p.normal_(0.0, 0.5 / max(1.0, p.shape[-1]) ** 0.5)
            for p in model.parameters():
                p.copy_(p.half().float())
    return model.eval()


def openai_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights as an OpenAI-format state dict (fp16 tensors, OpenAI key names)."""
    sd = {}
    for k, v in model.state_dict().items():
        if k == "attn_mask" or k.endswith(".attn_mask"):
            continue
        sd[k] = v.half() if v.is_floating_point() else v
    return sd


def save_tiny_clip_openai(path: str | os.PathLike, seed: int = 0) -> Path:
    """Build the tiny CLIP and save it as an OpenAI-format ``.pt`` state dict.

    Args:
        path: the file to write.
        seed: the weights' seed.

    Returns:
        The path written (pass ``model=str(path)`` to any CLIP-based scorer).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(openai_state_dict(build_tiny_clip(seed)), path)
    return path


def tiny_clip_factory(seed: int = 0) -> Callable[[], tuple]:
    """A zero-argument factory returning ``(model, preprocess, tokenizer)`` for the tiny CLIP.

    Pass it as ``model=`` to any CLIP-based scorer.

    Args:
        seed: the weights' seed.

    Returns:
        The factory.
    """

    def factory():
        import open_clip

        model = build_tiny_clip(seed)
        preprocess = open_clip.image_transform(model.visual.image_size, is_train=False)
        tokenizer = open_clip.tokenizer.SimpleTokenizer(context_length=model.context_length)
        return model, preprocess, tokenizer

    return factory


def save_tiny_long_clip(path: str | os.PathLike, seed: int = 0) -> Path:
    """A tiny CLIP with Long-CLIP's 248-token context saved in Long-CLIP's released layout
    (beichenzbc/Long-CLIP: ``positional_embedding`` and ``positional_embedding_res`` [248, W], ``mask1``
    and ``mask2`` [248, 1]); the two positional tables are drawn independently, so a loader that ignored
    either one would give other embeddings. Returns the path."""
    config = {**TINY_CLIP_CONFIG, "text": {**TINY_CLIP_CONFIG["text"], "context_length": 248}}
    state = openai_state_dict(build_tiny_clip(seed, config))
    generator = torch.Generator().manual_seed(seed + 248)
    width = state["positional_embedding"].shape[1]
    state["positional_embedding_res"] = (torch.randn(248, width, generator=generator) * 0.5).half()
    state["mask1"] = torch.zeros(248, 1)
    state["mask1"][:20] = 1
    state["mask2"] = 1 - state["mask1"]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path)
    return path
