"""FLEUR throughput: the batched prefix-sharing path against per-sample ``generate``.

GRPO-shaped work: ``--images`` images with ``--captions`` captions each (4 x 8 by default) scored by a
LLaVA-architecture judge with random weights (nothing is downloaded). ``--arch small`` (default) is a
~110M-parameter LLaVA-1.5-shaped model (576 image tokens from a 336 px / 14 px-patch CLIP tower, LLaMA
decoder of width 768 x 8 layers, 32064-token embedding) that runs in a few minutes on 2 CPU cores;
``--arch llava-7b`` has the real LLaVA-1.5-7B shapes (CLIP ViT-L/14-336 + LLaMA-7B) for a GPU in
float16.

Both paths run the same prompts and the same greedy decoding budget (``--max-new-tokens``; a random
model rarely ends early); the script checks that they pick the same tokens and prints captions/s, their
ratio and the peak memory each needed on top of the loaded model.

    python benchmarks/bench_fleur.py                      # CPU, ~100M params, 4 x 8
    python benchmarks/bench_fleur.py --images 2 --captions 4 --text-layers 4   # quicker
    python benchmarks/bench_fleur.py --arch llava-7b --device cuda --dtype float16
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_common import copy_bandwidth, matmul_peak, write_json  # noqa: E402

from capreward import FLEUR
from capreward.judges import mean_background, pad_to_square
from capreward.testing import TinyLlavaSpec, build_tiny_llava

ARCHS = {
    # a few-million-parameter judge for a CPU dry run of the GPU command (16 image tokens)
    "tiny": dict(
        text_hidden=64, text_layers=2, text_heads=4, text_kv_heads=2, text_intermediate=192,
        vision_hidden=32, vision_layers=2, vision_heads=2, vision_intermediate=64, image_size=56, max_positions=512,
    ),
    "small": dict(
        text_hidden=768, text_layers=8, text_heads=12, text_kv_heads=12, text_intermediate=2048,
        vision_hidden=256, vision_layers=4, vision_heads=4, vision_intermediate=1024,
    ),
    "llava-7b": dict(
        text_hidden=4096, text_layers=32, text_heads=32, text_kv_heads=32, text_intermediate=11008,
        vision_hidden=1024, vision_layers=24, vision_heads=16, vision_intermediate=4096,
    ),
}
COMMON = dict(max_positions=4096, image_size=336, patch_size=14, vocab_size=32064)

WORDS = (
    "man woman child dog cat bicycle street park beach ball red blue green white black small large young old "
    "running riding sitting standing playing holding walking jumping wearing looking near under over next front "
    "group people two three grass water snow field road building tree sky shirt hat car bus train table"
).split()
GLUE = ("a", "the", "in", "on", "with", "of", "is", "and", "while", "at", "down", "across")


def make_captions(rng: random.Random, n: int) -> list[str]:
    """GRPO-like sampled captions: 10-18 words each, different openings."""
    out = []
    for _ in range(n):
        words = [rng.choice(WORDS) if i % 2 else rng.choice(GLUE) for i in range(rng.randint(10, 18))]
        out.append(" ".join(words).capitalize())
    return out


def make_images(rng: random.Random, n: int) -> list[Image.Image]:
    sizes = [(640, 480), (500, 375), (480, 640), (512, 512)]
    arrays = [np.random.default_rng(rng.getrandbits(32)).integers(0, 256, (h, w, 3), dtype=np.uint8) for w, h in sizes]
    return [Image.fromarray(arrays[i % len(arrays)]) for i in range(n)]


class PeakMemory:
    """Peak memory above the level at entry: CUDA allocator statistics, or process RSS sampled every 10 ms."""

    def __init__(self, device: torch.device):
        self.device = device
        self.peak = 0

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start = torch.cuda.memory_allocated()
        else:
            self.start = self._rss()
            self._stop = threading.Event()
            self._high = self.start

            def sample():
                while not self._stop.is_set():
                    self._high = max(self._high, self._rss())
                    time.sleep(0.01)

            self._thread = threading.Thread(target=sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            self.peak = torch.cuda.max_memory_allocated() - self.start
        else:
            self._stop.set()
            self._thread.join()
            self.peak = max(self._high, self._rss()) - self.start


def per_sample_generate(scorer: FLEUR, captions, images, max_new_tokens: int):
    """The straightforward way: one ``generate(..., output_logits=True)`` per caption, image processed
    each time. Returns the generated token ids and the digit distributions of every step."""
    model, processor = scorer.judge.model, scorer.judge.processor
    background = mean_background(processor.image_processor.image_mean)
    digit_ids = torch.tensor(scorer.digit_ids)
    tokens, digits = [], []
    for prompt, image in zip(scorer.prompts(captions), images):
        inputs = processor(images=pad_to_square(image, background), text=prompt, return_tensors="pt")
        inputs = {k: v.to(model.device) for k, v in inputs.items()}
        inputs["pixel_values"] = inputs["pixel_values"].to(model.dtype)
        with torch.inference_mode():
            out = model.generate(
                **inputs,
                do_sample=False,
                max_new_tokens=max_new_tokens,
                output_logits=True,
                return_dict_in_generate=True,
            )
        gen = out.sequences[0, inputs["input_ids"].shape[1] :].tolist()
        tokens.append(gen)
        logits = torch.stack([step[0].float() for step in out.logits])
        digits.append(torch.softmax(logits, dim=-1)[:, digit_ids.to(logits.device)].cpu())
    return tokens, digits


def workload(args) -> tuple[FLEUR, list[str], list[Image.Image], float]:
    """The judge (random weights) and the GRPO-shaped captions/images; also the build time in seconds."""
    device = torch.device(args.device)
    dtype = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[args.dtype]
    dims = dict(COMMON, **ARCHS[args.arch])
    if args.text_layers is not None:
        dims["text_layers"] = args.text_layers
    rng = random.Random(args.seed)
    images = make_images(rng, args.images)
    captions, group_images = [], []
    for image in images:
        captions += make_captions(rng, args.captions)
        group_images += [image] * args.captions
    vocabulary = tuple(WORDS) + GLUE + tuple(w.capitalize() for w in GLUE + tuple(WORDS))
    spec = TinyLlavaSpec(words=vocabulary, **dims)
    t0 = time.perf_counter()
    model, processor = build_tiny_llava(spec, dtype=dtype, device=device)
    built = time.perf_counter() - t0
    scorer = FLEUR((model, processor), batch_size=args.batch_size, max_new_tokens=args.max_new_tokens)
    scorer.judge.decode_graphs = {"auto": None, "on": True, "off": False}[args.decode_graphs]
    return scorer, captions, group_images, built


def run_one_path(args) -> dict:
    """Build the judge and time one path (``args.path``) in this process (the batched one also reads its
    cache sizes)."""
    built = workload(args)
    out = time_path(args, args.path, *built)
    if args.path == "batched":
        out["cache"] = cache_figures(built[0], built[1], built[2], args.max_new_tokens)
    return out


def time_path(args, path: str, scorer: FLEUR, captions, images, built: float) -> dict:
    """Time one path on an already built judge. Memory is measured from before the warm-up call (so
    memory the warm-up leaves in the allocator still counts) to the end."""
    device = torch.device(args.device)
    n = len(captions)
    with PeakMemory(device) as mem:
        if path == "batched":
            scorer.plan(captions[:2], images[:2])  # warm-up: first-call allocations, lazy initialisation
            fn = lambda: scorer.plan(captions, images).tokens  # noqa: E731
        else:
            per_sample_generate(scorer, captions[:1], images[:1], 2)
            fn = lambda: per_sample_generate(scorer, captions, images, args.max_new_tokens)[0]  # noqa: E731
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        tokens = fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    model = scorer.judge.model
    n_image = int(model.config.image_seq_length)
    lengths = [len(p) for p in scorer.judge.encode_prompts(scorer.prompts(captions), n_image)]
    return {
        "path": path,
        "captions": n,
        "seconds": seconds,
        "captions_per_s": n / seconds,
        "peak_bytes": mem.peak,
        "tokens": tokens,
        "params": sum(p.numel() for p in model.parameters()),
        "weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "image_tokens": n_image,
        "prompt_tokens": [min(lengths), max(lengths)],
        "built_s": built,
        "threads": torch.get_num_threads(),
        "eos": sorted(scorer.judge.eos_token_ids),
    }


def cache_figures(scorer: FLEUR, captions, images, max_new_tokens: int) -> dict:
    """Bytes of the batched path's key/value cache for the workload (one prefill of every caption, room for
    the answer), read off its tensors, beside what the copying design held (the image prefix copied into
    every row) and what per-sample ``generate`` holds (one row: its prompt and answer)."""
    judge = scorer.judge
    distinct, index = [], []
    for image in images:
        k = next((j for j, seen in enumerate(distinct) if seen is image), None)
        if k is None:
            distinct.append(image)
            k = len(distinct) - 1
        index.append(k)
    with torch.inference_mode():
        features = judge.image_features(judge.preprocess(distinct))
        ids = judge.encode_prompts(scorer.prompt_parts(captions), int(features.shape[1]))
        state = judge.start(ids, features, index, reserve=max_new_tokens)
    sizes = judge.cache_bytes(state)
    text = judge.model.config.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    per_position = text.num_hidden_layers * 2 * text.num_key_value_heads * head_dim * judge.dtype.itemsize
    prefix, capacity, n = state.cache.prefix_length, state.cache.capacity, len(captions)
    copying = n * (prefix + capacity) * per_position
    generate = (max(len(p) for p in ids) + max_new_tokens) * per_position
    del state
    return {"bytes_per_position": per_position, "images": len(distinct), "rows": n, "prefix_positions": prefix,
            "row_positions": capacity, "batched_bytes": sizes["total"], "prefix_bytes": sizes["prefix"],
            "row_bytes": sizes["rows"], "copying_design_bytes": copying, "generate_bytes": generate,
            "overhead_over_generate_bytes": sizes["total"] - generate, "saved_bytes": copying - sizes["total"]}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", choices=sorted(ARCHS), default="small")
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--captions", type=int, default=8, help="captions per image")
    parser.add_argument("--text-layers", type=int, default=None, help="override the decoder depth")
    parser.add_argument("--max-new-tokens", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--skip-generate", action="store_true", help="time only the batched path")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--decode-graphs", choices=["auto", "on", "off"], default="auto",
                        help="the batched path's decode steps as CUDA graphs (auto: on a GPU)")
    parser.add_argument("--path", choices=["both", "batched", "generate"], default="both",
                        help="internal: time one path in this process and print its JSON")
    parser.add_argument("--one-process", action=argparse.BooleanOptionalAction, default=None,
                        help="build the judge once and time both paths in this process (default on a GPU: the "
                             "allocator's peak statistics are reset between the paths; on the CPU each path runs in "
                             "its own process, so that the RSS peak of each is its own)")
    parser.add_argument("--json-out", help="write the results to this JSON file")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.path != "both":
        print(json.dumps(run_one_path(args)))
        return {}

    paths = ["batched"] if args.skip_generate else ["batched", "generate"]
    results = {}
    one_process = args.one_process if args.one_process is not None else torch.device(args.device).type == "cuda"
    flops = peak = None
    cache = None
    if one_process:  # the judge (7B: 13 GiB in float16) is built once, directly on the device in its dtype
        built = workload(args)
        for path in paths:
            results[path] = time_path(args, path, *built)
        flops, peak = prefill_flops(args, *built[:3])
        cache = cache_figures(built[0], built[1], built[2], args.max_new_tokens)
    else:
        # Each path runs in its own process, so that neither inherits the other's allocator state and
        # the peak memory of each is its own.
        base = [a for a in (argv if argv is not None else sys.argv[1:]) if not a.startswith("--path")]
        for path in paths:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), *base, "--path", path],
                                 capture_output=True, text=True)
            if out.returncode != 0:  # the child's own error, not only its exit code
                sys.stderr.write(out.stdout[-4000:] + out.stderr[-8000:])
                raise SystemExit(f"the {path} path failed (exit code {out.returncode}); its output is above")
            results[path] = json.loads(out.stdout.strip().splitlines()[-1])
        cache = results["batched"].get("cache")
    fast = results["batched"]
    n = fast["captions"]
    print(
        f"judge: LLaVA architecture '{args.arch}', {fast['params'] / 1e6:.1f}M parameters "
        f"({fast['weight_bytes'] / 2**20:.0f} MiB of weights, random, built in {fast['built_s']:.1f}s), "
        f"{fast['image_tokens']} image tokens, {args.dtype} on {args.device}, torch threads {fast['threads']}"
    )
    print(
        f"work: {args.images} images x {args.captions} captions = {n} captions; prompts of "
        f"{fast['prompt_tokens'][0]}-{fast['prompt_tokens'][1]} tokens; greedy budget {args.max_new_tokens} new tokens"
    )
    report = {"config": {k: getattr(args, k) for k in ("arch", "images", "captions", "max_new_tokens", "batch_size",
                                                       "device", "dtype")},
              "one_process": one_process, "params": fast["params"], "weight_bytes": fast["weight_bytes"],
              "built_s": fast["built_s"], "image_tokens": fast["image_tokens"], "prompt_tokens": fast["prompt_tokens"],
              "captions": n, "batched_seconds": fast["seconds"], "batched_s_per_caption": fast["seconds"] / n,
              "batched_captions_per_s": fast["captions_per_s"], "batched_peak_bytes": fast["peak_bytes"]}
    judge = None
    if one_process:
        judge = built[0].judge
        report["decode_graphs"] = judge.uses_graphs
        report["sync_every"] = judge.sync_every
    if cache is not None:
        report["cache"] = cache
    if flops is not None:
        report.update({"batched_gflop": flops / 1e9, "matmul_peak_gflop_per_s": peak / 1e9,
                       # the whole batched call (prefill of the shared image prefix and of every caption,
                       # then the greedy answer) as a share of the measured matmul peak of the judge's dtype
                       "prefill_peak_fraction": flops / fast["seconds"] / peak})
    print(f"batched prefix-sharing path: {fast['captions_per_s']:8.2f} captions/s  ({fast['seconds']:7.2f} s, "
          f"{fast['seconds'] / n:.3f} s/caption)  peak memory +{fast['peak_bytes'] / 2**20:8.1f} MiB")
    if "generate" in results:
        slow = results["generate"]
        speedup = slow["seconds"] / fast["seconds"]
        report.update(
            {"generate_captions_per_s": slow["captions_per_s"], "generate_peak_bytes": slow["peak_bytes"], "speedup": speedup,
             "generate_seconds": slow["seconds"], "generate_s_per_caption": slow["seconds"] / n}
        )
        if one_process:  # every decode step reads every weight once: a lower bound of the bytes moved
            copy = copy_bandwidth(args.device)["device_copy_bytes_per_s"]
            rate = fast["weight_bytes"] * args.max_new_tokens * n / slow["seconds"]
            report.update({"generate_weight_read_gb_per_s": rate / 1e9, "device_copy_gb_per_s": copy / 1e9,
                           "generate_copy_fraction": rate / copy})
        print(f"per-sample generate:         {slow['captions_per_s']:8.2f} captions/s  ({slow['seconds']:7.2f} s, "
              f"{slow['seconds'] / n:.3f} s/caption)  peak memory +{slow['peak_bytes'] / 2**20:8.1f} MiB")
        print(f"speed-up: {speedup:.2f}x (target >= 4x)")
        eos = set(fast["eos"])
        same = 0
        for ours, theirs in zip(fast["tokens"], slow["tokens"]):
            end = next((i for i, t in enumerate(theirs) if t in eos), len(theirs))
            same += ours == theirs[:end]
        print(f"greedy tokens identical in {same}/{n} captions")
        report["identical"] = same
    if cache is not None:
        mib = 2**20
        print(f"key/value cache of the batched call ({cache['rows']} rows, {cache['images']} images): "
              f"{cache['batched_bytes'] / mib:.1f} MiB = {cache['images']} prefixes of {cache['prefix_positions']} positions "
              f"({cache['prefix_bytes'] / mib:.1f} MiB) + {cache['rows']} rows of {cache['row_positions']} positions "
              f"({cache['row_bytes'] / mib:.1f} MiB); the prefix copied into every row would hold "
              f"{cache['copying_design_bytes'] / mib:.1f} MiB; per-sample generate holds {cache['generate_bytes'] / mib:.1f} MiB "
              f"(overhead of the batch over generate: {cache['overhead_over_generate_bytes'] / mib:.1f} MiB)")
    if "prefill_peak_fraction" in report:
        print(f"batched call: {report['batched_gflop']:.0f} GFLOP at {100 * report['prefill_peak_fraction']:.1f}% of the "
              f"measured {args.dtype} matmul peak ({report['matmul_peak_gflop_per_s'] / 1e3:.0f} TFLOP/s)")
    if "generate_copy_fraction" in report:
        print(f"per-sample generate reads the weights at >= {report['generate_weight_read_gb_per_s']:.0f} GB/s, "
              f"{100 * report['generate_copy_fraction']:.0f}% of the measured device copy rate")
    if args.arch == "llava-7b" and args.device.startswith("cuda"):
        print("paper (FLEUR, 13B, RTX 3090): 0.70 s/caption")
    write_json(args.json_out, report)
    return report


def prefill_flops(args, scorer: FLEUR, captions, images) -> tuple[float, float]:
    """(FLOPs of one batched call, counted with the fused attention disabled; the measured matmul peak
    of the judge's dtype on the device)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_emscore import counted_flops

    wanted = scorer.judge.decode_graphs
    scorer.judge.decode_graphs = False  # a graph's replays bypass the counting mode: count eager steps
    try:
        with counted_flops() as box:
            scorer.plan(captions, images)
    finally:
        scorer.judge.decode_graphs = wanted
    dtype = next(scorer.judge.model.parameters()).dtype
    return box["flops"], matmul_peak(args.device, dtype, seconds=0.5)


if __name__ == "__main__":
    main()
