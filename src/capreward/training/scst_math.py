"""Pure math of self-critical sequence training (no model code).

SCST (Rennie et al., CVPR 2017) is REINFORCE with the reward of the model's own greedy caption as the
baseline: for k captions w^s sampled per visual,

    loss = - Σ_s (r(w^s) - b) · Σ_t log p(w^s_t | w^s_<t, visual),

with b = r(ŵ), the greedy caption's reward. The "new SCST" variant (Luo, 2020, "A Better Variant of
Self-Critical Sequence Training") drops the greedy decode and uses the mean reward of the *other* k-1
samples of the same visual as each sample's baseline.
"""

from __future__ import annotations

import torch

BASELINES = ("greedy", "mean")


def scst_advantages(rewards: torch.Tensor, greedy: torch.Tensor | None = None, baseline: str = "greedy") -> torch.Tensor:
    """Advantages ``r - b`` [B, k] for rewards [B, k] of k samples per visual.

    ``baseline="greedy"``: b is ``greedy`` [B] (the reward of each visual's greedy caption).
    ``baseline="mean"``: b of sample j is the mean of the other samples of its visual.
    NaN marks a sample without a reward (an unscorable caption): its advantage is 0 and it does not
    enter the other samples' mean baseline. A visual whose baseline is undefined (greedy reward NaN, or
    fewer than two scored samples with ``"mean"``) gets advantage 0 for all its samples.

    Args:
        rewards: [B, k] rewards of k samples per visual (NaN: no reward).
        greedy: [B] rewards of each visual's greedy caption (``baseline="greedy"``).
        baseline: ``"greedy"`` or ``"mean"``.

    Returns:
        The advantages [B, k], without gradient (rewards are constants for REINFORCE).

    Examples:
        >>> import torch
        >>> from capreward.training import scst_advantages
        >>> a = scst_advantages(torch.tensor([[0.8, 0.2, float("nan")]]), baseline="mean")
        >>> [round(v, 4) for v in a[0].tolist()]   # 0.8 - 0.2, 0.2 - 0.8; no reward: 0
        [0.6, -0.6, 0.0]
    """
    if baseline not in BASELINES:
        raise ValueError(f"baseline must be one of {BASELINES}, got {baseline!r}")
    rewards = rewards.detach().double()
    if rewards.ndim != 2:
        raise ValueError(f"rewards must have shape (B, k), got {tuple(rewards.shape)}")
    valid = ~torch.isnan(rewards)
    r = torch.where(valid, rewards, torch.zeros_like(rewards))
    if baseline == "greedy":
        if greedy is None:
            raise ValueError("baseline='greedy' needs the greedy captions' rewards")
        greedy = greedy.detach().double().reshape(-1)
        if greedy.shape[0] != rewards.shape[0]:
            raise ValueError(f"got {greedy.shape[0]} greedy rewards for {rewards.shape[0]} visuals")
        b = greedy[:, None].expand_as(r)
    else:
        count = valid.sum(dim=1, keepdim=True)
        others = (count - valid.long()).clamp(min=1)
        b = (r.sum(dim=1, keepdim=True) - r) / others
        b = torch.where(count >= 2, b, torch.full_like(b, float("nan")))
    adv = r - b
    return torch.where(valid & ~torch.isnan(adv), adv, torch.zeros_like(adv))


def sequence_log_probs(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ_t log p(tokens_t) over positions where ``mask`` is true: logits [N, T, V] predict tokens [N, T].

    Returns [N] (differentiable with respect to ``logits``)."""
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return (logp * mask.to(logp.dtype)).sum(dim=-1)


def reinforce_loss(seq_log_probs: torch.Tensor, advantages: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """``- mean_s advantage_s · log p(w^s)`` over all samples (those without a reward have advantage 0).

    Args:
        seq_log_probs: each sample's caption log-probability (with gradient).
        advantages: each sample's advantage (same shape; flattened inside).
        lengths: each sample's token count: its log-probability is divided by it (length-normalised
            SCST); None: not normalised.

    Returns:
        A scalar attached to the graph of ``seq_log_probs``.
    """
    lp = seq_log_probs.reshape(-1)
    adv = advantages.reshape(-1).to(lp.device, lp.dtype)
    if lengths is not None:
        lp = lp / lengths.reshape(-1).to(lp.device, lp.dtype).clamp(min=1)
    return -(adv * lp).mean()
