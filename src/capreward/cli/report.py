"""``capreward report``: an HTML page of a scored manifest (frames, captions, scores, alignment)."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from ..jobs.results_file import read_results
    from ..report import render_report

    rows = read_results(args.scores)
    path = render_report(rows, args.out, frames=None if args.frames == 0 else args.frames)
    print(path)
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("report", help="HTML report of a scores JSONL written by `capreward score`")
    p.add_argument("scores", help="results JSONL (use `capreward score --alignment` for token→frame colouring)")
    p.add_argument("--out", required=True, help="HTML file to write")
    p.add_argument("--frames", type=int, default=10, help="frames shown per video (match the scoring run)")
    p.set_defaults(func=run)
