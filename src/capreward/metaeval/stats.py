"""The statistics of the meta-evaluation protocols (plain numbers in, plain numbers out).

Correlations come from scipy and are returned as coefficients in [-1, 1] (NaN when undefined, e.g. a
constant input); the protocols turn them into percent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .._extras import require


def _scipy_stats():
    """scipy.stats (the ``metaeval`` extra), imported when a correlation is first computed, so that the
    judgment readers and ``capreward meta-eval --help`` work without it."""
    return require("metaeval", "scipy.stats", used_by="meta-evaluation correlations (capreward meta-eval)")


def _correlation(test: str, x: Sequence[float], y: Sequence[float], **options: str) -> float:
    """``scipy.stats.<test>(x, y, **options)``'s coefficient as a float, once ``x`` and ``y`` are checked to be
    two 1-D sequences of equal length with at least 2 points (ValueError otherwise)."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if xs.shape != ys.shape or xs.ndim != 1:
        raise ValueError(f"need two 1-D sequences of equal length, got shapes {xs.shape} and {ys.shape}")
    if len(xs) < 2:
        raise ValueError(f"a correlation needs at least 2 points, got {len(xs)}")
    return float(getattr(_scipy_stats(), test)(xs, ys, **options).statistic)


def kendall(x: Sequence[float], y: Sequence[float], variant: str = "c") -> float:
    """Kendall's tau-b or tau-c of ``x`` and ``y``.

    Args:
        x: one value per item.
        y: the other value per item (same length).
        variant: ``"b"`` or ``"c"`` (the benchmarks' protocols name which).

    Returns:
        The coefficient, in [-1, 1].

    Examples:
        >>> from capreward.metaeval import kendall
        >>> round(kendall([1, 2, 3, 4], [1, 3, 2, 4], variant="b"), 4)
        0.6667
    """
    if variant not in ("b", "c"):
        raise ValueError(f"variant must be 'b' or 'c', got {variant!r}")
    return _correlation("kendalltau", x, y, variant=variant)


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation.

    Args:
        x: one value per item.
        y: the other value per item (same length).

    Returns:
        The coefficient, in [-1, 1].
    """
    return _correlation("spearmanr", x, y)


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson's linear correlation.

    Args:
        x: one value per item.
        y: the other value per item (same length).

    Returns:
        The coefficient, in [-1, 1].
    """
    return _correlation("pearsonr", x, y)


def pairwise_outcomes(preferred: Sequence[float | None], other: Sequence[float | None]) -> dict[str, int]:
    """Counts of pairs where the human-preferred caption scores strictly higher (``hits``), equally
    (``ties``), lower (``wrong``), or lacks a score on either side (``unscored``)."""
    out = {"hits": 0, "ties": 0, "wrong": 0, "unscored": 0}
    for p, o in zip(preferred, other, strict=True):
        if p is None or o is None or math.isnan(p) or math.isnan(o):
            out["unscored"] += 1
        elif p > o:
            out["hits"] += 1
        elif p == o:
            out["ties"] += 1
        else:
            out["wrong"] += 1
    return out


def pairwise_accuracy(preferred: Sequence[float | None], other: Sequence[float | None]) -> float:
    """Share of pairs where the preferred caption scores strictly higher; ties and pairs without both
    scores count as misses (the denominator is every pair).

    Args:
        preferred: the score of each pair's human-preferred caption (None: unscored).
        other: the score of its other caption.

    Returns:
        The share, in [0, 1]; NaN for no pairs.

    Examples:
        >>> from capreward.metaeval import pairwise_accuracy
        >>> pairwise_accuracy([0.9, 0.5, 0.7, None], [0.1, 0.5, 0.8, 0.2])
        0.25
    """
    counts = pairwise_outcomes(preferred, other)
    total = sum(counts.values())
    return counts["hits"] / total if total else math.nan


def percent(x: float) -> float:
    """A coefficient or share in [-1, 1] as the papers print it: times 100, NaN kept."""
    return x * 100.0
