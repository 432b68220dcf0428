"""Inverse document frequency weights for EMScore, following the released code's procedure.

The released code counts document frequency over the *set* of ids of each caption's padded
77-token row (so the padding id, SOS and EOS are counted), computes idf(t) = ln((N+1)/(df(t)+1)),
gives unseen ids ln(N+1), and then overwrites idf(EOS) with the arithmetic mean of the idf values of
every id in the df table (EOS's own value, 0, included).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from collections.abc import Iterable, Mapping

import torch


@dataclass
class IdfTable:
    """Token id → weight, with ``default`` for ids not in ``weights``."""

    weights: dict[int, float]
    default: float

    def vector(self, vocab_size: int) -> torch.Tensor:
        """A dense fp32 lookup vector of length ``vocab_size``."""
        vec = torch.full((vocab_size,), float(self.default), dtype=torch.float32)
        for token_id, w in self.weights.items():
            if 0 <= token_id < vocab_size:
                vec[token_id] = float(w)
        return vec


def idf_from_rows(rows: Iterable[Iterable[int]], eos_id: int) -> IdfTable:
    """The released EMScore idf table from padded token-id rows (one row per corpus caption)."""
    df: Counter[int] = Counter()
    n_docs = 0
    for row in rows:
        df.update(set(int(t) for t in row))
        n_docs += 1
    if n_docs == 0:
        raise ValueError("the idf corpus is empty")
    weights = {t: math.log((n_docs + 1) / (c + 1)) for t, c in df.items()}
    weights[eos_id] = sum(weights.values()) / len(weights)
    return IdfTable(weights=weights, default=math.log(n_docs + 1))


def idf_from_mapping(mapping: Mapping[int, float], default: float | None = None) -> IdfTable:
    """A user-given id → weight table; ids it lacks get ``default``. When ``default`` is None: the
    ``default_factory`` value of a ``defaultdict`` (the released code's idf dict is one, giving unseen
    ids ln(N+1)), else the table's largest weight."""
    if not mapping:
        raise ValueError("the idf dict is empty")
    weights = {int(k): float(v) for k, v in mapping.items()}
    bad = {k: v for k, v in weights.items() if not (math.isfinite(v) and v >= 0)}
    if bad:
        shown = ", ".join(f"{k}: {v}" for k, v in list(bad.items())[:5])
        raise ValueError(f"idf weights must be finite and >= 0; {len(bad)} are not ({shown})")
    if default is None and isinstance(mapping, defaultdict) and mapping.default_factory is not None:
        default = mapping.default_factory()
    default = max(weights.values()) if default is None else float(default)
    if not (math.isfinite(default) and default >= 0):
        raise ValueError(f"the idf default weight must be finite and >= 0, got {default}")
    return IdfTable(weights=weights, default=default)
