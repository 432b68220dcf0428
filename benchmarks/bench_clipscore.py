"""CLIP-S: capreward's ``CLIPScore`` against torchmetrics' ``CLIPScore`` on the same weights, in one run.

Workload (defaults): 16 images x 8 captions of 8-20 words (128 image-caption pairs, as a GRPO step on
images scores them), a CLIP with the ViT-B-32 architecture and random weights, fp32 CPU, ``--threads``.

torchmetrics: ``torchmetrics.multimodal.CLIPScore(model_name_or_path=factory)``. Its ``model_name_or_path``
accepts a callable returning ``(model, processor)`` in the transformers API, so the factory returns a thin
wrapper around the same open_clip model: ``get_image_features`` is ``encode_image`` on pixels made by
the same open_clip preprocessing, ``get_text_features`` runs the text tower on the rows padded to the
longest caption of the call (what the transformers CLIP processor's ``padding=True`` gives), pooled at
EOS. Used as documented: ``metric.update(images, captions)`` with one image per caption (each image
repeated for its captions), then ``compute()``; it has no cache, so cold and warm are the same work.

capreward: ``CLIPScore(...).score(captions, images=...)``, cold (empty caches) and warm (the images
cached by an earlier step, new captions).

What is compared is not the same number: torchmetrics returns one number for the whole update,
``max(mean over pairs of 100 * cos(image, caption), 0)``, with no prefix; CLIP-S is per sample
``2.5 * max(cos(image, "A photo depicts " + caption), 0)``. The agreement check therefore compares
torchmetrics' per-pair 100*cos (its update function, before the mean and clamp) with capreward's own
embeddings (no prefix), and recomputes its returned number from them.

    python benchmarks/bench_clipscore.py --threads 2
    python benchmarks/bench_clipscore.py --quick     # 4 images, 1 round
    python benchmarks/bench_clipscore.py --device cuda --precision fp16
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from PIL import Image

from capreward import CLIPScore
from capreward.backbones.clip import pixel_dtype

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_emscore import counted_flops, make_captions, make_video, synchronize  # noqa: E402  (shared workload generators)
from gpu_common import matmul_peak, write_json  # noqa: E402


class OpenClipAsTransformers(torch.nn.Module):
    """An open_clip CLIP behind the two methods torchmetrics calls on a transformers ``CLIPModel``."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.config = SimpleNamespace()  # no text_config: torchmetrics then skips its length check

    def get_image_features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model.encode_image(pixel_values.to(pixel_dtype(self.model.visual))).float()

    def get_text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        m, width = self.model, input_ids.shape[1]
        x = (m.token_embedding(input_ids) + m.positional_embedding[:width]).to(m.transformer.get_cast_dtype())
        x = m.ln_final(m.transformer(x, attn_mask=m.attn_mask[:width, :width]))
        eos = attention_mask.sum(-1) - 1
        return (x[torch.arange(x.shape[0]), eos] @ m.text_projection).float()


class OpenClipProcessor:
    """The transformers-processor call torchmetrics makes: images -> pixel_values, texts -> padded ids."""

    def __init__(self, preprocess, tokenizer):
        self.preprocess, self.tokenizer = preprocess, tokenizer

    def __call__(self, text=None, images=None, return_tensors="pt", padding=True):
        if images is not None:
            pixels = [self.preprocess(Image.fromarray(i.permute(1, 2, 0).numpy())) for i in images]
            return {"pixel_values": torch.stack(pixels)}
        rows = [[self.tokenizer.sot_token_id, *self.tokenizer.encode(t), self.tokenizer.eot_token_id] for t in text]
        width = max(len(r) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)], mask[i, : len(r)] = torch.tensor(r), 1
        return {"input_ids": ids, "attention_mask": mask}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=16)
    parser.add_argument("--captions", type=int, default=8, help="captions per image")
    parser.add_argument("--height", type=int, default=240)
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--model", default="ViT-B-32/random")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]; both metrics run there")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "fp16", "bf16"),
                        help="of the shared CLIP, for both metrics")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="4 images, 1 round")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--json-out", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.repeats = 4, 1
    from torchmetrics.functional.multimodal.clip_score import _clip_score_update
    from torchmetrics.multimodal import CLIPScore as TMCLIPScore

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng, nrng = random.Random(args.seed), np.random.default_rng(args.seed)
    images = [make_video(nrng, 1, args.height, args.width)[0] for _ in range(args.images)]
    n = args.images * args.captions
    per_caption = [images[i // args.captions] for i in range(n)]
    # torchmetrics runs its model where the images are
    per_caption_chw = [torch.from_numpy(im).permute(2, 0, 1).to(args.device) for im in per_caption]

    ours = CLIPScore(model=args.model, device=args.device, precision=None if args.precision == "fp32" else args.precision)
    bb = ours.backbone
    wrapped = OpenClipAsTransformers(bb.model).eval()
    processor = OpenClipProcessor(bb.preprocess, bb.tokenizer)
    # the metric's states live where its model runs: moved to the device with the metric
    tm = TMCLIPScore(model_name_or_path=lambda: (wrapped, processor)).to(args.device)

    def run_tm(caps):
        tm.reset()
        with torch.no_grad():
            tm.update(per_caption_chw, caps)
            return float(tm.compute())

    def clear():
        bb.cache.clear()
        bb.text_cache.clear()

    def timed(fn):
        synchronize(args.device)
        start, cpu = time.perf_counter(), time.process_time()
        out = fn()
        synchronize(args.device)
        return time.perf_counter() - start, time.process_time() - cpu, out

    # explicit warm-up of both paths (first-call allocations, kernel selection), then the FLOPs of one call
    # of each (fused attention disabled while counting, so attention is counted)
    warm_caps = make_captions(rng, n)
    run_tm(warm_caps)
    clear()
    ours.score(warm_caps, images=per_caption)
    with counted_flops() as tm_flops:
        run_tm(make_captions(rng, n))
    clear()
    with counted_flops() as cold_flops:
        ours.score(make_captions(rng, n), images=per_caption)
    with counted_flops() as warm_flops:
        ours.score(make_captions(rng, n), images=per_caption)
    peak = matmul_peak(args.device, pixel_dtype(bb.model.visual), seconds=0.5)  # the layers' dtype
    rounds = []
    for _ in range(args.repeats):
        caps, other = make_captions(rng, n), make_captions(rng, n)
        r = {"torchmetrics": timed(lambda: run_tm(caps))}
        clear()
        r["capreward cold"] = timed(lambda: ours.score(caps, images=per_caption))
        clear()
        ours.score(other, images=per_caption)
        r["capreward warm"] = timed(lambda: ours.score(caps, images=per_caption))
        # torchmetrics' per-pair 100*cos (before its mean and clamp) against capreward's embeddings (no prefix)
        frames = torch.stack([f[0] for f in bb.visual_embeddings(per_caption, kind="image")])
        text = torch.stack([pooled for _, pooled in bb.embed_rows([tuple(bb.token_ids(c)[0]) for c in caps])])
        with torch.no_grad():
            tm_pairs, _ = _clip_score_update(per_caption_chw, caps, wrapped, processor)
        ours_cos = 100 * (frames * text).sum(-1).to(tm_pairs.device)
        r["agreement"] = float((ours_cos - tm_pairs).abs().max())
        r["value_check"] = abs(max(float(ours_cos.mean()), 0.0) - r["torchmetrics"][2])
        rounds.append(r)

    best = {k: min(r[k][0] for r in rounds) for k in ("torchmetrics", "capreward cold", "capreward warm")}
    cpu = {k: min(r[k][1] for r in rounds) for k in best}
    result = {
        "config": {k: getattr(args, k) for k in ("images", "captions", "height", "width", "model", "threads", "repeats", "device", "precision")},
        "seconds_best": best,
        "cpu_seconds_best": cpu,
        "speedup_cold": best["torchmetrics"] / best["capreward cold"],
        "speedup_warm": best["torchmetrics"] / best["capreward warm"],
        "cpu_speedup_cold": cpu["torchmetrics"] / cpu["capreward cold"],
        "cpu_speedup_warm": cpu["torchmetrics"] / cpu["capreward warm"],
        "per_pair_100cos_difference": max(r["agreement"] for r in rounds),
        "torchmetrics_value_difference": max(r["value_check"] for r in rounds),
        "matmul_peak_gflop_per_s": peak / 1e9,
        # whole-call FLOP/s (preprocessing and Python included) as a share of the measured matmul peak
        "efficiency": {k: {"gflop": f["flops"] / 1e9, "peak_fraction": f["flops"] / best[k] / peak}
                       for k, f in (("torchmetrics", tm_flops), ("capreward cold", cold_flops),
                                    ("capreward warm", warm_flops))},
    }
    if torch.device(args.device).type != "cpu":  # process CPU time means nothing for GPU work
        for k in ("cpu_speedup_cold", "cpu_speedup_warm"):
            result[k] = None
    write_json(args.json_out, result)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        c = result["config"]
        where = f"{c['precision']} CPU, {c['threads']} threads" if c["device"] == "cpu" else f"{c['precision']} {c['device']}"
        print(f"CLIP-S, {c['model']}, {where}: {c['images']} images x {c['captions']} captions, "
              f"best of {c['repeats']} rounds")
        for k, s in best.items():
            print(f"  {k:16s} {s:7.3f} s  ({n / s:6.1f} captions/s; CPU {cpu[k]:.2f} s)")
        cpu_note = "" if result["cpu_speedup_cold"] is None else \
            f" (process CPU time: {result['cpu_speedup_cold']:.1f}x, {result['cpu_speedup_warm']:.1f}x)"
        print(f"capreward vs torchmetrics: cold {result['speedup_cold']:.1f}x, warm {result['speedup_warm']:.1f}x{cpu_note}")
        print("whole calls as a share of the measured matmul peak: " + ", ".join(
            f"{k} {e['gflop']:.1f} GFLOP at {100 * e['peak_fraction']:.1f}%" for k, e in result["efficiency"].items()))
        print(f"torchmetrics' per-pair 100*cos vs capreward's embeddings: max |diff| "
              f"{result['per_pair_100cos_difference']:.1e}; its value max(mean 100*cos, 0) recomputed: "
              f"{result['torchmetrics_value_difference']:.1e} (note: torchmetrics returns that one number, no prefix; "
              f"CLIP-S is per sample 2.5*max(cos, 0) with 'A photo depicts ')")
    return result


if __name__ == "__main__":
    main()
