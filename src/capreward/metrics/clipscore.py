"""CLIP-S and RefCLIP-S (Hessel et al., "CLIPScore: A Reference-free Evaluation Metric for Image
Captioning", EMNLP 2021); PAC-S (Sarto et al., CVPR 2023) is the same math with w = 2.0."""

from __future__ import annotations

import torch

from .emscore import f_measure


def clip_s(image: torch.Tensor, text: torch.Tensor, w: float = 2.5) -> torch.Tensor:
    """w · max(cos(image, text), 0) for normalised embeddings [N, D]; in [0, w]."""
    return w * (image * text).sum(-1).clamp_min(0.0)


def reference_similarity(text: torch.Tensor, refs: torch.Tensor, ref_mask: torch.Tensor) -> torch.Tensor:
    """max_r cos(text, ref_r) over each candidate's real references; text [N, D], refs [N, R, D]."""
    sims = torch.einsum("nd,nrd->nr", text, refs).masked_fill(~ref_mask, float("-inf"))
    return sims.max(dim=1).values


def ref_clip_s(clip_score: torch.Tensor, ref_similarity: torch.Tensor) -> torch.Tensor:
    """Harmonic mean of CLIP-S and the (unscaled, unclipped) best reference similarity; 0 where both are 0."""
    return f_measure(clip_score, ref_similarity)
