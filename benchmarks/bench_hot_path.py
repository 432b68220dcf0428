"""The hot-path changes made for CUDA, timed against the code they replaced on this machine (interleaved
rounds, best of each): the packed text tower (host-computed row slots instead of boolean masks), pad_stack
(torch's pad_sequence on the CPU; the one indexed copy that a GPU runs is in tests/test_cuda_pitfalls.py),
and CLIP preprocessing of video frames with ``--workers`` threads against one frame at a time (the default
is half the cores, so 1 on a 2-core machine). The old implementations are the references of tests/test_cuda_pitfalls.py.

    python benchmarks/bench_hot_path.py [--model ViT-B-32/random] [--rounds 5] [--json-out FILE]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
from bench_emscore import make_captions, make_video  # noqa: E402
from gpu_common import synchronize, write_json  # noqa: E402
from test_cuda_pitfalls import old_pad_stack, old_text_tower_packed  # noqa: E402

from capreward.backbones import CLIPBackbone  # noqa: E402
from capreward.metrics.emscore import pad_stack  # noqa: E402


def best_of(rounds: int, fns: dict, device) -> dict[str, float]:
    """Best seconds of each function over interleaved rounds (one warm-up call each first)."""
    for fn in fns.values():
        fn()
    best = {k: float("inf") for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)
            best[k] = min(best[k], time.perf_counter() - start)
    return best


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="ViT-B-32/random")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--captions", type=int, default=128)
    parser.add_argument("--videos", type=int, default=4)
    parser.add_argument("--frames", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="preprocessing threads of the 'new' frame run")
    parser.add_argument("--json-out")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    bb = CLIPBackbone(args.model, device=args.device)
    rng = random.Random(0)
    rows = [tuple(bb.token_ids(c)[0]) for c in make_captions(rng, args.captions)]
    emb = [torch.randn(len(r), 512, device=args.device) for r in rows]
    videos = [make_video(np.random.default_rng(i), args.frames, 240, 320) for i in range(args.videos)]
    workers = args.workers
    default_workers = bb.preprocess_workers

    def frames(k):
        def run():
            bb.preprocess_workers = k
            for v in videos:
                bb.pixels_of(v)
        return run

    with torch.no_grad():
        result = {
            "config": vars(args) | {"default_preprocess_workers": default_workers},
            "text_tower_packed": best_of(args.rounds, {"old": lambda: old_text_tower_packed(bb, rows),
                                                       "new": lambda: bb._text_tower_packed(rows)}, args.device),
            "pad_stack": best_of(args.rounds, {"old": lambda: old_pad_stack(emb), "new": lambda: pad_stack(emb)},
                                 args.device),
            "preprocess_frames": best_of(args.rounds, {"old": frames(1), "new": frames(workers)}, args.device),
        }
    bb.preprocess_workers = default_workers
    for name in ("text_tower_packed", "pad_stack", "preprocess_frames"):
        r = result[name]
        r["speedup"] = r["old"] / r["new"]
        print(f"{name:18s} old {1000 * r['old']:8.2f} ms  new {1000 * r['new']:8.2f} ms  ({r['speedup']:.2f}x)")
    write_json(args.json_out, result)
    return result


if __name__ == "__main__":
    main()
