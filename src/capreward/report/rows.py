"""The rows ``capreward report`` can show: every row of a results file checked before the page is built.

A results file written by ``capreward score`` always passes, whatever manifest it scored (an image or a
video per row, a row with several images, references or none, carried keys). A file edited by hand or
produced by another tool may not: a row that is not an object, a caption that is not text, ``errors``
that is not an object of reasons, references that are not a list, a visual that is not a path (or, for
``image``, a list of paths), an ``alignment`` that is not ``capreward score --alignment``'s, or a file
with no score at all (a manifest given instead of its results) is refused with one
:class:`ReportInputError` line naming the file and line. One of the files ``capreward score`` writes
beside its results (``<out>.settings.json``, ``<out>.idf.json``, ``<out>.quarantine``, ``<out>.lock``)
given in their place is named as such, with the results file to pass instead (:func:`companion_problem`).

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
        value = row.get(key)
        if value is None or isinstance(value, str):
            continue
        if key == "image" and isinstance(value, list):  # a row with several images
            if not value or not all(isinstance(p, str) and p for p in value):
                return "'image' is a list that is not of paths"
            continue
        return f"'{key}' is a {type(value).__name__}, not a path"
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


#: The files ``capreward score`` writes beside its results ``<out>``: suffix -> what the file is.
COMPANIONS = {".settings.json": "the settings record", ".idf.json": "the idf record",
              ".quarantine": "the lines set aside (--quarantine-bad-lines)", ".lock": "the lock file"}
#: The ``format`` of the records among them (a record renamed is still named by its content).
RECORD_FORMATS = {"capreward-settings/1": ".settings.json", "capreward-idf/1": ".idf.json"}


def companion_problem(path: str | Path) -> str | None:
    """Why ``path`` is not a results file but one ``capreward score`` writes beside one (named by its
    name, or for a settings or idf record by its ``format``), with the results file to pass; None
    otherwise."""
    path = Path(path)
    for suffix, what in COMPANIONS.items():
        if path.name.endswith(suffix) and len(path.name) > len(suffix):
            results = path.with_name(path.name[: -len(suffix)])
            return (f"{path} is {what} of {results}, not a results file; pass {results}: "
                    f"capreward report {results} --out report.html")
    try:
        from ..input_files import open_regular_stream

        with open_regular_stream(path, "the results") as f:
            head = f.read(4096).decode("utf-8", "replace")
    except OSError:
        return None  # reading the rows says what is wrong
    for fmt, suffix in RECORD_FORMATS.items():
        if f'"format": "{fmt}"' in head:
            return (f"{path} is {COMPANIONS[suffix]} of a results file (format {fmt}), not a results file; pass the "
                    f"results file it was written beside (<out> of <out>{suffix})")
    return None


def checked_rows(path: Path) -> list[dict]:
    """Every row of results file ``path``; :class:`ReportInputError` naming the first row that cannot be
    shown (and how many others), saying the file holds no scores, or naming a file ``capreward score``
    writes beside its results (:func:`companion_problem`)."""
    from .html import headline_metrics

    if (companion := companion_problem(path)) is not None:
        raise ReportInputError(companion)
    rows, bad = [], []
    for _lineno, where, row in json_lines(Path(path), ReportInputError):
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
