"""How far capreward's EMScore is from the exact value in each precision, per component, on one device.

The exact value: the released EMScore call path (bench_emscore.ReleasedPathEMScore) with the model in
fp64 on the device. Against it, capreward's ``EMScore`` in fp32, fp16 and bf16 on the device (and in fp32
on the CPU when the device is a GPU): for the image embeddings, the caption token embeddings and every
score component (coarse, fine P/R/F, full P/R/F), the median, 99th percentile and largest absolute
difference. The fp32 gate is 1e-5 on the well-conditioned components (coarse, P, R; F = 2PR/(P+R)
amplifies rounding where P+R is near 0, see bench_emscore.py).

    python benchmarks/gpu_precision.py --device cuda --json-out precision.json
    python benchmarks/gpu_precision.py --device cpu --small --model tiny_clip.pt
"""

from __future__ import annotations

import argparse
import copy
import random
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_emscore import GATED, ReleasedPathEMScore, make_captions, make_video  # noqa: E402
from gpu_common import cpu_precision, tf32_settings, write_json  # noqa: E402

from capreward import EMScore  # noqa: E402
from capreward.backbones import load_clip  # noqa: E402


def stats(diff: torch.Tensor) -> dict[str, float]:
    d = diff.detach().double().abs().flatten().cpu()
    return {"median": float(d.median()), "p99": float(torch.quantile(d, 0.99)) if d.numel() > 1 else float(d.max()),
            "max": float(d.max()), "n": int(d.numel())}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--model", default="ViT-B-32/random")
    parser.add_argument("--videos", type=int, default=4)
    parser.add_argument("--captions", type=int, default=8, help="per video")
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--small", action="store_true", help="2 videos x 2 captions x 3 frames (a CPU dry run)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json-out")
    args = parser.parse_args(argv)
    if args.small:
        args.videos, args.captions, args.frames = 2, 2, 3
    torch.manual_seed(args.seed)
    rng, nrng = random.Random(args.seed), np.random.default_rng(args.seed)
    videos = [make_video(nrng, args.frames, 120, 160) for _ in range(args.videos)]
    refs_of = [make_captions(rng, 2) for _ in range(args.videos)]
    n = args.videos * args.captions
    caps = make_captions(rng, n)
    per_video = [videos[i // args.captions] for i in range(n)]
    keys = [i // args.captions for i in range(n)]
    refs = [refs_of[i // args.captions] for i in range(n)]
    corpus = [r for rs in refs for r in rs]

    model, preprocess, tokenizer = load_clip(args.model, "cpu", "fp32")
    exact_model = copy.deepcopy(model).double().to(args.device)
    exact = ReleasedPathEMScore(exact_model, preprocess, tokenizer)
    truth = exact.score(caps, refs, per_video, keys, idf=exact.idf_dict(corpus)).as_dict()
    true_frames = [exact.encode_video(v) for v in videos]
    sentences = sorted(set(caps))
    true_text = exact.encode_text(exact.tokenize(sentences))

    runs = {"fp32": (args.device, "fp32"), "fp16": (args.device, cpu_precision(args.device, "fp16")),
            "bf16": (args.device, "bf16")}
    if torch.device(args.device).type == "cuda":
        runs["fp32_cpu"] = ("cpu", "fp32")
    deviation, scores = {}, {}
    for name, (device, precision) in runs.items():
        em = EMScore(model=lambda: (copy.deepcopy(model), preprocess, tokenizer), device=device,
                     precision=None if precision == "fp32" else precision, idf=corpus, frames=args.frames)
        got = em.score(caps, videos=per_video, references=refs).combined.as_dict()
        scores[name] = got
        row = {k: stats(got[k].double().cpu() - truth[k].double().cpu()) for k in truth}
        frames = em.backbone.visual_embeddings(videos, kind="video", frames=args.frames)
        row["image_embedding"] = stats(torch.cat([f.double().cpu() - t.double().cpu() for f, t in zip(frames, true_frames)]))
        rows = em.backbone.embed_rows([tuple(em.backbone.token_ids(s)[0]) for s in sentences])
        row["text_token_embedding"] = stats(torch.cat([tok.double().cpu() - true_text[i, : tok.shape[0]].double().cpu()
                                                       for i, (tok, _) in enumerate(rows)]))
        deviation[name] = row
    result = {
        "config": {k: getattr(args, k) for k in ("device", "model", "videos", "captions", "frames", "seed")},
        "tf32": tf32_settings(),
        "deviation": deviation,
        "fp32_components_max": max(deviation["fp32"][k]["max"] for k in GATED),
        "fp32_within_1e-5": max(deviation["fp32"][k]["max"] for k in GATED) <= 1e-5,
    }
    if "fp32_cpu" in scores:
        result["fp32_device_vs_cpu_max"] = max(float((scores["fp32"][k].cpu() - scores["fp32_cpu"][k].cpu()).abs().max())
                                               for k in GATED)
    for name, row in deviation.items():
        print(f"{name:9s} vs fp64: " + ", ".join(f"{k} {v['median']:.1e}/{v['p99']:.1e}/{v['max']:.1e}"
                                                for k, v in row.items()))
    print(f"fp32 within 1e-5 of fp64 on {', '.join(GATED)}: {result['fp32_within_1e-5']} "
          f"(max {result['fp32_components_max']:.1e})")
    write_json(args.json_out, result)
    return result


if __name__ == "__main__":
    main()
