"""Per-sample caption scores after synchronisation: deduplication by sample id, ordering and means.

Pure tensor bookkeeping, no model code. A metric accumulates one row of ``K`` values per caption
(``columns`` name them; the first is always ``"score"``) and, optionally, one integer sample id per
caption. Under a ``DistributedSampler`` the last batch is padded with repeated samples so that every
process sees the same number of batches; giving sample ids lets :func:`summarize` drop those repeats
and order the samples by id, which makes the result identical whatever the number of processes.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch

#: Sample ids are stored in float32 metric states (so that every state has the metric's dtype, which
#: torchmetrics also uses for the empty placeholder of a process that saw no data); float32 holds
#: every integer below 2**24 exactly.
MAX_SAMPLE_ID = 2**24
NO_ID = -1.0


@dataclass
class CaptionScores:
    """One metric's per-sample scores over a whole evaluation (all processes, repeats removed).

    - ``name``: the metric's name (``"emscore"``, ``"clip_s"``, ``"fleur"`` …).
    - ``ids``: LongTensor [N] of sample ids in ascending order, or None when no ids were given (then
      the order is the order of updates, process by process).
    - ``values``: column → float32 Tensor [N]; ``"score"`` first. NaN where a value does not apply
      (e.g. a FLEUR answer that did not parse). Columns that are NaN for every sample are left out.
    """

    name: str
    ids: torch.Tensor | None
    values: dict[str, torch.Tensor]

    def __len__(self) -> int:
        return int(self.values["score"].shape[0])

    @property
    def score(self) -> torch.Tensor:
        """The main per-sample score, Tensor [N]."""
        return self.values["score"]

    @property
    def mean(self) -> float:
        """Mean of the main score over samples that have one (NaN entries skipped); NaN if none."""
        return nanmean(self.values["score"])

    def means(self) -> dict[str, float]:
        """Mean of every column (NaN entries skipped), ``"score"`` first."""
        return {k: nanmean(v) for k, v in self.values.items()}

    def rows(self) -> list[dict[str, float | int | None]]:
        """One dict per sample: ``id`` (None without ids) and every column as a float."""
        ids = [None] * len(self) if self.ids is None else [int(i) for i in self.ids]
        cols = {k: v.tolist() for k, v in self.values.items()}
        return [{"id": ids[n], **{k: cols[k][n] for k in cols}} for n in range(len(self))]


def nanmean(values: torch.Tensor) -> float:
    """Mean over the non-NaN entries, computed in float64; NaN when there are none."""
    v = values.double()
    v = v[~torch.isnan(v)]
    return float(v.mean()) if v.numel() else math.nan


def check_ids(ids, n: int) -> torch.Tensor:
    """Validate ``n`` sample ids of one update (distinct ints in [0, 2**24)) and return them as a float32
    tensor.

    Raises TypeError/ValueError naming the offending position. An id given twice in one update is an
    error: :func:`summarize` keeps one row per id, so the second sample would be dropped silently. The
    repeats a ``DistributedSampler`` pads with are never in one update: a padded sample repeats one that
    another process holds.
    """
    if isinstance(ids, torch.Tensor):
        if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            raise TypeError(f"sample ids must be integers, got a tensor of dtype {ids.dtype}")
        ids = ids.reshape(-1).tolist()
    ids = list(ids)
    if len(ids) != n:
        raise ValueError(f"got {len(ids)} sample ids for {n} candidates; give one per candidate")
    for i, v in enumerate(ids):
        if isinstance(v, bool) or not isinstance(v, int) and not hasattr(v, "__index__"):
            raise TypeError(f"ids[{i}] must be an int (a dataset index), got {type(v).__name__}")
        v = int(v)
        if not 0 <= v < MAX_SAMPLE_ID:
            raise ValueError(f"ids[{i}] = {v} is outside [0, 2**24)")
    first: dict[int, int] = {}
    for i, v in enumerate(int(v) for v in ids):
        if v in first:
            raise ValueError(
                f"ids[{i}] = {v} repeats ids[{first[v]}] in one update: each sample needs its own id (the dataset "
                "index), else one of the two would be dropped (a DistributedSampler's padding repeats a sample "
                "of another process, never one of the same batch)"
            )
        first[v] = i
    return torch.tensor([int(v) for v in ids], dtype=torch.float32)


def _warn_reused_ids(name: str, rows: torch.Tensor, sorted_ids: torch.Tensor, first: torch.Tensor) -> None:
    """Warn when an id repeats with other scores than its first row: the same id given to two different
    samples across updates (the repeats a DistributedSampler pads with are the same sample, scored the
    same), whose second sample :func:`summarize` would drop silently."""
    if bool(first.all()):
        return
    head = torch.cumsum(first.long(), 0) - 1  # each row's group index
    firsts = rows[first][head]
    same = torch.isclose(rows, firsts, rtol=1e-4, atol=1e-5, equal_nan=True).all(dim=1)
    clash = sorted(set(sorted_ids[~same].tolist()))
    if clash:
        shown = ", ".join(str(i) for i in clash[:5]) + (f" and {len(clash) - 5} more" if len(clash) > 5 else "")
        warnings.warn(
            f"{name}: sample id(s) {shown} were given to samples with other scores in different updates; only the "
            "first of each is kept. Give each sample its own id (its dataset index), or reset() between evaluations",
            UserWarning, stacklevel=4,
        )


def summarize(name: str, columns: tuple[str, ...], ids: torch.Tensor, values: torch.Tensor) -> CaptionScores:
    """Turn flat metric states into :class:`CaptionScores`.

    ``ids``: float Tensor [N] (``NO_ID`` everywhere when ids were not given); ``values``: float Tensor
    [N * K] holding N rows of the K ``columns``. With ids, rows are ordered by id and each id is kept once
    (its first occurrence: the repeats a DistributedSampler pads with are the same sample scored again).
    """
    k = len(columns)
    ids = ids.reshape(-1).cpu()
    values = values.reshape(-1).cpu()
    if values.numel() != ids.numel() * k:
        raise RuntimeError(f"{name}: metric state holds {values.numel()} values for {ids.numel()} ids x {k} columns")
    table = values.reshape(-1, k).float()
    has_id = ids >= 0
    if bool(has_id.any()) and not bool(has_id.all()):
        raise ValueError(
            f"{name}: some updates gave sample ids and others did not; give ids always or never"
        )
    sample_ids = None
    if ids.numel() and bool(has_id.all()):
        as_long = ids.long()
        order = torch.sort(as_long, stable=True).indices
        sorted_ids = as_long[order]
        first = torch.ones_like(sorted_ids, dtype=torch.bool)
        first[1:] = sorted_ids[1:] != sorted_ids[:-1]
        _warn_reused_ids(name, table[order], sorted_ids, first)
        keep = order[first]
        table = table[keep]
        sample_ids = sorted_ids[first]
    out = {}
    for j, col in enumerate(columns):
        column = table[:, j]
        if j == 0 or not bool(torch.isnan(column).all()):
            out[col] = column.contiguous()
    return CaptionScores(name=name, ids=sample_ids, values=out)
