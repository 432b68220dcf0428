"""Weighted terms: the one syntax of a weighted list of metrics, for ``serve --reward composite``
(``CAPREWARD_COMPOSITE``, :attr:`~capreward.adapters.factory.RewardOptions.composite`) and the GRPO
recipe's ``--rewards``.

The documented form is ``name=weight`` joined by commas (``"emscore=1,clip_s=0.5"``); ``name:weight``
(the recipe's earlier form) is accepted too, and a bare name weighs 1. Names are read through the
registry's aliases (``clipscore`` is ``clip_s``).

Examples:
    >>> parse_weighted_terms("emscore=1, clipscore:0.5,hallucination")
    [('emscore', 1.0), ('clip_s', 0.5), ('hallucination', 1.0)]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: The separator the docs use between a name and its weight; ``:`` is accepted as well.
WEIGHT_SEP = "="


def split_term(part: str) -> tuple[str, str]:
    """``"name=w"`` or ``"name:w"`` -> ``("name", "w")`` (``""`` for a bare name)."""
    cut = min((i for i in (part.find("="), part.find(":")) if i >= 0), default=-1)
    if cut < 0:
        return part.strip(), ""
    return part[:cut].strip(), part[cut + 1:].strip()


def parse_weighted_terms(spec: str, choices: Sequence[str] | None = None, *, what: str = "reward",
                         where: str = "", unique: bool = True) -> list[tuple[str, float]]:
    """The ``(canonical name, weight)`` terms of ``spec``.

    Args:
        spec: ``"name=weight,..."`` (or ``name:weight``; a bare name weighs 1).
        choices: the accepted names (default: every registered metric).
        what: what a name is, for messages (``"reward"``).
        where: where ``spec`` came from, for messages (``" in --rewards 'x'"``).
        unique: refuse a name given twice.

    Returns:
        The terms in the order given.

    Raises:
        ValueError: an unknown name (with the closest names), a weight that is not a finite number, a
            name given twice (with ``unique``), or no term at all.
    """
    from .names import canonical

    out: list[tuple[str, float]] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        raw_name, weight = split_term(part)
        try:
            name = canonical(raw_name, choices, what=what)
        except ValueError as exc:
            raise ValueError(f"{exc}{where}") from None
        try:
            w = float(weight) if weight else 1.0
        except ValueError:
            raise ValueError(f"bad weight {weight!r} for {what} {name!r}{where}: the weight must be a number") from None
        if not math.isfinite(w):
            raise ValueError(f"weight of {name!r} must be finite, got {weight!r}{where}")
        if unique and name in {n for n, _ in out}:
            raise ValueError(f"{what} {name!r} given twice{where}")
        out.append((name, w))
    if not out:
        raise ValueError(f"{spec!r} names no {what}{where}")
    return out


__all__ = ["WEIGHT_SEP", "parse_weighted_terms", "split_term"]
