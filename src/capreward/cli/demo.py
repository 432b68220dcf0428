"""``capreward demo``: the library end to end on tiny, locally built models.

1. EMScore of the sample clips with a seeded tiny CLIP, as a table (decoding, frame sampling,
   caching, EMScore components, token→frame alignment); ``--no-table`` skips it.
2. The GRPO recipe (``recipes/grpo_captioner.py --tiny``): a tiny LLaVA captioner trained with LoRA for
   ``--steps`` GRPO steps on EMScore + CLIP-S + the hallucination penalty, then its reward trajectory.

No weights are downloaded: every model is built from a seed (``capreward.testing``), so the numbers
show the machinery, not caption quality (see experiments/grpo_colour_toy.py for a task where the
reward means something and moves).
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


def recipe_path() -> Path:
    """``recipes/grpo_captioner.py`` of the repository this package is run from."""
    return Path(__file__).resolve().parents[3] / "recipes" / "grpo_captioner.py"


def load_recipe(path: Path | None = None):
    """Import the GRPO recipe script as a module. Raises FileNotFoundError naming the path when the
    package is not run from a repository checkout."""
    import importlib.util
    import sys

    path = path or recipe_path()
    if not path.is_file():
        raise FileNotFoundError(f"GRPO recipe not found at {path} (run the demo from a capreward checkout)")
    spec = importlib.util.spec_from_file_location("grpo_captioner", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("grpo_captioner", module)
    spec.loader.exec_module(module)
    return module


def run_grpo(args: argparse.Namespace) -> int:
    """Run the tiny GRPO recipe and print its reward trajectory (the recipe prints it)."""
    import tempfile

    recipe = load_recipe()
    out = args.out or tempfile.mkdtemp(prefix="capreward-demo-")
    print(f"\nGRPO: tiny LLaVA captioner + LoRA, {args.steps} steps, rewards {args.rewards} (output in {out})")
    recipe.main(
        ["--tiny", "--quiet", "--steps", str(args.steps), "--rewards", args.rewards, "--out", out,
         "--batch-size", "4", "--num-generations", "2", "--max-completion-length", "8", "--frames", "4"]
    )
    return 0


def run(args: argparse.Namespace) -> int:
    if not args.no_table:
        code = run_table(args)
        if code:
            return code
    return run_grpo(args) if args.steps > 0 else 0


def run_table(args: argparse.Namespace) -> int:
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
    p = subparsers.add_parser("demo", help="EMScore table and a few GRPO steps, on tiny local models")
    p.add_argument("--videos", default=str(default_video_dir()), help="folder of video clips")
    p.add_argument("--frames", type=int, default=10, help="frames sampled per video")
    p.add_argument("--no-table", action="store_true", help="skip the EMScore table")
    p.add_argument("--steps", type=int, default=3, help="GRPO steps (0: no GRPO part)")
    p.add_argument("--rewards", default="emscore:1.0,clipscore:0.5,hallucination:0.5", help="GRPO rewards name:weight")
    p.add_argument("--out", default=None, help="GRPO output folder (default: a temporary one)")
    p.set_defaults(func=run)
