"""EMScore throughput on GRPO-shaped work: the batched + cached path against a per-sample loop.

``--videos`` videos (8) with ``--captions`` sampled captions each (8), ``--frames`` frames per video
(10), scored by a CLIP with the ViT-B-32 architecture and random weights (nothing is downloaded), fp32
on the CPU.

(a) batched: the library's default ``EMScore`` called as a GRPO step calls it, all captions of the step
    in one ``score()`` call; timed cold (empty visual cache) and warm (the same videos again).
(b) per-sample: ``cache_size=0, batch_size=1, trim_text=False`` (the full 77-token context, as the
    reference implementations run it), one ``score()`` call per caption.

Printed: captions/s of each, the speed-up of (a) over (b), the FLOPs of the CLIP encoders (counted with
``torch.utils.flop_counter.FlopCounterMode``) and their achieved FLOP/s, both over the whole call and
over the time spent inside the encoders, as a fraction of this machine's fp32 matmul peak measured
with a ``torch.matmul`` loop on the same number of threads. The two paths' scores are checked to agree.

    python benchmarks/bench_emscore.py                    # 8 x 8, 10 frames, all threads
    python benchmarks/bench_emscore.py --threads 2 --repeats 3 --json
    python benchmarks/bench_emscore.py --videos 2 --repeats 1     # a quick look
    python benchmarks/bench_emscore.py --profile          # torch.profiler table of the cold batched call
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from contextlib import contextmanager

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from capreward import EMScore
from capreward.backbones import CLIPBackbone

WORDS = (
    "man woman child dog cat bicycle street park beach ball red blue green white black small large young old "
    "running riding sitting standing playing holding walking jumping wearing looking cooking dancing kitchen "
    "group people two three grass water snow field road building tree sky shirt hat car bus train table"
).split()
GLUE = ("a", "the", "in", "on", "with", "of", "is", "and", "while", "at", "down", "across")


def make_captions(rng: random.Random, n: int) -> list[str]:
    """GRPO-like sampled captions of 8-20 words."""
    return [
        " ".join(rng.choice(WORDS) if i % 2 else rng.choice(GLUE) for i in range(rng.randint(8, 20)))
        for _ in range(n)
    ]


def make_video(rng: np.random.Generator, frames: int, height: int, width: int) -> np.ndarray:
    """A uint8 (T, H, W, 3) clip of smooth colour fields drifting over time."""
    base = rng.integers(0, 256, size=(8, 8, 3)).astype(np.float32)
    up = np.kron(base, np.ones((height // 8 + 1, width // 8 + 1, 1), np.float32))[:height, :width]
    drift = np.linspace(0, 60, frames, dtype=np.float32)[:, None, None, None]
    return np.clip(up[None] + drift + rng.normal(0, 6, size=(frames, height, width, 3)), 0, 255).astype(np.uint8)


def matmul_peak(threads: int, seconds: float = 2.0) -> float:
    """Best fp32 FLOP/s of ``torch.matmul`` on square matrices (1024-4096) with ``threads`` threads."""
    torch.set_num_threads(threads)
    best = 0.0
    for n in (1024, 2048, 4096):
        a, b = torch.randn(n, n), torch.randn(n, n)
        out = torch.empty(n, n)
        torch.matmul(a, b, out=out)  # warm-up
        iters, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / 3:
            torch.matmul(a, b, out=out)
            iters += 1
        best = max(best, 2 * n**3 * iters / (time.perf_counter() - start))
    return best


class EncoderTimer:
    """Wraps a backbone's two encoder entry points to accumulate the time spent inside them."""

    def __init__(self, backbone: CLIPBackbone):
        self.seconds = 0.0
        for name in ("encode_pixels", "_text_tower"):
            original = getattr(backbone, name)
            setattr(backbone, name, self._timed(original))

    def _timed(self, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return wrapper


@contextmanager
def counted_flops():
    """Yields a dict filled with ``{"flops": total}`` of the torch ops run inside the block."""
    counter = FlopCounterMode(display=False)
    box: dict[str, int] = {}
    with counter:
        yield box
    box["flops"] = counter.get_total_flops()


def run_batched(em: EMScore, captions, videos):
    return em.score(captions, videos=videos).score


def run_per_sample(em: EMScore, captions, videos):
    return torch.cat([em.score([c], videos=[v]).score for c, v in zip(captions, videos)])


def measure(fn, timer: EncoderTimer, before=None) -> tuple[float, float, torch.Tensor]:
    """Run ``fn`` once; (wall seconds, seconds inside the encoders, its output)."""
    if before is not None:
        before()
    enc0 = timer.seconds
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, timer.seconds - enc0, out


def summarise(name, n_captions, walls, encs, flops, peak):
    best = min(walls)
    best_enc = encs[walls.index(best)]
    return {
        "path": name,
        "captions": n_captions,
        "seconds_best": best,
        "seconds_median": statistics.median(walls),
        "captions_per_s": n_captions / best,
        "encoder_seconds": best_enc,
        "gflops": flops / 1e9,
        "gflop_per_s_wall": flops / best / 1e9,
        "gflop_per_s_encoders": flops / best_enc / 1e9,
        "peak_fraction_wall": flops / best / peak,
        "peak_fraction_encoders": flops / best_enc / peak,
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--videos", type=int, default=8)
    parser.add_argument("--captions", type=int, default=8, help="captions per video (a GRPO group)")
    parser.add_argument("--frames", type=int, default=10, help="frames sampled per video")
    parser.add_argument("--video-length", type=int, default=32, help="frames in each source video")
    parser.add_argument("--height", type=int, default=240)
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--model", default="ViT-B-32/random")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--repeats", type=int, default=2,
                        help="rounds (peak, cold, warm, per-sample in turn, so load from other processes hits all "
                             "alike); the best of each is reported")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")
    parser.add_argument("--profile", action="store_true", help="also print a torch.profiler table")
    args = parser.parse_args(argv)

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    nrng = np.random.default_rng(args.seed)
    videos = [make_video(nrng, args.video_length, args.height, args.width) for _ in range(args.videos)]
    captions = make_captions(rng, args.videos * args.captions)
    per_caption_videos = [videos[i // args.captions] for i in range(len(captions))]
    n = len(captions)

    fast = EMScore(model=args.model, frames=args.frames)
    bb = fast.backbone
    shared = lambda: (bb.model, bb.preprocess, bb.tokenizer)  # noqa: E731 - same weights, no reload
    slow = EMScore(model=shared, frames=args.frames, cache_size=0, batch_size=1, trim_text=False)
    fast_timer, slow_timer = EncoderTimer(fast.backbone), EncoderTimer(slow.backbone)

    # FLOPs of one run of each path (not timed: counting adds dispatch overhead)
    fast.backbone.cache.clear()
    with counted_flops() as cold_flops:
        run_batched(fast, captions, per_caption_videos)
    with counted_flops() as warm_flops:
        run_batched(fast, captions, per_caption_videos)
    with counted_flops() as one_flops:  # every per-sample call runs the same shapes (77 tokens, k frames)
        run_per_sample(slow, captions[:1], per_caption_videos[:1])
    slow_flops = one_flops["flops"] * n

    peaks: list[float] = []
    times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in ("cold", "warm", "slow")}
    outputs: dict[str, torch.Tensor] = {}
    runs = {
        "cold": (lambda: run_batched(fast, captions, per_caption_videos), fast_timer, fast.backbone.cache.clear),
        "warm": (lambda: run_batched(fast, captions, per_caption_videos), fast_timer, None),
        "slow": (lambda: run_per_sample(slow, captions, per_caption_videos), slow_timer, None),
    }
    for _ in range(args.repeats):
        peaks.append(matmul_peak(args.threads, seconds=1.5))
        for key, (fn, timer, before) in runs.items():
            wall, enc, outputs[key] = measure(fn, timer, before)
            times[key][0].append(wall)
            times[key][1].append(enc)
    peak = max(peaks)
    cold_w, cold_e = times["cold"]
    warm_w, warm_e = times["warm"]
    slow_w, slow_e = times["slow"]
    cold_out, warm_out, slow_out = outputs["cold"], outputs["warm"], outputs["slow"]
    max_diff = float(max((cold_out - slow_out).abs().max(), (warm_out - slow_out).abs().max()))

    rows = [
        summarise("batched+cached (cold cache)", n, cold_w, cold_e, cold_flops["flops"], peak),
        summarise("batched+cached (warm cache)", n, warm_w, warm_e, warm_flops["flops"], peak),
        summarise("per-sample, no cache, 77 tokens", n, slow_w, slow_e, slow_flops, peak),
    ]
    result = {
        "config": {k: getattr(args, k) for k in ("videos", "captions", "frames", "video_length", "height", "width",
                                                 "model", "threads", "repeats")},
        "matmul_peak_gflop_per_s": peak / 1e9,
        "matmul_peak_gflop_per_s_per_round": [p / 1e9 for p in peaks],
        "paths": rows,
        "speedup_cold": rows[0]["captions_per_s"] / rows[2]["captions_per_s"],
        "speedup_warm": rows[1]["captions_per_s"] / rows[2]["captions_per_s"],
        "max_score_difference": max_diff,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    if args.profile:
        profile_cold(fast, captions, per_caption_videos)
    if max_diff > 1e-4:
        raise SystemExit(f"the two paths disagree: max score difference {max_diff:.2e}")
    return result


def print_table(result: dict) -> None:
    c = result["config"]
    print(f"EMScore, {c['model']}, fp32 CPU, {c['threads']} threads: {c['videos']} videos x {c['captions']} captions, "
          f"{c['frames']} frames/video (source {c['video_length']}x{c['height']}x{c['width']}), best of {c['repeats']}")
    rounds = ", ".join(f"{p:.1f}" for p in result["matmul_peak_gflop_per_s_per_round"])
    print(f"fp32 matmul peak: {result['matmul_peak_gflop_per_s']:.1f} GFLOP/s (per round: {rounds})")
    head = f"{'path':34s} {'captions/s':>10s} {'s/step':>8s} {'GFLOP':>8s} {'GFLOP/s':>8s} {'%peak':>6s} " \
           f"{'enc s':>7s} {'enc GFLOP/s':>11s} {'enc %peak':>9s}"
    print(head)
    for r in result["paths"]:
        print(f"{r['path']:34s} {r['captions_per_s']:10.2f} {r['seconds_best']:8.3f} {r['gflops']:8.1f} "
              f"{r['gflop_per_s_wall']:8.1f} {100 * r['peak_fraction_wall']:5.1f}% {r['encoder_seconds']:7.3f} "
              f"{r['gflop_per_s_encoders']:11.1f} {100 * r['peak_fraction_encoders']:8.1f}%")
    print(f"speed-up batched/per-sample: cold cache {result['speedup_cold']:.1f}x, "
          f"warm cache {result['speedup_warm']:.1f}x (target >= 5x)")
    print(f"max |score difference| between the paths: {result['max_score_difference']:.1e}")


def profile_cold(em: EMScore, captions, videos) -> None:
    from torch.profiler import ProfilerActivity, profile

    em.backbone.cache.clear()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
        run_batched(em, captions, videos)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))


if __name__ == "__main__":
    main()
