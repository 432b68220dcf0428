"""Typed per-sample results shared by the matching scorers."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import overload
from collections.abc import Callable, Sequence

import torch


@dataclass
class MatchScores:
    """EMScore components, Tensor[N] each: coarse cos(f_X, f_V) and fine P/R/F in [-1, 1], and
    full = (fine + coarse) / 2 for each of P, R, F."""

    coarse: torch.Tensor
    fine_p: torch.Tensor
    fine_r: torch.Tensor
    fine_f: torch.Tensor
    full_p: torch.Tensor
    full_r: torch.Tensor
    full_f: torch.Tensor

    @classmethod
    def from_parts(cls, coarse: torch.Tensor, p: torch.Tensor, r: torch.Tensor, f: torch.Tensor) -> MatchScores:
        return cls(coarse, p, r, f, (p + coarse) / 2, (r + coarse) / 2, (f + coarse) / 2)

    @classmethod
    def average(cls, a: MatchScores, b: MatchScores) -> MatchScores:
        """EMScore(X, V, X*): fine and coarse parts averaged separately, then full recomputed."""
        return cls.from_parts(
            (a.coarse + b.coarse) / 2, (a.fine_p + b.fine_p) / 2, (a.fine_r + b.fine_r) / 2, (a.fine_f + b.fine_f) / 2
        )

    def as_dict(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def row(self, i: int) -> dict[str, float]:
        """Sample ``i``'s components as plain floats."""
        return {name: float(t[i]) for name, t in self.as_dict().items()}


@dataclass
class TokenAlignment:
    """For one candidate: its tokens (SOS..EOS) and, per token, the best-matching frame (Figure 7 of
    the paper), that cosine similarity, and the token's idf weight."""

    tokens: list[str]
    token_ids: list[int]
    best_frame: list[int]
    similarity: list[float]
    weight: list[float]


class Alignments(Sequence[TokenAlignment]):
    """The per-candidate :class:`TokenAlignment` list, each built on first access: a reward that only
    reads scores never pays for decoding tokens to text. (With ``errors="nan"``, unscored items read as
    None.) ``truncated[i]``: whether candidate i was cut to the text context (``long_captions="truncate"``)."""

    def __init__(self, n: int, build: Callable[[int], TokenAlignment | None], truncated: Sequence[bool] | None = None):
        self._items: list[TokenAlignment | None] = [None] * n
        self._build = build
        self.truncated = list(truncated) if truncated is not None else [False] * n

    @overload
    def __getitem__(self, i: int) -> TokenAlignment: ...
    @overload
    def __getitem__(self, i: slice) -> list[TokenAlignment]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError(f"alignment index {i} out of range for {len(self)} candidates")
        i %= len(self)
        if self._items[i] is None:
            self._items[i] = self._build(i)
        return self._items[i]

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"Alignments({len(self)} candidates)"
