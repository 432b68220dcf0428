"""``capreward demo``: score the sample clips with a tiny, locally built CLIP and print a table.

No weights are downloaded: the CLIP is built from a seed (``capreward.testing``). The numbers are
therefore not meaningful as quality judgements; the demo shows the pipeline end to end (decoding,
frame sampling, caching, EMScore components, token→frame alignment).
"""

from __future__ import annotations

import argparse
from pathlib import Path

DEMO_CAPTIONS = [
    "a man is cooking food in a kitchen",
    "a person plays a guitar on stage",
    "a dog runs across a grassy field",
]


def default_video_dir() -> Path:
    """``../shared/data/videos`` beside the repository (where CI and developers keep the clips)."""
    return Path(__file__).resolve().parents[3].parent / "shared" / "data" / "videos"


def run(args: argparse.Namespace) -> int:
    from ..scorers.emscore import EMScore
    from ..testing import tiny_clip_factory

    video_dir = Path(args.videos)
    videos = sorted(p for p in video_dir.glob("*") if p.suffix.lower() in {".mp4", ".avi", ".mkv", ".webm", ".mov"})
    if not videos:
        print(f"no videos found in {video_dir}")
        return 1
    scorer = EMScore(model=tiny_clip_factory(seed=0), idf=DEMO_CAPTIONS, frames=args.frames)
    pairs = [(v, c) for v in videos for c in DEMO_CAPTIONS]
    result = scorer.score([c for _, c in pairs], videos=[str(v) for v, _ in pairs])
    print(f"EMScore on {len(videos)} clips x {len(DEMO_CAPTIONS)} captions (tiny random CLIP, {args.frames} frames)")
    header = f"{'video':<40} {'caption':<38} {'coarse':>7} {'fine_F':>7} {'full_F':>7}"
    print(header)
    print("-" * len(header))
    v = result.video
    for i, (video, caption) in enumerate(pairs):
        print(f"{video.name[:40]:<40} {caption[:38]:<38} {v.coarse[i]:7.4f} {v.fine_f[i]:7.4f} {v.full_f[i]:7.4f}")
    cache = scorer.backbone.cache
    print(f"{len(pairs)} pairs, {cache.misses} video encodings ({len(cache)} cached)")
    align = result.alignment[0]
    print("token -> best frame for the first pair: " + ", ".join(f"{t}:{f}" for t, f in zip(align.tokens, align.best_frame)))
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("demo", help="score the sample clips with a tiny local CLIP")
    p.add_argument("--videos", default=str(default_video_dir()), help="folder of video clips")
    p.add_argument("--frames", type=int, default=10, help="frames sampled per video")
    p.set_defaults(func=run)
