"""Per-sample score tables: joining captions with metric scores, best/worst examples, files, text.

A table is a list of flat dicts, one per sample: ``id``, ``caption``, ``references`` (when known),
``<metric>`` (the main score) and ``<metric>/<column>`` (its sub-scores, named as everywhere in capreward:
``emscore/video/full_f``).
"""

from __future__ import annotations

import csv
import json
import logging
import math
import os
from pathlib import Path
from typing import Any
from collections.abc import Mapping, Sequence

from ..names import SEP, sub_score
from ..torchmetrics.summary import CaptionScores

logger = logging.getLogger(__name__)

TABLE_FORMATS = ("jsonl", "csv")


def merge_records(gathered: Sequence[Sequence[dict]], by_id: bool) -> list[dict]:
    """Flatten per-process caption records (rank order); with ``by_id``, keep each id once, sorted by id."""
    flat = [r for part in gathered for r in part]
    if not by_id:
        return flat
    seen: dict[int, dict] = {}
    for r in flat:
        seen.setdefault(int(r["id"]), r)
    return [seen[i] for i in sorted(seen)]


def score_table(records: Sequence[dict], scores: Mapping[str, CaptionScores], sub_scores: bool = True) -> list[dict]:
    """Join caption records with each metric's per-sample scores (by id, else by position).

    Raises ValueError when a metric's samples do not line up with the records.
    """
    rows = [dict(r) for r in records]
    for name, s in scores.items():
        if s.ids is not None:
            position = {int(i): n for n, i in enumerate(s.ids.tolist())}
            index = []
            for r in rows:
                if r.get("id") is None or int(r["id"]) not in position:
                    raise ValueError(f"{name}: no score for sample id {r.get('id')!r}")
                index.append(position[int(r["id"])])
        else:
            if len(s) != len(rows):
                raise ValueError(f"{name}: {len(s)} scores for {len(rows)} captions")
            index = list(range(len(rows)))
        cols = {k: v.tolist() for k, v in s.values.items() if sub_scores or k == "score"}
        for r, n in zip(rows, index):
            for k, v in cols.items():
                r[name if k == "score" else sub_score(name, k)] = v[n]
    return rows


def logged_means(scores: Mapping[str, CaptionScores], prefix: str, sub_scores: bool) -> dict[str, float]:
    """What a callback logs of ``scores``: each metric's mean headline as ``<prefix><metric>`` and, with
    ``sub_scores``, each sub-score's mean under :func:`~capreward.names.sub_score` of that key."""
    logged: dict[str, float] = {}
    for name, s in scores.items():
        means = s.means()
        logged[f"{prefix}{name}"] = means.pop("score")
        if sub_scores:
            logged.update({sub_score(f"{prefix}{name}", k): v for k, v in means.items()})
    return logged


def best_and_worst(rows: Sequence[dict], key: str, k: int) -> tuple[list[dict], list[dict]]:
    """The ``k`` rows with the highest and the lowest ``key`` (NaN values skipped), best first / worst first."""
    valid = [r for r in rows if isinstance(r.get(key), float) and not math.isnan(r[key])]
    ranked = sorted(valid, key=lambda r: r[key], reverse=True)
    return ranked[:k], ranked[::-1][:k]


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def write_table(rows: Sequence[dict], path: str | os.PathLike, fmt: str = "jsonl") -> Path:
    """Write rows as JSON lines (NaN → null) or CSV (references joined with `` | ``); return the path."""
    if fmt not in TABLE_FORMATS:
        raise ValueError(f"table format must be one of {TABLE_FORMATS}, got {fmt!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        with path.open("w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps({k: _clean(v) for k, v in r.items()}, ensure_ascii=False) + "\n")
        return path
    columns: list[str] = []
    for r in rows:
        columns.extend(c for c in r if c not in columns)
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for r in rows:
            writer.writerow(
                {k: " | ".join(v) if isinstance(v, list) else ("" if _clean(v) is None else v) for k, v in r.items()}
            )
    return path


def example_columns(rows: Sequence[dict], key: str) -> list[str]:
    """Columns shown in a text table: id, caption, references (if any), then the metrics' main scores."""
    cols = ["id", "caption"]
    if rows and rows[0].get("references") is not None:
        cols.append("references")
    # sub-score columns are "<metric>/<column>"; the main scores are the bare metric names
    metrics = [c for c in rows[0] if c not in ("id", "caption", "references") and SEP not in c] if rows else []
    return cols + sorted(metrics, key=lambda c: c != key)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else f"{v:.4f}"
    if isinstance(v, list):
        v = " / ".join(map(str, v))
    return str(v).replace("|", "\\|").replace("\n", " ")


def markdown_table(rows: Sequence[dict], columns: Sequence[str]) -> str:
    """A Markdown table of ``columns`` (floats with 4 decimals)."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def examples_markdown(best: Sequence[dict], worst: Sequence[dict], key: str) -> str:
    """Best and worst captions as two Markdown tables."""
    cols = example_columns(list(best) or list(worst), key)
    return f"**best by {key}**\n\n{markdown_table(best, cols)}\n\n**worst by {key}**\n\n{markdown_table(worst, cols)}"
