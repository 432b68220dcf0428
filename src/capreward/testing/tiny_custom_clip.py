"""Tiny open_clip ``CustomTextCLIP`` models built offline (seeded random weights), for tests of
:mod:`capreward.backbones.open_clip_text`.

- ``"siglip"``: the SigLIP text tower layout of open_clip's ``ViT-B-16-SigLIP`` config at toy width
  (no causal mask, ``pool_type="last"``, projection with bias, 64 positions) with open_clip's own
  ``HFTokenizer`` (``clean="canonicalize"``) over a tiny SigLIP-style tokenizer saved to a temporary
  directory (see :mod:`capreward.testing.tiny_hf_clip`).
- ``"eva"``: the EVA02-CLIP layout (``custom_text``: a causal tower in ``model.text``, ``argmax``
  pooling, 77 positions) with CLIP's BPE ``SimpleTokenizer``.

Both use open_clip's own ViT image tower (EVA's and SigLIP's come from timm; the text side is what
differs).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable

import torch

CUSTOM_KINDS = ("siglip", "eva")


def build_tiny_custom_clip(kind: str = "siglip", seed: int = 0) -> torch.nn.Module:
    """A tiny open_clip ``CustomTextCLIP`` of ``kind`` (one of :data:`CUSTOM_KINDS`) in eval mode."""
    from open_clip.model import CLIPTextCfg, CLIPVisionCfg, CustomTextCLIP

    if kind not in CUSTOM_KINDS:
        raise ValueError(f"kind must be one of {CUSTOM_KINDS}, got {kind!r}")
    if kind == "siglip":
        from .tiny_hf_clip import _siglip_tokenizer

        text = CLIPTextCfg(context_length=64, vocab_size=len(_siglip_tokenizer()), width=64, heads=2, layers=2,
                           no_causal_mask=True, proj_bias=True, pool_type="last", pad_id=1)
    else:
        text = CLIPTextCfg(context_length=77, vocab_size=49408, width=64, heads=2, layers=2)
    devices: list[int] | None = [] if not torch.cuda.is_available() else None
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        model = CustomTextCLIP(32, vision_cfg=CLIPVisionCfg(layers=2, width=64, patch_size=8, image_size=32, head_width=32),
                               text_cfg=text)
        with torch.no_grad():  # widen the init so outputs vary visibly with the input
            for name, p in model.named_parameters():
                if p.ndim >= 2 and "ln" not in name:
                    p.normal_(0.0, 0.5 / max(1.0, p.shape[-1]) ** 0.5)
    return model.eval()


def tiny_custom_clip_factory(kind: str = "siglip", seed: int = 0) -> Callable[[], tuple]:
    """A zero-argument factory ``() -> (model, preprocess, tokenizer)`` for :func:`build_tiny_custom_clip`,
    which every CLIP-based scorer accepts as ``model=``.

    Examples:
        >>> model, preprocess, tokenizer = tiny_custom_clip_factory("eva")()
        >>> type(model).__name__, model.context_length
        ('CustomTextCLIP', 77)
    """

    def factory():
        import open_clip

        model = build_tiny_custom_clip(kind, seed)
        preprocess = open_clip.image_transform(model.visual.image_size, is_train=False)
        if kind == "siglip":
            from .tiny_hf_clip import _siglip_tokenizer

            folder = tempfile.mkdtemp(prefix="tiny-siglip-tok-")
            _siglip_tokenizer().save_pretrained(folder)
            tokenizer = open_clip.tokenizer.HFTokenizer(folder, context_length=64, clean="canonicalize")
        else:
            tokenizer = open_clip.tokenizer.SimpleTokenizer(context_length=model.context_length)
        return model, preprocess, tokenizer

    return factory
