"""Harmonic means of two similarities: the papers' formula, and the sign-safe one that rewards use.

EMScore's F combines precision P and recall R, RefCLIP-S combines CLIP-S and the best reference
cosine, both with the harmonic mean ``2ab / (a + b)``. For a >= 0 and b >= 0 that lies between
``min(a, b)`` and ``max(a, b)``; with opposite signs it does not: it changes sign and is unbounded near
``a = -b`` (P = -0.61, R = 0.46 gives F = 3.59 with a colour CLIP, so a wrong caption tops the reward).
A policy that finds such captions is rewarded for the artefact, so rewards use
:func:`sign_safe_harmonic_mean`; the scorers keep :func:`released_harmonic_mean`, the papers' and
released code's formula.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from collections.abc import Callable

if TYPE_CHECKING:  # the command line reads HARMONIC_MEANS for its help before torch is imported
    import torch

#: Names of the harmonic means a reward can use (``harmonic_mean=`` of the EMScore and CLIP-S rewards).
HARMONIC_MEANS = ("sign-safe", "released")


def released_harmonic_mean(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``2ab / (a + b)`` elementwise, 0 where ``a + b == 0``: the formula of the EMScore and CLIPScore
    papers and their released code. In [min(a, b), max(a, b)] when a, b >= 0; with opposite signs it
    leaves that interval and is unbounded near ``a = -b``."""
    import torch

    denom = a + b
    safe = torch.where(denom == 0, torch.ones_like(denom), denom)
    return torch.where(denom == 0, torch.zeros_like(denom), 2 * a * b / safe)


def sign_safe_harmonic_mean(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``H(a, b) = 2ab / (a + b)`` where ``a > 0`` and ``b > 0``, else ``min(a, b)``, elementwise.

    H is continuous (both branches give 0 on the boundary a = 0 or b = 0 with the other positive),
    non-decreasing in each argument, symmetric, and lies in ``[min(a, b), max(a, b)]``: it never leaves
    the range of its parts, so a reward built on it needs no clipping, and no pair of opposite signs
    scores above a pair of positive parts. Gradients are finite everywhere (the unused branch never
    divides by zero).
    """
    import torch

    both = (a > 0) & (b > 0)
    denom = torch.where(both, a + b, torch.ones_like(a + b))
    return torch.where(both, 2 * a * b / denom, torch.minimum(a, b))


def harmonic_mean(name: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The mean called ``name`` (one of :data:`HARMONIC_MEANS`); ValueError for other names."""
    if name == "sign-safe":
        return sign_safe_harmonic_mean
    if name == "released":
        return released_harmonic_mean
    raise ValueError(f"harmonic_mean must be one of {HARMONIC_MEANS}, got {name!r}")
