"""CLIP-S and RefCLIP-S (Hessel et al., "CLIPScore: A Reference-free Evaluation Metric for Image
Captioning", EMNLP 2021); PAC-S (Sarto et al., CVPR 2023) is the same math with w = 2.0."""

from __future__ import annotations

from collections.abc import Callable

import torch

from .harmonic import released_harmonic_mean


def clip_s(image: torch.Tensor, text: torch.Tensor, w: float = 2.5) -> torch.Tensor:
    """w · max(cos(image, text), 0) for normalised embeddings [N, D]; in [0, w]."""
    return w * (image * text).sum(-1).clamp_min(0.0)


def reference_similarity(text: torch.Tensor, refs: torch.Tensor, ref_mask: torch.Tensor) -> torch.Tensor:
    """max_r cos(text, ref_r) over each candidate's real references; text [N, D], refs [N, R, D]."""
    sims = torch.einsum("nd,nrd->nr", text, refs).masked_fill(~ref_mask, float("-inf"))
    return sims.max(dim=1).values


def ref_clip_s(
    clip_score: torch.Tensor,
    ref_similarity: torch.Tensor,
    mean: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = released_harmonic_mean,
) -> torch.Tensor:
    """Harmonic mean of CLIP-S and the (unscaled, unclipped) best reference similarity.

    ``mean``: the paper's 2ab/(a+b) (0 where both are 0) by default, which leaves [0, w] when the
    reference similarity is negative; with :func:`~capreward.metrics.harmonic.sign_safe_harmonic_mean`
    the result lies in [min(CLIP-S, similarity), max(...)], so in [-1, w] for w >= 1."""
    return mean(clip_score, ref_similarity)
