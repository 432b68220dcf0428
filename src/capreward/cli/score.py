"""``capreward score``: score a JSONL manifest into a resumable JSONL (and optional CSV) file."""

from __future__ import annotations

import argparse
import json
import sys

from ..backbones.clip_loading import DEFAULT_CLIP


def run(args: argparse.Namespace) -> int:
    from ..jobs.runners import ScoreOptions
    from ..jobs.score_job import run_job

    precision = {"fp32": None}.get(args.precision, args.precision)
    options = ScoreOptions(
        metrics=[m.strip().replace("-", "_") for m in args.metrics.split(",") if m.strip()],
        clip_model=args.clip_model, pac_model=args.pac_model, fleur_model=args.fleur_model,
        device=args.device, precision=precision, batch_size=args.batch_size,
        frames=None if args.frames == 0 else args.frames, alignment=args.alignment,
    )
    summary = run_job(args.manifest, args.out, options, idf=args.idf, engine=args.engine,
                      num_actors=args.num_actors, csv=args.csv, progress=not args.no_progress)
    print(json.dumps(summary), file=sys.stderr)
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("score", help="score a JSONL manifest (resumable)")
    p.add_argument("manifest", help="JSONL rows: caption, image|video, optional references, id")
    p.add_argument("--out", required=True, help="results JSONL (appended to; rerun to resume)")
    p.add_argument("--csv", help="also write the results as CSV")
    p.add_argument("--metrics", default="emscore", help="comma-separated: emscore, clip-s, pac-s, fleur")
    p.add_argument("--clip-model", default=DEFAULT_CLIP, help="CLIP for emscore/clip-s: name/tag, .pt path, ...")
    p.add_argument("--pac-model", help="PAC-S checkpoint path (for pac-s)")
    p.add_argument("--fleur-model", default="llava-hf/llava-1.5-13b-hf", help="LLaVA name or local dir (for fleur)")
    p.add_argument("--idf", default="auto", help="auto | refs | none | FILE (one caption per line)")
    p.add_argument("--frames", type=int, default=10, help="frames per video (0: all)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "bf16"])
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--engine", default="local", choices=["local", "ray"])
    p.add_argument("--num-actors", type=int, default=2, help="Ray actors (one model copy each)")
    p.add_argument("--alignment", action="store_true", help="store EMScore's token -> frame alignment (for reports)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run)
