"""capreward report: one self-contained HTML page of a scores file written by `capreward score`.

The page opens with a summary table (per metric: n, mean, median, std, min, max, errors) and a histogram
per metric; each sample shows its frames, caption (tokens coloured by their best frame with
--alignment), references, errors and scores (sub-scores folded under each headline score). Samples can
be sorted by any metric and filtered to errors or flagged samples in the page itself.

Visuals are read from the paths the rows hold: capreward score writes the path it scored (a manifest's
relative path resolved against the manifest's folder), so the report finds them from any working
directory. A relative path in a row (a results file from an older version, or written by hand) is
resolved against the working directory; visuals that cannot be found are counted in a warning. A row
the page cannot show (not written by ``capreward score``) or a file without any score (a manifest) is
refused in one line, exit status 2."""

from __future__ import annotations

import argparse
import os
import sys


def missing_visuals(rows: list[dict]) -> list[str]:
    """The image/video paths of ``rows`` that are not files."""
    paths = [r.get("image") or r.get("video") for r in rows]
    return [p for p in paths if isinstance(p, str) and p and not os.path.isfile(p)]


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
        print(f"capreward report: warning: {len(missing)} of {len(rows)} visuals not found (first: "
              f"{printable(missing[0])}); relative paths are resolved against the working directory", file=sys.stderr)
    path = render_report(rows, args.out, frames=None if args.frames == 0 else args.frames,
                         title=args.title, progress=not args.no_progress)
    print(path)
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("report", help="HTML report of a scores JSONL written by `capreward score`",
                              description=__doc__)
    p.add_argument("scores", help="results JSONL (use `capreward score --alignment` for token→frame colouring)")
    p.add_argument("--out", required=True, help="HTML file to write")
    p.add_argument("--frames", type=int, default=10, help="frames shown per video (match the scoring run)")
    p.add_argument("--title", default="capreward report", help="the page's title")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)
