"""What the torchmetrics wrappers cost on top of the scorers, and what a synced summary costs.

Scores the same captions and clips three ways on one CLIP backbone and prints captions per second:

- ``scorer``: ``EMScore.score`` / ``CLIPScore.score`` called directly on each batch;
- ``metric``: ``EMScoreMetric.update`` / ``CLIPScoreMetric.update`` on each batch, then ``compute()``
  (per-sample rows, empty-caption handling, id bookkeeping included);
- ``summary``: ``metric.summary()`` alone over the accumulated states (deduplication by id, ordering).

Both paths share the backbone and so its visual-embedding cache (warmed first). Defaults use the tiny
offline CLIP (timings then show the wrapper overhead, not CLIP's cost)::

    python benchmarks/bench_validation_metrics.py --samples 256 --batch-size 32
    python benchmarks/bench_validation_metrics.py --clip ViT-B-32/openai --device cuda   # a real CLIP
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from capreward import CLIPScore, EMScore
from capreward.backbones import CLIPBackbone
from capreward.torchmetrics import CLIPScoreMetric, EMScoreMetric

WORDS = "a the red green blue dog cat man woman runs sits on in road kitchen field ball car".split()


def data(n: int, frames: int, size: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    videos = [rng.integers(0, 256, size=(frames, size, size, 3), dtype=np.uint8) for _ in range(n)]
    captions = [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 12)))) for _ in range(n)]
    refs = [[" ".join(rng.choice(WORDS, size=6))] for _ in range(n)]
    return captions, videos, refs


def timed(fn, repeat: int) -> float:
    """Best wall time of ``repeat`` runs, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clip", default="tiny", help="CLIP specification, or 'tiny' (offline test model)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--frames", type=int, default=4)
    p.add_argument("--size", type=int, default=32, help="frame height and width")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()

    if args.clip == "tiny":
        from capreward.testing import tiny_clip_factory

        backbone = CLIPBackbone(tiny_clip_factory(0), device=args.device)
    else:
        backbone = CLIPBackbone(args.clip, device=args.device)
    captions, videos, refs = data(args.samples, args.frames, args.size)
    batches = [slice(i, i + args.batch_size) for i in range(0, args.samples, args.batch_size)]

    pairs = {
        "emscore": (EMScore(backbone=backbone, frames=args.frames),
                    EMScoreMetric(backbone=backbone, frames=args.frames)),
        "clip_s": (CLIPScore(backbone=backbone, frames=args.frames),
                   CLIPScoreMetric(backbone=backbone, visual="video", frames=args.frames)),
    }
    print(f"device={args.device} clip={args.clip} samples={args.samples} batch={args.batch_size} "
          f"frames={args.frames} size={args.size} threads={torch.get_num_threads()}")
    for name, (scorer, metric) in pairs.items():
        def direct():
            for b in batches:
                scorer.score(captions[b], videos=videos[b], references=refs[b])

        def wrapped():
            metric.reset()
            for b in batches:
                metric.update(captions[b], videos[b], refs[b], ids=range(b.start, min(b.stop, args.samples)))
            metric.compute()

        direct()  # warm-up
        # alternate the two so that a busy machine slows both alike; keep the best run of each
        t_direct = t_metric = float("inf")
        for _ in range(args.repeat):
            t_direct, t_metric = min(t_direct, timed(direct, 1)), min(t_metric, timed(wrapped, 1))
        t_summary = timed(metric.summary, args.repeat)
        print(f"{name:8s} scorer {args.samples / t_direct:9.1f} captions/s | metric {args.samples / t_metric:9.1f} "
              f"captions/s ({100 * (t_metric / t_direct - 1):+.1f}%) | summary {1000 * t_summary:.2f} ms")


if __name__ == "__main__":
    main()
