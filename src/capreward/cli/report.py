"""capreward report: one self-contained HTML page of a scores file written by `capreward score`.

The page opens with a summary table (per metric: n, mean, median, std, min, max, errors) and a histogram
per metric, then what the rows were scored with (the settings record capreward score wrote beside the
results, <scores>.settings.json: metrics, models, frames, and which harmonic mean formed EMScore's F and
RefCLIP-S); each sample shows its frames (every image of a row with several), caption (tokens coloured by
their best frame with --alignment), references, errors and scores (sub-scores and per-image values folded
under each headline score). Samples can be sorted by any metric and filtered to errors or flagged samples
in the page itself.

Visuals are read from the paths the rows hold: capreward score writes the path it scored (a manifest's
relative path resolved against the manifest's folder), so the report finds them from any working
directory. A relative path in a row (a results file from an older version, or written by hand) is
resolved against the working directory; visuals that cannot be found are counted in a warning. A row
the page cannot show (not written by ``capreward score``) or a file without any score (a manifest) is
refused in one line, exit status 2; so is a file capreward score writes beside the results (the settings
or idf record, the quarantine or lock file), naming the results file to pass instead. --out is never
opened through a symbolic link, and a FIFO or a device is refused, like every file capreward writes."""

from __future__ import annotations

import argparse
import os
import sys


def visual_paths(rows: list[dict]) -> list[str]:
    """The image/video paths of ``rows`` (every image of a row with several)."""
    paths: list[object] = []  # filtered to the non-empty strings below
    for r in rows:
        visual = r.get("image") or r.get("video")
        paths.extend(visual if isinstance(visual, list) else [visual])
    return [p for p in paths if isinstance(p, str) and p]


def missing_visuals(rows: list[dict]) -> list[str]:
    """The image/video paths of ``rows`` that are not files (every image of a row with several)."""
    return [p for p in visual_paths(rows) if not os.path.isfile(p)]


def recorded_settings(scores: str) -> dict | None:
    """The settings ``capreward score`` recorded beside results file ``scores`` (``<scores>.settings.json``),
    or None when there is no record (a warning line when it cannot be read)."""
    from ..jobs.errors import JobError
    from ..jobs.settings_file import read_record, record_path
    from ..text import printable

    path = record_path(scores)
    if not os.path.lexists(path):
        return None
    try:
        return read_record(path)["settings"]
    except (JobError, OSError) as exc:
        print(f"capreward report: warning: {printable(str(exc))}; the page says the settings are not known",
              file=sys.stderr)
        return None


def run(args: argparse.Namespace) -> int:
    from ..report import render_report
    from ..report.rows import ReportInputError, checked_rows
    from ..text import printable

    try:
        rows = checked_rows(args.scores)
    except (ReportInputError, OSError) as exc:
        print(f"capreward report: error: {printable(str(exc))}", file=sys.stderr)
        return 2
    missing = missing_visuals(rows)
    if missing:
        print(f"capreward report: warning: {len(missing)} of {len(visual_paths(rows))} visuals not found (first: "
              f"{printable(missing[0])}); relative paths are resolved against the working directory", file=sys.stderr)
    path = render_report(rows, args.out, frames=None if args.frames == 0 else args.frames,
                         title=args.title, progress=not args.no_progress, settings=recorded_settings(args.scores))
    print(path)
    return 0


def add_parser(subparsers) -> None:
    from .common import whole_number

    p = subparsers.add_parser("report", help="HTML report of a scores JSONL written by `capreward score`",
                              description=__doc__)
    p.add_argument("scores", help="results JSONL (use `capreward score --alignment` for token→frame colouring)")
    p.add_argument("--out", required=True, help="HTML file to write")
    p.add_argument("--frames", type=whole_number(0), default=10, help="frames shown per video, 0: all (match the scoring run)")
    p.add_argument("--title", default="capreward report", help="the page's title")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)
