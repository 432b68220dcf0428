"""EMScore on GRPO-shaped work: capreward against the authors' released call path, in one run.

Workload (defaults): 8 videos x 16 sampled captions of 8-20 words, 12 frames per video, 2 references per
caption (a prompt's references, shared by its group), idf over a fixed corpus, a CLIP with the ViT-B-32
architecture and random weights (nothing is downloaded), fp32 on the CPU with ``--threads`` threads.

Baseline, ``ReleasedPathEMScore``: our own code following the call path of the released EMScore
(ShiYaya/emscore, ``EMScorer.score`` -> ``em_cos_score``), with its model load hoisted out of the call:
per call, the candidate/reference pairs are expanded (one pair per reference), idf is counted from that
call's references (set of ids of each padded 77-token row, unseen ids ln(N+1), EOS set to the mean),
the distinct sentences (references and candidates) are sorted by word count and encoded at the full
77-token context in batches of 64, each distinct video's frames are preprocessed and encoded as one
batch, video by video; nothing is kept between calls. The matching is capreward's (the same greedy
matching; the released code's multiply-by-mask would clamp negative maxima to 0, see DESIGN.md). In the
per-group runs the baseline gets the fixed corpus's idf as a precomputed dict (the released
``idf=dict`` path), so it does no idf work there.

Runs, each round (``--repeats``), interleaved so that load from other processes hits all alike; every
timed call scores captions never seen before (a later GRPO step samples new completions):
- one call of all captions: baseline; capreward cold (empty visual and text caches); capreward warm
  (caches filled by an earlier step on other captions: same videos and references);
- 8 per-group calls of 16: the same three.
Printed: seconds (best of the rounds), the ratios baseline / capreward, the encoders' FLOPs (counted with
``FlopCounterMode`` in a pass with the fused attention kernels disabled, so attention is counted) and
their FLOP/s as a share of this machine's matmul peak in the model's precision (a ``torch.matmul`` loop on
the same threads or GPU, measured each round), the largest score difference against the baseline, and ``precision="bf16"``: its
speed and largest score difference against fp32.
Also printed: the *cold ceiling* (the FLOPs of the frames alone, every frame through the image tower,
which no exact method can skip, at 100 % of the measured peak: the best cold ratio any exact fp32 method
could reach against the released path's measured time), and the error of F and of its components against
the *exact* value, the released path computed in fp64 on the same captions, for the released fp32 path
and for capreward. F = 2PR/(P+R) amplifies rounding ~1/|P+R| times where random weights put P+R near 0,
so two fp32 implementations can differ in F by more than 1e-5 while each is as close to the exact
value as the other.

    python benchmarks/bench_emscore.py --threads 2            # the full workload, 2 rounds
    python benchmarks/bench_emscore.py --quick                # 2 videos, 1 round: a look in ~30 s
    python benchmarks/bench_emscore.py --json --profile       # JSON; torch.profiler table of a warm call
    python benchmarks/bench_emscore.py --device cuda --precision fp16   # a GPU: both paths in fp16, as the
                                                              # released code runs there (clip.load on cuda)
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import time
from collections import Counter, defaultdict
from contextlib import contextmanager

import numpy as np
import torch
from PIL import Image
from torch.utils.flop_counter import FlopCounterMode

from capreward import EMScore
from capreward.backbones import CLIPBackbone
from capreward.backbones.clip import pixel_dtype
from capreward.metrics.emscore import coarse_score, greedy_match, pad_stack, video_embedding
from capreward.scorers.results import MatchScores

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


def synchronize(device: torch.device | str = "cpu") -> None:
    """Wait for queued GPU work, so that wall-clock timings cover it (nothing to do on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak(threads: int, seconds: float = 1.5, device: str = "cpu", dtype: torch.dtype = torch.float32) -> float:
    """Best FLOP/s of ``torch.matmul`` on square ``dtype`` matrices with ``threads`` threads on the CPU
    (1024-2048), or on the GPU ``device`` (4096-8192)."""
    torch.set_num_threads(threads)
    best = 0.0
    # on a CPU, smaller sizes first, and no larger size whose one product would take over 1 s (bf16 on a
    # CPU without bf16 instructions runs below 1 GFLOP/s: one 2048^3 product would take half a minute)
    cpu = torch.device(device).type != "cuda"
    sizes = (256, 512, 1024, 2048) if cpu else (4096, 8192)
    for n in sizes:
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        out = torch.empty(n, n, device=device, dtype=dtype)
        torch.matmul(a, b, out=out)  # warm-up
        synchronize(device)
        iters, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds / 2:
            torch.matmul(a, b, out=out)
            iters += 1
            synchronize(device)
        took = time.perf_counter() - start
        best = max(best, 2 * n**3 * iters / took)
        if cpu and 8 * took / iters > 1.0:  # the next size's product: 8x the FLOPs
            break
    return best


@contextmanager
def counted_flops():
    """Yields a dict filled with ``{"flops": total}`` of the torch ops run inside the block. The fused
    attention kernels (``nn.MultiheadAttention``'s fast path, flash SDPA) are invisible to
    ``FlopCounterMode``, so they are disabled here: attention runs as counted matmuls."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    counter = FlopCounterMode(display=False)
    box: dict[str, int] = {}
    fast = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with sdpa_kernel(SDPBackend.MATH), counter:
            yield box
    finally:
        torch.backends.mha.set_fastpath_enabled(fast)
    box["flops"] = counter.get_total_flops()


class Stopwatch:
    """Accumulates the seconds spent inside wrapped functions (GPU work included: synchronised) while
    ``enabled``; disabled, a wrapped function runs as it is (no synchronisation, so the timed rounds keep
    the overlap of CPU preprocessing and GPU encoding; one instrumented round measures the split)."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.seconds = 0.0
        self.device = device
        self.enabled = True

    def wrap(self, fn):
        def wrapper(*args, **kwargs):
            if not self.enabled:
                return fn(*args, **kwargs)
            synchronize(self.device)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                synchronize(self.device)
                self.seconds += time.perf_counter() - start

        return wrapper


# --------------------------------------------------------------------------- the released call path
class ReleasedPathEMScore:
    """EMScore(X, V, X*) computed the way the released ``EMScorer.score`` computes it (module doc), on an
    already loaded open_clip model."""

    def __init__(self, model, preprocess, tokenizer, context_length: int = 77, text_batch: int = 64):
        self.model, self.preprocess, self.tokenizer = model, preprocess, tokenizer
        # the towers run in the model's dtype (fp32; fp16 on a GPU, as clip.load gives; fp64: the exact
        # reference), the matching in fp32 (fp64 for the exact reference)
        self.dtype = model.transformer.get_cast_dtype()
        self.image_dtype = pixel_dtype(model.visual)
        self.match_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        self.device = next(model.parameters()).device
        self.context_length, self.text_batch = context_length, text_batch
        self.sot, self.eot = tokenizer.sot_token_id, tokenizer.eot_token_id
        self.encoders = Stopwatch(self.device)

    def tokenize(self, sentences: list[str]) -> torch.Tensor:
        """``clip.tokenize``: SOS + BPE + EOS, zero-padded to the context (the workload never truncates)."""
        out = torch.zeros(len(sentences), self.context_length, dtype=torch.long)
        for i, s in enumerate(sentences):
            ids = [self.sot, *self.tokenizer.encode(s), self.eot]
            out[i, : len(ids)] = torch.tensor(ids)
        return out

    def idf_dict(self, corpus: list[str]) -> defaultdict:
        """``get_idf_dict`` over the corpus, then EOS (the largest id seen) set to the mean idf."""
        df: Counter[int] = Counter()
        for row in self.tokenize(corpus).tolist():
            df.update(set(row))
        n = len(corpus)
        idf = defaultdict(lambda: math.log((n + 1) / 1))
        idf.update({t: math.log((n + 1) / (c + 1)) for t, c in df.items()})
        idf[max(idf)] = sum(idf.values()) / len(idf)
        return idf

    def encode_text(self, ids: torch.Tensor) -> torch.Tensor:
        """Every position's ln_final(h) @ text_projection over the full context, L2-normalised."""
        m = self.model
        if self.encoders.enabled:
            synchronize(self.device)
        start = time.perf_counter()
        with torch.no_grad():
            x = (m.token_embedding(ids.to(self.device)) + m.positional_embedding).to(self.dtype)
            x = m.transformer(x, attn_mask=m.attn_mask)
            x = (m.ln_final(x) @ m.text_projection).to(self.match_dtype)
        if self.encoders.enabled:
            synchronize(self.device)
            self.encoders.seconds += time.perf_counter() - start
        return x / x.norm(dim=-1, keepdim=True)

    def encode_video(self, frames: np.ndarray) -> torch.Tensor:
        """All frames of one video preprocessed and encoded as one batch; L2-normalised [k, D]."""
        pixels = torch.stack([self.preprocess(Image.fromarray(f).convert("RGB")) for f in frames])
        if self.encoders.enabled:
            synchronize(self.device)
        start = time.perf_counter()
        with torch.no_grad():
            feats = self.model.encode_image(pixels.to(self.device, self.image_dtype)).to(self.match_dtype)
        if self.encoders.enabled:
            synchronize(self.device)
            self.encoders.seconds += time.perf_counter() - start
        return feats / feats.norm(dim=-1, keepdim=True)

    def score(self, cands: list[str], refs: list[list[str]], videos: list[np.ndarray], video_keys: list,
              idf: dict | None = None) -> MatchScores:
        """EMScore(X, V, X*) per candidate (every component)."""
        pair_cands = [c for c, rs in zip(cands, refs) for _ in rs]
        pair_refs = [r for rs in refs for r in rs]
        idf = idf if idf is not None else self.idf_dict(pair_refs)
        sentences = sorted(set(pair_refs + cands), key=lambda s: len(s.split(" ")), reverse=True)
        local, pooled, weights = {}, {}, {}
        for start in range(0, len(sentences), self.text_batch):
            batch = sentences[start : start + self.text_batch]
            ids = self.tokenize(batch)
            emb = self.encode_text(ids)
            lengths = ids.argmax(dim=-1) + 1  # EOS has the largest id
            for i, s in enumerate(batch):
                n = int(lengths[i])
                local[s], pooled[s] = emb[i, :n], emb[i, n - 1]
                weights[s] = torch.tensor([idf[int(t)] for t in ids[i, :n]], dtype=self.match_dtype,
                                          device=self.device)
        frames = {}
        for key, video in zip(video_keys, videos):
            if key not in frames:
                frames[key] = self.encode_video(video)

        def stacked(sents):
            tokens, mask = pad_stack([local[s] for s in sents])
            w, _ = pad_stack([weights[s][:, None] for s in sents])
            return tokens, mask, w[..., 0], torch.stack([pooled[s] for s in sents])

        ct, cm, cw, cp = stacked(pair_cands)
        rt, rm, rw, rp = stacked(pair_refs)
        fine = greedy_match(ct, cm, cw, rt, rm, rw)
        owner = torch.tensor([i for i, rs in enumerate(refs) for _ in rs], device=self.device)
        parts = [coarse_score(cp, rp), fine.p, fine.r, fine.f]
        ref_part = MatchScores.from_parts(*(torch.stack([v[owner == i].max() for i in range(len(cands))])
                                            for v in parts))
        ct, cm, cw, cp = stacked(cands)
        ft, fm = pad_stack([frames[k] for k in video_keys])
        fine = greedy_match(ct, cm, cw, ft, fm, fm.to(self.match_dtype))
        vid_part = MatchScores.from_parts(coarse_score(cp, video_embedding(ft, fm)), fine.p, fine.r, fine.f)
        return MatchScores.average(vid_part, ref_part)


# --------------------------------------------------------------------------------------- the runs
class Workload:
    def __init__(self, args):
        self.args = args
        nrng = np.random.default_rng(args.seed)
        self.rng = random.Random(args.seed)
        self.videos = [make_video(nrng, args.frames, args.height, args.width) for _ in range(args.videos)]
        self.video_refs = [make_captions(self.rng, args.references) for _ in range(args.videos)]
        g = args.captions
        self.n = args.videos * g
        self.per_caption_videos = [self.videos[i // g] for i in range(self.n)]
        self.video_keys = [i // g for i in range(self.n)]
        self.refs = [self.video_refs[i // g] for i in range(self.n)]
        # the fixed idf corpus: this step's references as the released code counts them (one row per pair)
        self.corpus = [r for rs in self.refs for r in rs]

    def captions(self) -> list[str]:
        return make_captions(self.rng, self.n)

    def groups(self):
        g = self.args.captions
        return [slice(s, s + g) for s in range(0, self.n, g)]


def clear(em: EMScore) -> None:
    em.backbone.cache.clear()
    em.backbone.text_cache.clear()


def ours_call(em: EMScore, w: Workload, caps: list[str], part: slice = slice(None)) -> MatchScores:
    return em.score(caps[part], videos=w.per_caption_videos[part], references=w.refs[part]).combined


def concat(parts: list[MatchScores]) -> MatchScores:
    return MatchScores(**{k: torch.cat([p.as_dict()[k] for p in parts]) for k in parts[0].as_dict()})


def ours_groups(em: EMScore, w: Workload, caps: list[str]) -> MatchScores:
    return concat([ours_call(em, w, caps, g) for g in w.groups()])


def base_call(base: ReleasedPathEMScore, w: Workload, caps, part=slice(None), idf=None) -> MatchScores:
    return base.score(caps[part], w.refs[part], w.per_caption_videos[part], w.video_keys[part], idf=idf)


# F = 2PR/(P+R) turns a rounding-level change of P or R into one ~1/|P+R| times larger, and random
# weights put P+R near 0 for some captions; the agreement gate is on the well-conditioned components.
GATED = ("coarse", "fine_p", "fine_r", "full_p", "full_r")


def differences(a: MatchScores, b: MatchScores) -> dict[str, float]:
    """Largest |a - b| of the gated components and of the score (full F)."""
    return {"components": max(float((a.as_dict()[k] - b.as_dict()[k]).abs().max()) for k in GATED),
            "score": float((a.full_f - b.full_f).abs().max())}


#: Stopwatches of the host-side parts of a capreward call (preprocessing, pixel hashing), enabled in the
#: instrumented round only: where a cold call's time goes besides the encoders.
PARTS: dict[str, Stopwatch] = {}


def timed(fn, watch: Stopwatch):
    """(wall s, wall s inside the encoders, output, process CPU s: all threads, robust to a busy machine,
    {part: s} of the :data:`PARTS` stopwatches)."""
    synchronize(watch.device)
    enc0, start, cpu = watch.seconds, time.perf_counter(), time.process_time()
    parts0 = {k: w.seconds for k, w in PARTS.items()}
    out = fn()
    synchronize(watch.device)
    parts = {k: w.seconds - parts0[k] for k, w in PARTS.items()}
    return time.perf_counter() - start, watch.seconds - enc0, out, time.process_time() - cpu, parts


def instrument_parts(bb: CLIPBackbone, device: str) -> None:
    """Wrap the backbone's preprocessing and the pixel hashing of its visual cache keys in stopwatches
    (:data:`PARTS`), disabled until the instrumented round."""
    import capreward.backbones.clip as clip_module

    PARTS["preprocess"] = Stopwatch(device)
    PARTS["hash"] = Stopwatch(device)
    bb.pixels_of = PARTS["preprocess"].wrap(bb.pixels_of)
    bb.image_pixels = PARTS["preprocess"].wrap(bb.image_pixels)
    clip_module.content_key = PARTS["hash"].wrap(clip_module.content_key)
    for part in PARTS.values():
        part.enabled = False


def preprocessing_deviation(em: EMScore, w: Workload) -> dict:
    """The device-side image path against the PIL path on the same captions and videos (caches cleared):
    the largest pixel difference (8-bit levels) over the workload's frames and the largest difference of
    every EMScore component."""
    bb = em.backbone
    mode = bb.preprocessing
    caps = w.captions()
    scores, pixels = {}, {}
    for name in ("pil", "device"):
        bb.set_preprocessing(name)
        clear(em)
        scores[name] = ours_call(em, w, caps)
        pixels[name] = torch.cat([bb.pixels_of(v).float().cpu() for v in w.videos])
    bb.set_preprocessing(mode)
    clear(em)
    std = torch.tensor(bb._tensor_preprocess.std)[:, None, None]
    levels = ((pixels["pil"] - pixels["device"]) * std * 255).abs()
    a, b = scores["pil"].as_dict(), scores["device"].as_dict()
    return {"max_pixel_levels": float(levels.max()), "fraction_of_values_off": float((levels > 0.5).float().mean()),
            "max_component_difference": {k: float((a[k] - b[k]).abs().max()) for k in a},
            "max_score_difference": float((a["full_f"] - b["full_f"]).abs().max())}


def pooled_only(result: MatchScores) -> dict:
    """What a server of pooled embeddings only (vLLM's /score, /embeddings: one vector per text and per
    image) leaves of EMScore: its coarse component. Against the full EMScore (whose fine-grained half needs
    every token's embedding) on the same captions: largest and mean difference, Spearman rank correlation."""
    full, coarse = result.full_f.double().cpu(), result.coarse.double().cpu()
    diff = (full - coarse).abs()

    def ranks(x):
        return torch.argsort(torch.argsort(x)).double()

    rf, rc = ranks(full), ranks(coarse)
    rho = float(((rf - rf.mean()) * (rc - rc.mean())).sum() / ((rf - rf.mean()).norm() * (rc - rc.mean()).norm()))
    return {"max_difference": float(diff.max()), "mean_difference": float(diff.mean()), "spearman": rho,
            "captions": int(full.numel())}


def run_scenarios(em: EMScore, base: ReleasedPathEMScore | None, w: Workload, watch: Stopwatch, fixed_idf):
    """One round of every scenario on fresh captions: ({name: (wall s, encoder s, scores, CPU s)}, the
    captions scored)."""
    caps, other = w.captions(), w.captions()
    out = {}
    if base is not None:
        out["released one call"] = timed(lambda: base_call(base, w, caps), base.encoders)
    clear(em)
    out["capreward one call, cold"] = timed(lambda: ours_call(em, w, caps), watch)
    clear(em)
    ours_call(em, w, other)  # an earlier step: same videos and references, other captions
    out["capreward one call, warm"] = timed(lambda: ours_call(em, w, caps), watch)
    if base is not None:
        out["released per group"] = timed(
            lambda: concat([base_call(base, w, caps, g, fixed_idf) for g in w.groups()]), base.encoders)
    clear(em)
    out["capreward per group, cold"] = timed(lambda: ours_groups(em, w, caps), watch)
    clear(em)
    ours_groups(em, w, other)
    out["capreward per group, warm"] = timed(lambda: ours_groups(em, w, caps), watch)
    return out, caps


def count_scenario_flops(em: EMScore, base: ReleasedPathEMScore, w: Workload) -> dict[str, float]:
    """Encoder FLOPs of the one-call scenarios (the matching's few MFLOP are included and negligible)."""
    caps, other = w.captions(), w.captions()
    flops = {}
    with counted_flops() as box:
        base_call(base, w, caps)
    flops["released"] = box["flops"]
    clear(em)
    with counted_flops() as box:
        ours_call(em, w, other)
    flops["cold"] = box["flops"]
    with counted_flops() as box:
        ours_call(em, w, caps)
    flops["warm"] = box["flops"]
    clear(em)
    with counted_flops() as box:  # what no exact method can skip: every frame through the image tower
        em.backbone.visual_embeddings(w.videos, kind="video", frames=w.args.frames)
    flops["frames"] = box["flops"]
    clear(em)
    return flops


def exact_errors(rounds: list[dict], truths: list[MatchScores]) -> dict[str, dict[str, float]]:
    """Per run: the largest |score - exact| over the rounds, for F and for the gated components, where
    exact is the released path computed in fp64 on the same captions."""
    out = {}
    for name in rounds[0]:
        errors, comps = [], 0.0
        for r, truth in zip(rounds, truths):
            got, ref = r[name][2].as_dict(), truth.as_dict()
            errors.append((got["full_f"].double() - ref["full_f"]).abs())
            comps = max(comps, max(float((got[k].double() - ref[k]).abs().max()) for k in GATED))
        every = torch.cat(errors)
        out[name] = {"score": float(every.max()), "score_median": float(every.median()), "components": comps}
    return out


def precision_comparison(model_parts, w: Workload, args, fp32: EMScore | None, other_precision: str = "bf16",
                         other: EMScore | None = None) -> dict:
    """``other_precision`` against fp32 on the same captions: seconds cold and warm (one call), largest score
    difference. The scorer of whichever side is not given is built from ``model_parts`` (an fp32 model)."""
    model, preprocess, tokenizer = model_parts

    def build(precision):
        return EMScore(model=lambda: (copy.deepcopy(model).float(), preprocess, tokenizer), frames=args.frames,
                       idf=w.corpus, device=args.device, precision=None if precision == "fp32" else precision)

    fp32 = fp32 or build("fp32")
    em16 = other or build(other_precision)
    caps, other_caps = w.captions(), w.captions()
    for em in (fp32, em16):  # warm-up of both paths (first-call allocations, lazy initialisation)
        clear(em)
        ours_call(em, w, other_caps)
    res = {}
    for name, em in (("fp32", fp32), ("bf16", em16)):
        clear(em)
        cold, _, scores, *_ = timed(lambda: ours_call(em, w, caps), Stopwatch(args.device))
        clear(em)
        ours_call(em, w, other_caps)
        warm, *_ = timed(lambda: ours_call(em, w, caps), Stopwatch(args.device))
        res[name] = {"cold_s": cold, "warm_s": warm, "scores": scores.full_f}
    return {
        "precision": other_precision,
        "fp32_cold_s": res["fp32"]["cold_s"], "bf16_cold_s": res["bf16"]["cold_s"],
        "fp32_warm_s": res["fp32"]["warm_s"], "bf16_warm_s": res["bf16"]["warm_s"],
        "speedup_cold": res["fp32"]["cold_s"] / res["bf16"]["cold_s"],
        "speedup_warm": res["fp32"]["warm_s"] / res["bf16"]["warm_s"],
        "max_score_difference": float((res["fp32"]["scores"] - res["bf16"]["scores"]).abs().max()),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--videos", type=int, default=8)
    parser.add_argument("--captions", type=int, default=16, help="captions per video (a GRPO group)")
    parser.add_argument("--frames", type=int, default=12, help="frames per video (all are scored)")
    parser.add_argument("--references", type=int, default=2, help="references per caption")
    parser.add_argument("--height", type=int, default=240)
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--model", default="ViT-B-32/random")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N]; both paths run there")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "fp16", "bf16"),
                        help="of the shared CLIP, for both paths (the released code loads fp16 on a GPU)")
    parser.add_argument("--repeats", type=int, default=2, help="rounds; the best of each is reported")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="2 videos, 1 round, no bf16 run")
    parser.add_argument("--no-bf16", action="store_true", help="skip the bf16 comparison")
    parser.add_argument("--no-fp64", action="store_true",
                        help="skip the exact reference (the released path in fp64 on every round's captions)")
    parser.add_argument("--compare-fp32", action="store_true",
                        help="with --precision fp16/bf16: also time capreward in fp32 on the same captions and give "
                             "the largest score difference (the bf16 comparison, for the run's own precision)")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")
    parser.add_argument("--json-out", help="also write the results to this JSON file")
    parser.add_argument("--profile", action="store_true", help="also print a torch.profiler table of a warm call")
    parser.add_argument("--preprocessing", choices=("pil", "device"), default="pil",
                        help="capreward's image path: the released PIL transform, or the same steps as tensors on the "
                             "device (its deviation from the PIL path is measured and printed)")
    args = parser.parse_args(argv)
    if args.quick:
        args.videos, args.repeats, args.no_bf16, args.no_fp64 = 2, 1, True, True
    if args.precision != "fp32" and not args.compare_fp32:
        args.no_bf16 = True  # the bf16 comparison is against fp32

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    w = Workload(args)
    master = None
    if args.precision != "fp32":  # the fp32 weights, for the fp64 reference and the fp32 comparison
        from capreward.backbones import load_clip

        master = load_clip(args.model, "cpu", "fp32")[0]
        torch.manual_seed(args.seed)  # NAME/random: the same seeded weights again
    em = EMScore(model=args.model, frames=args.frames, idf=w.corpus, device=args.device,
                 precision=None if args.precision == "fp32" else args.precision)
    bb: CLIPBackbone = em.backbone
    dtype = pixel_dtype(bb.model.visual)  # the layers' dtype (mixed precision keeps some embeddings in fp32)
    parts = (bb.model, bb.preprocess, bb.tokenizer)
    base = ReleasedPathEMScore(*parts, context_length=bb.context_length)
    if master is not None:
        same = torch.equal(master.token_embedding.weight.to(bb.model.token_embedding.weight.dtype),
                           bb.model.token_embedding.weight.cpu())
        if not same:
            raise SystemExit(f"{args.model}: the fp32 copy's weights differ from the {args.precision} model's")
    fp32_parts = (master if master is not None else bb.model, bb.preprocess, bb.tokenizer)
    fixed_idf = base.idf_dict(w.corpus)
    watch = Stopwatch(args.device)
    bb.encode_pixels = watch.wrap(bb.encode_pixels)
    bb._text_tower = watch.wrap(bb._text_tower)
    bb._text_tower_packed = watch.wrap(bb._text_tower_packed)
    deviation = None
    if args.preprocessing == "device":
        bb.set_preprocessing("device")
        deviation = preprocessing_deviation(em, w)
    instrument_parts(bb, args.device)

    flops = count_scenario_flops(em, base, w)
    # explicit warm-up of every path (first-call allocations, cuDNN/cuBLAS heuristics, lazy state)
    watch.enabled = base.encoders.enabled = False
    run_scenarios(em, base, w, watch, fixed_idf)
    rounds, peaks, scored = [], [], []
    for _ in range(args.repeats):  # timed rounds: no synchronisation inside a call
        peaks.append(matmul_peak(args.threads, device=args.device, dtype=dtype))
        out, caps = run_scenarios(em, base, w, watch, fixed_idf)
        rounds.append(out)
        scored.append(caps)
    # one instrumented round: the encoders' own seconds (synchronised around every encoder call)
    watch.enabled = base.encoders.enabled = True
    for part in PARTS.values():
        part.enabled = True
    instrumented, _ = run_scenarios(em, base, w, watch, fixed_idf)
    for part in PARTS.values():
        part.enabled = False
    peak = max(peaks)
    preprocess_floor = preprocessing_floor(bb, w)
    exact = None
    if not args.no_fp64:
        fp64 = ReleasedPathEMScore(copy.deepcopy(fp32_parts[0]).double().to(args.device), bb.preprocess, bb.tokenizer,
                                   context_length=bb.context_length)
        exact = exact_errors(rounds, [base_call(fp64, w, caps) for caps in scored])

    best = {k: min(r[k][0] for r in rounds) for k in rounds[0]}
    enc = {k: v[1] for k, v in instrumented.items()}
    diffs = {k: {d: max(differences(r[k][2], r["released one call"][2])[d] for r in rounds)
                 for d in ("components", "score")}
             for k in rounds[0] if k != "released one call"}
    cpu = {k: min(r[k][3] for r in rounds) for k in rounds[0]}

    def ratio_table(t):
        return {
            "one call, cold": t["released one call"] / t["capreward one call, cold"],
            "one call, warm": t["released one call"] / t["capreward one call, warm"],
            "per group, cold": t["released per group"] / t["capreward per group, cold"],
            "per group, warm": t["released per group"] / t["capreward per group, warm"],
        }

    ratios, cpu_ratios = ratio_table(best), ratio_table(cpu)
    on_gpu = torch.device(args.device).type != "cpu"
    flop_of = {"released one call": flops["released"], "capreward one call, cold": flops["cold"],
               "capreward one call, warm": flops["warm"]}
    efficiency = {k: {"gflop": f / 1e9, "encoder_s": enc[k], "encoder_peak_fraction": f / enc[k] / peak}
                  for k, f in flop_of.items()}
    result = {
        "config": {k: getattr(args, k) for k in ("videos", "captions", "frames", "references", "height", "width",
                                                 "model", "threads", "repeats", "device", "precision")},
        "workload": {"captions": w.n, "frames": args.videos * args.frames},
        "matmul_peak_gflop_per_s": peak / 1e9,
        "matmul_peak_gflop_per_s_per_round": [p / 1e9 for p in peaks],
        "seconds_best": best,
        "seconds_per_round": [{k: v[0] for k, v in r.items()} for r in rounds],
        "cpu_seconds_best": cpu,
        "ratios": ratios,
        # process CPU time means nothing for GPU work (a waiting thread spins or sleeps): CPU runs only
        "cpu_time_ratios": None if on_gpu else cpu_ratios,
        "instrumented_seconds": {k: v[0] for k, v in instrumented.items()},
        # where each capreward scenario's time went in the instrumented round (synchronised around each part)
        "breakdown": {k: {"wall_s": v[0], "encoders_s": v[1], **{f"{p}_s": t for p, t in v[4].items()},
                          "other_s": v[0] - v[1] - sum(v[4].values())}
                      for k, v in instrumented.items() if k.startswith("capreward")},
        "preprocessing": args.preprocessing,
        "pooled_only": pooled_only(rounds[0]["capreward one call, cold"][2]),
        "efficiency": efficiency,
        "max_score_difference": diffs,
        # a cold call must at least run every frame through the image tower: at 100 % of the fp32 peak
        # and with everything else free, this is the best cold ratio any exact fp32 method can reach
        "cold_ceiling": {"frames_gflop": flops["frames"] / 1e9,
                         "frames_s_at_peak": flops["frames"] / peak,
                         "ratio": best["released one call"] / (flops["frames"] / peak)},
        # the other floor of a cold call: CLIP preprocessing of every frame on the CPU (this process's threads)
        "preprocessing_floor": {"seconds": preprocess_floor,
                                "ratio": best["released one call"] / max(preprocess_floor, 1e-9)},
    }
    if exact is not None:
        result["error_vs_fp64"] = exact
    if deviation is not None:
        result["device_preprocessing"] = deviation
    if not args.no_bf16:
        if args.precision == "fp32":
            result["bf16"] = precision_comparison(fp32_parts, w, args, em, "bf16")
        else:
            result["bf16"] = precision_comparison(fp32_parts, w, args, None, args.precision, other=em)
    from gpu_common import write_json

    write_json(args.json_out, result)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)
    if args.profile:
        profile_warm(em, w)
    worst = max(d["components"] for d in diffs.values())
    if args.precision == "fp32" and worst > 1e-5:  # in fp16/bf16 both paths round at ~1e-3 anyway
        raise SystemExit(f"capreward and the released path disagree: max score difference {worst:.2e}")
    return result


def print_table(result: dict) -> None:
    c = result["config"]
    where = f"{c['precision']} CPU, {c['threads']} threads" if c["device"] == "cpu" else f"{c['precision']} {c['device']}"
    print(f"EMScore(X, V, X*), {c['model']}, {where}: {c['videos']} videos x "
          f"{c['captions']} captions, {c['frames']} frames/video ({c['height']}x{c['width']}), {c['references']} "
          f"references/caption, fixed-corpus idf; best of {c['repeats']} rounds")
    rounds = ", ".join(f"{p:.1f}" for p in result["matmul_peak_gflop_per_s_per_round"])
    print(f"{c['precision']} matmul peak: {result['matmul_peak_gflop_per_s']:.1f} GFLOP/s (per round: {rounds})")
    print(f"{'run':30s} {'s':>8s} {'enc GFLOP':>10s} {'enc s':>7s} {'enc %peak':>9s} {'|diff| P,R,coarse':>17s} "
          f"{'|diff| F':>9s}")
    for k, s in result["seconds_best"].items():
        e = result["efficiency"].get(k)
        extra = f"{e['gflop']:10.1f} {e['encoder_s']:7.2f} {100 * e['encoder_peak_fraction']:8.1f}%" if e else \
            f"{'':10s} {'':7s} {'':9s}"
        diff = result["max_score_difference"].get(k)
        diff_text = "" if diff is None else f"{diff['components']:17.1e} {diff['score']:9.1e}"
        print(f"{k:30s} {s:8.3f} {extra} {diff_text}")
    r = result["ratios"]
    print(f"released / capreward: one call cold {r['one call, cold']:.1f}x, warm {r['one call, warm']:.1f}x; "
          f"8 calls of {c['captions']}: cold {r['per group, cold']:.1f}x, warm {r['per group, warm']:.1f}x "
          f"(targets: warm >= 10x, cold >= 3x, per-group warm >= 8x)")
    r = result["cpu_time_ratios"]
    if r is not None:
        print(f"same ratios in process CPU time (less sensitive to other load): one call cold {r['one call, cold']:.1f}x, "
              f"warm {r['one call, warm']:.1f}x; per group cold {r['per group, cold']:.1f}x, warm {r['per group, warm']:.1f}x")
    cc = result["cold_ceiling"]
    print(f"cold ceiling: the {c['videos'] * c['frames']} frames alone are {cc['frames_gflop']:.0f} GFLOP, "
          f"{cc['frames_s_at_peak']:.2f} s at 100 % of the {c['precision']} matmul peak with everything else free: no exact "
          f"method gets a cold call more than {cc['ratio']:.2f}x faster than the released path here")
    pf = result["preprocessing_floor"]
    print(f"preprocessing floor: CLIP preprocessing of the frames alone takes {pf['seconds']:.2f} s on this CPU: with it in "
          f"the calling thread a cold call is at most {pf['ratio']:.2f}x faster than the released path")
    if "error_vs_fp64" in result:
        e = result["error_vs_fp64"]
        ours = max((k for k in e if k.startswith("capreward")), key=lambda k: e[k]["score"])
        print(f"against the exact value (the released path in fp64, same captions), |error| of F, largest / median "
              f"over the captions: released fp32 {e['released one call']['score']:.1e} / "
              f"{e['released one call']['score_median']:.1e}, capreward {e[ours]['score']:.1e} / "
              f"{e[ours]['score_median']:.1e} ({ours}); largest of P, R, coarse: released "
              f"{e['released one call']['components']:.1e}, capreward "
              f"{max(v['components'] for k, v in e.items() if k.startswith('capreward')):.1e}")
    for k, b in result["breakdown"].items():
        print(f"{k}: {b['wall_s']:.3f} s = encoders {b['encoders_s']:.3f} + preprocessing {b.get('preprocess_s', 0):.3f} "
              f"+ pixel hashing {b.get('hash_s', 0):.3f} + other {b['other_s']:.3f} (instrumented round, "
              f"{result['preprocessing']} image path)")
    if "device_preprocessing" in result:
        d = result["device_preprocessing"]
        print(f"device-side image path against PIL: pixels within {d['max_pixel_levels']:.0f} 8-bit level(s) "
              f"({100 * d['fraction_of_values_off']:.3f} % of values off), EMScore components within "
              f"{max(d['max_component_difference'].values()):.1e}")
    po = result["pooled_only"]
    print(f"pooled embeddings only (a /score or /embeddings server): EMScore's coarse part differs from EMScore by up to "
          f"{po['max_difference']:.3f} (mean {po['mean_difference']:.3f}), Spearman {po['spearman']:.3f} over "
          f"{po['captions']} captions")
    if "bf16" in result:
        b = result["bf16"]
        print(f"{b['precision']} vs fp32 (capreward, one call): cold {b['fp32_cold_s']:.2f} -> {b['bf16_cold_s']:.2f} s "
              f"({b['speedup_cold']:.2f}x), warm {b['fp32_warm_s']:.2f} -> {b['bf16_warm_s']:.2f} s "
              f"({b['speedup_warm']:.2f}x); max |score difference| {b['max_score_difference']:.1e}")


def preprocessing_floor(bb: CLIPBackbone, w: Workload) -> float:
    """Seconds of CLIP preprocessing (PIL resize, crop, normalise) of every frame of the workload."""
    start = time.perf_counter()
    for video in w.videos:
        bb.pixels_of(video)
    return time.perf_counter() - start


def profile_warm(em: EMScore, w: Workload) -> None:
    from torch.profiler import ProfilerActivity, profile

    ours_call(em, w, w.captions())
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        ours_call(em, w, w.captions())
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
