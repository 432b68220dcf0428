"""The rows ``capreward report`` can show: every row of a results file checked before the page is built.

A results file written by ``capreward score`` always passes. A file edited by hand or produced by
another tool may not: a row that is not an object, a caption that is not text, ``errors`` that is not an
object of reasons, references that are not a list, a visual that is not a path, an ``alignment`` that is
not ``capreward score --alignment``'s, or a file with no score at all (a manifest given instead of its
results) is refused with one :class:`ReportInputError` line naming the file and line.

Example::

    rows = checked_rows(Path("scores.jsonl"))   # list[dict], or ReportInputError("scores.jsonl:3: ...")
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import CaprewardError
from ..jsonl import json_lines
from .claims_view import FIELD as CLAIMS_FIELD, verdicts_problem

ALIGNMENT_LISTS = ("tokens", "best_frame", "similarity", "weight")


class ReportInputError(CaprewardError, ValueError):
    """A results file the report cannot show; the message names the file and line."""


def row_problem(row: Any) -> str | None:
    """Why ``row`` (one decoded JSONL line) cannot be shown, or None."""
    if not isinstance(row, dict):
        return f"a JSON {type(row).__name__}, not a result row (an object)"
    if "caption" in row and not isinstance(row["caption"], str):
        return f"'caption' is a {type(row['caption']).__name__}, not text"
    errors = row.get("errors")
    if errors is not None and not isinstance(errors, dict):
        return f"'errors' is a {type(errors).__name__}, not an object of metric -> reason"
    references = row.get("references")
    if references is not None and not isinstance(references, list):
        return f"'references' is a {type(references).__name__}, not a list"
    for key in ("image", "video"):
        if row.get(key) is not None and not isinstance(row[key], str):
            return f"'{key}' is a {type(row[key]).__name__}, not a path"
    for key in (CLAIMS_FIELD, "claims.claims"):
        if row.get(key) is not None and verdicts_problem(row[key]) is not None:
            return verdicts_problem(row[key])
    alignment = row.get("alignment")
    if alignment is not None:
        if not isinstance(alignment, dict) or not all(isinstance(alignment.get(k), list) for k in ALIGNMENT_LISTS):
            return "'alignment' is not the object `capreward score --alignment` writes"
        if not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in alignment["similarity"]):
            return "'alignment.similarity' holds a value that is not a number"
        if not all(isinstance(b, int) and not isinstance(b, bool) for b in alignment["best_frame"]):
            return "'alignment.best_frame' holds a value that is not a frame index"
    return None


def checked_rows(path: Path) -> list[dict]:
    """Every row of results file ``path``; :class:`ReportInputError` naming the first row that cannot be
    shown (and how many others), or saying the file holds no scores."""
    from .html import headline_metrics

    rows, bad = [], []
    for lineno, where, row in json_lines(Path(path), ReportInputError):
        problem = row_problem(row)
        if problem is not None:
            bad.append(f"{where}: {problem}")
        else:
            rows.append(row)
    if bad:
        more = f" (and {len(bad) - 1} more rows that cannot be shown)" if len(bad) > 1 else ""
        raise ReportInputError(f"{bad[0]}{more}; the report shows files written by `capreward score`")
    if not rows:
        raise ReportInputError(f"{path} has no rows")
    if not headline_metrics(rows):
        raise ReportInputError(
            f"{path} has no scores (no row has a metric's value or error): is it a manifest? "
            "Score it first: capreward score MANIFEST --out scores.jsonl"
        )
    return rows
