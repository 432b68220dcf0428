"""EMScore's matching math on embeddings (Shi et al., "EMScore: Evaluating Video Captioning via
Coarse-Grained and Fine-Grained Embedding Matching", CVPR 2022).

All inputs are L2-normalised embeddings. Padded positions are excluded from every max with a mask
(never multiplied by zero, which would clamp negative maxima to 0 as the released code does), so a
score never depends on what else is in the batch.

Every similarity and every reduction (the sums of P and R, the frame mean of f_V, the coarse cosine) is
computed in float64 (:func:`exact_dtype`) from the fp32 embeddings, and F is formed from the float64 P
and R before the results come back in the embeddings' dtype. In fp32 a sum's rounding depends on the
batch's padded shape (the matmul kernel and the vector lanes of a reduction change with it), which
moved P and R by ~1e-7 with the batch; F = 2PR/(P+R) multiplies that by 2R^2/(P+R)^2, up to 1e-2 near
its singularity P + R = 0. In float64 the products of fp32 numbers are exact and the sums' rounding is
~1e-16, so P, R and F of a sample are the same, to the last fp32 bit but in rare rounding ties, alone
or in any batch, in any order, near the singularity too (down to |P + R| ~ 1e-5). What float64 cannot
remove is a difference in the embeddings themselves: see the ``batch_size`` of
:class:`~capreward.scorers.emscore.EMScore`.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Callable

import torch

from ..devices import host_to_device, strict_fp32
from .harmonic import released_harmonic_mean


@dataclass
class FineMatch:
    """Fine-grained precision, recall, F (Tensor[N] each, in [-1, 1]) and, for each candidate
    position, the index of its best-matching target (frame or reference token), -1 at padding."""

    p: torch.Tensor
    r: torch.Tensor
    f: torch.Tensor
    best_target: torch.Tensor  # LongTensor [N, Lc]
    best_similarity: torch.Tensor  # [N, Lc]


def exact_dtype(device: torch.device) -> torch.dtype:
    """The dtype EMScore's similarities and reductions are computed in on ``device``: float64, or
    float32 on Apple's MPS, which has no float64."""
    return torch.float32 if torch.device(device).type == "mps" else torch.float64


def masked_weighted_mean(values: torch.Tensor, weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ w·v / Σ w over the positions where ``mask`` is True (last dimension)."""
    w = weights * mask
    return (values * w).sum(-1) / w.sum(-1).clamp_min(torch.finfo(values.dtype).tiny)


def f_measure(p: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """The paper's F: harmonic mean 2PR/(P+R), 0 where P+R == 0 (see
    :func:`~capreward.metrics.harmonic.released_harmonic_mean`)."""
    return released_harmonic_mean(p, r)


def greedy_match(
    cand: torch.Tensor,
    cand_mask: torch.Tensor,
    cand_weight: torch.Tensor,
    target: torch.Tensor,
    target_mask: torch.Tensor,
    target_weight: torch.Tensor,
    mean: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = released_harmonic_mean,
) -> FineMatch:
    """Token-to-target greedy matching of EMScore's fine-grained score.

    cand: [N, Lc, D] candidate token embeddings; target: [N, Lt, D] frame embeddings (video) or
    reference token embeddings; masks [N, L*] are True on real positions; weights [N, L*] are the idf
    weights (uniform for frames).

    P = Σ_i w_i max_j s_ij / Σ_i w_i, R = Σ_j w*_j max_i s_ij / Σ_j w*_j, each in [-1, 1], and
    F = ``mean(P, R)``: the paper's 2PR/(P+R) by default (which leaves [-1, 1] when P and R have
    opposite signs), or :func:`~capreward.metrics.harmonic.sign_safe_harmonic_mean` (in [-1, 1]).

    Computed in float64 (:func:`exact_dtype`: similarities, sums and F from the float64 P and R) and
    returned in ``cand``'s dtype, so a sample's P, R and F do not depend on the batch's padding or
    composition (see the module docstring); ``best_similarity`` is in ``cand``'s dtype too.
    """
    out_dtype = cand.dtype
    exact = exact_dtype(cand.device)
    cand, target = cand.to(exact), target.to(exact)
    cand_weight, target_weight = cand_weight.to(exact), target_weight.to(exact)
    with strict_fp32(cand.device):  # IEEE fp32 on CUDA even where the caller allows TF32 (capreward.devices)
        sim = torch.bmm(cand, target.transpose(1, 2))  # [N, Lc, Lt]
    pair_mask = cand_mask[:, :, None] & target_mask[:, None, :]
    sim = sim.masked_fill(~pair_mask, float("-inf"))
    best_sim, best_target = sim.max(dim=2)
    recall_sim = sim.max(dim=1).values
    best_sim = best_sim.masked_fill(~cand_mask, 0.0)
    recall_sim = recall_sim.masked_fill(~target_mask, 0.0)
    p = masked_weighted_mean(best_sim, cand_weight, cand_mask)
    r = masked_weighted_mean(recall_sim, target_weight, target_mask)
    return FineMatch(
        p=p.to(out_dtype),
        r=r.to(out_dtype),
        f=mean(p, r).to(out_dtype),
        best_target=best_target.masked_fill(~cand_mask, -1),
        best_similarity=best_sim.to(out_dtype),
    )


def video_embedding(frames: torch.Tensor, frame_mask: torch.Tensor) -> torch.Tensor:
    """f_V = normalise(mean of the (normalised) frame embeddings over real frames); [N, D], in ``frames``'
    dtype, computed in float64 (:func:`exact_dtype`) so that the number of padded frames does not round it."""
    exact = exact_dtype(frames.device)
    m = frame_mask[..., None].to(exact)
    mean = (frames.to(exact) * m).sum(1) / m.sum(1).clamp_min(1.0)
    return torch.nn.functional.normalize(mean, dim=-1).to(frames.dtype)


def coarse_score(caption: torch.Tensor, visual: torch.Tensor) -> torch.Tensor:
    """cos(f_X, f_V) of normalised embeddings [N, D], unscaled and unclipped; in [-1, 1]; summed in float64
    (:func:`exact_dtype`), returned in ``caption``'s dtype."""
    exact = exact_dtype(caption.device)
    return (caption.to(exact) * visual.to(exact)).sum(-1).to(caption.dtype)


def pad_stack(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack [L_i, D] tensors into [N, max L, D] (zeros after each row, in the first row's dtype and on
    its device) with a BoolTensor [N, max L] marking real rows.

    On an accelerator a fixed number of device operations whatever N (:func:`pad_stack_indexed`): a copy per
    row would launch 2N tiny kernels on a GPU. On the CPU, where a copy costs no launch, torch's own
    ``pad_sequence`` loop, which is faster there than one indexed copy."""
    first = rows[0]
    dev = first.device
    if dev.type != "cpu" or any(r.device != dev for r in rows):
        return pad_stack_indexed(rows)
    sizes = [r.shape[0] for r in rows]
    mask = torch.arange(max(sizes))[None, :] < torch.tensor(sizes)[:, None]
    out = torch.nn.utils.rnn.pad_sequence([r.to(first.dtype) for r in rows], batch_first=True)
    return out, mask


def pad_stack_indexed(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`pad_stack` in one concatenation and one indexed copy, with the row slots and the mask computed
    on the host from the lengths and copied once (pinned, non-blocking on CUDA)."""
    first = rows[0]
    dev = first.device
    sizes = [r.shape[0] for r in rows]
    n, width = len(rows), max(sizes)
    lengths = torch.tensor(sizes, dtype=torch.long)
    mask = host_to_device(torch.arange(width)[None, :] < lengths[:, None], dev)
    if any(r.device != dev for r in rows):
        rows = [r.to(dev) for r in rows]
    if all(k == width for k in sizes):
        return torch.stack(rows).to(first.dtype), mask
    starts = torch.cumsum(lengths, 0) - lengths
    row = torch.repeat_interleave(torch.arange(n), lengths)
    slot = row * width + torch.arange(sum(sizes)) - starts[row]  # position of each packed row
    out = first.new_zeros(n * width, *first.shape[1:])
    out.index_copy_(0, host_to_device(slot, dev), torch.cat(rows).to(first.dtype))
    return out.view(n, width, *first.shape[1:]), mask
