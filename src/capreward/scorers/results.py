"""Typed per-sample results shared by the matching scorers."""

from __future__ import annotations

from dataclasses import dataclass, fields

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
    def from_parts(cls, coarse: torch.Tensor, p: torch.Tensor, r: torch.Tensor, f: torch.Tensor) -> "MatchScores":
        return cls(coarse, p, r, f, (p + coarse) / 2, (r + coarse) / 2, (f + coarse) / 2)

    @classmethod
    def average(cls, a: "MatchScores", b: "MatchScores") -> "MatchScores":
        """EMScore(X, V, X*): fine and coarse parts averaged separately, then full recomputed."""
        return cls.from_parts(
            (a.coarse + b.coarse) / 2, (a.fine_p + b.fine_p) / 2, (a.fine_r + b.fine_r) / 2, (a.fine_f + b.fine_f) / 2
        )

    def as_dict(self) -> dict[str, torch.Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def row(self, i: int) -> dict[str, float]:
        """Sample ``i``'s components as plain floats."""
        return {name: float(t[i]) for name, t in self.as_dict().items()}
